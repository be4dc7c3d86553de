package placement

import (
	"sort"
	"unique"

	corev1 "k8s.io/api/core/v1"
)

// WithNodes returns a copy of r whose required node affinity also names
// nodes (by metadata.name): op NotIn excludes them, op In allows only them.
// A field requirement takes exactly one value (component-helpers'
// nodeaffinity refuses more, and a selector that does not parse matches no
// node), so NotIn becomes one requirement per node in every term (ANDed),
// and In one copy of every term per node (ORed).
func WithNodes(r *Request, set map[string]bool, op corev1.NodeSelectorOperator) *Request {
	names := make([]string, 0, len(set))
	for n := range set {
		names = append(names, n)
	}
	sort.Strings(names)
	out := *r
	c := Constraints{}
	if r.Constraints != nil {
		c = *r.Constraints
		c.sealed = unique.Handle[string]{} // changed below
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

// InPool returns a copy of r constrained to the node pool pool: a gang
// placed whole in one pool. The pool "" is the nodes without a pool label
// (static nodes beside Karpenter's pools), not every node.
func InPool(r Request, pool string) Request {
	c := Constraints{}
	if r.Constraints != nil {
		c = *r.Constraints
		c.sealed = unique.Handle[string]{} // changed below
	}
	c.Pool, c.Unpooled = pool, pool == ""
	r.Constraints = &c
	return r
}
