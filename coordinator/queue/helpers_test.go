package queue_test

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/coordinator/queue"
)

// specBuilder builds a queue.Spec through a v1alpha1.Queue and SpecFromAPI,
// so every test also exercises the conversion.
type specBuilder struct{ q v1alpha1.Queue }

func queueSpec(name string) *specBuilder {
	return &specBuilder{q: v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: name}}}
}

func (b *specBuilder) Parent(p string) *specBuilder  { b.q.Spec.Parent = p; return b }
func (b *specBuilder) Priority(p int32) *specBuilder { b.q.Spec.Priority = p; return b }
func (b *specBuilder) GPUQuota(v string) *specBuilder {
	block(&b.q.Spec.Resources.GPU).Quota = qty(v)
	return b
}
func (b *specBuilder) GPULimit(v string) *specBuilder {
	block(&b.q.Spec.Resources.GPU).Limit = qty(v)
	return b
}
func (b *specBuilder) GPUWeight(w int32) *specBuilder {
	block(&b.q.Spec.Resources.GPU).OverQuotaWeight = &w
	return b
}
func (b *specBuilder) CPUQuota(v string) *specBuilder {
	block(&b.q.Spec.Resources.CPU).Quota = qty(v)
	return b
}
func (b *specBuilder) CPULimit(v string) *specBuilder {
	block(&b.q.Spec.Resources.CPU).Limit = qty(v)
	return b
}
func (b *specBuilder) MemoryQuota(v string) *specBuilder {
	block(&b.q.Spec.Resources.Memory).Quota = qty(v)
	return b
}

// Obj converts the queue; test quantities are never invalid, so a
// conversion error is a bug in the test itself.
func (b *specBuilder) Obj() queue.Spec {
	s, err := queue.SpecFromAPI(&b.q)
	if err != nil {
		panic(err)
	}
	return s
}

func block(p **v1alpha1.ResourceQuota) *v1alpha1.ResourceQuota {
	if *p == nil {
		*p = &v1alpha1.ResourceQuota{}
	}
	return *p
}

func qty(s string) *resource.Quantity {
	q := resource.MustParse(s)
	return &q
}

// gpus is an amount of GPUs only ("1.5").
func gpus(v string) queue.Resources {
	return queue.Resources{GPUMilli: qty(v).MilliValue()}
}

// res is GPUs, CPUs and memory ("" for none).
func res(gpu, cpu, mem string) queue.Resources {
	var r queue.Resources
	if gpu != "" {
		r.GPUMilli = qty(gpu).MilliValue()
	}
	if cpu != "" {
		r.CPUMilli = qty(cpu).MilliValue()
	}
	if mem != "" {
		r.MemoryBytes = qty(mem).Value()
	}
	return r
}

// usage is one Assume call.
type usage struct {
	queue          string
	res            queue.Resources
	nonPreemptible bool
}

// newTree builds a tree that must be valid and assumes the usage.
func newTree(t *testing.T, specs []queue.Spec, used ...usage) *queue.Tree {
	t.Helper()
	tree, err := queue.NewTree(specs)
	if err != nil {
		t.Fatalf("NewTree: %v", err)
	}
	for _, u := range used {
		if err := tree.Assume(u.queue, u.res, u.nonPreemptible); err != nil {
			t.Fatalf("Assume: %v", err)
		}
	}
	return tree
}

// orgTree is org (8 GPUs, limit 10) with team-a and team-b deserving 4 each
// (team-a limited to 6), and a top-level queue "other" deserving 2.
func orgTree() []queue.Spec {
	return []queue.Spec{
		queueSpec("org").GPUQuota("8").GPULimit("10").Obj(),
		queueSpec("team-a").Parent("org").GPUQuota("4").GPULimit("6").Obj(),
		queueSpec("team-b").Parent("org").GPUQuota("4").Obj(),
		queueSpec("other").GPUQuota("2").Obj(),
	}
}
