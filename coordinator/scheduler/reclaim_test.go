package scheduler

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpufrac/gpufrac/api/v1alpha1"
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
