package placement

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestSealedConstraints: a sealed key is the key of what the constraints
// say; the copies WithNodes and InPool make say more, so their keys differ
// (a stale key would share the sealed request's eligibility), and the
// eligibility cache keeps them apart.
func TestSealedConstraints(t *testing.T) {
	tols := []corev1.Toleration{{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}}
	fresh := func() *Constraints {
		return &Constraints{NodeSelector: map[string]string{"zone": "a"}, Tolerations: tols}
	}
	sealed := fresh().Sealed()
	if got, want := sealed.key(), fresh().key(); got != want {
		t.Fatalf("sealed key %q, want %q", got, want)
	}
	if !sealed.Equal(fresh()) {
		t.Error("sealed constraints not Equal to the same unsealed ones")
	}
	r := &Request{ShareMilli: 100, Constraints: sealed}
	pooled := InPool(*r, "p1")
	if pooled.Constraints.key() == sealed.key() || pooled.Constraints.key() != (&Constraints{NodeSelector: sealed.NodeSelector, Tolerations: tols, Pool: "p1"}).key() {
		t.Errorf("InPool of sealed constraints keyed %q", pooled.Constraints.key())
	}
	without := WithNodes(r, map[string]bool{"n1": true}, corev1.NodeSelectorOpNotIn)
	if without.Constraints.key() == sealed.key() {
		t.Errorf("WithNodes of sealed constraints kept the sealed key %q", sealed.key())
	}
	if sealed.key() != fresh().key() || sealed.Pool != "" || sealed.Affinity != nil {
		t.Error("InPool or WithNodes changed the sealed constraints")
	}

	// The eligibility cache: a node in pool p1 labelled zone=a is eligible
	// for the sealed request and for the pooled one; n1 is not for the one
	// without n1.
	s, err := NewSnapshot([]Node{{Name: "n1", Labels: map[string]string{"zone": "a"}, Pool: "p1", GPUs: []GPU{{ID: "g", FreeMilli: 1000}}}})
	if err != nil {
		t.Fatal(err)
	}
	if !s.Allows(r, 0) || !s.Allows(&pooled, 0) || s.Allows(without, 0) {
		t.Errorf("eligibility: sealed %v, pooled %v, without n1 %v; want true, true, false", s.Allows(r, 0), s.Allows(&pooled, 0), s.Allows(without, 0))
	}
}
