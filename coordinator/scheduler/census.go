package scheduler

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpufrac/gpufrac/coordinator/predicates"
)

// The gang census (gangsPlaced) counts every cycle what the gangs' members
// bound or being bound say: how many count toward min-member, the pool the
// first of them pins, and who a rollback evicts. Counted from every member
// in every cycle, it was a third of a busy cycle's own CPU at full size
// (12,000 members sorted and counted). So the ledger keeps each gang's
// count of its bound members (gangLedger) and counts it again only when a
// member changed or a node event moved what the census reads of the nodes
// (Scheduler.nodeEvents); the members being bound, which change every
// cycle, are counted on top of a copy.

// gangLedger is what the ledger keeps of one gang: its bound members and
// their count, as of the node events seen when it was counted.
type gangLedger struct {
	name    string // the gang's "namespace/group"
	members map[types.UID]*boundPart
	tally   *gangTally // nil: to be counted (a member changed)
	nodes   uint64     // Scheduler.nodeEvents when tally was counted
}

// gangTally is what the members of one gang counted so far say.
type gangTally struct {
	census gangCensus
	bound  int // members that count toward min-member and pin the pool
	// pool is the pool of the member with the lowest ledger key among
	// those counted in bound (pinKey): the same member pins it whatever
	// order the members are counted in.
	pool   string
	pinKey types.UID
	pinned bool
}

// nodePools reads the nodes' pools for one census, each node once.
type nodePools struct {
	s     *Scheduler
	pools map[string]string
	gone  map[string]bool
}

// of is node's pool and whether the node exists.
func (n *nodePools) of(node string) (string, bool) {
	if pool, ok := n.pools[node]; ok {
		return pool, !n.gone[node]
	}
	pool, exists := n.s.poolOf(node)
	if n.pools == nil {
		n.pools, n.gone = map[string]string{}, map[string]bool{}
	}
	n.pools[node] = pool
	if !exists {
		n.gone[node] = true
	}
	return pool, exists
}

// count counts part, a gang member bound or being bound (to part.node),
// parsed as part.pi (for a bound pod, as its binding recorded: pods the
// coordinator did not bind are no gang's members).
func (t *gangTally) count(nodes *nodePools, name string, k types.UID, part *boundPart) {
	p, pi := part.pod, &part.pi
	c := &t.census
	if c.name == "" {
		// Room for the members the gang says it has (a tenant's number:
		// bounded).
		c.name, c.live = name, make([]*corev1.Pod, 0, min(max(pi.GangMinMember(), 1), maxCensusRoom))
	}
	c.min = max(c.min, pi.GangMinMember())
	if part.terminal {
		// A member that ended after it ran (succeeded, or failed in its
		// work) counts as having run: its gang was whole. One that never
		// ran (refused at the kubelet's admission, no container started)
		// does not: a Job keeps such pods, and counting them would hide a
		// gang bound in part from its rollback.
		if !predicates.NeverRan(p) {
			c.ran++
		}
		return
	}
	c.held++
	if part.being && p.Spec.NodeName == "" {
		c.inflight++
	}
	pool, exists := nodes.of(part.node)
	if p.DeletionTimestamp != nil || !exists {
		// Going (evicted, drained) or on a node that is gone (a spot node
		// reclaimed: its pods wait for the pod garbage collector): it holds
		// its resources until it is gone, but it is no member the gang can
		// count on, so neither toward min-member (a lone replacement would
		// be placed as "the rest" of a gang that lost every member) nor for
		// the gang's pool.
		return
	}
	if p.Spec.NodeName != "" {
		c.live = append(c.live, p)
	}
	t.bound++
	if !t.pinned || k < t.pinKey {
		t.pool, t.pinKey, t.pinned = pool, k, true
	}
}

// copy is t with a census of its own, to count more members on.
func (t *gangTally) copy() *gangTally {
	out := *t
	out.census.live = slices.Clone(t.census.live)
	return &out
}

// addMember keeps part, a gang member bound (part.gang), in its gang.
func (l *boundLedger) addMember(k types.UID, part *boundPart, name string) {
	g := l.gangs[part.gang]
	if g == nil {
		g = &gangLedger{name: name, members: map[types.UID]*boundPart{}}
		l.gangs[part.gang] = g
	}
	g.members[k] = part
	g.tally = nil
}

// dropMember lets go of part, a gang member, from its gang.
func (l *boundLedger) dropMember(k types.UID, part *boundPart) {
	g := l.gangs[part.gang]
	if g == nil {
		return
	}
	delete(g.members, k)
	g.tally = nil
	if len(g.members) == 0 {
		delete(l.gangs, part.gang)
	}
}

// census counts the gangs: each gang's bound members as kept (counted
// again when a member changed or a node event moved what it read), and
// the members being bound on top.
func (s *Scheduler) census(being []boundPart) *gangsPlaced {
	l := s.bound
	nodes := &nodePools{s: s}
	events := s.nodeEvents.Load()
	tallies := make(map[string]*gangTally, len(l.gangs))
	for id, g := range l.gangs {
		if g.tally == nil || g.nodes != events {
			t := &gangTally{}
			for k, part := range g.members {
				t.count(nodes, g.name, k, part)
			}
			g.tally, g.nodes = t, events
		}
		tallies[id] = g.tally
	}
	// Being bound: on a copy of the gang's count (the ledger's is shared
	// with the cycles that read it).
	var copied map[string]bool
	for i := range being {
		part := &being[i]
		if !part.member {
			continue
		}
		id, name := s.gangIDs.of(part.pi.Queue, part.pod.Namespace, part.pi.GangName())
		t := tallies[id]
		switch {
		case t == nil:
			t = &gangTally{}
		case !copied[id]:
			t = t.copy()
		}
		if copied == nil {
			copied = map[string]bool{}
		}
		copied[id], tallies[id] = true, t
		t.count(nodes, name, ledgerKey(part.pod), part)
	}
	gangs := newGangsPlaced(len(tallies))
	for id, t := range tallies {
		gangs.census[id] = &t.census
		if t.bound > 0 {
			gangs.bound[id] = t.bound
		}
		if t.pinned {
			gangs.pool[id] = t.pool
		}
	}
	return gangs
}
