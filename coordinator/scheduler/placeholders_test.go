package scheduler

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/coordinator/placeholder"
)

// clusterPlaceholders creates placeholder pods straight into the cluster's
// pods and deletes them from there, recording why.
type clusterPlaceholders struct {
	c       *cluster
	created []string
	deleted map[string]string // name -> why
}

func (f *clusterPlaceholders) Create(_ context.Context, p *corev1.Pod) error {
	p = p.DeepCopy()
	p.UID = types.UID(p.Name + "-" + time.Now().Format(time.RFC3339Nano))
	f.created = append(f.created, p.Name)
	return f.c.pods.Add(p)
}

func (f *clusterPlaceholders) Delete(_ context.Context, p *corev1.Pod, why string) error {
	f.deleted[p.Name] = why
	return f.c.pods.Delete(p)
}

func (f *clusterPlaceholders) only(t *testing.T) *corev1.Pod {
	t.Helper()
	var out []*corev1.Pod
	for _, o := range f.c.pods.List() {
		if p := o.(*corev1.Pod); placeholder.IsPlaceholder(p) {
			out = append(out, p)
		}
	}
	if len(out) != 1 {
		t.Fatalf("%d placeholders, want 1", len(out))
	}
	return out[0]
}

// Work that finds room on a node its placeholder did not bring has that
// placeholder deleted before it is bound: left pending, kube-scheduler
// could bind it to the same GPU in the same moment, and the kubelet would
// admit one of the two only.
func TestPlaceholderIsWithdrawnBeforeItsWorkIsBound(t *testing.T) {
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 1)}, []*v1alpha1.Queue{queueOf("q", "8")},
		admitted(gpuPod("busy", "q", 1), "n1"), gpuPod("w", "q", 1))
	ph := &clusterPlaceholders{c: c, deleted: map[string]string{}}
	c.s.deps.Placeholders = ph
	c.cycle() // n1 is full: w asks for capacity
	asked := ph.only(t).Name

	// busy ends: w fits on n1, its placeholder still pending.
	obj, _, _ := c.pods.GetByKey("default/busy")
	done := obj.(*corev1.Pod).DeepCopy()
	done.Status.Phase = corev1.PodSucceeded
	_ = c.pods.Update(done)
	c.b.BindErr = func(p *corev1.Pod, _ string) error {
		if _, gone := ph.deleted[asked]; p.Name == "w" && !gone {
			t.Errorf("w bound while its placeholder %s was still pending", asked)
		}
		return nil
	}
	c.cycle()
	if why := ph.deleted[asked]; why != "its work found room on a node" {
		t.Errorf("placeholder %s deleted with %q, want it withdrawn before w was bound", asked, why)
	}
	// Not in the cycle that withdrew it: kube-scheduler may have bound the
	// placeholder unseen, and the kubelet may be admitting it on w's GPU.
	if n := c.boundTo("w"); n != "" {
		t.Fatalf("w bound to %q in the cycle that withdrew its placeholder", n)
	}
	c.cycle()
	if n := c.boundTo("w"); n != "n1" {
		t.Fatalf("w bound to %q, want n1 once its placeholder is gone", n)
	}
}

// A group whose placeholder landed on a node another group's pods then
// took asks again once that node settled, not after the whole cooldown;
// while the node settles, it waits.
func TestPlaceholderAsksAgainWhenTheCapacityItFoundWasTaken(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC))
	old := h100Node("n1", "a", 1)
	old.CreationTimestamp = metav1.NewTime(clk.Now().Add(-time.Hour))
	c := newCluster(t, "", []*corev1.Node{old}, []*v1alpha1.Queue{queueOf("q", "8")},
		admitted(gpuPod("busy", "q", 1), "n1"), gpuPod("w", "q", 1))
	c.s.opts.NewNodeSettle = 3 * time.Second
	c.s.clock = clk
	ph := &clusterPlaceholders{c: c, deleted: map[string]string{}}
	c.s.deps.Placeholders = ph
	c.cycle()
	if len(ph.created) != 1 {
		t.Fatalf("placeholders created %v, want one for w", ph.created)
	}

	// Karpenter brings n2; w's placeholder lands there, and another pod
	// (whose own placeholder landed there first) takes its GPU.
	n2 := h100Node("n2", "a", 1)
	n2.CreationTimestamp = metav1.NewTime(clk.Now())
	_ = c.nodes.Add(n2)
	landed := ph.only(t).DeepCopy()
	landed.Spec.NodeName = "n2"
	_ = c.pods.Update(landed)
	clk.Step(500 * time.Millisecond)
	c.cycle() // released: capacity arrived on n2
	if _, ok := ph.deleted[landed.Name]; !ok {
		t.Fatalf("the landed placeholder was not released")
	}
	_ = c.pods.Add(admitted(gpuPod("thief", "q", 1), "n2"))

	clk.Step(time.Second) // n2 still settles: w's pods may yet get it
	c.cycle()
	if len(ph.created) != 1 {
		t.Errorf("a placeholder was asked again while its node settled: %v", ph.created)
	}
	clk.Step(3 * time.Second) // n2 settled, taken: 4.5 s after the release, within the cooldown
	c.cycle()
	if c.boundTo("w") != "" {
		t.Fatalf("w bound to %s; n2 was full", c.boundTo("w"))
	}
	if len(ph.created) != 2 {
		t.Errorf("placeholders created %v, want w's asked again once n2 settled full", ph.created)
	}
}
