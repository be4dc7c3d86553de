package scheduler

import (
	"context"
	"fmt"
	"time"

	"github.com/gpufrac/gpufrac/api"
)

// A binding can fail for good - an admission policy or webhook refuses it,
// the pod is being deleted - or for a while (the API server is
// overloaded). Each failure wakes the scheduler so a passing failure heals
// at once; without a back-off, a binding that keeps failing had the
// coordinator run a full cycle and send a failing request every few
// milliseconds for as long as the pod existed, and the pod never said why
// it waited. As kube-scheduler backs off a pod whose scheduling failed
// (1 s, doubling up to 10 s), a workload whose binding failed is not placed
// again before its back-off has passed, and its pods say BindingFailed with
// the error meanwhile. A gang bound in part stays subject to
// GangBindTimeout: its retries fit in the timeout's default (1+2+4+8 s).

// Bind back-off bounds.
const (
	initialBindBackoff = time.Second
	maxBindBackoff     = 10 * time.Second
)

// bindRetry is a workload's back-off after a failed binding.
type bindRetry struct {
	// until is when the workload may be placed again.
	until time.Time
	// next is the back-off after its next failure.
	next time.Duration
	// failures counts its failed bindings in a row; err is the last.
	failures int
	err      string
}

// backOffLocked records that t's binding failed with err. s.mu must be held.
func (s *Scheduler) backOffLocked(t bindTask, err error) {
	r := s.bindBackoff[t.workload]
	d := r.next
	if d == 0 {
		d = initialBindBackoff
	}
	now := s.clock.Now()
	if now.Before(r.until) {
		// Another pod of the workload failed in the same round: one back-off.
		d = r.until.Sub(now)
	} else {
		r.failures++
		r.next = min(2*d, maxBindBackoff)
	}
	r.until = now.Add(d)
	r.err = fmt.Sprintf("binding %s to %s: %v", t.pod.Name, t.node, err)
	s.bindBackoff[t.workload] = r
}

// holdBackedOff takes out of ws the workloads still in their back-off after
// a failed binding, giving their pods the reason BindingFailed, and forgets
// the back-offs of workloads no longer pending (bound, or gone).
func (s *Scheduler) holdBackedOff(ctx context.Context, ws []*workload, now time.Time, res *Result) []*workload {
	s.mu.Lock()
	if len(s.bindBackoff) == 0 {
		s.mu.Unlock()
		return ws
	}
	pendingKeys := make(map[string]bool, len(ws))
	for _, w := range ws {
		pendingKeys[w.key] = true
	}
	held := map[string]bindRetry{}
	for key, r := range s.bindBackoff {
		switch {
		case !pendingKeys[key]:
			delete(s.bindBackoff, key)
		case now.Before(r.until):
			held[key] = r
		}
	}
	s.mu.Unlock()
	kept := ws[:0]
	for _, w := range ws {
		r, ok := held[w.key]
		if !ok {
			kept = append(kept, w)
			continue
		}
		msg := fmt.Sprintf("the coordinator placed this pod but its binding failed (%d in a row, last: %s); it is placed again after a back-off",
			r.failures, r.err)
		for _, p := range w.pods {
			s.markPending(ctx, p.pod, w.queue, api.ReasonBindingFailed, msg, res)
		}
	}
	return kept
}
