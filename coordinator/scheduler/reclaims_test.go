package scheduler

import (
	"maps"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// TestReclaimTracking: the rules of what reclaim remembers between cycles,
// step by step at fake instants: a victim evicted for a queue is waited for
// while it runs and forgotten once gone or shown terminating; a victim
// whose eviction was refused is left out of the candidates until
// evictionRetry has passed, or until it is gone; prune forgets the same
// for every queue at once.
func TestReclaimTracking(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	type step struct {
		t float64
		// evict: victims evicted for queue "q"; refuse: victims whose
		// eviction was refused at at(t).
		evict, refuse []types.UID
		// running: pod UID -> not terminating, for the pods that hold
		// resources at at(t).
		running map[types.UID]bool
		// ask: waitingFor("q") and stillRefused are asked (else prune when
		// doPrune); want them.
		ask         bool
		doPrune     bool
		wantWaiting int
		wantRefused []types.UID
		wantEmpty   bool
	}
	cases := []struct {
		name  string
		steps []step
	}{{
		name: "an evicted victim is waited for while it runs",
		steps: []step{
			{t: 0, evict: []types.UID{"v1", "v2"}},
			{t: 1, running: map[types.UID]bool{"v1": true, "v2": true}, ask: true, wantWaiting: 2},
			{t: 2, running: map[types.UID]bool{"v1": true, "v2": false}, ask: true, wantWaiting: 1}, // v2 shown terminating
			{t: 3, running: map[types.UID]bool{"v1": true, "v2": true}, ask: true, wantWaiting: 1},  // v2 stays forgotten
			{t: 4, running: map[types.UID]bool{}, ask: true, wantWaiting: 0, wantEmpty: true},
		},
	}, {
		name: "a refused victim is retried after its time",
		steps: []step{
			{t: 0, refuse: []types.UID{"r"}},
			{t: 5, running: map[types.UID]bool{"r": true}, ask: true, wantRefused: []types.UID{"r"}},
			{t: 9.9, running: map[types.UID]bool{"r": true}, ask: true, wantRefused: []types.UID{"r"}},
			{t: 10, running: map[types.UID]bool{"r": true}, ask: true, wantRefused: nil, wantEmpty: true},
		},
	}, {
		name: "a refused victim gone is forgotten before its time",
		steps: []step{
			{t: 0, refuse: []types.UID{"r", "s"}},
			{t: 1, running: map[types.UID]bool{"s": false}, ask: true, wantRefused: []types.UID{"s"}}, // terminating still holds
			{t: 2, running: map[types.UID]bool{}, ask: true, wantRefused: nil, wantEmpty: true},
		},
	}, {
		name: "prune forgets for every queue",
		steps: []step{
			{t: 0, evict: []types.UID{"v1", "v2"}, refuse: []types.UID{"r", "s"}},
			{t: 1, running: map[types.UID]bool{"v1": true, "v2": false, "r": true, "s": true}, doPrune: true},
			{t: 1, running: map[types.UID]bool{"v1": true, "v2": true, "r": true, "s": true}, ask: true, wantWaiting: 1, wantRefused: []types.UID{"r", "s"}},
			{t: 2, running: map[types.UID]bool{"v1": true, "r": true}, doPrune: true},
			{t: 2, running: map[types.UID]bool{"v1": true, "r": true, "s": true}, ask: true, wantWaiting: 1, wantRefused: []types.UID{"r"}},
			{t: 10, running: map[types.UID]bool{"r": true}, doPrune: true, wantEmpty: true},
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newReclaimTracking()
			if !r.empty() {
				t.Fatal("a new record is not empty")
			}
			for i, st := range tc.steps {
				now := at(st.t)
				for _, uid := range st.evict {
					r.evictedFor("q", uid)
				}
				for _, uid := range st.refuse {
					r.refusedAt(uid, now)
				}
				if st.doPrune {
					r.prune(st.running, now)
				}
				if st.ask {
					waiting := r.waitingFor("q", func(uid types.UID) bool { return st.running[uid] })
					if waiting != st.wantWaiting {
						t.Errorf("step %d: waiting for %d, want %d", i, waiting, st.wantWaiting)
					}
					refused := r.stillRefused(now, func(uid types.UID) bool { _, ok := st.running[uid]; return ok })
					got := slices.Sorted(maps.Keys(refused))
					if !slices.Equal(got, st.wantRefused) {
						t.Errorf("step %d: refused %v, want %v", i, got, st.wantRefused)
					}
				}
				if st.wantEmpty != r.empty() {
					t.Errorf("step %d: empty %v, want %v (%v %v)", i, r.empty(), st.wantEmpty, r.evicted, r.refused)
				}
			}
		})
	}
}
