package queue

import (
	"sort"
)

// Workload is a unit of running work that can be reclaimed: a gang (all its
// pods at once) or a single pod.
type Workload struct {
	// Queue is the leaf queue the workload is charged to.
	Queue string
	// Key identifies the workload for the caller ("namespace/name" of the pod or gang).
	Key string
	// Priority is the pod priority (a gang's lowest member's).
	Priority int32
	// Preemptible is false for non-preemptible work, which is never reclaimed.
	Preemptible bool
	// Resources is what the whole workload uses.
	Resources Resources
	// CreationUnixNano is when the workload was created (the gang's first pod).
	CreationUnixNano int64
}

// ReclaimVictims chooses running workloads of other queues to evict so that
// the starved leaf queue can run work needing need. It answers only when the
// starved queue is below its deserved quota and stays within it with need
// (at the leaf and at its ancestors up to the one it shares with a victim);
// otherwise, or when the candidates cannot free enough, it returns nil, false.
//
// Only the resources the starved queue manages (a finite quota) and need asks
// for count. A candidate is taken only when it is preemptible, its leaf queue
// is another queue that is over its deserved quota in a resource the
// candidate frees, and taking it leaves that queue and its ancestors (below
// the ancestor shared with the starved queue; ancestors that do not manage
// the resource are skipped) at or above their deserved quota. Candidates
// are tried lowest priority first, then newest first, then by key, and taken
// whole; the answer is the first set that frees need. The caller must still
// verify placement on a snapshot with the victims removed.
func (t *Tree) ReclaimVictims(starved string, need Resources, candidates []Workload) ([]Workload, bool) {
	return t.reclaimVictims(starved, need, candidates, 0)
}

// ReclaimVictimsUpTo is ReclaimVictims going on past the first set that
// frees need, taking more candidates under the same rules, up to limit
// victims in all: the room a pod needs may be more than its resources when
// other victims' pods keep it out (kube-scheduler's checks: anti-affinity,
// ports, spread), as kube-scheduler's preemption takes every lower-priority
// pod in the way. It still answers nil, false when need cannot be freed.
func (t *Tree) ReclaimVictimsUpTo(starved string, need Resources, candidates []Workload, limit int) ([]Workload, bool) {
	return t.reclaimVictims(starved, need, candidates, limit)
}

func (t *Tree) reclaimVictims(starved string, need Resources, candidates []Workload, limit int) ([]Workload, bool) {
	s, err := t.leaf(starved)
	if err != nil {
		return nil, false
	}
	var dims []dim // resources the reclaim is about
	for d := range numDims {
		if need.get(d) > 0 && s.spec.Quota.get(d) != Unlimited {
			dims = append(dims, d)
		}
	}
	if len(dims) == 0 {
		return nil, false
	}
	for _, d := range dims {
		if satAdd(s.used.get(d), need.get(d)) > s.spec.Quota.get(d) {
			return nil, false // the starved queue would go beyond its deserved quota
		}
	}
	order := make([]Workload, len(candidates))
	copy(order, candidates)
	sort.SliceStable(order, func(i, j int) bool {
		a, b := order[i], order[j]
		switch {
		case a.Priority != b.Priority:
			return a.Priority < b.Priority
		case a.CreationUnixNano != b.CreationUnixNano:
			return a.CreationUnixNano > b.CreationUnixNano
		}
		return a.Key < b.Key
	})
	removed := map[*node]Resources{} // queue -> usage of victims chosen so far
	var freed Resources
	var victims []Workload
	for _, w := range order {
		v, ok := t.queues[w.Queue]
		if !ok || !v.isLeaf() || v == s || !w.Preemptible {
			continue
		}
		helps := false
		for _, d := range dims {
			if w.Resources.get(d) > 0 && (freed.get(d) < need.get(d) || limit > 0) {
				helps = true
			}
		}
		if !helps || !t.mayReclaim(s, v, w.Resources, need, dims, removed) {
			continue
		}
		for _, n := range v.path() {
			removed[n] = removed[n].Add(w.Resources)
		}
		freed = freed.Add(w.Resources)
		victims = append(victims, w)
		enough := true
		for _, d := range dims {
			if freed.get(d) < need.get(d) {
				enough = false
			}
		}
		if enough && (limit == 0 || len(victims) >= limit) {
			return victims, true
		}
	}
	if limit > 0 && len(victims) > 0 {
		for _, d := range dims {
			if freed.get(d) < need.get(d) {
				return nil, false
			}
		}
		return victims, true // every candidate the rules allow
	}
	return nil, false
}

// mayReclaim checks the quota rules for moving res from victim leaf v to
// starved leaf s, given what was already taken (removed).
func (t *Tree) mayReclaim(s, v *node, res, need Resources, dims []dim, removed map[*node]Resources) bool {
	starvedSide := map[*node]bool{}
	for _, n := range s.path() {
		starvedSide[n] = true
	}
	// The victim's side: every queue below the shared ancestor loses res.
	for _, n := range v.path() {
		if starvedSide[n] {
			break // the shared ancestor: it loses and gains the same
		}
		for _, d := range dims {
			r := res.get(d)
			if r <= 0 {
				continue
			}
			quota := n.spec.Quota.get(d)
			if quota == Unlimited {
				if n == v {
					return false // the victim's queue deserves all it uses
				}
				continue // an ancestor that does not manage d protects nothing
			}
			if n.used.get(d)-removed[n].get(d)-r < quota {
				return false
			}
		}
	}
	// The starved side: its ancestors below the shared one gain need and
	// must stay within their deserved quota too.
	victimSide := map[*node]bool{}
	for _, n := range v.path() {
		victimSide[n] = true
	}
	for _, n := range s.path()[1:] {
		if victimSide[n] {
			break
		}
		for _, d := range dims {
			if quota := n.spec.Quota.get(d); quota != Unlimited && satAdd(n.used.get(d), need.get(d)) > quota {
				return false
			}
		}
	}
	return true
}
