package e2e

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/tests/builders"
	"github.com/gpufrac/gpufrac/tests/cluster"
	"github.com/gpufrac/gpufrac/tests/images"
	"github.com/gpufrac/gpufrac/tests/images/report"
)

// realBed is a cluster with one real GPU node (kubelet, containerd, runc,
// CNI) running gpufrac-node as the chart's DaemonSet pod from its image, on
// mock NVML.
type realBed struct {
	c    *cluster.Cluster
	node *cluster.GPUNode
}

// realNodeConfig is gpufrac-node's config on the real node: fractions, and
// a watchdog that acts within a second.
const realNodeConfig = `version: v1
default:
  mode: fraction
  fraction: {enforcement: kill, pollInterval: 200ms, samples: 2}
`

// startRealBed starts a cluster and a real GPU node (cluster.StartGPUNode).
func startRealBed(t *testing.T, o cluster.GPUNodeOptions) *realBed {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end: needs the local cluster (make tools)")
	}
	bin := filepath.Join(repoRoot(t), "bin")
	if err := errors.Join(cluster.RealNodeRequirements(bin), cluster.MockDriverRequirements()); err != nil {
		// Not root, or no runc/CNI where make tools could not install them.
		t.Skipf("no real node on this machine: %v", err)
	}
	buildBinary(t, "gpufrac-node")
	buildBinary(t, "gpufrac-coordinator")
	c := cluster.StartForTest(t, cluster.Options{})
	if o.Config == "" {
		o.Config = realNodeConfig
	}
	n, err := c.StartGPUNode(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Stop(); err != nil {
			t.Errorf("stopping the real node: %v", err)
		}
	})
	return &realBed{c: c, node: n}
}

// workloadPod is a pod of the workload image in ns.
func workloadPod(name, ns string) *builders.PodWrapper {
	return builders.MakePod(name, ns).CPU("10m").Memory("16Mi")
}

// withWorkload points every container of p at the workload image, each
// reporting under its own name (init containers exit after reporting).
func withWorkload(p *corev1.Pod) *corev1.Pod {
	for i := range p.Spec.InitContainers {
		c := &p.Spec.InitContainers[i]
		c.Image, c.ImagePullPolicy = images.WorkloadRef, corev1.PullNever
		c.Args = []string{"-name=" + c.Name, "-sleep=1ms"}
	}
	for i := range p.Spec.Containers {
		c := &p.Spec.Containers[i]
		c.Image, c.ImagePullPolicy = images.WorkloadRef, corev1.PullNever
		c.Args = []string{"-name=" + c.Name}
	}
	var grace int64 = 1
	p.Spec.TerminationGracePeriodSeconds = &grace
	return p
}

// report is the report of a container of the workload image.
func (b *realBed) report(t *testing.T, pod *corev1.Pod, container string) report.Report {
	t.Helper()
	rep, err := b.node.Report(t.Context(), pod, container)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// gpuOf is the device node of the GPU the coordinator placed pod on.
func (b *realBed) gpuOf(t *testing.T, pod *corev1.Pod) string {
	t.Helper()
	hint := pod.Annotations[api.AnnotationGPU]
	for _, g := range b.node.Driver.GPUs {
		if strings.Contains(hint, g.UUID) || hint == strconv.Itoa(g.Index) {
			return fmt.Sprintf("/dev/nvidia%d", g.Minor)
		}
	}
	t.Fatalf("%s: placement %q names no GPU of the node", pod.Name, hint)
	return ""
}

// nodePID is the PID a container's first process has in the node's PID
// namespace, where gpufrac-node (hostPID) and NVML see it: found through
// the process's cgroup (which names the container) and its NSpid line.
func nodePID(containerID string) (int, error) {
	id := containerID[strings.Index(containerID, "://")+3:]
	procs, _ := filepath.Glob("/proc/[0-9]*/cgroup")
	for _, p := range procs {
		cg, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(cg), id) {
			continue
		}
		status, err := os.ReadFile(filepath.Join(filepath.Dir(p), "status"))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(status), "\n") {
			f := strings.Fields(strings.TrimPrefix(l, "NSpid:"))
			// host, node, container: the container's first process is 1 in its own.
			if strings.HasPrefix(l, "NSpid:") && len(f) == 3 && f[2] == "1" {
				return strconv.Atoi(f[1])
			}
		}
	}
	return 0, fmt.Errorf("no process of container %s", id)
}

// Issue 26: gpufrac-node as the chart's DaemonSet pod on a real kubelet and
// containerd, and what containers on that node see.
func TestRealNode(t *testing.T) {
	b := startRealBed(t, cluster.GPUNodeOptions{GPUs: 2})
	c := b.c
	startCoordinator(t, c, "real")
	const ns = "rn-tenant"
	if _, err := c.Client.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	applyYAML(t, c, []byte("apiVersion: gpufrac.io/v1alpha1\nkind: Queue\nmetadata: {name: rn}\nspec:\n  namespaces: [\""+ns+"\"]\n  resources:\n    gpu: {quota: \"2\"}\n"))

	t.Run("a refused pod carries the plugin's reason through the kubelet's admission", func(t *testing.T) {
		// Bound straight to the node (no scheduler) in a namespace no queue
		// admits: only the device plugin can refuse it. First, while the
		// node's 200 units are free: with fewer than 150 free the kubelet
		// refuses it itself ("requested number of devices unavailable")
		// without asking the plugin.
		b.bindDirect(t, withWorkload(workloadPod("frac-150", metav1.NamespaceDefault).Fraction(150).Obj()))
		waitFor(t, time.Minute, "frac-150 Failed", func(ctx context.Context) (bool, error) {
			p, err := c.Client.CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, "frac-150", metav1.GetOptions{})
			return err == nil && p.Status.Phase == corev1.PodFailed, nil
		})
		p := getPodIn(t, c, metav1.NamespaceDefault, "frac-150")
		if p.Status.Reason != cluster.ReasonUnexpectedAdmissionError || !strings.Contains(p.Status.Message, "at most 100 units") {
			t.Errorf("frac-150: reason %q message %q, want the kubelet's %s with gpufrac's reason", p.Status.Reason, p.Status.Message, cluster.ReasonUnexpectedAdmissionError)
		}
		// The invariant checker counts every pod refused at device admission.
		if err := c.Client.CoreV1().Pods(p.Namespace).Delete(t.Context(), p.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	})
	whole := withWorkload(workloadPod("whole", ns).Queue("rn").GPUs(1).Obj())
	create(t, c, whole)
	waitRunningIn(t, c, ns, 2*time.Minute, whole.Name)
	whole = getPodIn(t, c, ns, "whole")
	fracs := []*corev1.Pod{
		withWorkload(workloadPod("frac-a", ns).Queue("rn").Fraction(30).Obj()),
		withWorkload(workloadPod("frac-b", ns).Queue("rn").Fraction(30).Obj()),
	}
	create(t, c, fracs...)
	multi := withWorkload(workloadPod("multi", ns).Queue("rn").InitContainer("init").Container("app-a").Fraction(20).Container("app-b").Obj())
	create(t, c, multi)
	waitRunningIn(t, c, ns, 2*time.Minute, "frac-a", "frac-b", "multi")

	t.Run("a whole GPU is one device node", func(t *testing.T) {
		rep := b.report(t, whole, whole.Spec.Containers[0].Name)
		if g := rep.GPUs(); len(g) != 1 {
			t.Errorf("whole sees GPUs %v, want one", g)
		}
	})
	t.Run("two 30% fractions share the other GPU and see only it", func(t *testing.T) {
		wholeGPU := strings.Join(b.report(t, whole, whole.Spec.Containers[0].Name).GPUs(), ",")
		var seen []string
		for _, name := range []string{"frac-a", "frac-b"} {
			p := getPodIn(t, c, ns, name)
			rep := b.report(t, p, p.Spec.Containers[0].Name)
			g := rep.GPUs()
			if len(g) != 1 || g[0] != b.gpuOf(t, p) || g[0] == wholeGPU {
				t.Errorf("%s sees GPUs %v, placed on %s, the whole pod holds %s", name, g, b.gpuOf(t, p), wholeGPU)
			}
			seen = append(seen, g...)
			if rep.Env[api.EnvMemoryLimitMiB] == "" {
				t.Errorf("%s has no %s: env %v", name, api.EnvMemoryLimitMiB, rep.Env)
			}
			for _, ctl := range []string{"/dev/nvidiactl", "/dev/nvidia-uvm"} {
				if !slices.ContainsFunc(rep.Devices, func(d report.Device) bool {
					return d.Path == ctl && d.Char
				}) {
					t.Errorf("%s lacks the control device %s: %+v", name, ctl, rep.Devices)
				}
			}
		}
		if len(seen) == 2 && seen[0] != seen[1] {
			t.Errorf("the fractions see %v, want one shared GPU", seen)
		}
	})
	t.Run("init and app containers each see what they asked", func(t *testing.T) {
		p := getPodIn(t, c, ns, "multi")
		if g := b.report(t, p, "app-a").GPUs(); len(g) != 1 || g[0] != b.gpuOf(t, p) {
			t.Errorf("app-a (20%%) sees %v, want %s", g, b.gpuOf(t, p))
		}
		for _, ctr := range []string{"init", "app-b"} {
			if g := b.report(t, p, ctr).GPUs(); len(g) != 0 {
				t.Errorf("%s asked no GPU and sees %v", ctr, g)
			}
		}
	})
	t.Run("PodResources as the real kubelet serves it", func(t *testing.T) {
		sock := filepath.Join(b.node.KubeletRootDir(), "pod-resources", "kubelet.sock")
		conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		list, err := podresourcesapi.NewPodResourcesListerClient(conn).List(ctx, &podresourcesapi.ListPodResourcesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		// Devices per pod/container and resource, as the kubelet records them.
		got := map[string]int{}
		for _, p := range list.GetPodResources() {
			if p.GetNamespace() != ns {
				continue
			}
			for _, ctr := range p.GetContainers() {
				for _, d := range ctr.GetDevices() {
					got[p.GetName()+"/"+ctr.GetName()+" "+d.GetResourceName()] += len(d.GetDeviceIds())
				}
			}
		}
		want := map[string]int{
			"whole/" + whole.Spec.Containers[0].Name + " " + string(api.ResourceGPU):          1,
			"frac-a/" + fracs[0].Spec.Containers[0].Name + " " + string(api.ResourceFraction): 30,
			"frac-b/" + fracs[1].Spec.Containers[0].Name + " " + string(api.ResourceFraction): 30,
			"multi/app-a " + string(api.ResourceFraction):                                     20,
		}
		if !maps.Equal(got, want) {
			t.Errorf("PodResources List of %s: %v, want %v", ns, got, want)
		}
		alloc, err := podresourcesapi.NewPodResourcesListerClient(conn).GetAllocatableResources(ctx, &podresourcesapi.AllocatableResourcesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		units := map[string]int{}
		for _, d := range alloc.GetDevices() {
			units[d.GetResourceName()] += len(d.GetDeviceIds())
		}
		if units[string(api.ResourceGPU)] != 2 || units[string(api.ResourceFraction)] != 200 {
			t.Errorf("allocatable devices %v, want 2 %s and 200 %s", units, api.ResourceGPU, api.ResourceFraction)
		}
	})
	t.Run("the watchdog kills a real container process over its limit", func(t *testing.T) {
		p := getPodIn(t, c, ns, "frac-a")
		st := p.Status.ContainerStatuses[0]
		pid, err := nodePID(st.ContainerID)
		if err != nil {
			t.Fatal(err)
		}
		uuid := ""
		for _, g := range b.node.Driver.GPUs {
			if b.gpuOf(t, p) == fmt.Sprintf("/dev/nvidia%d", g.Minor) {
				uuid = g.UUID
			}
		}
		// 30 % of 80 GB is about 24 GiB: the process uses 40.
		if err := nvidia.WriteMockProcesses(b.node.MockState, map[string][]nvidia.Process{uuid: {{PID: uint32(pid), UsedBytes: 40 << 30}}}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = nvidia.WriteMockProcesses(b.node.MockState, nil) })
		waitFor(t, time.Minute, "frac-a's container killed and restarted", func(ctx context.Context) (bool, error) {
			p, err := c.Client.CoreV1().Pods(ns).Get(ctx, "frac-a", metav1.GetOptions{})
			if err != nil || len(p.Status.ContainerStatuses) == 0 {
				return false, nil
			}
			s := p.Status.ContainerStatuses[0]
			return s.RestartCount > 0 && s.LastTerminationState.Terminated != nil, nil
		})
		events, err := c.Client.CoreV1().Events(ns).List(t.Context(), metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("involvedObject.name", "frac-a").String()})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(events.Items, func(e corev1.Event) bool {
			return e.Reason == "GPUMemoryProcessKilled" && strings.Contains(e.Message, strconv.Itoa(pid))
		}) {
			t.Errorf("no GPUMemoryProcessKilled event naming PID %d for frac-a", pid)
		}
		if s := getPodIn(t, c, ns, "frac-b").Status.ContainerStatuses[0]; s.RestartCount != 0 {
			t.Errorf("frac-b, under its limit, restarted %d times", s.RestartCount)
		}
	})
	// Both GPUs are held now: one whole, one by the fractions (frac-a, frac-b,
	// multi's app-a: 80 %), so no whole GPU is left on the node.
	t.Run("the kubelet restarts", func(t *testing.T) {
		before := restartsOf(t, c, ns)
		if err := b.node.RestartKubelet(t.Context()); err != nil {
			t.Fatal(err)
		}
		b.checkRestartSurvivors(t, ns, before, "after-kubelet")
	})
	t.Run("containerd restarts", func(t *testing.T) {
		before := restartsOf(t, c, ns)
		if err := b.node.RestartContainerd(t.Context()); err != nil {
			t.Fatal(err)
		}
		b.checkRestartSurvivors(t, ns, before, "after-containerd")
	})
	t.Run("the DaemonSet replaces gpufrac-node's pod", func(t *testing.T) {
		before := restartsOf(t, c, ns)
		old, err := b.node.NodeAgentPod(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Client.CoreV1().Pods(old.Namespace).Delete(t.Context(), old.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 2*time.Minute, "a new gpufrac-node pod Ready", func(ctx context.Context) (bool, error) {
			p, err := b.node.NodeAgentPod(ctx)
			if err != nil || p.UID == old.UID {
				return false, nil
			}
			for _, cond := range p.Status.Conditions {
				if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		})
		b.checkRestartSurvivors(t, ns, before, "after-roll")
	})
}

// restartsOf are the containers' restart counts of the running pods in ns.
func restartsOf(t *testing.T, c *cluster.Cluster, ns string) map[string]int32 {
	t.Helper()
	pods, err := c.Client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int32{}
	for _, p := range pods.Items {
		for _, s := range p.Status.ContainerStatuses {
			out[p.Name+"/"+s.Name] = s.RestartCount
		}
	}
	return out
}

// checkRestartSurvivors checks that the pods of ns run on with the restart
// counts they had, that a whole GPU bound straight to the node is refused
// (every GPU is held: the kubelet's checkpoint and gpufrac-node's records
// survived), and that the invariant checker holds.
func (b *realBed) checkRestartSurvivors(t *testing.T, ns string, before map[string]int32, probe string) {
	t.Helper()
	c := b.c
	waitFor(t, 2*time.Minute, b.node.Name()+" Ready with its GPUs again", func(ctx context.Context) (bool, error) {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, b.node.Name(), metav1.GetOptions{})
		if err != nil || !cluster.IsNodeReady(n) {
			return false, nil
		}
		q := n.Status.Allocatable[api.ResourceFraction]
		return q.Value() == int64(100*len(b.node.Driver.GPUs)), nil
	})
	if after := restartsOf(t, c, ns); !maps.Equal(before, after) {
		t.Errorf("restart counts changed: before %v, after %v", before, after)
	}
	for name := range before {
		p := getPodIn(t, c, ns, strings.Split(name, "/")[0])
		if p.Status.Phase != corev1.PodRunning {
			t.Errorf("%s is %s after the restart", p.Name, p.Status.Phase)
		}
	}
	b.bindDirect(t, withWorkload(workloadPod(probe, metav1.NamespaceDefault).GPUs(1).Obj()))
	waitFor(t, time.Minute, probe+" refused", func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, probe, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		if p.Status.Phase == corev1.PodRunning {
			return false, fmt.Errorf("%s got a GPU every pod of %s already holds", probe, ns)
		}
		return p.Status.Phase == corev1.PodFailed && p.Status.Reason == cluster.ReasonUnexpectedAdmissionError, nil
	})
	// The refusal was the point; the invariant checker counts every pod
	// rejected at device admission as a fault, so the probe goes first.
	if err := c.Client.CoreV1().Pods(metav1.NamespaceDefault).Delete(t.Context(), probe, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, c)
}

// bindDirect creates p and binds it to the node as the cluster admin, so
// that only the kubelet's admission (the device plugin) can refuse it.
// Tenants cannot do this: the admission policies refuse a GPU pod with a
// node name, and pods/binding is the schedulers'. A pod asking a fraction
// must name gpufrac-scheduler (the policies again); in a namespace no
// queue admits, the coordinator leaves it alone. Any other pod names no
// scheduler that runs.
func (b *realBed) bindDirect(t *testing.T, p *corev1.Pod) {
	t.Helper()
	p.Spec.SchedulerName = "gpufrac-e2e-nobody"
	for _, c := range p.Spec.Containers {
		if _, ok := c.Resources.Requests[api.ResourceFraction]; ok {
			p.Spec.SchedulerName = api.SchedulerName
		}
	}
	created, err := b.c.Client.CoreV1().Pods(p.Namespace).Create(t.Context(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	err = b.c.Client.CoreV1().Pods(p.Namespace).Bind(t.Context(), &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: created.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: b.node.Name()},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

func getPodIn(t *testing.T, c *cluster.Cluster, ns, name string) *corev1.Pod {
	t.Helper()
	p, err := c.Client.CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func waitRunningIn(t *testing.T, c *cluster.Cluster, ns string, limit time.Duration, names ...string) {
	t.Helper()
	for _, n := range names {
		waitFor(t, limit, ns+"/"+n+" Running", func(ctx context.Context) (bool, error) {
			p, err := c.Client.CoreV1().Pods(ns).Get(ctx, n, metav1.GetOptions{})
			return err == nil && p.Status.Phase == corev1.PodRunning, nil
		})
	}
}

// Issue 26, mode dra on the real node: kube-scheduler allocates a 30 % claim
// from gpufrac's ResourceSlices, the real kubelet's DRA manager has
// gpufrac-node (registered through the plugin registry) prepare it, and
// containerd injects the claim's CDI devices: the container sees its GPU
// and gpufrac's env. Deleting the pod unprepares the claim.
func TestRealNodeDRA(t *testing.T) {
	b := startRealBed(t, cluster.GPUNodeOptions{GPUs: 2, Config: draConfig, Labels: map[string]string{modeLabel: "dra"}})
	c := b.c
	waitDRAPool(t, c, b.node.Name(), 2*3) // three devices per GPU, as on the simulated nodes
	createTemplates(t, c)
	p := draPod("dra-30", "gpu-30pct")
	p = withWorkload(p)
	if _, err := c.Client.CoreV1().Pods("default").Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRunningIn(t, c, "default", 2*time.Minute, p.Name)
	p = getPodIn(t, c, "default", p.Name)
	rep := b.report(t, p, p.Spec.Containers[0].Name)
	if g := rep.GPUs(); len(g) != 1 {
		t.Errorf("the 30 %% claim's container sees GPUs %v, want one", g)
	}
	if rep.Env[api.EnvMemoryLimitMiB] == "" {
		t.Errorf("no %s in the claim's container: %v", api.EnvMemoryLimitMiB, rep.Env)
	}
	claim := podClaim(t, c, p)
	_, runCDI := b.node.CDIDirs()
	spec := filepath.Join(runCDI, "gpufrac-claim-"+string(claim.UID)+".json")
	if _, err := os.Stat(spec); err != nil {
		t.Errorf("the prepared claim's CDI spec: %v", err)
	}
	if err := c.Client.CoreV1().Pods("default").Delete(t.Context(), p.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the claim unprepared (its CDI spec removed)", func(context.Context) (bool, error) {
		_, err := os.Stat(spec)
		return os.IsNotExist(err), nil
	})
}
