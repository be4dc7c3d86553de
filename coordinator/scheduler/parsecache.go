package scheduler

import (
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// parseCache keeps the pods' parses from one cycle to the next, by pod
// object (see the note in parse.go), with the cycle-wide inputs they were
// made with. It is the cycle goroutine's alone: no lock.
type parseCache struct {
	entries map[*corev1.Pod]*parseEntry // nil until the first begin
	in      parseInputs                 // what the entries were made with
	cycle   uint64                      // counts the cycles begun
	gen     uint64                      // counts the times the entries were emptied
}

// parseInputs are the cycle-wide inputs of a parse besides the pod: the GPU
// models, the scalar worth (MIG or replica resource -> milli-GPU per unit)
// and the nodes in mode dra (where pods with GPU claims may go).
type parseInputs struct {
	models      []string
	scalarMilli map[string]int64
	draNodes    map[string]bool
}

// begin begins a cycle's parses with in. It empties the cache when the
// parses kept were made with other inputs, and tells whether it did.
func (c *parseCache) begin(in parseInputs) (emptied bool) {
	c.cycle++
	if c.valid(in) {
		return false
	}
	c.gen++
	c.entries = map[*corev1.Pod]*parseEntry{}
	c.in = parseInputs{models: slices.Clone(in.models), scalarMilli: maps.Clone(in.scalarMilli), draNodes: maps.Clone(in.draNodes)}
	return true
}

// valid tells whether the parses kept were made with in.
func (c *parseCache) valid(in parseInputs) bool {
	return c.entries != nil && slices.Equal(c.in.models, in.models) &&
		maps.Equal(c.in.scalarMilli, in.scalarMilli) && maps.Equal(c.in.draNodes, in.draNodes)
}

// sweep forgets the pods the cycle did not read.
func (c *parseCache) sweep() {
	maps.DeleteFunc(c.entries, func(_ *corev1.Pod, e *parseEntry) bool { return e.cycle != c.cycle })
}

// entry returns p's entry, made when missing and marked read by the cycle;
// nil when p is not kept (an object without a resourceVersion, made by
// hand and maybe changed in place) or no cycle began.
func (c *parseCache) entry(p *corev1.Pod) *parseEntry {
	if c.entries == nil || p.ResourceVersion == "" {
		return nil
	}
	e := c.entries[p]
	if e == nil {
		e = &parseEntry{}
		c.entries[p] = e
	}
	e.cycle = c.cycle
	return e
}

// kept returns p's entry when it has one, marked read by the cycle; nil
// otherwise (none is made).
func (c *parseCache) kept(p *corev1.Pod) *parseEntry {
	if c.entries == nil || p.ResourceVersion == "" {
		return nil
	}
	e := c.entries[p]
	if e != nil {
		e.cycle = c.cycle
	}
	return e
}
