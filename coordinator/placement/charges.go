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
	// perSlot is the charge for each k-GPU slot (k fully free GPUs on one
	// node) the placement breaks, by model and k.
	perSlot [][MaxKindGPUs + 1]float64
	// ks are the k with a slot charge on some model, ascending, and minK
	// the first of them (more than any node has when there is none).
	ks   []int32
	minK int32
}

// chargeSlot adds w to the charge for breaking a k-GPU slot on model m.
func (c *charges) chargeSlot(m int, k int32, w float64) {
	c.perSlot[m][k] += w
	if i, found := slices.BinarySearch(c.ks, k); !found {
		c.ks = slices.Insert(c.ks, i, k)
	}
	c.minK = c.ks[0]
}

// reset clears c for a snapshot with n models.
func (c *charges) reset(n int) {
	if cap(c.byModel) < n {
		c.byModel = make([]float64, n)
	}
	c.byModel = c.byModel[:n]
	clear(c.byModel)
	if cap(c.perSlot) < n {
		c.perSlot = make([][MaxKindGPUs + 1]float64, n)
	}
	c.perSlot = c.perSlot[:n]
	clear(c.perSlot)
	c.ks, c.minK = c.ks[:0], math.MaxInt32
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

// slotCharge is the charge for the k-GPU slots placing q on node st breaks.
func (c *charges) slotCharge(s *Snapshot, st *nodeState, q *req, gpu int) float64 {
	full := st.fullFree
	after := full
	switch {
	case !q.share:
		after -= q.k
	case gpu >= 0 && s.free[int(st.gpuOff)+gpu] == MilliPerGPU:
		after--
	}
	if after == full {
		return 0 // no fully free GPU taken: no slot broken
	}
	var sum float64
	per := &c.perSlot[st.model]
	for _, k := range c.ks {
		if k > full {
			break
		}
		if w := per[k]; w != 0 {
			sum += w * float64(full/k-after/k)
		}
	}
	return sum
}
