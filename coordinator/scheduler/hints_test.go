package scheduler

import (
	"slices"
	"testing"
	"time"
)

// TestPlaceholderHints: the rules of the placeholder hints, step by step at
// fake instants: a landed placeholder makes its node preferred and starts
// the group's cooldown, which holds only while a preferred node is busy and
// releaseCooldown has not passed; Karpenter's nominations add nodes and
// NodeClaims once each; prune forgets dead groups, gone nodes and the
// release times of dead groups past their cooldown.
func TestPlaceholderHints(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	type step struct {
		t float64
		// land: a placeholder of group g landed on this node; nominate:
		// nodes and NodeClaims Karpenter nominated for g.
		land               string
		nominate, claimsOf []string
		// prune with these live groups and existing nodes (nil: no prune).
		live, exists []string
		// busy: the nodes settling or with a pod being bound; wantCooling
		// is asked for g when checkCooling.
		busy         []string
		checkCooling bool
		wantCooling  bool
		wantNodes    []string // g's preferred nodes
		wantClaims   []string // g's nominated NodeClaims
		wantHinted   bool
		wantEmpty    bool
	}
	set := func(xs []string) map[string]bool {
		m := map[string]bool{}
		for _, x := range xs {
			m[x] = true
		}
		return m
	}
	cases := []struct {
		name  string
		steps []step
	}{{
		name: "a landed placeholder cools its group while its node is busy",
		steps: []step{
			{t: 0, land: "n1", wantNodes: []string{"n1"}, wantHinted: true},
			{t: 1, busy: []string{"n1"}, checkCooling: true, wantCooling: true, wantNodes: []string{"n1"}, wantHinted: true},
			{t: 1, busy: []string{"n2"}, checkCooling: true, wantCooling: false, wantNodes: []string{"n1"}, wantHinted: true},
			{t: 9.9, busy: []string{"n1"}, checkCooling: true, wantCooling: true, wantNodes: []string{"n1"}, wantHinted: true},
			{t: 10, busy: []string{"n1"}, checkCooling: true, wantCooling: false, wantNodes: []string{"n1"}, wantHinted: true},
		},
	}, {
		name: "nominations add nodes and NodeClaims once",
		steps: []step{
			{t: 0, nominate: []string{"n1", "n2"}, claimsOf: []string{"c1"}, wantNodes: []string{"n1", "n2"}, wantClaims: []string{"c1"}, wantHinted: true},
			{t: 0, nominate: []string{"n2"}, claimsOf: []string{"c1", "c2"}, wantNodes: []string{"n1", "n2"}, wantClaims: []string{"c1", "c2"}, wantHinted: true},
			{t: 0, land: "n1", wantNodes: []string{"n1", "n2"}, wantClaims: []string{"c1", "c2"}, wantHinted: true},
			// Released at 0: a nominated node busy holds the cooldown too.
			{t: 1, busy: []string{"n2"}, checkCooling: true, wantCooling: true, wantNodes: []string{"n1", "n2"}, wantClaims: []string{"c1", "c2"}, wantHinted: true},
		},
	}, {
		name: "a nominated NodeClaim alone is a hint",
		steps: []step{
			{t: 0, claimsOf: []string{"c1"}, wantClaims: []string{"c1"}, wantHinted: true},
		},
	}, {
		name: "nominated only: no cooldown",
		steps: []step{
			{t: 0, nominate: []string{"n1"}, wantNodes: []string{"n1"}, wantHinted: true},
			{t: 1, busy: []string{"n1"}, checkCooling: true, wantCooling: false, wantNodes: []string{"n1"}, wantHinted: true},
		},
	}, {
		name: "prune forgets gone nodes, dead groups, and their release after the cooldown",
		steps: []step{
			{t: 0, land: "n1", nominate: []string{"n2"}, claimsOf: []string{"c1"}, wantNodes: []string{"n1", "n2"}, wantClaims: []string{"c1"}, wantHinted: true},
			{t: 1, live: []string{"g"}, exists: []string{"n2"}, wantNodes: []string{"n2"}, wantClaims: []string{"c1"}, wantHinted: true},
			{t: 2, live: []string{}, exists: []string{"n2"}, wantHinted: false},
			// The release stays for its cooldown, then goes too.
			{t: 9, live: []string{}, exists: []string{"n2"}, wantHinted: false},
			{t: 10, live: []string{}, exists: []string{"n2"}, wantHinted: false, wantEmpty: true},
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newPlaceholderHints()
			if !h.empty() || h.hinted() || h.nodes() != nil {
				t.Fatal("new hints are not empty")
			}
			for i, st := range tc.steps {
				now := at(st.t)
				if st.land != "" {
					h.landed("g", st.land, now)
				}
				if st.nominate != nil || st.claimsOf != nil {
					h.nominated("g", st.nominate, st.claimsOf)
				}
				if st.live != nil {
					exists := set(st.exists)
					h.prune(func() map[string]bool { return set(st.live) }, func(n string) bool { return exists[n] }, now)
				}
				if st.checkCooling {
					busy := set(st.busy)
					if got := h.cooling("g", now, func(n string) bool { return busy[n] }); got != st.wantCooling {
						t.Errorf("step %d: cooling %v, want %v", i, got, st.wantCooling)
					}
				}
				nodes, claims := h.of("g")
				if !slices.Equal(nodes, st.wantNodes) && len(nodes)+len(st.wantNodes) > 0 {
					t.Errorf("step %d: nodes %v, want %v", i, nodes, st.wantNodes)
				}
				if !slices.Equal(claims, st.wantClaims) && len(claims)+len(st.wantClaims) > 0 {
					t.Errorf("step %d: claims %v, want %v", i, claims, st.wantClaims)
				}
				if all := h.nodes(); len(all) != len(st.wantNodes) || !allIn(st.wantNodes, all) {
					t.Errorf("step %d: all nodes %v, want %v", i, all, st.wantNodes)
				}
				if h.hinted() != st.wantHinted {
					t.Errorf("step %d: hinted %v, want %v", i, h.hinted(), st.wantHinted)
				}
				if h.empty() != st.wantEmpty {
					t.Errorf("step %d: empty %v, want %v", i, h.empty(), st.wantEmpty)
				}
			}
		})
	}
}

func allIn(xs []string, m map[string]bool) bool {
	for _, x := range xs {
		if !m[x] {
			return false
		}
	}
	return true
}

// TestPruneNamesTheLiveGroupsOnlyWithAHint: naming the live groups hashes
// every admitted workload's constraints, so prune asks for them only when
// some hint is kept, and then once.
func TestPruneNamesTheLiveGroupsOnlyWithAHint(t *testing.T) {
	h := newPlaceholderHints()
	asked := 0
	live := func() map[string]bool {
		asked++
		return map[string]bool{"g": true}
	}
	exists := func(string) bool { return true }
	now := time.Unix(1000, 0)
	h.prune(live, exists, now)
	if asked != 0 {
		t.Errorf("no hint kept: the live groups were asked for %d times, want 0", asked)
	}
	h.nominated("g", []string{"n"}, nil)
	h.nominated("gone", []string{"n"}, nil)
	h.prune(live, exists, now)
	if asked != 1 {
		t.Errorf("hints kept: the live groups were asked for %d times, want 1", asked)
	}
	if nodes, _ := h.of("g"); len(nodes) != 1 {
		t.Errorf("live group g lost its hint: %v", nodes)
	}
	if nodes, _ := h.of("gone"); len(nodes) != 0 {
		t.Errorf("group gone, not live, kept its hint: %v", nodes)
	}
}
