package queue_test

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpufrac/gpufrac/coordinator/queue"
	"github.com/gpufrac/gpufrac/tests/builders"
)

// spec converts a built v1alpha1.Queue with SpecFromAPI, so every test also
// exercises the conversion. Test quantities are never invalid, so a
// conversion error is a bug in the test itself.
func spec(w *builders.QueueWrapper) queue.Spec {
	s, err := queue.SpecFromAPI(w.Obj())
	if err != nil {
		panic(err)
	}
	return s
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
		spec(builders.MakeQueue("org").GPUQuota("8").GPULimit("10")),
		spec(builders.MakeQueue("team-a").Parent("org").GPUQuota("4").GPULimit("6")),
		spec(builders.MakeQueue("team-b").Parent("org").GPUQuota("4")),
		spec(builders.MakeQueue("other").GPUQuota("2")),
	}
}
