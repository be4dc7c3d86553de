package openb

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/gpufrac/gpufrac/coordinator/placement"
)

func TestReadPods(t *testing.T) {
	csv := `gpu_milli,name,cpu_milli,memory_mib,num_gpu,gpu_spec,qos
1000,p-whole,12000,16384,1,,LS
460,p-share,6000,12288,1,nan,BE
0,p-cpu,8000,1024,0,,BE
0,p-zero,1000,1024,1,V100M16|V100M32,LS
1500,p-big,1000,1024,2,,LS
`
	got, err := ReadPods(strings.NewReader(csv))
	if err != nil {
		t.Fatal(err)
	}
	want := []Pod{
		{Name: "p-whole", CPUMilli: 12000, MemoryMiB: 16384, NumGPU: 1, GPUMilli: 1000},
		{Name: "p-share", CPUMilli: 6000, MemoryMiB: 12288, NumGPU: 1, GPUMilli: 460},
		{Name: "p-cpu", CPUMilli: 8000, MemoryMiB: 1024},
		{Name: "p-zero", CPUMilli: 1000, MemoryMiB: 1024, NumGPU: 1, GPUMilli: 1, Models: []string{"V100M16", "V100M32"}},
		{Name: "p-big", CPUMilli: 1000, MemoryMiB: 1024, NumGPU: 2, GPUMilli: 1000},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ReadPods (-want +got):\n%s", diff)
	}
	classes := []string{"one", "share", "cpu", "share", "multi"}
	for i, p := range got {
		if p.Class() != classes[i] {
			t.Errorf("%s: class %q, want %q", p.Name, p.Class(), classes[i])
		}
	}
	if r := got[1].Request(); r.ShareMilli != 460 || r.GPUs != 0 || r.MemoryBytes != 12288*MiB {
		t.Errorf("share pod request: %+v", r)
	}
	if r := got[4].Request(); r.GPUs != 2 || r.ShareMilli != 0 {
		t.Errorf("2-GPU pod request: %+v", r)
	}

	for _, bad := range []string{
		"name,cpu_milli,memory_mib,num_gpu\np,1,1,1\n",                // no gpu_milli column
		"name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,x,1,1,1000\n", // not a number
		"name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,2,500\n",  // shares two GPUs
		"",
	} {
		if _, err := ReadPods(strings.NewReader(bad)); err == nil {
			t.Errorf("ReadPods(%q): got nil error", bad)
		}
	}
}

func TestReadNodes(t *testing.T) {
	csv := "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,262144,0,\nn1,96000,393216,8,G2\nn2,64000,1,2,nan\n"
	got, err := ReadNodes(strings.NewReader(csv))
	if err != nil {
		t.Fatal(err)
	}
	want := []NodeSpec{
		{Name: "n0", CPUMilli: 32000, MemoryMiB: 262144},
		{Name: "n1", CPUMilli: 96000, MemoryMiB: 393216, GPUs: 8, Model: "G2"},
		{Name: "n2", CPUMilli: 64000, MemoryMiB: 1, GPUs: 2},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ReadNodes (-want +got):\n%s", diff)
	}
	if got := CapacityMilli(want); got != 10000 {
		t.Errorf("CapacityMilli: got %d, want 10000", got)
	}
	nodes := Nodes(want, []int{2, 1})
	if nodes[0].Name != "n2" || nodes[1].Name != "n1" || len(nodes[1].GPUs) != 8 || nodes[1].GPUs[7].ID != "7" || nodes[1].GPUs[7].FreeMilli != placement.MilliPerGPU {
		t.Errorf("Nodes in order [2 1]: %+v", nodes)
	}
}

// trace is n pods cycling through a share, a whole GPU and a CPU-only pod.
func trace(n int) []Pod {
	var pods []Pod
	for i := range n {
		p := Pod{Name: fmt.Sprintf("p%04d", i), CPUMilli: 1000, MemoryMiB: 1024}
		switch i % 3 {
		case 0:
			p.NumGPU, p.GPUMilli = 1, 500
		case 1:
			p.NumGPU, p.GPUMilli = 1, 1000
		}
		pods = append(pods, p)
	}
	return pods
}

func demandOf(pods []Pod) int64 {
	var d int64
	for i := range pods {
		d += pods[i].TotalMilli()
	}
	return d
}

func TestWorkload(t *testing.T) {
	pods := trace(300) // 100 shares + 100 whole = 150,000 milli
	tests := []struct {
		name      string
		capacity  int64
		inflation float64
	}{
		{name: "inflated: the trace asks less than the target", capacity: 150000, inflation: 1.3},
		{name: "deflated: the trace asks more than the target", capacity: 100000, inflation: 1.0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			target := int64(tc.inflation * float64(tc.capacity))
			w := Workload(pods, tc.capacity, tc.inflation, 42)
			d := demandOf(w)
			if d > target || d <= target-1000 {
				t.Errorf("demand %d, want in (%d, %d]: filled up to the first pod that would pass the target", d, target-1000, target)
			}
			if diff := cmp.Diff(w, Workload(pods, tc.capacity, tc.inflation, 42)); diff != "" {
				t.Errorf("same seed, different workload (-first +second):\n%s", diff)
			}
			if cmp.Equal(w, Workload(pods, tc.capacity, tc.inflation, 43)) {
				t.Error("seeds 42 and 43 built the same workload")
			}
		})
	}
	// Deflation keeps the shuffled order: the result is a subsequence of
	// the seed's shuffle (the workload with no target change).
	full := Workload(pods, demandOf(pods), 1, 7)
	small := Workload(pods, 100000, 1, 7)
	j := 0
	for _, p := range small {
		for j < len(full) && full[j].Name != p.Name {
			j++
		}
		if j == len(full) {
			t.Fatalf("deflated workload is not a subsequence of the shuffled trace (pod %s)", p.Name)
		}
	}
}

func TestNodeOrder(t *testing.T) {
	a, b := NodeOrder(50, 42), NodeOrder(50, 42)
	if diff := cmp.Diff(a, b); diff != "" {
		t.Errorf("same seed, different order (-first +second):\n%s", diff)
	}
	sorted := slices.Clone(a)
	slices.Sort(sorted)
	for i, v := range sorted {
		if v != i {
			t.Fatalf("NodeOrder is not a permutation: %v", a)
		}
	}
	if cmp.Equal(a, NodeOrder(50, 43)) {
		t.Error("seeds 42 and 43 gave the same node order")
	}
}

func TestResample(t *testing.T) {
	// 600 share, 300 one-GPU, 30 two-GPU, 10 eight-GPU, 200 CPU-only pods.
	var pods []Pod
	add := func(n int, p Pod) {
		for i := range n {
			p.Name = fmt.Sprintf("%s-%d", p.Class(), i)
			pods = append(pods, p)
		}
	}
	add(600, Pod{CPUMilli: 4000, MemoryMiB: 1024, NumGPU: 1, GPUMilli: 470})
	add(300, Pod{CPUMilli: 12000, MemoryMiB: 1024, NumGPU: 1, GPUMilli: 1000})
	add(30, Pod{CPUMilli: 24000, MemoryMiB: 1024, NumGPU: 2, GPUMilli: 1000})
	add(10, Pod{CPUMilli: 88000, MemoryMiB: 1024, NumGPU: 8, GPUMilli: 1000})
	add(200, Pod{CPUMilli: 8000, MemoryMiB: 1024})
	nodes := []NodeSpec{
		{Name: "g", CPUMilli: 96000, MemoryMiB: 1 << 20, GPUs: 8, Model: "G2"},
		{Name: "t", CPUMilli: 104000, MemoryMiB: 1 << 20, GPUs: 2, Model: "T4"},
	}
	count := func(ps []Pod, class string) int {
		n := 0
		for i := range ps {
			if ps[i].Class() == class {
				n++
			}
		}
		return n
	}
	t.Run("share", func(t *testing.T) {
		got, err := Resample(pods, nodes, Variant{{Kind: "share", Value: 0.6}}, 1)
		if err != nil {
			t.Fatal(err)
		}
		gpu := count(got, "share") + count(got, "one") + count(got, "multi")
		if gpu != 940 || count(got, "share") != 564 || count(got, "cpu") != 200 {
			t.Errorf("share=0.6: %d GPU pods, %d shares, %d CPU-only; want 940, 564, 200", gpu, count(got, "share"), count(got, "cpu"))
		}
	})
	t.Run("multigpu", func(t *testing.T) {
		got, err := Resample(pods, nodes, Variant{{Kind: "multigpu", Value: 0.5}}, 1)
		if err != nil {
			t.Fatal(err)
		}
		var multi int64
		for i := range got {
			if got[i].Class() == "multi" {
				multi += got[i].TotalMilli()
			}
		}
		total := demandOf(pods)
		if f := float64(multi) / float64(demandOf(got)); math.Abs(f-0.5) > 0.01 {
			t.Errorf("multigpu=0.5: multi-GPU pods carry %.3f of the demand", f)
		}
		if d := demandOf(got); math.Abs(float64(d-total)) > 1000 {
			t.Errorf("multigpu=0.5: demand %d, want about %d", d, total)
		}
	})
	t.Run("cpuonly", func(t *testing.T) {
		got, err := Resample(pods, nodes, Variant{{Kind: "cpuonly", Value: 0.5}}, 1)
		if err != nil {
			t.Fatal(err)
		}
		if count(got, "cpu") != 940 || len(got) != 1880 {
			t.Errorf("cpuonly=0.5: %d CPU-only of %d pods, want 940 of 1880", count(got, "cpu"), len(got))
		}
	})
	t.Run("gpuspec", func(t *testing.T) {
		got, err := Resample(pods, nodes, Variant{{Kind: "gpuspec", Value: 0.25}}, 1)
		if err != nil {
			t.Fatal(err)
		}
		constrained := 0
		for _, p := range got {
			if len(p.Models) == 0 {
				continue
			}
			constrained++
			if !slices.ContainsFunc(nodes, func(n NodeSpec) bool {
				return n.Model == p.Models[0] && n.GPUs >= p.NumGPU && n.CPUMilli >= p.CPUMilli
			}) {
				t.Errorf("pod %+v constrained to a model none of whose nodes can host it", p)
			}
		}
		if constrained != 235 {
			t.Errorf("gpuspec=0.25: %d constrained pods, want 235", constrained)
		}
	})
	t.Run("gpuspec focused", func(t *testing.T) {
		nodes := append(slices.Clone(nodes), NodeSpec{Name: "p", CPUMilli: 16000, MemoryMiB: 1 << 20, GPUs: 1, Model: "P100"})
		onModel := func(ps []Pod, model string) (n, shares int) {
			for _, p := range ps {
				if len(p.Models) == 1 && p.Models[0] == model {
					n++
					if p.Class() == "share" {
						shares++
					}
				}
			}
			return n, shares
		}
		for _, tc := range []struct {
			spec                string
			constrained, wantT4 int // wantT4 within ±tol; -1: all that fit T4
			tol                 int
			shares              int // constrained shares, -1: any
		}{
			// 235 constrained; T4 can host every one-GPU and two-GPU pod.
			{spec: "gpuspec=0.25,focus=T4,conc=1", constrained: 235, wantT4: -1, shares: -1},
			{spec: "gpuspec=0.25,focus=T4,conc=0.5", constrained: 235, wantT4: 116, tol: 20, shares: -1},
			{spec: "gpuspec=0.25,focus=T4,conc=0", constrained: 235, wantT4: 0, tol: 0, shares: -1},
			{spec: "gpuspec=0.25,focus=T4,conc=1,specshare=1", constrained: 235, wantT4: 235, tol: 0, shares: 235},
			{spec: "specshare=0,focus=T4,gpuspec=0.25,conc=1", constrained: 235, wantT4: -1, shares: 0},
		} {
			v, err := ParseVariant(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Resample(pods, nodes, v, 1)
			if err != nil {
				t.Fatal(err)
			}
			constrained, fitT4 := 0, 0
			for _, p := range got {
				if len(p.Models) > 0 {
					constrained++
					if p.NumGPU <= 4 {
						fitT4++
					}
				}
			}
			t4, shares := onModel(got, "T4")
			if tc.wantT4 < 0 { // conc=1: every constrained pod that fits a T4 node
				tc.wantT4 = fitT4
			}
			if constrained != tc.constrained || t4 < tc.wantT4-tc.tol || t4 > tc.wantT4+tc.tol {
				t.Errorf("%s: %d constrained, %d on T4; want %d, %d±%d", tc.spec, constrained, t4, tc.constrained, tc.wantT4, tc.tol)
			}
			if tc.shares >= 0 && shares != tc.shares {
				t.Errorf("%s: %d constrained shares on T4, want %d", tc.spec, shares, tc.shares)
			}
			if mix := Describe(got); math.Abs(mix.Constrained-float64(constrained)/940) > 1e-9 || math.Abs(mix.ByModel["T4"]-float64(t4)/float64(constrained)) > 1e-9 {
				t.Errorf("%s: Describe says %+v", tc.spec, mix)
			}
		}
		// The eight-GPU pods fit no T4 node: they draw among the others.
		v, _ := ParseVariant("gpuspec=1,focus=T4,conc=1")
		got, err := Resample(pods, nodes, v, 1)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range got {
			if p.NumGPU == 8 && (len(p.Models) != 1 || p.Models[0] != "G2") {
				t.Errorf("eight-GPU pod %s constrained to %v, want [G2]", p.Name, p.Models)
			}
		}
		if _, err := Resample(pods, nodes, Variant{{Kind: "gpuspec", Value: 0.2}, {Kind: "focus", Model: "H100"}}, 1); err == nil {
			t.Error("focus on a model no node has: got nil error")
		}
	})
	for _, bad := range []string{"share", "share=2", "cpuonly=1", "colour=0.5", "share=x",
		"focus=T4", "conc=0.5", "gpuspec=0.2,conc=0.5", "gpuspec=0.2,specshare=2", "gpuspec=0.2,focus="} {
		if _, err := ParseVariant(bad); err == nil {
			t.Errorf("ParseVariant(%q): got nil error", bad)
		}
	}
	v, err := ParseVariant("share=0.6,cpuonly=0.3")
	if err != nil || v.String() != "share=0.60,cpuonly=0.30" {
		t.Errorf("ParseVariant: got %v, %v", v, err)
	}
	v, err = ParseVariant("gpuspec=0.33,focus=T4,conc=0.5,specshare=1")
	if err != nil || v.String() != "gpuspec=0.33,focus=T4,conc=0.50,specshare=1.00" {
		t.Errorf("ParseVariant: got %v, %v", v, err)
	}
}

func TestFamilies(t *testing.T) {
	nodes := []NodeSpec{
		{Name: "g", GPUs: 8, Model: "G2"}, {Name: "g2", GPUs: 8, Model: "G2"}, {Name: "g3", GPUs: 8, Model: "G2"},
		{Name: "t", GPUs: 4, Model: "T4"}, {Name: "a", GPUs: 1, Model: "A10"}, {Name: "c"},
	}
	if got := ScarceModel(nodes); got != "T4" {
		t.Errorf("ScarceModel: %q, want T4 (A10 holds under a tenth)", got)
	}
	fams := Families(nodes)
	byName := map[string]Family{}
	for _, f := range fams {
		byName[f.Name] = f
		for _, v := range f.Variants {
			if v == "" {
				continue
			}
			if _, err := ParseVariant(v); err != nil {
				t.Errorf("family %s: %v", f.Name, err)
			}
		}
	}
	want := map[string]int{"default": 1, "share": 2, "multigpu": 2, "cpuonly": 2, "gpuspec": 2, "scarce": 12, "scarcemix": 6, "focus": 3}
	for name, n := range want {
		if len(byName[name].Variants) != n {
			t.Errorf("family %s: %d variants, want %d", name, len(byName[name].Variants), n)
		}
	}
	if got := byName["focus"].Variants; !slices.Equal(got, []string{"gpuspec=0.2,focus=A10,conc=0.5", "gpuspec=0.2,focus=T4,conc=0.5", "gpuspec=0.2,focus=G2,conc=0.5"}) {
		t.Errorf("focus family: %v, want fewest GPUs first", got)
	}
	if fams := Families([]NodeSpec{{Name: "x", GPUs: 2}}); len(fams) != 5 {
		t.Errorf("a cluster without models: %d families, want the 5 without model constraints", len(fams))
	}
}
