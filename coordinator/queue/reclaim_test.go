package queue_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/gpufrac/gpufrac/coordinator/queue"
	"github.com/gpufrac/gpufrac/tests/builders"
)

// wl is a preemptible workload of priority 0 created at time created.
func wl(q, key string, r queue.Resources, created int64) queue.Workload {
	return queue.Workload{Queue: q, Key: key, Preemptible: true, Resources: r, CreationUnixNano: created}
}

func withPriority(w queue.Workload, p int32) queue.Workload { w.Priority = p; return w }

func nonPreemptible(w queue.Workload) queue.Workload { w.Preemptible = false; return w }

// charge turns workloads into the usage they stand for.
func charge(ws ...queue.Workload) []usage {
	out := make([]usage, len(ws))
	for i, w := range ws {
		out[i] = usage{queue: w.Queue, res: w.Resources, nonPreemptible: !w.Preemptible}
	}
	return out
}

func TestReclaimVictims(t *testing.T) {
	// Two teams under org; team-b runs 8 GPUs, 4 beyond its deserved 4.
	b1 := wl("team-b", "b1", gpus("2"), 1)
	b2 := wl("team-b", "b2", gpus("2"), 2)
	b3 := withPriority(wl("team-b", "b3", gpus("2"), 3), 5)
	b4 := nonPreemptible(wl("team-b", "b4", gpus("2"), 4))
	teamB := []queue.Workload{b1, b2, b3, b4}

	twoOrgs := []queue.Spec{
		spec(builders.MakeQueue("org1").GPUQuota("4")),
		spec(builders.MakeQueue("a").Parent("org1").GPUQuota("2")),
		spec(builders.MakeQueue("a2").Parent("org1").GPUQuota("2")),
		spec(builders.MakeQueue("org2").GPUQuota("4")),
		spec(builders.MakeQueue("c").Parent("org2").GPUQuota("2")),
		spec(builders.MakeQueue("d").Parent("org2").GPUQuota("2")),
	}
	tests := []struct {
		name        string
		specs       []queue.Spec // orgTree when nil
		running     []queue.Workload
		extraUsed   []usage
		starved     string
		need        queue.Resources
		candidates  []queue.Workload // running when nil
		wantVictims []queue.Workload
		wantOK      bool
	}{
		{
			name:    "lowest priority, newest first",
			running: teamB, starved: "team-a", need: gpus("2"),
			wantVictims: []queue.Workload{b2}, wantOK: true,
		},
		{
			name:    "several victims until the need is met",
			running: teamB, starved: "team-a", need: gpus("3"),
			wantVictims: []queue.Workload{b2, b1}, wantOK: true,
		},
		{
			name:    "the victims leave the victim's queue at its deserved quota",
			running: teamB, starved: "team-a", need: gpus("4"),
			// b2, b1 free 4 and leave team-b at 4.
			wantVictims: []queue.Workload{b2, b1}, wantOK: true,
		},
		{
			name:    "never below the victim's deserved quota, so not enough",
			running: []queue.Workload{b1, b2, b3, nonPreemptible(wl("team-b", "np", gpus("1"), 0))},
			// team-b at 7: b2 takes it to 5; b1 or b3 would take it to 3.
			starved: "team-a", need: gpus("4"),
		},
		{
			name:    "the starved queue's usage plus need fits its deserved quota",
			running: teamB, extraUsed: charge(wl("team-a", "a0", gpus("1"), 0)),
			starved: "team-a", need: gpus("3"),
			wantVictims: []queue.Workload{b2, b1}, wantOK: true,
		},
		{
			name:    "the starved queue would go beyond its deserved quota",
			running: teamB, extraUsed: charge(wl("team-a", "a0", gpus("3"), 0)),
			starved: "team-a", need: gpus("2"),
		},
		{
			name:    "the starved queue is at its deserved quota",
			running: teamB, extraUsed: charge(wl("team-a", "a0", gpus("4"), 0)),
			starved: "team-a", need: gpus("1"),
		},
		{
			name: "a gang is taken whole",
			running: []queue.Workload{
				wl("team-b", "gang", gpus("4"), 1),
				nonPreemptible(wl("team-b", "np", gpus("4"), 0)),
			},
			starved: "team-a", need: gpus("1"),
			wantVictims: []queue.Workload{wl("team-b", "gang", gpus("4"), 1)}, wantOK: true,
		},
		{
			name: "a gang that would take its queue below deserved is skipped",
			running: []queue.Workload{
				wl("team-b", "gang", gpus("4"), 9),
				wl("team-b", "single", gpus("1"), 1),
				nonPreemptible(wl("team-b", "np", gpus("2.5"), 0)), // team-b at 7.5: 3.5 over
			},
			starved: "team-a", need: gpus("1"),
			wantVictims: []queue.Workload{wl("team-b", "single", gpus("1"), 1)}, wantOK: true,
		},
		{
			name: "non-preemptible and own-queue work is never taken",
			running: []queue.Workload{
				nonPreemptible(wl("team-b", "np", gpus("8"), 1)),
				wl("team-a", "own", gpus("1"), 2),
			},
			starved: "team-a", need: gpus("1"),
		},
		{
			name: "workloads that free nothing needed are skipped",
			running: []queue.Workload{
				wl("team-b", "cpu-only", res("", "8", ""), 5),
				wl("team-b", "gpu", gpus("2"), 1),
				nonPreemptible(wl("team-b", "np", gpus("4"), 0)),
			},
			starved: "team-a", need: gpus("1"),
			wantVictims: []queue.Workload{wl("team-b", "gpu", gpus("2"), 1)}, wantOK: true,
		},
		{
			name:    "need only in resources the starved queue does not manage",
			running: teamB, starved: "team-a", need: res("", "4", ""),
		},
		{
			name:    "unknown starved queue",
			running: teamB, starved: "nope", need: gpus("1"),
		},
		{
			name:  "across organisations when the victim's organisation is over its quota",
			specs: twoOrgs,
			running: []queue.Workload{
				wl("c", "c1", gpus("2"), 1),
				wl("c", "c2", gpus("2"), 2),
				wl("d", "d1", gpus("2"), 3),
				wl("d", "d2", gpus("2"), 4),
			},
			starved: "a", need: gpus("2"),
			wantVictims: []queue.Workload{wl("d", "d2", gpus("2"), 4)}, wantOK: true,
		},
		{
			name:  "not from an organisation at its quota, even from a team over its own",
			specs: twoOrgs,
			running: []queue.Workload{
				wl("c", "c1", gpus("2"), 1),
				wl("c", "c2", gpus("2"), 2),
			},
			starved: "a", need: gpus("2"),
		},
		{
			name:  "within the organisation first: the starved side's parent must stay within deserved",
			specs: twoOrgs,
			running: []queue.Workload{
				wl("a2", "a2-1", gpus("2"), 1),
				wl("a2", "a2-2", gpus("2"), 2),
				wl("c", "c1", gpus("3"), 3),
				wl("d", "d1", gpus("3"), 4),
			},
			starved: "a", need: gpus("2"),
			// org1 already uses its 4: taking from org2 would put it at 6.
			wantVictims: []queue.Workload{wl("a2", "a2-2", gpus("2"), 2)}, wantOK: true,
		},
		{
			name:    "candidates from unknown queues are ignored",
			running: teamB, starved: "team-a", need: gpus("2"),
			candidates:  []queue.Workload{wl("ghost", "g", gpus("8"), 9), b1},
			wantVictims: []queue.Workload{b1}, wantOK: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			specs := tc.specs
			if specs == nil {
				specs = orgTree()
			}
			tree := newTree(t, specs, append(charge(tc.running...), tc.extraUsed...)...)
			candidates := tc.candidates
			if candidates == nil {
				candidates = tc.running
			}
			before := usageSnapshot(tree)
			victims, ok := tree.ReclaimVictims(tc.starved, tc.need, candidates)
			if diff := cmp.Diff(tc.wantVictims, victims, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("victims (-want +got):\n%s", diff)
			}
			if ok != tc.wantOK {
				t.Errorf("ok = %v, want %v", ok, tc.wantOK)
			}
			if diff := cmp.Diff(before, usageSnapshot(tree)); diff != "" {
				t.Errorf("ReclaimVictims changed the usage (-before +after):\n%s", diff)
			}
		})
	}
}

// TestReclaimVictimsUpTo: past the first set that frees need, more victims
// are taken under the same rules (their queue stays at or above its
// deserved quota), up to the limit; non-preemptible work never.
func TestReclaimVictimsUpTo(t *testing.T) {
	b1 := wl("team-b", "b1", gpus("2"), 1)
	b2 := wl("team-b", "b2", gpus("2"), 2)
	b3 := wl("team-b", "b3", gpus("2"), 3)
	b4 := nonPreemptible(wl("team-b", "b4", gpus("2"), 4))
	teamB := []queue.Workload{b1, b2, b3, b4}
	var used []usage
	for _, w := range teamB {
		used = append(used, charge(w)...)
	}
	for _, tc := range []struct {
		name  string
		limit int
		want  int
		ok    bool
	}{
		{"one frees need", 1, 1, true},
		{"two asked, two over quota", 2, 2, true},
		{"four asked: team-b's deserved 4 keeps two", 4, 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tree := newTree(t, orgTree(), used...)
			got, ok := tree.ReclaimVictimsUpTo("team-a", gpus("1"), teamB, tc.limit)
			if ok != tc.ok || len(got) != tc.want {
				t.Errorf("ReclaimVictimsUpTo(limit %d) = %d victims, %v; want %d, %v", tc.limit, len(got), ok, tc.want, tc.ok)
			}
			for _, v := range got {
				if v.Key == b4.Key {
					t.Errorf("non-preemptible %s taken", v.Key)
				}
			}
		})
	}
}
