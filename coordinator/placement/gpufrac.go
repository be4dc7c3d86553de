package placement

import (
	"fmt"
	"math"
)

// Tuning of the gpufrac policy. The values were chosen on the default openb
// trace and checked on resampled variants (more shares, more multi-GPU pods,
// model constraints, more CPU-only pods); see docs/benchmarks.md.
const (
	// gpufracFillRate is k in the hole-value model: a hole that the share
	// P of the typical mix fits is assumed filled before the cluster is full
	// with probability min(1, k·P).
	gpufracFillRate = 40
	// gpufracFragWeight weighs FGD's one-step fragmentation (CPU-aware) in.
	gpufracFragWeight = 0.1
	// gpufracStrandWeight weighs GPU milli stranded by missing CPU or memory.
	gpufracStrandWeight = 0.4
	// gpufracResolution is the score grain in milli-GPU. Coarser than float
	// noise on purpose: candidates within it tie and the node order decides,
	// instead of rounding error picking systematically.
	gpufracResolution = 0.1
)

// gpufracPolicy, gpufrac's default, places a request where the cluster's
// expected waste grows least. The waste of a node is
// W(n) = Σ_g V(free_g) + 0.1·F(n) + 0.4·S(n), where:
//
//   - V(h) is the expected milli of a GPU hole of h milli that will never be
//     filled, from the typical mix: with P the weight of one-GPU typical pods
//     that fit h, the next pod to land there is one of them with probability
//     β = min(1, 40·P), else the hole stays: V(h) = (1−β)·h + β·E[V(h − m)].
//     A fresh GPU is worth V(1000), which is small (a whole pod fills it); an
//     810-milli share leaves 190 milli that only rare small pods fit, so
//     V(190) ≈ 190; a 530 hole is likely to take a 470 share.
//   - F(n) is FGD's fragmentation over the typical mix, model constraints
//     ignored: it adds the CPU view one pod ahead (a GPU is lost when no
//     typical pod has the CPU to use it).
//   - S(n) = max(0, idle GPU milli − min(free CPU/ρ, free memory/μ)) is the
//     GPU milli the node cannot use for lack of CPU or memory. ρ and μ are
//     the CPU and memory the workload's GPU pods ask per GPU milli; a CPU-only
//     request is judged with the whole workload's demand per GPU milli
//     (CPU-only pods included), which keeps more CPU next to idle GPUs.
//
// The score is −(W_after − W_before) at gpufracResolution; shares try every
// GPU with room. Compared with FGD it looks further ahead for shares (where a
// hole will end up, not only whether the next pod fits), steers CPU-only and
// CPU-heavy pods to nodes with CPU to spare, and does not pile flexible pods
// onto the models constrained pods need.
type gpufracPolicy struct {
	fm          *fragModel // FGD's measure, over the model-free typical mix
	hole        []float64  // hole[h] = V(h), h = 0..MilliPerGPU
	cpuPerMilli float64    // ρ; 0 disables CPU stranding
	memPerMilli float64    // μ in bytes; 0 disables memory stranding
	// allCPUPerMilli and allMemPerMilli count CPU-only pods' demand too;
	// CPU-only requests are judged with them.
	allCPUPerMilli, allMemPerMilli float64
}

func newGpufracPolicy(typical []Typical) (policy, error) {
	free := make([]Typical, len(typical))
	var w, cpu, mem, milli, allCPU, allMem float64
	for i, t := range typical {
		allCPU += t.Weight * float64(t.CPUMilli)
		allMem += t.Weight * float64(t.MemoryBytes)
		t.Models = nil // placement's model filter is exact; F's model term misleads
		free[i] = t
		w += t.Weight
		if t.GPUs > 0 { // what GPU pods need alongside their GPUs
			cpu += t.Weight * float64(t.CPUMilli)
			mem += t.Weight * float64(t.MemoryBytes)
			milli += t.Weight * float64(t.GPUs*t.MilliPerGPU)
		}
	}
	fm, err := newFragModel(free)
	if err != nil {
		return nil, fmt.Errorf("policy gpufrac: %w", err)
	}
	g := gpufracPolicy{fm: fm, hole: holeValues(free, w)}
	if milli > 0 {
		g.cpuPerMilli, g.memPerMilli = cpu/milli, mem/milli
		g.allCPUPerMilli, g.allMemPerMilli = allCPU/milli, allMem/milli
	}
	return g, nil
}

// holeValues computes V(h) for h = 0..MilliPerGPU (see gpufracPolicy).
func holeValues(typical []Typical, total float64) []float64 {
	v := make([]float64, MilliPerGPU+1)
	for h := 1; h <= MilliPerGPU; h++ {
		var p, next float64
		for _, t := range typical {
			if t.GPUs == 1 && t.MilliPerGPU <= h {
				p += t.Weight
				next += t.Weight * v[h-t.MilliPerGPU]
			}
		}
		if p == 0 || total == 0 {
			v[h] = float64(h)
			continue
		}
		beta := math.Min(1, gpufracFillRate*p/total)
		v[h] = (1-beta)*float64(h) + beta*next/p
	}
	return v
}

func (g gpufracPolicy) compile(s *Snapshot) { g.fm.compile(s) }

func (g gpufracPolicy) nodeCost(s *Snapshot, i int) float64 {
	st := &s.nodes[i]
	return g.holeWaste(st.model, st.cpuFree, s.gpus(i))
}

// holeWaste is the hole and fragmentation part of W(n); it is cached per
// node generation (nodeCost) as it is the expensive part.
func (g gpufracPolicy) holeWaste(model int32, cpu int64, gpus []int32) float64 {
	var w float64
	for _, f := range gpus {
		w += g.hole[f]
	}
	return w + gpufracFragWeight*g.fm.nodeFrag(model, cpu, gpus)
}

// strand is the stranding part of W(n) at ρ (rho) and μ (mu).
func strand(idle int32, cpu, mem int64, rho, mu float64) float64 {
	if rho <= 0 || idle <= 0 {
		return 0
	}
	usable := float64(cpu) / rho
	if mu > 0 {
		usable = math.Min(usable, float64(mem)/mu)
	}
	return gpufracStrandWeight * math.Max(0, float64(idle)-usable)
}

func (g gpufracPolicy) score(p *Placer, s *Snapshot, i int, q *req) (float64, int) {
	st := &s.nodes[i]
	rho, mu := g.cpuPerMilli, g.memPerMilli
	if q.k == 0 {
		rho, mu = g.allCPUPerMilli, g.allMemPerMilli
	}
	before := p.nodeCost(s, i, g) + strand(st.totalFree, st.cpuFree, st.memFree, rho, mu)
	idle := st.totalFree - q.k*q.m
	gpus := append(p.scratch[:0], s.gpus(i)...)
	score := func() float64 {
		after := g.holeWaste(st.model, st.cpuFree-q.cpu, gpus) + strand(idle, st.cpuFree-q.cpu, st.memFree-q.mem, rho, mu)
		return math.Floor((before-after)/gpufracResolution) * gpufracResolution
	}
	return scoreAfter(gpus, q, score)
}
func (gpufracPolicy) cacheable() bool  { return true }
func (gpufracPolicy) usesMemory() bool { return true }
