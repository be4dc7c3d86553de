package scheduler

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/tests/builders"
)

// TestBasicPodGroupReclaimedAsOneVictim: bound pods placed on their own -
// in a PodGroup with the basic policy, or given a pod-group label after
// their binding (tenant input) - are reclaimed one by one: read back as one
// gang they would be one victim too large to take, and the starved queue
// would wait for good.
func TestBasicPodGroupReclaimedAsOneVictim(t *testing.T) {
	for _, mode := range []string{"none", "basic-podgroup", "label-added-after-binding"} {
		inGroup := mode == "basic-podgroup"
		t.Run(mode, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
			g := "serve"
			var pods []*corev1.Pod
			for i := range 4 {
				p := admitted(gpuPod(fmt.Sprintf("b-%d", i), "team-b", 1), "n1")
				if mode == "label-added-after-binding" {
					p.Annotations[api.AnnotationAdmittedGang] = "" // its binding: a pod on its own
					p.Labels[api.LabelPodGroup] = "serve"
				}
				if inGroup {
					p.Spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: &g}
				}
				pods = append(pods, p)
			}
			pods = append(pods, gpuPod("a-0", "team-a", 1))
			c := newClusterWith(t, Options{BindWorkers: 1}, Deps{Clock: clk,
				Queues: staticQueues{queueOf("team-a", "2"), queueOf("team-b", "2")}}, []*corev1.Node{h100Node("n1", "a", 4)}, pods...)
			c.s.deps.PodGroups = builders.PodGroupLookup(builders.MakePodGroup("serve", "default").Obj()) // basic policy
			c.cycle()
			if ev := c.b.EvictedPods(); len(ev) != 1 {
				t.Errorf("a-0 needs 1 GPU; evicted %v; a-0: %s %q", ev, c.reason("a-0"), c.b.Messages["a-0"])
			}
		})
	}
}
