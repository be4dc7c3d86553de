package enforcement

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/enforcement/enforcementtest"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/deviceplugin/pods"
)

const mib1 = 1 << 20

// testPod is a pod with one container per name, each with a runtime ID
// derived from "<pod>/<container>".
func testPod(name string, uid types.UID, containers ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name, UID: uid}}
	for _, c := range containers {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: c})
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: c, ContainerID: "containerd://" + enforcementtest.ContainerID(name+"/"+c),
		})
	}
	return p
}

// fakeDevices is a DeviceSource with settable assignments.
type fakeDevices struct {
	mu  sync.Mutex
	as  []pods.Assignment
	err error
}

func (f *fakeDevices) List(context.Context) ([]pods.Assignment, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.as, f.err
}

func (f *fakeDevices) set(as ...pods.Assignment) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.as = as
}

// fakePods is a PodLookup over a fixed set of pods.
type fakePods map[types.UID]*corev1.Pod

func (f fakePods) PodByUID(uid types.UID) (*corev1.Pod, bool) {
	p, ok := f[uid]
	return p, ok
}

// kill is one recorded Kill call.
type kill struct {
	PID   uint32
	Start uint64
}

// recordingKiller records kills and returns err.
type recordingKiller struct {
	calls []kill
	err   error
}

func (k *recordingKiller) Kill(_ context.Context, pid uint32, start uint64) error {
	k.calls = append(k.calls, kill{PID: pid, Start: start})
	return k.err
}

// recordingEvictor records evicted pods ("ns/name") and returns err.
type recordingEvictor struct {
	calls []string
	err   error
}

func (e *recordingEvictor) Evict(_ context.Context, p *corev1.Pod) error {
	e.calls = append(e.calls, p.Namespace+"/"+p.Name)
	return e.err
}

// env is a watchdog on a mock DGX H100 with a fixture /proc tree.
type env struct {
	t        *testing.T
	ctx      context.Context
	lib      *nvidia.Mock
	gpus     []nvidia.GPU
	root     string
	devices  *fakeDevices
	pods     fakePods
	killer   *recordingKiller
	evictor  *recordingEvictor
	recorder *events.FakeRecorder
	reg      *prometheus.Registry
	w        *Watchdog
}

type envOptions struct {
	standalone bool          // no PodLookup
	killer     Killer        // default: a recordingKiller
	pods       PodLookup     // default: env.pods
	evictor    Evictor       // default: a recordingEvictor
	recorder   EventRecorder // default: env.recorder
	claims     ClaimSource   // default: none
}

func newEnv(t *testing.T, o envOptions) *env {
	t.Helper()
	lib, err := nvidia.NewMock("dgxh100", nvidia.WithUUIDSeed("node-a"))
	if err != nil {
		t.Fatal(err)
	}
	if err := lib.Init(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lib.Shutdown() })
	gpus, err := lib.GPUs()
	if err != nil {
		t.Fatal(err)
	}
	_, ctx := ktesting.NewTestContext(t)
	e := &env{
		t: t, ctx: ctx, lib: lib, gpus: gpus, root: t.TempDir(),
		devices: &fakeDevices{}, pods: fakePods{}, killer: &recordingKiller{}, evictor: &recordingEvictor{},
		recorder: events.NewFakeRecorder(1000), reg: prometheus.NewRegistry(),
	}
	opts := Options{
		GPUs: gpus, Processes: lib, Resolver: ProcFS{Root: e.root}, Devices: e.devices,
		Killer: e.killer, Evictor: e.evictor, Recorder: e.recorder, Registerer: e.reg,
	}
	if o.killer != nil {
		opts.Killer = o.killer
	}
	if !o.standalone {
		opts.Pods = e.pods
	}
	if o.pods != nil {
		opts.Pods = o.pods
	}
	if o.evictor != nil {
		opts.Evictor = o.evictor
	}
	if o.recorder != nil {
		opts.Recorder = o.recorder
	}
	opts.Claims = o.claims
	e.w = New(opts)
	return e
}

// addPod adds a pod to the lookup.
func (e *env) addPod(p *corev1.Pod) *corev1.Pod {
	e.pods[p.UID] = p
	return p
}

// proc writes a fixture process running in container c of pod p (p nil:
// a host process).
func (e *env) proc(pid uint32, start uint64, p *corev1.Pod, c string) {
	e.t.Helper()
	cg := enforcementtest.CgroupHost
	if p != nil {
		cg = enforcementtest.CgroupContainerdSystemd(p.UID, enforcementtest.ContainerID(p.Name+"/"+c))
	}
	if err := enforcementtest.WriteProc(e.root, enforcementtest.Proc{PID: pid, StartTime: start, Cgroup: cg}); err != nil {
		e.t.Fatal(err)
	}
}

// nvml sets the processes NVML reports on GPU i (pid -> MiB).
func (e *env) nvml(i int, procs ...nvidia.Process) {
	e.t.Helper()
	if err := e.lib.SetProcesses(e.gpus[i].UUID, procs); err != nil {
		e.t.Fatal(err)
	}
}

// fraction is a fraction assignment of units on GPU i.
func (e *env) fraction(p *corev1.Pod, c string, i, units int) pods.Assignment {
	return pods.Assignment{Namespace: p.Namespace, Pod: p.Name, Container: c, Resource: api.ResourceFraction, DeviceIDs: unitIDs(e.gpus[i].UUID, units)}
}

// events drains the recorded events.
func (e *env) events() []string {
	var out []string
	for {
		select {
		case ev := <-e.recorder.Events:
			out = append(out, ev)
		default:
			return out
		}
	}
}

// reasons returns the reason of each event ("Warning GPUMemoryProcessKilled ..." -> "GPUMemoryProcessKilled").
func reasons(events []string) []string {
	var out []string
	for _, ev := range events {
		f := strings.Fields(ev)
		if len(f) > 1 {
			out = append(out, f[1])
		}
	}
	return out
}

// metric returns the value of one series of the registry, by name and
// labels; ok is false when the series does not exist.
func (e *env) metric(name string, labels map[string]string) (float64, bool) {
	e.t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			if len(got) != len(labels) {
				continue
			}
			for k, v := range labels {
				if got[k] != v {
					continue series
				}
			}
			switch {
			case m.Gauge != nil:
				return m.GetGauge().GetValue(), true
			case m.Counter != nil:
				return m.GetCounter().GetValue(), true
			}
		}
	}
	return 0, false
}

// seriesCount counts the series of a metric family.
func (e *env) seriesCount(name string) int {
	e.t.Helper()
	n, err := testutil.GatherAndCount(e.reg, name)
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}

func containerLabelsOf(p *corev1.Pod, c, gpu string) map[string]string {
	return map[string]string{"namespace": p.Namespace, "pod": p.Name, "container": c, "gpu_uuid": gpu}
}

func withLabels(base map[string]string, kv ...string) map[string]string {
	out := map[string]string{}
	for k, v := range base {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

func procMiB(pid uint32, miB uint64) nvidia.Process {
	return nvidia.Process{PID: pid, UsedBytes: miB * mib1}
}
