package placement

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
)

// Reasons kube-scheduler's filter plugins give, as the coordinator's
// kubecheck passes them on (Request.Filter).
const (
	spreadReason       = "node(s) didn't match pod topology spread constraints"
	antiAffinityReason = "node(s) didn't match pod anti-affinity rules"
	portsReason        = "node(s) didn't have free ports for the requested pod ports"
)

// fakeFilter rejects the nodes of reject with their reasons (an empty list:
// no reason given), allows the others, and records every question.
type fakeFilter struct {
	reject map[string][]string
	// only, when set, allows only these nodes (with reason "not wanted").
	only  map[string]bool
	asked []string
}

func (f *fakeFilter) Allows(node string) (bool, []string) {
	f.asked = append(f.asked, node)
	if f.only != nil && !f.only[node] {
		return false, []string{"not wanted"}
	}
	if why, ok := f.reject[node]; ok {
		return false, why
	}
	return true, nil
}

func rejecting(reason string, nodes ...string) *fakeFilter {
	f := &fakeFilter{reject: map[string][]string{}}
	for _, n := range nodes {
		f.reject[n] = []string{reason}
	}
	return f
}

// mixedNodes differ in every way the policies score: free GPUs, partly
// used GPUs, CPU and memory in use, GPU count and model.
func mixedNodes() []Node {
	return []Node{
		gpuNode("empty8", "A100", 8),
		with(gpuNode("half8", "A100", 8), func(n *Node) {
			for g := range 4 {
				n.GPUs[g].FreeMilli = 0
			}
			n.UsedCPUMilli, n.UsedMemoryBytes = 32000, 100*gib
			n.Kinds[1] = 4
		}),
		with(gpuNode("holes4", "A100", 4), func(n *Node) {
			n.GPUs[0].FreeMilli, n.GPUs[1].FreeMilli = 300, 700
			n.Kinds[0] = 2
		}),
		gpuNode("one", "A100", 1),
		with(gpuNode("t4x2", "T4", 2), func(n *Node) { n.UsedCPUMilli = 60000 }),
		with(gpuNode("almost", "A100", 2), func(n *Node) { n.GPUs[0].FreeMilli = 100 }),
	}
}

func newPlacer(t *testing.T, policy string, nodes []Node) (*Placer, *Snapshot) {
	t.Helper()
	s, err := NewSnapshot(nodes)
	if err != nil {
		t.Fatalf("NewSnapshot: %v", err)
	}
	p, err := New(policy, Options{Seed: 3})
	if err != nil {
		t.Fatalf("New(%q): %v", policy, err)
	}
	return p, s
}

// A filter never changes how nodes score, only which may be chosen: with
// the node Place chose rejected, it chooses the best of the rest (the
// highest score, the first in the snapshot on a tie), for every policy and
// request kind, and with that one rejected too the next, down to none.
func TestFilterRejectingTheBestChoosesTheNextBest(t *testing.T) {
	reqs := map[string]Request{
		"whole GPU":  {CPUMilli: 4000, MemoryBytes: 8 * gib, GPUs: 1},
		"two GPUs":   {CPUMilli: 2000, GPUs: 2},
		"share":      {CPUMilli: 1000, ShareMilli: 300},
		"big share":  {CPUMilli: 1000, ShareMilli: 700},
		"CPU only":   {CPUMilli: 2000, MemoryBytes: gib},
		"T4 allowed": {GPUs: 1, Models: []string{"T4", "A100"}},
	}
	for _, policy := range Policies() {
		if policy == "random" {
			continue // no scores; see TestRandomPolicyHonoursTheFilter
		}
		for rname, r := range reqs {
			t.Run(policy+"/"+rname, func(t *testing.T) {
				p, s := newPlacer(t, policy, mixedNodes())
				// Each node's score, alone allowed.
				score := map[string]float64{}
				var order []string // fitting nodes, in snapshot order
				for _, n := range mixedNodes() {
					r := r
					r.Filter = &fakeFilter{only: map[string]bool{n.Name: true}}
					d, err := p.Place(s, &r)
					if errors.Is(err, ErrUnschedulable) {
						continue
					}
					if err != nil {
						t.Fatalf("Place with only %s allowed: %v", n.Name, err)
					}
					if d.Node != n.Name {
						t.Fatalf("only %s allowed, placed on %s", n.Name, d.Node)
					}
					score[n.Name] = d.Score
					order = append(order, n.Name)
				}
				if len(order) < 2 {
					t.Fatalf("%d fitting nodes: the test needs at least two", len(order))
				}
				rejected := map[string][]string{}
				for range order {
					r := r
					r.Filter = &fakeFilter{reject: rejected}
					d, err := p.Place(s, &r)
					want := ""
					for _, n := range order {
						if _, no := rejected[n]; !no && (want == "" || score[n] > score[want]) {
							want = n
						}
					}
					if err != nil {
						t.Fatalf("rejected %v: Place: %v (want %s)", keys(rejected), err, want)
					}
					if d.Node != want {
						t.Fatalf("rejected %v: placed on %s (score %v), want %s (score %v); scores %v", keys(rejected), d.Node, d.Score, want, score[want], score)
					}
					if d.Score != score[want] {
						t.Errorf("rejected %v: decision scored %v, alone %v", keys(rejected), d.Score, score[want])
					}
					rejected[d.Node] = []string{spreadReason}
				}
				// Every fitting node rejected: unschedulable, for the filter's reason.
				r.Filter = &fakeFilter{reject: rejected}
				_, err := p.Place(s, &r)
				var ue *UnschedulableError
				if !errors.As(err, &ue) {
					t.Fatalf("all fitting nodes rejected: got %v, want *UnschedulableError", err)
				}
				if ue.Counts[ReasonFilter] != len(order) || ue.Filtered[spreadReason] != len(order) {
					t.Errorf("all fitting nodes rejected: counts %v, filtered %v, want %d under %s", ue.Counts, ue.Filtered, len(order), ReasonFilter)
				}
			})
		}
	}
}

func keys(m map[string][]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// The filter is asked only about nodes that pass every other check (GPU,
// model, scalar resources, CPU, memory, constraints), each at most once per
// Place.
func TestFilterAskedOnlyAboutNodesThatFit(t *testing.T) {
	nodes := []Node{
		with(gpuNode("no-gpu", "A100", 2), func(n *Node) { n.GPUs[0].FreeMilli, n.GPUs[1].FreeMilli = 0, 200 }),
		with(gpuNode("no-cpu", "A100", 2), func(n *Node) { n.UsedCPUMilli = n.CPUMilli - 500 }),
		with(gpuNode("no-mem", "A100", 2), func(n *Node) { n.UsedMemoryBytes = n.MemoryBytes - gib }),
		with(gpuNode("tainted", "A100", 2), func(n *Node) {
			n.Taints = []corev1.Taint{{Key: "dedicated", Value: "x", Effect: corev1.TaintEffectNoSchedule}}
		}),
		with(gpuNode("other-pool", "A100", 2), func(n *Node) { n.Pool = "other" }),
		gpuNode("t4", "T4", 2),
		with(gpuNode("no-mig", "A100", 2), func(n *Node) { n.Scalars = map[string]int64{"example.com/thing": 0} }),
		gpuNode("fits-a", "A100", 2),
		gpuNode("fits-b", "A100", 4),
	}
	for i := range nodes {
		if nodes[i].Name != "other-pool" {
			nodes[i].Pool = "main"
		}
		if nodes[i].Name != "no-mig" {
			nodes[i].Scalars = map[string]int64{"example.com/thing": 2}
		}
	}
	r := Request{CPUMilli: 1000, MemoryBytes: 4 * gib, GPUs: 1, Models: []string{"A100"},
		Scalars: map[string]int64{"example.com/thing": 1}, Constraints: &Constraints{Pool: "main"}}
	fitting := []string{"fits-a", "fits-b"}
	for _, policy := range Policies() {
		t.Run(policy, func(t *testing.T) {
			p, s := newPlacer(t, policy, nodes)
			// A filter that allows everything.
			all := &fakeFilter{}
			r := r
			r.Filter = all
			d, err := p.Place(s, &r)
			if err != nil {
				t.Fatalf("Place: %v", err)
			}
			if !slices.Contains(fitting, d.Node) {
				t.Errorf("placed on %s, which does not fit", d.Node)
			}
			for _, n := range all.asked {
				if !slices.Contains(fitting, n) {
					t.Errorf("filter asked about %s, which fails another check (asked %v)", n, all.asked)
				}
			}
			if !slices.Contains(all.asked, d.Node) {
				t.Errorf("filter never asked about the chosen node %s (asked %v)", d.Node, all.asked)
			}
			// A filter that rejects everything: asked about each fitting
			// node exactly once, and about nothing else.
			none := rejecting(antiAffinityReason, "no-gpu", "no-cpu", "no-mem", "tainted", "other-pool", "t4", "no-mig", "fits-a", "fits-b")
			r.Filter = none
			_, err = p.Place(s, &r)
			var ue *UnschedulableError
			if !errors.As(err, &ue) {
				t.Fatalf("all rejected: got %v, want *UnschedulableError", err)
			}
			asked := slices.Clone(none.asked)
			slices.Sort(asked)
			if diff := cmp.Diff(fitting, asked); diff != "" {
				t.Errorf("filter asked (-want +got):\n%s", diff)
			}
			want := map[Reason]int{ReasonConstraints: 2, ReasonModel: 1, ReasonGPU: 1, ReasonScalar: 1, ReasonCPU: 1, ReasonMemory: 1, ReasonFilter: 2}
			if diff := cmp.Diff(want, ue.Counts); diff != "" {
				t.Errorf("counts (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(map[string]int{antiAffinityReason: 2}, ue.Filtered); diff != "" {
				t.Errorf("filtered (-want +got):\n%s", diff)
			}
		})
	}
}

// With no node fitting otherwise, Place never asks the filter at all.
func TestFilterNotAskedWhenNothingFits(t *testing.T) {
	for _, policy := range Policies() {
		p, s := newPlacer(t, policy, []Node{gpuNode("a", "A100", 1), gpuNode("b", "T4", 4)})
		f := &fakeFilter{}
		_, err := p.Place(s, &Request{GPUs: 2, Models: []string{"A100"}, Filter: f})
		var ue *UnschedulableError
		if !errors.As(err, &ue) {
			t.Fatalf("%s: got %v, want *UnschedulableError", policy, err)
		}
		if len(f.asked) != 0 || ue.Counts[ReasonFilter] != 0 || ue.Filtered != nil {
			t.Errorf("%s: filter asked %v, counts %v, filtered %v: want it never asked", policy, f.asked, ue.Counts, ue.Filtered)
		}
	}
}

// Every fitting node rejected: the error counts them under ReasonFilter, by
// the filter's own reasons, and reads like kube-scheduler's FitError.
func TestFilterRejectingAllIsUnschedulable(t *testing.T) {
	full := with(gpuNode("full", "A100", 1), func(n *Node) { n.GPUs[0].FreeMilli = 0 })
	tests := []struct {
		name     string
		nodes    []Node
		filter   *fakeFilter
		reason   Reason
		counts   map[Reason]int
		filtered map[string]int
		msg      string
	}{{
		name:     "one without GPU, two off the spread",
		nodes:    []Node{full, gpuNode("z1", "A100", 1), gpuNode("z2", "A100", 1)},
		filter:   rejecting(spreadReason, "z1", "z2"),
		reason:   ReasonFilter,
		counts:   map[Reason]int{ReasonGPU: 1, ReasonFilter: 2},
		filtered: map[string]int{spreadReason: 2},
		msg:      "0/3 nodes are available: 1 had insufficient GPU, 2 node(s) didn't match pod topology spread constraints",
	}, {
		name:  "reasons counted by node, sorted; a node with two counts under both",
		nodes: []Node{gpuNode("a", "A100", 1), gpuNode("b", "A100", 1), gpuNode("c", "A100", 1)},
		filter: &fakeFilter{reject: map[string][]string{
			"a": {spreadReason},
			"b": {antiAffinityReason, portsReason},
			"c": {portsReason},
		}},
		reason:   ReasonFilter,
		counts:   map[Reason]int{ReasonFilter: 3},
		filtered: map[string]int{spreadReason: 1, antiAffinityReason: 1, portsReason: 2},
		msg:      "0/3 nodes are available: 1 node(s) didn't match pod anti-affinity rules, 1 node(s) didn't match pod topology spread constraints, 2 node(s) didn't have free ports for the requested pod ports",
	}, {
		name:     "a filter that gives no reason",
		nodes:    []Node{gpuNode("a", "A100", 1)},
		filter:   &fakeFilter{reject: map[string][]string{"a": nil}},
		reason:   ReasonFilter,
		counts:   map[Reason]int{ReasonFilter: 1},
		filtered: map[string]int{"node(s) were rejected by the request's filter": 1},
		msg:      "0/1 nodes are available: 1 node(s) were rejected by the request's filter",
	}, {
		name:     "the most frequent reason wins; the filter's on a tie (checked last)",
		nodes:    []Node{full, with(full, func(n *Node) { n.Name = "full2" }), gpuNode("a", "A100", 1), gpuNode("b", "A100", 1)},
		filter:   rejecting(spreadReason, "a", "b"),
		reason:   ReasonFilter,
		counts:   map[Reason]int{ReasonGPU: 2, ReasonFilter: 2},
		filtered: map[string]int{spreadReason: 2},
		msg:      "0/4 nodes are available: 2 had insufficient GPU, 2 node(s) didn't match pod topology spread constraints",
	}, {
		name: "GPU the most frequent",
		nodes: []Node{full, with(full, func(n *Node) { n.Name = "full2" }),
			with(full, func(n *Node) { n.Name = "full3" }), gpuNode("a", "A100", 1)},
		filter:   rejecting(portsReason, "a"),
		reason:   ReasonGPU,
		counts:   map[Reason]int{ReasonGPU: 3, ReasonFilter: 1},
		filtered: map[string]int{portsReason: 1},
		msg:      "0/4 nodes are available: 3 had insufficient GPU, 1 node(s) didn't have free ports for the requested pod ports",
	}}
	for _, tc := range tests {
		for _, policy := range Policies() {
			t.Run(tc.name+"/"+policy, func(t *testing.T) {
				p, s := newPlacer(t, policy, tc.nodes)
				f := *tc.filter
				_, err := p.Place(s, &Request{CPUMilli: 1000, GPUs: 1, Filter: &f})
				if !errors.Is(err, ErrUnschedulable) {
					t.Fatalf("Place: got %v, want ErrUnschedulable", err)
				}
				var ue *UnschedulableError
				if !errors.As(err, &ue) {
					t.Fatalf("Place: %T is not *UnschedulableError", err)
				}
				want := &UnschedulableError{Reason: tc.reason, Nodes: len(tc.nodes), Counts: tc.counts, Filtered: tc.filtered}
				if diff := cmp.Diff(want, ue); diff != "" {
					t.Errorf("error (-want +got):\n%s", diff)
				}
				if got := err.Error(); got != tc.msg {
					t.Errorf("message:\n got %q\nwant %q", got, tc.msg)
				}
			})
		}
	}
}

// The random policy draws only among the nodes the filter allows, and
// asks it only about nodes that fit otherwise.
func TestRandomPolicyHonoursTheFilter(t *testing.T) {
	var nodes []Node
	for i := range 20 {
		nodes = append(nodes, gpuNode(fmt.Sprintf("n%02d", i), "A100", 2))
	}
	nodes[3].GPUs[0].FreeMilli, nodes[3].GPUs[1].FreeMilli = 0, 0 // fits no whole GPU
	allowed := map[string]bool{"n03": true, "n05": true, "n11": true, "n17": true}
	for seed := range uint64(50) {
		s, err := NewSnapshot(nodes)
		if err != nil {
			t.Fatal(err)
		}
		p, err := New("random", Options{Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			f := &fakeFilter{only: allowed}
			r := Request{CPUMilli: 100, GPUs: 1, Filter: f}
			d, err := p.Place(s, &r)
			if err != nil {
				t.Fatalf("seed %d: Place: %v", seed, err)
			}
			if !allowed[d.Node] || d.Node == "n03" {
				t.Fatalf("seed %d: placed on %s, which the filter rejects or has no GPU free", seed, d.Node)
			}
			if slices.Contains(f.asked, "n03") {
				t.Errorf("seed %d: filter asked about n03, which has no GPU free", seed)
			}
		}
		// Every allowed node taken: the fourth is unschedulable, by the filter.
		if seed == 0 {
			for _, n := range []string{"n05", "n11", "n17"} {
				i := slices.IndexFunc(nodes, func(x Node) bool { return x.Name == n })
				for range 2 {
					r := Request{CPUMilli: 100, GPUs: 1}
					if err := s.Assume(&r, Decision{Node: n, NodeIndex: i, GPUIndices: []int{freeGPU(s, i)}, MilliPerGPU: MilliPerGPU}); err != nil {
						t.Fatalf("Assume on %s: %v", n, err)
					}
				}
			}
			_, err := p.Place(s, &Request{CPUMilli: 100, GPUs: 1, Filter: &fakeFilter{only: allowed}})
			var ue *UnschedulableError
			if !errors.As(err, &ue) {
				t.Fatalf("allowed nodes full: got %v, want *UnschedulableError", err)
			}
			if ue.Counts[ReasonFilter] != 16 || ue.Counts[ReasonGPU] != 4 || ue.Filtered["not wanted"] != 16 {
				t.Errorf("allowed nodes full: counts %v filtered %v, want 16 filtered and 4 without GPU", ue.Counts, ue.Filtered)
			}
			if !strings.Contains(err.Error(), "4 had insufficient GPU, 16 not wanted") {
				t.Errorf("message %q", err.Error())
			}
		}
	}
}

// freeGPU is the lowest-index GPU of node i that is all free.
func freeGPU(s *Snapshot, i int) int {
	for g, f := range s.gpus(i) {
		if f == MilliPerGPU {
			return g
		}
	}
	return -1
}

// Request.Filter documents that Place asks it "only about nodes that pass
// every other check and would be chosen, best first, so a filter that
// allows the best node costs one call". Place asks it instead about every
// fitting node that scores above the best allowed so far, in snapshot
// order: with nodes in rising score order, a filter that allows every node
// is asked about each of them (for the coordinator, one run of
// kube-scheduler's Filter plugins per node instead of one per pod).
func TestFilterAllowingTheBestCostsOneCall(t *testing.T) {
	// Under spread the emptier node scores higher: rising order.
	nodes := []Node{
		with(gpuNode("a", "A100", 4), func(n *Node) { n.GPUs[0].FreeMilli, n.GPUs[1].FreeMilli, n.GPUs[2].FreeMilli = 0, 0, 0 }),
		with(gpuNode("b", "A100", 4), func(n *Node) { n.GPUs[0].FreeMilli, n.GPUs[1].FreeMilli = 0, 0 }),
		with(gpuNode("c", "A100", 4), func(n *Node) { n.GPUs[0].FreeMilli = 0 }),
		gpuNode("d", "A100", 4),
	}
	p, s := newPlacer(t, "spread", nodes)
	f := &fakeFilter{}
	d, err := p.Place(s, &Request{CPUMilli: 100, GPUs: 1, Filter: f})
	if err != nil {
		t.Fatal(err)
	}
	if d.Node != "d" {
		t.Fatalf("spread placed on %s, want the emptiest node d", d.Node)
	}
	if len(f.asked) != 1 {
		t.Errorf("a filter allowing every node was asked %d times (%v), want once (the chosen node), as Request.Filter documents", len(f.asked), f.asked)
	}
}
