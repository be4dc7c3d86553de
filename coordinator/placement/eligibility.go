package placement

import (
	"strings"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
)

// Per-node eligibility codes.
const (
	eligible           uint8 = 0
	rejectsConstraints uint8 = 1
	rejectsModel       uint8 = 2
	// rejectsScalar marks a node lacking a scalar resource the request asks
	// for; only withScalars sets it, never the cached eligibility.
	rejectsScalar uint8 = 3
)

// eligibility is the static part of feasibility for one request class:
// node selector, required affinity, taints, pool and GPU model. It depends
// only on node labels and taints, which never change in a snapshot, so it is
// computed once per class and kept off the hot loop.
type eligibility struct {
	code []uint8 // node index -> eligible / rejectsConstraints / rejectsModel
	any  bool    // at least one node is eligible
}

func (e *eligibility) ok(i int) bool { return e == nil || e.code[i] == eligible }

// Allows tells whether node i may take r by its labels and taints: r's
// node selector, required affinity, tolerations, pool and GPU models. Free
// capacity is not looked at (Assume checks it).
func (s *Snapshot) Allows(r *Request, i int) bool {
	return i >= 0 && i < len(s.nodes) && s.eligibilityFor(r).ok(i)
}

// eligKey is a request class: its GPU models and its constraints' key. A
// struct, not their concatenation: a sealed key (Constraints.Sealed) and one
// model are then looked up without making a string.
type eligKey struct{ models, constraints string }

// eligibilityFor returns the eligibility of the request's class, nil when
// every node is eligible (no models, no constraints, no node tainted).
func (s *Snapshot) eligibilityFor(r *Request) *eligibility {
	if len(r.Models) == 0 && r.Constraints == nil && !s.tainted {
		return nil
	}
	key := eligKey{models: strings.Join(r.Models, "|"), constraints: r.Constraints.key()}
	s.eligMu.Lock()
	defer s.eligMu.Unlock()
	if e, ok := s.elig[key]; ok {
		return e
	}
	e := s.computeEligibility(r)
	s.elig[key] = e
	return e
}

func (s *Snapshot) computeEligibility(r *Request) *eligibility {
	e := &eligibility{code: make([]uint8, len(s.nodes))}
	var models []bool // model index -> allowed
	if len(r.Models) > 0 {
		models = make([]bool, len(s.models))
		for m, name := range s.models {
			for _, want := range r.Models {
				if want == name {
					models[m] = true
				}
			}
		}
	}
	c := r.Constraints
	if c == nil {
		c = &Constraints{} // taints still apply
	}
	pod := &corev1.Pod{Spec: corev1.PodSpec{NodeSelector: c.NodeSelector}}
	if c.Affinity != nil {
		pod.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: c.Affinity,
		}}
	}
	affinity := nodeaffinity.GetRequiredNodeAffinity(pod)
	for i := range s.nodes {
		st := &s.nodes[i]
		switch {
		case !constraintsAllow(c, affinity, s.meta[i]):
			e.code[i] = rejectsConstraints
		case models != nil && (st.model < 0 || !models[st.model]):
			e.code[i] = rejectsModel
		default:
			e.any = true
		}
	}
	return e
}

func constraintsAllow(c *Constraints, affinity nodeaffinity.RequiredNodeAffinity, n *Node) bool {
	if c.Pool != "" && c.Pool != n.Pool || c.Unpooled && n.Pool != "" {
		return false
	}
	if len(c.NodeSelector) > 0 || c.Affinity != nil {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: n.Labels}}
		if ok, err := affinity.Match(node); err != nil || !ok {
			// A selector that does not parse matches no node, as in kube-scheduler.
			return false
		}
	}
	// Placement is pure and logs nothing: the helper logs only for the taint comparison
	// operators (TaintTolerationComparisonOperators, alpha and off in 1.36), left off here
	// as in kube-scheduler.
	_, untolerated := corev1helpers.FindMatchingUntoleratedTaint(logr.Discard(), n.Taints, c.Tolerations, blocksScheduling, false)
	return !untolerated
}

// blocksScheduling selects the taints a pod must tolerate to be placed.
func blocksScheduling(t *corev1.Taint) bool {
	return t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute
}
