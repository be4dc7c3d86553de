package view

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpufrac/gpufrac/api"
)

func gpuNode(t *testing.T, name string, gpus int, ready bool, unhealthy int) corev1.Node {
	t.Helper()
	var inv []api.GPUInfo
	for i := range gpus {
		inv = append(inv, api.GPUInfo{
			UUID: fmt.Sprintf("GPU-%s-%d-0000-0000", name, i), Index: i, Model: "NVIDIA H100 80GB HBM3",
			MemoryMiB: 81559, Mode: "fraction", Healthy: i != unhealthy,
		})
	}
	ann, err := api.EncodeInventory(inv)
	if err != nil {
		t.Fatal(err)
	}
	status := corev1.ConditionTrue
	if !ready {
		status = corev1.ConditionFalse
	}
	return corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{api.AnnotationGPUInventory: ann}},
		Status: corev1.NodeStatus{
			Allocatable: corev1.ResourceList{
				api.ResourceGPU:      resource.MustParse(fmt.Sprint(gpus)),
				api.ResourceFraction: resource.MustParse(fmt.Sprint(gpus * 100)),
			},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status}},
		},
	}
}

type podOpt func(*corev1.Pod)

func pod(name, node string, res corev1.ResourceName, n int, opts ...podOpt) corev1.Pod {
	p := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Annotations: map[string]string{}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{
			Name: "main", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{res: resource.MustParse(fmt.Sprint(n))}},
		}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	if node == "" {
		p.Status.Phase = corev1.PodPending
	}
	for _, o := range opts {
		o(&p)
	}
	return p
}

func annotated(k, v string) podOpt { return func(p *corev1.Pod) { p.Annotations[k] = v } }

func phase(ph corev1.PodPhase, reason, message string) podOpt {
	return func(p *corev1.Pod) { p.Status.Phase, p.Status.Reason, p.Status.Message = ph, reason, message }
}

func unschedulable(msg string) podOpt {
	return func(p *corev1.Pod) {
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable", Message: msg}}
	}
}

func TestRender(t *testing.T) {
	tests := []struct {
		name  string
		nodes func(t *testing.T) []corev1.Node
		pods  []corev1.Pod
		wide  bool
		want  string
	}{
		{
			name:  "no GPU nodes",
			nodes: func(*testing.T) []corev1.Node { return []corev1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "cpu"}}} },
			want:  "No GPU nodes.\n",
		},
		{
			name: "fractions, whole GPUs, pending and rejected pods",
			nodes: func(t *testing.T) []corev1.Node {
				return []corev1.Node{gpuNode(t, "b", 2, false, 1), gpuNode(t, "a", 3, true, -1)}
			},
			pods: []corev1.Pod{
				pod("infer-1", "a", api.ResourceFraction, 30, annotated(api.AnnotationAllocatedGPU, "GPU-a-1-0000-0000")),
				pod("infer-2", "a", api.ResourceFraction, 50, annotated(api.AnnotationAllocatedGPU, "GPU-a-1-0000-0000")),
				pod("new-frac", "a", api.ResourceFraction, 20, phase(corev1.PodPending, "", "")),
				pod("train", "a", api.ResourceGPU, 2),
				pod("listed", "b", api.ResourceGPU, 1, annotated(api.AnnotationAllocatedGPU, "GPU-b-0-0000-0000")),
				pod("done", "a", api.ResourceGPU, 1, phase(corev1.PodSucceeded, "", "")),
				pod("cpu", "a", corev1.ResourceCPU, 1),
				pod("burst", "", api.ResourceGPU, 8, unschedulable("0/2 nodes are available: 2 Insufficient nvidia.com/gpu.")),
				pod("too-big", "a", api.ResourceFraction, 150, phase(corev1.PodFailed, reasonUnexpectedAdmissionError,
					"Pod was rejected: Allocate failed due to rpc error: code = Unknown desc = at most 100 units, which is unexpected")),
			},
			want: `NODE a (Ready)  3× NVIDIA H100 80GB HBM3, 80 GiB each  allocatable: nvidia.com/gpu 3, gpufrac.io/gpu-fraction 300
  GPU  UUID           MODE      HEALTH  USED  HELD BY
  0    GPU-a-0-0000…  fraction  ok      -     free
  1    GPU-a-1-0000…  fraction  ok      80%   default/infer-1 30%, default/infer-2 50%
  2    GPU-a-2-0000…  fraction  ok      -     free
  whole GPUs held (which GPUs is not published by gpufrac-node): default/train ×2
  fractions whose GPU is not written back yet: default/new-frac 20% [Pending]

NODE b (NotReady)  2× NVIDIA H100 80GB HBM3, 80 GiB each  allocatable: nvidia.com/gpu 2, gpufrac.io/gpu-fraction 200
  GPU  UUID           MODE      HEALTH     USED  HELD BY
  0    GPU-b-0-0000…  fraction  ok         100%  default/listed (whole)
  1    GPU-b-1-0000…  fraction  UNHEALTHY  -     free

Pending GPU pods:
  default/burst  8 GPUs  Unschedulable: 0/2 nodes are available: 2 Insufficient nvidia.com/gpu.

Rejected at device admission (Failed):
  default/too-big  150% of a GPU  Allocate failed due to rpc error: code = Unknown desc = at most 100 units, which is unexpected
`,
		},
		{
			name:  "wide UUIDs and a reservation",
			nodes: func(t *testing.T) []corev1.Node { return []corev1.Node{gpuNode(t, "a", 1, true, -1)} },
			pods: []corev1.Pod{
				pod("gpufrac-reservation-a-0", "a", api.ResourceGPU, 1, annotated(api.AnnotationReservedGPU, "GPU-a-0-0000-0000")),
			},
			wide: true,
			want: `NODE a (Ready)  1× NVIDIA H100 80GB HBM3, 80 GiB each  allocatable: nvidia.com/gpu 1, gpufrac.io/gpu-fraction 100
  GPU  UUID               MODE      HEALTH  USED  HELD BY
  0    GPU-a-0-0000-0000  fraction  ok      100%  default/gpufrac-reservation-a-0 (reservation)
`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out strings.Builder
			if err := Build(tt.nodes(t), tt.pods).Render(&out, Options{Wide: tt.wide}); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, out.String()); diff != "" {
				t.Errorf("Render() (-want +got):\n%s\ngot:\n%s", diff, out.String())
			}
		})
	}
}
