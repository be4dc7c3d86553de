package scheduler

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// reclaimTracking is what reclaim remembers from one cycle to the next:
// the victims it evicted for each starved queue, until the informer shows
// them terminating (from then on the API itself says they are going), and
// the victims whose eviction the API refused, left out of the candidates
// until their evictionRetry has passed. Only the cycle reads and writes it;
// it has a lock of its own all the same (cycle.quiet takes it inside
// Scheduler.mu, never the other way round).
type reclaimTracking struct {
	mu sync.Mutex
	// evicted: starved queue -> victims evicted for it.
	evicted map[string]map[types.UID]bool
	// refused: victim whose eviction was refused -> when it may be tried again.
	refused map[types.UID]time.Time
}

func newReclaimTracking() *reclaimTracking {
	return &reclaimTracking{evicted: map[string]map[types.UID]bool{}, refused: map[types.UID]time.Time{}}
}

// waitingFor counts the victims evicted for queue that still run
// (running), forgetting the others: gone, or shown terminating.
func (r *reclaimTracking) waitingFor(queue string, running func(types.UID) bool) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for uid := range r.evicted[queue] {
		if running(uid) {
			n++
		} else {
			delete(r.evicted[queue], uid)
		}
	}
	if len(r.evicted[queue]) == 0 {
		delete(r.evicted, queue)
	}
	return n
}

// stillRefused forgets the refused victims whose wait is over at now or
// that no longer hold resources (holds), and returns the others.
func (r *reclaimTracking) stillRefused(now time.Time, holds func(types.UID) bool) map[types.UID]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for uid, until := range r.refused {
		if !now.Before(until) || !holds(uid) {
			delete(r.refused, uid)
		}
	}
	out := make(map[types.UID]bool, len(r.refused))
	for uid := range r.refused {
		out[uid] = true
	}
	return out
}

// evictedFor records that victim was evicted for queue.
func (r *reclaimTracking) evictedFor(queue string, victim types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.evicted[queue] == nil {
		r.evicted[queue] = map[types.UID]bool{}
	}
	r.evicted[queue][victim] = true
}

// refusedAt records that victim's eviction was refused at now: it is left
// out of the candidates for evictionRetry.
func (r *reclaimTracking) refusedAt(victim types.UID, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refused[victim] = now.Add(evictionRetry)
}

// prune forgets, for every queue, the victims no longer running and the
// refused victims whose wait is over at now or that no longer hold
// resources. running: pod UID -> not terminating, for the pods that hold
// resources (a pod not in it is gone or ended).
func (r *reclaimTracking) prune(running map[types.UID]bool, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for q, victims := range r.evicted {
		for uid := range victims {
			if !running[uid] {
				delete(victims, uid)
			}
		}
		if len(victims) == 0 {
			delete(r.evicted, q)
		}
	}
	for uid, until := range r.refused {
		if _, holds := running[uid]; !holds || !now.Before(until) {
			delete(r.refused, uid)
		}
	}
}

// empty tells whether no victim is awaited and none refused.
func (r *reclaimTracking) empty() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.evicted) == 0 && len(r.refused) == 0
}
