package reservation

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/state"
	"github.com/gpufrac/gpufrac/tests/apitest"
	"github.com/gpufrac/gpufrac/tests/builders"
)

// TestRemovedReservationStaysRemovingWhileShown: a reservation deleted while
// the informer lags must stay in Removing for as long as the informer shows
// it, whatever the snapshot makes of it. state.Build leaves a reservation
// pod out of Snapshot.Reservations when its node settles (it just lost a
// NoExecute taint, e.g. not-ready after a missed heartbeat), when another
// reservation of the same GPU comes after it in the list, or when it never
// got its GPU and another pod holds that GPU; Reconcile took each for "gone
// from the informer's cache" and forgot the deletion. A stale informer then
// showed the deleted reservation as a usable one, and its GPU was offered to
// fractions with no reservation pod holding it on the API server.
func TestRemovedReservationStaysRemovingWhileShown(t *testing.T) {
	gpu := builders.GPUUUID("n", 0)
	key := state.NodeGPU{Node: "n", GPU: gpu}
	tests := []struct {
		name string
		// admitted: the reservation got its GPU (gpufrac.io/reserved-gpu)
		// before it was removed as idle; else it is removed for never getting
		// it within AdmitTimeout.
		admitted bool
		// leftOut changes the inputs of the cycles after the deletion so
		// that the snapshot's reservations leave the deleted pod out, while
		// the informer still shows it.
		leftOut func(in *state.Inputs, clk *clocktesting.FakeClock)
	}{
		{name: "its node settles", admitted: true, leftOut: func(in *state.Inputs, _ *clocktesting.FakeClock) {
			in.Settling = map[string]bool{"n": true}
		}},
		// state.Build charges a node's pods in UID order: the last charged
		// of two reservations of one GPU is its Reservation.
		{name: "a newer reservation of the same GPU is charged after it", admitted: true, leftOut: func(in *state.Inputs, clk *clocktesting.FakeClock) {
			p := PodAt("n", gpu, 1, DefaultOptions())
			p.UID, p.ResourceVersion = "res-uid-2", "2"
			p.Annotations[api.AnnotationReservedGPU] = gpu
			p.CreationTimestamp = metav1.NewTime(clk.Now())
			in.Pods = append(in.Pods, p)
		}},
		{name: "never admitted, and a whole-GPU pod holds its GPU", leftOut: func(in *state.Inputs, _ *clocktesting.FakeClock) {
			w := builders.MakePod("w", "default").GPUs(1).Node("n").Annotation(api.AnnotationAllocatedGPU, gpu).Obj()
			w.UID, w.ResourceVersion = "w", "1"
			w.Status.Phase = corev1.PodRunning
			in.Pods = append(in.Pods, w)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
			node := builders.MakeNode("n").Inventory("fraction", 1).Obj()
			node.ResourceVersion = "1"
			p := PodAt("n", gpu, 0, DefaultOptions())
			p.UID, p.ResourceVersion = types.UID("res-uid"), "1"
			if tt.admitted {
				p.Annotations[api.AnnotationReservedGPU] = gpu
			}
			p.CreationTimestamp = metav1.NewTime(clk.Now().Add(-time.Hour))
			client := fake.NewSimpleClientset(p.DeepCopy())
			m := NewManager(client, nil, Options{Grace: time.Minute, AdmitTimeout: 10 * time.Minute}, clk)
			ctx := t.Context()
			build := func(leftOut bool, pods ...*corev1.Pod) *state.Snapshot {
				t.Helper()
				in := state.Inputs{Nodes: []*corev1.Node{node}, Pods: pods, Removing: m.Removing(), Now: clk.Now()}
				if leftOut {
					tt.leftOut(&in, clk)
				}
				snap, err := state.Build(in)
				if err != nil {
					t.Fatal(err)
				}
				return snap
			}
			reconcile := func(snap *state.Snapshot) int {
				return m.Reconcile(ctx, snap.Reservations, nil, snap.RemovingShown)
			}
			// Idle past the grace period (the first cycle starts its clock),
			// or never admitted in time (the first cycle removes it).
			n := reconcile(build(false, p))
			clk.Step(2 * time.Minute)
			if n += reconcile(build(false, p)); n != 1 {
				t.Fatalf("removed %d, want 1", n)
			}
			// The informer still shows it (its watch broke), and the
			// snapshot leaves it out for a few cycles.
			for range 2 {
				if r := build(true, p).Reservations[key]; r != nil && r.Pod == p {
					t.Fatalf("the snapshot keeps the reservation (%+v): the case does not test what it says", r)
				}
				reconcile(build(true, p))
			}
			if !m.Removing()["res-uid"] {
				t.Errorf("Removing() = %v while the informer still shows the deleted reservation, want res-uid", m.Removing())
			}
			// Shown as it was, by itself again, and now admitted (the node
			// agent wrote its GPU just before the deletion): it takes no
			// fraction.
			p.Annotations[api.AnnotationReservedGPU] = gpu
			if r := build(false, p).Reservations[key]; r != nil && r.Pod == p && r.Orphaned == "" && r.Ready {
				t.Errorf("the deleted reservation of %s is offered as usable (Ready, not orphaned): fractions would be bound on a GPU no reservation holds", gpu)
			}
			// Gone from the informer: forgotten.
			reconcile(build(false))
			if got := m.Removing(); len(got) != 0 {
				t.Errorf("Removing() = %v once the informer no longer shows it, want none", got)
			}
		})
	}
}

// TestIdleReservationWhoseBackgroundDeletionFailedGoesNextCycle: an idle
// reservation whose deletion failed in the background is deleted again by
// the next Reconcile, as one deleted inline is; its idle clock does not
// start over, which kept it (and its GPU) a whole grace period longer.
func TestIdleReservationWhoseBackgroundDeletionFailedGoesNextCycle(t *testing.T) {
	for _, background := range []bool{false, true} {
		t.Run(map[bool]string{false: "inline", true: "background"}[background], func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
			p := Pod("n", "g", DefaultOptions())
			p.UID = "uid-r"
			client := fake.NewSimpleClientset(p)
			unavailable := apierrors.NewServiceUnavailable("the API server is overloaded")
			failOnce := apitest.FailOnce(&client.Fake, "delete", "pods", "", unavailable)
			m := NewManager(client, nil, Options{Grace: time.Minute, AdmitTimeout: time.Hour}, clk)
			if background {
				m.RemoveInBackground(4)
			}
			ctx := t.Context()
			rs := map[state.NodeGPU]*state.Reservation{{Node: "n", GPU: "g"}: {Pod: p, Ready: true}}
			m.Reconcile(ctx, rs, nil, nil) // idle from now
			clk.Step(2 * time.Minute)
			m.Reconcile(ctx, rs, nil, nil) // past its grace: the deletion fails
			m.Wait()
			if failOnce.Fired() != 1 {
				t.Fatalf("injected delete failures: %d, want 1", failOnce.Fired())
			}
			clk.Step(time.Second)
			if n := m.Reconcile(ctx, rs, nil, nil); n != 1 {
				t.Errorf("the next Reconcile removed %d, want 1 (its grace was over before the failure)", n)
			}
			m.Wait()
			if _, err := client.CoreV1().Pods(api.ReservationNamespace).Get(ctx, p.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("the reservation still exists: %v", err)
			}
		})
	}
}

// TestBackgroundDeletionThatFailsAtOnceLeavesRemoving: a deletion that
// fails before Reconcile has returned (the API server answers at once)
// leaves Removing, so that the next Reconcile decides again. Reconcile
// marked the reservation Removing again after handing it over, over the
// failure: it stayed Removing - its GPU held, never deleted again - for as
// long as the pod lived. The race is run many times: it needs the deletion's
// goroutine to finish first, which it does a few times in a thousand under
// -race (go test -race, as the project runs its unit tests).
func TestBackgroundDeletionThatFailsAtOnceLeavesRemoving(t *testing.T) {
	p := Pod("n", "g", DefaultOptions())
	p.UID = "uid-r"
	rs := map[state.NodeGPU]*state.Reservation{{Node: "n", GPU: "g"}: {Pod: p, Ready: true, Orphaned: "node n is cordoned"}}
	const runs = 3000
	stuck := 0
	for range runs {
		client := fake.NewSimpleClientset(p)
		client.PrependReactor("delete", "pods", func(clienttesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewTooManyRequests("the API server is overloaded", 1)
		})
		m := NewManager(client, nil, Options{Grace: time.Minute, AdmitTimeout: time.Hour}, nil)
		m.RemoveInBackground(4)
		m.Reconcile(t.Context(), rs, nil, nil)
		m.Wait()
		if m.Removing()["uid-r"] {
			stuck++
		}
	}
	if stuck > 0 {
		t.Errorf("in %d of %d runs the reservation stayed Removing after its deletion failed", stuck, runs)
	}
}
