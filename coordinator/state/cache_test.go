package state

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpufrac/gpufrac/api"
)

// built is what a test compares of a snapshot: every node as placement
// sees it, and what the coordinator reads besides.
type built struct {
	Nodes                                                   []string
	NoFraction, DRANodes                                    map[string]bool
	Reservations                                            map[string]string
	ScalarMilli                                             map[string]int64
	GPUCapacityMilli, CPUCapacityMilli, MemoryCapacityBytes int64
}

func describe(t *testing.T, in Inputs) built {
	t.Helper()
	s, err := Build(in)
	if err != nil {
		t.Fatal(err)
	}
	out := built{NoFraction: s.NoFraction, DRANodes: s.DRANodes, Reservations: map[string]string{}, ScalarMilli: s.ScalarMilli,
		GPUCapacityMilli: s.GPUCapacityMilli, CPUCapacityMilli: s.CPUCapacityMilli, MemoryCapacityBytes: s.MemoryCapacityBytes}
	for i := 0; i < s.Len(); i++ {
		out.Nodes = append(out.Nodes, fmt.Sprintf("%+v", s.Node(i)))
	}
	for k, r := range s.Reservations {
		out.Reservations[k.Node+"/"+k.GPU] = fmt.Sprintf("%s ready=%v fractions=%d orphaned=%q", r.Pod.Name, r.Ready, r.Fractions, r.Orphaned)
	}
	return out
}

// TestCacheBuildsWhatAFreshReadBuilds: Builds with a Cache, the first and
// the next ones, and after objects are replaced (as an informer does: a new
// object, never a change to the old one), give what a Build that reads
// every object gives.
func TestCacheBuildsWhatAFreshReadBuilds(t *testing.T) {
	versioned := func(objs ...metav1.Object) {
		for _, o := range objs {
			o.SetResourceVersion("1")
		}
	}
	frac := node("frac", 4).inventory("fraction").n
	excl := node("excl", 2).inventory("exclusive").n
	ts := node("ts", 2).partitionedInv("timeslice", 2, 4, "").n
	dra := draNode("dra", 2)
	down := node("down", 2).inventory("fraction").notReady().n
	plain := node("plain", 2).n // no inventory
	nodes := []*corev1.Node{frac, excl, ts, dra, down, plain}
	planned := pod("planned").on("frac").fraction(30, "frac-gpu1").cpu("2").p
	admitted := pod("admitted").on("frac").fraction(30, "frac-gpu1").p
	admitted.Annotations[api.AnnotationAllocatedGPU] = "frac-gpu2"
	assumed := pod("assumed").fraction(50, "").p
	whole := pod("whole").on("excl").gpus(1).p
	whole.Annotations[api.AnnotationAllocatedGPU] = "excl-gpu1"
	wholeUnknown := pod("whole-unknown").on("frac").gpus(1).p
	res := reservation("res", 1, "frac-gpu1", "frac-gpu1")
	res.Spec.NodeName = "frac"
	asking := reservation("asking", 2, "frac-gpu3", "")
	asking.Spec.NodeName = "frac"
	offRes := reservation("off-res", 3, "down-gpu0", "down-gpu0")
	offRes.Spec.NodeName = "down"
	offFrac := pod("off-frac").on("down").fraction(20, "down-gpu0").p
	replica := pod("replica").on("ts").scalar(shared, 3).p
	onDRA := pod("on-dra").on("dra").cpu("1").p
	failedRes := reservation("failed-res", 4, "frac-gpu0", "")
	failedRes.Spec.NodeName = "frac"
	failedRes.Status.Phase = corev1.PodFailed
	pending := pod("pending").fraction(10, "").p
	pods := []*corev1.Pod{planned, admitted, assumed, whole, wholeUnknown, res, asking, offRes, offFrac, replica, onDRA, failedRes, pending}
	for _, n := range nodes {
		versioned(n)
	}
	for _, p := range pods {
		versioned(p)
	}
	cache := NewCache()
	check := func(step string) {
		t.Helper()
		fresh := Inputs{Nodes: nodes, Pods: pods, PoolLabel: api.LabelNodePool, Assumed: assumedOn(assumed, "frac", "frac-gpu0")}
		cached := fresh
		cached.Cache = cache
		want := describe(t, fresh)
		if d := cmp.Diff(want, describe(t, cached)); d != "" {
			t.Errorf("%s: a Build with the cache differs from a fresh read (-fresh +cached):\n%s", step, d)
		}
	}
	check("first Build")
	check("second Build")
	if len(cache.pods) == 0 || len(cache.nodes) == 0 {
		t.Fatalf("the cache kept nothing: %d pods, %d nodes", len(cache.pods), len(cache.nodes))
	}

	// The informer replaces objects: the planned fraction is admitted on
	// another GPU, the asking reservation is told its GPU, a node grows.
	p2 := planned.DeepCopy()
	p2.Annotations[api.AnnotationAllocatedGPU] = "frac-gpu3"
	p2.ResourceVersion = "2"
	a2 := asking.DeepCopy()
	a2.Annotations[api.AnnotationReservedGPU] = "frac-gpu3"
	a2.ResourceVersion = "2"
	e2 := excl.DeepCopy()
	e2.Status.Allocatable[corev1.ResourceCPU] = resource.MustParse("96")
	e2.ResourceVersion = "2"
	pods[0], pods[6], nodes[1] = p2, a2, e2
	check("objects replaced")
	// A pod gone is forgotten at the end of the next Build.
	pods = pods[1:]
	check("a pod gone")
	if _, ok := cache.pods[p2]; ok {
		t.Error("the cache still holds a pod no Build read")
	}
}

// assumedOn is the Assumed of one pod placed on node (and GPU).
func assumedOn(p *corev1.Pod, node, gpu string) map[types.UID]Assumed {
	return map[types.UID]Assumed{p.UID: {Node: node, GPU: gpu}}
}
