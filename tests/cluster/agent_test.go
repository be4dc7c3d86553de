package cluster_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/tests/cluster"
)

// nodeAgentBin is gpufrac-node built from the working tree by TestMain (empty with
// -short), so the tests never run a stale bin/gpufrac-node.
var nodeAgentBin string

func TestMain(m *testing.M) {
	flag.Parse()
	var dir string
	if !testing.Short() {
		var err error
		if dir, err = os.MkdirTemp("", "gpufrac-node-bin-"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		nodeAgentBin = filepath.Join(dir, "gpufrac-node")
		build := exec.Command("go", "build", "-o", nodeAgentBin, "github.com/gpufrac/gpufrac/cmd/gpufrac-node")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "building gpufrac-node:", err)
			os.Exit(1)
		}
	}
	code := m.Run()
	if dir != "" {
		os.RemoveAll(dir)
	}
	os.Exit(code)
}

// gpuNode is an H100 kwok GPU node without GPUs in its capacity: its agent adds them.
func gpuNode(name string) cluster.NodeSpec {
	return cluster.NodeSpec{
		Name:   name,
		Labels: map[string]string{api.LabelGPUNode: "true", api.LabelGPUProduct: cluster.H100Product},
		Capacity: cluster.ResourceList(map[corev1.ResourceName]string{
			corev1.ResourceCPU: "192", corev1.ResourceMemory: "2048Gi", corev1.ResourcePods: "110",
		}),
	}
}

// onNode pins a pod to a node through its hostname label (the scheduler still decides).
func onNode(pod *corev1.Pod, node string) *corev1.Pod {
	pod.Spec.NodeSelector = map[string]string{corev1.LabelHostname: node}
	return pod
}

// fractionPod asks for units percent of one GPU.
func fractionPod(name string, units int) *corev1.Pod {
	pod := gpuPod(name, 1)
	pod.Spec.Containers[0].Resources.Limits = cluster.ResourceList(map[corev1.ResourceName]string{
		api.ResourceFraction: fmt.Sprint(units),
	})
	return pod
}

// bindFraction creates a fraction pod of gpufrac-scheduler and binds it to a
// node itself, as the coordinator does but without a GPU choice: gpufrac's
// admission policies keep fractions away from kube-scheduler and from
// spec.nodeName, so the test plays the coordinator (as admin, through the
// pods/binding subresource) and the node agent picks the GPU by its own rule.
func bindFraction(t *testing.T, c *cluster.Cluster, pod *corev1.Pod, node string) {
	t.Helper()
	pod.Spec.SchedulerName = api.SchedulerName
	createPod(t, c, pod)
	if err := c.Client.CoreV1().Pods(pod.Namespace).Bind(t.Context(), &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("binding %s to %s: %v", pod.Name, node, err)
	}
}

func createPod(t *testing.T, c *cluster.Cluster, pod *corev1.Pod) {
	t.Helper()
	if _, err := c.Client.CoreV1().Pods(pod.Namespace).Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func getPod(t *testing.T, c *cluster.Cluster, name string) *corev1.Pod {
	t.Helper()
	pod, err := c.Client.CoreV1().Pods(metav1.NamespaceDefault).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

// podDevices lists, through the node's PodResources socket, the device IDs the
// pod's containers hold for a resource.
func podDevices(t *testing.T, agent *cluster.NodeAgent, pod, resource string) []string {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+agent.PodResourcesSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	resp, err := podresourcesv1.NewPodResourcesListerClient(conn).Get(ctx, &podresourcesv1.GetPodResourcesRequest{
		PodName: pod, PodNamespace: metav1.NamespaceDefault,
	})
	if err != nil {
		t.Fatalf("PodResources Get %s on %s: %v", pod, agent.Node, err)
	}
	var ids []string
	for _, ctr := range resp.GetPodResources().GetContainers() {
		for _, d := range ctr.GetDevices() {
			if d.GetResourceName() == resource {
				ids = append(ids, d.GetDeviceIds()...)
			}
		}
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

// nodeResources returns a node's capacity and allocatable of the GPU resources.
func nodeResources(ctx context.Context, c *cluster.Cluster, name string) (map[string]string, error) {
	node, err := c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, res := range []corev1.ResourceName{api.ResourceGPU, api.ResourceFraction} {
		if q, ok := node.Status.Capacity[res]; ok {
			out["capacity "+string(res)] = q.String()
		}
		if q, ok := node.Status.Allocatable[res]; ok {
			out["allocatable "+string(res)] = q.String()
		}
	}
	return out, nil
}

// processGone reports whether a process group has no live member left.
func processGone(pid int) bool {
	return errors.Is(syscall.Kill(-pid, 0), syscall.ESRCH)
}

// TestNodeAgents runs a real gpufrac-node per kwok GPU node under kube-scheduler:
// the nodes get their GPU resources from their agents, pods are admitted through
// the agents (or fail with the plugin's message), and PodResources shows what
// each pod holds.
func TestNodeAgents(t *testing.T) {
	clusterTest(t)
	c := cluster.StartForTest(t, cluster.Options{NodeAgents: &cluster.NodeAgentOptions{Binary: nodeAgentBin}})
	ctx := t.Context()
	agents := map[string]*cluster.NodeAgent{}

	t.Run("GPU nodes get their resources from gpufrac-node", func(t *testing.T) {
		for _, spec := range []cluster.NodeSpec{gpuNode("gpu-a"), gpuNode("gpu-b"), {Name: "cpu-node"}} {
			if _, err := c.AddNode(ctx, spec); err != nil {
				t.Fatal(err)
			}
		}
		for _, name := range []string{"gpu-a", "gpu-b"} {
			wctx, cancel := context.WithTimeout(ctx, 90*time.Second)
			agent, err := c.WaitForNodeAgent(wctx, name)
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			agents[name] = agent
			if agent.Model != "dgxh100" {
				t.Errorf("node %s agent model = %q, want dgxh100", name, agent.Model)
			}
			want := map[string]string{
				"capacity nvidia.com/gpu": "8", "allocatable nvidia.com/gpu": "8",
				"capacity gpufrac.io/gpu-fraction": "800", "allocatable gpufrac.io/gpu-fraction": "800",
			}
			var got map[string]string
			waitFor(t, 30*time.Second, name+" GPU resources in the node status", func(ctx context.Context) (bool, error) {
				var err error
				got, err = nodeResources(ctx, c, name)
				return cmp.Equal(want, got), err
			})
			// The agent published its inventory with its ServiceAccount's RBAC.
			waitFor(t, 30*time.Second, name+" GPU inventory annotation", func(ctx context.Context) (bool, error) {
				node, err := c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					return false, err
				}
				inv, err := api.DecodeInventory(node.Annotations[api.AnnotationGPUInventory])
				return err == nil && len(inv) == 8, nil
			})
		}
		// The agents run with the chart's arguments: CDI device names, which
		// the node's spec (the harness plays the NVIDIA toolkit) resolves.
		for name, agent := range agents {
			waitFor(t, 10*time.Second, name+" CDI devices resolved", func(ctx context.Context) (bool, error) {
				body, err := agent.Metrics(ctx)
				return strings.Contains(body, "gpufrac_cdi_devices_served 8\n") && strings.Contains(body, "gpufrac_cdi_devices_unresolved 0\n"), err
			})
		}
		if got := c.NodeAgent("cpu-node"); got != nil {
			t.Errorf("cpu-node has a node agent: %+v", got)
		}
		if got := len(c.NodeAgents()); got != 2 {
			t.Errorf("NodeAgents() has %d agents, want 2", got)
		}
	})
	if t.Failed() {
		t.FailNow()
	}

	t.Run("a whole-GPU pod runs and holds its GPU in PodResources", func(t *testing.T) {
		createPod(t, c, onNode(gpuPod("whole-0", 1), "gpu-a"))
		waitFor(t, 30*time.Second, "whole-0 Running", podRunning(c, "whole-0"))
		devs := podDevices(t, agents["gpu-a"], "whole-0", api.ResourceGPU)
		if len(devs) != 1 || !strings.HasPrefix(devs[0], "GPU-") {
			t.Errorf("whole-0 holds %v in PodResources, want one GPU UUID", devs)
		}
		if pod := getPod(t, c, "whole-0"); pod.Annotations[cluster.AnnotationAdmitted] != "true" {
			t.Errorf("whole-0 annotations %v lack %s=true", pod.Annotations, cluster.AnnotationAdmitted)
		}
	})

	t.Run("a pod without devices runs on the CPU node", func(t *testing.T) {
		pod := onNode(gpuPod("cpu-only", 1), "cpu-node")
		pod.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
		createPod(t, c, pod)
		waitFor(t, 30*time.Second, "cpu-only Running", podRunning(c, "cpu-only"))
	})

	t.Run("a fraction pod runs and gets its GPU written back", func(t *testing.T) {
		bindFraction(t, c, fractionPod("frac-30", 30), "gpu-b")
		waitFor(t, 30*time.Second, "frac-30 Running", podRunning(c, "frac-30"))
		units := podDevices(t, agents["gpu-b"], "frac-30", api.ResourceFraction)
		if len(units) != 30 {
			t.Fatalf("frac-30 holds %d units in PodResources, want 30", len(units))
		}
		gpu, _, _ := strings.Cut(units[0], "::")
		waitFor(t, 30*time.Second, "frac-30 gpufrac.io/allocated-gpu", func(ctx context.Context) (bool, error) {
			pod, err := c.Client.CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, "frac-30", metav1.GetOptions{})
			return err == nil && pod.Annotations[api.AnnotationAllocatedGPU] == gpu, err
		})
	})

	t.Run("a failed allocation fails the pod with the plugin's message", func(t *testing.T) {
		// The plugin refuses more than one GPU's 100 units, whoever bound the pod.
		bindFraction(t, c, fractionPod("frac-150", 150), "gpu-b")
		waitFor(t, 30*time.Second, "frac-150 Failed", func(ctx context.Context) (bool, error) {
			pod, err := c.Client.CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, "frac-150", metav1.GetOptions{})
			return err == nil && pod.Status.Phase == corev1.PodFailed, err
		})
		pod := getPod(t, c, "frac-150")
		if pod.Status.Reason != cluster.ReasonUnexpectedAdmissionError {
			t.Errorf("frac-150 reason = %q, want %s", pod.Status.Reason, cluster.ReasonUnexpectedAdmissionError)
		}
		if !strings.HasPrefix(pod.Status.Message, "Pod was rejected: Allocate failed due to") || !strings.Contains(pod.Status.Message, "at most 100 units") {
			t.Errorf("frac-150 message %q does not carry the plugin's message", pod.Status.Message)
		}
		events, err := c.Client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("involvedObject.name", "frac-150").String(),
		})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(events.Items, func(e corev1.Event) bool { return e.Reason == cluster.ReasonUnexpectedAdmissionError }) {
			t.Errorf("no %s event for frac-150 among %d events", cluster.ReasonUnexpectedAdmissionError, len(events.Items))
		}
		if got := podAllocations(agents["gpu-b"], "frac-150"); got != 0 {
			t.Errorf("frac-150 still holds %d allocations after failing", got)
		}
	})

	t.Run("whole-GPU pods fill the node and the ninth stays Pending", func(t *testing.T) {
		for i := 1; i < 8; i++ {
			createPod(t, c, onNode(gpuPod(fmt.Sprintf("whole-%d", i), 1), "gpu-a"))
		}
		for i := 1; i < 8; i++ {
			waitFor(t, 30*time.Second, fmt.Sprintf("whole-%d Running", i), podRunning(c, fmt.Sprintf("whole-%d", i)))
		}
		held := map[string]string{}
		for i := range 8 {
			name := fmt.Sprintf("whole-%d", i)
			for _, d := range podDevices(t, agents["gpu-a"], name, api.ResourceGPU) {
				if other, dup := held[d]; dup {
					t.Errorf("GPU %s held by %s and %s", d, other, name)
				}
				held[d] = name
			}
		}
		if len(held) != 8 {
			t.Errorf("8 whole-GPU pods hold %d distinct GPUs, want 8", len(held))
		}
		createPod(t, c, onNode(gpuPod("whole-8", 1), "gpu-a"))
		waitFor(t, 30*time.Second, "whole-8 Unschedulable", func(ctx context.Context) (bool, error) {
			pod, err := c.Client.CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, "whole-8", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			for _, cond := range pod.Status.Conditions {
				if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse {
					return cond.Reason == corev1.PodReasonUnschedulable && strings.Contains(cond.Message, "Insufficient "+api.ResourceGPU), nil
				}
			}
			return false, nil
		})
		if pod := getPod(t, c, "whole-8"); pod.Status.Phase != corev1.PodPending || pod.Spec.NodeName != "" {
			t.Errorf("whole-8: phase %s on %q, want Pending on no node", pod.Status.Phase, pod.Spec.NodeName)
		}
	})

	t.Run("a deleted pod frees its GPU for the pending one", func(t *testing.T) {
		freed := podDevices(t, agents["gpu-a"], "whole-3", api.ResourceGPU)
		if err := c.Client.CoreV1().Pods(metav1.NamespaceDefault).Delete(ctx, "whole-3", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, "whole-8 Running", podRunning(c, "whole-8"))
		if diff := cmp.Diff(freed, podDevices(t, agents["gpu-a"], "whole-8", api.ResourceGPU)); diff != "" {
			t.Errorf("whole-8 did not get the GPU whole-3 freed (-want +got):\n%s", diff)
		}
	})

	t.Run("an Xid on a GPU lowers the node's allocatable", func(t *testing.T) {
		node, err := c.Client.CoreV1().Nodes().Get(ctx, "gpu-b", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		inv, err := api.DecodeInventory(node.Annotations[api.AnnotationGPUInventory])
		if err != nil {
			t.Fatal(err)
		}
		if err := nvidia.WriteMockXid(agents["gpu-b"].StateDir, inv[5].UUID, 79); err != nil {
			t.Fatal(err)
		}
		want := map[string]string{
			"capacity nvidia.com/gpu": "8", "allocatable nvidia.com/gpu": "7",
			"capacity gpufrac.io/gpu-fraction": "800", "allocatable gpufrac.io/gpu-fraction": "700",
		}
		waitFor(t, 30*time.Second, "gpu-b allocatable without the failed GPU", func(ctx context.Context) (bool, error) {
			got, err := nodeResources(ctx, c, "gpu-b")
			return cmp.Equal(want, got), err
		})
	})

	t.Run("a node agent rolled to another binary and chart keeps its pods' devices", func(t *testing.T) {
		// Another version: a copy of the binary, and a copy of the chart
		// (ChartOptions.Dir) whose DaemonSet passes other arguments.
		dir := t.TempDir()
		bin := filepath.Join(dir, "gpufrac-node-next")
		raw, err := os.ReadFile(nodeAgentBin)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(bin, raw, 0o755); err != nil {
			t.Fatal(err)
		}
		src, err := cluster.ChartDir()
		if err != nil {
			t.Fatal(err)
		}
		chart := filepath.Join(dir, "chart")
		if err := os.CopyFS(chart, os.DirFS(src)); err != nil {
			t.Fatal(err)
		}
		values := filepath.Join(chart, "values.yaml")
		v, err := os.ReadFile(values)
		if err != nil {
			t.Fatal(err)
		}
		next := strings.Replace(string(v), "healthQuietPeriod: 5m", "healthQuietPeriod: 17m", 1)
		if next == string(v) {
			t.Fatal("the chart's values.yaml has no healthQuietPeriod: 5m to change")
		}
		if err := os.WriteFile(values, []byte(next), 0o644); err != nil {
			t.Fatal(err)
		}
		testbed, err := cluster.TestbedValues()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.InstallChart(ctx, cluster.ChartOptions{Dir: chart, ValuesFiles: []string{testbed}}); err != nil {
			t.Fatal(err)
		}
		agent := agents["gpu-a"]
		held := map[string][]string{}
		for _, i := range []int{0, 1, 2, 4, 5, 6, 7, 8} { // whole-8 took whole-3's GPU
			name := fmt.Sprintf("whole-%d", i)
			held[name] = podDevices(t, agent, name, api.ResourceGPU)
		}
		old, _ := agent.Process()
		if err := agent.Roll(ctx, bin); err != nil {
			t.Fatal(err)
		}
		now, addr := agent.Process()
		if now.PID == old.PID || !processGone(old.PID) {
			t.Fatalf("after the roll gpufrac-node runs as %d, the old process %d (gone: %v)", now.PID, old.PID, processGone(old.PID))
		}
		if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", now.PID)); err != nil || exe != bin {
			t.Errorf("the rolled gpufrac-node runs %s (%v), want %s", exe, err, bin)
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", now.PID))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(strings.Split(string(cmdline), "\x00"), "--health-quiet-period=17m") {
			t.Errorf("the rolled gpufrac-node's arguments %q lack the new chart's --health-quiet-period=17m", cmdline)
		}
		for name, devs := range held {
			if got := podDevices(t, agent, name, api.ResourceGPU); !cmp.Equal(devs, got) {
				t.Errorf("%s held %v before the roll, %v after", name, devs, got)
			}
		}
		waitFor(t, 30*time.Second, "gpu-a's resources after the roll", func(ctx context.Context) (bool, error) {
			got, err := nodeResources(ctx, c, "gpu-a")
			return got["capacity nvidia.com/gpu"] == "8" && got["capacity gpufrac.io/gpu-fraction"] == "800", err
		})
		// Metrics reads the current process, on its own port.
		body, err := agent.Metrics(ctx)
		if err != nil || !strings.Contains(body, "gpufrac_") {
			t.Errorf("the rolled agent's metrics (%s): %v", addr, err)
		}
	})

	t.Run("deleting a node stops its agent", func(t *testing.T) {
		agent := agents["gpu-b"]
		if err := c.Client.CoreV1().Nodes().Delete(ctx, "gpu-b", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, "gpu-b's agent gone", func(context.Context) (bool, error) {
			return c.NodeAgent("gpu-b") == nil && processGone(agent.PID), nil
		})
		if _, err := os.Stat(agent.PodResourcesSocket); err == nil {
			t.Errorf("gpu-b's PodResources socket %s still exists", agent.PodResourcesSocket)
		}
		if _, err := os.Stat(agent.LogPath); err != nil {
			t.Errorf("gpu-b's agent log is gone: %v", err)
		}
	})
}

// podAllocations counts a pod's allocations on the node's kubelet simulator.
func podAllocations(agent *cluster.NodeAgent, pod string) int {
	n := 0
	for _, a := range agent.Kubelet.Allocations() {
		if a.Pod.Name == pod {
			n++
		}
	}
	return n
}

// TestNodeAgentsWithKarpenter has Karpenter create a GPU node for a pending 8-GPU
// pod; a gpufrac-node comes up for it and admits the pod; once the pod is deleted
// Karpenter removes the empty node and its agent stops.
func TestNodeAgentsWithKarpenter(t *testing.T) {
	clusterTest(t)
	// The mock GPU models have 8 GPUs: only the 8-GPU machine matches its agent.
	types := slices.DeleteFunc(cluster.DefaultInstanceTypes(), func(it cluster.InstanceType) bool { return it.Name == "gpu-1x-h100" })
	c := cluster.StartForTest(t, cluster.Options{
		Karpenter:  &cluster.KarpenterOptions{InstanceTypes: types},
		NodeAgents: &cluster.NodeAgentOptions{Binary: nodeAgentBin},
	})
	ctx := t.Context()

	createPod(t, c, gpuPod("train", 8))
	var nodeName string
	waitFor(t, 90*time.Second, "train bound to Karpenter's node", func(ctx context.Context) (bool, error) {
		pod, err := c.Client.CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, "train", metav1.GetOptions{})
		nodeName = pod.Spec.NodeName
		return err == nil && nodeName != "", err
	})
	wctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	agent, err := c.WaitForNodeAgent(wctx, nodeName)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "train Running", podRunning(c, "train"))
	if got := podDevices(t, agent, "train", api.ResourceGPU); len(got) != 8 {
		t.Errorf("train holds %d GPUs in PodResources, want 8: %v", len(got), got)
	}
	node, err := c.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if q := node.Status.Allocatable[api.ResourceFraction]; q.Value() != 800 {
		t.Errorf("Karpenter's node allocatable %s = %s, want 800 from its agent", api.ResourceFraction, q.String())
	}

	if err := c.Client.CoreV1().Pods(metav1.NamespaceDefault).Delete(ctx, "train", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 3*time.Minute, "Karpenter removing the empty node", func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
	waitFor(t, 30*time.Second, "the node's agent gone", func(context.Context) (bool, error) {
		return c.NodeAgent(nodeName) == nil && processGone(agent.PID), nil
	})
}
