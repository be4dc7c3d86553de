package placement

import (
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// checkBookkeeping recomputes what the snapshot keeps in step (free milli by
// model and in all) and compares.
func checkBookkeeping(t *testing.T, s *Snapshot) {
	t.Helper()
	modelFree := make([]int64, len(s.models))
	var free int64
	for i := range s.nodes {
		st := &s.nodes[i]
		var f int32
		for _, x := range s.gpus(i) {
			f += x
		}
		free += int64(f)
		if st.model >= 0 {
			modelFree[st.model] += int64(f)
		}
	}
	if free != s.freeMilli {
		t.Fatalf("free milli %d, recomputed %d", s.freeMilli, free)
	}
	if diff := cmp.Diff(modelFree, s.modelFree); diff != "" {
		t.Fatalf("free milli by model (-recomputed +kept):\n%s", diff)
	}
}

// demandCluster: two 2-GPU B nodes (32 cores) and two 8-GPU A nodes (96
// cores), in the order b0, a0, b1, a1 (ties go to the first).
func demandCluster(t *testing.T) *Snapshot {
	t.Helper()
	var nodes []Node
	for i := range 2 {
		a := gpuNode(fmt.Sprintf("a%d", i), "A", 8)
		a.CPUMilli = 96000
		b := gpuNode(fmt.Sprintf("b%d", i), "B", 2)
		b.CPUMilli = 32000
		nodes = append(nodes, b, a)
	}
	s, err := NewSnapshot(nodes)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestAddDemandSortsDemandByHostModels(t *testing.T) {
	s := demandCluster(t)
	for _, r := range []Request{
		{CPUMilli: 4000, GPUs: 1},                                  // any model
		{CPUMilli: 4000, ShareMilli: 500},                          // any model
		{CPUMilli: 4000, GPUs: 1, Models: []string{"B"}},           // B by its list
		{CPUMilli: 4000, GPUs: 1, Models: []string{"B", "A", "B"}}, // any model, listed
		{CPUMilli: 40000, GPUs: 1},                                 // A by size: CPU
		{CPUMilli: 4000, GPUs: 4},                                  // A by size: GPUs
		{CPUMilli: 4000, GPUs: 4, Models: []string{"B"}},           // nowhere: not counted
		{CPUMilli: 4000, GPUs: 1, Models: []string{"H100"}},        // nowhere: not counted
		{CPUMilli: 4000},                                           // no GPU: not counted
	} {
		s.AddDemand(&r)
	}
	type set struct {
		Models []string
		Milli  int64
		Multi  map[int]int64
	}
	var got []set
	for _, ds := range s.demand.sets {
		st := set{Milli: ds.milli, Multi: map[int]int64{}}
		for _, m := range ds.models {
			st.Models = append(st.Models, s.models[m])
		}
		for k, v := range ds.multi {
			if v != 0 {
				st.Multi[k] = v
			}
		}
		got = append(got, st)
	}
	want := []set{
		{Models: []string{"B"}, Milli: 1000, Multi: map[int]int64{}},
		{Models: []string{"A"}, Milli: 5000, Multi: map[int]int64{4: 4000}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("demand sets (-want +got):\n%s", diff)
	}
	if s.demand.total != 8500 {
		t.Errorf("total demand %d, want 8500 (the requests some node can host)", s.demand.total)
	}
	c := s.Clone()
	c.AddDemand(&Request{CPUMilli: 4000, GPUs: 1, Models: []string{"B"}})
	if s.demand.sets[0].milli != 1000 || c.demand.sets[0].milli != 2000 {
		t.Errorf("AddDemand on a clone changed the original: %d, clone %d", s.demand.sets[0].milli, c.demand.sets[0].milli)
	}
}

// decide places r with gpufrac on s, without assuming it.
func decide(t *testing.T, s *Snapshot, r Request) string {
	t.Helper()
	p, err := New("gpufrac", Options{})
	if err != nil {
		t.Fatal(err)
	}
	d, err := p.Place(s, &r)
	if err != nil {
		t.Fatal(err)
	}
	return d.Node
}

func TestChargesKeepFlexiblePodsOffAPressedModel(t *testing.T) {
	flexible := Request{CPUMilli: 4000, GPUs: 1}
	onB := Request{CPUMilli: 4000, GPUs: 1, Models: []string{"B"}}

	s := demandCluster(t)
	// b0 runs one pod: one GPU free. Without demand, gpufrac fills it.
	mustAssume(t, s, &onB, Decision{Node: "b0", NodeIndex: 0, GPUIndices: []int{0}})
	if got := decide(t, s, flexible); got != "b0" {
		t.Fatalf("without demand the flexible pod goes to %s; the test needs b0", got)
	}
	// B-only demand of 3 GPUs (3 of 3 free B GPUs: π = 3/20·17/3 > 1).
	for range 3 {
		s.AddDemand(&onB)
	}
	s.AddDemand(&flexible)
	if got := decide(t, s, flexible); got == "b0" || got == "b1" {
		t.Errorf("with B-only demand on every free B GPU the flexible pod goes to %s, want an A node", got)
	}
	if got := decide(t, s, onB); got != "b0" {
		t.Errorf("a B-only pod goes to %s, want b0 (charges are the same on every B node)", got)
	}

	// Demand that leaves B room to spare charges nothing: the flexible pod
	// fills b0 as without demand.
	s = demandCluster(t)
	mustAssume(t, s, &onB, Decision{Node: "b0", NodeIndex: 0, GPUIndices: []int{0}})
	s.AddDemand(&onB)
	for range 30 {
		s.AddDemand(&flexible)
	}
	if got := decide(t, s, flexible); got != "b0" {
		t.Errorf("with little B-only demand the flexible pod goes to %s, want b0", got)
	}
}

func TestChargesKeepTheLastSlotsForMultiGPUDemand(t *testing.T) {
	one := Request{CPUMilli: 40000, GPUs: 1} // too much CPU for a B node
	eight := Request{CPUMilli: 8000, GPUs: 8}
	s := demandCluster(t)
	// a1 has 7 GPUs free: no 8-GPU slot there; a0 is the only one.
	mustAssume(t, s, &one, Decision{Node: "a1", NodeIndex: 3, GPUIndices: []int{0}})
	if got := decide(t, s, one); got != "a0" {
		t.Fatalf("without demand a one-GPU pod goes to %s; the test needs a0", got)
	}
	s.AddDemand(&eight)
	s.AddDemand(&one)
	if got := decide(t, s, one); got == "a0" {
		t.Errorf("with 8-GPU demand the one-GPU pod breaks the last 8-GPU slot (a0)")
	}
	if got := decide(t, s, eight); got != "a0" {
		t.Errorf("the 8-GPU pod goes to %s, want a0", got)
	}
	checkBookkeeping(t, s)
}

// Before any pod of its kind is seen, a model's last k-GPU slot is kept
// for the first one (gpufracSlotPrior): on a large cluster, a pod that may
// only use model A, which has two 8-GPU nodes, leaves alone the one that
// still has 8 free GPUs. On the small demandCluster the prior is too small
// to move it.
func TestChargesKeepAModelsLastSlotBeforeItsDemandIsSeen(t *testing.T) {
	onA := Request{CPUMilli: 4000, GPUs: 1, Models: []string{"A"}}
	var nodes []Node
	for i := range 2 {
		a := gpuNode(fmt.Sprintf("a%d", i), "A", 8)
		a.CPUMilli = 96000
		nodes = append(nodes, a)
	}
	for i := range 800 { // 6.4M free milli, most of it on model C
		c := gpuNode(fmt.Sprintf("c%d", i), "C", 8)
		c.CPUMilli = 96000
		nodes = append(nodes, c)
	}
	s, err := NewSnapshot(nodes)
	if err != nil {
		t.Fatal(err)
	}
	mustAssume(t, s, &onA, Decision{Node: "a1", NodeIndex: 1, GPUIndices: []int{0}})
	if got := decide(t, s, onA); got != "a0" {
		t.Fatalf("without demand the A-only pod goes to %s; the test needs a0", got)
	}
	s.AddDemand(&onA)
	if got := decide(t, s, onA); got != "a1" {
		t.Errorf("the A-only pod goes to %s, want a1: a0 holds model A's last 8-GPU slot", got)
	}

	small := demandCluster(t)
	one := Request{CPUMilli: 40000, GPUs: 1} // too much CPU for a B node
	mustAssume(t, small, &one, Decision{Node: "a1", NodeIndex: 3, GPUIndices: []int{0}})
	small.AddDemand(&one)
	small.AddDemand(&Request{CPUMilli: 4000, GPUs: 2})
	if got := decide(t, small, one); got != "a0" {
		t.Errorf("on a small cluster the one-GPU pod goes to %s, want a0 (the prior is tiny there)", got)
	}
}

// CPU-only pods pay for the k-GPU slots they break by taking CPU: with
// 8-GPU demand asking 88 cores, a CPU-only pod leaves alone the one node with
// 8 free GPUs and 88 cores free.
func TestChargesKeepTheCPUOfMultiGPUSlots(t *testing.T) {
	cpuOnly := Request{CPUMilli: 16000}
	eight := Request{CPUMilli: 88000, GPUs: 8}
	small := Request{CPUMilli: 16000, GPUs: 1}
	s := demandCluster(t)
	// a1 keeps 8 free GPUs but only 80 cores: no slot for the 8-GPU pods.
	mustAssume(t, s, &Request{CPUMilli: 16000}, Decision{Node: "a1", NodeIndex: 3})
	// Fill the B nodes, so that the CPU-only pod has A nodes only.
	for _, b := range []Decision{{Node: "b0", NodeIndex: 0}, {Node: "b1", NodeIndex: 2}} {
		for g := range 2 {
			b.GPUIndices = []int{g}
			mustAssume(t, s, &small, b)
		}
	}
	if got := decide(t, s, cpuOnly); got != "a0" {
		t.Fatalf("without demand the CPU-only pod goes to %s; the test needs a0", got)
	}
	s.AddDemand(&eight)
	s.AddDemand(&small)
	if got := decide(t, s, cpuOnly); got == "a0" {
		t.Errorf("with 88-core 8-GPU demand the CPU-only pod takes the CPU of the last slot (a0)")
	}
	if got := decide(t, s, eight); got != "a0" {
		t.Errorf("the 8-GPU pod goes to %s, want a0", got)
	}
}

// Before any pod that needs it was seen, a pod of model P that asks little
// CPU leaves alone the fully free GPUs of P's only node with more CPU than
// its other P nodes have, on a large cluster; on a small one the prior is
// tiny and it goes where it packs best.
func TestChargesKeepAModelsCPURichGPUsBeforeTheirDemandIsSeen(t *testing.T) {
	onP := Request{CPUMilli: 8000, GPUs: 1, Models: []string{"P"}}
	cluster := func(others int) *Snapshot {
		nodes := []Node{
			with(gpuNode("p64", "P", 2), func(n *Node) { n.CPUMilli = 64000 }),
			with(gpuNode("p24", "P", 2), func(n *Node) { n.CPUMilli = 24000 }),
		}
		for i := range others { // 8,000 free milli each, model C
			nodes = append(nodes, with(gpuNode(fmt.Sprintf("c%d", i), "C", 8), func(n *Node) { n.CPUMilli = 96000 }))
		}
		s, err := NewSnapshot(nodes)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	large := cluster(800)
	if got := decide(t, large, onP); got != "p64" {
		t.Fatalf("without demand the P-only pod goes to %s; the test needs p64", got)
	}
	large.AddDemand(&onP)
	if got := decide(t, large, onP); got != "p24" {
		t.Errorf("the P-only pod goes to %s, want p24: p64's GPUs are P's only ones with more than 24 cores", got)
	}
	small := cluster(1)
	small.AddDemand(&onP)
	if got := decide(t, small, onP); got != "p64" {
		t.Errorf("on a small cluster the P-only pod goes to %s, want p64 (the prior is tiny there)", got)
	}
}

// Where CPU-only pods ask much of the workload's CPU, slot charges start at
// a lower pressure (slotRamp): 8-GPU demand at π = 0.2 on the last 8-GPU
// slot with 88 cores charges nothing when CPU-only pods are few (charges
// start at 0.3), and keeps a CPU-only pod off that slot's CPU when they ask
// half of the CPU (charges start at 0.1).
func TestChargesStartEarlierWhenCPUOnlyDemandIsLarge(t *testing.T) {
	cpuOnly := Request{CPUMilli: 16000}
	eight := Request{CPUMilli: 88000, GPUs: 8}
	small := Request{CPUMilli: 16000, GPUs: 1}
	cluster := func(cpuOnlyPods int) *Snapshot {
		s := demandCluster(t)
		// a1 keeps 8 free GPUs but only 80 cores: a0 holds the only slot.
		mustAssume(t, s, &cpuOnly, Decision{Node: "a1", NodeIndex: 3})
		for _, b := range []Decision{{Node: "b0", NodeIndex: 0}, {Node: "b1", NodeIndex: 2}} {
			for g := range 2 {
				b.GPUIndices = []int{g}
				mustAssume(t, s, &small, b)
			}
		}
		// 8,000 of 80,000 milli of GPU demand in 8-GPU pods, 16,000 milli
		// free, one slot: π = 8/80·16/8 = 0.2.
		s.AddDemand(&eight)
		for range 72 {
			s.AddDemand(&small)
		}
		for range cpuOnlyPods {
			s.AddDemand(&cpuOnly)
		}
		return s
	}
	few := cluster(2) // 32 of 1,272 cores asked by CPU-only pods
	if got := decide(t, few, cpuOnly); got != "a0" {
		t.Errorf("with few CPU-only pods the CPU-only pod goes to %s, want a0 (π = 0.2 charges nothing)", got)
	}
	if from, full := slotRamp(&few.demand); from != gpufracSlotPressureFrom || full != gpufracPressureFull {
		t.Errorf("slot ramp with few CPU-only pods: %v to %v, want %v to %v", from, full, gpufracSlotPressureFrom, gpufracPressureFull)
	}
	many := cluster(80) // 1,280 of 2,520 cores
	if got := decide(t, many, cpuOnly); got == "a0" {
		t.Errorf("with CPU-only pods asking half of the CPU the CPU-only pod takes the CPU of the last 8-GPU slot (a0)")
	}
	if from, full := slotRamp(&many.demand); math.Abs(from-gpufracSlotPressureFromCPU) > 1e-9 || full != gpufracSlotPressureFullCPU {
		t.Errorf("slot ramp with many CPU-only pods: %v to %v, want %v to %v", from, full, gpufracSlotPressureFromCPU, gpufracSlotPressureFullCPU)
	}
	if c := many.Clone(); c.demand.cpuOnly != 1280000 || c.demand.gpuCPU != 1240000 {
		t.Errorf("clone's CPU demand: CPU-only %d, GPU pods %d, want 1280000 and 1240000", c.demand.cpuOnly, c.demand.gpuCPU)
	}
}

// A k-GPU pod asking more CPU than any other model's k-GPU nodes have can
// only use the CPU-rich model's nodes (on openb, an 8-GPU pod asking 120
// cores fits only the 128-core G3 nodes): their last such slots are kept
// before any such pod was seen.
func TestChargesKeepTheOnlySlotsForCPURichMultiGPUPods(t *testing.T) {
	onG := Request{CPUMilli: 8000, GPUs: 1, Models: []string{"G"}}
	cpuOnly := Request{CPUMilli: 32000}
	cluster := func(others int) *Snapshot {
		nodes := []Node{
			with(gpuNode("g0", "G", 8), func(n *Node) { n.CPUMilli = 128000 }),
			with(gpuNode("g1", "G", 8), func(n *Node) { n.CPUMilli = 128000 }),
		}
		for i := range others { // 8,000 free milli each, model C, 96 cores
			nodes = append(nodes, with(gpuNode(fmt.Sprintf("c%d", i), "C", 8), func(n *Node) { n.CPUMilli = 96000 }))
		}
		s, err := NewSnapshot(nodes)
		if err != nil {
			t.Fatal(err)
		}
		// g1 keeps its 8 GPUs free but only 90 cores: an 8-GPU slot of G
		// for any CPU up to 90 cores, not for more than C's 96.
		mustAssume(t, s, &Request{CPUMilli: 38000}, Decision{Node: "g1", NodeIndex: 1})
		s.AddDemand(&Request{CPUMilli: 8000, GPUs: 2}) // constrained demand: some charges are computed
		return s
	}
	large := cluster(800)
	if got := decide(t, large, onG); got != "g1" {
		t.Errorf("the G-only pod goes to %s, want g1: g0 is the last node with 8 free GPUs and more than 96 cores", got)
	}
	if got := decide(t, large, cpuOnly); got == "g0" {
		t.Errorf("the CPU-only pod takes the CPU of g0, the last node with 8 free GPUs and more than 96 cores")
	}
	small := cluster(1)
	small.AddDemand(&Request{CPUMilli: 90000, GPUs: 8}) // π = 0.8 on the three 90-core slots: g1 and c0 are charged
	if got := decide(t, small, cpuOnly); got != "g0" {
		t.Errorf("on a small cluster the CPU-only pod goes to %s, want g0 (the prior is tiny there)", got)
	}
}

func TestOnlyModelCPU(t *testing.T) {
	types := []hostType{ // openb's largest node types per model and GPU count
		{model: 0, gpus: 8, cpu: 96000},  // G2
		{model: 1, gpus: 8, cpu: 128000}, // G3
		{model: 2, gpus: 2, cpu: 104000}, // T4
		{model: 3, gpus: 1, cpu: 128000}, // A10
	}
	for _, c := range []struct {
		m, k int32
		cpu  int64
		ok   bool
	}{
		{m: 1, k: 8, cpu: 97000, ok: true},  // G3 above G2's 96 cores
		{m: 1, k: 2, cpu: 105000, ok: true}, // G3 above T4's 104
		{m: 1, k: 1, cpu: 129000},           // A10 has as much
		{m: 0, k: 8, cpu: 129000},           // G3 has more
		{m: 2, k: 2, cpu: 129000},
	} {
		cpu, ok := onlyModelCPU(types, c.m, c.k)
		if ok != c.ok || ok && cpu != c.cpu {
			t.Errorf("onlyModelCPU(model %d, k %d) = %d, %v; want %d, %v", c.m, c.k, cpu, ok, c.cpu, c.ok)
		}
	}
	if _, ok := onlyModelCPU(types[1:2], 1, 8); ok {
		t.Errorf("onlyModelCPU on one model: ok, want none (its own k-GPU slots are that class)")
	}
}

// Another model's k-GPU nodes with no allocatable CPU host only k-GPU pods
// asking no CPU: from one core, model m's nodes are the only ones left, as
// when no other model had k GPUs with more CPU than m's.
func TestOnlyModelCPUAgainstNodesWithoutCPU(t *testing.T) {
	types := []hostType{{model: 0, gpus: 8, cpu: 0}, {model: 1, gpus: 8, cpu: 128000}}
	if cpu, ok := onlyModelCPU(types, 1, 8); !ok || cpu != 1000 {
		t.Errorf("onlyModelCPU(model 1, k 8) = %d, %v; want 1000, true (model 0's 8-GPU nodes have no CPU)", cpu, ok)
	}
	if _, ok := onlyModelCPU(types, 0, 8); ok {
		t.Errorf("onlyModelCPU(model 0, k 8): ok, want none (model 1 has more CPU)")
	}
}

// onlyModelCPU's one core more never wraps around: a slot query at a
// negative CPU would count like the prior at no CPU and charge the model's
// k-GPU slots twice.
func TestOnlyModelCPUNeverWraps(t *testing.T) {
	types := []hostType{{model: 0, gpus: 8, cpu: math.MaxInt64 - 1}, {model: 1, gpus: 8, cpu: math.MaxInt64}}
	if cpu, ok := onlyModelCPU(types, 1, 8); ok && cpu <= types[0].cpu {
		t.Errorf("onlyModelCPU(model 1, k 8) = %d, true; want more than model 0's %d or none", cpu, types[0].cpu)
	}
}

// The prior reads node types only, on whatever nodes the cluster has: nodes
// with no CPU, no model, GPU counts other than powers of two, one model or
// a thousand. Placement stays sound on each (every pod that fits lands on a
// node it fits), with demand fed so the charges are computed.
func TestGpufracPriorOnOddClusters(t *testing.T) {
	many := func(n, models int, gpus func(i int) int, cpu func(i int) int64) []Node {
		nodes := make([]Node, n)
		for i := range nodes {
			nodes[i] = with(gpuNode(fmt.Sprintf("n%d", i), fmt.Sprintf("M%d", i%models), gpus(i)), func(nd *Node) { nd.CPUMilli = cpu(i) })
		}
		return nodes
	}
	for _, c := range []struct {
		name  string
		nodes []Node
	}{
		{"no CPU", many(16, 2, func(int) int { return 8 }, func(i int) int64 { return int64(i%2) * 96000 })},
		{"no CPU anywhere", many(16, 2, func(int) int { return 8 }, func(int) int64 { return 0 })},
		{"no model", append(many(8, 2, func(int) int { return 8 }, func(int) int64 { return 96000 }),
			with(gpuNode("bare", "", 8), func(nd *Node) { nd.CPUMilli = 256000 }))},
		{"one model", many(16, 1, func(i int) int { return 8 }, func(i int) int64 { return 64000 + int64(i)*1000 })},
		{"odd GPU counts", many(30, 3, func(i int) int { return []int{3, 6, 16, 5, 7}[i%5] }, func(i int) int64 { return 32000 * int64(1+i%4) })},
		{"a thousand models", many(2000, 1000, func(i int) int { return 1 << (i % 4) }, func(i int) int64 { return 16000 + int64(i)*1000 })},
		{"huge CPU", many(8, 2, func(int) int { return 8 }, func(i int) int64 { return math.MaxInt64 - int64(i%2) })},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := NewSnapshot(c.nodes)
			if err != nil {
				t.Fatal(err)
			}
			p, err := New("gpufrac", Options{})
			if err != nil {
				t.Fatal(err)
			}
			reqs := []Request{
				{CPUMilli: 120000, GPUs: 8}, {CPUMilli: 1000, GPUs: 2}, {GPUs: 4}, {CPUMilli: 500, ShareMilli: 300},
				{CPUMilli: 32000}, {CPUMilli: 4000, GPUs: 1, Models: []string{"M1"}}, {CPUMilli: 8000, GPUs: 3},
			}
			for i := range reqs {
				s.AddDemand(&reqs[i])
			}
			for range 3 {
				for i := range reqs {
					r := &reqs[i]
					d, err := p.Place(s, r)
					var ue *UnschedulableError
					if errors.As(err, &ue) {
						continue
					}
					if err != nil {
						t.Fatalf("Place(%+v): %v", *r, err)
					}
					st := &s.nodes[d.NodeIndex]
					if st.cpuFree < r.CPUMilli || int(st.fullFree) < r.GPUs {
						t.Fatalf("Place(%+v) chose %s with %d free CPU and %d free GPUs", *r, d.Node, st.cpuFree, st.fullFree)
					}
					mustAssume(t, s, r, d)
				}
			}
		})
	}
}

// The prior's slot queries depend on the node types only and are kept
// across requests; a Placer moved to a snapshot with other node types must
// decide like a fresh one. Before, the 128-core model was C (its slots from
// 97 cores kept); now it is G, whose last 8-GPU slot with more than 96
// cores (g0) the G-only pod must leave.
func TestPriorFollowsTheSnapshotsNodeTypes(t *testing.T) {
	build := func(gCPU, cCPU int64) *Snapshot {
		nodes := []Node{
			with(gpuNode("g0", "G", 8), func(n *Node) { n.CPUMilli = gCPU }),
			with(gpuNode("g1", "G", 8), func(n *Node) { n.CPUMilli = gCPU }),
		}
		for i := range 800 {
			nodes = append(nodes, with(gpuNode(fmt.Sprintf("c%d", i), "C", 8), func(n *Node) { n.CPUMilli = cCPU }))
		}
		s, err := NewSnapshot(nodes)
		if err != nil {
			t.Fatal(err)
		}
		mustAssume(t, s, &Request{CPUMilli: gCPU - 90000}, Decision{Node: "g1", NodeIndex: 1})
		s.AddDemand(&Request{CPUMilli: 8000, GPUs: 2})
		return s
	}
	onG := Request{CPUMilli: 8000, GPUs: 1, Models: []string{"G"}}
	p, err := New("gpufrac", Options{})
	if err != nil {
		t.Fatal(err)
	}
	before := build(96000, 128000)
	if _, err := p.Place(before, &onG); err != nil {
		t.Fatal(err)
	}
	now := build(128000, 96000)
	d, err := p.Place(now, &onG)
	if err != nil {
		t.Fatal(err)
	}
	if want := decide(t, now, onG); d.Node != want || want != "g1" {
		t.Errorf("a Placer that placed on other node types first chose %s, a fresh one %s; want g1", d.Node, want)
	}
}

// TestAddDemandNIsNCallsOfAddDemand: the demand of n pods asking one request
// adds up as n calls of AddDemand do, for every kind of request.
func TestAddDemandNIsNCallsOfAddDemand(t *testing.T) {
	for _, r := range []Request{
		{CPUMilli: 4000, GPUs: 1},
		{CPUMilli: 4000, ShareMilli: 300},
		{CPUMilli: 4000, GPUs: 1, Models: []string{"B"}},
		{CPUMilli: 40000, GPUs: 1},
		{CPUMilli: 4000, GPUs: 4},
		{CPUMilli: 2000, GPUs: 2, Models: []string{"A"}},
		{CPUMilli: 4000, GPUs: 4, Models: []string{"B"}},
		{CPUMilli: 4000},
		{CPUMilli: -1, GPUs: 1},
	} {
		for _, n := range []int{0, 1, 3} {
			t.Run(fmt.Sprintf("%+v x%d", r, n), func(t *testing.T) {
				once, many := demandCluster(t), demandCluster(t)
				// Demand already there, so that sums and CPU levels merge.
				for _, s := range []*Snapshot{once, many} {
					s.AddDemand(&Request{CPUMilli: 2000, GPUs: 2, Models: []string{"A"}})
				}
				for range n {
					once.AddDemand(&r)
				}
				many.AddDemandN(&r, n)
				if diff := cmp.Diff(once.demand, many.demand, cmp.AllowUnexported(demandBook{}, demandSet{}, cpuLevel{}, demandShape{})); diff != "" {
					t.Errorf("AddDemandN(r, %d) against %d AddDemand calls (-calls +N):\n%s", n, n, diff)
				}
			})
		}
	}
}
