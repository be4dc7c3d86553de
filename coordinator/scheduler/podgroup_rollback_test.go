package scheduler

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpufrac/gpufrac/tests/builders"
)

// TestPodGroupGangBoundInPartIsRolledBack: a PodGroup
// gang bound in part is rolled back after GangBindTimeout, also when its
// PodGroup is deleted meanwhile: its bound members keep the min-member they
// were read with.
func TestPodGroupGangBoundInPartIsRolledBack(t *testing.T) {
	for _, deleted := range []bool{false, true} {
		t.Run(map[bool]string{false: "podgroup present", true: "podgroup deleted"}[deleted], func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
			g := "train"
			bound := admitted(gpuPod("train-0", "q", 1), "n1")
			bound.Spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: &g}
			bound.ResourceVersion = "1" // an informer's object: its parse is kept
			pend := gpuPod("train-1", "q", 1)
			pend.Spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: &g}
			c := newClusterWith(t, Options{BindWorkers: 1}, Deps{Clock: clk, Queues: staticQueues{queueOf("q", "8")}},
				[]*corev1.Node{h100Node("n1", "a", 1)}, bound, pend) // no room for the second member
			c.s.deps.PodGroups = builders.PodGroupLookup(builders.MakePodGroup("train", "default").Gang(2).Obj())
			for i := range 4 {
				c.cycle()
				clk.Step(20 * time.Second)
				if deleted && i == 0 {
					c.s.deps.PodGroups = builders.PodGroupLookup() // gone after the coordinator saw it
				}
			}
			if rel := c.b.ReleasedPods(); len(rel) == 0 {
				t.Errorf("gang bound 1 of 2 for 80 s: nothing rolled back (train-1: %s %q)", c.reason("train-1"), c.b.Messages["train-1"])
			}
		})
	}
}
