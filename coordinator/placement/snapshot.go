package placement

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/gpufrac/gpufrac/api"
)

// ErrConflict reports an Assume or Forget that does not match the snapshot
// (the GPUs are not free, the node is unknown, usage would go negative).
var ErrConflict = errors.New("placement conflicts with the snapshot")

// genSource hands out node generations. A generation names one content of one
// node: every change takes a fresh number and Rollback restores the old one,
// so (source, node index, generation) is a valid cache key for anything
// computed from a node's free resources. Clones share the source.
type genSource struct{ n atomic.Uint64 }

func (g *genSource) next() uint64 { return g.n.Add(1) }

// nodeState is the mutable part of one node, kept flat for the hot loop
// and free of pointers: a Clone copies it as plain memory, and the
// collector does not scan it.
type nodeState struct {
	model   int32 // index into Snapshot.models, -1 without GPUs or model
	gpuOff  int32 // first GPU in Snapshot.free
	gpuN    int32
	cpuFree int64
	memFree int64
	// Derived from the GPUs' free milli, kept in step by apply.
	fullFree  int32 // GPUs with all MilliPerGPU free
	maxFree   int32 // largest free milli of one GPU
	totalFree int32
	gen       uint64
	kinds     KindCounts
}

// journalEntry holds a node as it was before a change, for Rollback.
type journalEntry struct {
	node  int
	state nodeState
	free  [8]int32 // GPUs 0..7 inline; more in Snapshot.journalFree
	extra int      // offset into journalFree for GPUs beyond 8, -1 if none
	scal  int      // offset into journalScal of the node's scalars, -1 if none
}

// Snapshot is the cluster as placement sees it: nodes, their free resources,
// and the undo journal of open checkpoints. It is not safe for concurrent
// use; Clone gives an independent copy.
//
// Reserved GPUs (GPU.Reserved) are known as such (reserved) and keep their
// true free milli (free). The policies, the fit checks and the choice of
// whole GPUs read view instead, where a reserved GPU never shows a whole GPU
// free (at most reservedViewMilli): so no whole-GPU request takes it and
// fragmentation scores count it as room for shares only. view is free
// itself when no GPU is reserved (the simulator's case).
type Snapshot struct {
	nodes    []nodeState
	meta     []*Node // node i's description; never written after NewSnapshot
	free     []int32 // free milli of every GPU, node i's at nodes[i].gpuOff
	view     []int32 // free as placement reads it (see above); aliases free when reserved is nil
	reserved []bool  // GPU (same index as free) -> held whole by a reservation; nil when none is
	byName   map[string]int
	models   []string // interned GPU models; nodeState.model indexes it
	src      *genSource
	// tainted is true when some node has a taint pods must tolerate.
	tainted bool
	// Scalar resources (Node.Scalars): their names, sorted, and the free
	// units of node i at scal[i*len(scalarNames):].
	scalarNames []string
	scalarIdx   map[string]int32 // resource name -> index in scalarNames
	scal        []int64

	// journal holds the pre-change state of nodes changed since the
	// outermost open checkpoint; empty when no checkpoint is open.
	journal     []journalEntry
	journalFree []int32
	journalScal []int64
	depth       int

	// elig caches per-node eligibility by request class key -> eligibility.
	eligMu sync.Mutex
	elig   map[eligKey]*eligibility

	// htypes are the node types (model, GPU count, allocatable CPU and
	// memory) of the nodes with GPUs and a model, to tell which models can
	// host a request; never written after NewSnapshot.
	htypes []hostType
	// modelFree (model index -> free GPU milli of its nodes) and freeMilli
	// (all nodes) are kept in step by refresh and Rollback.
	modelFree []int64
	freeMilli int64
	// demand is the workload's GPU demand by host types (AddDemand).
	demand demandBook
	// shared: nodes, free, view, scal and modelFree are shared with a
	// clone (or the snapshot cloned); own copies them before a change.
	shared bool
	// cloned: the snapshot was cloned, or is a clone: meta, reserved and
	// byName, which nothing writes, are shared for good (own keeps them).
	cloned bool
}

// NewSnapshot builds a snapshot of nodes. It keeps a pointer to each Node's
// descriptive fields (labels, taints, GPU IDs); the caller must not change
// them afterwards.
func NewSnapshot(nodes []Node) (*Snapshot, error) {
	ptrs := make([]*Node, len(nodes))
	for i := range nodes {
		ptrs[i] = &nodes[i]
	}
	return NewSnapshotOf(ptrs)
}

// NewSnapshotOf is NewSnapshot over pointers to the nodes, which it keeps:
// the caller must not change the Nodes afterwards. A caller that keeps its
// Nodes between snapshots (the coordinator's state cache) hands them over
// without copying them.
func NewSnapshotOf(nodes []*Node) (*Snapshot, error) { return NewSnapshotReusing(nil, nodes) }

// NewSnapshotReusing is NewSnapshotOf made in the arrays of spare, a
// snapshot its caller is done with (nil: none): a scheduler that makes a
// snapshot of thousands of nodes every cycle would otherwise allocate the
// last one's arrays again. spare's arrays are taken only when no clone
// shares them (those a clone shares for good, never) and no checkpoint is
// open; either way spare must not be used afterwards (it is emptied: a use
// panics).
func NewSnapshotReusing(spare *Snapshot, nodes []*Node) (*Snapshot, error) {
	nGPU := 0
	for i := range nodes {
		nGPU += len(nodes[i].GPUs)
	}
	s := &Snapshot{src: &genSource{}, elig: map[eligKey]*eligibility{}}
	var (
		spareView  []int32
		spareBools []bool
	)
	if spare != nil && !spare.shared && spare.depth == 0 && spare.nodes != nil {
		s.nodes = reuse(spare.nodes, len(nodes))
		s.free = reuse(spare.free, nGPU)[:0]
		if spare.reserved != nil {
			spareView = spare.view // an array of its own then
		}
		if !spare.cloned {
			s.meta, s.byName, spareBools = reuse(spare.meta, len(nodes)), spare.byName, spare.reserved
			clear(s.meta[len(s.meta):cap(s.meta)]) // nodes of the last one not held past it
			clear(s.byName)
		}
	}
	if spare != nil {
		*spare = Snapshot{} // emptied: its arrays are the new snapshot's
	}
	if s.nodes == nil {
		s.nodes = make([]nodeState, len(nodes))
		s.free = make([]int32, 0, nGPU)
	}
	if s.byName == nil {
		s.meta = make([]*Node, len(nodes))
		s.byName = make(map[string]int, len(nodes))
	}
	if err := s.initScalars(nodes); err != nil {
		return nil, err
	}
	modelIdx := map[string]int32{}
	lastModel, lastID := "", int32(-1)
	typeSeen := map[hostType]bool{}
	for i := range nodes {
		for _, g := range nodes[i].GPUs {
			if g.Reserved && s.reserved == nil {
				s.reserved = reuse(spareBools, nGPU)[:0]
			}
		}
	}
	for i := range nodes {
		n := nodes[i]
		if n.Name == "" {
			return nil, fmt.Errorf("building snapshot: node %d has no name", i)
		}
		if s.byName[n.Name] = i; len(s.byName) != i+1 {
			return nil, fmt.Errorf("building snapshot: duplicate node %q", n.Name)
		}
		for t := range n.Taints {
			if blocksScheduling(&n.Taints[t]) {
				s.tainted = true
			}
		}
		if n.UsedCPUMilli > n.CPUMilli || n.UsedMemoryBytes > n.MemoryBytes || n.UsedCPUMilli < 0 || n.UsedMemoryBytes < 0 {
			return nil, fmt.Errorf("building snapshot: node %q uses more CPU or memory than it has", n.Name)
		}
		s.meta[i] = n
		st := nodeState{
			model:   -1,
			gpuOff:  int32(len(s.free)),
			gpuN:    int32(len(n.GPUs)),
			cpuFree: n.CPUMilli - n.UsedCPUMilli,
			memFree: n.MemoryBytes - n.UsedMemoryBytes,
			gen:     s.src.next(),
			kinds:   n.Kinds,
		}
		for _, g := range n.GPUs {
			if g.FreeMilli < 0 || g.FreeMilli > MilliPerGPU {
				return nil, fmt.Errorf("building snapshot: node %q GPU %q has %d milli free, want 0..%d", n.Name, g.ID, g.FreeMilli, MilliPerGPU)
			}
			if s.reserved != nil {
				s.reserved = append(s.reserved, g.Reserved)
			}
			s.free = append(s.free, int32(g.FreeMilli))
		}
		if model := nodeModel(n); model != "" && (len(n.GPUs) > 0 || len(n.Scalars) > 0) {
			id, ok := lastID, model == lastModel && lastID >= 0 // most nodes are of the model of the one before
			if !ok {
				id, ok = modelIdx[model]
			}
			if !ok {
				id = int32(len(s.models))
				modelIdx[model] = id
				s.models = append(s.models, model)
				s.modelFree = append(s.modelFree, 0)
			}
			lastModel, lastID = model, id
			st.model = id
			if ht := (hostType{model: id, gpus: int32(len(n.GPUs)), cpu: n.CPUMilli, mem: n.MemoryBytes}); len(n.GPUs) > 0 && !typeSeen[ht] {
				typeSeen[ht] = true
				s.htypes = append(s.htypes, ht)
			}
		}
		s.nodes[i] = st
	}
	s.view = s.free
	if s.reserved != nil {
		s.view = reuse(spareView, len(s.free))
		for g := range s.free {
			s.view[g] = s.viewOf(g)
		}
	}
	for i := range s.nodes {
		s.refresh(i)
	}
	return s, nil
}

// reuse is xs with length n, in its own array when that is large enough,
// else in a new one; the caller overwrites what it held.
func reuse[T any](xs []T, n int) []T {
	if cap(xs) >= n {
		return xs[:n]
	}
	return make([]T, n)
}

// reservedViewMilli is the most free milli a reserved GPU shows in view:
// less than a whole GPU (see Snapshot).
const reservedViewMilli = MilliPerGPU - 1

// viewOf is GPU g's free milli as placement reads it.
func (s *Snapshot) viewOf(g int) int32 {
	if s.reserved != nil && s.reserved[g] {
		return min(s.free[g], reservedViewMilli)
	}
	return s.free[g]
}

// syncView recomputes node i's view from its free milli.
func (s *Snapshot) syncView(i int) {
	if s.reserved == nil {
		return
	}
	st := &s.nodes[i]
	for g := st.gpuOff; g < st.gpuOff+st.gpuN; g++ {
		s.view[g] = s.viewOf(int(g))
	}
}

func nodeModel(n *Node) string {
	if n.Model != "" {
		return n.Model
	}
	return n.Labels[api.LabelGPUProduct]
}

// Len is the number of nodes.
func (s *Snapshot) Len() int { return len(s.nodes) }

// NodePool is Node(i).Pool, without copying the node.
func (s *Snapshot) NodePool(i int) string { return s.meta[i].Pool }

// NodeGPUs is len(Node(i).GPUs), without copying the node.
func (s *Snapshot) NodeGPUs(i int) int { return int(s.nodes[i].gpuN) }

// Index returns the index of the named node.
func (s *Snapshot) Index(name string) (int, bool) {
	i, ok := s.byName[name]
	return i, ok
}

// Node returns node i as it is now: the descriptive fields the snapshot was
// built with and the current usage, GPU free milli and kind counts.
func (s *Snapshot) Node(i int) Node {
	st := &s.nodes[i]
	n := *s.meta[i]
	n.UsedCPUMilli = n.CPUMilli - st.cpuFree
	n.UsedMemoryBytes = n.MemoryBytes - st.memFree
	n.Kinds = st.kinds
	n.GPUs = make([]GPU, st.gpuN)
	for g := range n.GPUs {
		k := int(st.gpuOff) + g
		n.GPUs[g] = GPU{ID: s.meta[i].GPUs[g].ID, FreeMilli: int(s.free[k]), Reserved: s.reserved != nil && s.reserved[k]}
	}
	n.Scalars = s.nodeScalarMap(i)
	return n
}

// GPUMilli returns the cluster's GPU capacity and the milli-GPU in use.
func (s *Snapshot) GPUMilli() (capacity, used int64) {
	for i := range s.nodes {
		capacity += int64(s.nodes[i].gpuN) * MilliPerGPU
		used += int64(s.nodes[i].gpuN)*MilliPerGPU - int64(s.nodes[i].totalFree)
	}
	return capacity, used
}

// Clone returns an independent copy with no open checkpoint. Clones share the
// immutable node descriptions and the generation source, so a Placer's caches
// stay valid across a snapshot and its clones. They share the nodes' free
// resources too until either changes them (own): a clone nothing is placed
// on costs no copy of them.
func (s *Snapshot) Clone() *Snapshot {
	s.shared, s.cloned = true, true
	c := &Snapshot{
		cloned:   true,
		nodes:    s.nodes,
		meta:     s.meta, // never written after NewSnapshot
		free:     s.free,
		view:     s.view,
		shared:   true,
		reserved: s.reserved, // never written after NewSnapshot
		byName:   s.byName,   // never written after NewSnapshot
		models:   s.models,   // never written after NewSnapshot
		src:      s.src,
		tainted:  s.tainted,
		elig:     map[eligKey]*eligibility{},

		scalarNames: s.scalarNames, // never written after NewSnapshot
		scalarIdx:   s.scalarIdx,   // never written after NewSnapshot
		scal:        s.scal,

		htypes:    s.htypes, // never written after NewSnapshot
		modelFree: s.modelFree,
		freeMilli: s.freeMilli,
		demand:    s.demand.clone(),
	}
	s.eligMu.Lock()
	for k, v := range s.elig {
		c.elig[k] = v // immutable once built
	}
	s.eligMu.Unlock()
	return c
}

// own makes the nodes' free resources the snapshot's own, copying those it
// shares with a clone, before it changes them.
func (s *Snapshot) own() {
	if !s.shared {
		return
	}
	s.nodes = slices.Clone(s.nodes)
	s.free = slices.Clone(s.free)
	s.view = s.free
	if s.reserved != nil {
		s.view = slices.Clone(s.view)
	}
	s.scal = slices.Clone(s.scal)
	s.modelFree = slices.Clone(s.modelFree)
	s.shared = false
}

// gpus returns node i's free milli per GPU as placement reads it (view:
// reserved GPUs never whole); the slice aliases the snapshot.
func (s *Snapshot) gpus(i int) []int32 {
	st := &s.nodes[i]
	return s.view[st.gpuOff : st.gpuOff+st.gpuN]
}

// trueFree returns node i's true free milli per GPU (free); the slice
// aliases the snapshot. Changes to it must be followed by syncView.
func (s *Snapshot) trueFree(i int) []int32 {
	st := &s.nodes[i]
	return s.free[st.gpuOff : st.gpuOff+st.gpuN]
}

// isReserved tells whether GPU g of node i is reserved.
func (s *Snapshot) isReserved(i, g int) bool {
	return s.reserved != nil && s.reserved[int(s.nodes[i].gpuOff)+g]
}

// refresh recomputes node i's derived GPU fields.
func (s *Snapshot) refresh(i int) {
	st := &s.nodes[i]
	var full, maxF, total int32
	for _, f := range s.gpus(i) {
		if f == MilliPerGPU {
			full++
		}
		if f > maxF {
			maxF = f
		}
		total += f
	}
	s.freeChanged(st.model, total-st.totalFree)
	st.fullFree, st.maxFree, st.totalFree = full, maxF, total
}

// freeChanged keeps the per-model and cluster free milli in step with a
// node's totalFree.
func (s *Snapshot) freeChanged(model int32, delta int32) {
	s.freeMilli += int64(delta)
	if model >= 0 {
		s.modelFree[model] += int64(delta)
	}
}

// Assume takes the decision's resources from the snapshot, as if the pod were
// bound. Inside a checkpoint the change can be rolled back.
func (s *Snapshot) Assume(r *Request, d Decision) error {
	return s.change(r, d, -1)
}

// Forget gives the decision's resources back, as when the pod ends or an
// assumed binding failed. Inside a checkpoint the change can be rolled back.
func (s *Snapshot) Forget(r *Request, d Decision) error {
	return s.change(r, d, +1)
}

// change applies sign×request to the decision's node and GPUs after checking
// that the result stays within 0..capacity.
func (s *Snapshot) change(r *Request, d Decision, sign int) error {
	action := "assuming"
	if sign > 0 {
		action = "forgetting"
	}
	if err := r.Validate(); err != nil {
		return fmt.Errorf("%s placement on %s: %w", action, d.Node, err)
	}
	s.own()
	i := d.NodeIndex
	if i < 0 || i >= len(s.nodes) || s.meta[i].Name != d.Node {
		var ok bool
		if i, ok = s.byName[d.Node]; !ok {
			return fmt.Errorf("%s placement: node %q: %w", action, d.Node, ErrConflict)
		}
	}
	st := &s.nodes[i]
	gpus := s.trueFree(i)
	milli := int32(r.ShareMilli)
	want := 1
	if r.ShareMilli == 0 {
		milli, want = MilliPerGPU, r.GPUs
	}
	if len(d.GPUIndices) != want {
		return fmt.Errorf("%s placement on %s: decision has %d GPUs, request needs %d: %w", action, d.Node, len(d.GPUIndices), want, ErrConflict)
	}
	cpu, mem := st.cpuFree+int64(sign)*r.CPUMilli, st.memFree+int64(sign)*r.MemoryBytes
	if m := s.meta[i]; cpu < 0 || mem < 0 || cpu > m.CPUMilli || mem > m.MemoryBytes {
		return fmt.Errorf("%s placement on %s: CPU or memory out of range: %w", action, d.Node, ErrConflict)
	}
	asks := s.scalarAsks(r)
	if err := s.checkScalars(i, asks, sign); err != nil {
		return fmt.Errorf("%s placement on %s: %w", action, d.Node, err)
	}
	for k, g := range d.GPUIndices {
		if g < 0 || g >= len(gpus) {
			return fmt.Errorf("%s placement on %s: GPU index %d out of range: %w", action, d.Node, g, ErrConflict)
		}
		for _, h := range d.GPUIndices[:k] {
			if h == g {
				return fmt.Errorf("%s placement on %s: GPU %d chosen twice: %w", action, d.Node, g, ErrConflict)
			}
		}
		f := gpus[g] + int32(sign)*milli
		if f < 0 || f > MilliPerGPU {
			return fmt.Errorf("%s placement on %s: GPU %d has %d milli free: %w", action, d.Node, g, gpus[g], ErrConflict)
		}
		if r.ShareMilli == 0 && sign < 0 && s.isReserved(i, g) {
			return fmt.Errorf("%s placement on %s: GPU %d is reserved for shares: %w", action, d.Node, g, ErrConflict)
		}
	}
	kind := r.kind()
	if sign > 0 && kind >= 0 && st.kinds[kind] <= 0 {
		// Kind counts are advisory (only gpuclustering reads them); a pod
		// the snapshot never saw must not make them negative.
		kind = -1
	}

	s.record(i)
	st.cpuFree, st.memFree = cpu, mem
	for _, g := range d.GPUIndices {
		gpus[g] += int32(sign) * milli
	}
	s.applyScalars(i, asks, sign)
	if kind >= 0 {
		st.kinds[kind] -= int32(sign)
	}
	st.gen = s.src.next()
	s.syncView(i)
	s.refresh(i)
	return nil
}

// record saves node i to the journal when a checkpoint is open.
func (s *Snapshot) record(i int) {
	if s.depth == 0 {
		return
	}
	e := journalEntry{node: i, state: s.nodes[i], extra: -1, scal: -1}
	gpus := s.trueFree(i)
	n := copy(e.free[:], gpus)
	if n < len(gpus) {
		e.extra = len(s.journalFree)
		s.journalFree = append(s.journalFree, gpus[n:]...)
	}
	if sc := s.nodeScalars(i); len(sc) > 0 {
		e.scal = len(s.journalScal)
		s.journalScal = append(s.journalScal, sc...)
	}
	s.journal = append(s.journal, e)
}

// Checkpoint marks the snapshot's state so that Rollback can return to it.
// Checkpoints nest; each must be ended by Rollback or Commit, innermost first.
type Checkpoint struct {
	depth   int
	journal int
	extra   int
	scal    int
}

// Checkpoint opens a checkpoint.
func (s *Snapshot) Checkpoint() Checkpoint {
	s.depth++
	return Checkpoint{depth: s.depth, journal: len(s.journal), extra: len(s.journalFree), scal: len(s.journalScal)}
}

// Rollback undoes every change made since cp and closes it. Node
// generations return to their old values, so cached scores stay valid.
func (s *Snapshot) Rollback(cp Checkpoint) error {
	if cp.depth != s.depth || cp.depth == 0 {
		return fmt.Errorf("rolling back checkpoint %d while %d is innermost: %w", cp.depth, s.depth, ErrConflict)
	}
	if len(s.journal) > cp.journal {
		s.own()
	}
	for j := len(s.journal) - 1; j >= cp.journal; j-- {
		e := &s.journal[j]
		s.freeChanged(e.state.model, e.state.totalFree-s.nodes[e.node].totalFree)
		s.nodes[e.node] = e.state
		gpus := s.trueFree(e.node)
		n := copy(gpus, e.free[:])
		if n < len(gpus) {
			copy(gpus[n:], s.journalFree[e.extra:])
		}
		s.syncView(e.node)
		if e.scal >= 0 {
			copy(s.nodeScalars(e.node), s.journalScal[e.scal:])
		}
	}
	s.journal, s.journalFree, s.journalScal = s.journal[:cp.journal], s.journalFree[:cp.extra], s.journalScal[:cp.scal]
	s.depth--
	return nil
}

// Commit keeps the changes made since cp and closes it. The enclosing
// checkpoint, if any, can still roll them back.
func (s *Snapshot) Commit(cp Checkpoint) error {
	if cp.depth != s.depth || cp.depth == 0 {
		return fmt.Errorf("committing checkpoint %d while %d is innermost: %w", cp.depth, s.depth, ErrConflict)
	}
	s.depth--
	if s.depth == 0 {
		s.journal, s.journalFree, s.journalScal = s.journal[:0], s.journalFree[:0], s.journalScal[:0]
	}
	return nil
}
