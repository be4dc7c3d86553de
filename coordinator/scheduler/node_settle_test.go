package scheduler

import (
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/tests/builders"
)

// TestNodeSettle: the rules of the settle, round by round at fake
// instants (settle 3 s, no records of when a node became usable): a
// Karpenter node appearing after the first round settles from then (held),
// one found by the first round or not Karpenter's settles from its records
// (none: not at all); a node losing a NoExecute taint settles from then
// (held), one losing a draining taint in force is left out (out) while it
// settles; a node made again under its name settles afresh; a node not
// listed is forgotten.
func TestNodeSettle(t *testing.T) {
	const settle = 3 * time.Second
	t0 := time.Unix(1_700_000_000, 0)
	drainUntil := strconv.FormatInt(t0.Add(time.Hour).Unix(), 10)
	node := func(name string, uid types.UID, karpenter bool, taints ...string) *corev1.Node {
		w := builders.MakeNode(name)
		if karpenter {
			w = w.Pool("p")
		}
		for _, tt := range taints {
			switch tt {
			case "not-ready":
				w = w.Taint("node.kubernetes.io/not-ready", "", corev1.TaintEffectNoExecute)
			case "draining":
				w = w.Taint(api.TaintDraining, drainUntil, corev1.TaintEffectNoSchedule)
			}
		}
		n := w.Obj()
		n.UID = uid
		return n
	}
	type round struct {
		t           time.Duration
		nodes       []*corev1.Node
		wantHeld    []string
		wantOut     []string
		wantSoonest time.Duration // when some node settles
		wantKept    int           // nodes remembered after the round
	}
	cases := []struct {
		name   string
		rounds []round
	}{{
		name: "a Karpenter node appearing later settles from then",
		rounds: []round{
			{t: 0, nodes: []*corev1.Node{node("a", "a1", true)}, wantKept: 1},
			{t: time.Second, nodes: []*corev1.Node{node("a", "a1", true), node("k", "k1", true)}, wantHeld: []string{"k"}, wantSoonest: settle, wantKept: 2},
			{t: 2 * time.Second, nodes: []*corev1.Node{node("a", "a1", true), node("k", "k1", true)}, wantHeld: []string{"k"}, wantSoonest: 2 * time.Second, wantKept: 2},
			{t: 4 * time.Second, nodes: []*corev1.Node{node("a", "a1", true), node("k", "k1", true)}, wantKept: 2},
		},
	}, {
		name: "a node not Karpenter's appearing later settles from its records",
		rounds: []round{
			{t: 0, nodes: []*corev1.Node{node("a", "a1", false)}, wantKept: 1},
			{t: time.Second, nodes: []*corev1.Node{node("a", "a1", false), node("b", "b1", false)}, wantKept: 2},
		},
	}, {
		name: "a node losing a NoExecute taint is held, one given back is out",
		rounds: []round{
			{t: 0, nodes: []*corev1.Node{node("a", "a1", false, "not-ready"), node("d", "d1", false, "draining")}, wantKept: 2},
			{t: time.Second, nodes: []*corev1.Node{node("a", "a1", false), node("d", "d1", false)}, wantHeld: []string{"a"}, wantOut: []string{"d"}, wantSoonest: settle, wantKept: 2},
			// d loses nothing more, a taint again: d stays out until it settled.
			{t: 2 * time.Second, nodes: []*corev1.Node{node("a", "a1", false, "not-ready"), node("d", "d1", false)}, wantHeld: []string{"a"}, wantOut: []string{"d"}, wantSoonest: 2 * time.Second, wantKept: 2},
			{t: 4 * time.Second, nodes: []*corev1.Node{node("a", "a1", false, "not-ready"), node("d", "d1", false)}, wantKept: 2},
		},
	}, {
		name: "a node given back stays out whatever else it loses meanwhile",
		rounds: []round{
			{t: 0, nodes: []*corev1.Node{node("d", "d1", false, "draining", "not-ready")}, wantKept: 1},
			{t: time.Second, nodes: []*corev1.Node{node("d", "d1", false, "not-ready")}, wantOut: []string{"d"}, wantSoonest: settle, wantKept: 1},
			{t: 2 * time.Second, nodes: []*corev1.Node{node("d", "d1", false)}, wantOut: []string{"d"}, wantSoonest: settle, wantKept: 1},
		},
	}, {
		name: "a node made again under its name settles afresh, one not listed is forgotten",
		rounds: []round{
			{t: 0, nodes: []*corev1.Node{node("k", "k1", true), node("x", "x1", false)}, wantKept: 2},
			{t: time.Second, nodes: []*corev1.Node{node("k", "k2", true)}, wantHeld: []string{"k"}, wantSoonest: settle, wantKept: 1},
			{t: 1500 * time.Millisecond, nodes: []*corev1.Node{node("k", "k2", true), node("k", "k2", true)}, wantHeld: []string{"k"}, wantSoonest: 2500 * time.Millisecond, wantKept: 1},
		},
	}}
	noRecords := func(*corev1.Node, time.Time) time.Time { return time.Time{} }
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ns := newNodeSettle()
			for i, r := range tc.rounds {
				out, held, soonest := ns.settling(r.nodes, t0.Add(r.t), settle, noRecords)
				if got := slices.Sorted(maps.Keys(held)); !slices.Equal(got, r.wantHeld) {
					t.Errorf("round %d: held %v, want %v", i, got, r.wantHeld)
				}
				if got := slices.Sorted(maps.Keys(out)); !slices.Equal(got, r.wantOut) {
					t.Errorf("round %d: out %v, want %v", i, got, r.wantOut)
				}
				if (out != nil || held != nil) && soonest != r.wantSoonest {
					t.Errorf("round %d: soonest %v, want %v", i, soonest, r.wantSoonest)
				}
				if len(ns.seen) != r.wantKept {
					t.Errorf("round %d: %d nodes kept, want %d", i, len(ns.seen), r.wantKept)
				}
			}
		})
	}
}
