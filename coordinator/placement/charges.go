package placement

import (
	"math"
	"slices"
)

// charges are what one request pays, on top of a node's cached score, for
// capacity that other demand will need (see charger). Both parts are in
// milli-GPU of expected waste, like gpufrac's score.
type charges struct {
	// byModel is the charge for placing the request on a node of each model
	// (model index -> charge); nil charges nothing.
	byModel []float64
	// perSlot are the charges for the k-GPU slots (k fully free GPUs on one
	// node with cpu CPU free) a placement breaks, by model.
	perSlot [][]slotTerm
	// minK is the smallest k with a slot charge on some model (more than
	// any node has when there is none).
	minK int32
	// queries is slotCharges' scratch; models holds one-model lists.
	queries []slotQuery
	models  [][]int32
	// prior caches the prior's slot queries (priorQueries) for the node
	// types at priorOf, priorLen long (a snapshot's htypes, never written
	// after NewSnapshot).
	prior    []slotQuery
	priorOf  *hostType
	priorLen int
	// counts keeps the slot counts of the queries and the usable free
	// milli across requests, node by node.
	counts slotCounts
}

// slotCounts caches, per node generation, each node's slots for a list of
// slot queries and its free GPU milli usable at ρ CPU per milli, and their
// sums over the cluster: a placement changes one node, so a request
// recounts the nodes that changed only.
type slotCounts struct {
	src    *genSource
	rho    float64
	keys   []slotQuery // the queries counted (models, k, cpu)
	gens   []uint64    // node -> generation counted, 0 for none
	slots  []int64     // node i's slots for query j at i·len(keys)+j
	use    []int64     // node -> usable free milli
	totals []int64     // query -> slots over all nodes
	useSum int64
}

// count fills qs' slots and returns the cluster's free GPU milli that its
// free CPU can serve at rho CPU per milli (all free milli when rho is 0).
func (sc *slotCounts) count(s *Snapshot, qs []slotQuery, rho float64) int64 {
	if sc.src != s.src || sc.rho != rho || len(sc.gens) != len(s.nodes) || !sameQueries(sc.keys, qs) {
		sc.src, sc.rho = s.src, rho
		sc.keys = append(sc.keys[:0], qs...)
		sc.gens = make([]uint64, len(s.nodes))
		sc.slots = make([]int64, len(s.nodes)*len(qs))
		sc.use = make([]int64, len(s.nodes))
		sc.totals = make([]int64, len(qs))
		sc.useSum = 0
	}
	n := len(qs)
	for i := range s.nodes {
		st := &s.nodes[i]
		if sc.gens[i] == st.gen {
			continue
		}
		sc.gens[i] = st.gen
		use := int64(st.totalFree)
		if rho > 0 {
			use = min(use, int64(float64(max(st.cpuFree, 0))/rho))
		}
		sc.useSum += use - sc.use[i]
		sc.use[i] = use
		row := sc.slots[i*n : (i+1)*n]
		for j := range qs {
			q := &qs[j]
			var k int64
			if st.model >= 0 && st.fullFree >= q.k && (q.models == nil || slices.Contains(q.models, st.model)) {
				k = slotsOf(st.fullFree, st.cpuFree, q.k, q.cpu)
			}
			sc.totals[j] += k - row[j]
			row[j] = k
		}
	}
	for j := range qs {
		qs[j].slots = sc.totals[j]
	}
	return sc.useSum
}

// sameQueries reports whether a and b ask for the same slots.
func sameQueries(a, b []slotQuery) bool {
	if len(a) != len(b) {
		return false
	}
	for j := range a {
		if a[j].k != b[j].k || a[j].cpu != b[j].cpu || !slices.Equal(a[j].models, b[j].models) {
			return false
		}
	}
	return true
}

// model is the list of the one model m (kept for reuse).
func (c *charges) model(m int) []int32 {
	for len(c.models) <= m {
		c.models = append(c.models, []int32{int32(len(c.models))})
	}
	return c.models[m]
}

// slotTerm charges w for each k-GPU slot with cpu CPU free that a
// placement breaks: a node holds min(⌊fullFree/k⌋, ⌊cpuFree/cpu⌋) of them.
type slotTerm struct {
	k   int32
	cpu int64
	w   float64
}

// slotsOf is the number of k-GPU slots with cpu CPU each that a node with
// full fully free GPUs and cpuFree CPU holds.
func slotsOf(full int32, cpuFree int64, k int32, cpu int64) int64 {
	n := int64(full / k)
	if cpu > 0 {
		n = min(n, max(cpuFree, 0)/cpu)
	}
	return n
}

// chargeSlot adds w to the charge for breaking a k-GPU slot with cpu CPU
// on model m.
func (c *charges) chargeSlot(m int, k int32, cpu int64, w float64) {
	c.perSlot[m] = append(c.perSlot[m], slotTerm{k: k, cpu: cpu, w: w})
	c.minK = min(c.minK, k)
}

// reset clears c for a snapshot with n models.
func (c *charges) reset(n int) {
	if cap(c.byModel) < n {
		c.byModel = make([]float64, n)
	}
	c.byModel = c.byModel[:n]
	clear(c.byModel)
	if cap(c.perSlot) < n {
		c.perSlot = make([][]slotTerm, n)
	}
	c.perSlot = c.perSlot[:n]
	for m := range c.perSlot {
		c.perSlot[m] = c.perSlot[m][:0]
	}
	c.minK = math.MaxInt32
}

// at is the charge for placing q on node i (a share on GPU gpu): what it
// takes from the node's model and from its multi-GPU slots. Most nodes have
// fewer fully free GPUs than the smallest charged slot and skip the slots.
// It is kept out of line: inlined, it slowed Place's loop for every policy.
//
//go:noinline
func (c *charges) at(s *Snapshot, i int, q *req, gpu int) float64 {
	st := &s.nodes[i]
	if st.model < 0 {
		return 0
	}
	if st.fullFree >= c.minK {
		return c.byModel[st.model] + c.slotCharge(s, st, q, gpu)
	}
	return c.byModel[st.model]
}

// slotCharge is the charge for the k-GPU slots placing q on node st breaks,
// by taking fully free GPUs or CPU.
func (c *charges) slotCharge(s *Snapshot, st *nodeState, q *req, gpu int) float64 {
	full := st.fullFree
	after := full
	switch {
	case !q.share:
		after -= q.k
	case gpu >= 0 && s.free[int(st.gpuOff)+gpu] == MilliPerGPU:
		after--
	}
	if after == full && q.cpu == 0 {
		return 0 // nothing a slot needs taken
	}
	var sum float64
	for _, t := range c.perSlot[st.model] {
		if t.k > full {
			continue
		}
		if d := slotsOf(full, st.cpuFree, t.k, t.cpu) - slotsOf(after, st.cpuFree-q.cpu, t.k, t.cpu); d != 0 {
			sum += t.w * float64(d)
		}
	}
	return sum
}
