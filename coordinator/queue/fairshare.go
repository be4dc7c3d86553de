package queue

import (
	"math/bits"
	"sort"
)

// FairShare divides capacity among the queues and records the result for
// Check and Order. demand maps a leaf queue to what it wants: its usage plus
// its pending requests (entries for unknown or non-leaf queues are ignored,
// and a leaf's demand is never taken as less than its current usage).
//
// Each resource is divided on its own, top-down. Among siblings sharing an
// amount A (the cluster capacity for top-level queues, the parent's share
// below):
//
//  1. each queue first gets min(deserved quota, demand), its demand capped by
//     its limit; when these add up to more than A they are scaled down
//     proportionally;
//  2. the surplus, A minus what step 1 gave, is water-filled among queues
//     with unmet demand in proportion to their over-quota weights: no queue
//     gets more than it demands, and what a queue cannot use goes to the others.
//
// A queue's share is then divided among its children the same way. The
// returned map holds every queue of the tree; leaves' shares never exceed
// their demand. Amounts are integers: the remainders of proportional division
// go one unit each to the largest remainders (ties by name), so the result is
// deterministic.
func (t *Tree) FairShare(capacity Resources, demand map[string]Resources) map[string]Resources {
	// want is each queue's demand for the subtree, capped by its own limit.
	want := make(map[*node]Resources, len(t.queues))
	var wantOf func(n *node) Resources
	wantOf = func(n *node) Resources {
		var w Resources
		if n.isLeaf() {
			dem := demand[n.spec.Name]
			for d := range numDims {
				w.set(d, max(dem.get(d), n.used.get(d), 0))
			}
		} else {
			for _, c := range n.children {
				w = w.Add(wantOf(c))
			}
		}
		for d := range numDims {
			w.set(d, min(w.get(d), n.spec.Limit.get(d)))
		}
		want[n] = w
		return w
	}
	for _, r := range t.roots {
		wantOf(r)
	}
	share := make(map[string]Resources, len(t.queues))
	var divide func(avail Resources, siblings []*node)
	divide = func(avail Resources, siblings []*node) {
		got := make([]Resources, len(siblings))
		for d := range numDims {
			wants := make([]int64, len(siblings))
			quotas := make([]int64, len(siblings))
			weights := make([]int64, len(siblings))
			for i, n := range siblings {
				wants[i] = want[n].get(d)
				quotas[i] = n.spec.Quota.get(d)
				weights[i] = n.spec.Weights.get(d)
			}
			for i, v := range divideAmount(max(avail.get(d), 0), wants, quotas, weights) {
				got[i].set(d, v)
			}
		}
		for i, n := range siblings {
			share[n.spec.Name] = got[i]
			if !n.isLeaf() {
				divide(got[i], n.children)
			}
		}
	}
	divide(capacity, t.roots)
	t.fair = share
	out := make(map[string]Resources, len(share))
	for k, v := range share {
		out[k] = v
	}
	return out
}

// divideAmount divides avail among siblings (in name order) with the given
// demands, deserved quotas and weights; see FairShare.
func divideAmount(avail int64, wants, quotas, weights []int64) []int64 {
	base := make([]int64, len(wants))
	var sumBase int64
	for i := range wants {
		base[i] = min(quotas[i], wants[i])
		sumBase = satAdd(sumBase, base[i])
	}
	if sumBase >= avail {
		// Deserved quotas alone exhaust the amount: scale them down.
		return waterFill(avail, make([]int64, len(wants)), base, base)
	}
	room := make([]int64, len(wants))
	for i := range wants {
		room[i] = wants[i] - base[i]
	}
	extra := waterFill(avail-sumBase, make([]int64, len(wants)), room, weights)
	for i := range base {
		base[i] += extra[i]
	}
	return base
}

// waterFill hands out amount on top of got, in proportion to weights, never
// giving entry i more than room[i] in total. What a capped entry cannot take
// is handed out again among the others, until amount is gone or no entry
// with a positive weight has room left. It changes and returns got.
func waterFill(amount int64, got, room, weights []int64) []int64 {
	active := make([]int, 0, len(got))
	for amount > 0 {
		active = active[:0]
		var total uint64
		for i := range got {
			if weights[i] > 0 && got[i] < room[i] {
				active = append(active, i)
				total += uint64(weights[i])
			}
		}
		if len(active) == 0 {
			break
		}
		// Proportional portions with the largest-remainder rule; the total
		// handed out this round is exactly amount.
		portion := make([]int64, len(active))
		rem := make([]uint64, len(active))
		var given int64
		for k, i := range active {
			hi, lo := bits.Mul64(uint64(amount), uint64(weights[i]))
			q, r := bits.Div64(hi, lo, total) // hi < total since weights[i] <= total
			portion[k], rem[k] = int64(q), r
			given += int64(q)
		}
		order := make([]int, len(active))
		for k := range order {
			order[k] = k
		}
		sort.SliceStable(order, func(a, b int) bool { return rem[order[a]] > rem[order[b]] })
		for _, k := range order[:amount-given] {
			portion[k]++
		}
		var placed int64
		for k, i := range active {
			g := min(portion[k], room[i]-got[i])
			got[i] += g
			placed += g
		}
		amount -= placed
	}
	return got
}
