package state

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/request"
	"github.com/gpufrac/gpufrac/coordinator/dra"
	"github.com/gpufrac/gpufrac/coordinator/placement"
	"github.com/gpufrac/gpufrac/coordinator/predicates"
	"github.com/gpufrac/gpufrac/tests/builders"
)

type nodeB struct{ n *corev1.Node }

func node(name string, gpus int) *nodeB {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{api.LabelNodePool: "pool-a"}, Annotations: map[string]string{}},
		Status: corev1.NodeStatus{
			Allocatable: corev1.ResourceList{
				corev1.ResourceCPU: resource.MustParse("64"), corev1.ResourceMemory: resource.MustParse("512Gi"),
				api.ResourceGPU: *resource.NewQuantity(int64(gpus), resource.DecimalSI),
			},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
		},
	}
	return &nodeB{n}
}

// inventory publishes gpus GPUs in mode, as gpufrac-node does.
func (b *nodeB) inventory(mode string) *nodeB {
	n := b.n.Status.Allocatable.Name(api.ResourceGPU, "").Value()
	inv := make([]api.GPUInfo, n)
	for i := range inv {
		inv[i] = api.GPUInfo{UUID: fmt.Sprintf("%s-gpu%d", b.n.Name, i), Index: i, Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81920, Mode: mode, Healthy: true}
	}
	s, _ := api.EncodeInventory(inv)
	b.n.Annotations[api.AnnotationGPUInventory] = s
	if mode == "fraction" {
		b.n.Status.Allocatable[api.ResourceFraction] = *resource.NewQuantity(n*100, resource.DecimalSI)
	}
	return b
}

func (b *nodeB) notReady() *nodeB { b.n.Status.Conditions[0].Status = corev1.ConditionFalse; return b }

type podB struct{ p *corev1.Pod }

func pod(name string) *podB {
	return &podB{&corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(name), Annotations: map[string]string{}, Labels: map[string]string{}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{}, Limits: corev1.ResourceList{}}}}},
	}}
}

func (b *podB) on(node string) *podB { b.p.Spec.NodeName = node; return b }
func (b *podB) cpu(s string) *podB {
	b.p.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU] = resource.MustParse(s)
	return b
}
func (b *podB) gpus(n int) *podB {
	b.p.Spec.Containers[0].Resources.Limits[api.ResourceGPU] = *resource.NewQuantity(int64(n), resource.DecimalSI)
	return b
}
func (b *podB) fraction(pct int, gpu string) *podB {
	b.p.Spec.Containers[0].Resources.Limits[api.ResourceFraction] = *resource.NewQuantity(int64(pct), resource.DecimalSI)
	if gpu != "" {
		b.p.Annotations[api.AnnotationGPU] = gpu
	}
	return b
}
func (b *podB) phase(ph corev1.PodPhase) *podB { b.p.Status.Phase = ph; return b }

// free lists each node's GPU free milli, in snapshot order.
func free(t *testing.T, in Inputs) map[string][]int {
	t.Helper()
	s, err := Build(in)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]int{}
	for i := 0; i < s.Len(); i++ {
		n := s.Node(i)
		for _, g := range n.GPUs {
			out[n.Name] = append(out[n.Name], g.FreeMilli)
		}
	}
	return out
}

func TestBuildChargesGPUs(t *testing.T) {
	a := node("a", 4).inventory("fraction").n
	for _, tc := range []struct {
		name    string
		nodes   []*corev1.Node
		pods    []*corev1.Pod
		assumed map[types.UID]Assumed
		want    map[string][]int
	}{
		{name: "empty node", nodes: []*corev1.Node{a}, want: map[string][]int{"a": {1000, 1000, 1000, 1000}}},
		{name: "fractions charge their GPU", nodes: []*corev1.Node{a},
			pods: []*corev1.Pod{pod("f1").on("a").fraction(30, "a-gpu2").p, pod("f2").on("a").fraction(60, "a-gpu2").p},
			want: map[string][]int{"a": {1000, 1000, 100, 1000}}},
		{name: "allocated-gpu wins over the coordinator's choice", nodes: []*corev1.Node{a},
			pods: func() []*corev1.Pod {
				p := pod("f").on("a").fraction(50, "a-gpu0").p
				p.Annotations[api.AnnotationAllocatedGPU] = "a-gpu3"
				return []*corev1.Pod{p}
			}(),
			want: map[string][]int{"a": {1000, 1000, 1000, 500}}},
		{name: "whole GPUs of other schedulers take clean GPUs first", nodes: []*corev1.Node{a},
			pods: []*corev1.Pod{pod("f").on("a").fraction(10, "a-gpu0").p, pod("w").on("a").gpus(2).p},
			want: map[string][]int{"a": {900, 0, 0, 1000}}},
		{name: "terminal pods free their GPUs", nodes: []*corev1.Node{a},
			pods: []*corev1.Pod{pod("done").on("a").gpus(4).phase(corev1.PodSucceeded).p},
			want: map[string][]int{"a": {1000, 1000, 1000, 1000}}},
		{name: "assumed pods count before the binding shows", nodes: []*corev1.Node{a},
			pods:    []*corev1.Pod{pod("x").fraction(40, "").p},
			assumed: map[types.UID]Assumed{"x": {Node: "a", GPU: "a-gpu1"}},
			want:    map[string][]int{"a": {1000, 600, 1000, 1000}}},
		{name: "not-ready nodes are left out", nodes: []*corev1.Node{a, node("b", 8).notReady().n}, want: map[string][]int{"a": {1000, 1000, 1000, 1000}}},
		{name: "no inventory: anonymous GPUs from allocatable", nodes: []*corev1.Node{node("c", 2).n},
			pods: []*corev1.Pod{pod("w").on("c").gpus(1).p}, want: map[string][]int{"c": {0, 1000}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := free(t, Inputs{Nodes: tc.nodes, Pods: tc.pods, Assumed: tc.assumed, PoolLabel: api.LabelNodePool})
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("GPU free milli (-want +got):\n%s", diff)
			}
		})
	}
}

func TestBuildNodeFacts(t *testing.T) {
	s, err := Build(Inputs{
		Nodes:     []*corev1.Node{node("a", 4).inventory("fraction").n, node("b", 2).inventory("exclusive").n, node("c", 1).n},
		Pods:      []*corev1.Pod{pod("cpu").on("a").cpu("3").p},
		PoolLabel: api.LabelNodePool,
	})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]bool{"b": true, "c": true}, s.NoFraction); diff != "" {
		t.Errorf("NoFraction (-want +got):\n%s", diff)
	}
	if s.GPUCapacityMilli != 7000 {
		t.Errorf("GPU capacity = %d, want 7000", s.GPUCapacityMilli)
	}
	i, _ := s.Index("a")
	n := s.Node(i)
	if n.UsedCPUMilli != 3000 || n.Pool != "pool-a" || n.Model != "NVIDIA H100 80GB HBM3" {
		t.Errorf("node a = used CPU %d, pool %q, model %q", n.UsedCPUMilli, n.Pool, n.Model)
	}
}

// partitionedInv publishes GPUs in mode mig (7 1g.10gb devices each, mixed
// strategy) or timeslice (replicas each) and sets the allocatable the node
// agent serves for them.
func (b *nodeB) partitionedInv(mode string, gpus, replicas int, resourceName string) *nodeB {
	inv := make([]api.GPUInfo, gpus)
	for i := range inv {
		g := api.GPUInfo{UUID: fmt.Sprintf("%s-gpu%d", b.n.Name, i), Index: i, Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81920, Mode: mode, Healthy: true}
		switch mode {
		case "mig":
			for k := 0; k < 7; k++ {
				g.MIGDevices = append(g.MIGDevices, api.MIGDeviceInfo{UUID: fmt.Sprintf("MIG-%s-%d-%d", b.n.Name, i, k), Profile: "1g.10gb", Resource: mig1g, MemoryMiB: 10240})
			}
		case "timeslice":
			g.Replicas, g.ReplicaResource = replicas, resourceName
		}
		inv[i] = g
	}
	s, _ := api.EncodeInventory(inv)
	b.n.Annotations[api.AnnotationGPUInventory] = s
	delete(b.n.Status.Allocatable, api.ResourceGPU)
	switch mode {
	case "mig":
		b.n.Status.Allocatable[mig1g] = *resource.NewQuantity(int64(7*gpus), resource.DecimalSI)
	case "timeslice":
		if resourceName == "" {
			resourceName = shared
		}
		b.n.Status.Allocatable[corev1.ResourceName(resourceName)] = *resource.NewQuantity(int64(replicas*gpus), resource.DecimalSI)
	}
	return b
}

const (
	mig1g  = "nvidia.com/mig-1g.10gb"
	shared = "nvidia.com/gpu.shared"
)

func (b *podB) scalar(name string, n int64) *podB {
	b.p.Spec.Containers[0].Resources.Limits[corev1.ResourceName(name)] = *resource.NewQuantity(n, resource.DecimalSI)
	return b
}

func (b *podB) initScalar(name string, n int64) *podB {
	b.p.Spec.InitContainers = append(b.p.Spec.InitContainers, corev1.Container{Name: "init", Resources: corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceName(name): *resource.NewQuantity(n, resource.DecimalSI)},
	}})
	return b
}

func TestBuildScalars(t *testing.T) {
	type want struct {
		scalars     map[string]map[string]int64 // node -> free units
		gpus        map[string]int              // node -> GPUs placed as GPUs
		scalarMilli map[string]int64
		capacity    int64
	}
	for _, tc := range []struct {
		name      string
		nodes     []*corev1.Node
		pods      []*corev1.Pod
		assumed   map[types.UID]Assumed
		timeslice string
		want      want
	}{
		{
			name:  "MIG devices: allocatable minus bound, assumed and init-container requests",
			nodes: []*corev1.Node{node("m", 0).partitionedInv("mig", 2, 0, "").n},
			pods: []*corev1.Pod{
				pod("two").on("m").scalar(mig1g, 2).p,
				pod("assumed").scalar(mig1g, 1).p,
				pod("init").on("m").scalar(mig1g, 1).initScalar(mig1g, 3).p, // max(1, 3)
				pod("done").on("m").scalar(mig1g, 5).phase(corev1.PodFailed).p,
			},
			assumed: map[types.UID]Assumed{"assumed": {Node: "m"}},
			want: want{
				scalars:     map[string]map[string]int64{"m": {mig1g: 14 - 2 - 1 - 3}},
				gpus:        map[string]int{"m": 0},
				scalarMilli: map[string]int64{mig1g: 125}, // 10240 of 81920 MiB
				capacity:    2000,
			},
		},
		{
			name:  "replicas are worth 1000/replicas, the largest worth when nodes differ",
			nodes: []*corev1.Node{node("t4", 0).partitionedInv("timeslice", 2, 4, "").n, node("t2", 0).partitionedInv("timeslice", 1, 2, shared).n},
			pods:  []*corev1.Pod{pod("r").on("t4").scalar(shared, 3).p},
			want: want{
				scalars:     map[string]map[string]int64{"t4": {shared: 5}, "t2": {shared: 2}},
				gpus:        map[string]int{"t4": 0, "t2": 0},
				scalarMilli: map[string]int64{shared: 500},
				capacity:    3000,
			},
		},
		{
			name:      "a renamed replica resource",
			nodes:     []*corev1.Node{node("t", 0).partitionedInv("timeslice", 1, 3, "example.com/slice").n},
			pods:      []*corev1.Pod{pod("r").on("t").scalar("example.com/slice", 1).scalar(shared, 1).p},
			timeslice: "example.com/slice",
			want: want{
				scalars:     map[string]map[string]int64{"t": {"example.com/slice": 2}},
				gpus:        map[string]int{"t": 0},
				scalarMilli: map[string]int64{"example.com/slice": 333},
				capacity:    1000,
			},
		},
		{
			name:  "over-committed devices leave none free",
			nodes: []*corev1.Node{node("m", 0).partitionedInv("mig", 1, 0, "").n},
			pods:  []*corev1.Pod{pod("a").on("m").scalar(mig1g, 5).p, pod("b").on("m").scalar(mig1g, 5).p},
			want: want{
				scalars:     map[string]map[string]int64{"m": {mig1g: 0}},
				gpus:        map[string]int{"m": 0},
				scalarMilli: map[string]int64{mig1g: 125},
				capacity:    1000,
			},
		},
		{
			name: "fraction GPUs are GPUs, MIG GPUs of the same node are not",
			nodes: []*corev1.Node{func() *corev1.Node {
				n := node("mixed", 0).partitionedInv("mig", 1, 0, "").n
				inv, _ := api.DecodeInventory(n.Annotations[api.AnnotationGPUInventory])
				inv = append(inv, api.GPUInfo{UUID: "mixed-gpu1", Index: 1, MemoryMiB: 81920, Mode: "fraction", Healthy: true},
					api.GPUInfo{UUID: "mixed-gpu2", Index: 2, MemoryMiB: 81920, Mode: "mig", Healthy: false})
				n.Annotations[api.AnnotationGPUInventory], _ = api.EncodeInventory(inv)
				n.Status.Allocatable[api.ResourceGPU] = resource.MustParse("1")
				n.Status.Allocatable[api.ResourceFraction] = resource.MustParse("100")
				return n
			}()},
			want: want{
				scalars:     map[string]map[string]int64{"mixed": {mig1g: 7}},
				gpus:        map[string]int{"mixed": 1},
				scalarMilli: map[string]int64{mig1g: 125},
				capacity:    2000, // the unhealthy MIG GPU does not count
			},
		},
		{
			name:  "whole-GPU nodes have no scalars",
			nodes: []*corev1.Node{node("a", 2).inventory("exclusive").n},
			want: want{
				scalars:     map[string]map[string]int64{"a": nil},
				gpus:        map[string]int{"a": 2},
				scalarMilli: map[string]int64{},
				capacity:    2000,
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Build(Inputs{Nodes: tc.nodes, Pods: tc.pods, Assumed: tc.assumed, PoolLabel: api.LabelNodePool, TimesliceResource: tc.timeslice})
			if err != nil {
				t.Fatal(err)
			}
			got := want{scalars: map[string]map[string]int64{}, gpus: map[string]int{}, scalarMilli: s.ScalarMilli, capacity: s.GPUCapacityMilli}
			for i := 0; i < s.Len(); i++ {
				n := s.Node(i)
				got.scalars[n.Name] = n.Scalars
				got.gpus[n.Name] = len(n.GPUs)
			}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(want{})); diff != "" {
				t.Errorf("snapshot (-want +got):\n%s", diff)
			}
			for name := range tc.want.scalars {
				if !s.NoFraction[name] && name != "mixed" {
					t.Errorf("fractions may go to %s, which has no fraction GPU", name)
				}
			}
		})
	}
}

func TestPodFactsScalars(t *testing.T) {
	p := pod("p").scalar(mig1g, 2).scalar(shared, 1).initScalar(mig1g, 3).p
	p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "second", Resources: corev1.ResourceRequirements{
		Limits: corev1.ResourceList{mig1g: resource.MustParse("2"), "nvidia.com/mig-3g.40gb": resource.MustParse("1")},
	}})
	for _, tc := range []struct {
		name      string
		timeslice string
		want      map[string]int64
	}{
		{name: "default replica resource", want: map[string]int64{mig1g: 4, "nvidia.com/mig-3g.40gb": 1, shared: 1}},
		{name: "renamed replica resource: the default name is not a scalar", timeslice: "example.com/slice", want: map[string]int64{mig1g: 4, "nvidia.com/mig-3g.40gb": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, podFactsOf(p, tc.timeslice).d.Scalars); diff != "" {
				t.Errorf("scalars (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSameSizeFractionsAreInterchangeable(t *testing.T) {
	// a was planned on gpu0 and b on gpu1; the node agent gave a gpu1 (same
	// size, interchangeable) and b is not admitted yet: b will get gpu0.
	a := pod("a").on("n").fraction(40, "n-gpu0").p
	a.Annotations[api.AnnotationAllocatedGPU] = "n-gpu1"
	b := pod("b").on("n").fraction(40, "n-gpu1").p
	got := free(t, Inputs{Nodes: []*corev1.Node{node("n", 2).inventory("fraction").n}, Pods: []*corev1.Pod{a, b}, PoolLabel: api.LabelNodePool})
	if diff := cmp.Diff(map[string][]int{"n": {600, 600}}, got); diff != "" {
		t.Errorf("GPU free milli (-want +got):\n%s", diff)
	}
}

func TestWholeGPUsWrittenBackAreChargedExactly(t *testing.T) {
	w := pod("w").on("n").gpus(2).p
	w.Annotations[api.AnnotationAllocatedGPU] = "n-gpu1,n-gpu3"
	other := pod("x").on("n").gpus(1).p // not admitted yet: a clean GPU
	got := free(t, Inputs{Nodes: []*corev1.Node{node("n", 4).inventory("fraction").n}, Pods: []*corev1.Pod{w, other}, PoolLabel: api.LabelNodePool})
	if diff := cmp.Diff(map[string][]int{"n": {0, 0, 1000, 0}}, got); diff != "" {
		t.Errorf("GPU free milli (-want +got):\n%s", diff)
	}
}

func TestReservedGPUNeverLooksWhollyFree(t *testing.T) {
	r := pod("gpufrac-reservation-x").on("n").gpus(1).p
	r.Namespace = api.ReservationNamespace
	r.Labels[api.LabelRole] = api.RoleReservation
	r.Annotations[api.AnnotationGPU] = "n-gpu1"
	r.Annotations[api.AnnotationReservedGPU] = "n-gpu1"
	got := free(t, Inputs{Nodes: []*corev1.Node{node("n", 2).inventory("fraction").n}, Pods: []*corev1.Pod{r}, PoolLabel: api.LabelNodePool})
	// The free milli is the truth; that the GPU is reserved is said apart
	// (TestReservedGPUIsExplicit).
	if diff := cmp.Diff(map[string][]int{"n": {1000, 1000}}, got); diff != "" {
		t.Errorf("GPU free milli (-want +got):\n%s", diff)
	}
}

// reservation builds a reservation pod created at second sec asking for
// GPU asked; got, when not empty, is the GPU the node agent wrote back.
func reservation(name string, sec int, asked, got string) *corev1.Pod {
	r := pod(name).on("n").gpus(1).p
	r.Namespace = api.ReservationNamespace
	r.Labels[api.LabelRole] = api.RoleReservation
	r.CreationTimestamp = metav1.NewTime(time.Date(2026, 11, 24, 10, 0, sec, 0, time.UTC))
	r.Annotations[api.AnnotationGPU] = asked
	if got != "" {
		r.Annotations[api.AnnotationReservedGPU] = got
	}
	return r
}

// TestReservationsNeverShareAGPU: the kubelet gives every one-GPU pod its
// own GPU, and gpufrac-node gives a waiting reservation's GPU to whichever
// one-GPU pod is admitted first, so a reservation may get another GPU than
// it asked for. Until the node agent writes that back, its GPU is unknown:
// it must never be counted on a GPU another pod is known to hold, or the GPU
// it really got looks free and the coordinator reserves it once more (the
// demo's "Requested: 1, Available: 0" reservation). Whatever the lister's
// order.
func TestReservationsNeverShareAGPU(t *testing.T) {
	ddp := pod("ddp-0").on("n").gpus(1).p
	ddp.Annotations[api.AnnotationAllocatedGPU] = "n-gpu1" // written back: it got what reservation a asked for
	type held struct {
		Pod   string
		Ready bool
	}
	for _, tc := range []struct {
		name         string
		pods         []*corev1.Pod
		wantFree     []int
		wantReserved []bool
		wantRes      map[string]held // GPU -> reservation counted on it
	}{
		{
			// The demo's snapshot: a asked gpu1, which ddp-0 got, and got
			// gpu2 (written back); b asked gpu2, got gpu3 (not written back yet).
			name: "a reservation told its GPU holds the one another asks for",
			pods: []*corev1.Pod{ddp, reservation("a", 0, "n-gpu1", "n-gpu2"), reservation("b", 0, "n-gpu2", ""), reservation("c", 0, "n-gpu0", "n-gpu0")},
			// gpu3 is held by b, GPU unknown: nothing is free.
			wantFree: []int{1000, 0, 1000, 0}, wantReserved: []bool{true, false, true, false},
			wantRes: map[string]held{"n-gpu0": {"c", true}, "n-gpu2": {"a", true}},
		},
		{
			name:     "a whole-GPU pod holds the GPU a reservation asks for",
			pods:     []*corev1.Pod{ddp, reservation("a", 0, "n-gpu1", ""), reservation("b", 0, "n-gpu2", ""), reservation("c", 0, "n-gpu0", "n-gpu0")},
			wantFree: []int{1000, 0, 1000, 0}, wantReserved: []bool{true, false, true, false},
			wantRes: map[string]held{"n-gpu0": {"c", true}, "n-gpu2": {"b", false}},
		},
		{
			name:     "two reservations ask for one GPU: the older is counted on it",
			pods:     []*corev1.Pod{reservation("late", 1, "n-gpu1", ""), reservation("early", 0, "n-gpu1", "")},
			wantFree: []int{0, 1000, 1000, 1000}, wantReserved: []bool{false, true, false, false}, // late holds a GPU not known yet: a clean one
			wantRes: map[string]held{"n-gpu1": {"early", false}},
		},
		{
			name:     "reservations not told their GPUs yet are counted on the GPUs they ask for",
			pods:     []*corev1.Pod{reservation("a", 0, "n-gpu1", ""), reservation("b", 0, "n-gpu3", "")},
			wantFree: []int{1000, 1000, 1000, 1000}, wantReserved: []bool{false, true, false, true},
			wantRes: map[string]held{"n-gpu1": {"a", false}, "n-gpu3": {"b", false}},
		},
	} {
		for _, order := range []string{"as listed", "reversed"} {
			t.Run(tc.name+", "+order, func(t *testing.T) {
				pods := slices.Clone(tc.pods)
				if order == "reversed" {
					slices.Reverse(pods)
				}
				s, err := Build(Inputs{Nodes: []*corev1.Node{node("n", 4).inventory("fraction").n}, Pods: pods, PoolLabel: api.LabelNodePool})
				if err != nil {
					t.Fatal(err)
				}
				var gotFree []int
				var gotReserved []bool
				for _, g := range s.Node(0).GPUs {
					gotFree = append(gotFree, g.FreeMilli)
					gotReserved = append(gotReserved, g.Reserved)
				}
				if diff := cmp.Diff(tc.wantReserved, gotReserved); diff != "" {
					t.Errorf("GPU reserved (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff(tc.wantFree, gotFree); diff != "" {
					t.Errorf("GPU free milli (-want +got):\n%s", diff)
				}
				gotRes := map[string]held{}
				for k, r := range s.Reservations {
					gotRes[k.GPU] = held{r.Pod.Name, r.Ready}
				}
				if diff := cmp.Diff(tc.wantRes, gotRes); diff != "" {
					t.Errorf("reservations by GPU (-want +got):\n%s", diff)
				}
			})
		}
	}
}

func TestNewNodesSettleFirst(t *testing.T) {
	// Karpenter's young node waits; an old one and a young static node
	// (no karpenter.sh/nodepool label: no placeholders bind there) do not.
	old := node("old", 1).inventory("fraction").n
	young := node("young", 1).inventory("fraction").n
	static := node("static", 1).inventory("fraction").n
	now := time.Now()
	old.CreationTimestamp = metav1.NewTime(now.Add(-time.Minute))
	young.CreationTimestamp = metav1.NewTime(now)
	static.CreationTimestamp = metav1.NewTime(now)
	delete(static.Labels, api.LabelNodePool)
	got := free(t, Inputs{Nodes: []*corev1.Node{old, young, static}, PoolLabel: api.LabelNodePool, NotBefore: now.Add(-3 * time.Second)})
	if diff := cmp.Diff(map[string][]int{"old": {1000}, "static": {1000}}, got); diff != "" {
		t.Errorf("nodes placed on (-want +got):\n%s", diff)
	}
}

func TestNodesBusiestFirst(t *testing.T) {
	// Given in lister order c, a, b, d: b runs a whole GPU, d a 30% fraction.
	nodes := []*corev1.Node{
		node("c", 2).inventory("fraction").n, node("a", 2).inventory("fraction").n,
		node("b", 2).inventory("fraction").n, node("d", 2).inventory("fraction").n,
	}
	whole := pod("whole").on("b").gpus(1).p
	whole.Annotations[api.AnnotationAllocatedGPU] = "b-gpu0"
	pods := []*corev1.Pod{whole, pod("frac").on("d").fraction(30, "d-gpu1").p}
	s, err := Build(Inputs{Nodes: nodes, Pods: pods, PoolLabel: api.LabelNodePool})
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for i := 0; i < s.Len(); i++ {
		order = append(order, s.Node(i).Name)
	}
	if diff := cmp.Diff([]string{"b", "d", "a", "c"}, order); diff != "" {
		t.Errorf("snapshot node order (-want +got):\n%s", diff)
	}

	// Ties go to the busiest node: a whole GPU and a fresh-GPU fraction are
	// worth the same on every node with a free GPU, and land on b.
	p, err := placement.New(placement.DefaultPolicy, placement.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []placement.Request{{GPUs: 1}, {ShareMilli: 1000}} {
		d, err := p.Place(s.Snapshot, &r)
		if err != nil {
			t.Fatal(err)
		}
		if d.Node != "b" {
			t.Errorf("%+v placed on %s, want b (the busiest node with room)", r, d.Node)
		}
	}
}

// TestDemandFollowsTheRequestModel: the snapshot counts a pod as the
// coordinator's parser and the node agent do (api/request): sidecars add to
// the app containers and to later init containers, regular init containers
// count as a maximum, and CPU carries the pod overhead.
func TestDemandFollowsTheRequestModel(t *testing.T) {
	p := builders.MakePod("p", "ns").GPUs(1).CPU("1").
		SidecarContainer("proxy").GPUs(1).CPU("500m").
		InitContainer("setup").GPUs(3).CPU("2").
		Overhead(corev1.ResourceCPU, "100m").Obj()
	want := request.Demand{CPUMilli: 2600, Whole: 4}
	if diff := cmp.Diff(want, podFactsOf(p, "").d); diff != "" {
		t.Errorf("Demand (-want +got):\n%s", diff)
	}
}

// draNode is a node in mode dra: its inventory names the driver, and it
// advertises no GPU resources.
func draNode(name string, gpus int) *corev1.Node {
	b := node(name, gpus).inventory("fraction")
	inv, _ := api.DecodeInventory(b.n.Annotations[api.AnnotationGPUInventory])
	for i := range inv {
		inv[i].Driver = api.DRADriver
	}
	s, _ := api.EncodeInventory(inv)
	b.n.Annotations[api.AnnotationGPUInventory] = s
	delete(b.n.Status.Allocatable, api.ResourceGPU)
	delete(b.n.Status.Allocatable, api.ResourceFraction)
	return b.n
}

func TestBuildChargesDRANodesFromClaims(t *testing.T) {
	in := Inputs{
		Nodes: []*corev1.Node{draNode("dra", 3), node("dp", 1).inventory("fraction").n},
		Pods: []*corev1.Pod{
			// A pod on the DRA node asking a fraction as an extended resource:
			// its claim is what counts, not its spec.
			pod("f").on("dra").cpu("4").fraction(50, "dra-gpu2").p,
			pod("g").on("dp").fraction(30, "dp-gpu0").p,
		},
		DRAUsage: dra.Usage{"dra": {"dra-gpu0": {UsedMilli: 300}, "dra-gpu1": {UsedMilli: 1000}}},
	}
	want := map[string][]int{"dra": {700, 0, 1000}, "dp": {700}}
	if diff := cmp.Diff(want, free(t, in)); diff != "" {
		t.Errorf("free milli (-want +got):\n%s", diff)
	}
	s, err := Build(in)
	if err != nil {
		t.Fatal(err)
	}
	if !s.DRANodes["dra"] || s.DRANodes["dp"] || s.NoFraction["dra"] {
		t.Errorf("DRANodes %v NoFraction %v: want dra in mode dra and taking fractions", s.DRANodes, s.NoFraction)
	}
	i, _ := s.Index("dra")
	if n := s.Node(i); n.UsedCPUMilli != 4000 {
		t.Errorf("CPU used on dra: %d, want 4000 (pods' CPU still counts)", n.UsedCPUMilli)
	}
}

// A node consolidation drains (taint gpufrac.io/draining) takes no new pod,
// whatever the pods tolerate: it is left out like a cordoned node.
func TestDrainingNodeIsLeftOut(t *testing.T) {
	draining := node("d", 1).inventory("fraction").n
	draining.Spec.Taints = []corev1.Taint{{Key: api.TaintDraining, Value: "1", Effect: corev1.TaintEffectNoSchedule}}
	s, err := Build(Inputs{Nodes: []*corev1.Node{node("a", 1).inventory("fraction").n, draining}})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Index("d"); ok || s.Len() != 1 {
		t.Errorf("the draining node is in the snapshot (%d nodes)", s.Len())
	}
}

// A node being deleted (consolidation deletes a drained node for
// Karpenter's finalizer to terminate) takes no new pod, past its drain's
// deadline too: while Karpenter is away or slow the node lingers with a
// deletion timestamp, and nothing placed there would last. Its
// reservations are orphaned, so they go once their fractions have.
func TestNodeBeingDeletedIsLeftOut(t *testing.T) {
	now := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	n := node("d", 1).inventory("fraction").n
	n.Spec.Taints = []corev1.Taint{{Key: api.TaintDraining, Value: strconv.FormatInt(now.Add(-time.Minute).Unix(), 10), Effect: corev1.TaintEffectNoSchedule}}
	gone := metav1.NewTime(now.Add(-time.Minute))
	n.DeletionTimestamp = &gone
	res := reservationOn("d", "d-gpu0")
	s, err := Build(Inputs{Nodes: []*corev1.Node{node("a", 1).inventory("fraction").n, n}, Pods: []*corev1.Pod{res}, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if _, in := s.Index("d"); in {
		t.Error("a node being deleted is in the snapshot past its drain's deadline")
	}
	r := s.Reservations[NodeGPU{"d", "d-gpu0"}]
	if r == nil || !strings.Contains(r.Orphaned, "being deleted") || r.NodeLost {
		t.Errorf("reservation on the node being deleted: %+v; want orphaned (being deleted), its kubelet still there", r)
	}
}

// The taint's value is the drain's deadline (Unix seconds). Past it the
// drain is over whoever removes the taint: consolidation abandons it on its
// next pass, but a taint that outlives it (consolidation turned off while a
// drain was under way, which takes the coordinator's right to write nodes;
// node updates refused) must not keep the node out of placement for good.
// Nor may the taint itself keep pods that do not tolerate it away.
func TestDrainingNodeIsBackPastItsDeadline(t *testing.T) {
	now := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	tainted := func(deadline string) *corev1.Node {
		n := node("d", 1).inventory("fraction").n
		n.Spec.Taints = []corev1.Taint{{Key: api.TaintDraining, Value: deadline, Effect: corev1.TaintEffectNoSchedule}}
		return n
	}
	future := strconv.FormatInt(now.Add(time.Minute).Unix(), 10)
	past := strconv.FormatInt(now.Add(-time.Second).Unix(), 10)
	for _, tt := range []struct {
		name     string
		deadline string
		want     bool
	}{
		{"before the deadline", future, false},
		{"past the deadline", past, true},
		{"a value that does not parse is a deadline passed", "soon", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			n := tainted(tt.deadline)
			if got := !predicates.DrainingAt(n, now); got != tt.want {
				t.Errorf("DrainingAt = %v, want %v", !got, !tt.want)
			}
			s, err := Build(Inputs{Nodes: []*corev1.Node{n}, Now: now})
			if err != nil {
				t.Fatal(err)
			}
			i, in := s.Index("d")
			if in != tt.want {
				t.Fatalf("node in the snapshot: %v, want %v", in, tt.want)
			}
			if in && slices.ContainsFunc(s.Node(i).Taints, func(t corev1.Taint) bool { return t.Key == api.TaintDraining }) {
				t.Errorf("placement still sees the taint past its deadline: %v", s.Node(i).Taints)
			}
		})
	}
	// Without Now every draining taint counts.
	if got := free(t, Inputs{Nodes: []*corev1.Node{tainted(past)}}); len(got) != 0 {
		t.Errorf("without Now: free %v, want the node left out", got)
	}
}
