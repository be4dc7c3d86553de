package scheduler

import (
	"sort"

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

func withNodes(r *placement.Request, set map[string]bool, op corev1.NodeSelectorOperator) *placement.Request {
	names := make([]string, 0, len(set))
	for n := range set {
		names = append(names, n)
	}
	sort.Strings(names)
	notIn := corev1.NodeSelectorRequirement{Key: "metadata.name", Operator: op, Values: names}
	out := *r
	c := placement.Constraints{}
	if r.Constraints != nil {
		c = *r.Constraints
	}
	if c.Affinity == nil || len(c.Affinity.NodeSelectorTerms) == 0 {
		c.Affinity = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{notIn}}}}
	} else {
		aff := c.Affinity.DeepCopy()
		for i := range aff.NodeSelectorTerms {
			aff.NodeSelectorTerms[i].MatchFields = append(aff.NodeSelectorTerms[i].MatchFields, notIn)
		}
		c.Affinity = aff
	}
	out.Constraints = &c
	return &out
}
