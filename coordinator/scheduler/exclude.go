package scheduler

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/gpufrac/gpufrac/coordinator/placement"
)

// withExcludedNodes returns a copy of r whose required node affinity also
// excludes the named nodes (by metadata.name), added to every term so it is
// ANDed with the pod's own affinity.
func withExcludedNodes(r *placement.Request, exclude map[string]bool) *placement.Request {
	return withNodes(r, exclude, corev1.NodeSelectorOpNotIn)
}

// withOnlyNodes returns a copy of r restricted to the named nodes.
func withOnlyNodes(r *placement.Request, only map[string]bool) *placement.Request {
	return withNodes(r, only, corev1.NodeSelectorOpIn)
}

// withNodes adds the named nodes to r's required affinity (placement.WithNodes).
func withNodes(r *placement.Request, set map[string]bool, op corev1.NodeSelectorOperator) *placement.Request {
	return placement.WithNodes(r, set, op)
}
