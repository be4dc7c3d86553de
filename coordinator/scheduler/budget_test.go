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
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/coordinator/binder"
	"github.com/gpufrac/gpufrac/coordinator/placeholder"
	"github.com/gpufrac/gpufrac/coordinator/reservation"
	"github.com/gpufrac/gpufrac/tests/builders"
)

// tickingClock is a fake clock that moves on by tick every time it is read:
// work that reads the clock takes time, so a budget has something to spend.
type tickingClock struct {
	*clocktesting.FakeClock
	tick time.Duration
}

func (c *tickingClock) Now() time.Time {
	c.Step(c.tick)
	return c.FakeClock.Now()
}

func (c *tickingClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// budgetBacklog is a backlog of two queues' single pods and a gang, created
// one millisecond apart (the order the scheduler serves them in is then
// decided by the queues' shares and the pods' age, never by chance).
func budgetBacklog() []*corev1.Pod {
	created := time.Unix(1_700_000_000, 0)
	k := 0
	at := func(p *builders.PodWrapper) *corev1.Pod {
		k++
		return p.Created(metav1.NewTime(created.Add(time.Duration(k) * time.Millisecond))).Obj()
	}
	var pods []*corev1.Pod
	for i := range 10 {
		pods = append(pods, at(builders.MakePod(fmt.Sprintf("a-%d", i), "default").Queue("qa").GPUs(1+i%2).CPU("1").UID(fmt.Sprintf("a-%d", i))))
		pods = append(pods, at(builders.MakePod(fmt.Sprintf("b-%d", i), "default").Queue("qb").GPUs(1).CPU("1").UID(fmt.Sprintf("b-%d", i))))
		if i == 3 {
			for m := range 6 {
				name := fmt.Sprintf("gang-%d", m)
				pods = append(pods, at(builders.MakePod(name, "default").Queue("qb").GPUs(1).CPU("1").PodGroup("gang").MinMember(6).UID(name)))
			}
		}
	}
	return pods
}

func budgetCluster(t *testing.T, budget time.Duration) (*cluster, *[]string) {
	t.Helper()
	nodes := []*corev1.Node{h100Node("n1", "a", 8), h100Node("n2", "a", 8), h100Node("n3", "a", 8), h100Node("n4", "a", 8), h100Node("n5", "a", 8)}
	c := newCluster(t, "binpack", nodes, []*v1alpha1.Queue{queueOf("qa", "20"), queueOf("qb", "20")}, budgetBacklog()...)
	c.s.opts.PlaceBudget = budget
	var order []string // pods in the order their bindings were sent
	c.b.BindErr = func(p *corev1.Pod, _ string) error {
		order = append(order, p.Name)
		return nil
	}
	return c, &order
}

// TestPlaceBudgetBoundsACycle: a cycle stops placing once it has spent its
// place budget (Options.PlaceBudget) and leaves the rest of the backlog to
// the next cycles, counted as NextCycle and told nothing; the backlog is
// worked through over several cycles, each queue's pods in the order one
// unbounded cycle places them, a gang whole in one cycle.
func TestPlaceBudgetBoundsACycle(t *testing.T) {
	// One cycle without a budget: the order and the nodes to match.
	whole, wholeOrder := budgetCluster(t, -1)
	res := whole.cycle()
	if res.Bound != 26 {
		t.Fatalf("the unbounded cycle bound %d pods, want all 26 (pending %v)", res.Bound, res.Pending)
	}

	// A workload placed reads the clock a few times: 5 ms each.
	const budget = 25 * time.Millisecond
	c, order := budgetCluster(t, budget)
	clk := &tickingClock{FakeClock: clocktesting.NewFakeClock(time.Unix(1_700_000_100, 0)), tick: 5 * time.Millisecond}
	c.s.clock = clk
	var perCycle []int
	for cycle := 0; len(*order) < 26; cycle++ {
		if cycle == 26 {
			t.Fatalf("the backlog was not worked through in 26 cycles: bound per cycle %v", perCycle)
		}
		before := len(*order)
		res := c.cycle()
		perCycle = append(perCycle, res.Bound)
		if res.Bound == 0 {
			t.Fatalf("cycle %d placed nothing (pending %v)", cycle+1, res.Pending)
		}
		if left := 26 - before - res.Bound; res.Pending[ReasonNextCycle] != left {
			t.Errorf("cycle %d: %d pods left for the next cycle counted NextCycle, want %d (pending %v)", cycle+1, res.Pending[ReasonNextCycle], left, res.Pending)
		}
		for _, name := range (*order)[before:] {
			if r := c.reason(name); r != "" {
				t.Errorf("%s was told %q before it was bound", name, r)
			}
		}
		// The gang goes whole in one cycle.
		bound := 0
		for m := range 6 {
			if c.boundTo(fmt.Sprintf("gang-%d", m)) != "" {
				bound++
			}
		}
		if bound != 0 && bound != 6 {
			t.Fatalf("after cycle %d, %d of the gang's 6 members bound", cycle+1, bound)
		}
	}
	if len(perCycle) < 3 {
		t.Errorf("the backlog went in %d cycles (%v); want the budget to spread it over at least 3", len(perCycle), perCycle)
	}
	// Within each queue, the order one unbounded cycle places them in
	// (priority, then age; a gang's members go in no particular order).
	// Across queues each cycle ranks the queues by their shares afresh, so
	// neither waits for the other's whole backlog, as it does within one
	// cycle.
	for _, q := range []string{"a-", "b-"} {
		if diff := cmp.Diff(inQueue(*wholeOrder, q), inQueue(*order, q)); diff != "" {
			t.Errorf("order of queue %s's bindings over the budgeted cycles differs from one unbounded cycle's (-unbounded +budgeted):\n%s", q, diff)
		}
	}
	if first, last := slices.Index(*order, "b-0"), slices.Index(*order, "a-9"); first > last {
		t.Errorf("qb's first pod was bound after qa's last: %v", *order)
	}
}

// inQueue is order without the pods whose names do not start with prefix
// (the gang, in qb, is named "gang" there).
func inQueue(order []string, prefix string) []string {
	var out []string
	for _, name := range workloadOrder(order) {
		if strings.HasPrefix(name, prefix) || (prefix == "b-" && name == "gang") {
			out = append(out, name)
		}
	}
	return out
}

// workloadOrder is order with each gang member named by its gang.
func workloadOrder(order []string) []string {
	out := make([]string, len(order))
	for i, name := range order {
		if strings.HasPrefix(name, "gang-") {
			name = "gang"
		}
		out[i] = name
	}
	return out
}

// TestPlaceBudgetSkipsNoWorkThatDoesNotFit: workloads that do not fit do not
// spend the budget, so a cycle still places what fits behind them; and
// every cycle places at least one workload, however small the budget.
func TestPlaceBudgetSkipsNoWorkThatDoesNotFit(t *testing.T) {
	created := metav1.NewTime(time.Unix(1_700_000_000, 0))
	huge := builders.MakePod("huge", "default").Queue("q").GPUs(8).CPU("1").UID("huge").Created(created).Obj()
	pods := []*corev1.Pod{huge}
	for i := range 4 {
		pods = append(pods, builders.MakePod(fmt.Sprintf("p-%d", i), "default").Queue("q").GPUs(1).CPU("1").UID(fmt.Sprintf("p-%d", i)).
			Created(metav1.NewTime(created.Add(time.Duration(i+1)*time.Second))).Obj())
	}
	c := newCluster(t, "binpack", []*corev1.Node{h100Node("n1", "a", 4)}, []*v1alpha1.Queue{queueOf("q", "16")}, pods...)
	c.s.clock = &tickingClock{FakeClock: clocktesting.NewFakeClock(time.Unix(1_700_000_100, 0)), tick: time.Second}
	c.s.opts.PlaceBudget = time.Nanosecond
	for cycle := range 4 {
		res := c.cycle()
		if res.Bound != 1 || res.Pending[binder.ReasonNoCapacity] != 1 {
			t.Fatalf("cycle %d: bound %d, pending %v; want one pod bound behind the 8-GPU pod that never fits", cycle+1, res.Bound, res.Pending)
		}
	}
}

// TestPlannedWorkloadDoesNotWaitForTheBindQueue: a fraction placed in an
// earlier cycle whose reservation is now ready, met by a full bind queue,
// keeps its plan (and its GPU) for the next cycle instead of the cycle
// waiting for the bind workers.
func TestPlannedWorkloadDoesNotWaitForTheBindQueue(t *testing.T) {
	c := newCluster(t, "binpack", []*corev1.Node{h100Node("n1", "a", 2)}, []*v1alpha1.Queue{queueOf("q", "8")}, fracPod("f", "q", 40))
	r := &fakeReserver{c: c}
	c.s.deps.Reserver = r
	c.cycle()
	if len(r.ensured) != 1 {
		t.Fatalf("reservations asked for %v, want one", r.ensured)
	}
	planned := r.ensured[0][len("n1/"):]
	obj, _, _ := c.pods.GetByKey(api.ReservationNamespace + "/" + reservation.Name("n1", planned))
	res := obj.(*corev1.Pod).DeepCopy()
	res.Annotations[api.AnnotationReservedGPU] = planned
	_ = c.pods.Update(res)

	// The bind queue is full: one binding queued, room for one.
	queue := c.s.binds
	c.s.binds = make(chan bindTask, 1)
	c.s.binds <- bindTask{pod: builders.MakePod("other", "default").UID("other").Obj(), node: "n1"}
	done := make(chan Result, 1)
	go func() {
		out, err := c.s.Cycle(t.Context())
		if err != nil {
			t.Error(err)
		}
		done <- out
	}()
	select {
	case out := <-done:
		if out.Pending[ReasonWaitingToBind] != 1 {
			t.Errorf("pending %v, want f counted WaitingToBind", out.Pending)
		}
	case <-time.After(5 * time.Second):
		<-c.s.binds // let the cycle go
		<-done
		t.Fatal("the cycle waited for room in the bind queue")
	}
	if _, ok := c.s.plans["f"]; !ok {
		t.Fatal("f lost its plan")
	}

	// Room again: f goes where it was planned.
	c.s.binds = queue
	c.cycle()
	if got := c.b.Annotations["f"][api.AnnotationGPU]; c.boundTo("f") != "n1" || got != planned {
		t.Errorf("f bound to %q GPU %q, want n1 GPU %s (its plan)", c.boundTo("f"), got, planned)
	}
	if len(r.ensured) != 1 {
		t.Errorf("reservations asked for %v, want only the first", r.ensured)
	}
}

// TestPlaceBudgetKeepsThePlaceholdersOfWorkCut: a workload that asked
// Karpenter for capacity (its placeholder pending) and that a later cycle's
// place budget leaves for the next cycle keeps its placeholder: deleted as
// if no pending work needed it, Karpenter would drop the node it was
// buying, and the placeholder would be made again when the workload's turn
// came, for as long as fitting work ahead of it spends the budget.
func TestPlaceBudgetKeepsThePlaceholdersOfWorkCut(t *testing.T) {
	clk := &tickingClock{FakeClock: clocktesting.NewFakeClock(time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC))}
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 1), h100Node("n2", "b", 1)},
		[]*v1alpha1.Queue{queueOf("q", "8"), queueOf("q2", "8")},
		admitted(gpuPod("busy", "q", 1), "n1"), gpuPod("w", "q", 2))
	c.s.clock = clk
	ph := &clusterPlaceholders{c: c, deleted: map[string]string{}}
	c.s.deps.Placeholders = ph
	c.cycle()
	asked := ph.only(t)
	if !placeholder.AsksKarpenter(asked) {
		t.Fatalf("w's placeholder does not ask Karpenter")
	}

	// Work of another queue, which fits, comes first; each workload placed
	// spends the whole budget.
	for i := range 4 {
		if err := c.pods.Add(gpuPod(fmt.Sprintf("fit-%d", i), "q2", 1)); err != nil {
			t.Fatal(err)
		}
	}
	c.s.opts.PlaceBudget = time.Millisecond
	clk.tick = time.Millisecond
	res := c.cycle()
	if res.Bound == 0 || res.Pending[ReasonNextCycle] == 0 || c.boundTo("w") != "" {
		t.Fatalf("the cycle bound %d, pending %v: want the budget cut before w", res.Bound, res.Pending)
	}
	if why, gone := ph.deleted[asked.Name]; gone {
		t.Fatalf("w's placeholder was deleted (%q) while w waited for the next cycle", why)
	}
	if len(ph.created) != 1 {
		t.Errorf("placeholders created %v, want w's only", ph.created)
	}
}

// TestPlaceBudgetCountsPlacementsOnSettlingNodes: workloads placed on a
// node that settles are placed (their GPUs taken, their reservations made,
// bound once it settled without being placed again) and spend the place
// budget like any other: when Karpenter brings capacity for a backlog, the
// backlog goes there, and a cycle that placed it all at once is the long
// cycle the budget is there to prevent.
func TestPlaceBudgetCountsPlacementsOnSettlingNodes(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC))
	c := settlingCluster(t, clk, h100Node("old", "a", 1))
	_ = c.pods.Add(admitted(gpuPod("busy", "q", 1), "old"))
	for i := range 7 {
		_ = c.pods.Add(gpuPod(fmt.Sprintf("w-%d", i), "q", 1))
	}
	c.cycle()
	fresh := h100Node("new", "a", 8)
	fresh.CreationTimestamp = metav1.NewTime(clk.Now())
	fresh.Spec.Taints = []corev1.Taint{{Key: "karpenter.sh/unregistered", Effect: corev1.TaintEffectNoExecute}}
	_ = c.nodes.Add(fresh)
	clk.Step(time.Second)
	c.cycle()
	c.register(fresh)

	c.s.opts.PlaceBudget = time.Millisecond
	c.s.clock = &tickingClock{FakeClock: clk, tick: time.Millisecond}
	res := c.cycle()
	if res.Pending[ReasonNodeSettling] != 1 || res.Pending[ReasonNextCycle] != 7 {
		t.Fatalf("pending %v: want the budget spent by the first workload placed on new while it settles (1 NodeSettling, 7 NextCycle)", res.Pending)
	}
}

// TestFullBindQueueKeepsThePlaceholdersOfWorkWaiting: the same for a
// workload a full bind queue leaves for a later cycle.
func TestFullBindQueueKeepsThePlaceholdersOfWorkWaiting(t *testing.T) {
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 1)}, []*v1alpha1.Queue{queueOf("q", "8")},
		admitted(gpuPod("busy", "q", 1), "n1"), gpuPod("w", "q", 2))
	ph := &clusterPlaceholders{c: c, deleted: map[string]string{}}
	c.s.deps.Placeholders = ph
	c.cycle()
	asked := ph.only(t)
	c.s.binds = make(chan bindTask, 1)
	c.s.binds <- bindTask{pod: gpuPod("other", "q", 1), node: "n1"}
	res, err := c.s.Cycle(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if res.Pending[ReasonWaitingToBind] != 1 {
		t.Fatalf("pending %v: want w WaitingToBind", res.Pending)
	}
	if why, gone := ph.deleted[asked.Name]; gone {
		t.Fatalf("w's placeholder was deleted (%q) while w waited for room in the bind queue", why)
	}
}

// TestPlaceBudgetKeepsTheHintOfWorkCut: a workload whose placeholder landed
// (the node Karpenter bought for it is there, and preferred) and that the
// place budget leaves for later cycles keeps its hint: dropped as if
// nothing of its group waited, the workload would be placed anywhere once
// its turn came, and the node bought for it go to others.
func TestPlaceBudgetKeepsTheHintOfWorkCut(t *testing.T) {
	clk := &tickingClock{FakeClock: clocktesting.NewFakeClock(time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC))}
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 1), h100Node("n3", "c", 8)},
		[]*v1alpha1.Queue{queueOf("q", "8"), queueOf("q2", "8")},
		admitted(gpuPod("busy", "q", 1), "n1"), builders.MakePod("w", "default").Queue("q").GPUs(2).CPU("1").UID("w").NodeSelector(api.LabelNodePool, "a").Obj())
	c.s.clock = clk
	ph := &clusterPlaceholders{c: c, deleted: map[string]string{}}
	c.s.deps.Placeholders = ph
	c.cycle()
	asked := ph.only(t)
	group := asked.Labels[placeholder.LabelGroup]

	// Work of another queue, which fits on n3 only, comes first; each
	// workload placed spends the whole budget.
	for i := range 6 {
		if err := c.pods.Add(builders.MakePod(fmt.Sprintf("fit-%d", i), "default").Queue("q2").GPUs(1).CPU("1").UID(fmt.Sprintf("fit-%d", i)).NodeSelector(api.LabelNodePool, "c").Obj()); err != nil {
			t.Fatal(err)
		}
	}
	c.s.opts.PlaceBudget = time.Millisecond
	clk.tick = time.Millisecond
	// The placeholder lands on n2, which Karpenter brought.
	if err := c.nodes.Add(h100Node("n2", "a", 2)); err != nil {
		t.Fatal(err)
	}
	landed := asked.DeepCopy()
	landed.Spec.NodeName = "n2"
	_ = c.pods.Update(landed)
	cut := 0
	for cycle := 0; c.boundTo("w") == ""; cycle++ {
		if cycle == 6 {
			t.Fatal("w was not bound in 6 cycles")
		}
		if res := c.cycle(); c.boundTo("w") != "" {
			break
		} else if res.Pending[ReasonNextCycle] == 0 {
			t.Fatalf("cycle %d bound %d, pending %v: want the budget cut before w", cycle+1, res.Bound, res.Pending)
		}
		cut++
		if got, _ := c.s.hints.of(group); !slices.Equal(got, []string{"n2"}) {
			t.Fatalf("after cycle %d: w's group prefers %v, want [n2] (its placeholder landed there)", cycle+1, got)
		}
	}
	if cut < 2 || c.boundTo("w") != "n2" {
		t.Errorf("w cut in %d cycles, then bound to %q: want at least 2, then n2", cut, c.boundTo("w"))
	}
}
