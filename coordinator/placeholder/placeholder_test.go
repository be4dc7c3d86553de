package placeholder

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/tests/builders"
)

func fraction(name string, pct int) Item {
	return Item{Workload: "default/" + name, Pod: builders.MakePod(name, "default").Obj(), FractionPercent: pct, CPUMilli: 500, MemoryBytes: 1 << 30}
}

func gpus(p []*corev1.Pod) []int64 {
	var out []int64
	for _, x := range p {
		q := x.Spec.Containers[0].Resources.Limits[api.ResourceGPU]
		out = append(out, q.Value())
	}
	return out
}

func TestPlanPacksFractionsFirstFitDecreasing(t *testing.T) {
	for _, tc := range []struct {
		name  string
		pcts  []int
		wantN int
	}{
		{name: "ten 40% pods need five GPUs (three never fit one)", pcts: []int{40, 40, 40, 40, 40, 40, 40, 40, 40, 40}, wantN: 5},
		{name: "ten 10% pods fit one GPU", pcts: []int{10, 10, 10, 10, 10, 10, 10, 10, 10, 10}, wantN: 1},
		{name: "60 40 70 30 pair up", pcts: []int{60, 40, 70, 30}, wantN: 2},
		{name: "ten 30% and ten 70%", pcts: append(repeat(30, 10), repeat(70, 10)...), wantN: 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var items []Item
			for i, p := range tc.pcts {
				items = append(items, fraction(fmt.Sprintf("f%d", i), p))
			}
			pods := Plan(items, DefaultOptions())
			if len(pods) != tc.wantN {
				t.Fatalf("Plan made %d placeholders, want %d", len(pods), tc.wantN)
			}
			for _, p := range pods {
				if g := p.Spec.Containers[0].Resources.Limits[api.ResourceGPU]; g.Value() != 1 {
					t.Errorf("%s asks %s GPUs, want 1", p.Name, g.String())
				}
				if p.Spec.SchedulerName != "" || p.Spec.PriorityClassName != "gpufrac-placeholder" || p.Annotations[api.AnnotationDoNotDisrupt] != "" {
					t.Errorf("%s: scheduler %q priority %q: want the default scheduler, lowest priority, no do-not-disrupt", p.Name, p.Spec.SchedulerName, p.Spec.PriorityClassName)
				}
			}
			// Deterministic: the same demand gives the same names.
			again := Plan(items, DefaultOptions())
			for i := range pods {
				if pods[i].Name != again[i].Name {
					t.Errorf("names differ between plans: %s vs %s", pods[i].Name, again[i].Name)
				}
			}
		})
	}
}

func repeat(v, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = v
	}
	return out
}

func TestPlanCopiesConstraintsAndPool(t *testing.T) {
	pod := builders.MakePod("g-0", "team").NodeSelector("zone", "a").
		Toleration("nvidia.com/gpu", corev1.TolerationOpExists, "", corev1.TaintEffectNoSchedule).
		RequiredNodeAffinity(api.LabelNodePool, corev1.NodeSelectorOpIn, "gpu-a", "gpu-b").Obj()
	items := []Item{
		{Workload: "team/g", Pod: pod, GPUs: 1, CPUMilli: 2000, Pool: "gpu-a", Models: []string{"NVIDIA-H100-80GB-HBM3"}},
		{Workload: "team/g", Pod: pod, GPUs: 1, CPUMilli: 2000, Pool: "gpu-a", Models: []string{"NVIDIA-H100-80GB-HBM3"}},
	}
	pods := Plan(items, DefaultOptions())
	if diff := cmp.Diff([]int64{1, 1}, gpus(pods)); diff != "" {
		t.Fatalf("GPUs per placeholder (-want +got):\n%s", diff)
	}
	p := pods[0]
	if diff := cmp.Diff(map[string]string{"zone": "a", api.LabelNodePool: "gpu-a"}, p.Spec.NodeSelector); diff != "" {
		t.Errorf("node selector (-want +got):\n%s", diff)
	}
	if len(p.Spec.Tolerations) != 1 {
		t.Errorf("tolerations %v", p.Spec.Tolerations)
	}
	terms := p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) != 1 || len(terms[0].MatchExpressions) != 2 || terms[0].MatchExpressions[1].Key != api.LabelGPUProduct {
		t.Errorf("affinity terms %+v, want the pod's plus the GPU model", terms)
	}
	if q := p.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU]; q.MilliValue() != 2000 {
		t.Errorf("cpu %s, want 2", q.String())
	}
	if p.Namespace != api.SystemNamespace || !IsPlaceholder(p) {
		t.Errorf("placeholder in %s with labels %v", p.Namespace, p.Labels)
	}
}
