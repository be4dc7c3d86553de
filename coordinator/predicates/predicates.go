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
