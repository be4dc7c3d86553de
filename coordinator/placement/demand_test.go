package placement

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// checkBookkeeping recomputes what the snapshot keeps in step (free milli by
// model and in all, k-GPU slots) and compares.
func checkBookkeeping(t *testing.T, s *Snapshot) {
	t.Helper()
	modelFree := make([]int64, len(s.models))
	slots := make([][MaxKindGPUs + 1]int64, len(s.models))
	var all [MaxKindGPUs + 1]int64
	var free int64
	for i := range s.nodes {
		st := &s.nodes[i]
		var f, full int32
		for _, x := range s.gpus(i) {
			f += x
			if x == MilliPerGPU {
				full++
			}
		}
		free += int64(f)
		for k := int32(2); k <= MaxKindGPUs; k++ {
			all[k] += int64(full / k)
			if st.model >= 0 {
				slots[st.model][k] += int64(full / k)
			}
		}
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
	if diff := cmp.Diff(slots, s.slots); diff != "" {
		t.Fatalf("slots by model (-recomputed +kept):\n%s", diff)
	}
	if all != s.allSlots {
		t.Fatalf("slots %v, recomputed %v", s.allSlots, all)
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
