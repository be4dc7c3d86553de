package scheduler

import (
	"testing"
	"unsafe"
)

// TestGangIDs: a gang's ID is made once and kept while some cycle asks for
// it (this one or the last), then let go; a gang is its queue, namespace
// and name together.
func TestGangIDs(t *testing.T) {
	var g gangIDs
	type ask struct {
		queue, namespace, name string
		id, key                string
	}
	train := ask{"q", "ns", "train", "q|ns/train", "ns/train"}
	for _, tc := range []struct {
		name string
		turn bool
		asks []ask
		kept int // IDs held after the step
	}{
		{"first ask makes the ID", false, []ask{train}, 1},
		{"asked again in the same cycle", false, []ask{train}, 1},
		{"another queue, namespace or name is another gang", false, []ask{
			{"r", "ns", "train", "r|ns/train", "ns/train"},
			{"q", "other", "train", "q|other/train", "other/train"},
			{"q", "ns", "eval", "q|ns/eval", "ns/eval"},
		}, 4},
		{"the next cycle asks for one: it is kept", true, []ask{train}, 1},
		{"a cycle that asks for none", true, nil, 0},
		{"asked after that: made again", true, []ask{train}, 1},
	} {
		if tc.turn {
			g.turn()
		}
		for _, a := range tc.asks {
			id, key := g.of(a.queue, a.namespace, a.name)
			if id != a.id || key != a.key {
				t.Errorf("%s: of(%q, %q, %q) = %q, %q; want %q, %q", tc.name, a.queue, a.namespace, a.name, id, key, a.id, a.key)
			}
		}
		if len(g.cur) != tc.kept {
			t.Errorf("%s: %d IDs asked for in this cycle, want %d", tc.name, len(g.cur), tc.kept)
		}
	}
	// Made once: the second ask returns the string the first made.
	var h gangIDs
	first, _ := h.of("q", "ns", "train")
	h.turn()
	again, _ := h.of("q", "ns", "train")
	if unsafe.StringData(first) != unsafe.StringData(again) {
		t.Errorf("the ID was made again in the next cycle")
	}
}
