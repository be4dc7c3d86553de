package scheduler

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpufrac/gpufrac/coordinator/placement"
)

// TestNodeSetsMatchAsTheyRead places a one-GPU request on five nodes with
// node sets of several names: metadata.name field requirements take one
// value each, so a set of several must still parse and match.
func TestNodeSetsMatchAsTheyRead(t *testing.T) {
	names := []string{"a", "b", "c", "d", "e"}
	var nodes []placement.Node
	for _, n := range names {
		nodes = append(nodes, placement.Node{Name: n, Labels: map[string]string{"zone": map[bool]string{true: "x", false: "y"}[n < "c"]},
			CPUMilli: 1000, MemoryBytes: 1 << 30, GPUs: []placement.GPU{{ID: n, FreeMilli: placement.MilliPerGPU}}})
	}
	snap, err := placement.NewSnapshot(nodes)
	if err != nil {
		t.Fatal(err)
	}
	p, err := placement.New("spread", placement.Options{})
	if err != nil {
		t.Fatal(err)
	}
	zoneX := &placement.Constraints{Affinity: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{
		{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"x"}}}},
	}}}
	set := func(ns ...string) map[string]bool {
		m := map[string]bool{}
		for _, n := range ns {
			m[n] = true
		}
		return m
	}
	for _, tc := range []struct {
		name string
		req  *placement.Request
		want []string // nodes the request may go to
	}{
		{name: "excluding three nodes", req: withExcludedNodes(&placement.Request{GPUs: 1}, set("a", "c", "e")), want: []string{"b", "d"}},
		{name: "excluding one node", req: withExcludedNodes(&placement.Request{GPUs: 1}, set("a")), want: []string{"b", "c", "d", "e"}},
		{name: "only two nodes", req: withOnlyNodes(&placement.Request{GPUs: 1}, set("b", "e")), want: []string{"b", "e"}},
		{name: "excluding nodes ANDs with the pod's affinity", req: withExcludedNodes(&placement.Request{GPUs: 1, Constraints: zoneX}, set("a", "d")), want: []string{"b"}},
		{name: "only nodes ANDs with the pod's affinity", req: withOnlyNodes(&placement.Request{GPUs: 1, Constraints: zoneX}, set("a", "c", "e")), want: []string{"a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Take the chosen node away each time: the nodes it may use come out one by one.
			s := snap.Clone()
			var got []string
			for {
				d, err := p.Place(s, tc.req)
				if err != nil {
					break
				}
				got = append(got, d.Node)
				if err := s.Assume(tc.req, d); err != nil {
					t.Fatal(err)
				}
			}
			if diff := cmp.Diff(tc.want, slices.Sorted(slices.Values(got))); diff != "" {
				t.Errorf("nodes (-want +got):\n%s", diff)
			}
		})
	}
	if zoneX.Affinity.NodeSelectorTerms[0].MatchFields != nil {
		t.Error("the pod's own affinity was changed")
	}
}
