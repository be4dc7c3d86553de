package scheduler

import (
	"context"
	"fmt"
	"sync"
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

// bindFailures is what failed bindings leave from one cycle to the next:
// each workload's back-off and each gang's last binding error. The bind
// workers record failures; the cycle reads and forgets them. It has a lock
// of its own; the bind path takes it while it holds Scheduler.mu (never the
// other way round), so a failure's assumption dropped and back-off set are
// seen together.
type bindFailures struct {
	mu sync.Mutex
	// backoff: workload -> when it may be placed again, and the back-off
	// after its next failure.
	backoff map[string]bindRetry
	// gangErr: gang (gangID) -> the last error binding one of its members.
	gangErr map[string]string
}

func newBindFailures() *bindFailures {
	return &bindFailures{backoff: map[string]bindRetry{}, gangErr: map[string]string{}}
}

// failed records that t's binding failed with err at now: its workload
// backs off (1 s, doubling up to 10 s; pods of the workload failing in the
// same round share one back-off) and its gang, if any, keeps the error.
func (f *bindFailures) failed(t bindTask, err error, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	msg := fmt.Sprintf("binding %s to %s: %v", t.pod.Name, t.node, err)
	if t.gang != "" {
		f.gangErr[t.gang] = msg
	}
	r := f.backoff[t.workload]
	d := r.next
	if d == 0 {
		d = initialBindBackoff
	}
	if now.Before(r.until) {
		// Another pod of the workload failed in the same round: one back-off.
		d = r.until.Sub(now)
	} else {
		r.failures++
		r.next = min(2*d, maxBindBackoff)
	}
	r.until = now.Add(d)
	r.err = msg
	f.backoff[t.workload] = r
}

// held tells which of the pending workloads (by key) are still in their
// back-off at now, and forgets the back-offs of workloads no longer
// pending (bound, or gone).
func (f *bindFailures) held(pending map[string]bool, now time.Time) map[string]bindRetry {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out map[string]bindRetry
	for key, r := range f.backoff {
		switch {
		case !pending[key]:
			delete(f.backoff, key)
		case now.Before(r.until):
			if out == nil {
				out = map[string]bindRetry{}
			}
			out[key] = r
		}
	}
	return out
}

// backingOff tells whether some workload has a back-off recorded.
func (f *bindFailures) backingOff() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.backoff) > 0
}

// gangCause is the last error binding a member of gang ("" when none).
func (f *bindFailures) gangCause(gang string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.gangErr[gang]
}

// keepGangErrors forgets the errors of the gangs keep does not hold: an
// error matters only to explain the rollback of a gang bound in part.
func (f *bindFailures) keepGangErrors(keep func(gang string) bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for key := range f.gangErr {
		if !keep(key) {
			delete(f.gangErr, key)
		}
	}
}

// empty tells whether no back-off and no gang error is recorded.
func (f *bindFailures) empty() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.backoff) == 0 && len(f.gangErr) == 0
}

// holdBackedOff takes out of ws the workloads still in their back-off after
// a failed binding, giving their pods the reason BindingFailed, and forgets
// the back-offs of workloads no longer pending (bound, or gone).
func (s *Scheduler) holdBackedOff(ctx context.Context, ws []*workload, now time.Time, res *Result) []*workload {
	if !s.bindFailed.backingOff() {
		return ws
	}
	pendingKeys := make(map[string]bool, len(ws))
	for _, w := range ws {
		pendingKeys[w.key] = true
	}
	held := s.bindFailed.held(pendingKeys, now)
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
