package scheduler

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// What the coordinator last said - a pod's pending reason, a queue's
// status, a PodGroup's condition, an invalid queue's event - is remembered
// from one cycle to the next, so that the next cycles, which run before the
// informers show a write, do not queue it again. A failed write is
// forgotten (if nothing newer was said since), and the next cycle says it
// again. Each record has a lock of its own: the writer's goroutines report
// failed writes, the bind workers unsay pods they bind.

// lastSaid remembers, per key, the value last written or queued.
type lastSaid[K comparable, V comparable] struct {
	mu   sync.Mutex
	last map[K]V
}

func newLastSaid[K comparable, V comparable]() *lastSaid[K, V] {
	return &lastSaid[K, V]{last: map[K]V{}}
}

// say records v for k and tells whether it is news (not what was last
// said; nothing said reads as V's zero value): only news is written.
func (l *lastSaid[K, V]) say(k K, v V) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	news := l.last[k] != v
	l.last[k] = v
	return news
}

// failed forgets k's v, whose write failed, unless something else was
// said since: the next cycle says it again.
func (l *lastSaid[K, V]) failed(k K, v V) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if last, ok := l.last[k]; ok && last == v {
		delete(l.last, k)
	}
}

// forget forgets what was said for k.
func (l *lastSaid[K, V]) forget(k K) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.last, k)
}

// keep forgets the keys live does not hold.
func (l *lastSaid[K, V]) keep(live func(K) bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k := range l.last {
		if !live(k) {
			delete(l.last, k)
		}
	}
}

// empty tells whether nothing is remembered.
func (l *lastSaid[K, V]) empty() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.last) == 0
}

// said is a pending reason the coordinator wrote (or queued) on a pod.
type said struct {
	reason, message string
	at              time.Time
}

// podReasons remembers the pending reason last written or queued for each
// pod. A pod told a reason is not told the same reason again within the
// binder's MessageRefresh, whatever the message: the binder's rule (it
// reads the pod's condition), applied here from memory.
type podReasons struct {
	mu      sync.Mutex
	refresh time.Duration
	last    map[types.UID]said
}

func newPodReasons(refresh time.Duration) *podReasons {
	return &podReasons{refresh: refresh, last: map[types.UID]said{}}
}

// say tells whether pod uid is to be told reason and msg at now, and
// records it when so: not when it was told the same reason with the same
// message, or within the refresh whatever the message. A pod without a UID
// is always told, and nothing is recorded for it.
func (r *podReasons) say(uid types.UID, reason, msg string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	last, ok := r.last[uid]
	if ok && last.reason == reason && (last.message == msg || now.Sub(last.at) < r.refresh) {
		return false
	}
	if uid != "" {
		r.last[uid] = said{reason: reason, message: msg, at: now}
	}
	return true
}

// failed forgets pod uid's reason and msg, whose write failed, unless it
// was told another since: the next cycle tells it again.
func (r *podReasons) failed(uid types.UID, reason, msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if cur, ok := r.last[uid]; ok && cur.reason == reason && cur.message == msg {
		delete(r.last, uid)
	}
}

// unsay forgets what pod uid was told (it is being bound).
func (r *podReasons) unsay(uid types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.last, uid)
}

// forgetOld forgets the reasons told a refresh or more before now: by then
// the informer shows the write, and the binder's own check reads the pod.
func (r *podReasons) forgetOld(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for uid, last := range r.last {
		if now.Sub(last.at) >= r.refresh {
			delete(r.last, uid)
		}
	}
}
