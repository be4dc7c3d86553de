package placement

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
)

// Typical is one typical pod shape of a workload and its weight, the
// lookahead of the fragmentation-aware policies.
type Typical struct {
	// CPUMilli is the pod's CPU request.
	CPUMilli int64
	// MemoryBytes is the shape's mean memory request.
	MemoryBytes int64
	// GPUs is the GPU count: 0 CPU-only, 1 for a share, k for k whole GPUs.
	GPUs int
	// MilliPerGPU is what the pod takes from each GPU: 1..1000, 0 if CPU-only.
	MilliPerGPU int
	// Models are the allowed GPU models (empty: any).
	Models []string
	// Weight is the shape's share of the workload (weights sum to 1).
	Weight float64
}

// TypicalFromRequests returns the most frequent request shapes (CPU, GPU
// count, milli per GPU, models) of reqs: the smallest most-frequent-first
// prefix that covers at least coverage (0..1) of the requests, weighted by
// frequency and renormalised to sum to 1. This is the FGD paper's "typical
// pods" (its artifact uses coverage 0.95, CPU-only pods included).
func TypicalFromRequests(reqs []Request, coverage float64) []Typical {
	type shape struct {
		cpu       int64
		milli, k  int
		modelsKey string
	}
	counts := map[shape]int{}
	memory := map[shape]int64{} // shape -> sum of memory requests
	models := map[string][]string{}
	for i := range reqs {
		r := &reqs[i]
		sh := shape{cpu: r.CPUMilli}
		switch {
		case r.ShareMilli > 0:
			sh.milli, sh.k = r.ShareMilli, 1
		case r.GPUs > 0:
			sh.milli, sh.k = MilliPerGPU, r.GPUs
		}
		if len(r.Models) > 0 {
			m := slices.Clone(r.Models)
			slices.Sort(m)
			sh.modelsKey = strings.Join(m, "|")
			models[sh.modelsKey] = m
		}
		counts[sh]++
		memory[sh] += r.MemoryBytes
	}
	shapes := make([]shape, 0, len(counts))
	for sh := range counts {
		shapes = append(shapes, sh)
	}
	// Most frequent first; ties by larger CPU, milli, count, models (the
	// artifact's reversed order), which makes the prefix deterministic.
	slices.SortFunc(shapes, func(a, b shape) int {
		return cmp.Or(
			cmp.Compare(counts[b], counts[a]),
			cmp.Compare(b.cpu, a.cpu),
			cmp.Compare(b.milli, a.milli),
			cmp.Compare(b.k, a.k),
			cmp.Compare(b.modelsKey, a.modelsKey))
	})
	want := coverage * float64(len(reqs))
	var out []Typical
	covered := 0
	for _, sh := range shapes {
		if float64(covered) >= want && len(out) > 0 {
			break
		}
		covered += counts[sh]
		out = append(out, Typical{
			CPUMilli: sh.cpu, MemoryBytes: memory[sh] / int64(counts[sh]),
			GPUs: sh.k, MilliPerGPU: sh.milli, Models: models[sh.modelsKey],
			Weight: float64(counts[sh]),
		})
	}
	for i := range out {
		out[i].Weight /= float64(covered)
	}
	return out
}

// defaultTypical is the mix used when the caller has no workload history:
// whole GPUs and the usual shares, equally weighted, modest CPU.
func defaultTypical() []Typical {
	var t []Typical
	for _, m := range []int{1000, 500, 250, 100} {
		t = append(t, Typical{CPUMilli: 4000, GPUs: 1, MilliPerGPU: m, Weight: 0.25})
	}
	return t
}

// fragShape groups the typical pods that share a GPU shape and models.
type fragShape struct {
	m, k    int32
	models  []string
	modelOK []bool    // snapshot model index -> allowed; nil allows any
	cpu     []int64   // ascending CPU requests of the group
	cum     []float64 // cum[j]: weight of the group's pods with CPU <= cpu[j]
}

// weightUpTo is the weight of the group's pods needing at most cpuFree CPU.
func (f *fragShape) weightUpTo(cpuFree int64) float64 {
	w := 0.0
	for j, c := range f.cpu {
		if c > cpuFree {
			break
		}
		w = f.cum[j]
	}
	return w
}

// fragModel is the FGD paper's node fragmentation measure for one typical
// mix: F(n) = Σ_t w_t f(n,t), where f(n,t) is all of n's idle GPU milli when
// t cannot run on n at all (CPU-only, wrong model, too little CPU, too few
// GPUs with room), else the idle milli on GPUs too small for t. Written as
// F = W·idle − Σ_{t fits} w_t·(idle milli on GPUs big enough for t).
type fragModel struct {
	total    float64 // Σ w_t
	shapes   []fragShape
	compiled *genSource // snapshot family the model indices are for
}

func newFragModel(typical []Typical) (*fragModel, error) {
	if len(typical) == 0 {
		return nil, errors.New("building fragmentation model: no typical pods")
	}
	fm := &fragModel{}
	type key struct {
		m, k   int32
		models string
	}
	groups := map[key]int{}
	for _, t := range typical {
		if t.Weight < 0 || math.IsNaN(t.Weight) || t.GPUs < 0 || t.MilliPerGPU < 0 || t.MilliPerGPU > MilliPerGPU ||
			(t.GPUs > 1 && t.MilliPerGPU != MilliPerGPU) || (t.GPUs == 0) != (t.MilliPerGPU == 0) {
			return nil, fmt.Errorf("building fragmentation model: bad typical pod %+v", t)
		}
		fm.total += t.Weight
		if t.GPUs == 0 {
			continue // CPU-only pods never use idle GPUs: all of it is fragment
		}
		m := slices.Clone(t.Models)
		slices.Sort(m)
		k := key{m: int32(t.MilliPerGPU), k: int32(t.GPUs), models: strings.Join(m, "|")}
		g, ok := groups[k]
		if !ok {
			g = len(fm.shapes)
			groups[k] = g
			fm.shapes = append(fm.shapes, fragShape{m: k.m, k: k.k, models: m})
		}
		sh := &fm.shapes[g]
		sh.cpu = append(sh.cpu, t.CPUMilli)
		sh.cum = append(sh.cum, t.Weight)
	}
	for g := range fm.shapes {
		sh := &fm.shapes[g]
		idx := make([]int, len(sh.cpu))
		for j := range idx {
			idx[j] = j
		}
		slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(sh.cpu[a], sh.cpu[b]) })
		cpu, cum := make([]int64, len(idx)), make([]float64, len(idx))
		acc := 0.0
		for j, x := range idx {
			acc += sh.cum[x]
			cpu[j], cum[j] = sh.cpu[x], acc
		}
		sh.cpu, sh.cum = cpu, cum
	}
	return fm, nil
}

// compile resolves the groups' model sets against s's model indices.
func (fm *fragModel) compile(s *Snapshot) {
	if fm.compiled == s.src {
		return
	}
	fm.compiled = s.src
	for g := range fm.shapes {
		sh := &fm.shapes[g]
		sh.modelOK = nil
		if len(sh.models) == 0 {
			continue
		}
		sh.modelOK = make([]bool, len(s.models))
		for m, name := range s.models {
			_, sh.modelOK[m] = slices.BinarySearch(sh.models, name)
		}
	}
}

// nodeFrag is F(n) for a node with the given model, free CPU and GPUs.
func (fm *fragModel) nodeFrag(model int32, cpuFree int64, gpus []int32) float64 {
	var idle int32
	for _, g := range gpus {
		idle += g
	}
	if idle == 0 {
		return 0
	}
	f := fm.total * float64(idle)
	for g := range fm.shapes {
		sh := &fm.shapes[g]
		if sh.modelOK != nil && (model < 0 || !sh.modelOK[model]) {
			continue
		}
		w := sh.weightUpTo(cpuFree)
		if w == 0 {
			continue
		}
		var n, big int32
		for _, x := range gpus {
			if x >= sh.m {
				n++
				big += x
			}
		}
		if n >= sh.k {
			f -= w * float64(big)
		}
	}
	return f
}

// FragMeter measures fragmentation (the FGD paper's frag amount) of the
// nodes of a snapshot under a typical-pod mix.
type FragMeter struct{ fm *fragModel }

// NewFragMeter returns a meter for the typical mix.
func NewFragMeter(typical []Typical) (*FragMeter, error) {
	fm, err := newFragModel(typical)
	if err != nil {
		return nil, err
	}
	return &FragMeter{fm: fm}, nil
}

// Node is node i's fragmented GPU milli: the expected idle milli that a pod
// drawn from the mix could not use there.
func (m *FragMeter) Node(s *Snapshot, i int) float64 {
	m.fm.compile(s)
	st := &s.nodes[i]
	return m.fm.nodeFrag(st.model, st.cpuFree, s.gpus(i))
}

// Cluster is the sum of Node over all nodes.
func (m *FragMeter) Cluster(s *Snapshot) float64 {
	total := 0.0
	for i := range s.nodes {
		total += m.Node(s, i)
	}
	return total
}

// fgdPolicy is Fragmentation Gradient Descent (Weng et al., ATC'23) as its
// artifact runs it: score = int(100·sigmoid((F_before − F_after)/1000));
// a share tries every GPU with room and keeps the best, lowest index first.
type fgdPolicy struct{ fm *fragModel }

func (f fgdPolicy) compile(s *Snapshot) { f.fm.compile(s) }

func (f fgdPolicy) nodeCost(s *Snapshot, i int) float64 {
	st := &s.nodes[i]
	return f.fm.nodeFrag(st.model, st.cpuFree, s.gpus(i))
}

func (f fgdPolicy) score(p *Placer, s *Snapshot, i int, q *req) (float64, int) {
	st := &s.nodes[i]
	before := p.nodeCost(s, i)
	gpus := append(p.scratch[:0], s.gpus(i)...)
	score := func() float64 {
		after := f.fm.nodeFrag(st.model, st.cpuFree-q.cpu, gpus)
		return math.Trunc(maxScore * sigmoid((before-after)/1000))
	}
	return scoreAfter(gpus, q, score)
}
func (fgdPolicy) cacheable() bool  { return true }
func (fgdPolicy) usesMemory() bool { return false }

// scoreAfter takes q out of gpus, a scratch copy of a node's free milli per
// GPU, and returns what score says of the result. A whole request takes the k
// lowest-index fully free GPUs (GPU -1); a share tries each GPU it fits on,
// one per distinct free amount, and returns the best score and its GPU.
func scoreAfter(gpus []int32, q *req, score func() float64) (float64, int) {
	if !q.share {
		takeWhole(gpus, q.k)
		return score(), -1
	}
	best, bestG := math.Inf(-1), -1
	for g := range gpus {
		free := gpus[g]
		if free < q.m || slices.Contains(gpus[:g], free) {
			continue // too small, or same free milli as an earlier GPU: same score
		}
		gpus[g] = free - q.m
		if sc := score(); sc > best {
			best, bestG = sc, g
		}
		gpus[g] = free
	}
	return best, bestG
}

// takeWhole marks the k lowest-index fully free GPUs as used.
func takeWhole(gpus []int32, k int32) {
	for g := range gpus {
		if k > 0 && gpus[g] == MilliPerGPU {
			gpus[g], k = 0, k-1
		}
	}
}

func sigmoid(x float64) float64 { return 1 / (1 + math.Exp(-x)) }
