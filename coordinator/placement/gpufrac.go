package placement

import (
	"fmt"
	"math"
	"slices"
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
	// gpufracPressureFrom and gpufracPressureFull map a pressure π (the
	// demand that only some capacity can host, over that capacity; see
	// charges) to the share of the capacity a placement takes that is
	// charged as lost: none up to π = 0.5, all from π = 1, linear between.
	// Below 0.5 the constrained demand leaves room to spare and a charge
	// would only bend placement away from what packs best (a linear charge
	// from π = 0 lost 0.8 points at 100 on the default trace).
	gpufracPressureFrom = 0.5
	gpufracPressureFull = 1.0
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
// The score is −(W_after − W_before) at gpufracResolution, minus the
// charges for capacity that constrained demand will need (see charges), which
// come from the live demand (Snapshot.AddDemand) and are not cached; shares
// try every GPU with room. Compared with FGD it looks further ahead for
// shares (where a hole will end up, not only whether the next pod fits),
// steers CPU-only and CPU-heavy pods to nodes with CPU to spare, and keeps
// flexible pods off the models, and the multi-GPU slots, that constrained
// demand needs, in proportion to how much of it there is.
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

// charges charges a request for capacity that constrained demand will need,
// from the demand the snapshot was told about (Snapshot.AddDemand). Both
// charges use the pressure of some demand on the capacity only it can use:
// π = φ·F/C, where φ is that demand's share of all GPU demand, F the
// cluster's free milli and C the free capacity the demand can use. If the
// demand keeps its share while the cluster fills, it will ask φ·F more: at
// π ≥ 1 it uses up C by itself, so each milli another pod takes from C is a
// milli of it that will not fit later (charged in full); below 0.5 there is
// room to spare (no charge).
//
//   - By model: demand that only some GPU models can host (a model list, or
//     more GPUs, CPU or memory than other models' nodes have) is split over
//     its models in proportion to their free milli; C is a model's free
//     milli. A placement on a node of model M pays for the milli it takes.
//   - By slot: k-GPU pods need k fully free GPUs on one node. For the k-GPU
//     demand of a set of models (or of all models), C is k·1000 times the
//     k-GPU slots of those models' nodes; a placement pays k·1000 for each
//     such slot it breaks.
//
// A request that can only go to one model pays the same everywhere it can
// go, so the charges only steer the requests that have a choice. Without
// constrained demand (the default openb trace has no model constraints and
// few pods too large for most nodes) they are zero or rare.
func (g gpufracPolicy) charges(s *Snapshot, q *req, c *charges) bool {
	d := &s.demand
	if d.total == 0 || s.freeMilli <= 0 {
		return false
	}
	// Constrained demand by model (its share of the sets it belongs to).
	out := c.byModel
	for _, set := range d.sets {
		var free int64
		for _, m := range set.models {
			free += s.modelFree[m]
		}
		if free <= 0 {
			continue
		}
		for _, m := range set.models {
			out[m] += float64(set.milli) * float64(s.modelFree[m]) / float64(free)
		}
	}
	any := false
	milli := float64(q.k * q.m)
	for m := range out {
		dm := out[m]
		out[m] = 0
		if dm == 0 || s.modelFree[m] <= 0 {
			continue
		}
		pi := dm / float64(d.total) * float64(s.freeMilli) / float64(s.modelFree[m])
		out[m] = grain(pressure(pi) * min(milli, float64(s.modelFree[m])))
		any = any || out[m] != 0
	}
	// Flexible k-GPU demand against every slot, constrained demand against
	// its models' slots.
	any = slotCharges(d.multi, nil, s, c, d.total) || any
	for _, set := range d.sets {
		any = slotCharges(set.multi, set.models, s, c, d.total) || any
	}
	return any
}

// slotCharges adds, for k-GPU demand multi that only models can host (nil:
// any model), the charge for breaking one of their k-GPU slots.
func slotCharges(multi [MaxKindGPUs + 1]int64, models []int32, s *Snapshot, c *charges, total int64) bool {
	any := false
	for k := 2; k <= MaxKindGPUs; k++ {
		if multi[k] == 0 {
			continue
		}
		slots := s.allSlots[k]
		if models != nil {
			slots = 0
			for _, m := range models {
				slots += s.slots[m][k]
			}
		}
		size := float64(k * MilliPerGPU)
		pi := math.Inf(1)
		if slots > 0 {
			pi = float64(multi[k]) / float64(total) * float64(s.freeMilli) / (size * float64(slots))
		}
		w := grain(pressure(pi) * size)
		if w == 0 {
			continue
		}
		any = true
		for m := range c.perSlot {
			if models == nil || slices.Contains(models, int32(m)) {
				c.chargeSlot(m, int32(k), w)
			}
		}
	}
	return any
}

// pressure maps a pressure π to the share of taken capacity charged as lost.
func pressure(pi float64) float64 {
	return math.Min(1, math.Max(0, (pi-gpufracPressureFrom)/(gpufracPressureFull-gpufracPressureFrom)))
}

// grain floors a charge to the score grain, so that charges keep ties ties.
func grain(x float64) float64 {
	return math.Floor(x/gpufracResolution) * gpufracResolution
}
