package placement

import (
	"errors"
	"fmt"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
)

const gib = 1 << 30

// gpuNode is a node with n empty GPUs of a model, plenty of CPU and memory.
func gpuNode(name, model string, n int) Node {
	nd := Node{Name: name, Model: model, CPUMilli: 64000, MemoryBytes: 256 * gib, GPUs: make([]GPU, n)}
	for g := range nd.GPUs {
		nd.GPUs[g] = GPU{ID: name + "-gpu" + strconv.Itoa(g), FreeMilli: MilliPerGPU}
	}
	return nd
}

func with(n Node, f func(*Node)) Node { f(&n); return n }

// placement is where one request went, or the reason it did not fit.
type placement struct {
	Node   string
	GPUs   []int
	Reason Reason
}

// placeAll places reqs in order on a snapshot of nodes, assuming each.
func placeAll(t *testing.T, policy string, nodes []Node, reqs []Request) []placement {
	t.Helper()
	s, err := NewSnapshot(nodes)
	if err != nil {
		t.Fatalf("NewSnapshot: %v", err)
	}
	p, err := New(policy, Options{Seed: 1})
	if err != nil {
		t.Fatalf("New(%q): %v", policy, err)
	}
	var out []placement
	for i := range reqs {
		d, err := p.Place(s, &reqs[i])
		var ue *UnschedulableError
		switch {
		case errors.As(err, &ue):
			out = append(out, placement{Reason: ue.Reason})
			continue
		case err != nil:
			t.Fatalf("Place(%+v): %v", reqs[i], err)
		}
		if err := s.Assume(&reqs[i], d); err != nil {
			t.Fatalf("Assume(%+v, %+v): %v", reqs[i], d, err)
		}
		out = append(out, placement{Node: d.Node, GPUs: d.GPUIndices})
	}
	return out
}

func repeat(r Request, n int) []Request {
	out := make([]Request, n)
	for i := range out {
		out[i] = r
	}
	return out
}

func TestPlace(t *testing.T) {
	tainted := with(gpuNode("tainted", "A100", 1), func(n *Node) {
		n.Taints = []corev1.Taint{{Key: "gpu", Value: "true", Effect: corev1.TaintEffectNoSchedule}}
	})
	soft := with(gpuNode("soft", "A100", 1), func(n *Node) {
		n.Taints = []corev1.Taint{{Key: "gpu", Value: "true", Effect: corev1.TaintEffectPreferNoSchedule}}
	})
	tolerate := &Constraints{Tolerations: []corev1.Toleration{{Key: "gpu", Operator: corev1.TolerationOpEqual, Value: "true", Effect: corev1.TaintEffectNoSchedule}}}
	labelled := func(name, pool string) Node {
		return with(gpuNode(name, "A100", 1), func(n *Node) {
			n.Labels = map[string]string{"pool": pool}
			n.Pool = pool
		})
	}
	affinity := &Constraints{Affinity: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
		MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "pool", Operator: corev1.NodeSelectorOpIn, Values: []string{"train"}}},
	}}}}
	tests := []struct {
		name   string
		policy string
		nodes  []Node
		reqs   []Request
		want   []placement
	}{{
		name:   "ten 10% shares fill one GPU under binpack, the eleventh opens the next",
		policy: "binpack",
		nodes:  []Node{gpuNode("a", "A100", 2), gpuNode("b", "A100", 2)},
		reqs:   repeat(Request{CPUMilli: 100, ShareMilli: 100}, 11),
		want: append(repeat2(placement{Node: "a", GPUs: []int{0}}, 10),
			placement{Node: "a", GPUs: []int{1}}),
	}, {
		name:   "whole GPUs are the lowest-index fully free ones",
		policy: "gpufrac",
		nodes: []Node{with(gpuNode("a", "A100", 4), func(n *Node) {
			n.GPUs[1].FreeMilli = 400
		})},
		reqs: []Request{{CPUMilli: 1000, GPUs: 2}, {CPUMilli: 1000, GPUs: 1}, {CPUMilli: 1000, GPUs: 1}},
		want: []placement{{Node: "a", GPUs: []int{0, 2}}, {Node: "a", GPUs: []int{3}}, {Reason: ReasonGPU}},
	}, {
		name:   "a share never exceeds its GPU",
		policy: "binpack",
		nodes:  []Node{with(gpuNode("a", "A100", 2), func(n *Node) { n.GPUs[0].FreeMilli = 300 })},
		reqs:   []Request{{ShareMilli: 400}, {ShareMilli: 300}},
		want:   []placement{{Node: "a", GPUs: []int{1}}, {Node: "a", GPUs: []int{0}}},
	}, {
		name:   "model constraints pick the allowed model and name the reason when none is left",
		policy: "gpufrac",
		nodes:  []Node{gpuNode("t4", "T4", 1), gpuNode("a100", "A100", 1)},
		reqs: []Request{
			{GPUs: 1, Models: []string{"A100"}},
			{GPUs: 1, Models: []string{"A100", "H100"}},
			{GPUs: 1, Models: []string{"H100"}},
			{ShareMilli: 500, Models: []string{"T4"}},
		},
		want: []placement{{Node: "a100", GPUs: []int{0}}, {Reason: ReasonGPU}, {Reason: ReasonModel}, {Node: "t4", GPUs: []int{0}}},
	}, {
		name:   "the GPU model label stands in for Model",
		policy: "gpufrac",
		nodes: []Node{with(gpuNode("x", "", 1), func(n *Node) {
			n.Labels = map[string]string{"nvidia.com/gpu.product": "NVIDIA-H100"}
		})},
		reqs: []Request{{GPUs: 1, Models: []string{"NVIDIA-H100"}}},
		want: []placement{{Node: "x", GPUs: []int{0}}},
	}, {
		name:   "NoSchedule taints need a toleration, PreferNoSchedule ones do not",
		policy: "gpufrac",
		nodes:  []Node{tainted, soft},
		reqs:   []Request{{GPUs: 1}, {GPUs: 1}, {GPUs: 1, Constraints: tolerate}},
		want:   []placement{{Node: "soft", GPUs: []int{0}}, {Reason: ReasonGPU}, {Node: "tainted", GPUs: []int{0}}},
	}, {
		name:   "required node affinity, node selector and pool",
		policy: "spread",
		nodes:  []Node{labelled("a", "infer"), labelled("b", "train"), labelled("c", "train")},
		reqs: []Request{
			{ShareMilli: 100, Constraints: affinity},
			{ShareMilli: 100, Constraints: &Constraints{NodeSelector: map[string]string{"pool": "infer"}}},
			{ShareMilli: 100, Constraints: &Constraints{Pool: "train"}},
			{ShareMilli: 100, Constraints: &Constraints{Pool: "batch"}},
		},
		want: []placement{{Node: "b", GPUs: []int{0}}, {Node: "a", GPUs: []int{0}}, {Node: "c", GPUs: []int{0}}, {Reason: ReasonConstraints}},
	}, {
		name:   "CPU and memory must fit",
		policy: "gpufrac",
		nodes: []Node{with(gpuNode("a", "A100", 2), func(n *Node) {
			n.CPUMilli, n.MemoryBytes, n.UsedCPUMilli = 8000, 16*gib, 2000
		})},
		reqs: []Request{
			{CPUMilli: 7000, GPUs: 1},
			{CPUMilli: 4000, MemoryBytes: 17 * gib, GPUs: 1},
			{CPUMilli: 6000, MemoryBytes: 16 * gib, GPUs: 1},
			{MemoryBytes: 1},
		},
		want: []placement{{Reason: ReasonCPU}, {Reason: ReasonMemory}, {Node: "a", GPUs: []int{0}}, {Reason: ReasonMemory}},
	}, {
		name:   "CPU-only requests take no GPU",
		policy: "fgd",
		nodes:  []Node{gpuNode("a", "A100", 1)},
		reqs:   []Request{{CPUMilli: 1000, MemoryBytes: gib}},
		want:   []placement{{Node: "a"}},
	}, {
		name:   "gpupacking prefers a partly used GPU to a fresh one",
		policy: "gpupacking",
		nodes:  []Node{gpuNode("a", "A100", 2), with(gpuNode("b", "A100", 2), func(n *Node) { n.GPUs[1].FreeMilli = 600 })},
		reqs:   []Request{{ShareMilli: 500}},
		want:   []placement{{Node: "b", GPUs: []int{1}}},
	}, {
		name:   "bestfit picks the node with the least left",
		policy: "bestfit",
		nodes:  []Node{gpuNode("big", "A100", 8), gpuNode("small", "A100", 1)},
		reqs:   []Request{{CPUMilli: 1000, GPUs: 1}},
		want:   []placement{{Node: "small", GPUs: []int{0}}},
	}, {
		name:   "gpuclustering keeps shares with shares",
		policy: "gpuclustering",
		nodes: []Node{
			with(gpuNode("whole", "A100", 4), func(n *Node) { n.GPUs[0].FreeMilli = 0; n.Kinds[1] = 1 }),
			with(gpuNode("shared", "A100", 4), func(n *Node) { n.GPUs[0].FreeMilli = 500; n.Kinds[0] = 1 }),
		},
		reqs: []Request{{ShareMilli: 300}, {GPUs: 1}},
		want: []placement{{Node: "shared", GPUs: []int{0}}, {Node: "whole", GPUs: []int{1}}},
	}, {
		name:   "fgd and gpufrac fill a hole rather than open a fresh GPU",
		policy: "gpufrac",
		nodes:  []Node{gpuNode("a", "A100", 2), with(gpuNode("b", "A100", 2), func(n *Node) { n.GPUs[1].FreeMilli = 530 })},
		reqs:   []Request{{CPUMilli: 1000, ShareMilli: 470}},
		want:   []placement{{Node: "b", GPUs: []int{1}}},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := placeAll(t, tc.policy, tc.nodes, tc.reqs)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("placements (-want +got):\n%s", diff)
			}
		})
	}
}

func repeat2(p placement, n int) []placement {
	out := make([]placement, n)
	for i := range out {
		out[i] = p
	}
	return out
}

// Two 60% shares can never share a GPU, whatever the policy.
func TestTwoLargeSharesNeverShareAGPU(t *testing.T) {
	for _, policy := range Policies() {
		t.Run(policy, func(t *testing.T) {
			got := placeAll(t, policy, []Node{gpuNode("a", "A100", 2)}, repeat(Request{ShareMilli: 600}, 3))
			if got[0].Node != "a" || got[1].Node != "a" || got[0].GPUs[0] == got[1].GPUs[0] {
				t.Errorf("first two placements %+v, %+v: want node a, different GPUs", got[0], got[1])
			}
			if got[2].Reason != ReasonGPU {
				t.Errorf("third 60%% share: got %+v, want reason %s", got[2], ReasonGPU)
			}
		})
	}
}

func TestUnschedulableError(t *testing.T) {
	main := func(n *Node) { n.Pool = "main" }
	nodes := []Node{
		with(gpuNode("full1", "A100", 1), func(n *Node) { main(n); n.GPUs[0].FreeMilli = 0 }),
		with(gpuNode("full2", "A100", 1), func(n *Node) { main(n); n.GPUs[0].FreeMilli = 499 }),
		with(gpuNode("busy", "A100", 1), func(n *Node) { main(n); n.UsedCPUMilli = n.CPUMilli }),
		with(gpuNode("t4", "T4", 1), main),
		with(gpuNode("other", "A100", 1), func(n *Node) { n.Pool = "other" }),
	}
	s, err := NewSnapshot(nodes)
	if err != nil {
		t.Fatal(err)
	}
	p, err := New("gpufrac", Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.Place(s, &Request{CPUMilli: 1000, ShareMilli: 500, Models: []string{"A100"}, Constraints: &Constraints{Pool: "main"}})
	if !errors.Is(err, ErrUnschedulable) {
		t.Fatalf("Place: got %v, want ErrUnschedulable", err)
	}
	var ue *UnschedulableError
	if !errors.As(err, &ue) {
		t.Fatalf("Place: %T is not *UnschedulableError", err)
	}
	want := &UnschedulableError{Reason: ReasonGPU, Nodes: 5, Counts: map[Reason]int{ReasonConstraints: 1, ReasonModel: 1, ReasonGPU: 2, ReasonCPU: 1}}
	if diff := cmp.Diff(want, ue); diff != "" {
		t.Errorf("error (-want +got):\n%s", diff)
	}
	if got, wantMsg := err.Error(), "0/5 nodes are available: 1 did not match the pod's node constraints, 1 had no allowed GPU model, 2 had insufficient GPU, 1 had insufficient CPU"; got != wantMsg {
		t.Errorf("message: got %q, want %q", got, wantMsg)
	}
}

func TestInvalidRequests(t *testing.T) {
	s, err := NewSnapshot([]Node{gpuNode("a", "A100", 1)})
	if err != nil {
		t.Fatal(err)
	}
	p, err := New("gpufrac", Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []Request{{ShareMilli: 1001}, {ShareMilli: -1}, {GPUs: -1}, {GPUs: 1, ShareMilli: 100}, {CPUMilli: -5}} {
		if _, err := p.Place(s, &r); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("Place(%+v): got %v, want ErrInvalidRequest", r, err)
		}
	}
	if _, err := New("nope", Options{}); err == nil {
		t.Error("New(unknown policy): got nil error")
	}
	for _, nodes := range [][]Node{
		{gpuNode("a", "A100", 1), gpuNode("a", "A100", 1)},
		{with(gpuNode("a", "A100", 1), func(n *Node) { n.GPUs[0].FreeMilli = 1001 })},
		{with(gpuNode("a", "A100", 1), func(n *Node) { n.UsedCPUMilli = n.CPUMilli + 1 })},
		{{}},
	} {
		if _, err := NewSnapshot(nodes); err == nil {
			t.Errorf("NewSnapshot(%+v): got nil error", nodes)
		}
	}
}

// Same seed, same decisions; the random policy depends on the seed.
func TestDeterministic(t *testing.T) {
	var nodes []Node
	for i := range 40 {
		nodes = append(nodes, gpuNode(fmt.Sprintf("n%02d", i), "A100", 2))
	}
	reqs := repeat(Request{CPUMilli: 1000, ShareMilli: 300}, 30)
	run := func(seed uint64) []placement {
		s, err := NewSnapshot(nodes)
		if err != nil {
			t.Fatal(err)
		}
		p, err := New("random", Options{Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		var out []placement
		for i := range reqs {
			d, err := p.Place(s, &reqs[i])
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Assume(&reqs[i], d); err != nil {
				t.Fatal(err)
			}
			out = append(out, placement{Node: d.Node, GPUs: d.GPUIndices})
		}
		return out
	}
	if diff := cmp.Diff(run(7), run(7)); diff != "" {
		t.Errorf("same seed, different decisions (-first +second):\n%s", diff)
	}
	if cmp.Equal(run(7), run(8)) {
		t.Error("seeds 7 and 8 made the same 30 random choices among 40 nodes")
	}
}

func TestPolicies(t *testing.T) {
	want := []string{"bestfit", "binpack", "dotprod", "fgd", "gpuclustering", "gpufrac", "gpupacking", "random", "spread"}
	if diff := cmp.Diff(want, Policies()); diff != "" {
		t.Errorf("Policies (-want +got):\n%s", diff)
	}
	for _, name := range Policies() {
		if _, err := New(name, Options{}); err != nil {
			t.Errorf("New(%q): %v", name, err)
		}
	}
}
