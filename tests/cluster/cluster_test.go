package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/tests/cluster"
)

// clusterTest marks a test that starts a cluster: skipped under -short (make unit).
// Those that run do so in parallel: each has a control plane of its own and
// spends most of its time waiting (go test -parallel bounds how many).
func clusterTest(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a local cluster; skipped with -short")
	}
	t.Parallel()
}

// waitFor polls cond every 100ms until it holds, failing the test after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	began := time.Now()
	if err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, timeout, true, cond); err != nil {
		t.Fatalf("waiting %s for %s: %v", timeout, what, err)
	}
	t.Logf("%s after %s", what, time.Since(began).Round(time.Millisecond))
}

// gpuPod is a default-scheduler pod asking for whole GPUs.
func gpuPod(name string, gpus int) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name:  "main",
				Image: "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{
					Limits: cluster.ResourceList(map[corev1.ResourceName]string{api.ResourceGPU: fmt.Sprint(gpus)}),
				},
			}},
			TerminationGracePeriodSeconds: ptr.To[int64](0),
		},
	}
}

// taintEvicted tells whether kube-controller-manager's taint-eviction
// controller marked the default namespace's pod for deletion.
func taintEvicted(t *testing.T, c *cluster.Cluster, pod string) bool {
	t.Helper()
	l, err := c.Client.CoreV1().Events(metav1.NamespaceDefault).List(t.Context(), metav1.ListOptions{
		FieldSelector: "involvedObject.name=" + pod + ",reason=TaintManagerEviction",
	})
	if err != nil {
		t.Fatal(err)
	}
	return len(l.Items) > 0
}

func podRunning(c *cluster.Cluster, name string) func(ctx context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		pod, err := c.Client.CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return pod.Status.Phase == corev1.PodRunning, nil
	}
}

func nodeReady(c *cluster.Cluster, name string) func(ctx context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		node, err := c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return cluster.IsNodeReady(node), nil
	}
}

// nodeRecorder is an Options.OnNode that records the nodes it was called for and
// which of those calls saw their ctx end.
type nodeRecorder struct {
	mu    sync.Mutex
	seen  []string
	ended []string
}

func (r *nodeRecorder) onNode(ctx context.Context, node *corev1.Node) {
	r.mu.Lock()
	r.seen = append(r.seen, node.Name)
	r.mu.Unlock()
	<-ctx.Done()
	r.mu.Lock()
	r.ended = append(r.ended, node.Name)
	r.mu.Unlock()
}

func (r *nodeRecorder) snapshot() (seen, ended []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.seen), slices.Clone(r.ended)
}

// TestStartStopTwice starts and stops a cluster twice in one process and checks that
// no process (nor process group) of either cluster is left.
func TestStartStopTwice(t *testing.T) {
	clusterTest(t)
	logger, _ := ktesting.NewTestContext(t)
	ctx := klog.NewContext(t.Context(), logger)
	for round := 1; round <= 2; round++ {
		began := time.Now()
		c, err := cluster.Start(ctx, cluster.Options{})
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		started := time.Since(began)
		procs := c.Processes()
		var names []string
		for _, p := range procs {
			names = append(names, p.Name)
			if err := syscall.Kill(p.PID, 0); err != nil {
				t.Errorf("round %d: %s (pid %d) not running while the cluster is up: %v", round, p.Name, p.PID, err)
			}
		}
		// A component restarted on a fresh port (another cluster took its port) is listed twice.
		slices.Sort(names)
		names = slices.Compact(names)
		want := []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"}
		if diff := cmp.Diff(want, names); diff != "" {
			t.Errorf("round %d: processes (-want +got):\n%s", round, diff)
		}
		nss, err := c.Client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("round %d: listing namespaces: %v", round, err)
		}
		var nsNames []string
		for _, ns := range nss.Items {
			nsNames = append(nsNames, ns.Name)
		}
		for _, ns := range []string{"default", "kube-system", "kube-node-lease", "kube-public"} {
			if !slices.Contains(nsNames, ns) {
				t.Errorf("round %d: namespace %s missing from %v", round, ns, nsNames)
			}
		}
		if _, err := os.Stat(c.KubeconfigPath); err != nil {
			t.Errorf("round %d: admin kubeconfig: %v", round, err)
		}

		stopBegan := time.Now()
		if err := c.Stop(); err != nil {
			t.Errorf("round %d: stop: %v", round, err)
		}
		stopped := time.Since(stopBegan)
		for _, p := range procs {
			// Each component leads its own process group; ESRCH means the group is empty.
			if err := syscall.Kill(-p.PID, 0); !errors.Is(err, syscall.ESRCH) {
				t.Errorf("round %d: process group of %s (pgid %d) still there after Stop: kill -0 gave %v", round, p.Name, p.PID, err)
			}
		}
		if err := c.Stop(); err != nil {
			t.Errorf("round %d: second Stop: %v", round, err)
		}
		t.Logf("round %d: start %s, stop %s", round, started.Round(time.Millisecond), stopped.Round(time.Millisecond))
		if t.Failed() {
			t.Logf("round %d: logs kept in %s", round, c.LogDir())
			return
		}
		if err := os.RemoveAll(c.Dir); err != nil {
			t.Errorf("removing %s: %v", c.Dir, err)
		}
	}
}

// TestWholeGPUScheduling runs kube-scheduler against a kwok node with 8 GPUs: the node
// gets Ready, GPU pods run until the GPUs are used up, and the 9th stays Pending.
func TestWholeGPUScheduling(t *testing.T) {
	clusterTest(t)
	rec := &nodeRecorder{}
	c := cluster.StartForTest(t, cluster.Options{OnNode: rec.onNode})
	ctx := t.Context()

	t.Run("nodes become Ready", func(t *testing.T) {
		nodes := []cluster.NodeSpec{
			{
				Name: "cpu-node",
				Capacity: cluster.ResourceList(map[corev1.ResourceName]string{
					corev1.ResourceCPU: "8", corev1.ResourceMemory: "32Gi", corev1.ResourcePods: "110",
				}),
			},
			{
				Name:   "gpu-node",
				Labels: map[string]string{api.LabelGPUNode: "true", api.LabelGPUProduct: cluster.H100Product},
				Capacity: cluster.ResourceList(map[corev1.ResourceName]string{
					corev1.ResourceCPU: "192", corev1.ResourceMemory: "2048Gi", corev1.ResourcePods: "110", api.ResourceGPU: "8",
				}),
			},
		}
		for _, spec := range nodes {
			if _, err := c.AddNode(ctx, spec); err != nil {
				t.Fatal(err)
			}
		}
		for _, spec := range nodes {
			waitFor(t, 30*time.Second, "node "+spec.Name+" Ready", nodeReady(c, spec.Name))
		}
		node, err := c.Client.CoreV1().Nodes().Get(ctx, "gpu-node", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		gpus := node.Status.Allocatable[api.ResourceGPU]
		if gpus.Value() != 8 {
			t.Errorf("gpu-node allocatable %s = %s, want 8", api.ResourceGPU, gpus.String())
		}
	})

	t.Run("OnNode sees only kwok GPU nodes", func(t *testing.T) {
		waitFor(t, 10*time.Second, "OnNode call for gpu-node", func(context.Context) (bool, error) {
			seen, _ := rec.snapshot()
			return len(seen) > 0, nil
		})
		seen, _ := rec.snapshot()
		if diff := cmp.Diff([]string{"gpu-node"}, seen); diff != "" {
			t.Errorf("OnNode calls (-want +got):\n%s", diff)
		}
	})

	t.Run("GPU pods run until the GPUs are used up", func(t *testing.T) {
		for i := range 8 {
			name := fmt.Sprintf("gpu-pod-%d", i)
			if _, err := c.Client.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, gpuPod(name, 1), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 30*time.Second, name+" Running", podRunning(c, name))
			pod, err := c.Client.CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if pod.Spec.NodeName != "gpu-node" {
				t.Errorf("%s runs on %q, want gpu-node", name, pod.Spec.NodeName)
			}
		}
	})

	t.Run("the 9th whole-GPU pod stays Pending", func(t *testing.T) {
		if _, err := c.Client.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, gpuPod("gpu-pod-8", 1), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// kube-scheduler has tried and given up: PodScheduled=False, reason Unschedulable.
		var reason, message string
		waitFor(t, 30*time.Second, "gpu-pod-8 Unschedulable", func(ctx context.Context) (bool, error) {
			pod, err := c.Client.CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, "gpu-pod-8", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			for _, cond := range pod.Status.Conditions {
				if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse {
					reason, message = cond.Reason, cond.Message
					return true, nil
				}
			}
			return false, nil
		})
		pod, err := c.Client.CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, "gpu-pod-8", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if reason != corev1.PodReasonUnschedulable || pod.Status.Phase != corev1.PodPending || pod.Spec.NodeName != "" {
			t.Errorf("gpu-pod-8: reason %q, phase %s, node %q; want Unschedulable, Pending, no node", reason, pod.Status.Phase, pod.Spec.NodeName)
		}
		if !strings.Contains(message, "Insufficient "+api.ResourceGPU) {
			t.Errorf("gpu-pod-8 unschedulable message %q does not name %s", message, api.ResourceGPU)
		}
	})

	t.Run("OnNode ctx ends when the node is deleted", func(t *testing.T) {
		if err := c.Client.CoreV1().Nodes().Delete(ctx, "gpu-node", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "OnNode ctx of gpu-node done", func(context.Context) (bool, error) {
			_, ended := rec.snapshot()
			return slices.Contains(ended, "gpu-node"), nil
		})
	})
}

// TestKarpenterGPUScaleUpAndDown has Karpenter create nodes for pending GPU pods,
// choosing the cheapest instance type that fits, and remove them once the pods are gone.
func TestKarpenterGPUScaleUpAndDown(t *testing.T) {
	clusterTest(t)
	rec := &nodeRecorder{}
	c := cluster.StartForTest(t, cluster.Options{
		Karpenter: &cluster.KarpenterOptions{}, // DefaultInstanceTypes and DefaultNodePools
		OnNode:    rec.onNode,
	})
	ctx := t.Context()
	nodeClaims := c.Dynamic.Resource(cluster.NodeClaimResource())

	waitFor(t, 30*time.Second, "NodePools Ready", func(ctx context.Context) (bool, error) {
		list, err := c.Dynamic.Resource(cluster.NodePoolResource()).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, np := range list.Items {
			if !cluster.ConditionTrue(&np, "Ready") {
				return false, nil
			}
		}
		return len(list.Items) == 2, nil
	})

	// nodeOf waits for a pod to run and returns its node. A pod bound in the
	// instant Karpenter removes its new node's karpenter.sh/unregistered
	// NoExecute taint can be deleted by kube-controller-manager's
	// taint-eviction controller, whose node cache still has the taint
	// (kubernetes/kubernetes#119862, not fixed in v1.34): real clusters lose
	// bare pods to it too. Such a pod is created again, once, and logged; any
	// other loss fails the test.
	nodeOf := func(podName string, gpus int) *corev1.Node {
		t.Helper()
		var pod *corev1.Pod
		recreated := false
		waitFor(t, 60*time.Second, podName+" Running", func(ctx context.Context) (bool, error) {
			p, err := c.Client.CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, podName, metav1.GetOptions{})
			if apierrors.IsNotFound(err) && !recreated && taintEvicted(t, c, podName) {
				t.Logf("%s was deleted by the taint-eviction controller's stale node cache (kubernetes/kubernetes#119862); creating it again", podName)
				recreated = true
				_, err = c.Client.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, gpuPod(podName, gpus), metav1.CreateOptions{})
				return false, err
			}
			if err != nil {
				return false, nil
			}
			pod = p
			return p.Status.Phase == corev1.PodRunning, nil
		})
		node, err := c.Client.CoreV1().Nodes().Get(ctx, pod.Spec.NodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return node
	}
	checkLabels := func(node *corev1.Node, instanceType string) {
		t.Helper()
		want := map[string]string{
			corev1.LabelInstanceTypeStable: instanceType,
			api.LabelGPUProduct:            cluster.H100Product,
			api.LabelNodePool:              "gpu",
			api.LabelGPUNode:               "true",
		}
		got := map[string]string{}
		for k := range want {
			got[k] = node.Labels[k]
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("labels of Karpenter's node %s (-want +got):\n%s", node.Name, diff)
		}
	}

	// 1. A pending 8-GPU pod: only the 8×H100 type fits.
	if _, err := c.Client.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, gpuPod("train", 8), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "a NodeClaim for the 8-GPU pod", func(ctx context.Context) (bool, error) {
		list, err := nodeClaims.List(ctx, metav1.ListOptions{})
		return err == nil && len(list.Items) > 0, err
	})
	big := nodeOf("train", 8)
	checkLabels(big, "gpu-8x-h100")

	// 2. A 1-GPU pod while the 8-GPU node is full: the cheaper 1×H100 type.
	if _, err := c.Client.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, gpuPod("infer", 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	small := nodeOf("infer", 1)
	checkLabels(small, "gpu-1x-h100")
	list, err := nodeClaims.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 2 {
		t.Errorf("got %d NodeClaims, want 2", len(list.Items))
	}
	waitFor(t, 10*time.Second, "OnNode calls for Karpenter's nodes", func(context.Context) (bool, error) {
		seen, _ := rec.snapshot()
		return slices.Contains(seen, big.Name) && slices.Contains(seen, small.Name), nil
	})

	// 3. Without pods, both nodes are empty and Karpenter removes them.
	for _, name := range []string{"train", "infer"} {
		err := c.Client.CoreV1().Pods(metav1.NamespaceDefault).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		if apierrors.IsNotFound(err) && taintEvicted(t, c, name) {
			t.Logf("%s was deleted by the taint-eviction controller's stale node cache (kubernetes/kubernetes#119862)", name)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 3*time.Minute, "Karpenter removing the empty nodes", func(ctx context.Context) (bool, error) {
		for _, node := range []*corev1.Node{big, small} {
			_, err := c.Client.CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{})
			if !apierrors.IsNotFound(err) {
				return false, err // nil while the node exists
			}
		}
		list, err := nodeClaims.List(ctx, metav1.ListOptions{})
		return err == nil && len(list.Items) == 0, err
	})
	waitFor(t, 10*time.Second, "OnNode ctx of Karpenter's nodes done", func(context.Context) (bool, error) {
		_, ended := rec.snapshot()
		return slices.Contains(ended, big.Name) && slices.Contains(ended, small.Name), nil
	})
}

// TestTaintEvictedSeesTheTaintManager checks the helper TestKarpenterGPUScaleUpAndDown
// relies on to tell a pod lost to the taint-eviction controller from any other loss.
func TestTaintEvictedSeesTheTaintManager(t *testing.T) {
	clusterTest(t)
	c := cluster.StartForTest(t, cluster.Options{})
	ctx := t.Context()
	spec := cluster.NodeSpec{Name: "plain", Capacity: cluster.ResourceList(map[corev1.ResourceName]string{
		corev1.ResourceCPU: "8", corev1.ResourceMemory: "32Gi", corev1.ResourcePods: "10",
	})}
	if _, err := c.AddNode(ctx, spec); err != nil {
		t.Fatal(err)
	}
	p := gpuPod("victim", 0)
	p.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
	p.Spec.NodeName = "plain"
	if _, err := c.Client.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "victim Running", podRunning(c, "victim"))
	if taintEvicted(t, c, "victim") {
		t.Fatal("taintEvicted before any taint")
	}
	// kwok's heartbeat updates the node too: retry on a conflict.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := c.Client.CoreV1().Nodes().Get(ctx, "plain", metav1.GetOptions{})
		if err != nil {
			return err
		}
		node.Spec.Taints = append(node.Spec.Taints, corev1.Taint{Key: "example.com/drain", Effect: corev1.TaintEffectNoExecute})
		_, err = c.Client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the taint-eviction controller to delete victim and say so", func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, "victim", metav1.GetOptions{})
		return apierrors.IsNotFound(err) && taintEvicted(t, c, "victim"), nil
	})
}
