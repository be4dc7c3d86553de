package scheduler

import (
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpufrac/gpufrac/api"
)

// ReasonNonPreemptibleLost is the reason of the event on a non-preemptible
// pod the infrastructure deleted before it finished (reportLost).
const ReasonNonPreemptibleLost = "NonPreemptibleLost"

// lostLabel is the metric label of a DisruptionTarget reason: the reasons
// Kubernetes writes on a pod it deletes (the pod garbage collector's, its
// node gone, as when a spot instance is reclaimed; the taint manager's; the
// Eviction API's, a drain; the kubelet's, node shutdown or pressure;
// kube-scheduler's preemption), "Other" for any else, so the labels stay few.
func lostLabel(reason string) string {
	switch reason {
	case "DeletionByPodGC", "DeletionByTaintManager", "EvictionByEvictionAPI", "TerminationByKubelet", "PreemptionByScheduler":
		return reason
	}
	return "Other"
}

// reportLost reports p, deleted, when it is work the coordinator admitted
// non-preemptible and bound, and Kubernetes deleted it before it finished (a
// DisruptionTarget condition): a Warning event on the pod and
// gpufrac_nonpreemptible_pods_lost_total{reason}. Karpenter never disrupts
// such work of its own accord (the coordinator annotates it
// karpenter.sh/do-not-disrupt), but a spot interruption reclaims the node
// anyway. gpufrac.io/admitted-preemptible is the coordinator's write on the
// binding, and a pod's conditions the kubelet's and controllers', so the
// pod's author forges neither; a pod its author deletes has no
// DisruptionTarget. Pods the coordinator evicts itself (a gang rollback, a
// fraction off a GPU taken) are left out by OnPodDelete (selfEvicted). A
// tenant that evicts its own pod (pods/eviction, in the edit role) is
// counted as a drain would be.
func (s *Scheduler) reportLost(p *corev1.Pod) {
	if p.Spec.NodeName == "" || p.Spec.SchedulerName != s.opts.SchedulerName ||
		p.Annotations[api.AnnotationAdmittedPreemptible] != "false" || p.Status.Phase == corev1.PodSucceeded {
		return
	}
	i := slices.IndexFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
		return c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue
	})
	if i < 0 {
		return
	}
	c := p.Status.Conditions[i]
	s.metrics.nonPreemptibleLost.WithLabelValues(lostLabel(c.Reason)).Inc()
	if s.deps.Recorder != nil {
		s.deps.Recorder.Eventf(p, corev1.EventTypeWarning, ReasonNonPreemptibleLost,
			"non-preemptible pod lost on node %s before it finished: %s (%s); it runs again only if its controller makes it again", p.Spec.NodeName, c.Reason, c.Message)
	}
}
