package scheduler

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// A gang is bound member by member: one binding can fail (the pod was
// deleted or changed, the node went, the API server refused) while the
// others succeed. Bound members then hold GPUs for a gang that does not
// run. A failed member is placed and bound again by the next cycle, so a
// passing failure heals; a gang still bound in part after GangBindTimeout
// is rolled back: its bound members are evicted (the Eviction API, so the
// pods end gracefully and PodDisruptionBudgets apply), each with an event
// saying why, and its pending members say why they wait. A bound pod
// cannot be unbound, so eviction is the rollback, as Kueue evicts a
// workload whose pods are not ready in time (waitForPodsReady); the pods'
// controller (a Job) makes new ones, and the gang is placed again whole.
//
// The time a gang was first seen bound in part lives in memory: a new
// leader starts the clock again, so a gang holds GPUs in part for at most
// the leader hand-over plus GangBindTimeout.

// DefaultGangReportDelay is the coordinator's Options.GangReportDelay,
// like DefaultReservationReportDelay.
const DefaultGangReportDelay = 5 * time.Second

// DefaultGangBindTimeout is Options.GangBindTimeout's default.
const DefaultGangBindTimeout = 30 * time.Second

// ReasonGangRollback is the event reason on a gang member evicted because
// its gang did not bind whole in time.
const ReasonGangRollback = "GangRollback"

// Releaser evicts a pod to give its resources back, recording reason and
// message on it (coordinator/binder.Binder).
type Releaser interface {
	Release(ctx context.Context, pod *corev1.Pod, reason, message string) error
}

// gangCensus counts the members of one gang that were bound.
type gangCensus struct {
	// name is the gang's "namespace/group", for messages.
	name string
	// min is the gang's min-member.
	min int
	// held counts the members bound or being bound that still hold their
	// resources (terminating ones included); ran counts those bound that
	// ended after they ran (Succeeded, or Failed with a container started).
	held, ran int
	// inflight counts the members whose binding is being written.
	inflight int
	// live are the bound members not terminating, on nodes that exist:
	// what a rollback evicts.
	live []*corev1.Pod
}

// partial tells whether the gang holds resources without ever having had
// min-member members bound at once.
func (c *gangCensus) partial() bool { return c.held > 0 && c.held+c.ran < c.min }

// checkGangBinds finds the gangs bound in part, rolls back those bound in
// part for longer than GangBindTimeout, and returns them (by gangID) with
// the message their pending members get.
func (s *Scheduler) checkGangBinds(ctx context.Context, census map[string]*gangCensus) map[string]string {
	now := s.clock.Now()
	rolling := map[string]string{}
	s.gangPartial.keep(func(key string) bool {
		c := census[key]
		return c != nil && c.partial()
	})
	// A binding error matters only to explain the rollback of a gang bound
	// in part; kept for gangs none of whose members was bound (or whose
	// pods are gone), the errors grew with every gang name ever seen.
	s.bindFailed.keepGangErrors(func(key string) bool {
		c := census[key]
		return c != nil && c.partial()
	})
	s.gangEvicted.keep(func(uid types.UID) bool { return censusHolds(census, uid) })
	for key, c := range census {
		if !c.partial() {
			continue
		}
		since := s.gangPartial.since(key, now)
		if c.inflight > 0 || now.Sub(since) < s.opts.GangBindTimeout {
			continue // bindings in flight, or time left for the failed ones to be bound again
		}
		cause := s.bindFailed.gangCause(key)
		if cause != "" {
			cause = " (last failure: " + cause + ")"
		}
		msg := fmt.Sprintf("gang %s had %d of its %d members bound but not the rest within %s%s; it was rolled back: its bound members are evicted to give their GPUs back, and the gang is placed again whole once they are gone",
			c.name, c.held+c.ran, c.min, s.opts.GangBindTimeout, cause)
		rolling[key] = msg
		if s.deps.Releaser == nil {
			continue
		}
		// In the order of their keys (the census's is a map's), on a copy:
		// the census is the ledger's, shared with later cycles.
		live := slices.SortedFunc(slices.Values(c.live), func(a, b *corev1.Pod) int { return strings.Compare(string(ledgerKey(a)), string(ledgerKey(b))) })
		for _, p := range live {
			if s.gangEvicted.sent(p.UID) {
				continue
			}
			s.noteSelfEvicted(p, true) // before: its delete may be seen before Release returns
			if err := s.deps.Releaser.Release(ctx, p, ReasonGangRollback, msg); err != nil {
				s.noteSelfEvicted(p, false)
				klog.FromContext(ctx).Error(err, "Evicting a member of a gang bound in part; trying again next cycle", "pod", klog.KObj(p), "podGroup", c.name)
				continue
			}
			s.gangEvicted.mark(p.UID)
		}
		klog.FromContext(ctx).Info("Rolled back a gang bound in part", "podGroup", c.name, "bound", c.held+c.ran, "minMember", c.min, "evicting", len(c.live))
	}
	return rolling
}

// censusHolds tells whether a pod of uid is among the live members of a gang.
func censusHolds(census map[string]*gangCensus, uid types.UID) bool {
	for _, c := range census {
		for _, p := range c.live {
			if p.UID == uid {
				return true
			}
		}
	}
	return false
}
