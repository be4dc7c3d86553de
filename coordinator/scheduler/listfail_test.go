package scheduler

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"

	"github.com/gpufrac/gpufrac/api/v1alpha1"
)

// failingPods is a pod lister whose List fails while fail is set.
type failingPods struct {
	corelisters.PodLister
	fail bool
}

func (f *failingPods) List(sel labels.Selector) ([]*corev1.Pod, error) {
	if f.fail {
		return nil, errors.New("the cache is gone")
	}
	return f.PodLister.List(sel)
}

// TestCycleWhenListingPodsFails: the cycle lists every pod only where the
// ledger and the cache do not say enough. A failed list there fails the
// ledger's first read (the cycle returns the error, the events it did not
// take stay for the next) or leaves reclaim's workload pending with the
// reason, nothing evicted; once the list works again both go on.
func TestCycleWhenListingPodsFails(t *testing.T) {
	queues := []*v1alpha1.Queue{queueOf("team-a", "2"), queueOf("team-b", "2")}
	var pods []*corev1.Pod
	for i := range 4 {
		pods = append(pods, admitted(gpuPod(fmt.Sprintf("b-%d", i), "team-b", 1), "n1"))
	}
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 4)}, queues, pods...)
	lister := &failingPods{PodLister: c.s.deps.Pods, fail: true}
	c.s.deps.Pods = lister

	if _, err := c.s.Cycle(t.Context()); err == nil || !strings.Contains(err.Error(), "listing pods") {
		t.Fatalf("the first cycle with a failing list: error %v, want one about listing pods", err)
	}
	lister.fail = false
	c.cycle()
	if len(c.s.bound.charges) == 0 {
		t.Fatal("team-b's bound pods were not charged once the list worked again")
	}

	// Reclaim reads every pod: it cannot, so a-0 waits and nothing is evicted.
	lister.fail = true
	_ = c.pods.Add(gpuPod("a-0", "team-a", 1))
	c.cycle()
	if ev := c.b.EvictedPods(); len(ev) != 0 {
		t.Errorf("evicted %v while the pods could not be listed", ev)
	}
	if m := msg(c.b, "a-0"); !strings.Contains(m, "could not read the pods") {
		t.Errorf("a-0 waits with %q, want reclaim's failed read", m)
	}
	lister.fail = false
	c.cycle()
	if ev := c.b.EvictedPods(); len(ev) != 1 {
		t.Errorf("evicted %v once the list worked again, want one of team-b's pods", ev)
	}
}
