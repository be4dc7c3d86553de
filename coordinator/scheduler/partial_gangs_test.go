package scheduler

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// TestPartialGangs: a gang bound in part is timed from the first cycle that
// saw it so, not from each cycle; one no longer bound in part is forgotten
// and timed afresh if it is bound in part again.
func TestPartialGangs(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	type step struct {
		t       time.Duration
		partial []string // the gangs bound in part in this cycle
		want    map[string]time.Duration
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{{
		name: "timed from the first sight",
		steps: []step{
			{t: 0, partial: []string{"g"}, want: map[string]time.Duration{"g": 0}},
			{t: 5 * time.Second, partial: []string{"g", "h"}, want: map[string]time.Duration{"g": 0, "h": 5 * time.Second}},
		},
	}, {
		name: "forgotten once whole, timed afresh",
		steps: []step{
			{t: 0, partial: []string{"g"}, want: map[string]time.Duration{"g": 0}},
			{t: time.Second, partial: nil, want: map[string]time.Duration{}},
			{t: 2 * time.Second, partial: []string{"g"}, want: map[string]time.Duration{"g": 2 * time.Second}},
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			g := partialGangs{}
			for i, st := range tc.steps {
				now := t0.Add(st.t)
				in := map[string]bool{}
				for _, k := range st.partial {
					in[k] = true
				}
				g.keep(func(k string) bool { return in[k] })
				got := map[string]time.Duration{}
				for _, k := range st.partial {
					got[k] = g.since(k, now).Sub(t0)
				}
				if len(g) != len(st.want) {
					t.Errorf("step %d: %d gangs kept, want %d", i, len(g), len(st.want))
				}
				for k, want := range st.want {
					if got[k] != want {
						t.Errorf("step %d: %s since +%v, want +%v", i, k, got[k], want)
					}
				}
			}
		})
	}
}

// TestEvictionsSent: an eviction sent is not sent again while the pod is
// still shown where it was evicted from; once it is not, it is forgotten.
func TestEvictionsSent(t *testing.T) {
	type step struct {
		mark     []types.UID
		still    []types.UID // the pods still shown (keep); nil: no keep
		wantSent []types.UID
		wantNot  []types.UID
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{{
		name: "sent once while still shown",
		steps: []step{
			{mark: []types.UID{"a", "b"}, wantSent: []types.UID{"a", "b"}, wantNot: []types.UID{"c"}},
			{still: []types.UID{"a", "b"}, wantSent: []types.UID{"a", "b"}},
			{still: []types.UID{"b"}, wantSent: []types.UID{"b"}, wantNot: []types.UID{"a"}},
			{still: []types.UID{"a", "b"}, wantSent: []types.UID{"b"}, wantNot: []types.UID{"a"}},
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			e := evictionsSent{}
			for i, st := range tc.steps {
				for _, u := range st.mark {
					e.mark(u)
				}
				if st.still != nil {
					in := map[types.UID]bool{}
					for _, u := range st.still {
						in[u] = true
					}
					e.keep(func(u types.UID) bool { return in[u] })
				}
				for _, u := range st.wantSent {
					if !e.sent(u) {
						t.Errorf("step %d: %s not sent, want sent", i, u)
					}
				}
				for _, u := range st.wantNot {
					if e.sent(u) {
						t.Errorf("step %d: %s sent, want not", i, u)
					}
				}
			}
		})
	}
}
