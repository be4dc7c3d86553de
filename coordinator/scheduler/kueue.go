package scheduler

import (
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/coordinator/kueue"
	"github.com/gpufrac/gpufrac/coordinator/predicates"
)

// kueueKeeps tells whether Kueue keeps queue q's quota.
func (b *books) kueueKeeps(q string) bool {
	spec, ok := b.specs[q]
	return ok && spec.Admission == v1alpha1.AdmissionKueue
}

// holdForKueue keeps back the workloads of queues whose quota Kueue keeps
// until Kueue admitted each of their pods (kueue.Gate): they wait with
// reason NotAdmittedByKueue, which asks Karpenter for nothing and counts in
// no queue's demand. A gang waits whole when one member is not admitted.
func (c *cycle) holdForKueue(ws []*workload) []*workload {
	s := c.s
	var gate *kueue.Gate // built on first need: most clusters have no such queue
	return slices.DeleteFunc(ws, func(w *workload) bool {
		if !c.books.kueueKeeps(w.queue) {
			return false
		}
		why := ""
		switch {
		case s.deps.Kueue == nil:
			why = "its queue's quota is kept by Kueue, and this coordinator does not read Kueue's Workloads (the chart's kueue.enabled, the coordinator's --kueue, or Kueue's API is not served)"
		case s.deps.KueueSynced != nil && !s.deps.KueueSynced():
			why = "its queue's quota is kept by Kueue, and the coordinator has not read Kueue's Workloads yet (if this lasts, check that it may list workloads.kueue.x-k8s.io: the chart's kueue.enabled)"
		default:
			if gate == nil {
				gate = kueue.NewGate(s.deps.Kueue, c.livePods())
			}
			for _, pi := range w.pods {
				if ok, msg := gate.Admits(pi.pod, func(t corev1.PodTemplateSpec) bool { return s.withinTemplate(pi, t) }); !ok {
					why = msg
					break
				}
			}
		}
		if why == "" {
			return false
		}
		c.leave(w, wait(api.ReasonNotAdmittedByKueue, why))
		return true
	})
}

// livePods are the cycle's pods that hold or may take capacity: not
// terminal, not being deleted.
func (c *cycle) livePods() []*corev1.Pod {
	var live []*corev1.Pod
	for _, p := range c.pods {
		if !predicates.Terminal(p) && p.DeletionTimestamp == nil {
			live = append(live, p)
		}
	}
	return live
}

// withinTemplate tells whether pi asks for no more GPU than a pod made
// from template t would, both parsed the same way. Only GPUs are compared:
// Kueue counts CPU and memory with LimitRange defaults the template does not
// show, and GPUs are what the coordinator places.
func (s *Scheduler) withinTemplate(pi podInfo, t corev1.PodTemplateSpec) bool {
	tp := &corev1.Pod{ObjectMeta: *t.ObjectMeta.DeepCopy(), Spec: *t.Spec.DeepCopy()}
	tp.Namespace, tp.Name = pi.pod.Namespace, pi.pod.Name
	if tp.Labels == nil {
		tp.Labels = map[string]string{}
	}
	tp.Labels[api.LabelQueue] = pi.queue
	tp.OwnerReferences = nil
	tp.Spec.SchedulingGroup = nil
	tp.Spec.SchedulerName = pi.pod.Spec.SchedulerName
	tpi, err := s.parseAsIs(tp, nil, nil, nil)
	if err != nil {
		return false
	}
	return pi.res.GPUMilli <= tpi.res.GPUMilli
}
