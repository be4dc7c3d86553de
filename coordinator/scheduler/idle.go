package scheduler

import (
	"context"
	"time"

	"k8s.io/klog/v2"
)

// DefaultIdleResync is Options.IdleResync's default: an idle cluster is
// looked at afresh twice a minute, in case something changed that no event
// told.
const DefaultIdleResync = 30 * time.Second

// idleState is what Run knows of the last cycle it ran.
type idleState struct {
	quiet  bool      // it was quiet (cycle.quiet)
	events uint64    // Scheduler.events when it began
	at     time.Time // when it began
}

// cycleIfChanged runs a cycle unless the last one was quiet, nothing
// happened since it began (no event, binding or write) and it began less
// than IdleResync ago: an idle cluster then costs one counter read a tick,
// not a snapshot of every node and pod.
func (s *Scheduler) cycleIfChanged(ctx context.Context) {
	events, now := s.events.Load(), s.clock.Now()
	if s.opts.IdleResync > 0 && s.idle.quiet && events == s.idle.events && now.Sub(s.idle.at) < s.opts.IdleResync {
		s.metrics.idleSkipped.Inc()
		return
	}
	c, err := s.runCycle(ctx)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Scheduling cycle failed")
	}
	s.idle = idleState{quiet: err == nil && c.quiet(), events: events, at: now}
}

// quiet tells whether nothing the cycle saw can change with time alone, so
// that the next cycle may wait for an event: nothing pending, bound, planned
// or being bound; every reservation ready and holding fractions (an empty
// one is removed after a grace, a new one waits for its node agent); no
// reservation created, removed or failed; no placeholder and no hint for
// Karpenter's capacity; no node settling; none of the scheduler's timed
// records (binding back-offs, gangs bound in part, evictions awaited or
// refused, claims in flight).
func (c *cycle) quiet() bool {
	if c.res.Bound > 0 || len(c.res.Pending) > 0 || c.deferred > 0 || len(c.plans) > 0 || len(c.assumed) > 0 ||
		len(c.existing) > 0 || len(c.held) > 0 || len(c.inputs.Settling) > 0 ||
		len(c.inputs.Removing) > 0 || len(c.inputs.Creating) > 0 || c.dra.busyPod() != "" ||
		len(c.snap.FailedReservations) > 0 || len(c.snap.RemovingShown) > 0 {
		return false
	}
	for _, r := range c.snap.Reservations {
		if !r.Ready || r.Fractions == 0 || r.Orphaned != "" || r.TakenBy != nil {
			return false
		}
	}
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.assumed) == 0 && s.reclaims.empty() && len(s.selfEvicted) == 0 &&
		s.hints.empty() &&
		len(s.gangPartial) == 0 && len(s.gangEvicted) == 0 && len(s.strandedEvicted) == 0 && s.bindFailed.empty() &&
		len(s.reserveCreated) == 0 && len(s.inflight) == 0 && len(s.plans) == 0
}
