package placement

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
)

// Options configure a Placer.
type Options struct {
	// Seed drives every random choice (the random policy). Same seed, same
	// snapshot, same requests: same decisions.
	Seed uint64
	// Typical is the workload's typical pod mix that fragmentation-aware
	// policies (fgd, gpufrac) look ahead with. TypicalFromRequests builds it.
	// Without it those policies fall back to a mix of one whole GPU and the
	// common shares.
	Typical []Typical
}

// Placer places requests with one policy. It keeps score caches keyed by
// node generation, so it is fastest when used on one snapshot (and its
// clones) for many requests. A Placer is not safe for concurrent use.
type Placer struct {
	name   string
	policy policy
	rng    *rand.Rand

	// Score cache: (snapshot family, node, generation, request class) -> score.
	cacheSrc *genSource
	classes  map[reqKey]int32 // request class -> row of cache
	cache    [][]cacheEntry   // row -> node index -> entry
	// costCache is the policy's per-node cost (nodeCoster), by node index.
	costCache []costEntry

	scratch []int32 // GPU free values of a node being scored
	// charges is the charger's scratch for the request being placed.
	charges charges
	// cands and filtered are Place's scratch for a request with a Filter
	// (every node that fits, and the Filter's reasons by node): kept, since
	// a cycle places thousands of such requests over thousands of nodes.
	cands    []candidate
	filtered [][]string
}

type cacheEntry struct {
	gen   uint64
	score float64
	gpu   int32
}

type costEntry struct {
	gen  uint64
	cost float64
}

// maxCacheEntries bounds the score cache (24 bytes each).
const maxCacheEntries = 1 << 20

// New returns a Placer running the named policy (see Policies).
func New(policyName string, opts Options) (*Placer, error) {
	typical := opts.Typical
	if len(typical) == 0 {
		typical = defaultTypical()
	}
	pol, err := newPolicy(policyName, typical)
	if err != nil {
		return nil, fmt.Errorf("creating placer: %w", err)
	}
	return &Placer{
		name:    policyName,
		policy:  pol,
		rng:     rand.New(rand.NewPCG(opts.Seed, 0x9e3779b97f4a7c15)),
		scratch: make([]int32, 0, 16),
	}, nil
}

// Policy is the name of the Placer's policy.
func (p *Placer) Policy() string { return p.name }

// req is a validated request in the form the hot loop uses.
type req struct {
	r     *Request
	cpu   int64
	mem   int64
	k     int32 // GPUs needed: 0 CPU-only, 1 for a share
	m     int32 // milli taken from each of them
	share bool
	kind  int
	key   reqKey
	// scal are the scalar resources asked for (nil: none). Policies never
	// read them, so they are not part of key.
	scal []scalarAsk
}

// reqKey is what a cached score may depend on.
type reqKey struct {
	cpu, mem int64
	k, m     int32
	share    bool
}

func makeReq(r *Request) req {
	q := req{r: r, cpu: r.CPUMilli, mem: r.MemoryBytes, kind: r.kind()}
	switch {
	case r.ShareMilli > 0:
		q.k, q.m, q.share = 1, int32(r.ShareMilli), true
	case r.GPUs > 0:
		q.k, q.m = int32(r.GPUs), MilliPerGPU
	}
	q.key = reqKey{cpu: q.cpu, mem: q.mem, k: q.k, m: q.m, share: q.share}
	return q
}

// fits reports whether node i has the CPU, memory and GPUs for q
// (eligibility aside; scalar resources are part of eligibility, see
// withScalars). It must stay small enough to be inlined into Place's loop.
func (s *Snapshot) fits(i int, q *req) bool {
	st := &s.nodes[i]
	if st.cpuFree < q.cpu || st.memFree < q.mem {
		return false
	}
	if q.share {
		return st.maxFree >= q.m
	}
	return st.fullFree >= q.k
}

// Place chooses a node and GPUs for r on s without changing s (call Assume
// to take the resources). Ties go to the node that comes first in the
// snapshot. When nothing fits it returns an *UnschedulableError.
func (p *Placer) Place(s *Snapshot, r *Request) (Decision, error) {
	if err := r.Validate(); err != nil {
		return Decision{}, fmt.Errorf("placing request: %w", err)
	}
	q := makeReq(r)
	q.scal = s.scalarAsks(r)
	elig := s.eligibilityFor(r)
	if q.scal != nil {
		elig = s.withScalars(elig, q.scal)
	}
	if elig != nil && !elig.any {
		return Decision{}, p.explain(s, &q, elig, nil)
	}
	p.prepare(s)
	// filtered: node -> the Filter's reasons against it (nil: allowed or
	// not asked), allocated on the first rejection.
	var filtered [][]string
	allowed := func(i int) bool {
		if r.Filter == nil {
			return true
		}
		if filtered != nil && filtered[i] != nil {
			return false
		}
		ok, why := r.Filter.Allows(s.meta[i].Name)
		if !ok {
			if len(why) == 0 {
				why = []string{"node(s) " + ReasonFilter.describe()}
			}
			if filtered == nil {
				filtered = p.filteredFor(len(s.nodes))
			}
			filtered[i] = why
		}
		return ok
	}

	best, bestGPU := -1, -1
	bestScore := math.Inf(-1)
	if _, random := p.policy.(randomPolicy); random {
		seen := 0
		for i := range s.nodes {
			if elig.ok(i) && s.fits(i, &q) && allowed(i) {
				seen++
				if p.rng.IntN(seen) == 0 {
					best = i
				}
			}
		}
		if best >= 0 {
			bestScore = 0
			bestGPU = p.randomGPU(s, best, &q)
		}
	} else {
		row := p.cacheRow(s, &q)
		ch := p.chargesFor(s, &q)
		cands := p.cands[:0] // with a Filter: every node that fits, scored
		defer func() { p.cands = cands[:0] }()
		for i := range s.nodes {
			if !elig.ok(i) || !s.fits(i, &q) {
				continue
			}
			var sc float64
			var g int
			if row != nil {
				e := &row[i]
				if e.gen != s.nodes[i].gen {
					sc, g = p.policy.score(p, s, i, &q)
					*e = cacheEntry{gen: s.nodes[i].gen, score: sc, gpu: int32(g)}
				}
				sc, g = float64(e.score), int(e.gpu)
			} else {
				sc, g = p.policy.score(p, s, i, &q)
			}
			if ch != nil {
				sc -= ch.at(s, i, &q, g)
			}
			if r.Filter != nil {
				cands = append(cands, candidate{i: i, gpu: g, score: sc})
			}
			if sc > bestScore {
				best, bestGPU, bestScore = i, g, sc
			}
		}
		if r.Filter != nil && best >= 0 && !allowed(best) {
			// The rest best first (the first in the snapshot on a tie, as
			// above): a filter that allows the best node is asked once, and
			// the list is sorted only when it does not.
			best, bestGPU, bestScore = -1, -1, math.Inf(-1)
			sort.SliceStable(cands, func(a, b int) bool { return cands[a].score > cands[b].score })
			for _, c := range cands {
				if allowed(c.i) {
					best, bestGPU, bestScore = c.i, c.gpu, c.score
					break
				}
			}
		}
	}
	if best < 0 {
		return Decision{}, p.explain(s, &q, elig, filtered)
	}
	return s.decision(best, bestGPU, bestScore, &q), nil
}

// filteredFor is Place's filtered scratch for n nodes, every entry nil.
func (p *Placer) filteredFor(n int) [][]string {
	if cap(p.filtered) < n {
		p.filtered = make([][]string, n)
	}
	f := p.filtered[:n]
	clear(f)
	return f
}

// candidate is a node that fits a request, with its score and GPU.
type candidate struct {
	i, gpu int
	score  float64
}

// charger is a policy that charges a request, on top of its cached per-node
// score, for capacity it takes that other demand will need: what that costs
// depends on the whole cluster (free capacity and demand), not on one node,
// so it cannot be cached by node generation.
type charger interface {
	// charges fills c for q and reports whether any charge is non-zero.
	charges(s *Snapshot, q *req, c *charges) bool
}

// chargesFor returns the policy's charges for q, nil when it has none.
func (p *Placer) chargesFor(s *Snapshot, q *req) *charges {
	ch, ok := p.policy.(charger)
	if !ok || len(s.models) == 0 || !s.demand.constrained() {
		return nil
	}
	c := &p.charges
	c.reset(len(s.models))
	if !ch.charges(s, q, c) {
		return nil
	}
	return c
}

// compiler is a policy with data to resolve against a snapshot's models.
type compiler interface{ compile(s *Snapshot) }

// nodeCoster is a policy with a per-node cost that depends only on the
// node's free resources, cached by generation (nodeCost).
type nodeCoster interface {
	nodeCost(s *Snapshot, i int) float64
}

// prepare resets the caches when s belongs to another snapshot family.
func (p *Placer) prepare(s *Snapshot) {
	if p.cacheSrc == s.src && len(p.costCache) == len(s.nodes) {
		return
	}
	p.cacheSrc = s.src
	p.classes = map[reqKey]int32{}
	p.cache = p.cache[:0]
	if len(p.costCache) == len(s.nodes) {
		clear(p.costCache) // gens start at 1: a zero entry holds nothing
	} else {
		p.costCache = make([]costEntry, len(s.nodes))
	}
	if c, ok := p.policy.(compiler); ok {
		c.compile(s)
	}
}

// cacheRow returns the score cache row for q's class, nil if the policy's
// scores cannot be cached.
func (p *Placer) cacheRow(s *Snapshot, q *req) []cacheEntry {
	if !p.policy.cacheable() {
		return nil
	}
	key := q.key
	if !p.policy.usesMemory() {
		key.mem = 0
	}
	if id, ok := p.classes[key]; ok {
		return p.cache[id]
	}
	if (len(p.cache)+1)*len(s.nodes) > maxCacheEntries {
		p.classes = map[reqKey]int32{}
		p.cache = p.cache[:0]
	}
	p.classes[key] = int32(len(p.cache))
	// A row of an earlier snapshot or class is cleared and used again:
	// the rows were a busy cycle's largest allocation after the snapshot.
	// Rows are used within one Place call, which asks for one row.
	if n := len(p.cache); n < cap(p.cache) {
		if row := p.cache[:n+1][n]; len(row) == len(s.nodes) {
			clear(row)
			p.cache = p.cache[:n+1]
			return row
		}
	}
	p.cache = append(p.cache, make([]cacheEntry, len(s.nodes)))
	return p.cache[len(p.cache)-1]
}

// nodeCost is the policy's (a nodeCoster) cost of node i as it is now,
// cached by generation.
func (p *Placer) nodeCost(s *Snapshot, i int) float64 {
	e := &p.costCache[i]
	if e.gen != s.nodes[i].gen {
		// The policy as held: passing a policy value as a nodeCoster would
		// box a copy on every call (a busy cycle scores thousands of nodes).
		*e = costEntry{gen: s.nodes[i].gen, cost: p.policy.(nodeCoster).nodeCost(s, i)}
	}
	return e.cost
}

// decision turns the chosen node (and GPU for shares) into a Decision.
func (s *Snapshot) decision(i, gpu int, score float64, q *req) Decision {
	d := Decision{Node: s.meta[i].Name, NodeIndex: i, MilliPerGPU: int(q.m), Score: score}
	switch {
	case q.share:
		d.GPUIndices = []int{gpu}
	case q.k > 0:
		d.GPUIndices = make([]int, 0, q.k)
		for g, f := range s.gpus(i) {
			if f == MilliPerGPU && len(d.GPUIndices) < int(q.k) {
				d.GPUIndices = append(d.GPUIndices, g)
			}
		}
	}
	if len(d.GPUIndices) > 0 {
		d.GPUs = make([]string, len(d.GPUIndices))
		for k, g := range d.GPUIndices {
			d.GPUs[k] = s.meta[i].GPUs[g].ID
		}
	}
	return d
}

// randomGPU picks a uniformly random GPU with room for a share.
func (p *Placer) randomGPU(s *Snapshot, i int, q *req) int {
	if !q.share {
		return -1
	}
	pick, seen := -1, 0
	for g, f := range s.gpus(i) {
		if f >= q.m {
			seen++
			if p.rng.IntN(seen) == 0 {
				pick = g
			}
		}
	}
	return pick
}

// explain builds the error for a request no node can host, with the reasons
// the request's Filter gave against the nodes that passed every other check
// (filtered). It is off the hot path: it runs only when nothing fits.
func (p *Placer) explain(s *Snapshot, q *req, elig *eligibility, filtered [][]string) error {
	e := &UnschedulableError{Nodes: len(s.nodes), Counts: map[Reason]int{}}
	lacking := map[string]int{} // scalar resource -> nodes it rejected
	for i := range s.nodes {
		st := &s.nodes[i]
		var why Reason
		scalarsOK, lack := true, -1
		if q.scal != nil {
			scalarsOK, lack = s.scalarsFit(i, q.scal)
		}
		switch {
		case elig != nil && elig.code[i] == rejectsConstraints:
			why = ReasonConstraints
		case elig != nil && elig.code[i] == rejectsModel:
			why = ReasonModel
		case q.share && st.maxFree < q.m, !q.share && st.fullFree < q.k:
			why = ReasonGPU
		case !scalarsOK:
			why = ReasonScalar
			lacking[q.scal[lack].name]++
		case st.cpuFree < q.cpu:
			why = ReasonCPU
		case st.memFree < q.mem:
			why = ReasonMemory
		case filtered != nil && filtered[i] != nil:
			why = ReasonFilter
			if e.Filtered == nil {
				e.Filtered = map[string]int{}
			}
			for _, r := range filtered[i] {
				e.Filtered[r]++
			}
		default:
			continue // fits; cannot happen when called after a failed search
		}
		e.Counts[why]++
	}
	// The most frequent reason; on a tie the later check, as a node that
	// passed more checks is closer to fitting and its reason more telling.
	most := 0
	for _, r := range reasonOrder() {
		if n := e.Counts[r]; n > 0 && n >= most {
			e.Reason, most = r, n
		}
	}
	most = 0
	for _, a := range q.scal { // sorted by name: the first wins a tie
		if n := lacking[a.name]; n > most {
			e.Resource, most = a.name, n
		}
	}
	return e
}

// tightestGPU is the GPU with the least free milli that still has room for
// q's share, lowest index on ties ("best fit" GPU selection).
func (s *Snapshot) tightestGPU(i int, q *req) int {
	pick := -1
	var pf int32
	for g, f := range s.gpus(i) {
		if f >= q.m && (pick < 0 || f < pf) {
			pick, pf = g, f
		}
	}
	return pick
}
