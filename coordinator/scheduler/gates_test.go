package scheduler

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/gpufrac/gpufrac/api/v1alpha1"
)

// TestGatedPodsAreLeftToTheirGates: a pod with spec.schedulingGates may not
// be bound (the API server refuses the binding) until its gates are gone -
// Kueue and other controllers hold pods that way. A tenant controls its pod
// spec, so gates are also a way to make every binding of a pod fail: the
// coordinator must leave such pods alone, not place, reserve for and try
// to bind them cycle after cycle.
func TestGatedPodsAreLeftToTheirGates(t *testing.T) {
	gated := fracPod("gated", "q", 30)
	gated.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "example.com/hold"}}
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 1)}, []*v1alpha1.Queue{queueOf("q", "8")},
		gated, gpuPod("whole", "q", 1))
	// As the API server answers a binding of a gated pod.
	c.b.BindErr = func(p *corev1.Pod, _ string) error {
		if len(p.Spec.SchedulingGates) > 0 {
			return apierrors.NewBadRequest(fmt.Sprintf("pod %s has non-empty .spec.schedulingGates", p.Name))
		}
		return nil
	}
	for range 3 {
		c.cycle()
	}
	if calls := c.b.BindCalls; calls != 1 {
		t.Errorf("%d binding calls, want 1 (the ungated pod; none for the gated one)", calls)
	}
	if got := c.boundTo("whole"); got != "n1" {
		t.Errorf("the ungated whole-GPU pod is bound to %q (reason %q), want n1: the gated fraction must not hold the node's only GPU", got, c.reason("whole"))
	}
	if r := c.reason("gated"); r != "" {
		t.Errorf("the gated pod got reason %q; its PodScheduled condition is the API server's (SchedulingGated)", r)
	}
}
