package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/placeholder"
	"github.com/gpufrac/gpufrac/tests/cluster"
)

// karpenterCluster starts the test bed with Karpenter's kwok provider, GPU
// instance types with 1 and 8 mock H100s, and the given GPU NodePools.
func karpenterCluster(t *testing.T, pools ...cluster.NodePool) *cluster.Cluster {
	t.Helper()
	return karpenterClusterWith(t, cluster.ChartOptions{}, pools...)
}

// karpenterClusterWith is karpenterCluster with gpufrac's chart installed
// with chart (its zero value: the test bed's values).
func karpenterClusterWith(t *testing.T, chart cluster.ChartOptions, pools ...cluster.NodePool) *cluster.Cluster {
	t.Helper()
	types := cluster.DefaultInstanceTypes()
	if len(pools) == 0 {
		pools = cluster.DefaultNodePools(types)
	}
	c := startCluster(t, cluster.Options{
		Karpenter:  &cluster.KarpenterOptions{InstanceTypes: types, NodePools: pools},
		NodeAgents: &cluster.NodeAgentOptions{StopGracePeriod: 5 * time.Second},
		Chart:      chart,
	})
	buildBinary(t, "gpufrac-coordinator")
	return c
}

func gpuPool(name string) cluster.NodePool {
	return cluster.NodePool{Name: name, Labels: map[string]string{api.LabelGPUNode: "true"}, InstanceTypes: []string{"gpu-8x-h100", "gpu-1x-h100"}}
}

// gpuNodes lists the nodes labelled as GPU nodes.
func gpuNodes(t testing.TB, c *cluster.Cluster) []corev1.Node {
	t.Helper()
	l, err := c.Client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{LabelSelector: api.LabelGPUNode + "=true"})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

func nodeClaims(t testing.TB, c *cluster.Cluster) int {
	t.Helper()
	l, err := c.Dynamic.Resource(cluster.NodeClaimResource()).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return len(l.Items)
}

func systemPods(t testing.TB, c *cluster.Cluster, role string) []corev1.Pod {
	t.Helper()
	l, err := c.Client.CoreV1().Pods(api.ReservationNamespace).List(context.Background(), metav1.ListOptions{LabelSelector: api.LabelRole + "=" + role})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Pod
	for _, p := range l.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out
}

// tenFractions submits ten 40% fraction pods.
func tenFractions(t *testing.T, c *cluster.Cluster) []string {
	var names []string
	for i := 0; i < 10; i++ {
		n := fmt.Sprintf("frac-%d", i)
		names = append(names, n)
		create(t, c, pod(n, "team-a").Fraction(40).Obj())
	}
	return names
}

// checkSharing asserts the fractions share as few GPUs as they can and that
// every shared GPU is held by exactly one reservation.
func checkSharing(t *testing.T, c *cluster.Cluster, pods map[string]*corev1.Pod) {
	t.Helper()
	// The GPU each pod actually got (same-size pods are interchangeable, so
	// this may differ from the coordinator's plan pod by pod).
	perGPU := map[string]int{}
	for name, p := range pods {
		var g string
		waitFor(t, 30*time.Second, name+" allocated-gpu write-back", func(ctx context.Context) (bool, error) {
			q, err := c.Client.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			g = q.Annotations[api.AnnotationAllocatedGPU]
			return g != "", nil
		})
		perGPU[p.Spec.NodeName+"/"+g] += 40
	}
	for g, pct := range perGPU {
		if pct > 100 {
			t.Errorf("GPU %s carries %d%%", g, pct)
		}
	}
	// Ten 40% pods fit two per GPU: five GPUs at best (three never fit one).
	// Placement is online (pods arrive and are admitted one by one), so a
	// sixth GPU may be started; ten would mean no sharing at all.
	t.Logf("ten 40%% fractions share %d GPUs (best possible: 5)", len(perGPU))
	if len(perGPU) < 5 || len(perGPU) > 6 {
		t.Errorf("ten 40%% fractions share %d GPUs, want 5 or 6: %v", len(perGPU), perGPU)
	}
	res := map[string]int{}
	for _, r := range systemPods(t, c, api.RoleReservation) {
		if r.Annotations[api.AnnotationDoNotDisrupt] != "true" {
			t.Errorf("reservation %s lacks do-not-disrupt", r.Name)
		}
		res[r.Spec.NodeName+"/"+r.Annotations[api.AnnotationReservedGPU]]++
	}
	for g := range perGPU {
		if res[g] != 1 {
			t.Errorf("shared GPU %s has %d reservations, want 1 (all: %v)", g, res[g], res)
		}
	}
}

// Scenarios 1 and 6: fractions get capacity for the GPUs they need, not one
// GPU each, and when they end the cluster returns to zero GPU nodes.
func TestKarpenterProvisionsForPackedFractionsAndScalesToZero(t *testing.T) {
	t.Parallel()
	c := karpenterCluster(t)
	applyYAML(t, c, queuesYAML(map[string]string{"team-a": "8"}))
	startCoordinator(t, c, "c1", "--leader-elect=false", "--reservation-grace=5s")

	names := tenFractions(t, c)
	pods := running(t, c, 3*time.Minute, names...)
	var gpus int64
	for _, n := range gpuNodes(t, c) {
		q := n.Status.Allocatable[api.ResourceGPU]
		gpus += q.Value()
	}
	t.Logf("Karpenter provisioned %d GPU nodes with %d GPUs for ten 40%% fractions", len(gpuNodes(t, c)), gpus)
	if gpus < 5 || gpus >= 10 {
		t.Errorf("provisioned %d GPUs for ten 40%% fractions, want at least 5 and fewer than 10", gpus)
	}
	checkSharing(t, c, pods)
	if ph := systemPods(t, c, api.RolePlaceholder); len(ph) != 0 {
		t.Errorf("%d placeholders left after the pods run", len(ph))
	}

	// Scenario 6: the fractions end; reservations go after their grace period
	// and Karpenter removes the empty nodes.
	for _, n := range names {
		if err := c.Client.CoreV1().Pods("default").Delete(t.Context(), n, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 3*time.Minute, "zero GPU nodes", func(ctx context.Context) (bool, error) {
		return len(gpuNodes(t, c)) == 0 && len(systemPods(t, c, api.RoleReservation)) == 0, nil
	})
}

// Scenario 2: over-quota pending pods never make Karpenter scale up. The
// control at the end shows the window was long enough: an admitted pod in
// another queue gets a NodeClaim well within it.
func TestOverQuotaPodsCreateNoNodeClaims(t *testing.T) {
	t.Parallel()
	c := karpenterCluster(t)
	applyYAML(t, c, queuesYAML(map[string]string{"broke": "0", "rich": "8"}))
	startCoordinator(t, c, "c1", "--leader-elect=false")
	var names []string
	for i := 0; i < 3; i++ {
		n := fmt.Sprintf("over-%d", i)
		names = append(names, n)
		create(t, c, pod(n, "broke").GPUs(1).Obj())
	}
	const window = 20 * time.Second
	deadline := time.Now().Add(window)
	for time.Now().Before(deadline) {
		if n := nodeClaims(t, c); n != 0 {
			t.Fatalf("%d NodeClaims created for over-quota pods", n)
		}
		if ph := systemPods(t, c, api.RolePlaceholder); len(ph) != 0 {
			t.Fatalf("placeholders created for over-quota pods: %d", len(ph))
		}
		time.Sleep(time.Second)
	}
	for _, n := range names {
		p, err := c.Client.CoreV1().Pods("default").Get(t.Context(), n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if r := scheduledReason(p); r != api.ReasonOverQuota {
			t.Errorf("%s reason %q, want OverQuota", n, r)
		}
	}

	// Control: the same request within quota gets a node in less than the window.
	start := time.Now()
	create(t, c, pod("within", "rich").GPUs(1).Obj())
	waitFor(t, window, "a NodeClaim for the admitted pod", func(ctx context.Context) (bool, error) {
		return nodeClaims(t, c) > 0, nil
	})
	t.Logf("NodeClaim for the admitted pod after %s (the over-quota window was %s)", time.Since(start).Round(100*time.Millisecond), window)
	running(t, c, 3*time.Minute, "within")
	for _, n := range names {
		p, err := c.Client.CoreV1().Pods("default").Get(t.Context(), n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Spec.NodeName != "" {
			t.Errorf("over-quota pod %s bound to %s once capacity came", n, p.Spec.NodeName)
		}
	}
}

// disruptionBlocked tells whether Karpenter recorded that it could not disrupt the node.
func disruptionBlocked(t testing.TB, c *cluster.Cluster, node string) bool {
	t.Helper()
	l, err := c.Client.CoreV1().Events("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range l.Items {
		if e.Reason == "DisruptionBlocked" && (e.InvolvedObject.Name == node || strings.Contains(e.Message, node)) {
			return true
		}
	}
	return false
}

// Scenario 3: a node whose GPU is shared is never consolidated, while an
// equal node with only a movable pod is.
func TestSharedGPUNodeIsNeverConsolidated(t *testing.T) {
	t.Parallel()
	c := karpenterCluster(t)
	applyYAML(t, c, queuesYAML(map[string]string{"team-a": "8"}))
	startCoordinator(t, c, "c1", "--leader-elect=false")

	// Node A: a 30% fraction and its reservation.
	create(t, c, pod("shared", "team-a").Fraction(30).Obj())
	shared := running(t, c, 3*time.Minute, "shared")["shared"]
	nodeA := shared.Spec.NodeName

	// Node B: an equal 1-GPU node, made for a default-scheduler GPU pod.
	gp := pod("ballast", "team-a").GPUs(1).Obj()
	gp.Spec.SchedulerName = ""
	delete(gp.Labels, api.LabelQueue) // a queue label needs the coordinator's scheduler name
	gp.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
		LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"e2e": "yes"}}, TopologyKey: "kubernetes.io/hostname",
		Namespaces: []string{"default"},
	}}}}
	if _, err := c.Client.CoreV1().Pods("default").Create(t.Context(), gp, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 3*time.Minute, "the ballast pod Running", func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods("default").Get(ctx, "ballast", metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning, nil
	})
	b, _ := c.Client.CoreV1().Pods("default").Get(t.Context(), "ballast", metav1.GetOptions{})
	nodeB := b.Spec.NodeName
	if nodeB == nodeA || nodeB == "" {
		t.Fatalf("ballast on %q, want its own node (A is %s)", nodeB, nodeA)
	}
	// Make B's pod movable and B underused: the ballast is replaced by a CPU pod.
	if err := c.Client.CoreV1().Pods("default").Delete(t.Context(), "ballast", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	mover := pod("mover", "team-a").Obj()
	mover.Spec.SchedulerName = ""
	delete(mover.Labels, api.LabelQueue)
	mover.Spec.NodeName = nodeB
	mover.Labels["e2e"] = "mover"
	mover.OwnerReferences = nil
	if _, err := c.Client.CoreV1().Pods("default").Create(t.Context(), mover, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Karpenter consolidates B; A, whose GPU is shared, stays and is reported blocked.
	waitFor(t, 4*time.Minute, "node B consolidated", func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().Nodes().Get(ctx, nodeB, metav1.GetOptions{})
		return err != nil, nil
	})
	if _, err := c.Client.CoreV1().Nodes().Get(t.Context(), nodeA, metav1.GetOptions{}); err != nil {
		t.Fatalf("node A (%s) with a shared GPU was removed: %v", nodeA, err)
	}
	p, err := c.Client.CoreV1().Pods("default").Get(t.Context(), "shared", metav1.GetOptions{})
	if err != nil || p.Spec.NodeName != nodeA || p.Status.Phase != corev1.PodRunning {
		t.Fatalf("the fraction pod was disrupted: %v %+v", err, p.Status)
	}
	waitFor(t, 60*time.Second, "Karpenter to report node A's disruption blocked", func(ctx context.Context) (bool, error) {
		return disruptionBlocked(t, c, nodeA), nil
	})
}

// Scenario 4: a non-preemptible pod's node is never disrupted; a preemptible
// pod's node may be. The NodePool drifts; Karpenter replaces what it may.
func TestNonPreemptibleWorkIsProtectedFromDisruption(t *testing.T) {
	t.Parallel()
	c := karpenterCluster(t)
	applyYAML(t, c, queuesYAML(map[string]string{"team-a": "8"}))
	startCoordinator(t, c, "c1", "--leader-elect=false")

	// Separate nodes through the instance type (the coordinator does not
	// implement inter-pod anti-affinity).
	np := pod("critical", "team-a").GPUs(1).Preemptible(false).NodeSelector("node.kubernetes.io/instance-type", "gpu-1x-h100").Obj()
	pr := pod("batch", "team-a").GPUs(1).NodeSelector("node.kubernetes.io/instance-type", "gpu-8x-h100").Obj()
	create(t, c, np, pr)
	pods := running(t, c, 3*time.Minute, "critical", "batch")
	if pods["critical"].Annotations[api.AnnotationDoNotDisrupt] != "true" {
		t.Fatalf("non-preemptible pod not annotated do-not-disrupt: %v", pods["critical"].Annotations)
	}
	critNode, batchNode := pods["critical"].Spec.NodeName, pods["batch"].Spec.NodeName

	// Drift every node of the pool: change its template.
	patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"template": map[string]any{"metadata": map[string]any{"labels": map[string]string{"e2e-drift": "1"}}}}})
	if _, err := c.Dynamic.Resource(cluster.NodePoolResource()).Patch(t.Context(), "gpu", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 4*time.Minute, "the preemptible pod's node to be replaced", func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().Nodes().Get(ctx, batchNode, metav1.GetOptions{})
		return err != nil, nil
	})
	if _, err := c.Client.CoreV1().Nodes().Get(t.Context(), critNode, metav1.GetOptions{}); err != nil {
		t.Fatalf("the non-preemptible pod's node %s was disrupted: %v", critNode, err)
	}
	p, err := c.Client.CoreV1().Pods("default").Get(t.Context(), "critical", metav1.GetOptions{})
	if err != nil || p.Status.Phase != corev1.PodRunning {
		t.Fatalf("the non-preemptible pod was disrupted: %v", err)
	}
}

// Scenario 5: a gang whose affinity allows two NodePools lands in one, and
// the capacity Karpenter creates for it is in that pool only.
func TestGangCapacityComesFromOnePool(t *testing.T) {
	t.Parallel()
	c := karpenterCluster(t, gpuPool("gpu-a"), gpuPool("gpu-b"))
	applyYAML(t, c, queuesYAML(map[string]string{"train": "16"}))
	startCoordinator(t, c, "c1", "--leader-elect=false")
	var names []string
	for i := 0; i < 8; i++ {
		n := fmt.Sprintf("gang-%d", i)
		names = append(names, n)
		create(t, c, pod(n, "train").GPUs(1).PodGroup("two-pools").MinMember(8).
			RequiredNodeAffinity(api.LabelNodePool, corev1.NodeSelectorOpIn, "gpu-a", "gpu-b").Obj())
	}
	pods := running(t, c, 3*time.Minute, names...)
	pools := map[string]bool{}
	for _, p := range pods {
		n, err := c.Client.CoreV1().Nodes().Get(t.Context(), p.Spec.NodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pools[n.Labels[api.LabelNodePool]] = true
	}
	if len(pools) != 1 {
		t.Errorf("gang spread over pools %v", pools)
	}
	for _, n := range gpuNodes(t, c) {
		if !pools[n.Labels[api.LabelNodePool]] {
			t.Errorf("Karpenter created node %s in pool %s, outside the gang's pool %v", n.Name, n.Labels[api.LabelNodePool], pools)
		}
	}
}

// Scenario 7: the coordinator restarted in the middle of scenario 1 leaves
// no duplicate reservations or placeholders and nothing orphaned.
func TestCoordinatorRestartDuringScaleUp(t *testing.T) {
	t.Parallel()
	c := karpenterCluster(t)
	applyYAML(t, c, queuesYAML(map[string]string{"team-a": "8"}))
	first := startCoordinator(t, c, "c1", "--leader-elect=false")
	names := tenFractions(t, c)
	waitFor(t, 60*time.Second, "placeholders", func(ctx context.Context) (bool, error) {
		return len(systemPods(t, c, api.RolePlaceholder)) > 0, nil
	})
	first.stop(syscall.SIGKILL)
	placeholdersBefore := len(systemPods(t, c, api.RolePlaceholder))
	startCoordinator(t, c, "c2", "--leader-elect=false")
	pods := running(t, c, 3*time.Minute, names...)
	checkSharing(t, c, pods)
	if ph := systemPods(t, c, api.RolePlaceholder); len(ph) != 0 {
		t.Errorf("%d placeholders orphaned (there were %d at the restart)", len(ph), placeholdersBefore)
	}
	names2 := map[string]bool{}
	for _, p := range systemPods(t, c, api.RolePlaceholder) {
		if names2[p.Name] {
			t.Errorf("duplicate placeholder %s", p.Name)
		}
		names2[p.Name] = true
		if !strings.HasPrefix(p.Name, placeholder.NamePrefix) {
			t.Errorf("placeholder %s", p.Name)
		}
	}
}

// A coordinator upgraded from a version whose placeholders kube-scheduler
// served replaces the pending ones it finds (same deterministic names) with
// placeholders nobody binds, marked Unschedulable by itself. The earlier
// version's placeholder here asks for a node no NodePool makes (as a
// placeholder of an earlier spec may), so kept, the work would never run.
func TestUpgradeReplacesPlaceholdersKubeSchedulerServes(t *testing.T) {
	t.Parallel()
	c := karpenterCluster(t)
	applyYAML(t, c, queuesYAML(map[string]string{"team-a": "8"}))
	first := startCoordinator(t, c, "c1", "--leader-elect=false")
	create(t, c, pod("w", "team-a").GPUs(1).Obj())
	var ph corev1.Pod
	waitFor(t, 60*time.Second, "a placeholder", func(ctx context.Context) (bool, error) {
		l := systemPods(t, c, api.RolePlaceholder)
		if len(l) == 1 {
			ph = l[0]
		}
		return len(l) == 1, nil
	})
	first.stop(syscall.SIGKILL)
	// The earlier version's placeholder, made as the coordinator made it.
	cfg := rest.CopyConfig(c.RESTConfig)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + api.ComponentNamespace + ":gpufrac-coordinator"}
	asCoordinator := kubernetes.NewForConfigOrDie(cfg)
	zero := int64(0)
	if err := asCoordinator.CoreV1().Pods(ph.Namespace).Delete(t.Context(), ph.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	old := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: ph.Name, Namespace: ph.Namespace, Labels: ph.Labels, Annotations: ph.Annotations}, Spec: *ph.Spec.DeepCopy()}
	old.Spec.SchedulerName = corev1.DefaultSchedulerName
	old.Spec.NodeSelector = map[string]string{"e2e.gpufrac.io/no-pool-makes": "this"}
	waitFor(t, 30*time.Second, "the earlier version's placeholder created", func(ctx context.Context) (bool, error) {
		_, err := asCoordinator.CoreV1().Pods(old.Namespace).Create(ctx, old, metav1.CreateOptions{})
		return err == nil, nil
	})
	startCoordinator(t, c, "c2", "--leader-elect=false")
	running(t, c, 2*time.Minute, "w")
	waitFor(t, 30*time.Second, "no placeholder left", func(ctx context.Context) (bool, error) {
		return len(systemPods(t, c, api.RolePlaceholder)) == 0, nil
	})
}
