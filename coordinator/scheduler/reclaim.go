package scheduler

import (
	"context"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/gpufrac/gpufrac/coordinator/queue"
	"github.com/gpufrac/gpufrac/coordinator/state"
)

// Evictor evicts pods through the Eviction API.
type Evictor interface {
	Evict(ctx context.Context, pod *corev1.Pod, reason string) error
}

// evictionRetry is how long a victim whose eviction the API refused (a
// PodDisruptionBudget, 429) is left out of the candidates: other victims
// are chosen meanwhile, and the refused one is tried again after it.
const evictionRetry = 10 * time.Second

// reclaim tries to give a queue below its deserved quota the room for w by
// evicting preemptible, over-quota workloads of other queues (whole gangs,
// lowest priority first). It returns a message for w's pods when it evicted
// or is still waiting for earlier victims to go; "" when nothing can be done.
//
// Victims are remembered only once their eviction succeeded, and only for
// the moment until the informer shows them terminating: from then on the
// API itself says they are going, so a restarted coordinator waits for
// them as its predecessor did, instead of evicting more.
func (s *Scheduler) reclaim(ctx context.Context, w *workload, b *books, in state.Inputs) string {
	if s.deps.Evictor == nil {
		return ""
	}
	now := s.clock.Now()
	// 1. Earlier victims still running, or pods terminating that would make
	// room: wait for them, evict nothing more.
	s.mu.Lock()
	waiting := 0
	for uid := range s.reclaiming[w.queue] {
		if p := podByUID(in.Pods, uid); p != nil && p.DeletionTimestamp == nil {
			waiting++
		} else {
			delete(s.reclaiming[w.queue], uid) // gone, or the API shows it terminating
		}
	}
	if len(s.reclaiming[w.queue]) == 0 {
		delete(s.reclaiming, w.queue)
	}
	for uid, until := range s.refused {
		if !now.Before(until) || podByUID(in.Pods, uid) == nil {
			delete(s.refused, uid)
		}
	}
	refused := make(map[types.UID]bool, len(s.refused))
	for uid := range s.refused {
		refused[uid] = true
	}
	s.mu.Unlock()
	if waiting > 0 {
		return fmt.Sprintf("queue %s is below its deserved quota: waiting for %d reclaimed pods of other queues to end", w.queue, waiting)
	}
	if n := s.fitsWithoutTerminating(w, in); n > 0 {
		return fmt.Sprintf("queue %s is below its deserved quota: waiting for %d terminating pods to end", w.queue, n)
	}

	// 2. Candidates: running workloads (gangs whole) the coordinator
	// admitted to other queues, but for victims whose eviction was refused a
	// moment ago. A pod is non-preemptible only inside its queue's
	// namespaces: gpufrac.io/preemptible "false" protects nothing in a
	// namespace the queue no longer lets in.
	groups := map[string][]*corev1.Pod{}
	cands := map[string]*queue.Workload{}
	for _, p := range in.Pods {
		if p.Spec.NodeName == "" || state.Terminal(p) || p.DeletionTimestamp != nil || refused[p.UID] {
			continue
		}
		pi, ok, _ := s.parseAdmitted(p)
		if !ok || pi.queue == w.queue {
			continue
		}
		pi.nonPreemptible = pi.nonPreemptible && b.allows(pi.queue, p.Namespace)
		key := p.Namespace + "/" + p.Name
		if pi.group != "" {
			// A gang's pods were admitted as one, so they share how; pods
			// relabelled into a gang after admission do not join its
			// protection.
			key = p.Namespace + "/" + pi.group + "/preemptible=" + strconv.FormatBool(!pi.nonPreemptible)
		}
		c := cands[key]
		if c == nil {
			c = &queue.Workload{Queue: pi.queue, Key: key, Priority: pi.priority, Preemptible: true, CreationUnixNano: p.CreationTimestamp.UnixNano()}
			cands[key] = c
		}
		c.Resources = c.Resources.Add(pi.res)
		c.Preemptible = c.Preemptible && !pi.nonPreemptible
		c.Priority = min(c.Priority, pi.priority)
		c.CreationUnixNano = min(c.CreationUnixNano, p.CreationTimestamp.UnixNano())
		groups[key] = append(groups[key], p)
	}
	list := make([]queue.Workload, 0, len(cands))
	for _, c := range cands {
		list = append(list, *c)
	}
	victims, ok := b.tree.ReclaimVictims(w.queue, w.resources(), list)
	if !ok {
		return ""
	}

	// 3. Verify: with the victims gone, does w fit?
	gone := map[types.UID]bool{}
	var evict []*corev1.Pod
	for _, v := range victims {
		for _, p := range groups[v.Key] {
			gone[p.UID] = true
			evict = append(evict, p)
		}
	}
	rest := make([]*corev1.Pod, 0, len(in.Pods))
	for _, p := range in.Pods {
		if !gone[p.UID] {
			rest = append(rest, p)
		}
	}
	in.Pods = rest
	trial, err := state.Build(in)
	if err != nil {
		return ""
	}
	if _, err := s.place(trial, w); err != nil {
		return ""
	}

	// 4. Evict, and remember the victims evicted so the next cycles wait
	// for them; a refused eviction is tried again after evictionRetry.
	var evicted int
	var lastErr error
	for _, p := range evict {
		msg := fmt.Sprintf("reclaimed by queue %s, which is below its deserved quota", w.queue)
		err := s.deps.Evictor.Evict(ctx, p, msg)
		s.mu.Lock()
		if err != nil {
			s.refused[p.UID] = now.Add(evictionRetry)
		} else {
			if s.reclaiming[w.queue] == nil {
				s.reclaiming[w.queue] = map[types.UID]bool{}
			}
			s.reclaiming[w.queue][p.UID] = true
			evicted++
		}
		s.mu.Unlock()
		if err != nil {
			lastErr = err
			klog.FromContext(ctx).Error(err, "Evicting for reclaim refused; trying other victims", "pod", klog.KObj(p), "queue", w.queue, "retryAfter", evictionRetry)
		}
	}
	klog.FromContext(ctx).Info("Reclaiming quota", "queue", w.queue, "workload", w.key, "victims", len(victims), "pods", len(evict), "evicted", evicted)
	msg := fmt.Sprintf("queue %s is below its deserved quota: reclaiming %d pods (%d workloads) from over-quota queues", w.queue, evicted, len(victims))
	if lastErr != nil {
		msg += fmt.Sprintf("; %d evictions refused, tried again in %s: %v", len(evict)-evicted, evictionRetry, lastErr)
	}
	return msg
}

// fitsWithoutTerminating returns the number of terminating pods (deleted or
// evicted, still holding their resources) when w would fit once they are
// gone; 0 when none are terminating or w would not fit even then.
func (s *Scheduler) fitsWithoutTerminating(w *workload, in state.Inputs) int {
	rest := make([]*corev1.Pod, 0, len(in.Pods))
	going := 0
	for _, p := range in.Pods {
		if p.DeletionTimestamp != nil && p.Spec.NodeName != "" && !state.Terminal(p) {
			going++
			continue
		}
		rest = append(rest, p)
	}
	if going == 0 {
		return 0
	}
	in.Pods = rest
	trial, err := state.Build(in)
	if err != nil {
		return 0
	}
	if _, err := s.place(trial, w); err != nil {
		return 0
	}
	return going
}

// podByUID finds a pod that still holds resources (not terminal) by UID.
func podByUID(pods []*corev1.Pod, uid types.UID) *corev1.Pod {
	for _, p := range pods {
		if p.UID == uid && !state.Terminal(p) {
			return p
		}
	}
	return nil
}
