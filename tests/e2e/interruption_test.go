package e2e

import (
	"context"
	"slices"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/scheduler"
	"github.com/gpufrac/gpufrac/tests/cluster"
)

// Issue 31, spot interruptions, in part: Karpenter nodes are interrupted as
// Karpenter's interruption controller does it (their NodeClaims deleted:
// Karpenter drains them, but their reservations and the non-preemptible pod
// carry do-not-disrupt) and their instances are reclaimed a moment later
// (the Node objects go, as the cloud's two minutes end, compressed to 2 s).
// The fractions the Deployment makes again are placed with new reservations
// on other GPUs, the lost node's reservations go, no placeholder is left,
// and the invariant checker holds. The non-preemptible pod, a bare pod
// nothing makes again, is lost: the coordinator says so in an event on it
// (and gpufrac_nonpreemptible_pods_lost_total, which the unit test reads).
func TestSpotInterruptionPlacesFractionsAgainAndReportsLostWork(t *testing.T) {
	t.Parallel()
	c := karpenterCluster(t)
	dumpOnFailure(t, c)
	applyYAML(t, c, queuesYAML(map[string]string{"team-a": "8"}))
	startCoordinator(t, c, "c1", "--leader-elect=false", "--reservation-grace=5s")
	fractionDeployment(t, c, "embed", "team-a", 4, 40)
	create(t, c, pod("critical", "team-a").GPUs(1).Preemptible(false).Obj())
	before := waitApp(t, c, "embed", 4, 3*time.Minute)
	critNode := running(t, c, time.Minute, "critical")["critical"].Spec.NodeName
	lost := before[0].Spec.NodeName
	if lost == critNode {
		t.Fatalf("fractions on %s, the GPU node of the non-preemptible whole-GPU pod", lost)
	}
	var reservedBefore []string
	for _, r := range reservationsOn(t, c, lost) {
		reservedBefore = append(reservedBefore, string(r.UID))
	}
	if len(reservedBefore) == 0 {
		t.Fatalf("no reservation on %s under its fractions", lost)
	}

	// 1. The interruption: the NodeClaims of the nodes are deleted.
	claims, err := c.Dynamic.Resource(cluster.NodeClaimResource()).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{lost, critNode} {
		i := slices.IndexFunc(claims.Items, func(u unstructured.Unstructured) bool {
			n, _, _ := unstructured.NestedString(u.Object, "status", "nodeName")
			return n == node
		})
		if i < 0 {
			t.Fatalf("no NodeClaim for node %s", node)
		}
		claim := claims.Items[i].GetName()
		if err := c.Dynamic.Resource(cluster.NodeClaimResource()).Delete(t.Context(), claim, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Logf("interrupted node %s (NodeClaim %s)", node, claim)
	}

	// 2. The instances are reclaimed.
	time.Sleep(2 * time.Second)
	for _, node := range []string{lost, critNode} {
		if err := c.Client.CoreV1().Nodes().Delete(t.Context(), node, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	began := time.Now()
	waitFor(t, 3*time.Minute, "four fractions running again, none on the lost node", func(ctx context.Context) (bool, error) {
		pods := appPods(t, c, "embed")
		if len(pods) != 4 || len(podsOf(t, c, "default", "app=embed")) != 4 {
			return false, nil
		}
		for _, p := range pods {
			if p.Spec.NodeName == lost || p.Annotations[api.AnnotationAllocatedGPU] == "" {
				return false, nil
			}
		}
		return true, nil
	})
	t.Logf("the fractions run again %s after the node was reclaimed", time.Since(began).Round(100*time.Millisecond))
	waitFor(t, 60*time.Second, "the lost node's reservations to go", func(context.Context) (bool, error) {
		return len(reservationsOn(t, c, lost)) == 0, nil
	})
	for _, r := range reservationsOn(t, c, "") {
		if slices.Contains(reservedBefore, string(r.UID)) {
			t.Errorf("reservation %s of the lost node is still there", r.Name)
		}
	}
	settled(t, c, "after the interruption")
	if ph := systemPods(t, c, api.RolePlaceholder); len(ph) != 0 {
		t.Errorf("%d placeholders left after the fractions run again", len(ph))
	}

	// 3. The non-preemptible pod went with its node (the pod garbage
	// collector deletes pods of a node that is gone), and is said lost.
	var said string
	// kube-controller-manager's pod garbage collector deletes a gone node's
	// pods after a 40 s quarantine, checked every 20 s; under a loaded CI
	// run that took over two minutes once.
	waitFor(t, 5*time.Minute, "the non-preemptible pod said lost", func(ctx context.Context) (bool, error) {
		evs, err := c.Client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=critical"})
		if err != nil {
			return false, nil
		}
		for _, e := range evs.Items {
			if e.Reason == scheduler.ReasonNonPreemptibleLost {
				said = e.Message
				return true, nil
			}
		}
		return false, nil
	})
	t.Logf("critical: %s", said)
}
