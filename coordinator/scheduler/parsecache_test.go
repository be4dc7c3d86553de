package scheduler

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestParseCache: a parse is kept by pod object while the cycle-wide inputs
// it was made with stay, and forgotten by the first cycle that does not
// read its pod; an object without a resourceVersion is never kept.
func TestParseCache(t *testing.T) {
	pod := func(name, rv string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: rv}}
	}
	a, b, handMade := pod("a", "1"), pod("b", "1"), pod("h", "")
	h100 := parseInputs{models: []string{"H100"}, scalarMilli: map[string]int64{"mig": 143}, draNodes: map[string]bool{}}
	both := parseInputs{models: []string{"A100", "H100"}, scalarMilli: h100.scalarMilli}
	withDRA := parseInputs{models: h100.models, scalarMilli: h100.scalarMilli, draNodes: map[string]bool{"n": true}}

	type step struct {
		name    string
		do      func(c *parseCache) // a cycle's reads
		begin   *parseInputs        // begin a cycle with these first
		emptied bool                // what begin tells
		sweep   bool                // sweep after do
		kept    []*corev1.Pod       // held after the step
		gen     uint64
	}
	read := func(ps ...*corev1.Pod) func(c *parseCache) {
		return func(c *parseCache) {
			for _, p := range ps {
				c.entry(p).own.done = true
			}
		}
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"nothing is kept before the first cycle", []step{
			{name: "no cycle", do: func(c *parseCache) {
				if c.entry(a) != nil || c.kept(a) != nil {
					t.Error("an entry before any cycle began")
				}
			}},
		}},
		{"kept while read, by object", []step{
			{name: "first cycle", begin: &h100, emptied: true, do: read(a, b), sweep: true, kept: []*corev1.Pod{a, b}, gen: 1},
			{name: "same inputs, a read", begin: &h100, do: func(c *parseCache) {
				if e := c.kept(a); e == nil || !e.own.done {
					t.Error("a's parse was not kept")
				}
			}, sweep: true, kept: []*corev1.Pod{a}, gen: 1},
			{name: "a new object of a", begin: &h100, do: func(c *parseCache) {
				if c.kept(pod("a", "2")) != nil {
					t.Error("another object of a found a's parse")
				}
			}, sweep: true, gen: 1},
		}},
		{"never a hand-made object", []step{
			{name: "read", begin: &h100, emptied: true, do: func(c *parseCache) {
				if c.entry(handMade) != nil || c.kept(handMade) != nil {
					t.Error("an object without a resourceVersion was kept")
				}
			}, gen: 1},
		}},
		{"other inputs empty it", []step{
			{name: "first", begin: &h100, emptied: true, do: read(a), kept: []*corev1.Pod{a}, gen: 1},
			{name: "a model more", begin: &both, emptied: true, gen: 2},
			{name: "back", begin: &h100, emptied: true, do: read(a), kept: []*corev1.Pod{a}, gen: 3},
			{name: "a node in mode dra", begin: &withDRA, emptied: true, gen: 4},
		}},
		{"kept without a sweep", []step{
			{name: "first", begin: &h100, emptied: true, do: read(a, b), kept: []*corev1.Pod{a, b}, gen: 1},
			{name: "nothing read, no sweep", begin: &h100, kept: []*corev1.Pod{a, b}, gen: 1},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c parseCache
			for _, st := range tc.steps {
				if st.begin != nil {
					if got := c.begin(*st.begin); got != st.emptied {
						t.Errorf("%s: begin emptied %v, want %v", st.name, got, st.emptied)
					}
				}
				if st.do != nil {
					st.do(&c)
				}
				if st.sweep {
					c.sweep()
				}
				if len(c.entries) != len(st.kept) {
					t.Errorf("%s: %d parses kept, want %d", st.name, len(c.entries), len(st.kept))
				}
				for _, p := range st.kept {
					if c.entries[p] == nil {
						t.Errorf("%s: %s's parse not kept", st.name, p.Name)
					}
				}
				if c.gen != st.gen {
					t.Errorf("%s: emptied %d times, want %d", st.name, c.gen, st.gen)
				}
			}
		})
	}

	// begin keeps its own copy of the inputs: the caller's maps may change.
	var c parseCache
	in := parseInputs{models: []string{"H100"}, scalarMilli: map[string]int64{"mig": 143}}
	c.begin(in)
	in.scalarMilli["mig"] = 250
	if c.valid(in) {
		t.Error("the kept inputs changed with the caller's map")
	}
}
