package scheduler

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/coordinator/reservation"
	"github.com/gpufrac/gpufrac/coordinator/state"
)

// idleReservation is a reservation of GPU-n1-0, admitted, with no fraction.
func idleReservation() *corev1.Pod {
	p := reservation.PodAt("n1", "GPU-n1-0", 0, reservation.DefaultOptions())
	p.UID = "idle-reservation"
	p.Status.Phase = corev1.PodRunning
	p.Annotations[api.AnnotationReservedGPU] = "GPU-n1-0"
	return p
}

// TestNoFractionIsBoundOnAReservationBeingRemoved: a reservation the
// manager removes (its grace without fractions is over) is still in the
// informer's cache for a moment - terminating, or not even that when the
// watch lags behind the delete. A fraction placed on its GPU then would be
// bound at once (the reservation looks admitted) and run on a GPU that no
// reservation holds a moment later: the kubelet may give that GPU whole to
// another pod, and nothing reserves it again while the fraction runs.
func TestNoFractionIsBoundOnAReservationBeingRemoved(t *testing.T) {
	for _, tc := range []struct {
		name string
		// lag: the informer does not show the deletion yet; else it shows the
		// pod terminating.
		lag bool
	}{
		{name: "terminating"},
		{name: "deleted, informer behind", lag: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := idleReservation()
			if !tc.lag {
				res.DeletionTimestamp = &metav1.Time{Time: time.Unix(1_700_000_000, 0)}
			}
			c := newCluster(t, "binpack", []*corev1.Node{h100Node("n1", "a", 2)}, []*v1alpha1.Queue{queueOf("q", "8")}, res)
			r := &laggingReserver{fakeReserver: fakeReserver{c: c, admit: true}, removing: map[string]bool{}}
			c.s.deps.Reserver = r
			if tc.lag {
				r.removing[string(res.UID)] = true // deleted by the last cycle's Reconcile
			}
			_ = c.pods.Add(fracPod("f1", "q", 40))
			c.cycle()
			c.cycle() // a reservation the first cycle asked for is admitted now
			if got := c.b.Annotations["f1"][api.AnnotationGPU]; got == "GPU-n1-0" {
				t.Errorf("f1 bound to GPU-n1-0, whose reservation is being removed")
			}
		})
	}
}

// laggingReserver is a fakeReserver whose deletions the informer has not
// shown yet (removing: pod UIDs).
type laggingReserver struct {
	fakeReserver
	removing map[string]bool
}

func (f *laggingReserver) Removing() map[types.UID]bool {
	out := map[types.UID]bool{}
	for uid := range f.removing {
		out[types.UID(uid)] = true
	}
	return out
}

func (f *laggingReserver) Reconcile(_ context.Context, rs map[state.NodeGPU]*state.Reservation, wanted map[state.NodeGPU]bool, _ map[types.UID]bool) int {
	return 0
}
