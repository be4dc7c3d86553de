package builders_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/tests/builders"
)

var quantityEqual = cmp.Comparer(func(a, b resource.Quantity) bool { return a.Cmp(b) == 0 })

func list(kv ...string) corev1.ResourceList {
	out := corev1.ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		out[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return out
}

func TestMakePod(t *testing.T) {
	job := builders.MakeJob("train", "ns").Parallelism(4).Completions(8).Obj()
	tests := []struct {
		name string
		got  *corev1.Pod
		want *corev1.Pod
	}{
		{
			name: "defaults",
			got:  builders.MakePod("p", "ns").Obj(),
			want: &corev1.Pod{
				TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
				ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"},
				Spec: corev1.PodSpec{
					SchedulerName: api.SchedulerName,
					Containers:    []corev1.Container{{Name: "main", Image: builders.DefaultImage}},
				},
			},
		},
		{
			name: "every pod-level helper",
			got: builders.MakePod("p", "ns").Fraction(30).CPU("500m").Memory("1Gi").
				Queue("team-a").PodGroup("g").MinMember(2).Preemptible(false).GPUModels("H100").
				Node("n1").SchedulerName("other").Priority(7).PriorityClass("high").
				Annotation("a", "b").Label("c", "d").
				Toleration("t", "", "", corev1.TaintEffectNoSchedule).
				Toleration("u", "", "v", corev1.TaintEffectNoExecute).
				NodeSelector("zone", "z1").
				RequiredNodeAffinity("k1", corev1.NodeSelectorOpIn, "v1").
				RequiredNodeAffinity("k2", corev1.NodeSelectorOpExists).
				RequiredNodeAffinityTerm("k3", corev1.NodeSelectorOpDoesNotExist).
				Overhead(corev1.ResourceCPU, "100m").
				OwnedByJob(job).UID("u-1").Created(metav1.Unix(10, 0)).Obj(),
			want: &corev1.Pod{
				TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
				ObjectMeta: metav1.ObjectMeta{
					Name: "p", Namespace: "ns", UID: "u-1", CreationTimestamp: metav1.Unix(10, 0),
					Labels: map[string]string{api.LabelQueue: "team-a", api.LabelPodGroup: "g", "c": "d"},
					Annotations: map[string]string{
						api.AnnotationMinMember: "2", api.AnnotationPreemptible: "false",
						api.AnnotationGPUModels: "H100", "a": "b",
					},
					OwnerReferences: []metav1.OwnerReference{{
						APIVersion: "batch/v1", Kind: "Job", Name: "train", UID: "uid-train",
						Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
					}},
				},
				Spec: corev1.PodSpec{
					SchedulerName: "other", NodeName: "n1", Priority: ptr.To[int32](7), PriorityClassName: "high",
					Containers: []corev1.Container{{
						Name: "main", Image: builders.DefaultImage,
						Resources: corev1.ResourceRequirements{
							Requests: list(api.ResourceFraction, "30", "cpu", "500m", "memory", "1Gi"),
							Limits:   list(api.ResourceFraction, "30"),
						},
					}},
					Tolerations: []corev1.Toleration{
						{Key: "t", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
						{Key: "u", Operator: corev1.TolerationOpEqual, Value: "v", Effect: corev1.TaintEffectNoExecute},
					},
					NodeSelector: map[string]string{"zone": "z1"},
					Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
						RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{
							{MatchExpressions: []corev1.NodeSelectorRequirement{
								{Key: "k1", Operator: corev1.NodeSelectorOpIn, Values: []string{"v1"}},
								{Key: "k2", Operator: corev1.NodeSelectorOpExists},
							}},
							{MatchExpressions: []corev1.NodeSelectorRequirement{
								{Key: "k3", Operator: corev1.NodeSelectorOpDoesNotExist},
							}},
						}},
					}},
					Overhead: list("cpu", "100m"),
				},
			},
		},
		{
			name: "containers: helpers apply to the current one",
			got: builders.MakePod("p", "ns").GPUs(1).
				InitContainer("init").CPU("1").Env("A", "1").
				SidecarContainer("side").Request("memory", "1Gi").Limit("memory", "2Gi").
				Container("second").Resource("example.com/dev", "2").Obj(),
			want: &corev1.Pod{
				TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
				ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"},
				Spec: corev1.PodSpec{
					SchedulerName: api.SchedulerName,
					InitContainers: []corev1.Container{
						{Name: "init", Image: builders.DefaultImage,
							Resources: corev1.ResourceRequirements{Requests: list("cpu", "1")},
							Env:       []corev1.EnvVar{{Name: "A", Value: "1"}}},
						{Name: "side", Image: builders.DefaultImage, RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
							Resources: corev1.ResourceRequirements{Requests: list("memory", "1Gi"), Limits: list("memory", "2Gi")}},
					},
					Containers: []corev1.Container{
						{Name: "main", Image: builders.DefaultImage, Resources: corev1.ResourceRequirements{
							Requests: list(api.ResourceGPU, "1"), Limits: list(api.ResourceGPU, "1")}},
						{Name: "second", Image: builders.DefaultImage, Resources: corev1.ResourceRequirements{
							Requests: list("example.com/dev", "2"), Limits: list("example.com/dev", "2")}},
					},
				},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, tc.got, quantityEqual); diff != "" {
				t.Errorf("pod (-want +got):\n%s", diff)
			}
		})
	}
}

func TestObjReturnsCopies(t *testing.T) {
	w := builders.MakePod("p", "ns").Queue("a").CPU("1")
	first := w.Obj()
	first.Labels[api.LabelQueue] = "changed"
	first.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU] = resource.MustParse("9")
	second := w.Label("x", "y").Obj()
	if got := second.Labels[api.LabelQueue]; got != "a" {
		t.Errorf("queue label = %q after changing an earlier Obj, want a", got)
	}
	if got := second.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU]; got.Cmp(resource.MustParse("1")) != 0 {
		t.Errorf("cpu = %s after changing an earlier Obj, want 1", got.String())
	}
	if _, ok := first.Labels["x"]; ok {
		t.Error("a later change reached an earlier Obj")
	}
}

func TestMakeNode(t *testing.T) {
	got := builders.MakeNode("n1").GPUs(8).FractionUnits(200).CPU("64").
		Product("NVIDIA-H100-80GB-HBM3").Pool("gpu").Label("zone", "a").
		Taint("nvidia.com/gpu", "true", corev1.TaintEffectNoSchedule).Unschedulable().NotReady().Obj()
	res := list("cpu", "64", "memory", "256Gi", "pods", "110", api.ResourceGPU, "8", api.ResourceFraction, "200")
	want := &corev1.Node{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{
			corev1.LabelHostname: "n1", api.LabelGPUProduct: "NVIDIA-H100-80GB-HBM3", api.LabelNodePool: "gpu", "zone": "a",
		}},
		Spec: corev1.NodeSpec{
			Unschedulable: true,
			Taints:        []corev1.Taint{{Key: "nvidia.com/gpu", Value: "true", Effect: corev1.TaintEffectNoSchedule}},
		},
		Status: corev1.NodeStatus{
			Capacity: res, Allocatable: res,
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionFalse}},
		},
	}
	if diff := cmp.Diff(want, got, quantityEqual); diff != "" {
		t.Errorf("node (-want +got):\n%s", diff)
	}
}

func TestMakeJob(t *testing.T) {
	got := builders.MakeJob("j", "ns").Parallelism(3).Completions(6).UID("x").Obj()
	want := &batchv1.Job{
		TypeMeta:   metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"},
		ObjectMeta: metav1.ObjectMeta{Name: "j", Namespace: "ns", UID: "x"},
		Spec: batchv1.JobSpec{
			Parallelism: ptr.To[int32](3), Completions: ptr.To[int32](6),
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers:    []corev1.Container{{Name: "main", Image: builders.DefaultImage}},
			}},
		},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("job (-want +got):\n%s", diff)
	}
}

func TestMakeQueue(t *testing.T) {
	got := builders.MakeQueue("team-a").Parent("org").Priority(3).
		GPUQuota("2.5").GPULimit("4").GPUWeight(2).
		CPUQuota("16").CPULimit("32").MemoryQuota("64Gi").MemoryLimit("128Gi").Obj()
	q := func(s string) *resource.Quantity { v := resource.MustParse(s); return &v }
	want := &v1alpha1.Queue{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.QueueKind},
		ObjectMeta: metav1.ObjectMeta{Name: "team-a"},
		Spec: v1alpha1.QueueSpec{Parent: "org", Priority: 3, Resources: v1alpha1.QueueResources{
			GPU:    &v1alpha1.ResourceQuota{Quota: q("2.5"), Limit: q("4"), OverQuotaWeight: ptr.To[int32](2)},
			CPU:    &v1alpha1.ResourceQuota{Quota: q("16"), Limit: q("32")},
			Memory: &v1alpha1.ResourceQuota{Quota: q("64Gi"), Limit: q("128Gi")},
		}},
	}
	if diff := cmp.Diff(want, got, quantityEqual); diff != "" {
		t.Errorf("queue (-want +got):\n%s", diff)
	}
}
