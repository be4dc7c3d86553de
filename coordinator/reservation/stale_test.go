package reservation

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/state"
	"github.com/gpufrac/gpufrac/tests/builders"
)

// TestRemovedReservationStaysRemovingWhileShownOnASettlingNode: a
// reservation deleted while the informer lags must stay in Removing for as
// long as the informer shows it, whatever the snapshot makes of its node.
// A node that settles (it just lost a NoExecute taint, e.g. not-ready after
// a missed heartbeat) is left out of the snapshot, and so are its
// reservations: Reconcile took that for "gone from the informer's cache"
// and forgot the deletion. Once the node settled, the stale reservation was
// a Ready, usable reservation again, and its GPU was offered to fractions
// with no reservation pod holding it on the API server.
func TestRemovedReservationStaysRemovingWhileShownOnASettlingNode(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	node := builders.MakeNode("n").Inventory("fraction", 1).Obj()
	node.ResourceVersion = "1"
	gpu := builders.GPUUUID("n", 0)
	p := PodAt("n", gpu, 0, DefaultOptions())
	p.UID, p.ResourceVersion = types.UID("res-uid"), "1"
	p.Annotations[api.AnnotationReservedGPU] = gpu
	p.CreationTimestamp = metav1.NewTime(clk.Now().Add(-time.Hour))
	client := fake.NewSimpleClientset(p.DeepCopy())
	m := NewManager(client, nil, Options{Grace: time.Minute, AdmitTimeout: time.Hour}, clk)
	ctx := t.Context()
	key := state.NodeGPU{Node: "n", GPU: gpu}
	build := func(settling bool) *state.Snapshot {
		t.Helper()
		in := state.Inputs{Nodes: []*corev1.Node{node}, Pods: []*corev1.Pod{p}, Removing: m.Removing(), Now: clk.Now()}
		if settling {
			in.Settling = map[string]bool{"n": true}
		}
		snap, err := state.Build(in)
		if err != nil {
			t.Fatal(err)
		}
		return snap
	}
	// Idle past the grace period: removed.
	reconcile := func(snap *state.Snapshot) int { return m.Reconcile(ctx, snap.Reservations, nil, snap.RemovingShown) }
	reconcile(build(false))
	clk.Step(2 * time.Minute)
	if n := reconcile(build(false)); n != 1 {
		t.Fatalf("removed %d, want 1", n)
	}
	// The informer still shows it (its watch broke); the node settles for a
	// few cycles.
	reconcile(build(true))
	reconcile(build(true))
	if !m.Removing()["res-uid"] {
		t.Errorf("Removing() = %v while the informer still shows the deleted reservation, want res-uid", m.Removing())
	}
	// The node settled; the informer still shows the reservation.
	snap := build(false)
	if r := snap.Reservations[key]; r != nil && r.Orphaned == "" && r.Ready {
		t.Errorf("the deleted reservation of %s is offered as usable (Ready, not orphaned): fractions would be bound on a GPU no reservation holds", gpu)
	}
	// Gone from the informer: forgotten.
	snap, err := state.Build(state.Inputs{Nodes: []*corev1.Node{node}, Removing: m.Removing(), Now: clk.Now()})
	if err != nil {
		t.Fatal(err)
	}
	reconcile(snap)
	if got := m.Removing(); len(got) != 0 {
		t.Errorf("Removing() = %v once the informer no longer shows it, want none", got)
	}
}
