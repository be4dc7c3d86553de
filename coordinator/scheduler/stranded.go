package scheduler

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/gpufrac/gpufrac/coordinator/state"
)

// ReasonGPUTaken is the event reason on a fraction pod evicted because its
// GPU's reservation was lost and the GPU given whole to another pod.
const ReasonGPUTaken = "FractionGPUTaken"

// EvictedGPUTaken is the reason label of gpufrac_fractions_evicted_total
// for ReasonGPUTaken.
const EvictedGPUTaken = "gpu_taken"

// evictStranded evicts the fraction pods that run on a GPU whose
// reservation was lost (preempted, evicted, deleted) and that the node
// agent then gave whole to another pod (state.Reservation.TakenBy): they
// share the GPU with an exclusive pod, and no reservation can hold it for
// them again. Their controllers re-create them and placement puts them on a
// reserved GPU. A lost reservation whose GPU nobody took is made again
// instead (ensureReservations), in the same cycle. An eviction that fails
// is tried again in the next cycle; one that succeeded is not sent again
// while the informer still shows the pod running.
func (s *Scheduler) evictStranded(ctx context.Context, snap *state.Snapshot) {
	logger := klog.FromContext(ctx)
	still := map[types.UID]bool{}
	var keys []state.NodeGPU // the GPUs taken: a few, when any
	for key, r := range snap.Reservations {
		if r.TakenBy != nil {
			keys = append(keys, key)
		}
	}
	slices.SortFunc(keys, func(a, b state.NodeGPU) int {
		return cmp.Or(strings.Compare(a.Node, b.Node), strings.Compare(a.GPU, b.GPU))
	})
	for _, key := range keys {
		r := snap.Reservations[key]
		for _, p := range r.Stranded {
			if p == nil || p.DeletionTimestamp != nil {
				continue
			}
			still[p.UID] = true
			if s.strandedEvicted.sent(p.UID) {
				continue
			}
			msg := fmt.Sprintf("GPU %s on %s lost its reservation and was given whole to pod %s/%s; a fraction may not share a GPU with an exclusive pod: evicted to be placed again",
				key.GPU, key.Node, r.TakenBy.Namespace, r.TakenBy.Name)
			if s.deps.Releaser == nil {
				logger.Info("Fraction runs on a GPU given whole to another pod; no releaser to evict it", "pod", klog.KObj(p), "node", key.Node, "gpu", key.GPU, "holder", klog.KObj(r.TakenBy))
				continue
			}
			s.noteSelfEvicted(p, true) // before: its delete may be seen before Release returns
			if err := s.deps.Releaser.Release(ctx, p, ReasonGPUTaken, msg); err != nil {
				s.noteSelfEvicted(p, false)
				logger.Error(err, "Evicting a fraction from a GPU given whole to another pod; retried in the next cycle", "pod", klog.KObj(p), "node", key.Node, "gpu", key.GPU)
				continue
			}
			s.strandedEvicted.mark(p.UID)
			s.metrics.fractionsEvicted.WithLabelValues(EvictedGPUTaken).Inc()
			logger.Info("Evicted a fraction from a GPU given whole to another pod", "pod", klog.KObj(p), "node", key.Node, "gpu", key.GPU, "holder", klog.KObj(r.TakenBy))
		}
	}
	s.strandedEvicted.keep(func(uid types.UID) bool { return still[uid] })
}
