package scheduler

import (
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/predicates"
)

// nodeSettle is what the settle of new and returned nodes keeps from one
// cycle to the next: each node listed by the last cycle (its settle
// taints, since when it is usable), whether a cycle saw the nodes yet, and
// the timer that wakes the scheduler when the next settling node settles.
// Used only by the cycle goroutine: no lock.
type nodeSettle struct {
	seen  map[string]*nodeSeen
	once  bool   // a cycle has seen the nodes
	round uint64 // settling calls so far
	wake  clock.Timer
}

func newNodeSettle() *nodeSettle { return &nodeSettle{seen: map[string]*nodeSeen{}} }

// wakeAfter wakes the scheduler (wake) after d, in place of the wake-up set
// before; a clock that cannot run functions later sets none.
func (ns *nodeSettle) wakeAfter(c clock.Clock, d time.Duration, wake func()) {
	if ns.wake != nil {
		ns.wake.Stop()
	}
	if dc, ok := c.(clock.WithDelayedExecution); ok {
		ns.wake = dc.AfterFunc(d, wake)
	}
}

// settling tells the nodes that became usable within settle (NewNodeSettle),
// and soonest, how long until the first of them settles. A node becomes
// usable when
//   - it appears, for Karpenter's nodes (label karpenter.sh/nodepool) that
//     appear after the first cycle; a node seen for the first time
//     otherwise (by the first cycle of a restarted coordinator, say) became
//     usable when its records say (recordedUsable), so a restart keeps the
//     settle of a node that was registered a moment before;
//   - it loses a NoExecute taint (karpenter.sh/unregistered on a node
//     Karpenter just registered, node.kubernetes.io/not-ready), or a
//     gpufrac.io/draining taint in force (consolidation gave it back, or
//     the drain's deadline passed).
//
// The first two settle for the taint eviction race (kubernetes#119862):
// kube-controller-manager's taint manager, whose informer may still show a
// NoExecute taint the coordinator already saw removed, deletes a pod bound
// in that moment. Such a node is placed on while it settles, and the
// reservations of the fractions placed there are made (a reservation pod
// tolerates every taint, so the taint manager never deletes it), but no
// pod is bound there until it settled (held): the fractions bind the
// moment it has, instead of asking for their reservations only then.
//
// A returned node is left out of the snapshot while it settles (out): its
// free GPUs are what the placeholders of earlier versions, which
// kube-scheduler binds, may be pending for, and a reservation made there
// could race them for a GPU.
func (ns *nodeSettle) settling(nodes []*corev1.Node, now time.Time, settle time.Duration, recordedUsable func(*corev1.Node, time.Time) time.Time) (out, held map[string]bool, soonest time.Duration) {
	soonest = settle
	ns.round++ // stamps the nodes listed now; the others are forgotten below
	for _, n := range nodes {
		taints := settleTaints(n, now)
		seen, known := ns.seen[n.Name]
		switch {
		case known && seen.round == ns.round:
			continue // listed twice
		case !known || seen.uid != n.UID:
			// New, or deleted and made again under its name since the
			// last cycle (the taint manager may have seen it tainted).
			seen = &nodeSeen{uid: n.UID}
			if _, karpenters := n.Labels[api.LabelNodePool]; karpenters && ns.once {
				seen.usableSince = now
			} else {
				// Found by the first cycle (a coordinator restarted, a new
				// leader) or not Karpenter's: it may have lost a NoExecute
				// taint a moment ago, unseen.
				seen.usableSince = recordedUsable(n, now)
			}
			ns.seen[n.Name] = seen
		default:
			gone := slices.DeleteFunc(slices.Clone(seen.taints), func(k string) bool { return slices.Contains(taints, k) })
			if len(gone) > 0 {
				// A node given back stays out until it settled, whatever
				// else it loses meanwhile.
				returning := seen.returned && now.Sub(seen.usableSince) < settle
				seen.usableSince = now
				seen.returned = returning || slices.ContainsFunc(gone, func(k string) bool { return strings.HasPrefix(k, api.TaintDraining+":") })
			}
		}
		seen.taints = taints
		seen.round = ns.round
		if left := settle - now.Sub(seen.usableSince); left > 0 {
			set := &held
			if seen.returned {
				set = &out
			}
			if *set == nil {
				*set = map[string]bool{}
			}
			(*set)[n.Name] = true
			soonest = min(soonest, left)
		}
	}
	ns.once = true
	for name, seen := range ns.seen {
		if seen.round != ns.round {
			delete(ns.seen, name)
		}
	}
	return out, held, soonest
}

// nodeSeen is what settlingNodes keeps of a node from one cycle to the next.
type nodeSeen struct {
	// taints are the keys of its taints that end in a settle (settleTaints).
	taints []string
	// usableSince is when it appeared or lost one of them (zero: long ago).
	usableSince time.Time
	// returned: what it lost then was a gpufrac.io/draining taint.
	returned bool
	// round is the last settlingNodes call that listed it.
	round uint64
	// uid is the node object's UID: another is another node of the name.
	uid types.UID
}

// settleTaints are the keys of n's taints whose removal makes n settle: its
// NoExecute taints and a gpufrac.io/draining taint in force.
func settleTaints(n *corev1.Node, now time.Time) []string {
	var keys []string
	for _, t := range n.Spec.Taints {
		if t.Effect == corev1.TaintEffectNoExecute || (t.Key == api.TaintDraining && predicates.DrainingAt(n, now)) {
			keys = append(keys, t.Key+":"+string(t.Effect))
		}
	}
	return keys
}
