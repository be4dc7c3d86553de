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
	// gpufracSlotPressureFrom is where the charge for breaking a k-GPU slot
	// starts. Slots are counted with the CPU their demand asks and against
	// the free GPU milli the cluster's CPU can still serve, so their π
	// rises only where k-GPU pods will really lack room; from 0.5, the
	// multigpu=0.2 workload stayed 0.013 below FGD at x = 92.
	gpufracSlotPressureFrom = 0.3
	// gpufracSlotPressureFromCPU and gpufracSlotPressureFullCPU replace 0.3
	// and 1 as the start and the end of the slot charges' ramp when CPU-only
	// pods ask a large share of the workload's CPU: from
	// gpufracCPUOnlyShareFull (0.42) of the CPU asked so far, linearly from
	// gpufracCPUOnlyShareFrom (0.35). There CPU runs out before the GPUs
	// (the CPU knee, near x = 50 on cpuonly=0.5, 80 on cpuonly=0.3), and
	// k-GPU pods find no node with the GPUs and the CPU free earlier than
	// under FGD unless slots are kept whole from lower pressure; the longer
	// ramp limits what that costs after the knee. CPU-only pods ask 0.23–0.27
	// of the CPU on the default trace and the other families (0.15–0.34 of
	// what was seen so far, during a run), 0.45 (0.42–0.48) on cpuonly=0.3
	// and 0.65 on cpuonly=0.5; docs/benchmarks-history.md, "Fourth pass".
	gpufracSlotPressureFromCPU = 0.1
	gpufracSlotPressureFullCPU = 2.0
	gpufracCPUOnlyShareFrom    = 0.35
	gpufracCPUOnlyShareFull    = 0.42
	// gpufracSlotPrior is the share of all GPU demand assumed to be k-GPU
	// pods that only one model can host, for each model and k = 2, 4, 8,
	// whether or not any was seen: if it keeps that share while the
	// cluster fills, N such pods will come, N Poisson with mean
	// φ0·F/(k·1000), and breaking a model's k-GPU slot when it has n left
	// costs k·1000·P(N ≥ n). On the openb cluster (F ≈ 6.2M milli empty)
	// the mean is 1.6 8-GPU pods: 0.79 of 8·1000 for a model's last 8-GPU
	// slot, 0.46 for the last but one, 0.07 for the fourth-last; less as F
	// falls. The first pod of a small class (an 8-GPU pod only the eight
	// 8-GPU V100M16 nodes can host) often comes before its demand can
	// raise any pressure, and found every slot of its model taken. On a
	// small cluster F is small, and the prior is too: it never outweighs
	// demand that was seen. The same share is assumed, separately, for
	// k-GPU pods asking more CPU than any other model's nodes with k GPUs
	// have (onlyModelCPU): on openb only the 39 128-core G3 nodes host an
	// 8-GPU pod asking 97–128 cores, and on cpuonly=0.5 one asking 120
	// found no such G3 slot left at x = 46.9 where FGD placed it, the one
	// pod that kept gpufrac below FGD there (docs/benchmarks-history.md, "Fifth
	// pass").
	gpufracSlotPrior = 0.002
	// gpufracGPUPrior is the same prior for one-GPU pods (a share or one
	// whole GPU) that only one model can host: each model's last fully free
	// GPUs are charged 1000·P(N ≥ n), N Poisson with mean φ1·F/1000 (3.1
	// pods on the empty openb cluster: 0.96 of 1000 for the last, 0.6 for
	// the third-last, 0.1 for the sixth-last), and so, separately, are its
	// fully free GPUs on nodes with more CPU than each smaller node type of
	// the model has (a slot of one GPU and that CPU plus one core): a
	// P100-only pod asking 18 cores has only the 22 P100 nodes with 64
	// cores, not the 107 with 16, and the first one came at x = 4–16, when
	// flexible pods had taken them all. With this prior and the one above
	// at 0.0004, seven scarce-model workloads stayed below FGD early in the
	// curve (docs/benchmarks-history.md, "Third pass").
	gpufracGPUPrior = 0.0005
	// gpufracCPUOnlyTie is what a CPU-only request's score loses per fully
	// free GPU on the node: well under the score grain, so it only breaks
	// ties, towards nodes whose GPUs are in use. Past the CPU knee of the
	// cpuonly workloads it is worth 0.3–0.9 points against no tie-break;
	// the opposite one, spreading CPU-only pods over lightly used nodes,
	// narrows the gap to FGD at the knee by 0.06–0.12 and gives up 0.4–0.9
	// points after it (docs/benchmarks-history.md).
	gpufracCPUOnlyTie = 0.001
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
	before := p.nodeCost(s, i) + strand(st.totalFree, st.cpuFree, st.memFree, rho, mu)
	idle := st.totalFree - q.k*q.m
	gpus := append(p.scratch[:0], s.gpus(i)...)
	score := func() float64 {
		after := g.holeWaste(st.model, st.cpuFree-q.cpu, gpus) + strand(idle, st.cpuFree-q.cpu, st.memFree-q.mem, rho, mu)
		sc := math.Floor((before-after)/gpufracResolution) * gpufracResolution
		if q.k == 0 {
			sc -= gpufracCPUOnlyTie * float64(st.fullFree)
		}
		return sc
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
//   - By slot: k-GPU pods need k fully free GPUs and their CPU on one node.
//     For the k-GPU demand of a set of models (or of all models), level by
//     level of the CPU it asks, C is k·1000 times the slots of those
//     models' nodes that have the k GPUs and that CPU free, and F counts
//     only the free milli the free CPU can serve; a placement pays for each
//     slot it breaks, by taking GPUs or CPU, so CPU-only requests pay too
//     (slotCharges). Charges start at π = 0.3, or lower where CPU-only pods
//     ask much of the CPU (slotRamp).
//   - Prior: whether or not any was seen, a few k-GPU pods that only one
//     model can host are expected, by their model list or by the CPU they
//     ask, so each model's last k-GPU slots are charged, and its last
//     k-GPU slots with more CPU than other models' nodes have
//     (gpufracSlotPrior).
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
	return g.slotCharges(s, c) || any
}

// slotQuery is one level of k-GPU demand: the models that can host it (nil:
// any), k, the CPU it asks, and the cluster's slots for it (counted).
type slotQuery struct {
	models []int32
	k      int32
	cpu    int64
	milli  int64 // demand at this level
	slots  int64
}

// slotCharges adds the charges for breaking k-GPU slots: for the k-GPU
// demand of each set of models (or of all), level by level of the CPU it
// asks. A slot at level l (k fully free GPUs and the CPU of l's requests) is
// worth W_l = max over levels j ≤ l of pressure(π_j)·k·1000, where π_j is
// the demand asking at least j's CPU against the slots with that CPU; a
// placement pays, for each level, W_l − W_(l−1) per slot of that level it
// breaks, by taking GPUs or CPU (CPU-only requests too).
func (g gpufracPolicy) slotCharges(s *Snapshot, c *charges) bool {
	d := &s.demand
	qs := c.queries[:0]
	add := func(models []int32, levels *[MaxKindGPUs + 1][]cpuLevel) {
		for k := 2; k <= MaxKindGPUs; k++ {
			for _, l := range levels[k] {
				qs = append(qs, slotQuery{models: models, k: int32(k), cpu: l.cpu, milli: l.milli})
			}
		}
	}
	add(nil, &d.multiCPU)
	for i := range d.sets {
		add(d.sets[i].models, &d.sets[i].multiCPU)
	}
	nq := len(qs)
	qs = append(qs, c.priorQueries(s)...)
	c.queries = qs
	if len(qs) == 0 {
		return false
	}
	// free is the GPU milli the free CPU can still serve (at ρ per milli).
	free := float64(c.counts.count(s, qs, g.cpuPerMilli))
	from, full := slotRamp(d)
	any := false
	for _, q := range qs[nq:] {
		if q.slots == 0 {
			continue
		}
		size := float64(q.k * MilliPerGPU)
		phi := gpufracSlotPrior
		if q.k == 1 {
			phi = gpufracGPUPrior
		}
		if w := grain(size * poissonTail(phi*free/size, q.slots)); w > 0 {
			any = true
			c.chargeSlot(int(q.models[0]), q.k, q.cpu, w)
		}
	}
	qs = qs[:nq]
	for j := 0; j < len(qs); {
		// qs[j:e] are the levels of one set and k, by ascending CPU.
		e := j + 1
		var rest int64 = qs[j].milli
		for e < len(qs) && qs[e].k == qs[j].k && slices.Equal(qs[e].models, qs[j].models) {
			rest += qs[e].milli
			e++
		}
		size := float64(qs[j].k * MilliPerGPU)
		var worth float64
		for ; j < e; j++ {
			q := &qs[j]
			pi := math.Inf(1)
			if q.slots > 0 {
				pi = float64(rest) / float64(d.total) * free / (size * float64(q.slots))
			}
			rest -= q.milli
			w := grain(rampTo(pi, from, full) * size)
			if dw := w - worth; dw > 0 {
				worth += dw
				any = true
				for m := range c.perSlot {
					if q.models == nil || slices.Contains(q.models, int32(m)) {
						c.chargeSlot(m, q.k, q.cpu, dw)
					}
				}
			}
		}
	}
	return any
}

// priorQueries are the prior's slots (see gpufracSlotPrior and
// gpufracGPUPrior): every model's own k-GPU slots (cpu 0), its fully free
// GPUs, its fully free GPUs with more CPU than each of its smaller node
// types has (one core more), and its k-GPU slots (k = 1, 2, 4, … up to its
// nodes' GPUs and MaxKindGPUs) with more CPU than any other model's node
// with k GPUs has (one core more), which k-GPU pods asking that CPU can use
// and no other node. They depend on the
// snapshot's node types only, so they are built once per node types (a
// snapshot and its clones share them), not per request: on a cluster of many
// node types (many models, or nodes whose allocatable memory differs) the
// build is O(types²).
func (c *charges) priorQueries(s *Snapshot) []slotQuery {
	if len(s.htypes) == 0 {
		return nil
	}
	if c.priorOf == &s.htypes[0] && c.priorLen == len(s.htypes) {
		return c.prior
	}
	qs := c.prior[:0]
	for m := range s.models {
		var most int32
		first := len(qs)
		for _, ht := range s.htypes {
			if ht.model != int32(m) {
				continue
			}
			most = max(most, ht.gpus)
			if !bigger(s.htypes, ht) {
				continue // the largest: no pod is too big for it alone
			}
			cpu := ht.cpu + 1000
			if !slices.ContainsFunc(qs[first:], func(q slotQuery) bool { return q.cpu == cpu }) {
				qs = append(qs, slotQuery{models: c.model(m), k: 1, cpu: cpu})
			}
		}
		if most > 0 {
			qs = append(qs, slotQuery{models: c.model(m), k: 1})
		}
		for k := int32(1); k <= most && k <= MaxKindGPUs; k *= 2 {
			if k > 1 {
				qs = append(qs, slotQuery{models: c.model(m), k: k})
			}
			cpu, ok := onlyModelCPU(s.htypes, int32(m), k)
			if ok && !slices.ContainsFunc(qs[first:], func(q slotQuery) bool { return q.k == k && q.cpu == cpu }) {
				qs = append(qs, slotQuery{models: c.model(m), k: k, cpu: cpu})
			}
		}
	}
	c.prior, c.priorOf, c.priorLen = qs, &s.htypes[0], len(s.htypes)
	return qs
}

// slotRamp is where the slot charges start (from) and where they are full
// (full), by the CPU-only share of the CPU demand seen so far: (0.3, 1) up
// to gpufracCPUOnlyShareFrom, (0.1, 2) from gpufracCPUOnlyShareFull, linear
// between (see gpufracSlotPressureFromCPU).
func slotRamp(d *demandBook) (from, full float64) {
	var share float64
	if t := d.cpuOnly + d.gpuCPU; t > 0 {
		share = float64(d.cpuOnly) / float64(t)
	}
	f := math.Min(1, math.Max(0, (share-gpufracCPUOnlyShareFrom)/(gpufracCPUOnlyShareFull-gpufracCPUOnlyShareFrom)))
	from = gpufracSlotPressureFrom + f*(gpufracSlotPressureFromCPU-gpufracSlotPressureFrom)
	full = gpufracPressureFull + f*(gpufracSlotPressureFullCPU-gpufracPressureFull)
	return from, full
}

// onlyModelCPU is the CPU from which model m's nodes are the only ones able
// to host a k-GPU request: one core more than the most any other model's
// node with k GPUs has. ok is false when no node of m with k GPUs has that
// much, or when no other model has a node with k GPUs (m's own k-GPU slots, the
// prior at cpu 0, are that class already).
func onlyModelCPU(types []hostType, m, k int32) (cpu int64, ok bool) {
	mine, other := int64(-1), int64(-1) // none yet: allocatable CPU is never negative
	for _, ht := range types {
		switch {
		case ht.gpus < k:
		case ht.model == m:
			mine = max(mine, ht.cpu)
		default:
			other = max(other, ht.cpu)
		}
	}
	if other < 0 || mine-other < 1000 { // no slot of m has one core more (and other+1000 cannot wrap)
		return 0, false
	}
	return other + 1000, true
}

// bigger reports whether a node type of ht's model has more CPU than ht.
func bigger(types []hostType, ht hostType) bool {
	return slices.ContainsFunc(types, func(o hostType) bool { return o.model == ht.model && o.cpu > ht.cpu })
}

// poissonTail is P(N ≥ n) for N Poisson with mean lambda.
func poissonTail(lambda float64, n int64) float64 {
	if n <= 0 {
		return 1
	}
	if float64(n) > lambda+12*math.Sqrt(lambda)+12 {
		return 0
	}
	term := math.Exp(-lambda) // P(N = 0)
	cdf := term
	for i := int64(1); i < n; i++ {
		term *= lambda / float64(i)
		cdf += term
	}
	return math.Max(0, 1-cdf)
}

// pressure maps a pressure π to the share of taken capacity charged as lost.
func pressure(pi float64) float64 { return ramp(pi, gpufracPressureFrom) }

// ramp is 0 up to π = from, 1 from π = gpufracPressureFull, linear between.
func ramp(pi, from float64) float64 { return rampTo(pi, from, gpufracPressureFull) }

// rampTo is 0 up to π = from, 1 from π = full, linear between.
func rampTo(pi, from, full float64) float64 {
	return math.Min(1, math.Max(0, (pi-from)/(full-from)))
}

// grain floors a charge to the score grain, so that charges keep ties ties.
func grain(x float64) float64 {
	return math.Floor(x/gpufracResolution) * gpufracResolution
}
