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

// withNodes adds the named nodes to r's required affinity as metadata.name
// field requirements. A field requirement takes exactly one value
// (component-helpers' nodeaffinity refuses more, and a selector that does
// not parse matches no node), so NotIn becomes one requirement per node in
// every term (ANDed), and In one copy of every term per node (ORed).
func withNodes(r *placement.Request, set map[string]bool, op corev1.NodeSelectorOperator) *placement.Request {
	names := make([]string, 0, len(set))
	for n := range set {
		names = append(names, n)
	}
	sort.Strings(names)
	out := *r
	c := placement.Constraints{}
	if r.Constraints != nil {
		c = *r.Constraints
	}
	terms := []corev1.NodeSelectorTerm{{}}
	if c.Affinity != nil && len(c.Affinity.NodeSelectorTerms) > 0 {
		terms = c.Affinity.DeepCopy().NodeSelectorTerms
	}
	field := func(name string) corev1.NodeSelectorRequirement {
		return corev1.NodeSelectorRequirement{Key: "metadata.name", Operator: op, Values: []string{name}}
	}
	var result []corev1.NodeSelectorTerm
	if op == corev1.NodeSelectorOpNotIn {
		for _, t := range terms {
			for _, n := range names {
				t.MatchFields = append(t.MatchFields, field(n))
			}
			result = append(result, t)
		}
	} else {
		for _, t := range terms {
			for _, n := range names {
				u := *t.DeepCopy()
				u.MatchFields = append(u.MatchFields, field(n))
				result = append(result, u)
			}
		}
	}
	c.Affinity = &corev1.NodeSelector{NodeSelectorTerms: result}
	out.Constraints = &c
	return &out
}
