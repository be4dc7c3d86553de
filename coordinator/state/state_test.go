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
