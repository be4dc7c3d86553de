package scheduler

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

// after a successful reclaim the starved queue's pod is placed by
// placement (room found), so reclaim() - the only place s.reclaims is
// pruned - never runs for that queue again: s.reclaims keeps the victims'
// UIDs, quiet() is false for good, and the idle skip never engages again.
func TestIdleNeverEngagesAfterAReclaim(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	var pods []*corev1.Pod
	for i := range 4 {
		pods = append(pods, admitted(gpuPod(fmt.Sprintf("b-%d", i), "team-b", 1), "n1"))
	}
	pods = append(pods, gpuPod("a-0", "team-a", 1))
	c := newClusterWith(t, Options{BindWorkers: 1}, Deps{Clock: clk,
		Queues: staticQueues{queueOf("team-a", "2"), queueOf("team-b", "2")}}, []*corev1.Node{h100Node("n1", "a", 4)}, pods...)
	c.tick()
	evicted := c.b.EvictedPods()
	if len(evicted) != 1 {
		t.Fatalf("evicted %v, want one victim", evicted)
	}
	// The victim ends: the informer shows it gone.
	obj, _, _ := c.pods.GetByKey("default/" + evicted[0])
	if obj == nil {
		for _, k := range c.pods.ListKeys() {
			t.Log(k)
		}
		t.Fatalf("victim %s not found", evicted[0])
	}
	_ = c.pods.Delete(obj)
	c.s.OnPodDelete(obj)
	for range 3 {
		clk.Step(time.Second)
		c.tick()
	}
	if c.boundTo("a-0") != "n1" {
		t.Fatalf("a-0 bound to %q", c.boundTo("a-0"))
	}
	skipped := false
	for range 5 {
		clk.Step(time.Second)
		if !c.tick() {
			skipped = true
		}
	}
	c.s.reclaims.mu.Lock()
	reclaiming := len(c.s.reclaims.evicted)
	c.s.reclaims.mu.Unlock()
	if !skipped {
		t.Errorf("cluster idle (nothing pending, a-0 bound) but no cycle skipped; s.reclaims still waits for %d queue(s)", reclaiming)
	}
}
