package scheduler

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/v1alpha1"
)

// TestAFailingBindingIsNotRetriedEveryCycle: a binding the API server keeps
// refusing (an admission policy, a webhook, a pod being deleted) must not
// make the coordinator try it again in every cycle: each failure wakes the
// scheduler at once, so without a back-off the coordinator spins, a full
// cycle and a failing request every few milliseconds, for as long as the
// pod exists. It backs off per workload, as kube-scheduler does (1 s, then
// doubling up to 10 s).
func TestAFailingBindingIsNotRetriedEveryCycle(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 8)}, []*v1alpha1.Queue{queueOf("q", "8")}, gpuPod("p", "q", 1))
	c.s.clock = clk
	refused := apierrors.NewForbidden(schema.GroupResource{Resource: "pods/binding"}, "p", fmt.Errorf("denied by a policy"))
	c.b.BindErr = func(*corev1.Pod, string) error { return refused }
	for range 20 {
		c.cycle()
	}
	if calls := c.b.BindCalls; calls != 1 {
		t.Errorf("20 cycles at one instant tried the refused binding %d times, want 1", calls)
	}
	if r, m := c.b.Reason("p"); r != api.ReasonBindingFailed || !strings.Contains(m, "denied by a policy") {
		t.Errorf("pod p says %s %q, want BindingFailed with the API's answer", r, m)
	}
	clk.Step(time.Second)
	c.cycle()
	if calls := c.b.BindCalls; calls != 2 {
		t.Errorf("after its back-off of 1 s: %d binding calls, want 2", calls)
	}
	// Back-offs double: 2 s more before the third try.
	clk.Step(time.Second)
	c.cycle()
	if calls := c.b.BindCalls; calls != 2 {
		t.Errorf("1 s into the second back-off (2 s): %d binding calls, want still 2", calls)
	}
	clk.Step(time.Second)
	c.b.BindErr = nil
	c.cycle()
	if got := c.boundTo("p"); got != "n1" {
		t.Errorf("once the API accepts it, pod p is bound to %q, want n1", got)
	}
}
