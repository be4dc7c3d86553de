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
				if p.Spec.SchedulerName != SchedulerName || !NeverBound(p) || p.Spec.PriorityClassName != "gpufrac-placeholder" || p.Annotations[api.AnnotationDoNotDisrupt] != "" {
					t.Errorf("%s: scheduler %q priority %q: want the scheduler nobody serves (%s), lowest priority, no do-not-disrupt", p.Name, p.Spec.SchedulerName, p.Spec.PriorityClassName, SchedulerName)
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
	if p.Namespace != api.ReservationNamespace || !IsPlaceholder(p) {
		t.Errorf("placeholder in %s with labels %v", p.Namespace, p.Labels)
	}
}

const (
	mig1g = "nvidia.com/mig-1g.10gb"
	mig3g = "nvidia.com/mig-3g.40gb"
	mig4g = "nvidia.com/mig-4g.40gb"
)

// scalarItem is a pod asking n units of a MIG or replica resource worth unitMilli each.
func scalarItem(name, resource string, n, unitMilli int64) Item {
	return Item{Workload: "default/" + name, Pod: builders.MakePod(name, "default").Obj(),
		Scalars: map[string]int64{resource: n}, ScalarMilli: n * unitMilli, CPUMilli: 500}
}

func TestPlanAsksWholeGPUsBehindMIGDevicesAndReplicas(t *testing.T) {
	many := func(n int, f func(i int) Item) []Item {
		var out []Item
		for i := 0; i < n; i++ {
			out = append(out, f(i))
		}
		return out
	}
	for _, tc := range []struct {
		name      string
		items     []Item
		wantGPUs  []int64
		wantMilli []string // AnnotationPackedMilli per placeholder
	}{
		{
			name:      "eight 1g.10gb devices: seven fit one GPU, though their memory would fit eight",
			items:     many(8, func(i int) Item { return scalarItem(fmt.Sprintf("m%d", i), mig1g, 1, 125) }),
			wantGPUs:  []int64{1, 1},
			wantMilli: []string{"994", "142"},
		},
		{
			name:      "4g.40gb devices take a GPU each",
			items:     many(3, func(i int) Item { return scalarItem(fmt.Sprintf("m%d", i), mig4g, 1, 500) }),
			wantGPUs:  []int64{1, 1, 1},
			wantMilli: []string{"1000", "1000", "1000"},
		},
		{
			name:      "two 3g.40gb per GPU",
			items:     many(3, func(i int) Item { return scalarItem(fmt.Sprintf("m%d", i), mig3g, 1, 500) }),
			wantGPUs:  []int64{1, 1},
			wantMilli: []string{"1000", "500"},
		},
		{
			name:      "replicas pack by 1000/replicas",
			items:     many(5, func(i int) Item { return scalarItem(fmt.Sprintf("r%d", i), api.DefaultTimesliceResource, 1, 250) }),
			wantGPUs:  []int64{1, 1},
			wantMilli: []string{"1000", "250"},
		},
		{
			name:      "a pod of more than a GPU's worth gets its GPUs in one placeholder, first",
			items:     []Item{scalarItem("small", mig3g, 1, 500), scalarItem("big", mig3g, 3, 500)},
			wantGPUs:  []int64{2, 1},
			wantMilli: []string{"1500", "500"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pods := Plan(tc.items, DefaultOptions())
			if diff := cmp.Diff(tc.wantGPUs, gpus(pods)); diff != "" {
				t.Errorf("GPUs per placeholder (-want +got):\n%s", diff)
			}
			var milli []string
			for _, p := range pods {
				milli = append(milli, p.Annotations[AnnotationPackedMilli])
				if q := p.Spec.Containers[0].Resources.Requests[corev1.ResourceName(mig1g)]; !q.IsZero() {
					t.Errorf("%s asks MIG devices; placeholders ask whole GPUs only", p.Name)
				}
			}
			if diff := cmp.Diff(tc.wantMilli, milli); diff != "" {
				t.Errorf("packed milli per placeholder (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPlanKeepsKindsApart(t *testing.T) {
	items := []Item{
		fraction("f1", 30), fraction("f2", 30),
		scalarItem("m1", mig1g, 1, 125), scalarItem("m2", mig3g, 1, 500),
		scalarItem("r1", api.DefaultTimesliceResource, 1, 250),
		scalarItem("s1", "example.com/slice", 1, 250),
	}
	pods := Plan(items, DefaultOptions())
	groups := map[string][]string{} // group -> workloads
	for _, p := range pods {
		groups[p.Labels[LabelGroup]] = append(groups[p.Labels[LabelGroup]], p.Annotations[AnnotationWorkloads])
	}
	want := map[string][]string{
		GroupOf(items[0]): {"default/f1,default/f2"},
		GroupOf(items[2]): {"default/m2,default/m1"},
		GroupOf(items[4]): {"default/r1"},
		GroupOf(items[5]): {"default/s1"},
	}
	if diff := cmp.Diff(want, groups); diff != "" {
		t.Errorf("placeholder groups (-want +got):\n%s", diff)
	}
	if GroupOf(items[2]) != GroupOf(items[3]) {
		t.Errorf("MIG devices of two profiles are in different groups")
	}
}

func TestPackMilli(t *testing.T) {
	for _, tc := range []struct {
		name string
		it   Item
		want int64
	}{
		{name: "1g device: a seventh of a GPU at least", it: scalarItem("a", mig1g, 1, 125), want: 142},
		{name: "2g device: a third", it: scalarItem("a", "nvidia.com/mig-2g.20gb", 2, 250), want: 666},
		{name: "compute-instance profile: six 1c.3g fit a GPU", it: scalarItem("a", "nvidia.com/mig-1c.3g.40gb", 1, 100), want: 166},
		{name: "a MIG device worth more than its slices", it: scalarItem("a", "nvidia.com/mig-1g.20gb", 1, 250), want: 250},
		{name: "replicas by their worth", it: scalarItem("a", api.DefaultTimesliceResource, 3, 250), want: 750},
		{name: "unreadable profile by its worth", it: scalarItem("a", "nvidia.com/mig-odd", 1, 300), want: 300},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := PackMilli(tc.it); got != tc.want {
				t.Errorf("PackMilli = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestPlanAsksClaimsForDRAPools(t *testing.T) {
	items := []Item{fraction("a", 60), fraction("b", 50), fraction("c", 30), fraction("d", 40)}
	for i := range items {
		items[i].DRA = true
	}
	items = append(items, fraction("dp", 30)) // a device-plugin fraction: a group of its own
	pods := Plan(items, DefaultOptions())
	var dra []*corev1.Pod
	for _, p := range pods {
		if len(p.Spec.ResourceClaims) > 0 {
			dra = append(dra, p)
		}
	}
	if len(pods) != 3 || len(dra) != 2 {
		t.Fatalf("%d placeholders, %d with claims; want 60+40 and 50+30 through claims, 30 through nvidia.com/gpu", len(pods), len(dra))
	}
	for _, p := range dra {
		c := p.Spec.Containers[0]
		if _, ok := c.Resources.Limits[api.ResourceGPU]; ok {
			t.Errorf("%s asks nvidia.com/gpu, which nodes in mode dra never advertise", p.Name)
		}
		if *p.Spec.ResourceClaims[0].ResourceClaimTemplateName != p.Name || len(c.Resources.Claims) != 1 || c.Resources.Claims[0].Name != p.Spec.ResourceClaims[0].Name {
			t.Errorf("%s claims: %+v, container %+v", p.Name, p.Spec.ResourceClaims, c.Resources.Claims)
		}
		tmpl := ClaimTemplate(p)
		if tmpl == nil || tmpl.Name != p.Name || tmpl.Namespace != api.ReservationNamespace {
			t.Fatalf("%s: template %+v", p.Name, tmpl)
		}
		if r := tmpl.Spec.Spec.Devices.Requests[0].Exactly; r.DeviceClassName != api.DRAClassGPU || r.Count != 1 {
			t.Errorf("%s: template asks %d of %s, want one whole GPU", p.Name, r.Count, r.DeviceClassName)
		}
	}
	if ClaimTemplate(pods[0]) != nil && len(pods[0].Spec.ResourceClaims) == 0 {
		t.Error("a device-plugin placeholder has a claim template")
	}
}

// TestPlanCarriesTopology: a pod's topology (its volumes' zones, the domains
// its spread allows) is ANDed into its placeholders' required affinity, and
// pods with different topologies ask in different groups.
func TestPlanCarriesTopology(t *testing.T) {
	zone := func(op corev1.NodeSelectorOperator, zs ...string) corev1.NodeSelector {
		return corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
			{Key: corev1.LabelTopologyZone, Operator: op, Values: zs}}}}}
	}
	pod := builders.MakePod("p", "team").RequiredNodeAffinity(api.LabelNodePool, corev1.NodeSelectorOpIn, "gpu-a", "gpu-b").Obj()
	a := Item{Workload: "team/a", Pod: pod, GPUs: 1, Topology: []corev1.NodeSelector{zone(corev1.NodeSelectorOpIn, "z1", "z2"), zone(corev1.NodeSelectorOpNotIn, "z1")}}
	b := Item{Workload: "team/b", Pod: pod, GPUs: 1}
	pods := Plan([]Item{a, b}, DefaultOptions())
	if len(pods) != 2 {
		t.Fatalf("%d placeholders, want 2 (one per topology)", len(pods))
	}
	var with *corev1.Pod
	for _, p := range pods {
		if p.Annotations[AnnotationWorkloads] == "team/a" {
			with = p
		}
	}
	if with == nil {
		t.Fatal("no placeholder for team/a")
	}
	terms := with.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) != 1 {
		t.Fatalf("terms %+v, want one", terms)
	}
	var got []string
	for _, e := range terms[0].MatchExpressions {
		got = append(got, fmt.Sprintf("%s %s %v", e.Key, e.Operator, e.Values))
	}
	want := []string{api.LabelNodePool + " In [gpu-a gpu-b]", "topology.kubernetes.io/zone In [z1 z2]", "topology.kubernetes.io/zone NotIn [z1]"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("requirements (-want +got):\n%s", diff)
	}
}

// TestPlanKeepsDomainsOutOfTheGroup: the domains a pod's spread allows move
// as pods land; a group named by them would drop its placeholders (and
// Karpenter's nomination) each time they moved.
func TestPlanKeepsDomainsOutOfTheGroup(t *testing.T) {
	pod := builders.MakePod("p", "team").Obj()
	zone := func(z string) []corev1.NodeSelector {
		return []corev1.NodeSelector{{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
			{Key: corev1.LabelTopologyZone, Operator: corev1.NodeSelectorOpNotIn, Values: []string{z}}}}}}}
	}
	a := Plan([]Item{{Workload: "team/p", Pod: pod, GPUs: 1, Domains: zone("z1")}}, DefaultOptions())
	b := Plan([]Item{{Workload: "team/p", Pod: pod, GPUs: 1, Domains: zone("z2")}}, DefaultOptions())
	if len(a) != 1 || len(b) != 1 || a[0].Name != b[0].Name {
		t.Fatalf("placeholders %v and %v, want one of the same name", a, b)
	}
	e := a[0].Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions[0]
	if e.Key != corev1.LabelTopologyZone || e.Operator != corev1.NodeSelectorOpNotIn || e.Values[0] != "z1" {
		t.Errorf("placeholder requires %+v, want zone NotIn [z1]", e)
	}
}
