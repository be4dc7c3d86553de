package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/util/retry"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/enforcement/enforcementtest"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
	"github.com/gpufrac/gpufrac/tests/cluster"
)

// watchdogConfig is gpufrac-node's config on the enforcement test bed: report
// by default, and evict or kill on the nodes of the pools named after them.
// The groups inherit the poll interval and sample count.
const watchdogConfig = `version: v1
default:
  mode: fraction
  fraction: {enforcement: report, pollInterval: 200ms, samples: 2}
groups:
  - nodeSelector: {karpenter.sh/nodepool: enf-evict}
    fraction: {enforcement: evict}
  - nodeSelector: {karpenter.sh/nodepool: enf-kill}
    fraction: {enforcement: kill}
`

// Issue 6: the GPU memory watchdog on the test bed. Per enforcement action, a
// node whose gpufrac-node maps PIDs through a fixture /proc tree; the
// coordinator places two 30% fractions on one GPU there; each pod's
// container runs a real process (a child of the test, in the fixture under its
// pod's cgroup with the container ID of its status) and the mock NVML reports
// pod 1's process over its 30% limit and pod 2's under it. Pod 1 gets a
// Warning event with the numbers and the action, the violation is counted on
// the agent's /metrics, and pod 2, its process and its metrics are untouched.
func TestMemoryWatchdogActsOnTheOverLimitFractionOnly(t *testing.T) {
	t.Parallel()
	procRoot := filepath.Join(t.TempDir(), "proc")
	c := startCluster(t, cluster.Options{NodeAgents: &cluster.NodeAgentOptions{
		Config: watchdogConfig,
		Args:   []string{"--proc-root=" + procRoot},
	}})
	buildBinary(t, "gpufrac-coordinator")
	applyYAML(t, c, queuesYAML(map[string]string{"enf": "8"}))
	// One node per action, in a pool named after it. The nodes and their
	// inventories exist before the coordinator starts: a pod created the
	// moment a node is published can meet a coordinator whose informer has
	// not seen the node yet (NoCapacity, a needless placeholder). binpack puts
	// the second 30% on the GPU of the first, which a reservation holds.
	nodes := map[string]string{}
	for _, action := range []string{"report", "kill", "evict"} {
		nodes[action] = addGPUNodes(t, c, action, "enf-"+action, 1)[0]
	}
	startCoordinator(t, c, "c1", "--leader-elect=false", "--policy=binpack")

	tests := []struct {
		name   string
		action string
		// check verifies what the action did to pod 1 and its process.
		check func(t *testing.T, w *watchdogBed)
	}{
		{name: "report", action: "report", check: func(t *testing.T, w *watchdogBed) {
			// Reported only: the pod runs on, its process lives, no action is counted.
			w.pollsPass(t, 10)
			w.stillRunning(t, w.over)
			for _, result := range []string{"success", "failed", "skipped"} {
				for _, action := range []string{"kill", "evict"} {
					if v := w.metric(t, "gpufrac_memory_limit_actions_total", map[string]string{"action": action, "result": result}); v != 0 {
						t.Errorf("%s %s actions counted with report enforcement: %v", action, result, v)
					}
				}
			}
			if n := len(w.events(t, w.over.pod, "GPUMemoryLimitExceeded")); n != 1 {
				t.Errorf("%d GPUMemoryLimitExceeded events on the over-limit pod, want 1 (one per over-limit run)", n)
			}
		}},
		{name: "kill", action: "kill", check: func(t *testing.T, w *watchdogBed) {
			// The process over the limit is SIGKILLed through its pidfd; the pod
			// object stays (the container's runtime would restart it).
			select {
			case state := <-w.over.exited:
				if !strings.Contains(state, "killed") {
					t.Errorf("the over-limit process ended with %q, want killed", state)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("the over-limit process %d was not killed", w.over.pid)
			}
			// NVML stops listing a process that is gone.
			w.writeProcesses(t, w.under)
			w.waitEvent(t, w.over.pod, "GPUMemoryProcessKilled", strconv.Itoa(int(w.over.pid)))
			w.waitMetric(t, "gpufrac_memory_limit_actions_total", map[string]string{"action": "kill", "result": "success"}, 1)
			w.pollsPass(t, 5)
			if v := w.metric(t, "gpufrac_memory_limit_actions_total", map[string]string{"action": "kill", "result": "success"}); v != 1 {
				t.Errorf("%v kills counted, want 1", v)
			}
		}},
		{name: "evict", action: "evict", check: func(t *testing.T, w *watchdogBed) {
			// The pod over its limit is evicted through the Eviction API (the
			// node agent's own RBAC must allow it) and goes away.
			w.waitEvent(t, w.over.pod, "GPUMemoryPodEvicted", w.gpu)
			w.waitMetric(t, "gpufrac_memory_limit_actions_total", map[string]string{"action": "evict", "result": "success"}, 1)
			waitFor(t, 30*time.Second, "the evicted pod to go", func(ctx context.Context) (bool, error) {
				_, err := c.Client.CoreV1().Pods("default").Get(ctx, w.over.pod.Name, metav1.GetOptions{})
				return apierrors.IsNotFound(err), nil
			})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pool, node := "enf-"+tt.action, nodes[tt.action]
			agent := c.NodeAgent(node)
			w := &watchdogBed{c: c, agent: agent, procRoot: procRoot}

			// 1. Two 30% fractions, one GPU.
			p1, p2 := fmt.Sprintf("enf-%s-over", tt.action), fmt.Sprintf("enf-%s-under", tt.action)
			create(t, c,
				pod(p1, "enf").Fraction(30).NodeSelector(api.LabelNodePool, pool).Obj(),
				pod(p2, "enf").Fraction(30).NodeSelector(api.LabelNodePool, pool).Obj())
			running(t, c, 60*time.Second, p1, p2)
			pods := w.writtenBack(t, p1, p2)
			if g1, g2 := pods[0].Annotations[api.AnnotationAllocatedGPU], pods[1].Annotations[api.AnnotationAllocatedGPU]; g1 != g2 {
				t.Fatalf("the two 30%% fractions got GPUs %s and %s, want one GPU shared (binpack fills the tightest GPU)", g1, g2)
			}
			w.gpu = pods[0].Annotations[api.AnnotationAllocatedGPU]
			w.limitBytes = w.limitOf(t, node, 30)

			// 2. The containers' processes and their runtime IDs.
			w.over = w.startContainer(t, pods[0], 0)
			w.under = w.startContainer(t, pods[1], 1)

			// 3. NVML: pod 1 far over its limit, pod 2 well under.
			w.over.used, w.under.used = w.limitBytes+16<<30, w.limitBytes/3
			w.writeProcesses(t, w.over, w.under)
			violations := map[string]string{"action": tt.action}
			w.waitMetric(t, "gpufrac_memory_limit_violations_total", violations, 1)
			w.waitEvent(t, w.over.pod, "GPUMemoryLimitExceeded",
				mibString(w.over.used), mibString(w.limitBytes), w.gpu, "action: "+tt.action)
			if v := w.metric(t, "gpufrac_container_gpu_memory_violations_total", w.series(w.over)); v != 1 && tt.action != "evict" {
				t.Errorf("pod 1's violations = %v, want 1", v)
			}

			tt.check(t, w)

			// 4. Pod 2: no event, no violation, still Running with its process.
			if evs := w.events(t, w.under.pod, ""); len(evs) > 0 {
				t.Errorf("events on the pod within its limit: %v", evs)
			}
			if v := w.metric(t, "gpufrac_container_gpu_memory_violations_total", w.series(w.under)); v != 0 {
				t.Errorf("pod 2's violations = %v, want 0", v)
			}
			if got := w.metric(t, "gpufrac_container_gpu_memory_used_bytes", w.series(w.under)); got != float64(w.under.used) {
				t.Errorf("pod 2's used bytes = %v, want %d (the watchdog maps its process)", got, w.under.used)
			}
			w.stillRunning(t, w.under)
			// One violation per over-limit run. After a kill, a poll that still
			// finds the dead process in the mock NVML (before the test removed
			// it) starts a new run whose kill is skipped: count those.
			skipped := w.metric(t, "gpufrac_memory_limit_actions_total", map[string]string{"action": "kill", "result": "skipped"})
			if v := w.metric(t, "gpufrac_memory_limit_violations_total", violations); v != 1+skipped {
				t.Errorf("%v violations counted on the node, want %v", v, 1+skipped)
			}
		})
	}
}

// watchdogBed is one enforcement node with its two fraction pods.
type watchdogBed struct {
	c          *cluster.Cluster
	agent      *cluster.NodeAgent
	procRoot   string
	gpu        string // the GPU both fractions share
	limitBytes uint64 // a 30% fraction's GPU memory limit
	over       *container
	under      *container
}

// container is a pod's container with its real process.
type container struct {
	pod    *corev1.Pod
	name   string
	id     string // the runtime's container ID
	pid    uint32
	used   uint64      // GPU memory NVML reports for it
	exited chan string // receives the process state when it ends
	proc   *exec.Cmd
}

// writtenBack waits until gpufrac-node has written back each pod's GPU and
// returns the pods.
func (w *watchdogBed) writtenBack(t *testing.T, names ...string) []*corev1.Pod {
	t.Helper()
	out := make([]*corev1.Pod, len(names))
	for i, n := range names {
		waitFor(t, 30*time.Second, n+" allocated-gpu", func(ctx context.Context) (bool, error) {
			p, err := w.c.Client.CoreV1().Pods("default").Get(ctx, n, metav1.GetOptions{})
			if err != nil || p.Annotations[api.AnnotationAllocatedGPU] == "" {
				return false, nil
			}
			out[i] = p
			return true, nil
		})
	}
	return out
}

// limitOf is the GPU memory limit of a fraction of units on the shared GPU,
// from the node's inventory, as gpufrac-node computes it.
func (w *watchdogBed) limitOf(t *testing.T, node string, units int) uint64 {
	t.Helper()
	n, err := w.c.Client.CoreV1().Nodes().Get(t.Context(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	inv, err := api.DecodeInventory(n.Annotations[api.AnnotationGPUInventory])
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range inv {
		if g.UUID == w.gpu {
			return resource.MemoryLimitMiB(nvidia.GPU{UUID: g.UUID, MemoryBytes: g.MemoryMiB << 20}, units) << 20
		}
	}
	t.Fatalf("GPU %s not in %s's inventory", w.gpu, node)
	return 0
}

// startContainer starts a real process for the pod's first container, puts it
// in the fixture /proc tree under the pod's cgroup with a containerd ID, and
// reports that ID in the pod's status as a kubelet would (kwok runs no
// containers and writes no container IDs). The process is killed at the end
// of the test if it still runs.
func (w *watchdogBed) startContainer(t *testing.T, p *corev1.Pod, i int) *container {
	t.Helper()
	ctr := &container{name: p.Spec.Containers[0].Name, exited: make(chan string, 1)}
	ctr.id = enforcementtest.ContainerID(p.Namespace + "/" + p.Name + "/" + ctr.name)
	ctr.proc = exec.Command("sleep", "600")
	if err := ctr.proc.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = ctr.proc.Wait(); ctr.exited <- ctr.proc.ProcessState.String() }()
	t.Cleanup(func() { _ = ctr.proc.Process.Kill() })
	ctr.pid = uint32(ctr.proc.Process.Pid)
	// The kernel's stat (real start time): the killer checks both trees, so
	// a kill through the fixture can only reach this process.
	if err := enforcementtest.CopyProc(w.procRoot, ctr.pid, enforcementtest.CgroupContainerdSystemd(p.UID, ctr.id)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = enforcementtest.RemoveProc(w.procRoot, ctr.pid) })

	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := w.c.Client.CoreV1().Pods(p.Namespace).Get(t.Context(), p.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		found := false
		for j := range cur.Status.ContainerStatuses {
			if cur.Status.ContainerStatuses[j].Name == ctr.name {
				cur.Status.ContainerStatuses[j].ContainerID = "containerd://" + ctr.id
				found = true
			}
		}
		if !found {
			return fmt.Errorf("pod %s has no status for container %s", p.Name, ctr.name)
		}
		_, err = w.c.Client.CoreV1().Pods(p.Namespace).UpdateStatus(t.Context(), cur, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatalf("writing the container ID of %s: %v", p.Name, err)
	}
	cur, err := w.c.Client.CoreV1().Pods(p.Namespace).Get(t.Context(), p.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctr.pod = cur
	return ctr
}

// writeProcesses makes the mock NVML list the containers' processes on the
// shared GPU.
func (w *watchdogBed) writeProcesses(t *testing.T, ctrs ...*container) {
	t.Helper()
	var procs []nvidia.Process
	for _, ctr := range ctrs {
		procs = append(procs, nvidia.Process{PID: ctr.pid, UsedBytes: ctr.used})
	}
	if err := nvidia.WriteMockProcesses(w.agent.StateDir, map[string][]nvidia.Process{w.gpu: procs}); err != nil {
		t.Fatal(err)
	}
}

// series is a container's label set in the per-container metrics.
func (w *watchdogBed) series(ctr *container) map[string]string {
	return map[string]string{"namespace": ctr.pod.Namespace, "pod": ctr.pod.Name, "container": ctr.name, "gpu_uuid": w.gpu}
}

// stillRunning checks a pod is Running, not being deleted, and its process alive.
func (w *watchdogBed) stillRunning(t *testing.T, ctr *container) {
	t.Helper()
	p, err := w.c.Client.CoreV1().Pods(ctr.pod.Namespace).Get(t.Context(), ctr.pod.Name, metav1.GetOptions{})
	if err != nil || p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
		t.Errorf("pod %s is not Running any more: %v", ctr.pod.Name, err)
	}
	select {
	case state := <-ctr.exited:
		t.Errorf("the process of pod %s ended: %s", ctr.pod.Name, state)
	default:
	}
	if err := syscall.Kill(int(ctr.pid), 0); err != nil {
		t.Errorf("the process of pod %s is gone: %v", ctr.pod.Name, err)
	}
}

// events returns "reason: message" of the gpufrac-node events on a pod
// (reason "" for all of them).
func (w *watchdogBed) events(t *testing.T, p *corev1.Pod, reason string) []string {
	t.Helper()
	l, err := w.c.Client.CoreV1().Events(p.Namespace).List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("involvedObject.uid", string(p.UID)).String(),
	})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range l.Items {
		// gpufrac-node writes events.k8s.io events (tools/events): their
		// core/v1 view has the reporting controller, not a source.
		if e.ReportingController != "gpufrac-node" || (reason != "" && e.Reason != reason) {
			continue
		}
		out = append(out, e.Reason+": "+e.Message)
	}
	return out
}

// waitEvent waits for a gpufrac-node event with reason on the pod whose
// message contains every want.
func (w *watchdogBed) waitEvent(t *testing.T, p *corev1.Pod, reason string, want ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		seen := w.events(t, p, "")
		for _, e := range seen {
			if !strings.HasPrefix(e, reason+": ") {
				continue
			}
			ok := true
			for _, s := range want {
				ok = ok && strings.Contains(e, s)
			}
			if ok {
				t.Logf("event on %s: %s", p.Name, e)
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no %s event on %s with %q after 30s; gpufrac-node's events on it:\n%s", reason, p.Name, want, strings.Join(seen, "\n"))
		case <-tick.C:
		}
	}
}

// pollsPass waits until the watchdog has polled n more times.
func (w *watchdogBed) pollsPass(t *testing.T, n float64) {
	t.Helper()
	start := w.metric(t, "gpufrac_enforcement_poll_duration_seconds_count", nil)
	w.waitMetric(t, "gpufrac_enforcement_poll_duration_seconds_count", nil, start+n)
}

// waitMetric waits until a series of the agent's /metrics reaches want.
func (w *watchdogBed) waitMetric(t *testing.T, name string, labels map[string]string, want float64) {
	t.Helper()
	var got float64
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if got = w.metric(t, name, labels); got >= want {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s%v = %v after 30s, want %v", name, labels, got, want)
		case <-tick.C:
		}
	}
}

// metric reads the value of the series of name whose labels include labels
// from the agent's /metrics (0 when there is none).
func (w *watchdogBed) metric(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	_, addr := w.agent.Process() // the current gpufrac-node: it may have been restarted
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("reading gpufrac-node's metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		series, value, ok := cutLast(line, " ")
		if !ok {
			continue
		}
		n, ls := parseSeries(series)
		if n != name || !containsLabels(ls, labels) {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		return v
	}
	return 0
}

func cutLast(s, sep string) (before, after string, ok bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}

// parseSeries splits `name{a="x",b="y"}` into its name and labels (values
// without escaped quotes, as gpufrac's are).
func parseSeries(s string) (string, map[string]string) {
	name, rest, found := strings.Cut(s, "{")
	labels := map[string]string{}
	if !found {
		return name, labels
	}
	for _, kv := range strings.Split(strings.TrimSuffix(rest, "}"), ",") {
		k, v, ok := strings.Cut(kv, "=")
		if ok {
			labels[k] = strings.Trim(v, `"`)
		}
	}
	return name, labels
}

func containsLabels(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// mibString formats bytes as the watchdog's events do.
func mibString(b uint64) string {
	if b%(1<<20) == 0 {
		return strconv.FormatUint(b>>20, 10) + " MiB"
	}
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}
