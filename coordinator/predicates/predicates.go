// Package predicates answers the questions every part of the coordinator
// asks of a pod or a node: does the pod still hold resources, which GPU does
// a reservation or a fraction hold, may the node take new pods, is it
// drained. Pure functions of the object, no state.
package predicates

import (
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpufrac/gpufrac/api"
)

// ReservedGPU is the GPU a reservation pod holds: the one the kubelet gave
// it, else the one the coordinator asked for.
func ReservedGPU(p *corev1.Pod) string {
	if g := p.Annotations[api.AnnotationReservedGPU]; g != "" {
		return g
	}
	return p.Annotations[api.AnnotationGPU]
}

// NeverRan tells whether a failed pod ended without running: no container
// of it ever started (the kubelet refused it at admission, or it failed
// before its containers were created). The informers' trim keeps what it
// reads for failed pods (see app's trimPod).
func NeverRan(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodFailed {
		return false
	}
	for _, st := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for _, cs := range st {
			if cs.State.Running != nil || cs.State.Terminated != nil && !cs.State.Terminated.StartedAt.IsZero() ||
				cs.LastTerminationState.Terminated != nil && !cs.LastTerminationState.Terminated.StartedAt.IsZero() {
				return false
			}
		}
	}
	return true
}

// Terminal tells whether a pod no longer holds resources.
func Terminal(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// NodeReady tells whether a node may take new pods: not cordoned, not being
// deleted, not being drained by consolidation (taint gpufrac.io/draining,
// whatever the pods tolerate), and Ready.
func NodeReady(n *corev1.Node) bool {
	return !n.Spec.Unschedulable && n.DeletionTimestamp == nil && !Draining(n) && ReadyCondition(n)
}

// Draining tells whether consolidation drains the node (taint
// gpufrac.io/draining, written only by the coordinator).
func Draining(n *corev1.Node) bool {
	_, ok := DrainDeadline(n)
	return ok
}

// DrainingAt tells whether the node is drained at now: it carries the taint
// and the deadline in it has not passed (a zero now ignores the deadline).
// Past the deadline consolidation abandons the drain; a taint that outlives
// it (consolidation turned off mid-drain, which also takes the
// coordinator's right to write nodes, or node updates refused) keeps the
// node out no longer.
func DrainingAt(n *corev1.Node, now time.Time) bool {
	deadline, ok := DrainDeadline(n)
	return ok && (now.IsZero() || now.Unix() <= deadline)
}

// DrainDeadline is the deadline written in the node's gpufrac.io/draining
// taint (Unix seconds); ok is false when the node has no such taint. A value
// that does not parse is a deadline already passed.
func DrainDeadline(n *corev1.Node) (deadline int64, ok bool) {
	for _, t := range n.Spec.Taints {
		if t.Key == api.TaintDraining {
			d, err := strconv.ParseInt(t.Value, 10, 64)
			if err != nil {
				return 0, true
			}
			return d, true
		}
	}
	return 0, false
}

// ReadyCondition tells whether the node's Ready condition is True.
func ReadyCondition(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// FractionGPU is the GPU a fraction pod uses: the one the node agent gave it,
// else the one the coordinator chose.
func FractionGPU(p *corev1.Pod) string {
	if g := p.Annotations[api.AnnotationAllocatedGPU]; g != "" {
		return g
	}
	return p.Annotations[api.AnnotationGPU]
}

// IsReservation tells whether p is a gpufrac reservation pod.
func IsReservation(p *corev1.Pod) bool {
	return p.Namespace == api.ReservationNamespace && p.Labels[api.LabelRole] == api.RoleReservation
}

// UsesKubeChecks tells whether the pod asks for something that
// kube-scheduler's plugins check and placement does not
// (coordinator/kubecheck): a hard
// topology spread constraint, a required pod (anti-)affinity, a volume
// CheckedVolume reads, or a host port.
func UsesKubeChecks(pod *corev1.Pod) bool {
	for i := range pod.Spec.TopologySpreadConstraints {
		if pod.Spec.TopologySpreadConstraints[i].WhenUnsatisfiable == corev1.DoNotSchedule {
			return true
		}
	}
	if a := pod.Spec.Affinity; a != nil {
		if a.PodAffinity != nil && len(a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution) > 0 {
			return true
		}
		if a.PodAntiAffinity != nil && len(a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) > 0 {
			return true
		}
	}
	for i := range pod.Spec.Volumes {
		if CheckedVolume(&pod.Spec.Volumes[i]) {
			return true
		}
	}
	hostPort := func(cs []corev1.Container) bool {
		for i := range cs {
			for _, p := range cs[i].Ports {
				if p.HostPort > 0 {
					return true
				}
			}
		}
		return false
	}
	return hostPort(pod.Spec.Containers) || hostPort(pod.Spec.InitContainers)
}

// CheckedVolume tells whether kube-scheduler's volume plugins read v:
// claims (persistent and ephemeral) and the volume sources that attach a
// disk to the node. Config maps, secrets, projected and downward API
// volumes, empty dirs and host paths place nothing.
func CheckedVolume(v *corev1.Volume) bool {
	s := &v.VolumeSource
	return s.PersistentVolumeClaim != nil || s.Ephemeral != nil || s.CSI != nil ||
		s.GCEPersistentDisk != nil || s.AWSElasticBlockStore != nil || s.RBD != nil ||
		s.ISCSI != nil || s.AzureDisk != nil || s.Cinder != nil
}
