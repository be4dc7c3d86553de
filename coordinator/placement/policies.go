package placement

import (
	"fmt"
	"math"
	"sort"
)

// policy scores one feasible node for one request. Higher is better.
type policy interface {
	// score returns node i's score for q and, for share requests, the GPU
	// the policy would use there (-1 otherwise).
	score(p *Placer, s *Snapshot, i int, q *req) (float64, int)
	// cacheable reports that score depends only on node i's free resources
	// (and static model) and on q's class, so it may be cached by node
	// generation.
	cacheable() bool
	// usesMemory reports that the score reads q's memory request.
	usesMemory() bool
}

// newPolicy maps a policy name to its implementation; typical is the
// workload mix the fragmentation-aware policies look ahead with.
func newPolicy(name string, typical []Typical) (policy, error) {
	switch name {
	case "random":
		return randomPolicy{}, nil
	case "dotprod":
		return dotProdPolicy{}, nil
	case "gpuclustering":
		return gpuClusteringPolicy{}, nil
	case "gpupacking":
		return gpuPackingPolicy{}, nil
	case "bestfit":
		return bestFitPolicy{}, nil
	case "binpack":
		return binpackPolicy{}, nil
	case "spread":
		return spreadPolicy{}, nil
	case "fgd":
		fm, err := newFragModel(typical)
		if err != nil {
			return nil, fmt.Errorf("policy fgd: %w", err)
		}
		return fgdPolicy{fm: fm}, nil
	case "gpufrac":
		return newGpufracPolicy(typical)
	}
	return nil, fmt.Errorf("unknown policy %q (known: %v)", name, Policies())
}

// Policies lists the policy names New accepts. "gpufrac" is the default;
// random, dotprod, gpuclustering, gpupacking, bestfit and fgd are the
// published baselines of the FGD paper (USENIX ATC'23) as its artifact runs
// them; binpack and spread are plain choices for users.
func Policies() []string {
	names := []string{"random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd", "binpack", "spread", "gpufrac"}
	sort.Strings(names)
	return names
}

// DefaultPolicy is the policy the coordinator uses unless told otherwise.
const DefaultPolicy = "gpufrac"

// Normalisers of the published policies: the largest node in the paper's
// cluster (128 cores, 8 GPUs).
const (
	maxSpecCPU = 128000.0
	maxSpecGPU = 8000.0
	maxScore   = 100
)

// randomPolicy is handled by Place itself (reservoir sampling over feasible
// nodes); score is never called.
type randomPolicy struct{}

func (randomPolicy) score(*Placer, *Snapshot, int, *req) (float64, int) { return 0, -1 }
func (randomPolicy) cacheable() bool                                    { return false }
func (randomPolicy) usesMemory() bool                                   { return false }

// dotProdPolicy is Tetris' alignment score as the artifact runs it (merged
// GPU dimension, normalised by the largest node): 100 × (1 − N·P/2) with
// N = [cpuFree/128000, gpuFree/8000], P = [cpu/128000, gpu/8000]; the
// tightest-fitting GPU for shares.
type dotProdPolicy struct{}

func (dotProdPolicy) score(_ *Placer, s *Snapshot, i int, q *req) (float64, int) {
	st := &s.nodes[i]
	dot := float64(st.cpuFree)/maxSpecCPU*float64(q.cpu)/maxSpecCPU +
		float64(st.totalFree)/maxSpecGPU*float64(q.k*q.m)/maxSpecGPU
	sc := math.Trunc(maxScore * (1 - dot/2))
	return sc, shareGPU(s, i, q)
}
func (dotProdPolicy) cacheable() bool  { return true }
func (dotProdPolicy) usesMemory() bool { return false }

// shareGPU is the tightest-fitting GPU for a share request, -1 otherwise.
func shareGPU(s *Snapshot, i int, q *req) int {
	if !q.share {
		return -1
	}
	return s.tightestGPU(i, q)
}

// gpuClusteringPolicy prefers nodes that already run only pods of the same
// kind (share, or the same whole-GPU count), then mixed nodes holding that
// kind, then empty nodes, then others; inside each band fuller nodes first.
type gpuClusteringPolicy struct{}

func (gpuClusteringPolicy) score(_ *Placer, s *Snapshot, i int, q *req) (float64, int) {
	if q.kind < 0 {
		return 0, -1
	}
	st := &s.nodes[i]
	kinds := 0
	for _, n := range st.kinds {
		if n > 0 {
			kinds++
		}
	}
	fill := int64(maxScore/4) * (maxSpecGPU - int64(st.totalFree)) / maxSpecGPU
	var band int64
	switch {
	case st.kinds[q.kind] > 0 && kinds == 1:
		band = 3
	case st.kinds[q.kind] > 0:
		band = 2
	case kinds == 0:
		band = 1
	}
	return float64(fill + band*maxScore/4), shareGPU(s, i, q)
}
func (gpuClusteringPolicy) cacheable() bool  { return false } // reads kind counts, not in the generation key
func (gpuClusteringPolicy) usesMemory() bool { return false }

// gpuPackingPolicy prefers partly used GPUs, then free GPUs on partly used
// nodes, then empty nodes (fewest GPUs first), as the artifact scores it.
type gpuPackingPolicy struct{}

func (gpuPackingPolicy) score(p *Placer, s *Snapshot, i int, q *req) (float64, int) {
	if q.k == 0 {
		return 0, -1
	}
	st := &s.nodes[i]
	full := int64(st.fullFree)
	if st.fullFree == st.gpuN {
		return float64(max(maxScore/3-full, full)), shareGPU(s, i, q)
	}
	// Take the k GPUs with the least free milli that fit, as the artifact does.
	gpus := append(p.scratch[:0], s.gpus(i)...)
	order := make([]int, len(gpus))
	for g := range order {
		order[g] = g
	}
	sort.SliceStable(order, func(a, b int) bool { return gpus[order[a]] < gpus[order[b]] })
	need, freeUsed := q.k, int64(0)
	var ratio int64
	for _, g := range order {
		if need == 0 {
			break
		}
		if gpus[g] >= q.m {
			need--
			if gpus[g] == MilliPerGPU {
				freeUsed++
			}
			ratio += int64(gpus[g]) * 100 / MilliPerGPU
		}
	}
	if freeUsed > 0 {
		return float64(max(maxScore/2-freeUsed, maxScore/3)), shareGPU(s, i, q)
	}
	return float64(max(maxScore-ratio/10, maxScore/2)), shareGPU(s, i, q)
}
func (gpuPackingPolicy) cacheable() bool  { return true }
func (gpuPackingPolicy) usesMemory() bool { return false }

// bestFitPolicy minimises what is left after placement:
// 100 × (1 − [½(cpuFree−cpu)/128000 + ½(gpuFree−gpu)/8000]), truncated.
// (The artifact then min-max normalises scores, which keeps the argmax.)
type bestFitPolicy struct{}

func (bestFitPolicy) score(_ *Placer, s *Snapshot, i int, q *req) (float64, int) {
	st := &s.nodes[i]
	left := 0.5*float64(st.cpuFree-q.cpu)/maxSpecCPU + 0.5*float64(int64(st.totalFree)-int64(q.k*q.m))/maxSpecGPU
	return math.Trunc(maxScore * (1 - left)), shareGPU(s, i, q)
}
func (bestFitPolicy) cacheable() bool  { return true }
func (bestFitPolicy) usesMemory() bool { return false }

// binpackPolicy fills the fullest nodes first: the share of the node's GPU
// milli in use after placement, CPU share as a tie-breaker; shares go to the
// tightest-fitting GPU.
type binpackPolicy struct{}

func (binpackPolicy) score(_ *Placer, s *Snapshot, i int, q *req) (float64, int) {
	gpuUsed, cpuUsed := usedAfter(s, i, q)
	return gpuUsed + 1e-3*cpuUsed, shareGPU(s, i, q)
}
func (binpackPolicy) cacheable() bool  { return true }
func (binpackPolicy) usesMemory() bool { return false }

// spreadPolicy fills the emptiest nodes first and puts a share on the GPU
// with the most room.
type spreadPolicy struct{}

func (spreadPolicy) score(_ *Placer, s *Snapshot, i int, q *req) (float64, int) {
	gpuUsed, cpuUsed := usedAfter(s, i, q)
	g := -1
	if q.share {
		var gf int32
		for k, f := range s.gpus(i) {
			if f >= q.m && f > gf {
				g, gf = k, f
			}
		}
	}
	return -(gpuUsed + 1e-3*cpuUsed), g
}
func (spreadPolicy) cacheable() bool  { return true }
func (spreadPolicy) usesMemory() bool { return false }

// usedAfter is node i's GPU and CPU share in use once q is placed, 0..1.
func usedAfter(s *Snapshot, i int, q *req) (gpu, cpu float64) {
	st := &s.nodes[i]
	if st.gpuN > 0 {
		gpu = 1 - float64(int64(st.totalFree)-int64(q.k*q.m))/float64(int64(st.gpuN)*MilliPerGPU)
	}
	if m := s.meta[i]; m.CPUMilli > 0 {
		cpu = 1 - float64(st.cpuFree-q.cpu)/float64(m.CPUMilli)
	}
	return gpu, cpu
}
