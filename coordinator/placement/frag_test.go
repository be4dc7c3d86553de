package placement

import (
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestFragMeterNode(t *testing.T) {
	// Half of the pods ask 500 milli with 4 cores, half a whole GPU with 16.
	typical := []Typical{
		{CPUMilli: 4000, GPUs: 1, MilliPerGPU: 500, Weight: 0.5},
		{CPUMilli: 16000, GPUs: 1, MilliPerGPU: 1000, Weight: 0.5},
	}
	tests := []struct {
		name string
		node Node
		want float64
	}{{
		name: "fresh node: nothing is fragment",
		node: gpuNode("n", "A100", 2),
		want: 0,
	}, {
		// 300 free is too small for both shapes: 0.5×300 + 0.5×300.
		name: "a 300-milli hole is fragment for both shapes",
		node: with(gpuNode("n", "A100", 2), func(n *Node) { n.GPUs[1].FreeMilli = 300 }),
		want: 300,
	}, {
		// 600 fits the share but not a whole GPU: 0.5×600 for the whole pods.
		name: "a 600-milli hole is fragment for whole pods only",
		node: with(gpuNode("n", "A100", 2), func(n *Node) { n.GPUs[1].FreeMilli = 600 }),
		want: 300,
	}, {
		// 8 cores: whole pods (16 cores) cannot run at all: 0.5×(1000+600).
		name: "too little CPU for whole pods makes all idle GPU fragment for them",
		node: with(gpuNode("n", "A100", 2), func(n *Node) {
			n.GPUs[1].FreeMilli = 600
			n.CPUMilli = 8000
		}),
		want: 800,
	}, {
		name: "no GPU free, no fragment",
		node: with(gpuNode("n", "A100", 1), func(n *Node) { n.GPUs[0].FreeMilli = 0 }),
		want: 0,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := NewSnapshot([]Node{tc.node})
			if err != nil {
				t.Fatal(err)
			}
			m, err := NewFragMeter(typical)
			if err != nil {
				t.Fatal(err)
			}
			if got := m.Node(s, 0); math.Abs(got-tc.want) > 1e-9 {
				t.Errorf("Node: got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestFragMeterModelsAndCPUOnly(t *testing.T) {
	typical := []Typical{
		{CPUMilli: 1000, GPUs: 1, MilliPerGPU: 1000, Models: []string{"T4"}, Weight: 0.5},
		{CPUMilli: 1000, Weight: 0.5}, // CPU-only pods never use GPUs
	}
	m, err := NewFragMeter(typical)
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewSnapshot([]Node{gpuNode("t4", "T4", 1), gpuNode("a100", "A100", 1)})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := m.Node(s, 0), 500.0; got != want {
		t.Errorf("T4 node: got %v, want %v (the CPU-only half)", got, want)
	}
	if got, want := m.Node(s, 1), 1000.0; got != want {
		t.Errorf("A100 node: got %v, want %v (no typical pod can use it)", got, want)
	}
	if got, want := m.Cluster(s), 1500.0; got != want {
		t.Errorf("Cluster: got %v, want %v", got, want)
	}
}

func TestFGDScoreFollowsTheArtifactFormula(t *testing.T) {
	typical := []Typical{
		{CPUMilli: 4000, GPUs: 1, MilliPerGPU: 500, Weight: 0.5},
		{CPUMilli: 16000, GPUs: 1, MilliPerGPU: 1000, Weight: 0.5},
	}
	s, err := NewSnapshot([]Node{with(gpuNode("n", "A100", 2), func(n *Node) { n.GPUs[1].FreeMilli = 600 })})
	if err != nil {
		t.Fatal(err)
	}
	p, err := New("fgd", Options{Typical: typical})
	if err != nil {
		t.Fatal(err)
	}
	// Before: F = 300 (see TestFragMeterNode). A 500 share on GPU 1 leaves
	// 100, fragment for both: F = 100, score int(100·σ(0.2)) = 54. On GPU 0 it
	// leaves [500, 600]: F = 0.5·1100 = 550, score int(100·σ(−0.25)) = 43.
	d, err := p.Place(s, &Request{CPUMilli: 1000, ShareMilli: 500})
	if err != nil {
		t.Fatal(err)
	}
	want := Decision{Node: "n", GPUs: []string{"n-gpu1"}, GPUIndices: []int{1}, MilliPerGPU: 500, Score: 54}
	if diff := cmp.Diff(want, d); diff != "" {
		t.Errorf("decision (-want +got):\n%s", diff)
	}
}

func TestTypicalFromRequests(t *testing.T) {
	var reqs []Request
	add := func(n int, r Request) {
		for range n {
			reqs = append(reqs, r)
		}
	}
	add(5, Request{CPUMilli: 4000, MemoryBytes: 2 * gib, ShareMilli: 500})
	add(3, Request{CPUMilli: 8000, MemoryBytes: 4 * gib, GPUs: 1})
	add(1, Request{CPUMilli: 8000, MemoryBytes: 6 * gib, GPUs: 1}) // same shape, memory averaged
	add(2, Request{CPUMilli: 2000, Models: []string{"B", "A"}, ShareMilli: 200})
	add(2, Request{CPUMilli: 1000})
	add(1, Request{CPUMilli: 64000, GPUs: 8})
	// 14 requests; 0.8 coverage needs 11.2: shapes of 5, 4, then a tie of
	// 2 and 2 (larger CPU first: the share of 2000), then 13 >= 11.2.
	got := TypicalFromRequests(reqs, 0.8)
	want := []Typical{
		{CPUMilli: 4000, MemoryBytes: 2 * gib, GPUs: 1, MilliPerGPU: 500, Weight: 5.0 / 13},
		{CPUMilli: 8000, MemoryBytes: 4*gib + gib/2, GPUs: 1, MilliPerGPU: 1000, Weight: 4.0 / 13},
		{CPUMilli: 2000, GPUs: 1, MilliPerGPU: 200, Models: []string{"A", "B"}, Weight: 2.0 / 13},
		{CPUMilli: 1000, Weight: 2.0 / 13},
	}
	if diff := cmp.Diff(want, got, cmpopts.EquateApprox(0, 1e-12)); diff != "" {
		t.Errorf("TypicalFromRequests (-want +got):\n%s", diff)
	}
	if got := TypicalFromRequests(reqs, 1); len(got) != 5 {
		t.Errorf("coverage 1: got %d shapes, want all 5", len(got))
	}
}

func TestHoleValues(t *testing.T) {
	typical := []Typical{
		{GPUs: 1, MilliPerGPU: 1000, Weight: 0.5},
		{GPUs: 1, MilliPerGPU: 500, Weight: 0.2},
		{GPUs: 1, MilliPerGPU: 400, Weight: 0.0125}, // fills with probability 40·0.0125 = 0.5
		{Weight: 0.2875}, // CPU-only: never fills a hole
	}
	v := holeValues(typical, 1)
	checks := []struct {
		h    int
		want float64
	}{
		{h: 0, want: 0},
		{h: 399, want: 399},                           // nothing fits: all of it is lost
		{h: 400, want: 0.5 * 400},                     // half the time a 400 takes it
		{h: 500, want: (0.2*0 + 0.0125*100) / 0.2125}, // β = 1: the next fitting pod
	}
	for _, c := range checks {
		if math.Abs(v[c.h]-c.want) > 1e-9 {
			t.Errorf("V(%d) = %v, want %v", c.h, v[c.h], c.want)
		}
	}
	for h := 1; h <= MilliPerGPU; h++ {
		if v[h] < 0 || v[h] > float64(h) {
			t.Errorf("V(%d) = %v outside 0..%d", h, v[h], h)
		}
	}
}
