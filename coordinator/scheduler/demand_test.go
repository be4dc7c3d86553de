package scheduler

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/coordinator/placement"
	"github.com/gpufrac/gpufrac/tests/builders"
)

// The cycle feeds the demand it sees to placement: with a T4-only pod
// running and another waiting, gpufrac leaves the last T4 GPU to the waiting
// one and puts the older flexible pod on the H100 node, although the T4
// node is the busiest (ties go to the busiest node).
func TestConstrainedDemandKeepsItsModel(t *testing.T) {
	t4 := builders.MakeNode("t4").GPUs(2).CPU("64").Memory("256Gi").Pool("a").Product("NVIDIA-T4").Obj()
	h100 := builders.MakeNode("h100").GPUs(8).CPU("128").Memory("1Ti").Pool("a").Product("NVIDIA-H100-80GB-HBM3").Obj()
	old := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	pod := func(name string, created metav1.Time) *builders.PodWrapper {
		return builders.MakePod(name, "default").Queue("q").GPUs(1).CPU("4").UID(name).Created(created)
	}
	running := pod("t4-running", old).GPUModels("NVIDIA-T4").Node("t4").Obj()
	flexible := pod("flexible", metav1.NewTime(old.Add(time.Minute))).Obj()
	waiting := pod("t4-waiting", metav1.NewTime(old.Add(2*time.Minute))).GPUModels("NVIDIA-T4").Obj()
	c := newCluster(t, placement.DefaultPolicy, []*corev1.Node{t4, h100}, []*v1alpha1.Queue{queueOf("q", "16")}, running, flexible, waiting)
	c.cycle()
	if got := c.boundTo("flexible"); got != "h100" {
		t.Errorf("flexible pod bound to %q, want h100 (the last T4 GPU is wanted by t4-waiting)", got)
	}
	if got := c.boundTo("t4-waiting"); got != "t4" {
		t.Errorf("t4-waiting bound to %q (reason %q), want t4", got, c.reason("t4-waiting"))
	}
}

// Pending pods that their queue may not run do not count as demand: with
// the T4-only pod over its queue's limit, the flexible pod fills the T4 node
// as it would without any demand (ties go to the busiest node); within the
// limit, it counts and the flexible pod leaves the T4 GPU to it.
func TestDemandCountsOnlyPodsTheirQueueMayRun(t *testing.T) {
	for _, tc := range []struct {
		limit, want string
	}{
		{limit: "1", want: "t4"},
		{limit: "2", want: "h100"},
	} {
		t.Run("limit "+tc.limit, func(t *testing.T) {
			t4 := builders.MakeNode("t4").GPUs(2).CPU("64").Memory("256Gi").Pool("a").Product("NVIDIA-T4").Obj()
			h100 := builders.MakeNode("h100").GPUs(8).CPU("128").Memory("1Ti").Pool("a").Product("NVIDIA-H100-80GB-HBM3").Obj()
			old := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			running := builders.MakePod("running", "default").Queue("q").GPUs(1).CPU("4").UID("running").Created(old).Node("t4").Obj()
			flexible := builders.MakePod("flexible", "default").Queue("q").GPUs(1).CPU("4").UID("flexible").Created(metav1.NewTime(old.Add(time.Minute))).Obj()
			t4Pair := builders.MakePod("t4-pair", "default").Queue("small").GPUs(2).CPU("4").UID("t4-pair").Created(metav1.NewTime(old.Add(2 * time.Minute))).GPUModels("NVIDIA-T4").Obj()
			queues := []*v1alpha1.Queue{queueOf("q", "16"), builders.MakeQueue("small").GPUQuota(tc.limit).GPULimit(tc.limit).Namespaces("default").Obj()}
			c := newCluster(t, placement.DefaultPolicy, []*corev1.Node{t4, h100}, queues, running, flexible, t4Pair)
			c.cycle()
			if got := c.boundTo("flexible"); got != tc.want {
				t.Errorf("flexible pod bound to %q, want %s (t4-pair: %q)", got, tc.want, msg(c.b, "t4-pair"))
			}
		})
	}
}

// TestDemandCountsABacklogOnlyUpToWhatItsQueueMayRun: issue 15's demand
// counts pending pods only when their queue admits them now. A tenant whose
// queue may run one more GPU submits ten T4-only pods: each alone is within
// the queue's limit, all ten are not. Counted one by one, the whole backlog
// would weigh on placement and push the other tenants' flexible pods off the
// T4 node; only what the queue may run together may count. (Two full A100
// nodes add flexible demand, so that one T4-only pod is too little pressure
// to move the flexible pod and ten are enough.)
func TestDemandCountsABacklogOnlyUpToWhatItsQueueMayRun(t *testing.T) {
	for _, tc := range []struct {
		name, limit, want string
	}{
		{name: "backlog beyond the limit", limit: "1", want: "t4"},
		{name: "backlog within the limit", limit: "10", want: "h100"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nodes := []*corev1.Node{
				builders.MakeNode("t4").GPUs(4).CPU("64").Memory("256Gi").Pool("a").Product("NVIDIA-T4").Obj(),
				builders.MakeNode("h100").GPUs(8).CPU("128").Memory("1Ti").Pool("a").Product("NVIDIA-H100-80GB-HBM3").Obj(),
			}
			old := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			// The T4 node runs one pod that takes most of its CPU, so the
			// backlog (60 CPUs each) is admitted but does not fit now.
			pods := []*corev1.Pod{
				builders.MakePod("running", "default").Queue("q").GPUs(1).CPU("8").UID("running").Created(old).Node("t4").Obj(),
				builders.MakePod("flexible", "default").Queue("q").GPUs(1).CPU("4").UID("flexible").Created(metav1.NewTime(old.Add(time.Minute))).Obj(),
			}
			for n := range 2 {
				node := fmt.Sprintf("a100-%d", n)
				nodes = append(nodes, builders.MakeNode(node).GPUs(8).CPU("128").Memory("1Ti").Pool("a").Product("NVIDIA-A100-SXM4-80GB").Obj())
				for g := range 8 {
					name := fmt.Sprintf("%s-%d", node, g)
					pods = append(pods, builders.MakePod(name, "default").Queue("q").GPUs(1).CPU("1").UID(name).Created(old).Node(node).Obj())
				}
			}
			for i := range 10 {
				name := fmt.Sprintf("t4-%d", i)
				pods = append(pods, builders.MakePod(name, "default").Queue("small").GPUs(1).CPU("60").UID(name).
					Created(metav1.NewTime(old.Add(2*time.Minute))).GPUModels("NVIDIA-T4").Obj())
			}
			queues := []*v1alpha1.Queue{queueOf("q", "32"), builders.MakeQueue("small").GPUQuota(tc.limit).GPULimit(tc.limit).Namespaces("default").Obj()}
			c := newCluster(t, placement.DefaultPolicy, nodes, queues, pods...)
			c.cycle()
			if got := c.boundTo("flexible"); got != tc.want {
				t.Errorf("flexible pod bound to %q, want %s (t4-0: %q)", got, tc.want, msg(c.b, "t4-0"))
			}
		})
	}
}

// TestFinishedPodsOfOtherSchedulersAreNotKept: readBound keeps a part in
// its ledger for each pod it counts, but none, and no parse entry, for the
// pods it skips - other schedulers' finished pods, which pile up (a
// cluster's completed Jobs).
func TestFinishedPodsOfOtherSchedulersAreNotKept(t *testing.T) {
	done := builders.MakePod("done", "default").SchedulerName("default-scheduler").GPUs(1).CPU("1").UID("done").Node("n").Obj()
	done.Status.Phase = corev1.PodSucceeded
	running := builders.MakePod("running", "default").SchedulerName("default-scheduler").GPUs(1).CPU("1").UID("running").Node("n").Obj()
	running.Status.Phase = corev1.PodRunning
	for _, p := range []*corev1.Pod{done, running} {
		p.ResourceVersion = "1" // kept by object, as informers' pods are
	}
	c := newCluster(t, "", []*corev1.Node{h100Node("n", "p", 2)}, []*v1alpha1.Queue{queueOf("q", "2")}, done, running)
	c.cycle()
	c.cycle()
	if _, kept := c.s.parses.entries[done]; kept {
		t.Error("a finished pod of another scheduler has a parse entry")
	}
	if part := c.s.bound.parts[done.UID]; part != nil {
		t.Errorf("a finished pod of another scheduler has a part in the ledger: %+v", part)
	}
	if part := c.s.bound.parts[running.UID]; part == nil || !part.demands || part.charged {
		t.Errorf("the running pod of another scheduler: part %+v, want one that weighs its demand and charges no queue", part)
	}
}
