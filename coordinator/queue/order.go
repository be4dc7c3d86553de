package queue

import (
	"math"
	"sort"
)

// DominantShare is a queue's usage relative to what it should have: the
// largest, over the resources the queue manages, of usage / fair share (from
// the last FairShare call), or usage / deserved quota before any FairShare
// call. A resource with nothing to divide by counts as +Inf when in use and 0
// otherwise. ok is false for an unknown queue.
func (t *Tree) DominantShare(queue string) (share float64, ok bool) {
	n, ok := t.queues[queue]
	if !ok {
		return 0, false
	}
	return t.dominantShare(n), true
}

func (t *Tree) dominantShare(n *node) float64 {
	var worst float64
	fair, known := t.fair[n.spec.Name]
	for d := range numDims {
		if n.spec.Quota.get(d) == Unlimited {
			continue // not managed by this queue
		}
		used := n.used.get(d)
		denom := n.spec.Quota.get(d)
		if known {
			denom = fair.get(d)
		}
		var s float64
		switch {
		case used <= 0:
			continue
		case denom <= 0:
			s = math.Inf(1)
		default:
			s = float64(used) / float64(denom)
		}
		worst = max(worst, s)
	}
	return worst
}

// Order sorts leaf queues in the order they should be served: the queue
// furthest below its fair share first. The comparison is hierarchical, as in
// the fair share: two queues are compared through their ancestors that are
// siblings (so a team of a busy organisation waits for the teams of an idle
// one), and siblings by DominantShare (lower first), then priority (higher
// first), then name. Unknown queues come last, by name. leaves is not changed.
func (t *Tree) Order(leaves []string) []string {
	out := append([]string(nil), leaves...)
	shares := map[*node]float64{}
	shareOf := func(n *node) float64 {
		s, ok := shares[n]
		if !ok {
			s = t.dominantShare(n)
			shares[n] = s
		}
		return s
	}
	paths := map[string][]*node{} // name -> path from the root down
	for _, name := range out {
		if n, ok := t.queues[name]; ok {
			p := n.path()
			for i, j := 0, len(p)-1; i < j; i, j = i+1, j-1 {
				p[i], p[j] = p[j], p[i]
			}
			paths[name] = p
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, aok := paths[out[i]]
		b, bok := paths[out[j]]
		if !aok || !bok {
			if aok != bok {
				return aok
			}
			return out[i] < out[j]
		}
		// Find the first level where the paths part: those two queues are
		// siblings (or both top-level).
		k := 0
		for k < len(a) && k < len(b) && a[k] == b[k] {
			k++
		}
		if k == len(a) || k == len(b) {
			return len(a) < len(b) // the same queue; only with duplicates
		}
		x, y := a[k], b[k]
		if sx, sy := shareOf(x), shareOf(y); sx != sy {
			return sx < sy
		}
		if x.spec.Priority != y.spec.Priority {
			return x.spec.Priority > y.spec.Priority
		}
		return x.spec.Name < y.spec.Name
	})
	return out
}
