package scheduler

import "k8s.io/apimachinery/pkg/types"

// evictionsSent remembers the pods this scheduler evicted for one purpose
// (a gang's rollback, a fraction off a GPU given whole to another pod)
// while the informer still shows them, so the eviction is not sent again
// every cycle. Used only by the cycle goroutine: no lock.
type evictionsSent map[types.UID]bool

// sent tells whether uid's eviction was sent.
func (e evictionsSent) sent(uid types.UID) bool { return e[uid] }

// mark records that uid's eviction was sent.
func (e evictionsSent) mark(uid types.UID) { e[uid] = true }

// keep forgets the pods still does not hold (gone, or no longer where the
// eviction was for).
func (e evictionsSent) keep(still func(types.UID) bool) {
	for uid := range e {
		if !still(uid) {
			delete(e, uid)
		}
	}
}
