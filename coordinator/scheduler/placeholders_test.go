package scheduler

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/coordinator/placeholder"
)

// clusterPlaceholders creates placeholder pods straight into the cluster's
// pods (marked Unschedulable, as placeholder.Manager does) and deletes them
// from there, recording why. Like Karpenter's fakes it can fail: the next
// deleteFails deletes return deleteErr, deleting nothing.
type clusterPlaceholders struct {
	c           *cluster
	created     []string
	deleted     map[string]string // name -> why
	marked      []string
	deleteErr   error
	deleteFails int
}

func (f *clusterPlaceholders) Create(ctx context.Context, p *corev1.Pod) error {
	p = p.DeepCopy()
	p.UID = types.UID(p.Name + "-" + time.Now().Format(time.RFC3339Nano))
	f.created = append(f.created, p.Name)
	if err := f.c.pods.Add(p); err != nil {
		return err
	}
	return f.MarkUnschedulable(ctx, p)
}

func (f *clusterPlaceholders) MarkUnschedulable(_ context.Context, p *corev1.Pod) error {
	p = p.DeepCopy()
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable}}
	f.marked = append(f.marked, p.Name)
	return f.c.pods.Update(p)
}

func (f *clusterPlaceholders) Delete(_ context.Context, p *corev1.Pod, why string) error {
	if f.deleteFails > 0 {
		f.deleteFails--
		return f.deleteErr
	}
	f.deleted[p.Name] = why
	return f.c.pods.Delete(p)
}

func (f *clusterPlaceholders) only(t *testing.T) *corev1.Pod {
	t.Helper()
	var out []*corev1.Pod
	for _, o := range f.c.pods.List() {
		if p := o.(*corev1.Pod); placeholder.IsPlaceholder(p) {
			out = append(out, p)
		}
	}
	if len(out) != 1 {
		t.Fatalf("%d placeholders, want 1", len(out))
	}
	return out[0]
}

// Work that finds room has its pending placeholders deleted before it is
// bound: left pending, a placeholder keeps asking Karpenter (whose
// simulation, seeing the work where it nominated the placeholder, buys
// another node), and one kube-scheduler serves (of an earlier version)
// could be bound to the same GPU in the same moment, and the kubelet would
// admit one of the two only. A placeholder no scheduler serves is never
// bound: its work binds in the same cycle. Otherwise, and when the delete
// fails, the work waits for a later cycle.
func TestPlaceholderIsWithdrawnBeforeItsWorkIsBound(t *testing.T) {
	for _, tc := range []struct {
		name string
		// kubeScheduler: the placeholder is one kube-scheduler serves.
		kubeScheduler bool
		deleteFails   int
		// wantCycles is the cycles after busy ends until w is bound.
		wantCycles int
	}{
		{name: "never bound: w binds in the cycle that withdrew it", wantCycles: 1},
		{name: "kube-scheduler's: w binds in the next cycle", kubeScheduler: true, wantCycles: 2},
		// The cycle's placeholder sync deletes it again (no pending work
		// wants it): w binds in the next cycle.
		{name: "the delete fails once: w waits a cycle", deleteFails: 1, wantCycles: 2},
		{name: "both deletes of the first cycle fail: w binds once withdrawn", deleteFails: 2, wantCycles: 2},
		{name: "three deletes fail: w waits two cycles", deleteFails: 3, wantCycles: 3},
		{name: "kube-scheduler's, both deletes of the first cycle fail", kubeScheduler: true, deleteFails: 2, wantCycles: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 1)}, []*v1alpha1.Queue{queueOf("q", "8")},
				admitted(gpuPod("busy", "q", 1), "n1"), gpuPod("w", "q", 1))
			ph := &clusterPlaceholders{c: c, deleted: map[string]string{}}
			c.s.deps.Placeholders = ph
			c.cycle() // n1 is full: w asks for capacity
			asked := ph.only(t)
			if !placeholder.NeverBound(asked) || !placeholder.AsksKarpenter(asked) {
				t.Fatalf("placeholder scheduler %q conditions %v: want one no scheduler serves, marked Unschedulable", asked.Spec.SchedulerName, asked.Status.Conditions)
			}
			if tc.kubeScheduler {
				old := asked.DeepCopy()
				old.Spec.SchedulerName = ""
				_ = c.pods.Update(old)
			}

			// busy ends: w fits on n1, its placeholder still pending.
			obj, _, _ := c.pods.GetByKey("default/busy")
			done := obj.(*corev1.Pod).DeepCopy()
			done.Status.Phase = corev1.PodSucceeded
			_ = c.pods.Update(done)
			ph.deleteErr, ph.deleteFails = errors.New("injected: delete refused"), tc.deleteFails
			c.b.BindErr = func(p *corev1.Pod, _ string) error {
				if _, gone := ph.deleted[asked.Name]; p.Name == "w" && !gone {
					t.Errorf("w bound while its placeholder %s was still pending", asked.Name)
				}
				return nil
			}
			for i := 1; i <= tc.wantCycles; i++ {
				c.cycle()
				if n := c.boundTo("w"); (n != "") != (i == tc.wantCycles) {
					t.Fatalf("cycle %d after busy ended: w bound to %q; want it bound in cycle %d", i, n, tc.wantCycles)
				}
			}
			if c.boundTo("w") != "n1" {
				t.Fatalf("w bound to %q, want n1", c.boundTo("w"))
			}
			if _, gone := ph.deleted[asked.Name]; !gone {
				t.Errorf("placeholder %s never deleted", asked.Name)
			}
		})
	}
}

// A fraction's placeholder goes before the reservation of the GPU it found:
// pending next to that reservation on the node Karpenter nominated, it would
// no longer fit there in Karpenter's simulation, which would buy another.
func TestPlaceholderIsWithdrawnBeforeTheReservation(t *testing.T) {
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 1)}, []*v1alpha1.Queue{queueOf("q", "8")},
		admitted(gpuPod("busy", "q", 1), "n1"), fracPod("f", "q", 40))
	ph := &clusterPlaceholders{c: c, deleted: map[string]string{}}
	c.s.deps.Placeholders = ph
	r := &fakeReserver{c: c}
	c.s.deps.Reserver = r
	c.cycle()
	asked := ph.only(t).Name
	obj, _, _ := c.pods.GetByKey("default/busy")
	done := obj.(*corev1.Pod).DeepCopy()
	done.Status.Phase = corev1.PodSucceeded
	_ = c.pods.Update(done)
	ph.deleteErr, ph.deleteFails = errors.New("injected: delete refused"), 1
	c.cycle()
	if len(r.ensured) != 0 {
		t.Fatalf("reservation %v made while the placeholder %s could not be withdrawn", r.ensured, asked)
	}
	c.cycle()
	if _, gone := ph.deleted[asked]; !gone || len(r.ensured) != 1 {
		t.Fatalf("placeholder withdrawn %v, reservations %v: want it withdrawn and the GPU reserved", gone, r.ensured)
	}
}

// A placeholder whose Unschedulable mark failed at creation is marked again
// once it is old enough that the informer would show the mark: until then
// Karpenter does not see it.
func TestPlaceholderNotAskingIsMarkedAgain(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC))
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 1)}, []*v1alpha1.Queue{queueOf("q", "8")},
		admitted(gpuPod("busy", "q", 1), "n1"), gpuPod("w", "q", 1))
	c.s.clock = clk
	ph := &clusterPlaceholders{c: c, deleted: map[string]string{}}
	c.s.deps.Placeholders = ph
	c.cycle()
	unmarked := ph.only(t).DeepCopy()
	unmarked.Status.Conditions = nil // as if the mark had failed
	unmarked.CreationTimestamp = metav1.NewTime(clk.Now())
	_ = c.pods.Update(unmarked)
	ph.marked = nil
	clk.Step(remarkAfter / 2)
	c.cycle()
	if len(ph.marked) != 0 {
		t.Fatalf("marked again %v before remarkAfter", ph.marked)
	}
	clk.Step(remarkAfter)
	c.cycle()
	if len(ph.marked) != 1 || !placeholder.AsksKarpenter(ph.only(t)) {
		t.Fatalf("marked %v: want the placeholder marked again, asking Karpenter", ph.marked)
	}
	c.cycle()
	if len(ph.marked) != 1 {
		t.Errorf("marked %v: a placeholder already asking was marked again", ph.marked)
	}
}

// A group whose placeholder landed on a node another group's pods then
// took asks again once that node settled, not after the whole cooldown;
// while the node settles, it waits.
func TestPlaceholderAsksAgainWhenTheCapacityItFoundWasTaken(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC))
	old := h100Node("n1", "a", 1)
	old.CreationTimestamp = metav1.NewTime(clk.Now().Add(-time.Hour))
	c := newCluster(t, "", []*corev1.Node{old}, []*v1alpha1.Queue{queueOf("q", "8")},
		admitted(gpuPod("busy", "q", 1), "n1"), gpuPod("w", "q", 1))
	c.s.opts.NewNodeSettle = 3 * time.Second
	c.s.clock = clk
	ph := &clusterPlaceholders{c: c, deleted: map[string]string{}}
	c.s.deps.Placeholders = ph
	c.cycle()
	if len(ph.created) != 1 {
		t.Fatalf("placeholders created %v, want one for w", ph.created)
	}

	// Karpenter brings n2; w's placeholder lands there, and another pod
	// (whose own placeholder landed there first) takes its GPU.
	n2 := h100Node("n2", "a", 1)
	n2.CreationTimestamp = metav1.NewTime(clk.Now())
	_ = c.nodes.Add(n2)
	landed := ph.only(t).DeepCopy()
	landed.Spec.NodeName = "n2"
	_ = c.pods.Update(landed)
	clk.Step(500 * time.Millisecond)
	c.cycle() // released: capacity arrived on n2
	if _, ok := ph.deleted[landed.Name]; !ok {
		t.Fatalf("the landed placeholder was not released")
	}
	_ = c.pods.Add(admitted(gpuPod("thief", "q", 1), "n2"))

	clk.Step(time.Second) // n2 still settles: w's pods may yet get it
	c.cycle()
	if len(ph.created) != 1 {
		t.Errorf("a placeholder was asked again while its node settled: %v", ph.created)
	}
	clk.Step(3 * time.Second) // n2 settled, taken: 4.5 s after the release, within the cooldown
	c.cycle()
	if c.boundTo("w") != "" {
		t.Fatalf("w bound to %s; n2 was full", c.boundTo("w"))
	}
	if len(ph.created) != 2 {
		t.Errorf("placeholders created %v, want w's asked again once n2 settled full", ph.created)
	}
}

// A pending placeholder kube-scheduler serves (made by an earlier version,
// before placeholders named a scheduler nobody serves) is replaced by one
// nobody binds: left as it is, kube-scheduler could bind it to the GPU the
// coordinator binds its work to, in the same moment, on a node that now
// settles only NewNodeSettle (100 ms by default) from becoming usable, not 3 s.
func TestPlaceholderOfAnEarlierVersionIsReplaced(t *testing.T) {
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 1)}, []*v1alpha1.Queue{queueOf("q", "8")},
		admitted(gpuPod("busy", "q", 1), "n1"), gpuPod("w", "q", 1))
	ph := &clusterPlaceholders{c: c, deleted: map[string]string{}}
	c.s.deps.Placeholders = ph
	c.cycle()
	old := ph.only(t).DeepCopy()
	old.Spec.SchedulerName = corev1.DefaultSchedulerName
	old.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable}}
	_ = c.pods.Update(old)
	c.cycle()
	if _, ok := ph.deleted[old.Name]; !ok {
		t.Fatalf("deleted %v: the pending placeholder kube-scheduler serves was kept", ph.deleted)
	}
	c.cycle()
	p := ph.only(t)
	if !placeholder.NeverBound(p) || !placeholder.AsksKarpenter(p) {
		t.Errorf("placeholder %s: scheduler %q, asks Karpenter %v; want one nobody binds, asking Karpenter",
			p.Name, p.Spec.SchedulerName, placeholder.AsksKarpenter(p))
	}
}
