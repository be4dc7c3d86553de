package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/tests/cluster"
)

// world is what an upgrade must not change: where every pod runs and on
// which GPUs, the reservation pods (by UID: none recreated), and the
// queues' status.
type world struct {
	Pods         map[string]string // pod -> node, coordinator's GPU, GPUs given
	Reservations map[string]string // reservation pod holding running fractions -> UID, node, GPU
	Queues       map[string]string // queue -> allocated, non-preemptible, pending
}

func snapshot(t *testing.T, c *cluster.Cluster) world {
	t.Helper()
	ctx := t.Context()
	w := world{Pods: map[string]string{}, Reservations: map[string]string{}, Queues: map[string]string{}}
	pods, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "e2e=yes"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		w.Pods[p.Name] = fmt.Sprintf("%s %s node=%s gpu=%s given=%s", p.UID, p.Status.Phase, p.Spec.NodeName,
			p.Annotations[api.AnnotationGPU], p.Annotations[api.AnnotationAllocatedGPU])
	}
	res, err := c.Client.CoreV1().Pods(api.ReservationNamespace).List(ctx, metav1.ListOptions{LabelSelector: api.LabelRole + "=" + api.RoleReservation})
	if err != nil {
		t.Fatal(err)
	}
	given := map[string]bool{} // node/GPU -> a fraction runs there
	for _, p := range pods.Items {
		given[p.Spec.NodeName+"/"+p.Annotations[api.AnnotationAllocatedGPU]] = true
	}
	for _, p := range res.Items {
		// A reservation without fractions (one planned before the kubelet
		// gave the fraction another GPU) goes after its grace period,
		// upgrade or not: only those holding running fractions count.
		gpu := p.Annotations[api.AnnotationReservedGPU]
		if !given[p.Spec.NodeName+"/"+gpu] {
			continue
		}
		w.Reservations[p.Name] = fmt.Sprintf("%s %s node=%s gpu=%s", p.UID, p.Status.Phase, p.Spec.NodeName, gpu)
	}
	qs, err := c.Dynamic.Resource(queueGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range qs.Items {
		alloc, _, _ := unstructured.NestedStringMap(q.Object, "status", "allocated")
		np, _, _ := unstructured.NestedStringMap(q.Object, "status", "allocatedNonPreemptible")
		pending, _, _ := unstructured.NestedInt64(q.Object, "status", "pendingGangs")
		w.Queues[q.GetName()] = fmt.Sprintf("allocated=%v nonPreemptible=%v pending=%d", alloc, np, pending)
	}
	return w
}

// TestHelmUpgradeWhileWorkRunsLosesNothing installs the chart, runs
// fractions (with their reservations), a gang and whole-GPU work under the
// chart's coordinator and node agents, then upgrades the release with
// changed values as `helm upgrade` does: every object is applied again, the
// node agents get the new ConfigMap (hot-reloaded, the DaemonSet's pod
// template is unchanged so they are not restarted), and the coordinator
// Deployment rolls (a new replica with the new arguments takes the Lease, the
// old one stops). Allocations, reservations and queue status are the same
// after, and new work is scheduled by the upgraded coordinator.
func TestHelmUpgradeWhileWorkRunsLosesNothing(t *testing.T) {
	t.Parallel()
	c := startCluster(t, cluster.Options{})
	ctx := t.Context()
	buildBinary(t, "gpufrac-coordinator")
	addGPUNodes(t, c, "gpu", "pool-a", 2)
	applyYAML(t, c, queuesYAML(map[string]string{"team-a": "8", "team-b": "8"}))
	before := c.Installed()
	old := startCoordinator(t, c, "release-1", "--leader-elect=true")

	// 1. Work of every kind: fractions on shared GPUs, a gang, whole GPUs.
	create(t, c,
		pod("frac-30", "team-b").Fraction(30).Obj(),
		pod("frac-40", "team-b").Fraction(40).Obj(),
		pod("frac-50", "team-b").Fraction(50).Obj(),
		pod("gang-0", "team-a").GPUs(2).PodGroup("train").MinMember(2).Obj(),
		pod("gang-1", "team-a").GPUs(2).PodGroup("train").MinMember(2).Obj(),
		pod("whole", "team-a").GPUs(1).Obj(),
	)
	all := []string{"frac-30", "frac-40", "frac-50", "gang-0", "gang-1", "whole"}
	running(t, c, 90*time.Second, all...)
	var w0 world
	waitFor(t, 30*time.Second, "GPUs written back, reservations held and queue status settled", func(ctx context.Context) (bool, error) {
		w0 = snapshot(t, c)
		// Judged on the snapshot itself: a write-back read apart from it
		// could land just after it was taken, and the comparison after the
		// upgrade would see it as a change.
		// One reservation for each GPU the fractions run on: two when
		// they pack as planned, three when a plan moved because the
		// kubelet gave a GPU it named to a whole-GPU pod first (the node
		// agent, not the coordinator, picks whole pods' GPUs).
		// Every pod's GPU written back, whole ones too: the node agent
		// writes a whole-GPU pod's after the kubelet lists it, which can
		// come after the fractions' (once, under load, it came after the
		// snapshot, and the comparison took it for a change).
		for _, n := range all {
			if w0.Pods[n] == "" || strings.HasSuffix(w0.Pods[n], " given=") {
				return false, nil
			}
		}
		shared := map[string]bool{}
		for _, n := range []string{"frac-30", "frac-40", "frac-50"} {
			if w0.Pods[n] == "" || strings.HasSuffix(w0.Pods[n], " given=") {
				return false, nil
			}
			f := strings.Fields(w0.Pods[n]) // uid phase node= gpu= given=
			shared[f[2]+" "+f[len(f)-1]] = true
		}
		return len(w0.Reservations) == len(shared) && queueGPU(ctx, c, "team-a") == 5000 && queueGPU(ctx, c, "team-b") == 1200 &&
			strings.HasSuffix(w0.Queues["team-a"], "pending=0") && strings.HasSuffix(w0.Queues["team-b"], "pending=0"), nil
	})
	t.Logf("before the upgrade: pods %v, reservations %v, queues %v", w0.Pods, w0.Reservations, w0.Queues)

	// 2. helm upgrade with changed values: the coordinator's placement
	// policy and reservation grace, the nodes' enforcement action.
	testbed, err := cluster.TestbedValues()
	if err != nil {
		t.Fatal(err)
	}
	after, err := c.InstallChart(ctx, cluster.ChartOptions{ValuesFiles: []string{testbed}, Set: []string{
		"coordinator.policy=binpack",
		"coordinator.reservations.grace=90s",
		"node.config.default.fraction.enforcement=report",
	}})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(before.Node.Args, after.Node.Args); diff != "" {
		t.Fatalf("the upgrade changes gpufrac-node's arguments (a real DaemonSet would roll; -before +after):\n%s", diff)
	}
	if cmp.Equal(before.Coordinator.Args, after.Coordinator.Args) || before.NodeConfig == after.NodeConfig {
		t.Fatal("the upgrade's values change neither the coordinator's arguments nor the node config")
	}
	// The nodes mount the ConfigMap the upgrade changed: the test bed
	// updates each mount as the kubelet does (tests/cluster configMount).
	// The Deployment rolls: the new replica starts, then the old one stops
	// and releases the Lease.
	startCoordinator(t, c, "release-2", "--leader-elect=true")
	old.stop(syscall.SIGTERM)
	waitFor(t, 30*time.Second, "the upgraded coordinator to lead", func(ctx context.Context) (bool, error) {
		l, err := c.Client.CoordinationV1().Leases(after.Namespace).Get(ctx, "gpufrac-coordinator", metav1.GetOptions{})
		return err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == "release-2", nil
	})
	// The nodes applied the new config.
	for _, a := range c.NodeAgents() {
		waitFor(t, 15*time.Second, a.Node+" to reload its config", func(ctx context.Context) (bool, error) {
			body, err := a.Metrics(ctx)
			return err == nil && containsLine(body, `gpufrac_config_reloads_total{result="success"} 2`), nil
		})
	}

	// 3. New work is placed by the upgraded coordinator (binpack: onto a GPU
	// already shared).
	create(t, c, pod("frac-20", "team-b").Fraction(20).Obj())
	p := running(t, c, 60*time.Second, "frac-20")["frac-20"]
	t.Logf("frac-20 placed on %s %s", p.Spec.NodeName, p.Annotations[api.AnnotationGPU])

	// 4. Nothing the old release ran changed: the same pods on the same
	// nodes and GPUs, the same reservation pods (same UIDs), the same queue
	// status once frac-20 is taken out.
	if err := c.Client.CoreV1().Pods("default").Delete(ctx, "frac-20", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	var w1 world
	waitFor(t, 30*time.Second, "frac-20 gone and the queues settled", func(ctx context.Context) (bool, error) {
		w1 = snapshot(t, c)
		_, present := w1.Pods["frac-20"]
		return !present && cmp.Equal(w0.Queues, w1.Queues), nil
	})
	if diff := cmp.Diff(w0, w1); diff != "" {
		t.Errorf("the upgrade changed running work (-before +after):\n%s", diff)
	}
	if got := slices.Sorted(maps.Keys(w1.Pods)); !slices.Equal(got, sortedCopy(all)) {
		t.Errorf("pods after the upgrade %v, want %v", got, all)
	}
	// No pod was evicted or deleted by either release.
	evs, err := c.Client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "reason=Evicted"})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs.Items) > 0 {
		t.Errorf("%d pods evicted across the upgrade", len(evs.Items))
	}
}

func sortedCopy(s []string) []string {
	out := slices.Clone(s)
	sort.Strings(out)
	return out
}

// containsLine tells whether body has exactly this line.
func containsLine(body, line string) bool {
	return slices.Contains(strings.Split(body, "\n"), line)
}
