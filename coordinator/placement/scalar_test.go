package placement

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const (
	mig1g   = "nvidia.com/mig-1g.10gb"
	mig3g   = "nvidia.com/mig-3g.40gb"
	replica = "nvidia.com/gpu.shared"
)

// scalarNode is a node without whole or fraction GPUs serving scalars.
func scalarNode(name, model string, scalars map[string]int64) Node {
	return Node{Name: name, Model: model, CPUMilli: 64000, MemoryBytes: 256 * gib, Scalars: scalars}
}

func TestPlaceScalars(t *testing.T) {
	migNode := scalarNode("mig", "H100", map[string]int64{mig1g: 2, mig3g: 1})
	tsNode := scalarNode("ts", "A100", map[string]int64{replica: 4})
	mixed := with(gpuNode("mixed", "H100", 2), func(n *Node) { n.Scalars = map[string]int64{mig1g: 7} })
	for _, policy := range []string{"gpufrac", "fgd", "bestfit", "random", "gpuclustering", "gpupacking", "dotprod", "binpack", "spread"} {
		t.Run(policy, func(t *testing.T) {
			tests := []struct {
				name  string
				nodes []Node
				reqs  []Request
				want  []placement
			}{
				{
					name:  "MIG devices fill the only node serving them, then no node fits",
					nodes: []Node{gpuNode("plain", "H100", 8), migNode},
					reqs:  repeat(Request{CPUMilli: 1000, Scalars: map[string]int64{mig1g: 1}}, 3),
					want:  []placement{{Node: "mig"}, {Node: "mig"}, {Reason: ReasonScalar}},
				},
				{
					name:  "two units in one request need a node with two free",
					nodes: []Node{scalarNode("one", "", map[string]int64{replica: 1}), tsNode},
					reqs:  []Request{{Scalars: map[string]int64{replica: 2}}, {Scalars: map[string]int64{replica: 3}}},
					want:  []placement{{Node: "ts"}, {Reason: ReasonScalar}},
				},
				{
					name:  "a resource no node has never fits",
					nodes: []Node{migNode, tsNode},
					reqs:  []Request{{Scalars: map[string]int64{"nvidia.com/mig-7g.80gb": 1}}},
					want:  []placement{{Reason: ReasonScalar}},
				},
				{
					name:  "GPU models apply to nodes that only serve scalars",
					nodes: []Node{tsNode, scalarNode("ts-h100", "H100", map[string]int64{replica: 4})},
					reqs:  []Request{{Models: []string{"H100"}, Scalars: map[string]int64{replica: 1}}},
					want:  []placement{{Node: "ts-h100"}},
				},
				{
					name:  "scalars and whole GPUs of one node are charged apart",
					nodes: []Node{mixed},
					reqs:  []Request{{GPUs: 2}, {Scalars: map[string]int64{mig1g: 7}}, {GPUs: 1}, {Scalars: map[string]int64{mig1g: 1}}},
					want:  []placement{{Node: "mixed", GPUs: []int{0, 1}}, {Node: "mixed"}, {Reason: ReasonGPU}, {Reason: ReasonScalar}},
				},
				{
					name:  "CPU still counts for scalar requests",
					nodes: []Node{with(migNode, func(n *Node) { n.CPUMilli = 1000 })},
					reqs:  []Request{{CPUMilli: 2000, Scalars: map[string]int64{mig1g: 1}}},
					want:  []placement{{Reason: ReasonCPU}},
				},
				{
					name:  "zero units ask for nothing",
					nodes: []Node{gpuNode("plain", "H100", 1)},
					reqs:  []Request{{GPUs: 1, Scalars: map[string]int64{mig1g: 0}}},
					want:  []placement{{Node: "plain", GPUs: []int{0}}},
				},
			}
			for _, tc := range tests {
				t.Run(tc.name, func(t *testing.T) {
					got := placeAll(t, policy, tc.nodes, tc.reqs)
					if diff := cmp.Diff(tc.want, got); diff != "" {
						t.Errorf("placements (-want +got):\n%s", diff)
					}
				})
			}
		})
	}
}

func TestScalarUnschedulableErrorNamesTheResource(t *testing.T) {
	nodes := []Node{
		scalarNode("a", "", map[string]int64{mig1g: 1, mig3g: 0}),
		scalarNode("b", "", map[string]int64{mig1g: 0, mig3g: 1}),
		scalarNode("c", "", map[string]int64{mig1g: 0, mig3g: 0}),
		gpuNode("d", "", 1),
	}
	tests := []struct {
		name     string
		req      Request
		resource string
		counts   map[Reason]int
		msg      string
	}{
		{
			name:     "one resource short everywhere",
			req:      Request{Scalars: map[string]int64{mig1g: 2}},
			resource: mig1g,
			counts:   map[Reason]int{ReasonScalar: 4},
			msg:      "0/4 nodes are available: 4 had insufficient " + mig1g,
		},
		{
			name: "two resources: each node counts under the first it lacks by name, the most frequent is named",
			req:  Request{Scalars: map[string]int64{mig1g: 1, mig3g: 1}},
			// a lacks 3g; b, c and d lack 1g first.
			resource: mig1g,
			counts:   map[Reason]int{ReasonScalar: 4},
			msg:      "0/4 nodes are available: 4 had insufficient " + mig1g,
		},
		{
			name:     "GPU is checked before scalars",
			req:      Request{GPUs: 1, Scalars: map[string]int64{replica: 1}},
			resource: replica,
			counts:   map[Reason]int{ReasonGPU: 3, ReasonScalar: 1},
			msg:      "0/4 nodes are available: 3 had insufficient GPU, 1 had insufficient " + replica,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := NewSnapshot(nodes)
			if err != nil {
				t.Fatal(err)
			}
			p, err := New("gpufrac", Options{})
			if err != nil {
				t.Fatal(err)
			}
			_, err = p.Place(s, &tc.req)
			var ue *UnschedulableError
			if !errors.As(err, &ue) || !errors.Is(err, ErrUnschedulable) {
				t.Fatalf("Place: %v, want an *UnschedulableError", err)
			}
			if ue.Resource != tc.resource {
				t.Errorf("Resource = %q, want %q", ue.Resource, tc.resource)
			}
			if diff := cmp.Diff(tc.counts, ue.Counts); diff != "" {
				t.Errorf("Counts (-want +got):\n%s", diff)
			}
			if ue.Error() != tc.msg {
				t.Errorf("message %q, want %q", ue.Error(), tc.msg)
			}
		})
	}
}

func TestScalarsAssumeForgetAndRollback(t *testing.T) {
	s, err := NewSnapshot([]Node{
		gpuNode("plain", "", 1),
		scalarNode("mig", "", map[string]int64{mig1g: 3, mig3g: 1}),
	})
	if err != nil {
		t.Fatal(err)
	}
	scalarsOf := func() map[string]int64 { return s.Node(1).Scalars }
	one := Request{Scalars: map[string]int64{mig1g: 1}}
	two := Request{Scalars: map[string]int64{mig1g: 2, mig3g: 1}}
	onMIG := Decision{Node: "mig", NodeIndex: 1}

	mustAssume(t, s, &one, onMIG)
	if diff := cmp.Diff(map[string]int64{mig1g: 2, mig3g: 1}, scalarsOf()); diff != "" {
		t.Fatalf("after Assume (-want +got):\n%s", diff)
	}
	if s.Node(0).Scalars != nil {
		t.Errorf("node without scalars reports %v", s.Node(0).Scalars)
	}

	// A gang placed virtually, then rolled back: the counts come back.
	cp := s.Checkpoint()
	mustAssume(t, s, &two, onMIG)
	if diff := cmp.Diff(map[string]int64{mig1g: 0, mig3g: 0}, scalarsOf()); diff != "" {
		t.Fatalf("inside the checkpoint (-want +got):\n%s", diff)
	}
	if err := s.Assume(&one, onMIG); !errors.Is(err, ErrConflict) {
		t.Errorf("Assume beyond the free units: %v, want ErrConflict", err)
	}
	if err := s.Rollback(cp); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]int64{mig1g: 2, mig3g: 1}, scalarsOf()); diff != "" {
		t.Fatalf("after Rollback (-want +got):\n%s", diff)
	}

	// Committed changes stay; Forget gives back.
	cp = s.Checkpoint()
	mustAssume(t, s, &two, onMIG)
	if err := s.Commit(cp); err != nil {
		t.Fatal(err)
	}
	if err := s.Forget(&two, onMIG); err != nil {
		t.Fatal(err)
	}
	if err := s.Forget(&one, onMIG); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]int64{mig1g: 3, mig3g: 1}, scalarsOf()); diff != "" {
		t.Fatalf("after Forget (-want +got):\n%s", diff)
	}

	// The wrong node: nothing is taken.
	if err := s.Assume(&one, Decision{Node: "plain", NodeIndex: 0}); !errors.Is(err, ErrConflict) {
		t.Errorf("Assume on a node without the resource: %v, want ErrConflict", err)
	}
	if err := s.Assume(&Request{Scalars: map[string]int64{"nvidia.com/unknown": 1}}, onMIG); !errors.Is(err, ErrConflict) {
		t.Errorf("Assume of an unknown resource: %v, want ErrConflict", err)
	}
	if diff := cmp.Diff(map[string]int64{mig1g: 3, mig3g: 1}, scalarsOf()); diff != "" {
		t.Errorf("failed Assumes changed the counts (-want +got):\n%s", diff)
	}
}

func TestScalarsCloneIsIndependent(t *testing.T) {
	s, err := NewSnapshot([]Node{scalarNode("ts", "", map[string]int64{replica: 4})})
	if err != nil {
		t.Fatal(err)
	}
	c := s.Clone()
	mustAssume(t, c, &Request{Scalars: map[string]int64{replica: 3}}, Decision{Node: "ts"})
	if got := s.Node(0).Scalars[replica]; got != 4 {
		t.Errorf("original has %d replicas free after the clone took 3, want 4", got)
	}
	if got := c.Node(0).Scalars[replica]; got != 1 {
		t.Errorf("clone has %d replicas free, want 1", got)
	}
	if diff := cmp.Diff([]string{replica}, c.ScalarNames()); diff != "" {
		t.Errorf("ScalarNames (-want +got):\n%s", diff)
	}
}

func TestScalarValidation(t *testing.T) {
	if _, err := NewSnapshot([]Node{scalarNode("bad", "", map[string]int64{mig1g: -1})}); err == nil || !strings.Contains(err.Error(), mig1g) {
		t.Errorf("NewSnapshot with negative free units: %v, want an error naming the resource", err)
	}
	for _, r := range []Request{
		{Scalars: map[string]int64{mig1g: -1}},
		{Scalars: map[string]int64{"": 1}},
	} {
		if err := r.Validate(); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("Validate(%v) = %v, want ErrInvalidRequest", r.Scalars, err)
		}
	}
}
