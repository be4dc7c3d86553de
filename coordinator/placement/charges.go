package placement

import "slices"

// charges are what one request pays, on top of a node's cached score, for
// capacity that other demand will need (see charger). Both parts are in
// milli-GPU of expected waste, like gpufrac's score.
type charges struct {
	// byModel is the charge for placing the request on a node of each model
	// (model index -> charge); nil charges nothing.
	byModel []float64
	// perSlot is the charge for each k-GPU slot (k fully free GPUs on one
	// node) the placement breaks, by model and k; slots reports whether any
	// is set.
	perSlot [][MaxKindGPUs + 1]float64
	slots   bool
	// ks are the k with a slot charge on some model, ascending.
	ks []int32
}

// chargeSlot adds w to the charge for breaking a k-GPU slot on model m.
func (c *charges) chargeSlot(m int, k int32, w float64) {
	c.perSlot[m][k] += w
	c.slots = true
	if i, found := slices.BinarySearch(c.ks, k); !found {
		c.ks = slices.Insert(c.ks, i, k)
	}
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
	c.slots = false
	c.ks = c.ks[:0]
}

// of is the charge for placing q on node i (a share on GPU gpu).
func (c *charges) of(s *Snapshot, i int, q *req, gpu int) float64 {
	st := &s.nodes[i]
	var sum float64
	if st.model >= 0 {
		sum = c.byModel[st.model]
	}
	if !c.slots || st.model < 0 {
		return sum
	}
	full := st.fullFree
	after := full
	switch {
	case !q.share:
		after -= q.k
	case gpu >= 0 && s.free[int(st.gpuOff)+gpu] == MilliPerGPU:
		after--
	}
	if after == full {
		return sum // no fully free GPU taken: no slot broken
	}
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
