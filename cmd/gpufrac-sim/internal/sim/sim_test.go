package sim

import (
	"math"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/gpufrac/gpufrac/cmd/gpufrac-sim/internal/openb"
)

func TestCurves(t *testing.T) {
	// Capacity 1000: column x is arrived ≈ x×10 milli.
	events := []Event{
		{Arrived: 0, Allocated: 0},
		{Arrived: 10, Allocated: 10, Frag: 5},   // x = 1
		{Arrived: 14, Allocated: 14, Frag: 5},   // x = 1
		{Arrived: 31, Allocated: 20, Frag: 10},  // x = 3
		{Arrived: 50, Allocated: 40, Frag: 20},  // x = 5
		{Arrived: 2000, Allocated: 50, Frag: 0}, // beyond the last column: ignored
	}
	alloc, frag := curves(events, 1000, 5)
	// Columns 2 and 4 have no event of their own: they take x−1..x+1.
	wantAlloc := []float64{0, 1.2, (1 + 1.4 + 2) / 3, 2, (2 + 4) / 2.0, 4}
	wantFrag := []float64{0, 0.5, (0.5 + 0.5 + 1) / 3, 1, (1 + 2) / 2.0, 2}
	opts := []cmp.Option{cmpopts.EquateApprox(0, 1e-12)}
	if diff := cmp.Diff(wantAlloc, alloc, opts...); diff != "" {
		t.Errorf("alloc (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantFrag, frag, opts...); diff != "" {
		t.Errorf("frag (-want +got):\n%s", diff)
	}
	if alloc, _ := curves(nil, 1000, 2); !math.IsNaN(alloc[1]) {
		t.Errorf("no events: column 1 is %v, want NaN", alloc[1])
	}
}

func TestCurvesAreaAndGap(t *testing.T) {
	// Two seeds of two policies over columns 0..4.
	rs := []*Result{
		{Policy: "a", Seed: 1, Alloc: []float64{0, 1, 2, 3, 4}},
		{Policy: "b", Seed: 1, Alloc: []float64{0, 1, 2, 2, 2}},
		{Policy: "a", Seed: 2, Alloc: []float64{0, 1, 2, 3, 2}},
		{Policy: "b", Seed: 2, Alloc: []float64{0, 1, 1, 3, 4}},
	}
	cs := Curves(rs, 1, 4)
	if len(cs) != 2 || cs[0].Policy != "a" || cs[1].Policy != "b" {
		t.Fatalf("Curves: %+v", cs)
	}
	a, b := &cs[0], &cs[1]
	opts := cmpopts.EquateApprox(0, 1e-12)
	// Seed 1 of a: trapezoids over 1..4 = (1.5 + 2.5 + 3.5) / 3 = 2.5; seed 2: (1.5 + 2.5 + 2.5) / 3.
	if diff := cmp.Diff(Stat{Mean: (2.5 + 6.5/3) / 2, SD: math.Sqrt(2) * (2.5 - 6.5/3) / 2, Min: 6.5 / 3, Max: 2.5}, a.Area, opts); diff != "" {
		t.Errorf("area of a (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(Stat{Mean: 3, SD: math.Sqrt(2), Min: 2, Max: 4}, a.At[4], opts); diff != "" {
		t.Errorf("a at column 4 (-want +got):\n%s", diff)
	}
	// Mean curves: a = 0 1 2 3 3, b = 0 1 1.5 2.5 3: a−b is 0 at 1 and 4.
	worst, at, area := Gap(a, b)
	if worst != 0 || at != 1 || math.Abs(area-(a.Area.Mean-b.Area.Mean)) > 1e-12 {
		t.Errorf("Gap(a, b) = %v at %d, area %v", worst, at, area)
	}
	if worst, at, _ := Gap(b, a); worst != -0.5 || at != 2 {
		t.Errorf("Gap(b, a) = %v at %d, want -0.5 at 2", worst, at)
	}
	if !math.IsNaN(Area([]float64{1, 2}, 0, 2)) || !math.IsNaN(Area([]float64{1, 2}, 1, 1)) {
		t.Error("Area outside the curve: want NaN")
	}
}

// loadTrace reads the default openb trace, or skips when it is not there.
func loadTrace(t testing.TB) ([]openb.NodeSpec, []openb.Pod) {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := openb.FindData(wd)
	if err != nil {
		t.Skipf("openb trace not found: %v", err)
	}
	read := func(name string) *os.File {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	nodes, err := openb.ReadNodes(read("openb_node_list_gpu_node.csv"))
	if err != nil {
		t.Fatal(err)
	}
	pods, err := openb.ReadPods(read("openb_pod_list_default.csv"))
	if err != nil {
		t.Fatal(err)
	}
	return nodes, pods
}

// every returns every k-th element of xs.
func every[T any](xs []T, k int) []T {
	var out []T
	for i := 0; i < len(xs); i += k {
		out = append(out, xs[i])
	}
	return out
}

// One seed on a subsample (every 8th node, every 6th pod): the curve's
// invariants hold for every policy.
func TestRunInvariantsOnSubsample(t *testing.T) {
	nodes, pods := loadTrace(t)
	spec := &Spec{Nodes: every(nodes, 8), Pods: every(pods, 6), Inflation: 1.3, Coverage: 0.95}
	for _, policy := range []string{"random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd", "gpufrac", "binpack", "spread"} {
		t.Run(policy, func(t *testing.T) {
			r, err := RunOne(t.Context(), spec, policy, 42)
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Events) == 0 || r.Placed+r.Failed != len(r.Events) {
				t.Fatalf("%d events, %d placed, %d failed", len(r.Events), r.Placed, r.Failed)
			}
			var prev Event
			for k, e := range r.Events {
				switch {
				case e.Arrived < prev.Arrived:
					t.Fatalf("event %d: arrived went down: %d < %d", k, e.Arrived, prev.Arrived)
				case e.Allocated > e.Arrived:
					t.Fatalf("event %d: allocated %d > arrived %d", k, e.Allocated, e.Arrived)
				case e.Allocated > r.Capacity:
					t.Fatalf("event %d: allocated %d > capacity %d", k, e.Allocated, r.Capacity)
				case !e.Placed && e.Allocated != prev.Allocated:
					t.Fatalf("event %d: a failed pod changed the allocation", k)
				case e.Frag < -1e-6 || e.Frag > float64(r.Capacity-e.Allocated)+1e-6:
					t.Fatalf("event %d: frag %v outside 0..idle %d", k, e.Frag, r.Capacity-e.Allocated)
				}
				prev = e
			}
			last := r.Events[len(r.Events)-1]
			if x := float64(last.Arrived) / float64(r.Capacity); x < 1.28 || x > 1.3 {
				t.Errorf("arrived ends at %.3f of capacity, want 1.3 minus at most one pod", x)
			}
			for x, a := range r.Alloc {
				if math.IsNaN(a) || a > 100 || a > float64(x)+1.5 || r.Frag[x] < 0 {
					t.Errorf("column %d: alloc %.2f frag %.2f", x, a, r.Frag[x])
				}
			}
		})
	}
}

// Constraints concentrated on the scarce model (T4, 14 % of the GPUs): a
// fifth of the GPU pods may only use T4. gpufrac once lost 8 points to FGD
// here at x = 100 (flexible pods filled T4 first, the T4-only pods failed
// later; docs/benchmarks-history.md). On a subsample (every 4th node and pod, three
// seeds, about a second) gpufrac must not fall below FGD in the middle of
// the curve, where that loss showed.
func TestScarceModelGuardOnSubsample(t *testing.T) {
	nodes, pods := loadTrace(t)
	variant, err := openb.ParseVariant("gpuspec=0.2,focus=T4,conc=1")
	if err != nil {
		t.Fatal(err)
	}
	base, err := openb.Resample(pods, nodes, variant, 1)
	if err != nil {
		t.Fatal(err)
	}
	spec := &Spec{Nodes: every(nodes, 4), Pods: every(base, 4), Inflation: 1.3, Coverage: 0.95}
	var jobs []Job
	for _, p := range []string{"fgd", "gpufrac"} {
		for _, s := range []uint64{42, 43, 44} {
			jobs = append(jobs, Job{Policy: p, Seed: s})
		}
	}
	rs, err := RunAll(t.Context(), spec, jobs, runtime.GOMAXPROCS(0))
	if err != nil {
		t.Fatal(err)
	}
	for _, col := range []int{70, 85, 100} {
		if g, f := meanAt(rs, "gpufrac", col), meanAt(rs, "fgd", col); g < f {
			t.Errorf("at %d: gpufrac %.2f < fgd %.2f", col, g, f)
		}
	}
}

// published is the FGD paper's default-trace allocation at 100 and 130.
func published() map[string][2]float64 {
	return map[string][2]float64{
		"random": {86.30, 87.47}, "dotprod": {90.62, 90.85}, "gpuclustering": {91.65, 91.88},
		"gpupacking": {91.78, 92.00}, "bestfit": {92.86, 93.08}, "fgd": {95.23, 95.39},
	}
}

func meanAt(rs []*Result, policy string, col int) float64 {
	var sum float64
	n := 0
	for _, r := range rs {
		if r.Policy == policy {
			sum += r.Alloc[col]
			n++
		}
	}
	return sum / float64(n)
}

func seeds() []uint64 {
	var s []uint64
	for x := uint64(42); x <= 51; x++ {
		s = append(s, x)
	}
	return s
}

// The workloads the third, fourth and fifth passes closed
// (docs/benchmarks-history.md, "Third pass", "Fourth pass", "Fifth pass"): at full
// size, mean of seeds 42..51, gpufrac is at or above FGD at every x from 10
// to 130. Before the third pass (the priors at 0.0004 and none), each of its
// seven was below FGD somewhere: scarce 0.1/0.75 by up to 0.057 at x =
// 25-88, the others by 0.000-0.013 at x = 12-31; before the fourth (slot
// charges from π = 0.3 whatever the CPU-only share), cpuonly=0.3 by up to
// 0.058 at x = 79-84; before the fifth (no prior for the slots only one
// model's nodes have the CPU for), cpuonly=0.5 by up to 0.013 at x = 47-51,
// one 8-GPU pod on seed 46.
func TestClosedRowsAtEveryX(t *testing.T) {
	if testing.Short() {
		t.Skip("long: 180 full runs of resampled traces")
	}
	nodes, pods := loadTrace(t)
	for _, v := range []string{"gpuspec=0.1,focus=T4,conc=0.75", "gpuspec=0.1,focus=T4,conc=0.5",
		"gpuspec=0.33,focus=T4,conc=0.25", "gpuspec=0.33,focus=T4,conc=0.5",
		"gpuspec=0.33,focus=T4,conc=0.5,specshare=0", "gpuspec=0.33,focus=T4,conc=0.5,specshare=0.5",
		"gpuspec=0.2,focus=G2,conc=0.5", "cpuonly=0.3", "cpuonly=0.5"} {
		t.Run(v, func(t *testing.T) {
			rs := fgdAndGpufrac(t, nodes, pods, v)
			for col := 10; col <= 130; col++ {
				if g, f := meanAt(rs, "gpufrac", col), meanAt(rs, "fgd", col); g < f-1e-9 {
					t.Errorf("at %d: gpufrac %.3f < fgd %.3f", col, g, f)
				}
			}
		})
	}
}

// The six published policies reproduce the paper's numbers within 0.5
// points (mean of seeds 42..51), and gpufrac meets its targets.
func TestReproducesPublishedPolicies(t *testing.T) {
	if testing.Short() {
		t.Skip("long: 70 full runs of the default trace")
	}
	nodes, pods := loadTrace(t)
	spec := &Spec{Nodes: nodes, Pods: pods, Inflation: 1.3, Coverage: 0.95}
	var jobs []Job
	for _, p := range []string{"random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd", "gpufrac"} {
		for _, s := range seeds() {
			jobs = append(jobs, Job{Policy: p, Seed: s})
		}
	}
	rs, err := RunAll(t.Context(), spec, jobs, runtime.GOMAXPROCS(0))
	if err != nil {
		t.Fatal(err)
	}
	for policy, want := range published() {
		for k, col := range []int{100, 130} {
			if got := meanAt(rs, policy, col); math.Abs(got-want[k]) > 0.5 {
				t.Errorf("%s at %d: %.2f, published %.2f", policy, col, got, want[k])
			}
		}
	}
	if got := meanAt(rs, "gpufrac", 100); got < 95.8 {
		t.Errorf("gpufrac at 100: %.2f, want >= 95.8", got)
	}
	if got := meanAt(rs, "gpufrac", 130); got < 96.0 {
		t.Errorf("gpufrac at 130: %.2f, want >= 96.0", got)
	}
}

// gpufrac beats FGD on resampled workloads, at 100 and at 130, and its
// curve's area (10..130) is at least FGD's.
func TestGpufracBeatsFGDOnVariants(t *testing.T) {
	if testing.Short() {
		t.Skip("long: 220 full runs of resampled traces")
	}
	nodes, pods := loadTrace(t)
	for _, v := range []string{"share=0.6", "share=0.8", "multigpu=0.2", "multigpu=0.4", "gpuspec=0.2", "gpuspec=0.33", "cpuonly=0.3", "cpuonly=0.5",
		"gpuspec=0.2,focus=T4,conc=1", "gpuspec=0.33,focus=T4,conc=0.5", "gpuspec=0.33,focus=T4,conc=0.5,specshare=0"} {
		t.Run(v, func(t *testing.T) {
			rs := fgdAndGpufrac(t, nodes, pods, v)
			for _, col := range []int{100, 130} {
				if g, f := meanAt(rs, "gpufrac", col), meanAt(rs, "fgd", col); g <= f {
					t.Errorf("at %d: gpufrac %.2f <= fgd %.2f", col, g, f)
				}
			}
			cs := Curves(rs, 10, 130)
			if g, f := cs[1].Area.Mean, cs[0].Area.Mean; g < f {
				t.Errorf("area 10..130: gpufrac %.3f < fgd %.3f", g, f)
			}
		})
	}
}

// fgdAndGpufrac runs fgd and gpufrac on the variant v of the trace (resampled
// with seed 1), seeds 42..51, at full size.
func fgdAndGpufrac(t *testing.T, nodes []openb.NodeSpec, pods []openb.Pod, v string) []*Result {
	t.Helper()
	variant, err := openb.ParseVariant(v)
	if err != nil {
		t.Fatal(err)
	}
	base, err := openb.Resample(pods, nodes, variant, 1)
	if err != nil {
		t.Fatal(err)
	}
	spec := &Spec{Nodes: nodes, Pods: base, Inflation: 1.3, Coverage: 0.95}
	var jobs []Job
	for _, p := range []string{"fgd", "gpufrac"} {
		for _, s := range seeds() {
			jobs = append(jobs, Job{Policy: p, Seed: s})
		}
	}
	rs, err := RunAll(t.Context(), spec, jobs, runtime.GOMAXPROCS(0))
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// BenchmarkOpenbRun is one full run of the default trace (seed 42, about
// 10.8k placements on 1,213 nodes), workload construction included.
func BenchmarkOpenbRun(b *testing.B) {
	nodes, pods := loadTrace(b)
	spec := &Spec{Nodes: nodes, Pods: pods, Inflation: 1.3, Coverage: 0.95}
	for _, policy := range []string{"gpufrac", "fgd", "bestfit"} {
		b.Run(policy, func(b *testing.B) {
			for b.Loop() {
				if _, err := RunOne(b.Context(), spec, policy, 42); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
