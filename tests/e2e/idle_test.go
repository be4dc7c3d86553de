package e2e

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// idleSplit says where the GPU-hours on idle nodes of a day went, per node:
// Up before the node first ran a job (launch, registration, binding), Gap
// between two of its jobs, Down after its last job until it left or the
// window ended (reservation grace, Karpenter's consolidateAfter, its
// disruption loop and the node's termination). Simulated GPU-hours.
type idleSplit struct {
	Up, Gap, Down float64
	// Nodes are the per-node figures, busiest idle first.
	Nodes []nodeIdle
}

type nodeIdle struct {
	Node          string
	Up, Gap, Down float64
}

// splitIdle integrates each node's idle samples over [from, to) as
// integrate does, and files each under Up, Gap or Down by whether the node
// ran a job before and after it.
func splitIdle(samples []daySample, from, to time.Time, simHour time.Duration, gpus func(typ string) int64) idleSplit {
	type span struct {
		h    float64
		busy bool
	}
	per := map[string][]span{}
	eachHeld(samples, from, to, simHour, func(s daySample, h float64) {
		for _, n := range s.PerNode {
			per[n.Node] = append(per[n.Node], span{h: h * float64(gpus(n.Type)), busy: n.Demand > 0})
		}
	})
	var out idleSplit
	for node, spans := range per {
		first, last := -1, -1
		for i, sp := range spans {
			if sp.busy {
				if first < 0 {
					first = i
				}
				last = i
			}
		}
		ni := nodeIdle{Node: node}
		for i, sp := range spans {
			switch {
			case sp.busy:
			case first < 0 || i < first:
				ni.Up += sp.h
			case i > last:
				ni.Down += sp.h
			default:
				ni.Gap += sp.h
			}
		}
		out.Up, out.Gap, out.Down = out.Up+ni.Up, out.Gap+ni.Gap, out.Down+ni.Down
		out.Nodes = append(out.Nodes, ni)
	}
	sort.Slice(out.Nodes, func(i, j int) bool {
		a, b := out.Nodes[i], out.Nodes[j]
		if ta, tb := a.Up+a.Gap+a.Down, b.Up+b.Gap+b.Down; ta != tb {
			return ta > tb
		}
		return a.Node < b.Node
	})
	return out
}

func (s idleSplit) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "IDLE up=%.2f gap=%.2f down=%.2f GPU-h", s.Up, s.Gap, s.Down)
	for _, n := range s.Nodes {
		fmt.Fprintf(&b, "\n  %s up=%.2f gap=%.2f down=%.2f", n.Node, n.Up, n.Gap, n.Down)
	}
	return b.String()
}

func TestSplitIdle(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	// One sim hour = 10 s. Node a (1 GPU): idle 0-10 s, busy 10-20, idle
	// 20-30, busy 30-40, idle 40-60. Node b (8 GPUs): appears at 20, idle
	// throughout.
	load := func(a int64, b bool) []nodeLoad {
		out := []nodeLoad{{Node: "a", Type: "one", Demand: a}}
		if b {
			out = append(out, nodeLoad{Node: "b", Type: "eight"})
		}
		return out
	}
	samples := []daySample{
		{At: at(0), PerNode: load(0, false)},
		{At: at(10), PerNode: load(40, false)},
		{At: at(20), PerNode: load(0, true)},
		{At: at(30), PerNode: load(100, true)},
		{At: at(40), PerNode: load(0, true)},
	}
	gpus := func(typ string) int64 {
		if typ == "eight" {
			return 8
		}
		return 1
	}
	got := splitIdle(samples, at(0), at(60), 10*time.Second, gpus)
	// a: up 1 h, gap 1 h, down 2 h; b: never busy, 4 h x 8 GPUs all "up".
	if got.Up != 1+32 || got.Gap != 1 || got.Down != 2 {
		t.Errorf("splitIdle = up %.2f gap %.2f down %.2f, want 33, 1, 2\n%s", got.Up, got.Gap, got.Down, got)
	}
	if len(got.Nodes) != 2 || got.Nodes[0].Node != "b" {
		t.Errorf("nodes %+v, want b (most idle) first", got.Nodes)
	}
	// A window that starts late counts only what is inside it.
	if late := splitIdle(samples, at(35), at(60), 10*time.Second, gpus); late.Down != 2 || late.Up != 2.5*8 || late.Gap != 0 {
		t.Errorf("late window: %s", late)
	}
}

// TestCostConsolidationCompressesTheChartsDefaults: (c)'s consolidation is
// the chart's, its times compressed as the day is, and the environment
// goes over it.
func TestCostConsolidationCompressesTheChartsDefaults(t *testing.T) {
	consolidation := func(simHour time.Duration) []string {
		t.Helper()
		got, err := costConsolidation(simHour)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	t.Setenv("GPUFRAC_COMPARE_CONSOLIDATION", "")
	got := consolidation(time.Minute)
	for _, want := range []string{"stableFor: 2s", "moveWindow: 1s", "interval: 1s", "maxMoves: 10", "maxDrainingNodes: 1",
		"maxInFlight: 4", "minSavingPerMove: 0.5", "drainTimeout: 3m", "moveBarePods: true", "deleteDrainedNodes: true"} {
		if !slices.Contains(got, want) {
			t.Errorf("at 1 h = 60 s: no %q in %q", want, got)
		}
	}
	if slices.ContainsFunc(got, func(s string) bool { return strings.HasPrefix(s, "enabled:") }) {
		t.Errorf("enabled is consolidationValues' to set: %q", got)
	}
	// At 1 h = 10 min the chart's 10 s interval compresses to 1.667 s; at
	// 1 h = 10 s stableFor is 333 ms and the interval 1 s, its floor.
	for simHour, want := range map[time.Duration][]string{
		10 * time.Minute: {"interval: 1.667s", "stableFor: 20s", "moveWindow: 10s"},
		10 * time.Second: {"interval: 1s", "stableFor: 333ms", "moveWindow: 167ms"},
	} {
		got := consolidation(simHour)
		for _, w := range want {
			if !slices.Contains(got, w) {
				t.Errorf("at 1 h = %s: no %q in %q", simHour, w, got)
			}
		}
	}
	t.Setenv("GPUFRAC_COMPARE_CONSOLIDATION", "stableFor=6s; maxMoves = 8")
	got = consolidation(time.Minute)
	if !slices.Contains(got, "stableFor: 6s") || !slices.Contains(got, "maxMoves: 8") {
		t.Errorf("the environment's values are not over the chart's: %q", got)
	}
	for _, bad := range []string{"enabled=false", "stableFr=6s", "stableFor"} {
		t.Setenv("GPUFRAC_COMPARE_CONSOLIDATION", bad)
		if got, err := costConsolidation(time.Minute); err == nil {
			t.Errorf("GPUFRAC_COMPARE_CONSOLIDATION=%q: no error, %q", bad, got)
		}
	}
}
