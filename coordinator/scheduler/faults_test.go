package scheduler

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/coordinator/placeholder"
	"github.com/gpufrac/gpufrac/coordinator/reservation"
	"github.com/gpufrac/gpufrac/tests/builders"
)

// TestNonPreemptiblePriorityZeroIsSettable: a threshold of 0 makes every
// pod non-preemptible; it must not fall back to the default.
func TestNonPreemptiblePriorityZeroIsSettable(t *testing.T) {
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 8)}, []*v1alpha1.Queue{queueOf("q", "8")},
		builders.MakePod("p50", "default").Queue("q").GPUs(1).Priority(50).UID("p50").Obj())
	c.s.opts.NonPreemptiblePriority = ptr.To[int32](0)
	c.cycle()
	if got := c.b.Annotations["p50"][api.AnnotationDoNotDisrupt]; got != "true" {
		t.Errorf("priority-50 pod with threshold 0: annotations %v, want do-not-disrupt (non-preemptible)", c.b.Annotations["p50"])
	}
}

// badQueueCluster is a cluster whose queues come from a lister holding a
// valid queue "good", a Queue object that does not convert ("bad": its
// priority is a string) and a child of it.
func badQueueCluster(t *testing.T) (*cluster, *recordingStatus) {
	t.Helper()
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, q := range []*v1alpha1.Queue{queueOf("good", "8"), builders.MakeQueue("child").Parent("bad").GPUQuota("1").Obj()} {
		u, err := v1alpha1.ToUnstructured(q)
		if err != nil {
			t.Fatal(err)
		}
		_ = idx.Add(u)
	}
	bad := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.APIVersion, "kind": v1alpha1.QueueKind,
		"metadata": map[string]any{"name": "bad", "uid": "uid-bad"},
		"spec":     map[string]any{"priority": "high"},
	}}
	_ = idx.Add(bad)
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 8)}, nil,
		gpuPod("in-bad", "bad", 1), gpuPod("in-child", "child", 1), gpuPod("in-good", "good", 1))
	c.s.deps.Queues = QueuesFromLister(cache.NewGenericLister(idx, v1alpha1.QueueGVR().GroupResource()))
	rec := &recordingStatus{st: map[string]v1alpha1.QueueStatus{}}
	c.s.deps.Status = rec
	return c, rec
}

// TestQueueThatFailsConversionIsReported: a Queue object the coordinator
// cannot read is not dropped silently: its pods say it is invalid and why,
// its children that their parent is invalid (not "does not exist"), and
// the Queue itself gets a condition saying why.
func TestQueueThatFailsConversionIsReported(t *testing.T) {
	c, rec := badQueueCluster(t)
	events := record.NewFakeRecorder(10)
	c.s.deps.Recorder = events
	c.cycle()
	if c.boundTo("in-good") == "" {
		t.Errorf("a pod of the valid queue was not bound: %s", c.b.Messages["in-good"])
	}
	if r, msg := c.b.Reason("in-bad"); r != api.ReasonInvalidRequest || !strings.Contains(msg, "queue bad is invalid") || !strings.Contains(msg, "priority") {
		t.Errorf("pod of the unreadable queue: %s %q, want InvalidRequest saying queue bad is invalid and why (its priority)", r, msg)
	}
	if r, msg := c.b.Reason("in-child"); r != api.ReasonInvalidRequest || strings.Contains(msg, "does not exist") || !strings.Contains(msg, `parent "bad" is invalid`) {
		t.Errorf("pod of the child queue: %s %q, want InvalidRequest saying its parent is invalid", r, msg)
	}
	st, ok := rec.st["bad"]
	if !ok {
		t.Fatalf("no status written for queue bad; written: %v", rec.st)
	}
	cond := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionValid)
	if cond == nil || cond.Status != metav1.ConditionFalse || !strings.Contains(cond.Message, "priority") {
		t.Errorf("queue bad conditions %+v, want Valid=False naming the priority", st.Conditions)
	}
	if cond := meta.FindStatusCondition(rec.st["child"].Conditions, v1alpha1.ConditionValid); cond == nil || cond.Status != metav1.ConditionFalse {
		t.Errorf("queue child conditions %+v, want Valid=False", rec.st["child"].Conditions)
	}
	if cond := meta.FindStatusCondition(rec.st["good"].Conditions, v1alpha1.ConditionValid); cond == nil || cond.Status != metav1.ConditionTrue {
		t.Errorf("queue good conditions %+v, want Valid=True", rec.st["good"].Conditions)
	}
	// An event on each invalid queue, once: the next cycle repeats neither
	// the events nor the status writes.
	writes := rec.n
	c.cycle()
	close(events.Events)
	var got []string
	for e := range events.Events {
		got = append(got, e)
	}
	if len(got) != 2 || !strings.HasPrefix(got[0], "Warning InvalidQueue") || !strings.HasPrefix(got[1], "Warning InvalidQueue") {
		t.Errorf("events %q, want one Warning InvalidQueue for bad and one for child", got)
	}
	if rec.n != writes {
		t.Errorf("the second cycle wrote %d unchanged statuses again", rec.n-writes)
	}
}

// fakePlaceholders records placeholder creations and deletions.
type fakePlaceholders struct {
	created, deleted []string
	pods             []*corev1.Pod // the placeholders created
}

func (f *fakePlaceholders) Create(_ context.Context, p *corev1.Pod) error {
	f.created = append(f.created, p.Name)
	f.pods = append(f.pods, p)
	return nil
}

func (f *fakePlaceholders) MarkUnschedulable(context.Context, *corev1.Pod) error { return nil }

func (f *fakePlaceholders) Delete(_ context.Context, p *corev1.Pod, _ string) error {
	f.deleted = append(f.deleted, p.Name)
	return nil
}

// TestPlaceholderHintsArePrunedWithNodeChurn: the nodes Karpenter
// nominated or where placeholders landed, and the release times, are kept
// per placeholder group; with Karpenter's nodes coming and going and new
// groups every hour, they must go with their groups and nodes, not grow.
func TestPlaceholderHintsArePrunedWithNodeChurn(t *testing.T) {
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 8)}, []*v1alpha1.Queue{queueOf("q", "8")})
	c.s.deps.Placeholders = &fakePlaceholders{}
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	c.s.clock = clk
	for i := range 50 {
		group := fmt.Sprintf("%010x", i)
		node := fmt.Sprintf("kwok-gpu-%d", i)
		c.s.OnEvent(&corev1.Event{
			Reason:         karpenterNominated,
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: api.ReservationNamespace, Name: placeholder.NamePrefix + group + "-0"},
			Message:        fmt.Sprintf("Pod should schedule on: nodeclaim/claim-%d, node/%s", i, node),
		})
		// The group's placeholder landed on its node and was released.
		ph := builders.MakePod(placeholder.NamePrefix+group+"-1", api.ReservationNamespace).UID(group).
			Label(api.LabelRole, api.RolePlaceholder).Label(placeholder.LabelGroup, group).Node(node).Obj()
		_ = c.pods.Add(ph)
		c.s.hints.mu.Lock()
		c.s.hints.released[group] = clk.Now() // as syncPlaceholders records it for a group with pending work
		c.s.hints.mu.Unlock()
		c.cycle()
		_ = c.pods.Delete(ph)
	}
	// Nodes gone, no placeholders, no pending work: nothing to remember.
	clk.Step(time.Hour)
	c.cycle()
	c.s.hints.mu.Lock()
	defer c.s.hints.mu.Unlock()
	if n, m, r := len(c.s.hints.preferred), len(c.s.hints.claims), len(c.s.hints.released); n+m+r != 0 {
		t.Errorf("after 50 groups came and went: %d preferred, %d nominatedClaims, %d released entries left, want none", n, m, r)
	}
}

// reclaimCluster: team-b borrowed all 4 GPUs of n1 while team-a was idle;
// team-a (deserves 2) now asks for 2. The terminating pods were deleted
// with the default grace period of 30 s, a moment ago on the scheduler's
// clock.
func reclaimCluster(t *testing.T, terminating ...string) *cluster {
	t.Helper()
	var pods []*corev1.Pod
	gone := map[string]bool{}
	for _, n := range terminating {
		gone[n] = true
	}
	now := time.Unix(1_700_000_000, 0)
	for i := range 4 {
		p := admitted(gpuPod(fmt.Sprintf("b-%d", i), "team-b", 1), "n1")
		if gone[p.Name] {
			p.DeletionTimestamp = &metav1.Time{Time: now.Add(30 * time.Second)}
		}
		pods = append(pods, p)
	}
	pods = append(pods, gpuPod("a-0", "team-a", 2))
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 4)}, []*v1alpha1.Queue{queueOf("team-a", "2"), queueOf("team-b", "2")}, pods...)
	c.s.clock = clocktesting.NewFakeClock(now)
	return c
}

// TestReclaimDoesNotStallOnRefusedEvictions: evictions the API refuses
// (429: a PodDisruptionBudget) are not remembered as victims to wait for;
// a later cycle tries again instead of waiting forever.
func TestReclaimDoesNotStallOnRefusedEvictions(t *testing.T) {
	c := reclaimCluster(t)
	refused := apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
	c.b.EvictErr = func(*corev1.Pod) error { return refused }
	c.cycle()
	if got := c.b.EvictedPods(); len(got) != 0 {
		t.Fatalf("evicted %v although every eviction was refused", got)
	}
	// The budget allows it now.
	c.b.EvictErr = nil
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	c.s.clock = clk
	for range 3 {
		clk.Step(30 * time.Second)
		c.cycle()
	}
	if got := c.b.EvictedPods(); len(got) != 2 {
		_, msg := c.b.Reason("a-0")
		t.Errorf("after the budget allowed it: evicted %v, want two team-b pods (a-0 says %q)", got, msg)
	}
}

// TestReclaimWaitsForVictimsAfterRestart: a new leader does not know what
// the old one evicted, but the API does: victims still terminating are
// waited for, not joined by more victims.
func TestReclaimWaitsForVictimsAfterRestart(t *testing.T) {
	c := reclaimCluster(t, "b-0", "b-1") // the previous leader's victims, still terminating
	c.cycle()
	if got := c.b.EvictedPods(); len(got) != 0 {
		t.Errorf("a restarted coordinator evicted %v while two victims were still terminating", got)
	}
	if r, msg := c.b.Reason("a-0"); r != api.ReasonNoCapacity || !strings.Contains(msg, "terminating") {
		t.Errorf("a-0: %s %q, want NoCapacity saying it waits for terminating pods", r, msg)
	}
}

func gangOf(name string, n int) []*corev1.Pod {
	var out []*corev1.Pod
	for i := range n {
		pn := fmt.Sprintf("%s-%d", name, i)
		out = append(out, builders.MakePod(pn, "default").Queue("q").GPUs(1).CPU("1").PodGroup(name).MinMember(n).UID(pn).Obj())
	}
	return out
}

// TestGangRollsBackWhenAMemberCannotBind: one member's binding keeps
// failing; the members bound must not hold their GPUs for longer than the
// gang bind timeout: they are evicted with a reason, and the pending member
// says why the gang waits.
func TestGangRollsBackWhenAMemberCannotBind(t *testing.T) {
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 8)}, []*v1alpha1.Queue{queueOf("q", "8")}, gangOf("g", 4)...)
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	c.s.clock = clk
	conflict := apierrors.NewConflict(corev1.Resource("pods/binding"), "g-2", fmt.Errorf("pod g-2 is being deleted"))
	c.b.BindErr = func(p *corev1.Pod, _ string) error {
		if p.Name == "g-2" {
			return conflict
		}
		return nil
	}
	c.cycle()
	for _, n := range []string{"g-0", "g-1", "g-3"} {
		if c.boundTo(n) == "" {
			t.Fatalf("%s not bound in the first cycle", n)
		}
	}
	// Cycles go by for a minute; the binding of g-2 keeps failing.
	for range 12 {
		clk.Step(5 * time.Second)
		c.cycle()
	}
	released := c.b.ReleasedPods()
	for _, n := range []string{"g-0", "g-1", "g-3"} {
		if _, ok := released[n]; !ok {
			t.Errorf("%s still holds its GPU a minute after its gang failed to bind whole (released: %v)", n, released)
		}
	}
	if r, msg := c.b.Reason("g-2"); r != api.ReasonGangIncomplete || !strings.Contains(msg, "rolled back") {
		t.Errorf("g-2: %s %q, want GangIncomplete saying the gang was rolled back", r, msg)
	}
}

// TestGangRetriesAFailedBindWithinTheTimeout: a binding that fails once is
// retried by the next cycle and the gang completes; nothing is rolled back.
func TestGangRetriesAFailedBindWithinTheTimeout(t *testing.T) {
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 8)}, []*v1alpha1.Queue{queueOf("q", "8")}, gangOf("g", 4)...)
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	c.s.clock = clk
	c.b.NextBindErr = apierrors.NewServiceUnavailable("etcd leader changed")
	c.cycle()
	clk.Step(time.Second)
	c.cycle()
	for _, p := range gangOf("g", 4) {
		if c.boundTo(p.Name) == "" {
			r, msg := c.b.Reason(p.Name)
			t.Errorf("%s not bound after a retry: %s %q", p.Name, r, msg)
		}
	}
	if got := c.b.ReleasedPods(); len(got) != 0 {
		t.Errorf("released %v after a binding that failed once", got)
	}
}

// TestBindQueueSendHonoursCancellation: when Run ends its bind workers stop;
// a cycle that still hands out bindings must end too, not block on a full
// queue nobody reads (which kept the lease holder from stopping).
func TestBindQueueSendHonoursCancellation(t *testing.T) {
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 8)}, []*v1alpha1.Queue{queueOf("q", "8")},
		gpuPod("p1", "q", 1), gpuPod("p2", "q", 1))
	c.s.binds = make(chan bindTask) // no worker reads it
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := c.s.Cycle(ctx)
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Cycle blocked on the bind queue after its context was cancelled")
	}
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	if len(c.s.assumed) != 0 {
		t.Errorf("%d pods still assumed after their bindings were dropped", len(c.s.assumed))
	}
}

// TestFailedReservationsAreRemoved: a reservation the kubelet rejected at
// admission (its GPU was taken) ends Failed; it holds nothing, but left in
// place it keeps its name taken and says "rejected at admission" forever.
// The reservation manager is given it to remove.
func TestFailedReservationsAreRemoved(t *testing.T) {
	failed := reservation.PodAt("n1", "GPU-n1-0", 0, reservation.DefaultOptions())
	failed.UID = "failed-reservation"
	failed.Status.Phase = corev1.PodFailed
	failed.Status.Reason = "UnexpectedAdmissionError"
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 2)}, []*v1alpha1.Queue{queueOf("q", "8")}, failed, fracPod("f1", "q", 40))
	r := &fakeReserver{c: c}
	c.s.deps.Reserver = r
	c.cycle()
	if len(r.removedPods) != 1 || r.removedPods[0] != failed.Name {
		t.Errorf("reservations removed %v, want the failed %s", r.removedPods, failed.Name)
	}
	// Its name stays taken until it is gone: the next reservation of that GPU uses the next attempt.
	if len(r.ensured) == 1 && r.ensured[0] == "n1/GPU-n1-0" && r.attempts[0] == 0 {
		t.Errorf("a new reservation of GPU-n1-0 reuses the failed one's name (attempt 0)")
	}
}

// TestQueueBorrowsIdleQuotaWhenItsPodsArriveInSteps: team-b may borrow idle
// team-a's share whether its pods arrive at once or a few per cycle. The
// fair share is computed from each queue's demand, its usage plus what it
// asks for (queue.FairShare); with pending requests alone, a queue that
// already used its quota had a demand no larger than its usage, so it got
// no surplus once its first pods ran.
func TestQueueBorrowsIdleQuotaWhenItsPodsArriveInSteps(t *testing.T) {
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 8)}, []*v1alpha1.Queue{queueOf("team-a", "4"), queueOf("team-b", "4")})
	for i := range 8 {
		_ = c.pods.Add(gpuPod(fmt.Sprintf("b-%d", i), "team-b", 1))
		if i%2 == 1 {
			c.cycle()
		}
	}
	c.cycle()
	for i := range 8 {
		n := fmt.Sprintf("b-%d", i)
		if c.boundTo(n) == "" {
			r, msg := c.b.Reason(n)
			t.Errorf("%s not bound: %s %q", n, r, msg)
		}
	}
}

// TestGangBindErrorsAreForgotten: the last binding error of each gang is
// kept to explain a rollback. A gang whose binding failed before any member
// was bound never becomes "bound in part", and a tenant that deletes its
// gangs' pods while they are being bound (or any passing API failure) must
// not make that memory grow with every gang name ever seen.
func TestGangBindErrorsAreForgotten(t *testing.T) {
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 8)}, []*v1alpha1.Queue{queueOf("q", "8")})
	gone := apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, "x")
	c.b.BindErr = func(*corev1.Pod, string) error { return gone }
	for i := range 20 {
		name := fmt.Sprintf("g%d", i)
		p := builders.MakePod(name+"-0", "default").Queue("q").GPUs(1).CPU("1").UID(name).PodGroup(name).MinMember(1).Obj()
		_ = c.pods.Add(p)
		c.cycle() // the binding fails: the pod was deleted meanwhile
		_ = c.pods.Delete(p)
	}
	c.cycle()
	c.s.bindFailed.mu.Lock()
	defer c.s.bindFailed.mu.Unlock()
	if n := len(c.s.bindFailed.gangErr); n != 0 {
		t.Errorf("%d gang binding errors remembered after their gangs are gone, want 0", n)
	}
}

// TestGangRollbackStaysInItsQueue: two queues take pods from one
// namespace. A team-b pod that carries the pod group of team-a's running
// gang and a min-member beyond it (labels and annotations stay the pod
// author's to change after binding) is team-b's own workload: its min-member
// must not make team-a's gang look bound in part and get it rolled back.
func TestGangRollbackStaysInItsQueue(t *testing.T) {
	mk := func(name, queue string, min int) *corev1.Pod {
		return admitted(builders.MakePod(name, "default").Queue(queue).GPUs(1).CPU("1").UID(name).PodGroup("train").MinMember(min).Obj(), "n1")
	}
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 8)}, []*v1alpha1.Queue{queueOf("team-a", "4"), queueOf("team-b", "4")},
		mk("a-train-0", "team-a", 2), mk("a-train-1", "team-a", 2), mk("b-train", "team-b", 10))
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	c.s.clock = clk
	for range 10 {
		c.cycle()
		clk.Step(10 * time.Second)
	}
	released := c.b.ReleasedPods()
	for _, n := range []string{"a-train-0", "a-train-1"} {
		if _, ok := released[n]; ok {
			t.Errorf("team-a's complete gang was rolled back (released %v) because of team-b's pod", released)
		}
	}
}

// TestGangThatLostItsMembersIsPlacedAgainWhole: a spot node is reclaimed
// under a running gang of two. Its members are going (drained: a deletion
// timestamp) or stay bound to the node that is gone until the pod garbage
// collector comes; the Job makes new pods one by one. A member going or on
// a gone node is no member the gang can count on: the first new pod waits
// for the second, and the two are bound together, in one pool (the gone
// node's pool pins nothing).
func TestGangThatLostItsMembersIsPlacedAgainWhole(t *testing.T) {
	for _, tc := range []struct {
		name string
		old  func(p *corev1.Pod) *corev1.Pod
	}{
		{"on a node that is gone", func(p *corev1.Pod) *corev1.Pod { return admitted(p, "reclaimed") }},
		{"being deleted", func(p *corev1.Pod) *corev1.Pod {
			p = admitted(p, "b1")
			p.DeletionTimestamp = &metav1.Time{Time: time.Unix(1_699_999_990, 0)}
			return p
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			member := func(name string) *corev1.Pod {
				return builders.MakePod(name, "default").Queue("q").GPUs(1).CPU("1").PodGroup("train").MinMember(2).UID(name).Obj()
			}
			c := newCluster(t, "", []*corev1.Node{h100Node("a1", "pool-a", 1), h100Node("b1", "pool-b", 4)},
				[]*v1alpha1.Queue{queueOf("q", "8")},
				tc.old(member("old-0")), tc.old(member("old-1")), member("new-0"))
			clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
			c.s.clock = clk
			c.cycle()
			if n := c.boundTo("new-0"); n != "" {
				t.Fatalf("new-0 bound to %s alone: the gang's other members are lost, not placed", n)
			}
			if r := c.reason("new-0"); r != api.ReasonGangIncomplete {
				t.Errorf("new-0 reason %q (%s), want GangIncomplete", r, c.b.Messages["new-0"])
			}
			_ = c.pods.Add(member("new-1"))
			clk.Step(time.Second)
			c.cycle()
			n0, n1 := c.boundTo("new-0"), c.boundTo("new-1")
			if n0 == "" || n1 == "" {
				t.Fatalf("gang not bound whole once complete: new-0 %q (%s), new-1 %q (%s)", n0, c.b.Messages["new-0"], n1, c.b.Messages["new-1"])
			}
			if n0[:1] != n1[:1] {
				t.Errorf("gang bound across pools: %s and %s", n0, n1)
			}
		})
	}
}

// TestGangWithAFailedMemberIsRolledBack: a gang of two, one member running
// and the other failed before it ran (refused at admission; a Job keeps its
// failed pods) with nothing to replace it: the running member holds its GPU
// for a gang that never ran whole, and is evicted after the gang bind
// timeout. A member that ran, then succeeded or failed in its work, counts
// as having run: the gang was whole, and its survivor is left alone.
func TestGangWithAFailedMemberIsRolledBack(t *testing.T) {
	ranAndFailed := []corev1.ContainerStatus{{Name: "main", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
		ExitCode: 1, StartedAt: metav1.Time{Time: time.Unix(1_699_999_000, 0)}, FinishedAt: metav1.Time{Time: time.Unix(1_699_999_900, 0)}}}}}
	for _, tc := range []struct {
		name       string
		phase      corev1.PodPhase
		statuses   []corev1.ContainerStatus
		rolledBack bool
	}{
		{"failed before it ran", corev1.PodFailed, nil, true},
		{"failed after it ran", corev1.PodFailed, ranAndFailed, false},
		{"succeeded", corev1.PodSucceeded, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gang := gangOf("g", 2)
			running := admitted(gang[0], "n1")
			ended := admitted(gang[1], "n1")
			ended.Status.Phase = tc.phase
			ended.Status.ContainerStatuses = tc.statuses
			c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 8)}, []*v1alpha1.Queue{queueOf("q", "8")}, running, ended)
			clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
			c.s.clock = clk
			for range 10 {
				c.cycle()
				clk.Step(5 * time.Second)
			}
			_, released := c.b.ReleasedPods()["g-0"]
			if released != tc.rolledBack {
				t.Errorf("g-0 released=%v with its gang's other member %s, want %v", released, tc.phase, tc.rolledBack)
			}
		})
	}
}

// TestGangPlaceholdersAskInAPoolWithGPUs: a gang with no member placed and
// no pool of its own asks for capacity in the first pool that has GPU
// nodes, never in a CPU pool that sorts before it (where Karpenter could
// never buy its GPUs, and it would wait for ever).
func TestGangPlaceholdersAskInAPoolWithGPUs(t *testing.T) {
	cpu := builders.MakeNode("c1").CPU("64").Memory("256Gi").Pool("cpu").Obj()
	busy := admitted(builders.MakePod("busy", "default").Queue("q").GPUs(1).CPU("1").UID("busy").Obj(), "g1")
	c := newCluster(t, "", []*corev1.Node{cpu, h100Node("g1", "gpu", 1)}, []*v1alpha1.Queue{queueOf("q", "8")},
		append(gangOf("g", 2), busy)...)
	c.s.opts.ElasticPools = true
	ph := &fakePlaceholders{}
	c.s.deps.Placeholders = ph
	c.cycle()
	if len(ph.pods) == 0 {
		t.Fatalf("no placeholder for the gang: g-0 %s %q", c.reason("g-0"), c.b.Messages["g-0"])
	}
	for _, p := range ph.pods {
		if got := p.Spec.NodeSelector[api.LabelNodePool]; got != "gpu" {
			t.Errorf("placeholder %s asks in pool %q, want gpu (the only pool with GPU nodes)", p.Name, got)
		}
	}
}

// TestGangOnUnpooledNodesStaysThere: a gang's member runs on a static node
// of no pool; its replacement goes beside it, never to a Karpenter pool
// with more room (the nodes of no pool are a pool of their own).
func TestGangOnUnpooledNodesStaysThere(t *testing.T) {
	member := func(name string) *corev1.Pod {
		return builders.MakePod(name, "default").Queue("q").GPUs(1).CPU("1").PodGroup("g").MinMember(2).UID(name).Obj()
	}
	c := newCluster(t, "", []*corev1.Node{h100Node("a1", "a", 8), h100Node("s1", "", 2)}, []*v1alpha1.Queue{queueOf("q", "8")},
		admitted(member("g-0"), "s1"), member("g-1"))
	c.cycle()
	if n := c.boundTo("g-1"); n != "s1" {
		t.Errorf("g-1 bound to %q (%s), want s1 beside its gang's member", n, c.b.Messages["g-1"])
	}
}
