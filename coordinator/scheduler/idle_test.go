package scheduler

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
)

// tick is one turn of Run's loop: a cycle unless the cluster is idle and
// unchanged, then the bindings it queued. It tells whether a cycle ran.
func (c *cluster) tick() bool {
	c.t.Helper()
	before := testutil.ToFloat64(c.s.metrics.idleSkipped)
	c.s.cycleIfChanged(c.t.Context())
	c.applyBinds()
	return testutil.ToFloat64(c.s.metrics.idleSkipped) == before
}

func TestIdleClusterSkipsCyclesUntilSomethingHappens(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	c := newClockedCluster(t, clk, h100Node("n1", "a", 2), admitted(gpuPod("running", "q", 1), "n1"))
	if !c.tick() {
		t.Fatal("the first cycle was skipped")
	}
	clk.Step(time.Second)
	if c.tick() {
		t.Fatal("a cycle ran on an idle cluster with no event since the last")
	}
	// An event: a pod arrives.
	p := gpuPod("new", "q", 1)
	_ = c.pods.Add(p)
	c.s.OnPod(p)
	clk.Step(time.Second)
	if !c.tick() {
		t.Fatal("no cycle ran after a pod arrived")
	}
	if c.boundTo("new") != "n1" {
		t.Fatalf("new bound to %q, want n1", c.boundTo("new"))
	}
	// The binding and its informer event were changes: the next cycle runs,
	// finds the cluster idle again, and the one after is skipped.
	clk.Step(time.Second)
	if !c.tick() {
		t.Fatal("no cycle ran after a binding")
	}
	clk.Step(time.Second)
	if c.tick() {
		t.Fatal("a cycle ran on an idle cluster after the binding settled")
	}
	// Something no event told: a cycle runs once IdleResync has passed.
	clk.Step(DefaultIdleResync)
	if !c.tick() {
		t.Fatalf("no cycle ran %v after the last", DefaultIdleResync)
	}
	// A negative IdleResync never skips.
	c.s.opts.IdleResync = -1
	clk.Step(time.Second)
	if !c.tick() {
		t.Fatal("a cycle was skipped with IdleResync < 0")
	}
}

// TestClusterWaitingOnTimeIsNotIdle: a cluster where something changes
// with time alone, no event telling, runs every cycle.
func TestClusterWaitingOnTimeIsNotIdle(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(c *cluster)
		pods  []*corev1.Pod
	}{
		{name: "a pod pending for room", pods: []*corev1.Pod{
			admitted(gpuPod("running", "q", 2), "n1"), gpuPod("waits", "q", 1)}},
		{name: "a reservation without fractions (removed after a grace)", pods: []*corev1.Pod{idleReservation()}},
		{name: "fractions waiting for their reservation", pods: []*corev1.Pod{fracPod("f", "q", 40)},
			setup: func(c *cluster) { c.s.deps.Reserver = &fakeReserver{c: c} }},
		{name: "a pod whose Job the cache does not show yet", pods: []*corev1.Pod{jobPod("j-0", "j")},
			setup: func(c *cluster) {
				c.s.deps.Jobs = func(string, string) (*batchv1.Job, bool) { return nil, false }
			}},
		{name: "placeholder hints", setup: func(c *cluster) { c.s.hints.released["group"] = c.s.clock.Now() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
			c := newClockedCluster(t, clk, h100Node("n1", "a", 2), tc.pods...)
			if tc.setup != nil {
				tc.setup(c)
			}
			for i := range 3 {
				clk.Step(time.Second)
				if !c.tick() {
					t.Fatalf("cycle %d skipped", i+1)
				}
			}
		})
	}
}

// jobPod is a pending 1-GPU pod of queue q controlled by Job job.
func jobPod(name, job string) *corev1.Pod {
	p := gpuPod(name, "q", 1)
	yes := true
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: job, UID: types.UID(job), Controller: &yes}}
	return p
}
