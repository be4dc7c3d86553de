package view

import (
	"encoding/json"
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

func labelled(k, v string) podOpt {
	return func(p *corev1.Pod) {
		if p.Labels == nil {
			p.Labels = map[string]string{}
		}
		p.Labels[k] = v
	}
}

func inNamespace(ns string) podOpt { return func(p *corev1.Pod) { p.Namespace = ns } }

func reason(r, msg string) podOpt {
	return func(p *corev1.Pod) {
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: r, Message: msg}}
	}
}

func terminating() podOpt {
	return func(p *corev1.Pod) { now := metav1.Now(); p.DeletionTimestamp = &now }
}

// reservation is a reservation pod of the coordinator holding uuid on node.
func reservation(name, node, uuid string) corev1.Pod {
	return pod(name, node, api.ResourceGPU, 1, inNamespace(api.ReservationNamespace), labelled(api.LabelRole, api.RoleReservation),
		annotated(api.AnnotationReservedGPU, uuid), annotated(api.AnnotationDoNotDisrupt, "true"))
}

// karpenterNode marks a node as made by Karpenter.
func karpenterNode(n corev1.Node, pool, instanceType string) corev1.Node {
	n.Labels = map[string]string{labelKarpenterNodePool: pool, corev1.LabelInstanceTypeStable: instanceType}
	return n
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
  whole GPUs held, which ones not written back yet: default/train ×2
  fractions whose GPU is not written back yet: default/new-frac 20% [Pending]

NODE b (NotReady)  2× NVIDIA H100 80GB HBM3, 80 GiB each  allocatable: nvidia.com/gpu 2, gpufrac.io/gpu-fraction 200
  GPU  UUID           MODE      HEALTH     USED  HELD BY
  0    GPU-b-0-0000…  fraction  ok         100%  default/listed (whole)
  1    GPU-b-1-0000…  fraction  UNHEALTHY  -     free

Pending GPU pods:
  POD            ASKS    QUEUE  WHY
  default/burst  8 GPUs  -      Unschedulable: 0/2 nodes are available: 2 Insufficient nvidia.com/gpu.

Rejected at device admission (Failed):
  default/too-big  150% of a GPU  Allocate failed due to rpc error: code = Unknown desc = at most 100 units, which is unexpected

5 GPUs on 2 nodes: 1 held whole, 1 shared by 2 fractions, 3 free; 1 GPU pod pending.
`,
		},
		{
			name: "a shared GPU with its reservation, whole GPUs by UUID, Karpenter nodes and placeholders",
			nodes: func(t *testing.T) []corev1.Node {
				return []corev1.Node{
					gpuNode(t, "static", 4, true, -1),
					karpenterNode(gpuNode(t, "k1", 1, true, -1), "gpu", "gpu-1x-h100"),
					karpenterNode(gpuNode(t, "k2", 1, true, -1), "gpu", "gpu-1x-h100"),
				}
			},
			pods: []corev1.Pod{
				reservation("gpufrac-reservation-static-0a", "static", "GPU-static-1-0000-0000"),
				pod("chat-1", "static", api.ResourceFraction, 30, annotated(api.AnnotationAllocatedGPU, "GPU-static-1-0000-0000"), labelled(api.LabelQueue, "team-a")),
				pod("chat-2", "static", api.ResourceFraction, 30, annotated(api.AnnotationAllocatedGPU, "GPU-static-1-0000-0000"), labelled(api.LabelQueue, "team-a")),
				pod("train", "static", api.ResourceGPU, 1, annotated(api.AnnotationAllocatedGPU, "GPU-static-2-0000-0000"),
					annotated(api.AnnotationDoNotDisrupt, "true")),
				pod("ddp-0", "static", api.ResourceGPU, 1, annotated(api.AnnotationAllocatedGPU, "GPU-static-3-0000-0000"), labelled(api.LabelPodGroup, "ddp")),
				reservation("gpufrac-reservation-k1-0b", "k1", "GPU-k1-0-0000-0000"),
				pod("burst-1", "k1", api.ResourceFraction, 40, annotated(api.AnnotationAllocatedGPU, "GPU-k1-0-0000-0000")),
				pod("gpufrac-placeholder-abc-1", "k2", api.ResourceGPU, 1, inNamespace(api.ReservationNamespace), labelled(api.LabelRole, api.RolePlaceholder),
					annotated(api.AnnotationAllocatedGPU, "GPU-k2-0-0000-0000"), terminating()),
				pod("gpufrac-placeholder-abc-2", "", api.ResourceGPU, 1, inNamespace(api.ReservationNamespace), labelled(api.LabelRole, api.RolePlaceholder),
					annotated(annotationPlaceholderWorkloads, "default/burst-2,default/burst-3"), unschedulable("0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")),
				pod("eval", "", api.ResourceGPU, 3, labelled(api.LabelQueue, "team-b"), reason(api.ReasonOverQuota, "queue team-b: non-preemptible pods use 2 of 4 deserved GPUs and 3 more is asked")),
				pod("gang-0", "", api.ResourceGPU, 1, labelled(api.LabelQueue, "team-b"), reason(api.ReasonGangIncomplete, "")),
			},
			want: `NODE k1 (Ready)  made by Karpenter (NodePool gpu, gpu-1x-h100)  1× NVIDIA H100 80GB HBM3, 80 GiB each  allocatable: nvidia.com/gpu 1, gpufrac.io/gpu-fraction 100
  do-not-disrupt: 1 reservation (shared GPU)
  GPU  UUID           MODE      HEALTH  USED  HELD BY
  0    GPU-k1-0-000…  fraction  ok      40%   [reservation], default/burst-1 40%

NODE k2 (Ready)  made by Karpenter (NodePool gpu, gpu-1x-h100)  1× NVIDIA H100 80GB HBM3, 80 GiB each  allocatable: nvidia.com/gpu 1, gpufrac.io/gpu-fraction 100
  no do-not-disrupt pods: Karpenter may consolidate this node when it is empty or underused
  GPU  UUID           MODE      HEALTH  USED  HELD BY
  0    GPU-k2-0-000…  fraction  ok      100%  gpufrac-reservations/gpufrac-placeholder-abc-1 (placeholder) [Terminating]

NODE static (Ready)  4× NVIDIA H100 80GB HBM3, 80 GiB each  allocatable: nvidia.com/gpu 4, gpufrac.io/gpu-fraction 400
  do-not-disrupt: 1 reservation (shared GPU), default/train
  GPU  UUID           MODE      HEALTH  USED  HELD BY
  0    GPU-static-0…  fraction  ok      -     free
  1    GPU-static-1…  fraction  ok      60%   [reservation], default/chat-1 30%, default/chat-2 30%
  2    GPU-static-2…  fraction  ok      100%  default/train (whole)
  3    GPU-static-3…  fraction  ok      100%  default/ddp-0 (whole, gang ddp)

Pending GPU pods:
  POD             ASKS    QUEUE   WHY
  default/eval    3 GPUs  team-b  OverQuota: queue team-b: non-preemptible pods use 2 of 4 deserved GPUs and 3 more is asked
  default/gang-0  1 GPU   team-b  GangIncomplete

Placeholders (gpufrac-coordinator asking Karpenter for capacity):
  POD                                             ASKS   FOR                              WHY
  gpufrac-reservations/gpufrac-placeholder-abc-2  1 GPU  default/burst-2,default/burst-3  Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu.

6 GPUs on 3 nodes (2 made by Karpenter): 3 held whole, 2 shared by 3 fractions, 1 free; 2 GPU pods pending.
`,
		},
		{
			name: "a cordoned node",
			nodes: func(t *testing.T) []corev1.Node {
				n := gpuNode(t, "a", 1, true, -1)
				n.Spec.Unschedulable = true
				return []corev1.Node{n}
			},
			want: `NODE a (Ready, cordoned)  1× NVIDIA H100 80GB HBM3, 80 GiB each  allocatable: nvidia.com/gpu 1, gpufrac.io/gpu-fraction 100
  GPU  UUID           MODE      HEALTH  USED  HELD BY
  0    GPU-a-0-0000…  fraction  ok      -     free

1 GPU on 1 node: 0 held whole, 0 shared by 0 fractions, 1 free.
`,
		},
		{
			name:  "wide UUIDs, a reservation waiting for fractions",
			nodes: func(t *testing.T) []corev1.Node { return []corev1.Node{gpuNode(t, "a", 1, true, -1)} },
			pods: []corev1.Pod{
				reservation("gpufrac-reservation-a-0", "a", "GPU-a-0-0000-0000"),
			},
			wide: true,
			want: `NODE a (Ready)  1× NVIDIA H100 80GB HBM3, 80 GiB each  allocatable: nvidia.com/gpu 1, gpufrac.io/gpu-fraction 100
  do-not-disrupt: gpufrac-reservations/gpufrac-reservation-a-0
  GPU  UUID               MODE      HEALTH  USED  HELD BY
  0    GPU-a-0-0000-0000  fraction  ok      0%    [reservation gpufrac-reservations/gpufrac-reservation-a-0]

1 GPU on 1 node: 0 held whole, 0 shared by 0 fractions, 0 free, 1 reserved with no fraction yet.
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

func TestUsedPercent(t *testing.T) {
	tests := []struct {
		name    string
		holders []Holder
		want    int
	}{
		{name: "free", want: 0},
		{name: "a reservation alone adds nothing", holders: []Holder{{Role: RoleReservation, Whole: 1}}, want: 0},
		{name: "fractions under a reservation", holders: []Holder{{Role: RoleReservation, Whole: 1}, {Role: RoleFraction, Percent: 30}, {Role: RoleFraction, Percent: 50}}, want: 80},
		{name: "whole", holders: []Holder{{Role: RoleWhole, Whole: 1}}, want: 100},
		{name: "placeholder", holders: []Holder{{Role: RolePlaceholder, Whole: 1}}, want: 100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := (GPU{Holders: tt.holders}).UsedPercent(); got != tt.want {
				t.Errorf("UsedPercent() = %d, want %d", got, tt.want)
			}
		})
	}
}

// TestRenderMIG: a node whose GPU 3 an admin put in MIG mode shows its MIG
// devices in the GPU's row and its MIG resources next to the allocatable.
func TestRenderMIG(t *testing.T) {
	n := gpuNode(t, "gpu-node-2", 4, true, -1)
	inv, err := api.DecodeInventory(n.Annotations[api.AnnotationGPUInventory])
	if err != nil {
		t.Fatal(err)
	}
	inv[3].Mode = "mig"
	for i := range 7 {
		inv[3].MIGDevices = append(inv[3].MIGDevices, api.MIGDeviceInfo{UUID: fmt.Sprintf("MIG-%d", i), Profile: "1g.10gb", Resource: "nvidia.com/mig-1g.10gb", MemoryMiB: 9856})
	}
	if n.Annotations[api.AnnotationGPUInventory], err = api.EncodeInventory(inv); err != nil {
		t.Fatal(err)
	}
	n.Status.Allocatable[api.ResourceGPU] = resource.MustParse("3")
	n.Status.Allocatable[api.ResourceFraction] = resource.MustParse("300")
	n.Status.Allocatable["nvidia.com/mig-1g.10gb"] = resource.MustParse("7")
	n.Status.Allocatable["nvidia.com/mig-3g.40gb"] = resource.MustParse("0") // withdrawn, in the kubelet's grace period
	var out strings.Builder
	if err := Build([]corev1.Node{n}, nil).Render(&out, Options{}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"allocatable: nvidia.com/gpu 3, gpufrac.io/gpu-fraction 300, nvidia.com/mig-1g.10gb 7\n",
		"mig 7× 1g.10gb",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the view lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "3g.40gb") {
		t.Errorf("the view shows a withdrawn MIG resource:\n%s", out.String())
	}
}

// TestDocSaysCordoned: -o json tells a cordoned node (kubectl cordon, a
// drain) from one that takes new pods; the text view says so beside Ready.
func TestDocSaysCordoned(t *testing.T) {
	cordoned := gpuNode(t, "a", 1, true, -1)
	cordoned.Spec.Unschedulable = true
	raw, err := json.Marshal(Build([]corev1.Node{cordoned, gpuNode(t, "b", 1, true, -1)}, nil).Doc())
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Nodes []struct {
			Name     string `json:"name"`
			Cordoned *bool  `json:"cordoned"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"a": true, "b": false}
	for _, n := range got.Nodes {
		if n.Cordoned == nil || *n.Cordoned != want[n.Name] {
			t.Errorf("node %s: cordoned %v, want %v (%s)", n.Name, n.Cordoned, want[n.Name], raw)
		}
	}
	if len(got.Nodes) != 2 {
		t.Errorf("%d nodes in %s, want 2", len(got.Nodes), raw)
	}
}
