package placement

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// views is every node of s as it is now.
func views(s *Snapshot) []Node {
	out := make([]Node, s.Len())
	for i := range out {
		out[i] = s.Node(i)
	}
	return out
}

// ignoreMeta leaves the descriptive fields out of node comparisons.
func ignoreMeta() cmp.Option { return cmpopts.IgnoreFields(Node{}, "Labels", "Taints") }

func TestGangPlacedVirtuallyAndRolledBack(t *testing.T) {
	// Three nodes with two free GPUs each: a gang of four 2-GPU pods does
	// not fit, a gang of three does.
	nodes := []Node{gpuNode("a", "A100", 2), gpuNode("b", "A100", 2), gpuNode("c", "A100", 2)}
	s, err := NewSnapshot(nodes)
	if err != nil {
		t.Fatal(err)
	}
	p, err := New("gpufrac", Options{})
	if err != nil {
		t.Fatal(err)
	}
	member := Request{CPUMilli: 4000, MemoryBytes: 8 * gib, GPUs: 2}
	before := views(s)
	firstChoice, err := p.Place(s, &member)
	if err != nil {
		t.Fatal(err)
	}

	// placeGang assumes members until one does not fit; it rolls back then.
	placeGang := func(size int) (placed int, err error) {
		cp := s.Checkpoint()
		for range size {
			d, err := p.Place(s, &member)
			if err != nil {
				if rbErr := s.Rollback(cp); rbErr != nil {
					t.Fatalf("Rollback: %v", rbErr)
				}
				return placed, err
			}
			if err := s.Assume(&member, d); err != nil {
				t.Fatalf("Assume: %v", err)
			}
			placed++
		}
		return placed, s.Commit(cp)
	}

	placed, err := placeGang(4)
	if !errors.Is(err, ErrUnschedulable) || placed != 3 {
		t.Fatalf("gang of 4: placed %d, err %v; want 3 placed then ErrUnschedulable", placed, err)
	}
	if diff := cmp.Diff(before, views(s), ignoreMeta()); diff != "" {
		t.Errorf("after rollback (-before +after):\n%s", diff)
	}
	again, err := p.Place(s, &member)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(firstChoice, again); diff != "" {
		t.Errorf("decision after rollback differs (-before +after):\n%s", diff)
	}

	if placed, err := placeGang(3); err != nil || placed != 3 {
		t.Fatalf("gang of 3: placed %d, err %v", placed, err)
	}
	if _, used := s.GPUMilli(); used != 6000 {
		t.Errorf("after committing the gang of 3: %d milli used, want 6000", used)
	}
}

func TestNestedCheckpoints(t *testing.T) {
	s, err := NewSnapshot([]Node{gpuNode("a", "A100", 4)})
	if err != nil {
		t.Fatal(err)
	}
	share := Request{CPUMilli: 1000, ShareMilli: 250}
	on := func(g int) Decision {
		return Decision{Node: "a", NodeIndex: 0, GPUIndices: []int{g}, GPUs: []string{fmt.Sprintf("a-gpu%d", g)}, MilliPerGPU: 250}
	}
	free := func() []int {
		var out []int
		for _, g := range s.Node(0).GPUs {
			out = append(out, g.FreeMilli)
		}
		return out
	}

	outer := s.Checkpoint()
	mustAssume(t, s, &share, on(0))
	inner := s.Checkpoint()
	mustAssume(t, s, &share, on(1))
	if err := s.Rollback(outer); err == nil {
		t.Error("rolling back the outer checkpoint while the inner one is open: got nil error")
	}
	if err := s.Rollback(inner); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]int{750, 1000, 1000, 1000}, free()); diff != "" {
		t.Errorf("after inner rollback (-want +got):\n%s", diff)
	}
	inner = s.Checkpoint()
	mustAssume(t, s, &share, on(2))
	if err := s.Commit(inner); err != nil {
		t.Fatal(err)
	}
	if err := s.Rollback(outer); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]int{1000, 1000, 1000, 1000}, free()); diff != "" {
		t.Errorf("after outer rollback (-want +got):\n%s", diff)
	}
	if err := s.Commit(outer); err == nil {
		t.Error("committing a closed checkpoint: got nil error")
	}
	// Without a checkpoint, changes are not journaled and stay.
	mustAssume(t, s, &share, on(3))
	if len(s.journal) != 0 {
		t.Errorf("journal has %d entries without an open checkpoint", len(s.journal))
	}
}

func mustAssume(t *testing.T, s *Snapshot, r *Request, d Decision) {
	t.Helper()
	if err := s.Assume(r, d); err != nil {
		t.Fatalf("Assume(%+v, %+v): %v", r, d, err)
	}
}

func TestAssumeAndForget(t *testing.T) {
	node := with(gpuNode("a", "A100", 2), func(n *Node) {
		n.CPUMilli, n.MemoryBytes = 10000, 10*gib
		n.GPUs[1].FreeMilli = 300
	})
	whole := Request{CPUMilli: 2000, MemoryBytes: gib, GPUs: 1}
	share := Request{CPUMilli: 2000, MemoryBytes: gib, ShareMilli: 300}
	d := func(gpus ...int) Decision { return Decision{Node: "a", NodeIndex: -1, GPUIndices: gpus} }
	tests := []struct {
		name    string
		assume  []Request
		on      []Decision
		forget  *Request
		forgetD Decision
		wantErr bool
	}{
		{name: "whole GPU on a free GPU", assume: []Request{whole}, on: []Decision{d(0)}},
		{name: "whole GPU on a shared GPU conflicts", assume: []Request{whole}, on: []Decision{d(1)}, wantErr: true},
		{name: "share that fits", assume: []Request{share}, on: []Decision{d(1)}},
		{name: "share that does not fit", assume: []Request{share, share}, on: []Decision{d(1), d(1)}, wantErr: true},
		{name: "unknown node", assume: []Request{whole}, on: []Decision{{Node: "zz", GPUIndices: []int{0}}}, wantErr: true},
		{name: "GPU index out of range", assume: []Request{whole}, on: []Decision{d(2)}, wantErr: true},
		{name: "wrong GPU count", assume: []Request{whole}, on: []Decision{d(0, 1)}, wantErr: true},
		{name: "too much CPU", assume: []Request{{CPUMilli: 10001}}, on: []Decision{d()}, wantErr: true},
		{name: "forget more than is used", forget: &share, forgetD: d(0), wantErr: true},
		{name: "forget frees what assume took", assume: []Request{share}, on: []Decision{d(0)}, forget: &share, forgetD: d(0)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := NewSnapshot([]Node{node})
			if err != nil {
				t.Fatal(err)
			}
			before := views(s)
			var gotErr error
			for i := range tc.assume {
				if gotErr = s.Assume(&tc.assume[i], tc.on[i]); gotErr != nil {
					break
				}
			}
			if gotErr == nil && tc.forget != nil {
				gotErr = s.Forget(tc.forget, tc.forgetD)
			}
			if (gotErr != nil) != tc.wantErr {
				t.Fatalf("got error %v, want error: %v", gotErr, tc.wantErr)
			}
			if gotErr != nil && !errors.Is(gotErr, ErrConflict) {
				t.Errorf("error %v is not ErrConflict", gotErr)
			}
			if tc.forget != nil && !tc.wantErr {
				if diff := cmp.Diff(before, views(s), ignoreMeta()); diff != "" {
					t.Errorf("assume then forget changed the node (-before +after):\n%s", diff)
				}
			}
		})
	}
}

// TestCloneIsIndependent: a clone shares the nodes' free resources with
// its snapshot until either changes them; a change to one, on either side
// and in any order (a rollback too), never shows in the other.
func TestCloneIsIndependent(t *testing.T) {
	one := &Request{GPUs: 1}
	on := func(g int) Decision { return Decision{Node: "a", GPUIndices: []int{g}} }
	for _, tc := range []struct {
		name         string
		do           func(t *testing.T, s, c *Snapshot)
		orig, cloned int64 // GPU milli used after
	}{
		{"the clone changes", func(t *testing.T, _, c *Snapshot) { mustAssume(t, c, one, on(0)) }, 0, 1000},
		{"the snapshot changes", func(t *testing.T, s, _ *Snapshot) { mustAssume(t, s, one, on(0)) }, 1000, 0},
		{"both change", func(t *testing.T, s, c *Snapshot) {
			mustAssume(t, s, one, on(0))
			mustAssume(t, c, one, on(1))
			mustAssume(t, c, one, on(0))
		}, 1000, 2000},
		{"a clone of a clone changes", func(t *testing.T, _, c *Snapshot) { mustAssume(t, c.Clone(), one, on(0)) }, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := NewSnapshot([]Node{gpuNode("a", "A100", 2)})
			if err != nil {
				t.Fatal(err)
			}
			c := s.Clone()
			tc.do(t, s, c)
			if _, used := s.GPUMilli(); used != tc.orig {
				t.Errorf("the snapshot uses %d milli, want %d", used, tc.orig)
			}
			if _, used := c.GPUMilli(); used != tc.cloned {
				t.Errorf("the clone uses %d milli, want %d", used, tc.cloned)
			}
		})
	}
	t.Run("rolled back after a clone was taken", func(t *testing.T) {
		s, err := NewSnapshot([]Node{gpuNode("a", "A100", 2)})
		if err != nil {
			t.Fatal(err)
		}
		cp := s.Checkpoint()
		mustAssume(t, s, one, on(0))
		c := s.Clone()
		if err := s.Rollback(cp); err != nil {
			t.Fatal(err)
		}
		if _, used := s.GPUMilli(); used != 0 {
			t.Errorf("the snapshot uses %d milli after its rollback, want 0", used)
		}
		if _, used := c.GPUMilli(); used != 1000 {
			t.Errorf("the clone uses %d milli after the snapshot's rollback, want 1000", used)
		}
	})
}

// A long-lived Placer (score caches keyed by node generation) must decide
// exactly like a fresh one, across Assume, Forget, Rollback and Clone.
func TestCachedScoresMatchFreshPlacer(t *testing.T) {
	var nodes []Node
	for i := range 12 {
		n := gpuNode(fmt.Sprintf("n%02d", i), []string{"A100", "T4", "H100"}[i%3], []int{1, 2, 4, 8, 16}[i%5])
		n.CPUMilli = int64(16000 + 8000*(i%4))
		nodes = append(nodes, n)
	}
	typical := []Typical{
		{CPUMilli: 3000, GPUs: 1, MilliPerGPU: 810, Weight: 0.2},
		{CPUMilli: 8000, GPUs: 1, MilliPerGPU: 470, Weight: 0.2},
		{CPUMilli: 4000, GPUs: 1, MilliPerGPU: 320, Models: []string{"T4"}, Weight: 0.1},
		{CPUMilli: 11000, GPUs: 1, MilliPerGPU: 1000, Weight: 0.3},
		{CPUMilli: 12000, Weight: 0.2},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	randomRequest := func() Request {
		r := Request{CPUMilli: int64(rng.IntN(12)+1) * 1000, MemoryBytes: int64(rng.IntN(8)) * gib}
		switch rng.IntN(4) {
		case 0:
			r.ShareMilli = []int{810, 470, 320, 230, 160}[rng.IntN(5)]
		case 1:
			r.GPUs = []int{1, 1, 2, 4}[rng.IntN(4)]
		case 2:
			r.ShareMilli = 500
			r.Models = []string{"T4"}
		}
		return r
	}
	for _, policy := range []string{"gpufrac", "fgd", "dotprod", "gpupacking", "bestfit", "binpack", "spread"} {
		t.Run(policy, func(t *testing.T) {
			s, err := NewSnapshot(nodes)
			if err != nil {
				t.Fatal(err)
			}
			long, err := New(policy, Options{Typical: typical})
			if err != nil {
				t.Fatal(err)
			}
			type assumed struct {
				r Request
				d Decision
			}
			var live, liveAtCheckpoint []assumed
			var cp *Checkpoint
			for step := range 400 {
				r := randomRequest()
				s.AddDemand(&r) // charges (gpufrac) come from the demand, uncached
				fresh, err := New(policy, Options{Typical: typical})
				if err != nil {
					t.Fatal(err)
				}
				want, wantErr := fresh.Place(s, &r)
				got, gotErr := long.Place(s, &r)
				if (wantErr == nil) != (gotErr == nil) {
					t.Fatalf("step %d: fresh err %v, cached err %v", step, wantErr, gotErr)
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Fatalf("step %d, request %+v (-fresh +cached):\n%s", step, r, diff)
				}
				switch {
				case gotErr == nil:
					mustAssume(t, s, &r, got)
					live = append(live, assumed{r, got})
				case len(live) > 0:
					k := rng.IntN(len(live))
					if err := s.Forget(&live[k].r, live[k].d); err != nil {
						t.Fatalf("step %d: Forget: %v", step, err)
					}
					live = slices.Delete(live, k, k+1)
				}
				switch {
				case cp == nil && step%37 == 0:
					c := s.Checkpoint()
					cp = &c
					liveAtCheckpoint = append([]assumed(nil), live...)
				case cp != nil && step%37 == 20:
					if err := s.Rollback(*cp); err != nil {
						t.Fatal(err)
					}
					cp, live = nil, liveAtCheckpoint
				case cp == nil && step%50 == 25:
					// A snapshot of another family, the same nodes and
					// placements: the long-lived Placer's rows are cleared
					// and used again (its generations start over).
					again, err := NewSnapshot(nodes)
					if err != nil {
						t.Fatal(err)
					}
					for _, a := range live {
						mustAssume(t, again, &a.r, a.d)
					}
					s = again
				case step == 300:
					if cp != nil {
						if err := s.Commit(*cp); err != nil {
							t.Fatal(err)
						}
						cp = nil
					}
					s = s.Clone()
				}
				checkBookkeeping(t, s)
			}
		})
	}
}

// TestNewSnapshotRefusesADuplicateNode: a node name given twice is an
// error, wherever the second comes.
func TestNewSnapshotRefusesADuplicateNode(t *testing.T) {
	for _, names := range [][]string{{"a", "a"}, {"a", "b", "a"}, {"a", "b", "c", "b"}} {
		nodes := make([]Node, len(names))
		for i, n := range names {
			nodes[i] = Node{Name: n, CPUMilli: 1000, MemoryBytes: 1 << 30}
		}
		if _, err := NewSnapshot(nodes); err == nil || !strings.Contains(err.Error(), "duplicate node") {
			t.Errorf("nodes %v: error %v, want a duplicate node", names, err)
		}
	}
}

// TestNewSnapshotInternsModelsInAnyOrder: each node's model index names its
// own model, with the models in runs and interleaved.
func TestNewSnapshotInternsModelsInAnyOrder(t *testing.T) {
	models := []string{"A100", "A100", "H100", "A100", "H100", "H100", "L4", "A100", ""}
	nodes := make([]Node, len(models))
	for i, m := range models {
		nodes[i] = Node{Name: fmt.Sprintf("n%d", i), Model: m, CPUMilli: 1000, MemoryBytes: 1 << 30, GPUs: []GPU{{ID: "g0", FreeMilli: MilliPerGPU}}}
	}
	s, err := NewSnapshot(nodes)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"A100", "H100", "L4"}; !slices.Equal(s.models, want) {
		t.Errorf("models %v, want %v", s.models, want)
	}
	for i, m := range models {
		got := ""
		if id := s.nodes[i].model; id >= 0 {
			got = s.models[id]
		}
		if got != m {
			t.Errorf("node %d: model %q, want %q", i, got, m)
		}
	}
}

// TestNewSnapshotReusingIsNewSnapshotOf: a snapshot made in the arrays of
// the last one (changed by placements, with reserved GPUs or without, of
// more nodes or fewer) is what NewSnapshotOf makes of the same nodes; the
// last one is emptied; and a clone that shares the last one's arrays keeps
// what it had, the last one changed after the clone was taken or not.
func TestNewSnapshotReusingIsNewSnapshotOf(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 30))
	nodesOf := func(n int, reserved bool) []*Node {
		out := make([]*Node, n)
		for i := range out {
			gpus := make([]GPU, 1+rng.IntN(8))
			for g := range gpus {
				gpus[g] = GPU{ID: fmt.Sprintf("g%d", g), FreeMilli: 100 * rng.IntN(11), Reserved: reserved && rng.IntN(3) == 0}
			}
			out[i] = &Node{Name: fmt.Sprintf("n%03d", rng.IntN(1000)*1000+i), Model: []string{"A100", "H100"}[rng.IntN(2)], CPUMilli: 64000, MemoryBytes: 1 << 40, GPUs: gpus}
		}
		return out
	}
	share := &Request{ShareMilli: 100}
	for round := range 40 {
		last, err := NewSnapshotOf(nodesOf(1+rng.IntN(60), rng.IntN(2) == 0))
		if err != nil {
			t.Fatal(err)
		}
		for range rng.IntN(5) { // placed on, as a cycle does
			if d, err := New("binpack", Options{}); err == nil {
				if dec, err := d.Place(last, share); err == nil {
					mustAssume(t, last, share, dec)
				}
			}
		}
		var clone *Snapshot
		var cloned []Node
		if round%3 == 0 {
			clone = last.Clone()
			cloned = views(clone)
			if round%2 == 0 {
				// Changed after the clone was taken: its changing arrays are
				// its own again, those nothing changes still shared.
				if d, err := New("binpack", Options{}); err == nil {
					if dec, err := d.Place(last, share); err == nil {
						mustAssume(t, last, share, dec)
					}
				}
			}
		}
		next := nodesOf(1+rng.IntN(60), rng.IntN(2) == 0)
		want, err := NewSnapshotOf(next)
		if err != nil {
			t.Fatal(err)
		}
		got, err := NewSnapshotReusing(last, next)
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(views(want), views(got)); d != "" {
			t.Fatalf("round %d: made in the last one's arrays (-fresh +reused):\n%s", round, d)
		}
		if !slices.Equal(want.models, got.models) || !slices.Equal(want.view, got.view) || want.freeMilli != got.freeMilli {
			t.Fatalf("round %d: models %v / %v, view %v / %v, free %d / %d", round, want.models, got.models, want.view, got.view, want.freeMilli, got.freeMilli)
		}
		for i, n := range next {
			if j, ok := got.Index(n.Name); !ok || j != i {
				t.Fatalf("round %d: node %s at %d, %v; want %d", round, n.Name, j, ok, i)
			}
		}
		if last.Len() != 0 {
			t.Fatalf("round %d: the snapshot reused still has %d nodes", round, last.Len())
		}
		if clone != nil {
			if d := cmp.Diff(cloned, views(clone)); d != "" {
				t.Fatalf("round %d: a clone of the snapshot reused changed (-before +after):\n%s", round, d)
			}
			for i, n := range cloned {
				if j, ok := clone.Index(n.Name); !ok || j != i {
					t.Fatalf("round %d: the clone finds node %s at %d, %v; want %d", round, n.Name, j, ok, i)
				}
			}
		}
	}
}
