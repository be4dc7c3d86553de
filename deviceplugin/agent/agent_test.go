package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	k8sresource "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/deviceplugin/plugin"
	"github.com/gpufrac/gpufrac/deviceplugin/pods"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
	"github.com/gpufrac/gpufrac/tests/kubeletsim"
)

const nodeName = "node-a"

// env is one in-process gpufrac-node on mock GPUs with a fake API server
// and a kubelet simulator.
type env struct {
	t       *testing.T
	ctx     context.Context
	dir     string
	cfgPath string
	client  *fake.Clientset
	kubelet *kubeletsim.Kubelet
	agent   *Agent
	lib     nvidia.Lib   // the agent's mock
	gpus    []nvidia.GPU // the mock's GPUs, in index order
	// stop ends the agent's Run and waits for it (once; cleanup calls it).
	stop func()
}

// mockGPUs lists the GPUs a dgxh100 mock seeded with the node name has;
// the agent's own mock, seeded alike, has the same UUIDs.
func mockGPUs(t *testing.T) []nvidia.GPU {
	t.Helper()
	m, err := nvidia.NewMock("dgxh100", nvidia.WithUUIDSeed(nodeName))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Init(); err != nil {
		t.Fatal(err)
	}
	defer m.Shutdown()
	gs, err := m.GPUs()
	if err != nil {
		t.Fatal(err)
	}
	return gs
}

// startAgent starts the simulator and the agent with config as the admin's
// file; objs seed the fake API server (the Node is always there).
func startAgent(t *testing.T, config string, objs ...runtime.Object) *env {
	t.Helper()
	return startAgentWith(t, config, nil, objs...)
}

// startAgentWith is startAgent with prep called on the fake API server
// before the agent starts (to add reactors that fail calls).
func startAgentWith(t *testing.T, config string, prep func(*fake.Clientset), objs ...runtime.Object) *env {
	t.Helper()
	return startAgentFull(t, config, prep, nil, objs...)
}

// startAgentFull is startAgentWith with the agent's Config changed by mod.
func startAgentFull(t *testing.T, config string, prep func(*fake.Clientset), mod func(*Config), objs ...runtime.Object) *env {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	t.Cleanup(cancel)
	dir, err := os.MkdirTemp("", "agent") // short: unix socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	for _, d := range []string{"dp", "cfg", "reg"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	e := &env{t: t, ctx: ctx, dir: dir, cfgPath: filepath.Join(dir, "cfg", "config.yaml"), gpus: mockGPUs(t)}
	e.writeConfig(config)

	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, Labels: map[string]string{"kubernetes.io/hostname": nodeName}}}
	e.client = fake.NewClientset(append([]runtime.Object{node}, objs...)...)
	generateNames(e.client)
	if prep != nil {
		prep(e.client)
	}

	// The simulator's DRA side (a plugin registry, claims read from the
	// fake API server) serves agents whose config says mode dra.
	e.kubelet = kubeletsim.New(kubeletsim.Options{
		NodeName: nodeName, Dir: filepath.Join(dir, "dp"), PodResourcesSocket: filepath.Join(dir, "pr.sock"), Strict: true,
		PluginRegistryDir: filepath.Join(dir, "reg"), Claims: fakeClaims{e.client},
	})
	if err := e.kubelet.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.kubelet.Stop)
	lib, err := nvidia.NewMock("dgxh100", nvidia.WithUUIDSeed(nodeName))
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		NodeName:            nodeName,
		KubeletDir:          filepath.Join(dir, "dp"),
		PodResourcesSocket:  filepath.Join(dir, "pr.sock"),
		ConfigFile:          e.cfgPath,
		HealthProbeInterval: 100 * time.Millisecond,
		ProcRoot:            filepath.Join(dir, "proc"), // empty: the watchdog maps no process
		Version:             "test",
		DRA: DRAConfig{Client: e.client, RegistryDir: filepath.Join(dir, "reg"), PluginDir: filepath.Join(dir, "dra"),
			CDIDir: filepath.Join(dir, "cdi"), SliceSyncDelay: 200 * time.Millisecond},
	}
	if mod != nil {
		mod(&cfg)
	}
	e.lib = lib
	e.agent = New(cfg, lib, e.client)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- e.agent.Run(runCtx) }()
	e.stop = sync.OnceFunc(func() {
		stop()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("agent Run: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("agent Run did not return after its context ended")
		}
	})
	t.Cleanup(e.stop)
	return e
}

// generateNames makes the fake API server name created ResourceSlices from their
// metadata.generateName and give them a UID, as the API server does (the
// resourceslice controller creates slices by generateName).
func generateNames(c *fake.Clientset) {
	var n atomic.Int64
	c.PrependReactor("create", "resourceslices", func(action clienttesting.Action) (bool, runtime.Object, error) {
		ca, ok := action.(clienttesting.CreateAction)
		if !ok {
			return false, nil, nil
		}
		obj, ok := ca.GetObject().(metav1.Object)
		if !ok || obj.GetName() != "" || obj.GetGenerateName() == "" {
			return false, nil, nil
		}
		i := n.Add(1)
		obj.SetName(fmt.Sprintf("%s%05d", obj.GetGenerateName(), i))
		if obj.GetUID() == "" {
			obj.SetUID(types.UID(fmt.Sprintf("uid-%s%05d", obj.GetGenerateName(), i)))
		}
		return false, nil, nil
	})
}

// writeConfig replaces the config file atomically, as a ConfigMap update does.
func (e *env) writeConfig(content string) {
	e.t.Helper()
	tmp := e.cfgPath + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		e.t.Fatal(err)
	}
	if err := os.Rename(tmp, e.cfgPath); err != nil {
		e.t.Fatal(err)
	}
}

// served is what the tests check of one resource in the kubelet.
type served struct {
	Healthy       int
	Connected     bool
	Registrations int
}

func (e *env) served() map[string]served {
	out := map[string]served{}
	for name, s := range e.kubelet.Resources() {
		out[name] = served{Healthy: s.Allocatable, Connected: s.Connected, Registrations: s.Registrations}
	}
	return out
}

// waitServed waits until the kubelet sees exactly want.
func (e *env) waitServed(what string, want map[string]served) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 15*time.Second)
	defer cancel()
	err := e.kubelet.Wait(ctx, func(map[string]kubeletsim.ResourceState) bool { return cmp.Equal(want, e.served()) })
	if err != nil {
		e.t.Fatalf("waiting for %s: %v\nresources (-want +got):\n%s", what, err, cmp.Diff(want, e.served()))
	}
}

// poll checks cond every 20ms until it holds, failing after 15s.
func (e *env) poll(what string, cond func() bool) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 15*time.Second)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			e.t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-tick.C:
		}
	}
}

// nodeEvents returns "type reason: note" of the events (events.k8s.io/v1)
// on this Node, one per event object.
func (e *env) nodeEvents() []string {
	e.t.Helper()
	var out []string
	for _, ev := range e.nodeEventObjects() {
		out = append(out, fmt.Sprintf("%s %s: %s", ev.Type, ev.Reason, ev.Note))
	}
	slices.Sort(out)
	return out
}

// occurrences counts the occurrences of the Node's events whose "type
// reason: note" starts with prefix: one per event, two or more for an
// event with a series. tools/events writes a series' count when it starts
// (2), then only every 30 minutes and when it ends (6 minutes quiet), so
// it sees at most 2 per event in a test.
func (e *env) occurrences(prefix string) int {
	e.t.Helper()
	n := 0
	for _, ev := range e.nodeEventObjects() {
		if !strings.HasPrefix(fmt.Sprintf("%s %s: %s", ev.Type, ev.Reason, ev.Note), prefix) {
			continue
		}
		if ev.Series != nil {
			n += int(ev.Series.Count)
		} else {
			n++
		}
	}
	return n
}

func (e *env) nodeEventObjects() []eventsv1.Event {
	e.t.Helper()
	list, err := e.client.EventsV1().Events("").List(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []eventsv1.Event
	for _, ev := range list.Items {
		if ev.Regarding.Kind == "Node" && ev.Regarding.Name == nodeName {
			out = append(out, ev)
		}
	}
	return out
}

// rejectedReloads is gpufrac_config_reloads_total{result="rejected"}.
func rejectedReloads(t *testing.T, e *env) float64 {
	t.Helper()
	mfs, err := e.agent.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "gpufrac_config_reloads_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == "rejected" {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

const fractionConfig = "version: v1\ndefault:\n  mode: fraction\n"

// TestConfigRejectedAtRuntime breaks the admin's config while the agent
// runs: each broken version gives a Warning event GPUConfigRejected on the
// Node that says why (each its own event: the action carries a hash of the
// note, so tools/events does not fold a second error into the first's
// series) and changes nothing the kubelet sees; a valid version afterwards
// is applied.
func TestConfigRejectedAtRuntime(t *testing.T) {
	e := startAgent(t, fractionConfig)
	serving := map[string]served{
		api.ResourceGPU:      {Healthy: 8, Connected: true, Registrations: 1},
		api.ResourceFraction: {Healthy: 800, Connected: true, Registrations: 1},
	}
	e.waitServed("the whole and fraction resources", serving)
	if events := e.nodeEvents(); len(events) != 0 {
		t.Fatalf("events before any rejection: %q", events)
	}

	broken := []struct {
		name    string
		content string
		want    string // in the event message
	}{
		{name: "not YAML", content: "version: v1\ndefault: [\n", want: "parsing config YAML"},
		{name: "unknown mode", content: "version: v1\ndefault:\n  mode: turbo\n", want: "turbo"},
		{name: "unknown field", content: "version: v1\ndefault:\n  mdoe: exclusive\n", want: "mdoe"},
		{name: "unknown version", content: "version: v9\ndefault:\n  mode: exclusive\n", want: "v9"},
	}
	for i, b := range broken {
		e.writeConfig(b.content)
		var got string
		e.poll(b.name+": a GPUConfigRejected event saying why", func() bool {
			for _, ev := range e.nodeEvents() {
				if strings.HasPrefix(ev, "Warning GPUConfigRejected: ") && strings.Contains(ev, b.want) {
					got = ev
				}
			}
			return got != "" && e.occurrences("Warning GPUConfigRejected: ") == i+1 && rejectedReloads(t, e) == float64(i+1)
		})
		t.Logf("%s: %s", b.name, got)
		if diff := cmp.Diff(serving, e.served()); diff != "" {
			t.Errorf("%s: resources changed after a rejected config (-want +got):\n%s", b.name, diff)
		}
	}

	// A valid config is still taken: exclusive withdraws the fractions.
	e.writeConfig("version: v1\ndefault:\n  mode: exclusive\n")
	e.waitServed("the exclusive config", map[string]served{
		api.ResourceGPU:      {Healthy: 8, Connected: true, Registrations: 1},
		api.ResourceFraction: {Healthy: 0, Connected: false, Registrations: 1},
	})
	if diff := cmp.Diff([]string{api.ResourceGPU}, e.agent.Resources()); diff != "" {
		t.Errorf("served resources (-want +got):\n%s", diff)
	}
}

// fractionPod is a pod the coordinator placed on gpu and bound here.
func fractionPod(name string, units int, gpu string, age time.Duration) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "team-a", Name: name, UID: types.UID("uid-" + name),
			CreationTimestamp: metav1.NewTime(time.Now().Add(-age)),
			Annotations:       map[string]string{api.AnnotationGPU: gpu},
		},
		Spec: corev1.PodSpec{NodeName: nodeName, SchedulerName: api.SchedulerName, Containers: []corev1.Container{{
			Name: "main",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
				api.ResourceFraction: *k8sresource.NewQuantity(int64(units), k8sresource.DecimalSI),
			}},
		}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending},
	}
}

func podRef(p *corev1.Pod) kubeletsim.PodRef {
	return kubeletsim.PodRef{Namespace: p.Namespace, Name: p.Name, UID: p.UID}
}

// TestFractionFollowsCoordinator admits fraction pods through the kubelet
// simulator: the units come from the GPU in the pod's gpufrac.io/gpu
// annotation (best fit alone would pick GPU 0), the container gets that GPU
// and its share, and gpufrac.io/allocated-gpu and gpufrac.io/reserved-gpu
// are written back.
func TestFractionFollowsCoordinator(t *testing.T) {
	gs := mockGPUs(t)
	target := gs[5]
	first := fractionPod("first", 30, target.UUID, time.Hour)
	second := fractionPod("second", 50, target.UUID, time.Minute)
	reservation := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: api.ReservationNamespace, Name: api.ReservationNamePrefix + nodeName + "-5", UID: "uid-reservation",
			Annotations: map[string]string{api.AnnotationGPU: target.UUID}},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "hold", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{api.ResourceGPU: *k8sresource.NewQuantity(1, k8sresource.DecimalSI)},
		}}}},
	}
	e := startAgent(t, fractionConfig, first, second, reservation)
	e.waitServed("the whole and fraction resources", map[string]served{
		api.ResourceGPU:      {Healthy: 8, Connected: true, Registrations: 1},
		api.ResourceFraction: {Healthy: 800, Connected: true, Registrations: 1},
	})
	e.poll("the pod informer to sync", func() bool { return e.agent.hint != nil && e.agent.hint.HasSynced() })

	res, err := e.kubelet.Allocate(e.ctx, podRef(reservation), "hold", api.ResourceGPU, 1)
	if err != nil {
		t.Fatal(err)
	}
	reserved := res.DeviceIDs[0]
	// The coordinator binds a fraction to a reserved GPU only once the
	// reservation's GPU is written back, which gpufrac-node does after the
	// kubelet lists the reservation's device: before that, the GPU is not
	// known to be held by a reservation and the hint is not honoured (under
	// load the fractions below could be allocated inside that window).
	e.poll("the reservation's GPU written back", func() bool {
		cur, err := e.client.CoreV1().Pods(reservation.Namespace).Get(e.ctx, reservation.Name, metav1.GetOptions{})
		return err == nil && cur.Annotations[api.AnnotationReservedGPU] == reserved
	})

	got := map[string]string{} // pod -> GPU of its units
	for _, p := range []*corev1.Pod{first, second} {
		units := pods.FractionUnits(&p.Spec.Containers[0])
		a, err := e.kubelet.Allocate(e.ctx, podRef(p), "main", api.ResourceFraction, units)
		if err != nil {
			t.Fatal(err)
		}
		gpu, err := resource.GPUOfUnits(a.DeviceIDs)
		if err != nil {
			t.Fatal(err)
		}
		got[p.Name] = gpu
		wantLimit := fmt.Sprint(target.MemoryMiB() * uint64(units) / 100)
		if env := a.Response.Envs[api.EnvMemoryLimitMiB]; env != wantLimit {
			t.Errorf("%s: %s = %q, want %q", p.Name, api.EnvMemoryLimitMiB, env, wantLimit)
		}
		var devs []string
		for _, d := range a.Response.Devices {
			devs = append(devs, d.HostPath)
		}
		if !slices.Contains(devs, fmt.Sprintf("/dev/nvidia%d", target.Minor)) {
			t.Errorf("%s: device specs %v lack /dev/nvidia%d", p.Name, devs, target.Minor)
		}
	}
	if diff := cmp.Diff(map[string]string{"first": target.UUID, "second": target.UUID}, got); diff != "" {
		t.Errorf("GPU of each pod's units (-want +got):\n%s", diff)
	}

	want := map[string]string{
		"team-a/first":  target.UUID,
		"team-a/second": target.UUID,
		api.ReservationNamespace + "/" + reservation.Name: reserved,
	}
	var annotations map[string]string
	e.poll("allocated-gpu and reserved-gpu written back", func() bool {
		annotations = map[string]string{}
		for _, p := range []*corev1.Pod{first, second, reservation} {
			cur, err := e.client.CoreV1().Pods(p.Namespace).Get(e.ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			key := api.AnnotationAllocatedGPU
			if p == reservation {
				key = api.AnnotationReservedGPU
			}
			if v := cur.Annotations[key]; v != "" {
				annotations[p.Namespace+"/"+p.Name] = v
			}
		}
		return cmp.Equal(want, annotations)
	})
}

// TestRunReturnsWhenTheConfigAtStartCannotBeServed: the device plugins
// start, then serving the config at start fails (an endpoint's socket path
// is taken by a directory): Run stops what it started and returns the
// error instead of waiting for the device plugins, which stop only with
// its context, forever.
func TestRunReturnsWhenTheConfigAtStartCannotBeServed(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, plugin.EndpointName(api.ResourceGPU), "taken"), 0o755); err != nil {
		t.Fatal(err)
	}
	lib, err := nvidia.NewMock("dgxh100", nvidia.WithUUIDSeed(nodeName))
	if err != nil {
		t.Fatal(err)
	}
	a := New(Config{KubeletDir: dir, ProcRoot: filepath.Join(dir, "proc")}, lib, nil)
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "applying config") {
			t.Errorf("Run = %v, want the error applying the config", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return within 15 s of failing to serve the config at start")
	}
}
