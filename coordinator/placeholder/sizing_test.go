package placeholder

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpufrac/gpufrac/coordinator/pricing"
	"github.com/gpufrac/gpufrac/tests/builders"
)

const h100Types = `
instanceTypes:
  - {name: gpu-8x-h100, gpus: 8, price: 98.32, gpuProduct: NVIDIA-H100-80GB-HBM3}
  - {name: gpu-1x-h100, gpus: 1, price: 14.19, gpuProduct: NVIDIA-H100-80GB-HBM3}
`

func h100Prices(t *testing.T) *pricing.Table { return prices(t, h100Types) }

func prices(t *testing.T, table string) *pricing.Table {
	t.Helper()
	tab, err := pricing.Parse([]byte(table))
	if err != nil {
		t.Fatal(err)
	}
	return tab
}

// preferredTypes lists the instance type each placeholder prefers ("" for
// none), sorted, and checks the annotation says the same.
func preferredTypes(t *testing.T, pods []*corev1.Pod) []string {
	t.Helper()
	var out []string
	for _, p := range pods {
		typ := ""
		if a := p.Spec.Affinity; a != nil && a.NodeAffinity != nil {
			for _, term := range a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
				for _, r := range term.Preference.MatchExpressions {
					if r.Key == corev1.LabelInstanceTypeStable && r.Operator == corev1.NodeSelectorOpIn && len(r.Values) == 1 {
						typ = r.Values[0]
					}
				}
			}
		}
		if p.Annotations[AnnotationInstanceType] != typ {
			t.Errorf("%s: annotation %q, affinity %q", p.Name, p.Annotations[AnnotationInstanceType], typ)
		}
		out = append(out, typ)
	}
	sort.Strings(out)
	return out
}

func TestPlanAsksForTheCheapestInstanceTypes(t *testing.T) {
	h100 := h100Prices(t)
	frac := func(n, pct int) []Item {
		var out []Item
		for i := 0; i < n; i++ {
			out = append(out, fraction(fmt.Sprintf("f%d", i), pct))
		}
		return out
	}
	whole := func(n, gpus int, pod *corev1.Pod) []Item {
		var out []Item
		for i := 0; i < n; i++ {
			out = append(out, Item{Workload: fmt.Sprintf("default/w%d", i), Pod: pod, GPUs: gpus})
		}
		return out
	}
	plain := builders.MakePod("w", "default").Obj()
	withA100 := prices(t, h100Types+`  - {name: gpu-4x-a100, gpus: 4, price: 16.00, gpuProduct: NVIDIA-A100-SXM4-40GB, nodePools: [a100]}
`)
	one, eight := "gpu-1x-h100", "gpu-8x-h100"
	tests := []struct {
		name   string
		items  []Item
		prices *pricing.Table
		want   []string
	}{
		{
			// The brief's case: three GPUs of 1-GPU nodes ($42.57/h), never an 8-GPU node ($98.32/h).
			name: "five 40% fractions: three 1-GPU nodes", items: frac(5, 40), prices: h100,
			want: []string{one, one, one},
		},
		{name: "ten 40% fractions: five 1-GPU nodes", items: frac(10, 40), prices: h100, want: repeatStr(one, 5)},
		{name: "seven whole GPUs: one 8-GPU node", items: whole(7, 1, plain), prices: h100, want: repeatStr(eight, 7)},
		{name: "nine whole GPUs: an 8-GPU and a 1-GPU node", items: whole(9, 1, plain), prices: h100, want: append([]string{one}, repeatStr(eight, 8)...)},
		{name: "a 2-GPU pod and a 1-GPU pod: three 1-GPU nodes would not hold the 2-GPU pod", items: append(whole(1, 2, plain), whole(1, 1, plain)...), prices: h100,
			want: []string{"", ""}}, // the mix is three 1x, which the 2-GPU pod fits none of: Karpenter's own choice (one 8x for both) stands
		{name: "no table: no preference", items: frac(5, 40), prices: nil, want: repeatStr("", 3)},
		{
			name:   "the pod selects the 8x type: sizing respects it",
			items:  whole(2, 1, builders.MakePod("w", "default").NodeSelector(corev1.LabelInstanceTypeStable, eight).Obj()),
			prices: h100, want: repeatStr(eight, 2),
		},
		{
			name:   "the pod's affinity excludes the 1x type",
			items:  whole(2, 1, builders.MakePod("w", "default").RequiredNodeAffinity(corev1.LabelInstanceTypeStable, corev1.NodeSelectorOpNotIn, one).Obj()),
			prices: h100, want: repeatStr(eight, 2),
		},
		{
			name:   "no model asked: the cheapest type, the A100 one, holds them",
			items:  whole(3, 1, builders.MakePod("w", "default").Obj()),
			prices: withA100, want: []string{"gpu-4x-a100", "gpu-4x-a100", "gpu-4x-a100"}, // no model asked: the cheapest holds them
		},
		{
			name:   "nothing in the table matches: no preference",
			items:  whole(2, 1, builders.MakePod("w", "default").NodeSelector(corev1.LabelInstanceTypeStable, "p5.48xlarge").Obj()),
			prices: h100, want: repeatStr("", 2),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := DefaultOptions()
			o.Prices = tt.prices
			pods := Plan(tt.items, o)
			if diff := cmp.Diff(tt.want, preferredTypes(t, pods)); diff != "" {
				t.Errorf("preferred instance types (-want +got):\n%s", diff)
			}
		})
	}
}

// Types limited to a pool, or of another GPU model, serve only the
// placeholders that may go there.
func TestSizingHonoursPoolsAndModels(t *testing.T) {
	tab := prices(t, h100Types+`  - {name: gpu-4x-a100, gpus: 4, price: 16.00, gpuProduct: NVIDIA-A100-SXM4-40GB, nodePools: [a100]}
`)
	o := DefaultOptions()
	o.Prices = tab
	items := func(pool string, models ...string) []Item {
		var out []Item
		for i := 0; i < 3; i++ {
			out = append(out, Item{Workload: fmt.Sprintf("default/w%d", i), Pod: builders.MakePod("w", "default").Obj(), GPUs: 1, Pool: pool, Models: models})
		}
		return out
	}
	one, a100 := "gpu-1x-h100", "gpu-4x-a100"
	for _, tc := range []struct {
		name  string
		items []Item
		want  []string
	}{
		{name: "a gang pinned to pool a100 gets the cheap A100 type", items: items("a100"), want: []string{a100, a100, a100}},
		{name: "a gang pinned to pool h100 never gets the A100 type of pool a100", items: items("h100"), want: []string{one, one, one}},
		{name: "H100 pods never get the A100 type", items: items("", "NVIDIA-H100-80GB-HBM3"), want: []string{one, one, one}},
		{name: "A100 pods get it", items: items("", "NVIDIA-A100-SXM4-40GB"), want: []string{a100, a100, a100}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, preferredTypes(t, Plan(tc.items, o))); diff != "" {
				t.Errorf("preferred instance types (-want +got):\n%s", diff)
			}
		})
	}
}

func repeatStr(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// sizings lists how each placeholder was sized (AnnotationSizing, "" for
// none) with, when sized smallest, the GPU counts its preferred terms allow
// at most, heaviest first ("smallest<=1,2,4"), sorted.
func sizings(t *testing.T, pods []*corev1.Pod) []string {
	t.Helper()
	var out []string
	for _, p := range pods {
		got := p.Annotations[AnnotationSizing]
		var bounds []string
		if a := p.Spec.Affinity; a != nil && a.NodeAffinity != nil {
			last := int32(1 << 30)
			for _, term := range a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
				for _, r := range term.Preference.MatchExpressions {
					if r.Key != DefaultGPUCountLabel {
						continue
					}
					if r.Operator != corev1.NodeSelectorOpLt || len(r.Values) != 1 || term.Weight >= last {
						t.Errorf("%s: GPU-count term %v weight %d (after %d)", p.Name, r, term.Weight, last)
					}
					last = term.Weight
					n, _ := strconv.Atoi(r.Values[0])
					bounds = append(bounds, strconv.Itoa(n-1))
				}
			}
		}
		if (got == SizingSmallest) != (len(bounds) > 0) {
			t.Errorf("%s: sizing %q, GPU-count terms %v", p.Name, got, bounds)
		}
		if len(bounds) > 0 {
			got += "<=" + strings.Join(bounds, ",")
		}
		out = append(out, got)
	}
	sort.Strings(out)
	return out
}

// Without prices for a group's types each placeholder prefers nodes no
// larger than it, then twice and four times it (Karpenter then buys the
// cheapest type that small, not one large node for all); with them the
// table's mix decides, and a mix that holds no placeholder leaves Karpenter's
// own choice. No GPU-count label: nothing without a table.
func TestPlanSizesWithoutPricesTheSmallestNodes(t *testing.T) {
	h100 := h100Prices(t)
	whole := func(n, gpus int, pod *corev1.Pod) []Item {
		var out []Item
		for i := 0; i < n; i++ {
			out = append(out, Item{Workload: fmt.Sprintf("default/w%d", i), Pod: pod, GPUs: gpus})
		}
		return out
	}
	plain := builders.MakePod("w", "default").Obj()
	gang := func(n int, pod *corev1.Pod) []Item {
		out := whole(n, 1, pod)
		for i := range out {
			out[i].Workload, out[i].Gang, out[i].Pool = "default/ddp", true, "gpu"
		}
		return out
	}
	var fractions []Item
	for i := 0; i < 10; i++ {
		fractions = append(fractions, fraction(fmt.Sprintf("f%d", i), 40))
	}
	one := SizingSmallest + "<=1,2,4"
	tests := []struct {
		name    string
		items   []Item
		prices  *pricing.Table
		noLabel bool
		want    []string
	}{
		{name: "no table: five 1-GPU placeholders, each the smallest nodes", items: whole(5, 1, plain), want: repeatStr(one, 5)},
		{name: "no table: ten 40% fractions, five 1-GPU placeholders", items: fractions, want: repeatStr(one, 5)},
		{name: "no table: a 2-GPU placeholder prefers nodes of at most 2 GPUs", items: whole(1, 2, plain), want: []string{SizingSmallest + "<=2,4,8"}},
		{name: "an empty table is no table", items: whole(2, 1, plain), prices: &pricing.Table{}, want: repeatStr(one, 2)},
		{name: "no table, no GPU-count label: Karpenter's choice", items: whole(2, 1, plain), noLabel: true, want: []string{"", ""}},
		{name: "no table: a gang's members are left to Karpenter's packing", items: gang(8, plain), want: repeatStr("", 8)},
		{name: "the table knows the types: its mix", items: whole(5, 1, plain), prices: h100, want: repeatStr(SizingTable, 5)},
		{
			name:  "the table lists no type the pods may use: the smallest nodes",
			items: whole(2, 1, builders.MakePod("w", "default").NodeSelector(corev1.LabelInstanceTypeStable, "p5.48xlarge").Obj()), prices: h100,
			want: repeatStr(one, 2),
		},
		{
			// The table prices one 8x for both below a node of 2 GPUs or more
			// plus a 1-GPU one: packing them stays Karpenter's to do.
			name:  "the table knows the types, no mix holds the placeholders: Karpenter's choice",
			items: append(whole(1, 2, plain), whole(1, 1, plain)...), prices: h100, want: []string{"", ""},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := DefaultOptions()
			o.Prices = tt.prices
			if tt.noLabel {
				o.GPUCountLabel = ""
			}
			if diff := cmp.Diff(tt.want, sizings(t, Plan(tt.items, o))); diff != "" {
				t.Errorf("sizing (-want +got):\n%s", diff)
			}
		})
	}
}
