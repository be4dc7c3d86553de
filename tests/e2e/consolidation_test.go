package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/consolidation"
	"github.com/gpufrac/gpufrac/coordinator/predicates"
	"github.com/gpufrac/gpufrac/tests/cluster"
	"github.com/gpufrac/gpufrac/tests/invariants"
)

// pricesValues is the chart's coordinator.prices for the instance types the
// fake cloud sells (GPU types only), as YAML under "prices:" at indent.
func pricesValues(types []cluster.InstanceType, indent string) string {
	var b strings.Builder
	b.WriteString(indent + "prices:\n" + indent + "  instanceTypes:\n")
	for _, it := range types {
		if g := instanceGPUs(it); g > 0 {
			fmt.Fprintf(&b, "%s    - {name: %s, gpus: %d, price: %v, gpuProduct: %s}\n", indent, it.Name, g, it.Price, it.GPUProduct)
		}
	}
	return b.String()
}

// consolidationValues writes chart values that turn consolidation on with
// the price table of types (none for nil types: the chart's default) (the test bed's values first) and returns the
// values files. reservations holds the keys under coordinator.reservations
// ("grace: 5s", ...), consolidation those under coordinator.consolidation
// besides enabled ("interval: 1s", ...).
func consolidationValues(t testing.TB, types []cluster.InstanceType, reservations []string, consolidation ...string) []string {
	t.Helper()
	testbed, err := cluster.TestbedValues()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	b.WriteString("coordinator:\n")
	if types != nil {
		b.WriteString(pricesValues(types, "  "))
	}
	b.WriteString("  reservations:\n")
	for _, kv := range reservations {
		b.WriteString("    " + kv + "\n")
	}
	b.WriteString("  consolidation:\n    enabled: true\n")
	for _, kv := range consolidation {
		b.WriteString("    " + kv + "\n")
	}
	path := filepath.Join(t.TempDir(), "consolidation-values.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return []string{testbed, path}
}

// consolidationCluster is karpenterCluster with gpufrac's chart installed
// with consolidation on (its RBAC and admission policy included): quick
// passes, a short stability window, the test bed's price table.
func consolidationCluster(t *testing.T) *cluster.Cluster {
	t.Helper()
	types := cluster.DefaultInstanceTypes()
	return karpenterClusterWith(t, cluster.ChartOptions{ValuesFiles: consolidationValues(t, types, []string{"grace: 5s"},
		"interval: 1s", "stableFor: 3s", "drainTimeout: 3m", "deleteDrainedNodes: true")})
}

// fractionDeployment creates a Deployment of replicas pods asking pct% of a
// GPU each, in queue, labelled app=name.
func fractionDeployment(t *testing.T, c *cluster.Cluster, name, queue string, replicas int32, pct int) {
	t.Helper()
	tmpl := pod(name, queue).Fraction(pct).Label("app", name).Obj()
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: tmpl.Labels, Annotations: tmpl.Annotations}, Spec: tmpl.Spec},
		},
	}
	d.Spec.Template.Spec.TerminationGracePeriodSeconds = ptr.To[int64](0)
	if _, err := c.Client.AppsV1().Deployments("default").Create(t.Context(), d, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating deployment %s: %v", name, err)
	}
}

func scaleDeployment(t *testing.T, c *cluster.Cluster, name string, replicas int32) {
	t.Helper()
	// The Deployment controller writes the object too: a conflict is read
	// again and retried.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s, err := c.Client.AppsV1().Deployments("default").GetScale(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		s.Spec.Replicas = replicas
		_, err = c.Client.AppsV1().Deployments("default").UpdateScale(t.Context(), name, s, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// appPods lists the Running, not terminating pods of an app.
func appPods(t testing.TB, c *cluster.Cluster, app string) []corev1.Pod {
	t.Helper()
	var out []corev1.Pod
	for _, p := range podsOf(t, c, "default", "app="+app) {
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out
}

// waitApp waits until an app runs n pods and returns them.
func waitApp(t *testing.T, c *cluster.Cluster, app string, n int, limit time.Duration) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	waitFor(t, limit, fmt.Sprintf("%d pods of %s Running", n, app), func(ctx context.Context) (bool, error) {
		pods = appPods(t, c, app)
		return len(pods) == n && len(podsOf(t, c, "default", "app="+app)) == n, nil
	})
	return pods
}

// eventsFor lists "reason: message" of the events on an object.
func eventsFor(t testing.TB, c *cluster.Cluster, kind, name string) []string {
	t.Helper()
	l, err := c.Client.CoreV1().Events("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range l.Items {
		if e.InvolvedObject.Kind == kind && e.InvolvedObject.Name == name {
			out = append(out, e.Reason+": "+e.Message)
		}
	}
	return out
}

func anyHasPrefix(list []string, prefix string) bool {
	for _, s := range list {
		if strings.HasPrefix(s, prefix) {
			return true
		}
	}
	return false
}

// A node is emptied by consolidation and removed by Karpenter. Two 70%
// fractions get a node each (two 1×H100: the price table makes the
// placeholders ask for them, not one 8×H100), then a 30% fraction joins each.
// The 70% ones end: each node keeps one 30% fraction, which Karpenter cannot
// move (the reservations are do-not-disrupt). The coordinator drains one
// node: its fraction is evicted, re-created by its ReplicaSet and placed on
// the other node's shared GPU, the reservation goes, and the coordinator
// deletes the drained node (deleteDrainedNodes), which Karpenter's finalizer
// terminates.
func TestConsolidationEmptiesANodeForKarpenter(t *testing.T) {
	t.Parallel()
	c := consolidationCluster(t)
	applyYAML(t, c, queuesYAML(map[string]string{"team-a": "8"}))
	startCoordinator(t, c, "c1", "--leader-elect=false")

	fractionDeployment(t, c, "big", "team-a", 2, 70)
	big := waitApp(t, c, "big", 2, 3*time.Minute)
	if big[0].Spec.NodeName == big[1].Spec.NodeName {
		t.Fatalf("two 70%% fractions on one node %s", big[0].Spec.NodeName)
	}
	for _, n := range gpuNodes(t, c) {
		if typ := n.Labels[corev1.LabelInstanceTypeStable]; typ != "gpu-1x-h100" {
			t.Errorf("node %s is a %s: two GPUs of demand should buy two 1×H100 ($28.38/h), not an 8×H100 ($98.32/h)", n.Name, typ)
		}
	}
	fractionDeployment(t, c, "small", "team-a", 2, 30)
	small := waitApp(t, c, "small", 2, 2*time.Minute)
	if small[0].Spec.NodeName == small[1].Spec.NodeName {
		t.Fatalf("both 30%% fractions on %s; want one beside each 70%%", small[0].Spec.NodeName)
	}
	nodesBefore := map[string]bool{small[0].Spec.NodeName: true, small[1].Spec.NodeName: true}

	scaleDeployment(t, c, "big", 0)
	var kept string
	waitFor(t, 3*time.Minute, "one node left, running both 30% fractions", func(ctx context.Context) (bool, error) {
		nodes := gpuNodes(t, c)
		pods := appPods(t, c, "small")
		if len(nodes) != 1 || len(pods) != 2 || pods[0].Spec.NodeName != nodes[0].Name || pods[1].Spec.NodeName != nodes[0].Name {
			return false, nil
		}
		kept = nodes[0].Name
		return true, nil
	})
	var removed string
	for n := range nodesBefore {
		if n != kept {
			removed = n
		}
	}
	t.Logf("consolidation drained %s; both fractions run on %s", removed, kept)
	if ev := eventsFor(t, c, "Node", removed); !anyHasPrefix(ev, "ConsolidationDrainStarted: draining for consolidation: 1 pods move") ||
		!anyHasPrefix(ev, "ConsolidationNodeDeleted: drained") {
		t.Errorf("events of the removed node %s: %v; want the drain and, with deleteDrainedNodes, its deletion", removed, ev)
	}
	moved := 0
	for _, p := range small {
		if p.Spec.NodeName == removed {
			if ev := eventsFor(t, c, "Pod", p.Name); !anyHasPrefix(ev, "ConsolidationMove: evicted to drain node "+removed) {
				t.Errorf("events of the moved pod %s: %v", p.Name, ev)
			}
			moved++
		}
	}
	if moved != 1 {
		t.Errorf("%d fractions were on the removed node, want 1", moved)
	}
	// Both fractions share one GPU under one reservation.
	res := systemPods(t, c, api.RoleReservation)
	if len(res) != 1 || res[0].Spec.NodeName != kept {
		t.Errorf("reservations %d (want one, on %s)", len(res), kept)
	}
	checkCoordinatorNodeRights(t, c, kept)
	invariants.Eventually(t, c.Client, c.Dynamic, invariants.Options{}, 60*time.Second)
}

// checkCoordinatorNodeRights checks what consolidation's node rights reach,
// as the chart grants them (RBAC patch on nodes, no update, narrowed by the
// admission policy gpufrac-coordinator-nodes): with the coordinator's
// credentials the drain taint goes on and off node, nothing else of the
// node changes.
func checkCoordinatorNodeRights(t *testing.T, c *cluster.Cluster, node string) {
	t.Helper()
	in := c.Installed()
	rc, err := c.ServiceAccountConfig(t.Context(), in.Namespace, in.Coordinator.ServiceAccount, nil)
	if err != nil {
		t.Fatal(err)
	}
	as, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	update := func(change func(n *corev1.Node)) error {
		n, err := as.CoreV1().Nodes().Get(t.Context(), node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		old, err := json.Marshal(n)
		if err != nil {
			return err
		}
		change(n)
		changed, err := json.Marshal(n)
		if err != nil {
			return err
		}
		patch, err := strategicpatch.CreateTwoWayMergePatch(old, changed, corev1.Node{})
		if err != nil {
			return err
		}
		_, err = as.CoreV1().Nodes().Patch(t.Context(), node, k8stypes.StrategicMergePatchType, patch, metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	// RBAC grants patch, not update.
	if n, err := as.CoreV1().Nodes().Get(t.Context(), node, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else if _, err := as.CoreV1().Nodes().Update(t.Context(), n, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}}); !apierrors.IsForbidden(err) || cluster.RefusedBy(err, "gpufrac-coordinator-nodes") {
		t.Errorf("the coordinator updating node %s: %v; want forbidden by RBAC", node, err)
	}
	const refusal = "gpufrac-coordinator may change only the NoSchedule taint gpufrac.io/draining of a Node"
	for _, tc := range []struct {
		what   string
		change func(n *corev1.Node)
	}{
		{"a label", func(n *corev1.Node) { n.Labels["gpufrac.io/pool"] = "stolen" }},
		{"another taint", func(n *corev1.Node) {
			n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: "team", Value: "a", Effect: corev1.TaintEffectNoSchedule})
		}},
		{"the drain taint as NoExecute", func(n *corev1.Node) {
			n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: api.TaintDraining, Value: "1", Effect: corev1.TaintEffectNoExecute})
		}},
		{"cordon", func(n *corev1.Node) { n.Spec.Unschedulable = true }},
	} {
		if err := update(tc.change); err == nil || !cluster.RefusedBy(err, "gpufrac-coordinator-nodes") || !strings.Contains(err.Error(), refusal) {
			t.Errorf("the coordinator changing %s of node %s: %v; want refused by gpufrac-coordinator-nodes", tc.what, node, err)
		}
	}
	if err := update(func(n *corev1.Node) {
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: api.TaintDraining, Value: "1", Effect: corev1.TaintEffectNoSchedule})
	}); err != nil {
		t.Errorf("the coordinator may not put the drain taint on node %s: %v", node, err)
	}

	// deleteDrainedNodes: it may delete a Karpenter node it drained, that
	// Karpenter's finalizer holds and that is not annotated do-not-disrupt,
	// and no other (dry runs; the nodes below are bare objects, no
	// kubelet's).
	const delRefusal = "gpufrac-coordinator may delete only a Karpenter Node it drained"
	drainTaint := []corev1.Taint{{Key: api.TaintDraining, Value: "4102444800", Effect: corev1.TaintEffectNoSchedule}}
	pool := map[string]string{api.LabelNodePool: "gpu"}
	karpenter := []string{consolidation.KarpenterTerminationFinalizer}
	for _, tc := range []struct {
		name        string
		labels      map[string]string
		annotations map[string]string
		finalizers  []string
		taints      []corev1.Taint
		ok          bool
	}{
		{name: "rights-untainted", labels: pool, finalizers: karpenter},
		{name: "rights-static", taints: drainTaint, finalizers: karpenter},
		{name: "rights-no-finalizer", labels: pool, taints: drainTaint},
		{name: "rights-do-not-disrupt", labels: pool, annotations: map[string]string{api.AnnotationDoNotDisrupt: "true"}, taints: drainTaint, finalizers: karpenter},
		{name: "rights-drained", labels: pool, annotations: map[string]string{api.AnnotationDoNotDisrupt: "false"}, taints: drainTaint, finalizers: karpenter, ok: true},
	} {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: tc.name, Labels: tc.labels, Annotations: tc.annotations, Finalizers: tc.finalizers},
			Spec: corev1.NodeSpec{Taints: tc.taints}}
		if _, err := c.Client.CoreV1().Nodes().Create(t.Context(), n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		err := as.CoreV1().Nodes().Delete(t.Context(), tc.name, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		switch {
		case tc.ok && err != nil:
			t.Errorf("the coordinator may not delete %s, a drained Karpenter node: %v", tc.name, err)
		case !tc.ok && (err == nil || !cluster.RefusedBy(err, "gpufrac-coordinator-nodes") || !strings.Contains(err.Error(), delRefusal)):
			t.Errorf("the coordinator deleting %s: %v; want refused by gpufrac-coordinator-nodes", tc.name, err)
		}
		// The coordinator under test may delete rights-drained itself (it
		// looks drained): NotFound is fine.
		if len(tc.finalizers) > 0 {
			// No Karpenter NodeClaim behind it: the finalizer goes first.
			if _, err := c.Client.CoreV1().Nodes().Patch(t.Context(), tc.name, k8stypes.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Error(err)
			}
		}
		if err := c.Client.CoreV1().Nodes().Delete(t.Context(), tc.name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Error(err)
		}
	}
}

// A node with protected work is not touched. Node X runs a non-preemptible
// 30% fraction, node Y a preemptible 60% one that fits beside it. The
// coordinator drains Y onto X and Karpenter removes Y; X is never tainted
// and its protected pod never disrupted, although its fraction would fit on
// Y as well.
func TestConsolidationLeavesProtectedWorkAlone(t *testing.T) {
	t.Parallel()
	c := consolidationCluster(t)
	applyYAML(t, c, queuesYAML(map[string]string{"team-a": "8"}))
	startCoordinator(t, c, "c1", "--leader-elect=false")

	create(t, c, pod("critical", "team-a").Fraction(30).Preemptible(false).Obj())
	critical := running(t, c, 3*time.Minute, "critical")["critical"]
	x := critical.Spec.NodeName
	fractionDeployment(t, c, "filler", "team-a", 1, 70)
	if f := waitApp(t, c, "filler", 1, 2*time.Minute); f[0].Spec.NodeName != x {
		t.Fatalf("the 70%% filler went to %s, not beside the 30%% on %s", f[0].Spec.NodeName, x)
	}
	fractionDeployment(t, c, "y", "team-a", 1, 60)
	y := waitApp(t, c, "y", 1, 3*time.Minute)[0].Spec.NodeName
	if y == x {
		t.Fatalf("the 60%% fraction went to %s, which is full", x)
	}
	scaleDeployment(t, c, "filler", 0)

	// Watch X and the protected pod all along.
	protect := func(ctx context.Context) error {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, x, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("node %s with protected work: %w", x, err)
		}
		if predicates.Draining(n) {
			return fmt.Errorf("node %s with protected work was tainted %s: %v", x, api.TaintDraining, n.Spec.Taints)
		}
		p, err := c.Client.CoreV1().Pods("default").Get(ctx, "critical", metav1.GetOptions{})
		if err != nil || p.UID != critical.UID || p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning || p.Spec.NodeName != x {
			return fmt.Errorf("the protected pod was disrupted: %v", err)
		}
		return nil
	}
	waitFor(t, 3*time.Minute, "Y drained onto X and removed", func(ctx context.Context) (bool, error) {
		if err := protect(ctx); err != nil {
			return false, err
		}
		pods := appPods(t, c, "y")
		nodes := gpuNodes(t, c)
		return len(nodes) == 1 && nodes[0].Name == x && len(pods) == 1 && pods[0].Spec.NodeName == x, nil
	})
	if ev := eventsFor(t, c, "Node", y); !anyHasPrefix(ev, "ConsolidationDrainStarted") {
		t.Errorf("events of node %s: %v, want a drain", y, ev)
	}
	if ev := eventsFor(t, c, "Node", x); anyHasPrefix(ev, "ConsolidationDrain") {
		t.Errorf("node %s with protected work has drain events: %v", x, ev)
	}
	// And it stays so: nothing else may move now (X is protected, and no other node is left).
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if err := protect(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	invariants.Eventually(t, c.Client, c.Dynamic, invariants.Options{}, 60*time.Second)
}

// PodDisruptionBudgets are honoured: two nodes each run one 30% fraction
// of app "serve" (either could move beside the other), under a budget that
// allows no disruption. Nothing is drained or evicted while it says so; once
// it allows one, one node is drained and Karpenter removes it.
func TestConsolidationHonoursPodDisruptionBudgets(t *testing.T) {
	t.Parallel()
	c := consolidationCluster(t)
	applyYAML(t, c, queuesYAML(map[string]string{"team-a": "8"}))
	startCoordinator(t, c, "c1", "--leader-elect=false")

	// serve-a with a 70% filler on one node, serve-b beside a 70% filler
	// on a second: two 1×H100.
	fractionDeployment(t, c, "serve-a", "team-a", 1, 30)
	a := waitApp(t, c, "serve-a", 1, 3*time.Minute)[0]
	fractionDeployment(t, c, "filler", "team-a", 2, 70)
	waitApp(t, c, "filler", 2, 3*time.Minute)
	fractionDeployment(t, c, "serve-b", "team-a", 1, 30)
	b := waitApp(t, c, "serve-b", 1, 3*time.Minute)[0]
	if a.Spec.NodeName == b.Spec.NodeName {
		t.Fatalf("both serve pods on %s; the fillers should have kept them apart", a.Spec.NodeName)
	}
	minAvailable := intstr.FromInt32(2)
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "serve", Namespace: "default"},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: &minAvailable,
			Selector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: []string{"serve-a", "serve-b"}}}}},
	}
	if _, err := c.Client.PolicyV1().PodDisruptionBudgets("default").Create(t.Context(), pdb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the budget to count both pods", func(ctx context.Context) (bool, error) {
		p, err := c.Client.PolicyV1().PodDisruptionBudgets("default").Get(ctx, "serve", metav1.GetOptions{})
		return err == nil && p.Status.ExpectedPods == 2 && p.Status.CurrentHealthy == 2, nil
	})
	scaleDeployment(t, c, "filler", 0)
	waitFor(t, time.Minute, "the fillers to go", func(ctx context.Context) (bool, error) {
		return len(podsOf(t, c, "default", "app=filler")) == 0, nil
	})

	// 20 s (twenty passes, several stability windows): no drain.
	untouched := func(ctx context.Context) error {
		for _, n := range gpuNodes(t, c) {
			if predicates.Draining(&n) {
				return fmt.Errorf("node %s was tainted %s under a budget that allows no disruption", n.Name, api.TaintDraining)
			}
		}
		for _, want := range []corev1.Pod{a, b} {
			p, err := c.Client.CoreV1().Pods("default").Get(ctx, want.Name, metav1.GetOptions{})
			if err != nil || p.DeletionTimestamp != nil {
				return fmt.Errorf("pod %s was disrupted under a budget that allows no disruption: %v", want.Name, err)
			}
		}
		return nil
	}
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		if err := untouched(t.Context()); err != nil {
			t.Fatal(err)
		}
	}

	// The budget allows one disruption: one node goes.
	p, err := c.Client.PolicyV1().PodDisruptionBudgets("default").Get(t.Context(), "serve", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Spec.MinAvailable = ptr.To(intstr.FromInt32(1))
	if _, err := c.Client.PolicyV1().PodDisruptionBudgets("default").Update(t.Context(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 3*time.Minute, "one node left, running both serve pods", func(ctx context.Context) (bool, error) {
		nodes := gpuNodes(t, c)
		pa, pb := appPods(t, c, "serve-a"), appPods(t, c, "serve-b")
		return len(nodes) == 1 && len(pa) == 1 && len(pb) == 1 && pa[0].Spec.NodeName == nodes[0].Name && pb[0].Spec.NodeName == nodes[0].Name, nil
	})
	invariants.Eventually(t, c.Client, c.Dynamic, invariants.Options{}, 60*time.Second)
}
