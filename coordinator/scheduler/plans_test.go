package scheduler

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/coordinator/reservation"
	"github.com/gpufrac/gpufrac/coordinator/scheduler/schedulertest"
	"github.com/gpufrac/gpufrac/tests/builders"
)

// TestWaitingFractionKeepsItsGPU: a fraction waiting for its GPU's
// reservation stays on that GPU in later cycles even when a fresh placement
// would now prefer another GPU, so it never asks for a second reservation;
// it moves only when its reservation is removed.
func TestWaitingFractionKeepsItsGPU(t *testing.T) {
	tests := []struct {
		name string
		// removeReservation deletes the waited-for reservation after the
		// second cycle (as Reconcile does when the kubelet never gave it).
		removeReservation bool
		wantGPU           func(planned, other string) string
		wantEnsured       int
	}{
		{name: "reservation admitted: binds where planned", wantGPU: func(planned, _ string) string { return planned }, wantEnsured: 1},
		{name: "reservation removed: placed again", removeReservation: true, wantGPU: func(_, other string) string { return other }, wantEnsured: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCluster(t, "binpack", []*corev1.Node{h100Node("n1", "a", 2)}, []*v1alpha1.Queue{queueOf("q", "8")}, fracPod("f", "q", 40))
			r := &fakeReserver{c: c}
			c.s.deps.Reserver = r

			// 1. f waits for the reservation of the GPU it was given.
			c.cycle()
			if len(r.ensured) != 1 || c.reason("f") != api.ReasonReservationPending {
				t.Fatalf("after the first cycle: reservations %v, f's reason %q; want one reservation and ReservationPending", r.ensured, c.reason("f"))
			}
			planned := r.ensured[0][len("n1/"):]
			other := "GPU-n1-0"
			if planned == other {
				other = "GPU-n1-1"
			}

			// 2. The other GPU now holds a 60% fraction under an admitted
			// reservation: a fresh placement of f (40%) would fit it exactly.
			res := reservation.Pod("n1", other, reservation.DefaultOptions())
			res.UID = types.UID(res.Name)
			res.Annotations[api.AnnotationReservedGPU] = other
			_ = c.pods.Add(res)
			_ = c.pods.Add(builders.MakePod("sixty", "default").Queue("q").Fraction(60).CPU("1").UID("sixty").
				Node("n1").Annotation(api.AnnotationGPU, other).Obj())
			c.cycle()
			if c.boundTo("f") != "" {
				t.Fatalf("f was bound to %s (GPU %s) before its reservation was admitted", c.boundTo("f"), c.b.Annotations["f"][api.AnnotationGPU])
			}

			// 3. Admit or remove f's reservation.
			obj, _, _ := c.pods.GetByKey(api.ReservationNamespace + "/" + reservation.Name("n1", planned))
			mine := obj.(*corev1.Pod).DeepCopy()
			if tt.removeReservation {
				_ = c.pods.Delete(mine)
			} else {
				mine.Annotations[api.AnnotationReservedGPU] = planned
				_ = c.pods.Update(mine)
			}
			c.cycle()

			got := struct {
				Node, GPU string
				Ensured   int
			}{c.boundTo("f"), c.b.Annotations["f"][api.AnnotationGPU], len(r.ensured)}
			want := struct {
				Node, GPU string
				Ensured   int
			}{"n1", tt.wantGPU(planned, other), tt.wantEnsured}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("f's binding (-want +got):\n%s\nreservations asked for: %v", diff, r.ensured)
			}
		})
	}
}

// TestReservationPendingIsReportedAfterTheDelay: a fraction waiting for its
// reservation gets no pod condition (no API write) until it has waited
// ReservationReportDelay, and is counted as pending all the same.
func TestReservationPendingIsReportedAfterTheDelay(t *testing.T) {
	tests := []struct {
		name       string
		delay      time.Duration
		waited     time.Duration // how long the pod has waited before the second cycle
		wantReason [2]string     // after the first and the second cycle
	}{
		{name: "no delay: at once", wantReason: [2]string{api.ReasonReservationPending, api.ReasonReservationPending}},
		{name: "short wait: nothing written", delay: time.Hour, waited: time.Minute},
		{name: "long wait: written", delay: time.Hour, waited: 2 * time.Hour, wantReason: [2]string{"", api.ReasonReservationPending}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCluster(t, "binpack", []*corev1.Node{h100Node("n1", "a", 2)}, []*v1alpha1.Queue{queueOf("q", "8")}, fracPod("f", "q", 40))
			c.s.deps.Reserver = &fakeReserver{c: c}
			c.s.opts.ReservationReportDelay = tt.delay
			var got [2]string
			for i := range got {
				res := c.cycle()
				if res.Pending[api.ReasonReservationPending] != 1 {
					t.Errorf("cycle %d: pending %v, want f counted as ReservationPending", i+1, res.Pending)
				}
				got[i] = c.reason("f")
				// The pod began to wait tt.waited ago.
				pl := c.s.plans["f"]
				pl.since = pl.since.Add(-tt.waited)
				c.s.plans["f"] = pl
			}
			if diff := cmp.Diff(tt.wantReason, got); diff != "" {
				t.Errorf("f's reason after each cycle (-want +got):\n%s", diff)
			}
		})
	}
}

// TestReservationPendingWaitsForTheKubelet: a fraction is told
// ReservationPending only once its wait is the kubelet's - its reservation
// exists and has not been admitted ReservationReportDelay after its
// creation. While the reservation is still being created (the informer does
// not show it), nothing is written until the pod has waited
// reservationStuckFactor times the delay.
func TestReservationPendingWaitsForTheKubelet(t *testing.T) {
	const delay = time.Hour
	tests := []struct {
		name       string
		shown      bool          // the informer shows the reservation created
		age        time.Duration // the reservation's age when shown
		waited     time.Duration // how long the pod has waited before the second cycle
		wantReason string        // after the second cycle
	}{
		{name: "being created, waited past the delay: nothing written", waited: 2 * delay},
		{name: "being created, waited past the stuck bound: written", waited: reservationStuckFactor * delay, wantReason: api.ReasonReservationPending},
		{name: "shown, younger than the delay: nothing written", shown: true, age: time.Minute, waited: 2 * delay},
		{name: "shown, not admitted for the delay: written", shown: true, age: 2 * delay, waited: 2 * delay, wantReason: api.ReasonReservationPending},
		{name: "shown, not admitted for the delay, pod waited less: nothing written", shown: true, age: 2 * delay, waited: time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCluster(t, "binpack", []*corev1.Node{h100Node("n1", "a", 2)}, []*v1alpha1.Queue{queueOf("q", "8")}, fracPod("f", "q", 40))
			r := &fakeReserver{c: c, lag: !tt.shown}
			c.s.deps.Reserver = r
			c.s.opts.ReservationReportDelay = delay
			if res := c.cycle(); res.Pending[api.ReasonReservationPending] != 1 || len(r.ensured) != 1 {
				t.Fatalf("first cycle: pending %v, reservations %v; want f waiting for one", res.Pending, r.ensured)
			}
			for _, obj := range c.pods.List() {
				if p := obj.(*corev1.Pod); p.Namespace == api.ReservationNamespace {
					p = p.DeepCopy()
					p.CreationTimestamp = metav1.NewTime(time.Now().Add(-tt.age))
					_ = c.pods.Update(p)
				}
			}
			pl := c.s.plans["f"]
			pl.since = pl.since.Add(-tt.waited)
			c.s.plans["f"] = pl
			if res := c.cycle(); res.Pending[api.ReasonReservationPending] != 1 {
				t.Errorf("second cycle: pending %v, want f counted as ReservationPending", res.Pending)
			}
			if got := c.reason("f"); got != tt.wantReason {
				t.Errorf("f's reason %q, want %q", got, tt.wantReason)
			}
		})
	}
}

// TestNoReservationForAGPUAReservationHolds replays the demo's overbooked
// node: the coordinator binds a one-GPU pod and reserves the node's other
// three GPUs in one cycle; gpufrac-node gives the whole-GPU pod the GPU the
// first reservation asked for, that reservation the second one's GPU, and
// the second reservation the GPU the coordinator had counted for the
// whole-GPU pod. While the node agent has written back all but the second
// reservation's GPU, no GPU is free, and the coordinator must not reserve
// one more (the kubelet would fail it: "Requested: 1, Available: 0"). Once
// all is written back, every fraction binds to a GPU its reservation holds.
func TestNoReservationForAGPUAReservationHolds(t *testing.T) {
	c := newCluster(t, "binpack", []*corev1.Node{h100Node("n1", "a", 4)}, []*v1alpha1.Queue{queueOf("q", "8")},
		gpuPod("ddp-0", "q", 1), fracPod("f0", "q", 60), fracPod("f1", "q", 60), fracPod("f2", "q", 60))
	r := &fakeReserver{c: c}
	c.s.deps.Reserver = r

	// 1. ddp-0 binds, the fractions wait for three reservations.
	c.cycle()
	if c.boundTo("ddp-0") != "n1" || len(r.ensured) != 3 {
		t.Fatalf("after the first cycle: ddp-0 bound to %q, reservations %v; want n1 and three", c.boundTo("ddp-0"), r.ensured)
	}
	var asked []string // the GPUs reservations a, b and c ask for
	for _, e := range r.ensured {
		asked = append(asked, strings.TrimPrefix(e, "n1/"))
	}
	slices.Sort(asked)
	counted := "" // the GPU the coordinator counted for ddp-0
	for i := range 4 {
		if g := fmt.Sprintf("GPU-n1-%d", i); !slices.Contains(asked, g) {
			counted = g
		}
	}
	update := func(namespace, name, key, value string) {
		t.Helper()
		obj, ok, _ := c.pods.GetByKey(namespace + "/" + name)
		if !ok {
			t.Fatalf("no pod %s/%s", namespace, name)
		}
		p := obj.(*corev1.Pod).DeepCopy()
		p.Annotations[key] = value
		_ = c.pods.Update(p)
	}

	// 2. The kubelet admitted ddp-0 on a's GPU, a on b's, b on the one
	// counted for ddp-0, c on its own; b's GPU is not written back yet.
	update("default", "ddp-0", api.AnnotationAllocatedGPU, asked[0])
	update(api.ReservationNamespace, reservation.Name("n1", asked[0]), api.AnnotationReservedGPU, asked[1])
	update(api.ReservationNamespace, reservation.Name("n1", asked[2]), api.AnnotationReservedGPU, asked[2])
	c.cycle()
	if len(r.ensured) != 3 {
		t.Fatalf("with every GPU of n1 held, reservations asked for: %v; want only the first three", r.ensured)
	}

	// 3. b's GPU is written back: the fractions bind, each under a reservation.
	update(api.ReservationNamespace, reservation.Name("n1", asked[1]), api.AnnotationReservedGPU, counted)
	c.cycle()
	reserved := map[string]bool{asked[1]: true, asked[2]: true, counted: true}
	perGPU := map[string]int{}
	for _, f := range []string{"f0", "f1", "f2"} {
		g := c.b.Annotations[f][api.AnnotationGPU]
		if c.boundTo(f) != "n1" || !reserved[g] {
			t.Errorf("%s bound to %q on GPU %q (%s); want n1, on a GPU a reservation holds (%v)", f, c.boundTo(f), g, msg(c.b, f), reserved)
		}
		perGPU[g]++
	}
	for g, n := range perGPU {
		if n > 1 {
			t.Errorf("%d fractions of 60%% bound to GPU %s", n, g)
		}
	}
	if len(r.ensured) != 3 {
		t.Errorf("reservations asked for: %v; want only the first three", r.ensured)
	}
}

// msg is the pod's last pending message on the fake binder.
func msg(b *schedulertest.Binder, pod string) string {
	_, m := b.Reason(pod)
	return m
}

// laggingReservations is one 8-GPU node, a pending 30% fraction f0, a fake
// clock and a reserver whose pods the informer never shows.
func laggingReservations(t *testing.T) (*cluster, *clocktesting.FakeClock, *fakeReserver) {
	t.Helper()
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 8)}, []*v1alpha1.Queue{queueOf("q", "8")}, fracPod("f0", "q", 30))
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	c.s.clock = clk
	r := &fakeReserver{c: c, lag: true}
	c.s.deps.Reserver = r
	return c, clk, r
}

// TestAReservationIsNotAskedForAgainWhileTheInformerLags: an informer that
// shows a reservation created 20 s late (a loaded control plane) meets no
// second create of it.
func TestAReservationIsNotAskedForAgainWhileTheInformerLags(t *testing.T) {
	c, clk, r := laggingReservations(t)
	for range 20 {
		c.cycle()
		clk.Step(time.Second)
	}
	if len(r.ensured) != 1 {
		t.Errorf("20 s of cycles before the informer shows the reservation: reservations %v, want one", r.ensured)
	}
}

// TestAReservationCreatedIsNotAskedForAgain: cycles that run before the
// informer shows a reservation pod just created see its GPU without one;
// they must not create it again (each such request only met
// AlreadyExists: thousands in a burst). Once reservationEcho has passed
// without the pod showing up, it is asked for again.
func TestAReservationCreatedIsNotAskedForAgain(t *testing.T) {
	c, clk, r := laggingReservations(t)
	c.cycle()
	if len(r.ensured) != 1 {
		t.Fatalf("first cycle: reservations %v, want one", r.ensured)
	}
	for range 6 {
		clk.Step(reservationEcho / 7)
		c.cycle()
	}
	if len(r.ensured) != 1 {
		t.Fatalf("within %s of the creation: reservations %v, want still one", reservationEcho, r.ensured)
	}
	clk.Step(reservationEcho - 6*(reservationEcho/7))
	c.cycle()
	if len(r.ensured) != 2 || r.ensured[1] != r.ensured[0] {
		t.Errorf("%s after a creation the informer never showed: reservations %v, want the same one asked for again", reservationEcho, r.ensured)
	}
}
