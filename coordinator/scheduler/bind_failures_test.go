package scheduler

import (
	"errors"
	"testing"
	"time"

	"github.com/gpufrac/gpufrac/tests/builders"
)

// clearBackoffs forgets every back-off (tests that retry a binding at once).
func (f *bindFailures) clearBackoffs() {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.backoff)
}

// TestBindFailures: the rules of the bind back-off and the gangs' binding
// errors, step by step at fake instants: a workload's back-off starts at
// 1 s and doubles up to 10 s; pods of one workload failing in the same
// round share one back-off; a workload no longer pending is forgotten; a
// gang keeps its last error until it is no longer bound in part.
func TestBindFailures(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	task := func(pod, workload, gang string) bindTask {
		return bindTask{pod: builders.MakePod(pod, "default").Obj(), node: "n1", workload: workload, gang: gang}
	}
	type step struct {
		fail *bindTask // record this failure at at(t)
		t    float64
		// pending: the workloads pending when held is asked at at(t)
		// (nil: not asked); wantHeld: those held, with their failures in
		// a row and the seconds until they may be placed again.
		pending  []string
		wantHeld map[string][2]float64
		// keepGangs: the gangs still bound in part (nil: not asked);
		// wantCause: a gang's last error wanted after the step.
		keepGangs []string
		wantCause map[string]string
		wantEmpty bool
	}
	a0, a1 := task("a-0", "a", ""), task("a-1", "a", "")
	g0, g1 := task("g-0", "g", "g"), task("g-1", "g", "g")
	cases := []struct {
		name  string
		steps []step
	}{{
		name: "doubles from 1 s up to 10 s",
		steps: []step{
			{fail: &a0, t: 0},
			{t: 0.5, pending: []string{"a"}, wantHeld: map[string][2]float64{"a": {1, 0.5}}},
			{t: 1, pending: []string{"a"}, wantHeld: map[string][2]float64{}},
			{fail: &a0, t: 1},
			{t: 1, pending: []string{"a"}, wantHeld: map[string][2]float64{"a": {2, 2}}},
			{fail: &a0, t: 3},
			{t: 3, pending: []string{"a"}, wantHeld: map[string][2]float64{"a": {3, 4}}},
			{fail: &a0, t: 7},
			{t: 7, pending: []string{"a"}, wantHeld: map[string][2]float64{"a": {4, 8}}},
			{fail: &a0, t: 15},
			{t: 15, pending: []string{"a"}, wantHeld: map[string][2]float64{"a": {5, 10}}},
			{fail: &a0, t: 25},
			{t: 25, pending: []string{"a"}, wantHeld: map[string][2]float64{"a": {6, 10}}},
		},
	}, {
		name: "pods failing in one round share one back-off",
		steps: []step{
			{fail: &a0, t: 0},
			{fail: &a1, t: 0.2},
			{t: 0.2, pending: []string{"a"}, wantHeld: map[string][2]float64{"a": {1, 0.8}}},
		},
	}, {
		name: "a workload no longer pending is forgotten",
		steps: []step{
			{fail: &a0, t: 0},
			{fail: &g0, t: 0},
			{t: 0.5, pending: []string{"g"}, wantHeld: map[string][2]float64{"g": {1, 0.5}}},
			// a fails again after it was forgotten: its back-off starts over.
			{fail: &a0, t: 0.5},
			{t: 0.5, pending: []string{"a", "g"}, wantHeld: map[string][2]float64{"a": {1, 1}, "g": {1, 0.5}}},
		},
	}, {
		name: "a gang keeps its last error while bound in part",
		steps: []step{
			{fail: &g0, t: 0, wantCause: map[string]string{"g": "binding g-0 to n1: refused"}},
			{fail: &g1, t: 0.1, wantCause: map[string]string{"g": "binding g-1 to n1: refused"}},
			{t: 0.2, keepGangs: []string{"g"}, wantCause: map[string]string{"g": "binding g-1 to n1: refused"}},
			{t: 0.3, keepGangs: []string{}, wantCause: map[string]string{"g": ""}},
			{t: 2, pending: []string{}, wantHeld: map[string][2]float64{}, wantEmpty: true},
		},
	}, {
		name: "a pod on its own leaves no gang error",
		steps: []step{
			{fail: &a0, t: 0, wantCause: map[string]string{"": ""}},
			{t: 2, pending: []string{}, wantHeld: map[string][2]float64{}, wantEmpty: true},
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newBindFailures()
			if !f.empty() || f.backingOff() {
				t.Fatal("a new record is not empty")
			}
			for i, st := range tc.steps {
				now := at(st.t)
				if st.fail != nil {
					f.failed(*st.fail, errors.New("refused"), now)
					if !f.backingOff() {
						t.Errorf("step %d: no back-off after a failure", i)
					}
				}
				if st.pending != nil {
					keys := map[string]bool{}
					for _, k := range st.pending {
						keys[k] = true
					}
					held := f.held(keys, now)
					if len(held) != len(st.wantHeld) {
						t.Errorf("step %d: held %v, want %v", i, held, st.wantHeld)
					}
					for k, want := range st.wantHeld {
						r, ok := held[k]
						got := [2]float64{float64(r.failures), r.until.Sub(now).Seconds()}
						if !ok || got != want {
							t.Errorf("step %d: %s held %v (failures, seconds left) = %v, want %v", i, k, ok, got, want)
						}
					}
				}
				if st.keepGangs != nil {
					keep := map[string]bool{}
					for _, g := range st.keepGangs {
						keep[g] = true
					}
					f.keepGangErrors(func(g string) bool { return keep[g] })
				}
				for g, want := range st.wantCause {
					if got := f.gangCause(g); got != want {
						t.Errorf("step %d: gang %q cause %q, want %q", i, g, got, want)
					}
				}
				if st.wantEmpty && !f.empty() {
					t.Errorf("step %d: not empty: %v %v", i, f.backoff, f.gangErr)
				}
			}
		})
	}
}
