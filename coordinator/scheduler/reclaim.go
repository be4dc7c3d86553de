package scheduler

import (
	"context"
	"fmt"

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

// reclaim tries to give a queue below its deserved quota the room for w by
// evicting preemptible, over-quota workloads of other queues (whole gangs,
// lowest priority first). It returns a message for w's pods when it evicted
// or is still waiting for earlier victims to go; "" when nothing can be done.
func (s *Scheduler) reclaim(ctx context.Context, w *workload, b *books, in state.Inputs) string {
	if s.deps.Evictor == nil {
		return ""
	}
	// 1. Earlier victims still running: wait for them, evict nothing more.
	s.mu.Lock()
	waiting := 0
	for uid := range s.reclaiming[w.queue] {
		if podExists(in.Pods, uid) {
			waiting++
		} else {
			delete(s.reclaiming[w.queue], uid)
		}
	}
	s.mu.Unlock()
	if waiting > 0 {
		return fmt.Sprintf("queue %s is below its deserved quota: waiting for %d reclaimed pods of other queues to end", w.queue, waiting)
	}

	// 2. Candidates: running workloads (gangs whole) the coordinator
	// admitted to other queues. A pod is non-preemptible only inside its
	// queue's namespaces: gpufrac.io/preemptible "false" protects nothing in
	// a namespace the queue no longer lets in.
	groups := map[string][]*corev1.Pod{}
	cands := map[string]*queue.Workload{}
	for _, p := range in.Pods {
		if p.Spec.NodeName == "" || state.Terminal(p) || p.DeletionTimestamp != nil {
			continue
		}
		pi, ok, _ := s.parseAdmitted(p)
		if !ok || pi.queue == w.queue {
			continue
		}
		pi.nonPreemptible = pi.nonPreemptible && b.allows(pi.queue, p.Namespace)
		key := p.Namespace + "/" + p.Name
		if pi.group != "" {
			key = p.Namespace + "/" + pi.group
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

	// 4. Evict, and remember the victims so the next cycles wait for them.
	s.mu.Lock()
	if s.reclaiming[w.queue] == nil {
		s.reclaiming[w.queue] = map[types.UID]bool{}
	}
	for _, p := range evict {
		s.reclaiming[w.queue][p.UID] = true
	}
	s.mu.Unlock()
	for _, p := range evict {
		msg := fmt.Sprintf("reclaimed by queue %s, which is below its deserved quota", w.queue)
		if err := s.deps.Evictor.Evict(ctx, p, msg); err != nil {
			klog.FromContext(ctx).Error(err, "Evicting for reclaim", "pod", klog.KObj(p), "queue", w.queue)
		}
	}
	klog.FromContext(ctx).Info("Reclaiming quota", "queue", w.queue, "workload", w.key, "victims", len(victims), "pods", len(evict))
	return fmt.Sprintf("queue %s is below its deserved quota: reclaiming %d pods (%d workloads) from over-quota queues", w.queue, len(evict), len(victims))
}

func podExists(pods []*corev1.Pod, uid types.UID) bool {
	for _, p := range pods {
		if p.UID == uid && !state.Terminal(p) {
			return true
		}
	}
	return false
}
