package scheduler

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/tests/builders"
)

// TestReclaimDoesNotWaitForAPodThatTakesForeverToEnd: a starved queue
// waits for terminating pods that would make room instead of reclaiming
// more. A pod's termination grace period is its author's to choose (an
// hour, a year), and a pod can hang in Terminating when its node's runtime
// is stuck: waiting for such a pod stalls reclaim for every queue it would
// make room for. Beyond a bounded wait, reclaim goes on with other victims
// (the terminating pod still counts as holding its GPUs, so nothing is
// double-booked).
func TestReclaimDoesNotWaitForAPodThatTakesForeverToEnd(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	for _, tc := range []struct {
		name    string
		ends    time.Time // the pod's deletionTimestamp: when its grace period ends
		waiting bool
	}{
		{name: "ends within seconds", ends: now.Add(20 * time.Second), waiting: true},
		{name: "grace period of an hour", ends: now.Add(time.Hour)},
		{name: "overdue for ten minutes", ends: now.Add(-10 * time.Minute)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var pods []*corev1.Pod
			for i := range 4 {
				p := admitted(gpuPod(fmt.Sprintf("b-%d", i), "team-b", 1), "n1")
				if i == 0 {
					p.DeletionTimestamp = &metav1.Time{Time: tc.ends}
				}
				pods = append(pods, p)
			}
			pods = append(pods, gpuPod("a-0", "team-a", 1))
			c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 4)}, []*v1alpha1.Queue{queueOf("team-a", "2"), queueOf("team-b", "2")}, pods...)
			c.s.clock = clocktesting.NewFakeClock(now)
			c.cycle()
			evicted := c.b.EvictedPods()
			if tc.waiting && len(evicted) != 0 {
				t.Errorf("evicted %v while b-0 ends in moments, want a wait", evicted)
			}
			if !tc.waiting && len(evicted) != 1 {
				t.Errorf("evicted %v (a-0: %q), want one victim other than b-0: b-0 may hold its GPU for long", evicted, msg(c.b, "a-0"))
			}
			for _, e := range evicted {
				if e == "b-0" {
					t.Errorf("evicted b-0, which is already terminating")
				}
			}
		})
	}
}

// BenchmarkCycleWithStarvedBacklog: a queue below its deserved quota with
// many pending pods that do not fit, while some pod anywhere terminates.
// Every such pod used to build a snapshot of the whole cluster (twice) to
// decide whether to wait or reclaim: the cycle grew with pending x pods.
func BenchmarkCycleWithStarvedBacklog(b *testing.B) {
	for _, pending := range []int{10, 100, 400} {
		b.Run(fmt.Sprintf("pending=%d", pending), func(b *testing.B) {
			var nodes []*corev1.Node
			var pods []*corev1.Pod
			for n := range 250 {
				node := fmt.Sprintf("n%d", n)
				nodes = append(nodes, h100Node(node, "a", 8))
				for g := range 8 {
					p := admitted(gpuPod(fmt.Sprintf("b-%d-%d", n, g), "team-b", 1), node)
					p.Annotations["gpufrac.io/preemptible"] = "false"
					if n == 0 && g == 0 {
						p.DeletionTimestamp = &metav1.Time{Time: time.Now().Add(5 * time.Second)}
					}
					pods = append(pods, p)
				}
			}
			for i := range pending {
				pods = append(pods, gpuPod(fmt.Sprintf("a-%d", i), "team-a", 2))
			}
			qs := []*v1alpha1.Queue{queueOf("team-a", "1000"), queueOf("team-b", "1000")}
			c := newCluster(b, "", nodes, qs, pods...)
			b.ResetTimer()
			for range b.N {
				if _, err := c.s.Cycle(b.Context()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestReclaimNeverTakesAGangOfAnotherQueueByItsName: two queues take pods
// from one namespace. A team-b pod labelled with the pod group of team-a's
// running gang is team-b's own workload, not part of that gang: reclaiming
// from team-b (far over its quota) must evict team-b's pods, never team-a's
// gang, which is within its quota. Grouped by namespace and pod group
// alone, the three pods were one candidate charged to whichever queue's
// pod the lister returned first - the newest candidate, so team-a's gang
// was evicted for team-b's loan whenever that was team-b.
func TestReclaimNeverTakesAGangOfAnotherQueueByItsName(t *testing.T) {
	old := time.Unix(1_690_000_000, 0)
	mk := func(name, queue string, created time.Duration) *builders.PodWrapper {
		return builders.MakePod(name, "default").Queue(queue).GPUs(1).CPU("1").UID(name).Created(metav1.NewTime(old.Add(created)))
	}
	pods := []*corev1.Pod{
		admitted(mk("a-train-0", "team-a", 3*time.Minute).PodGroup("train").MinMember(2).Obj(), "n1"),
		admitted(mk("a-train-1", "team-a", 3*time.Minute).PodGroup("train").MinMember(2).Obj(), "n1"),
		admitted(mk("b-train", "team-b", 2*time.Minute).PodGroup("train").MinMember(1).Obj(), "n1"),
		gpuPod("c-0", "team-c", 1),
	}
	for i := range 5 {
		pods = append(pods, admitted(mk(fmt.Sprintf("b-%d", i), "team-b", 0).Obj(), "n1"))
	}
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 8)},
		[]*v1alpha1.Queue{queueOf("team-a", "2"), queueOf("team-b", "0"), queueOf("team-c", "2")}, pods...)
	c.s.clock = clocktesting.NewFakeClock(old.Add(time.Hour))
	c.cycle()
	got := c.b.EvictedPods()
	if len(got) != 1 || got[0] != "b-train" {
		t.Errorf("evicted %v, want [b-train]: team-b's newest pod, and nothing of team-a (c-0: %q)", got, msg(c.b, "c-0"))
	}
}
