package state

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpufrac/gpufrac/coordinator/dra"
	"github.com/gpufrac/gpufrac/coordinator/placement"
)

// Cache is what the coordinator knows of nodes and pods between cycles, in
// the shape of kube-scheduler's backend cache: the informers' events
// (AddPod, UpdatePod, DeletePod, AddNode, UpdateNode, DeleteNode) keep each
// node with the pods bound to it and a generation that moves with every
// change to either, and UpdateSnapshot charges again only the nodes whose
// generation moved since their last part was made. Nothing in a cycle walks
// every pod to find out what changed.
//
// It is safe for concurrent use: events come from the informers'
// goroutines, snapshots from the scheduling loop.
type Cache struct {
	mu sync.Mutex
	// timeslice is the replica resource the facts were read with.
	timeslice string
	// nodes are the nodes shown and the names pods are bound to.
	nodes map[string]*nodeInfo
	// pods are every pod shown, by UID.
	pods map[types.UID]*podInfo
	// reservationsOn are the reservation pods shown bound, by node and the
	// GPU they ask for (Inputs.Creating shown).
	reservationsOn map[NodeGPU]map[types.UID]*corev1.Pod
	// failed are the reservation pods the kubelet failed.
	failed map[types.UID]*corev1.Pod
	// gen is the last generation given to a node.
	gen uint64

	// Used by UpdateSnapshot only, under mu.
	snaps     uint64 // snapshots made
	poolLabel string // what the kept parts were made with
	scratch   []slotPod
	// reservations is how many reservations the last snapshot held: the
	// next one's map is made that large, not grown entry by entry.
	reservations int
	// taken counts the nodes' parts taken as they were, charged those
	// charged pod by pod (both over all snapshots); reused the snapshots
	// handed out again (a copy of last).
	taken, charged, reused int
	// last is the last snapshot made while it depends on nothing but the
	// cache (see steady), kept unchanged, and lastKey what it was made
	// from; nil when the last one depended on more.
	last      *Snapshot
	lastKey   snapKey
	lastUsage dra.Usage // the DRA usage last was made with
	// oneShot: the cache makes one snapshot (Build) and keeps none.
	oneShot bool
	// order is the last snapshot's parts, busiest first (sortBusiest);
	// ordered the snapshot it was made for.
	order   []*nodePart
	ordered uint64
	// spare is a snapshot handed back (Recycle): the next one is made in
	// its arrays.
	spare *placement.Snapshot
}

// snapKey is what a steady snapshot was made from besides its plain
// inputs: while it holds, the same snapshot is made again.
type snapKey struct {
	gen                  uint64
	poolLabel, timeslice string
	notBefore            time.Time
	noTime               bool // Inputs.Now unset: every drain counts, whatever its deadline
}

// podInfo is a pod the cache holds.
type podInfo struct {
	p *corev1.Pod
	h podHeader
	f *podFacts // nil until the pod is read bound or assumed
}

// facts are what a snapshot reads of the pod bound or assumed.
func (pi *podInfo) facts(timeslice string) *podFacts {
	if pi.f == nil {
		f := podFactsOf(pi.p, timeslice)
		pi.f = &f
	}
	return pi.f
}

// bound tells whether the pod takes resources on h.nodeName.
func (pi *podInfo) bound() bool { return pi.h.nodeName != "" && !pi.h.terminal }

// nodeInfo is a node and the pods bound to it.
type nodeInfo struct {
	name string
	// n is nil when the node is not shown: only pods name it.
	n     *corev1.Node
	facts *nodeFacts // nil until read
	// pods are the pods bound here and not terminal.
	pods map[types.UID]*podInfo
	// gen moves with n and pods.
	gen uint64
	// last is the node's part of the last snapshot that charged it.
	last *nodePart

	// What the snapshot being made says of the node: placed in it (snap
	// is its number), charged again whatever its generation (again), and
	// the pods assumed there.
	snap    uint64
	again   bool
	assumed []slotPod
}

// nodePart is one node's part of a snapshot and what it was made from.
type nodePart struct {
	facts *nodeFacts
	gen   uint64
	// again: made while something besides the node and its pods changed
	// it; never taken as is (what did may be gone by the next snapshot).
	again bool
	// node is the node as placement sees it; its GPUs and Scalars are not
	// changed after it is made (placement copies what it changes).
	node placement.Node
	// reservations are the node's reservations, shared by the snapshots
	// that take the part (Snapshot.Reservations: read only).
	reservations []keyedReservation
	// in is the last snapshot that took the part (chargePlaced); ordered
	// the last whose order it was in (sortBusiest).
	in, ordered uint64
	// used is the GPU milli in use sortBusiest orders by, when hasUsed.
	used    int
	hasUsed bool
}

type keyedReservation struct {
	key NodeGPU
	r   *Reservation
}

// NewCache returns an empty Cache that reads time-sliced replicas as
// timeslice ("" means api.DefaultTimesliceResource).
func NewCache(timeslice string) *Cache {
	return &Cache{
		timeslice:      timeslice,
		nodes:          map[string]*nodeInfo{},
		pods:           map[types.UID]*podInfo{},
		reservationsOn: map[NodeGPU]map[types.UID]*corev1.Pod{},
		failed:         map[types.UID]*corev1.Pod{},
	}
}

// AddPod adds a pod the informer shows.
func (c *Cache) AddPod(p *corev1.Pod) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.setPod(p)
}

// UpdatePod replaces old with cur; a pod made again under old's name has
// another UID.
func (c *Cache) UpdatePod(old, cur *corev1.Pod) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old != nil && old.UID != cur.UID {
		c.removePod(old.UID)
	}
	c.setPod(cur)
}

// DeletePod forgets a pod.
func (c *Cache) DeletePod(p *corev1.Pod) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.removePod(p.UID)
}

// AddNode adds a node the informer shows.
func (c *Cache) AddNode(n *corev1.Node) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.setNode(n)
}

// UpdateNode replaces a node's object.
func (c *Cache) UpdateNode(_, cur *corev1.Node) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.setNode(cur)
}

// DeleteNode forgets a node; the pods bound to it stay until deleted (a
// snapshot counts their reservations orphaned, their node gone).
func (c *Cache) DeleteNode(n *corev1.Node) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ni := c.nodes[n.Name]
	if ni == nil {
		return
	}
	ni.n, ni.facts, ni.last = nil, nil, nil
	c.touch(ni)
	c.dropIfEmpty(ni)
}

// Len returns how many nodes and pods the cache holds.
func (c *Cache) Len() (nodes, pods int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ni := range c.nodes {
		if ni.n != nil {
			nodes++
		}
	}
	return nodes, len(c.pods)
}

func (c *Cache) setPod(p *corev1.Pod) { c.setPodAs(p.UID, p) }

// setPodAs holds p under uid: its UID, but for Build's pods without one.
func (c *Cache) setPodAs(uid types.UID, p *corev1.Pod) {
	c.removePod(uid)
	pi := &podInfo{p: p, h: podHeaderOf(p)}
	c.pods[uid] = pi
	if pi.h.nodeName != "" && pi.h.reservation {
		key := NodeGPU{pi.h.nodeName, pi.h.planned}
		if c.reservationsOn[key] == nil {
			c.reservationsOn[key] = map[types.UID]*corev1.Pod{}
		}
		c.reservationsOn[key][uid] = p
	}
	if pi.h.failedReservation {
		c.failed[uid] = p
		c.gen++ // snapshots list it (see steady)
	}
	if pi.bound() {
		ni := c.node(pi.h.nodeName)
		ni.pods[uid] = pi
		c.touch(ni)
	}
}

func (c *Cache) removePod(uid types.UID) {
	pi := c.pods[uid]
	if pi == nil {
		return
	}
	delete(c.pods, uid)
	if c.failed[uid] != nil {
		delete(c.failed, uid)
		c.gen++
	}
	if pi.h.nodeName != "" && pi.h.reservation {
		key := NodeGPU{pi.h.nodeName, pi.h.planned}
		if delete(c.reservationsOn[key], uid); len(c.reservationsOn[key]) == 0 {
			delete(c.reservationsOn, key)
		}
	}
	if ni := c.nodes[pi.h.nodeName]; ni != nil && ni.pods[uid] != nil {
		delete(ni.pods, uid)
		c.touch(ni)
		c.dropIfEmpty(ni)
	}
}

func (c *Cache) setNode(n *corev1.Node) {
	ni := c.node(n.Name)
	ni.n, ni.facts = n, nil
	c.touch(ni)
}

// node returns the node named name, made when there is none.
func (c *Cache) node(name string) *nodeInfo {
	ni := c.nodes[name]
	if ni == nil {
		ni = &nodeInfo{name: name, pods: map[types.UID]*podInfo{}}
		c.nodes[name] = ni
	}
	return ni
}

// touch moves a node's generation.
func (c *Cache) touch(ni *nodeInfo) {
	c.gen++
	ni.gen = c.gen
}

// dropIfEmpty forgets a node neither shown nor named by a pod.
func (c *Cache) dropIfEmpty(ni *nodeInfo) {
	if ni.n == nil && len(ni.pods) == 0 {
		delete(c.nodes, ni.name)
	}
}

// nodeFacts returns what a snapshot reads of the node (n must be set).
func (c *Cache) nodeFacts(ni *nodeInfo) *nodeFacts {
	if ni.facts == nil {
		ni.facts = nodeFactsOf(ni.n, c.timeslice)
	}
	return ni.facts
}

// UpdateSnapshot makes the snapshot of the nodes and pods the events
// showed (in.Nodes and in.Pods must be nil) and the rest of in. A node
// whose generation has not moved since its last part, with nothing else in
// in that changes it, is taken as it was.
func (c *Cache) UpdateSnapshot(in Inputs) (*Snapshot, error) {
	if in.Nodes != nil || in.Pods != nil {
		return nil, fmt.Errorf("building placement snapshot: a Cache reads nodes and pods from its events, not Inputs")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.snapshot(&in, nil)
}

// Recycle hands back s, a snapshot UpdateSnapshot made, once its reader is
// done with it: the next snapshot is made in its placement snapshot's
// arrays (placement.NewSnapshotReusing), which a cycle of the coordinator
// allocated anew otherwise (a sixth of what it allocated at full size).
// Its placement snapshot may not be used afterwards: the next UpdateSnapshot
// empties it.
func (c *Cache) Recycle(s *Snapshot) {
	if s == nil || s.Snapshot == nil {
		return
	}
	c.mu.Lock()
	c.spare = s.Snapshot
	c.mu.Unlock()
}

// SnapshotWithout is UpdateSnapshot with the pods gone says left out, as if
// they were not shown (reclaim's what-if: the cluster once its victims are
// gone). Only the nodes of such pods are charged for it, and their parts
// are not kept. gone must be pure: it may be asked more than once of a pod.
func (c *Cache) SnapshotWithout(in Inputs, gone func(*corev1.Pod) bool) (*Snapshot, error) {
	if in.Nodes != nil || in.Pods != nil {
		return nil, fmt.Errorf("building placement snapshot: a Cache reads nodes and pods from its events, not Inputs")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.snapshot(&in, gone)
}

// Build makes the snapshot of in.Nodes and in.Pods, read afresh. Nodes that
// are not Ready are left out; pods on unknown nodes are ignored. A node name
// given twice is an error; each pod counts, even one without a UID or with
// another's (made by hand: no informer lists such pods).
func Build(in Inputs) (*Snapshot, error) {
	c := NewCache(in.TimesliceResource)
	c.oneShot = true
	for _, n := range in.Nodes {
		if ni := c.nodes[n.Name]; ni != nil && ni.n != nil {
			return nil, fmt.Errorf("building placement snapshot: duplicate node %q", n.Name)
		}
		c.setNode(n)
	}
	for i, p := range in.Pods {
		uid := p.UID
		if uid == "" || c.pods[uid] != nil {
			// Made by hand (a what-if, a test): each object counts, as
			// listed, under a key no informer's pod has.
			uid = types.UID(fmt.Sprintf("\x00%d", i))
		}
		c.setPodAs(uid, p)
	}
	in.Nodes, in.Pods = nil, nil
	return c.snapshot(&in, nil)
}

// snapshot makes the snapshot, without the pods gone says (nil: none);
// c.mu is held. It hands out the kept one again when no event moved the
// cache since it was made (steady); else it builds one, step by step.
func (c *Cache) snapshot(in *Inputs, gone func(*corev1.Pod) bool) (*Snapshot, error) {
	c.follow(in)
	key := snapKey{gen: c.gen, poolLabel: c.poolLabel, timeslice: c.timeslice, notBefore: in.NotBefore, noTime: in.Now.IsZero()}
	if gone == nil && c.last != nil && c.lastKey == key && plain(in) && c.lastUsage.Equal(in.DRAUsage) {
		// No event since a snapshot that depends on nothing else.
		c.reused++
		return c.last.copy(), nil
	}
	if gone == nil {
		c.last = nil // a what-if changes nothing the kept one was made from
	}
	c.snaps++
	b := &build{c: c, in: in, gone: gone, steady: gone == nil && plain(in) && !c.oneShot,
		out: &Snapshot{NoFraction: map[string]bool{}, DRANodes: map[string]bool{}, Reservations: make(map[NodeGPU]*Reservation, c.reservations),
			ScalarMilli: map[string]int64{}, Models: []string{}}, // Models not nil: told, even when no node names a model
		offAssumed: map[string][]slotPod{}, offFracs: map[NodeGPU]int{}}
	b.sortNodes()
	b.assumedPods()
	b.removing()
	b.creating()
	b.failedReservations()
	b.chargeLeftOut()
	nodes := b.sortBusiest(b.chargePlaced())
	b.settleReservations()
	var spare *placement.Snapshot
	if gone == nil {
		spare, c.spare = c.spare, nil
	}
	snap, err := placement.NewSnapshotReusing(spare, nodes)
	if err != nil {
		return nil, fmt.Errorf("building placement snapshot: %w", err)
	}
	b.out.Snapshot = snap
	c.reservations = len(b.out.Reservations)
	if b.steady {
		c.last, c.lastKey, c.lastUsage = b.out.copy(), key, in.DRAUsage
	}
	return b.out, nil
}

// follow makes the cache read with in's replica resource and pool label:
// the facts and parts read with others are read again.
func (c *Cache) follow(in *Inputs) {
	if in.TimesliceResource != c.timeslice {
		c.timeslice = in.TimesliceResource
		for _, ni := range c.nodes {
			ni.facts, ni.last = nil, nil
		}
		for _, pi := range c.pods {
			pi.f = nil
		}
	}
	if in.PoolLabel != c.poolLabel {
		c.poolLabel = in.PoolLabel
		for _, ni := range c.nodes {
			ni.last = nil
		}
	}
}

// build is one snapshot being built: what its steps read and gather. The
// Cache's lock is held.
type build struct {
	c    *Cache
	in   *Inputs
	gone func(*corev1.Pod) bool // pods left out (nil: none)
	out  *Snapshot
	// steady: the snapshot depends on the cache alone (see plain).
	steady bool

	placed     []*nodeInfo          // the nodes placement places on
	off        []*nodeInfo          // nodes left out (not Ready, cordoned, young) or not shown, with pods
	offAssumed map[string][]slotPod // node not placed on -> the pods being bound there
	creatingOn map[string][]NodeGPU // node -> its reservations of in.Creating not shown
	offFracs   map[NodeGPU]int      // GPU of a node left out -> the fraction pods on it
}

// isGone tells whether the snapshot leaves p out.
func (b *build) isGone(p *corev1.Pod) bool { return b.gone != nil && b.gone(p) }

// sortNodes sorts the nodes into those placed on and those left out, and
// records what the snapshot tells of them: GPU models, scalar worth, nodes
// without fractions and nodes in mode dra.
func (b *build) sortNodes() {
	c, in, out := b.c, b.in, b.out
	b.placed = make([]*nodeInfo, 0, len(c.nodes))
	for _, ni := range c.nodes {
		if ni.n == nil {
			b.off = append(b.off, ni)
			continue
		}
		f := c.nodeFacts(ni)
		if f.drainingAt(in.Now) {
			b.steady = false // its part moves with the time: the drain ends at its deadline
		}
		out.Models = addModel(out.Models, f.product)
		if !f.readyAt(in.Now) || settling(ni.n, in.NotBefore) || in.Settling[ni.name] || in.Drifted[ni.name] {
			ni.last = nil // its pods may go while it is left out
			if len(ni.pods) > 0 {
				b.off = append(b.off, ni)
			}
			continue
		}
		ni.snap, ni.again, ni.assumed = c.snaps, f.dra || f.draining, ni.assumed[:0]
		for name, m := range f.scalarMilli {
			out.ScalarMilli[name] = max(out.ScalarMilli[name], m)
		}
		if !f.fractionOK {
			out.NoFraction[ni.name] = true
		}
		if f.dra {
			out.DRANodes[ni.name] = true
		}
		b.placed = append(b.placed, ni)
	}
	slices.Sort(out.Models)
}

// assumedPods puts the pods being bound on their nodes: those placed on
// are charged again with them.
func (b *build) assumedPods() {
	c := b.c
	for uid, a := range b.in.Assumed {
		pi := c.pods[uid]
		if pi == nil || pi.h.nodeName != "" || pi.h.terminal || b.isGone(pi.p) {
			continue // gone, or bound: charged on its node
		}
		sp := slotPod{p: pi.p, f: pi.facts(c.timeslice), assumedGPU: a.GPU}
		if ni := c.placedNode(a.Node); ni != nil {
			ni.assumed = append(ni.assumed, sp)
			ni.again = true
		} else {
			b.offAssumed[a.Node] = append(b.offAssumed[a.Node], sp)
		}
	}
}

// removing records the reservations being removed that the cache still
// shows; their nodes are charged again.
func (b *build) removing() {
	c, out := b.c, b.out
	for uid := range b.in.Removing {
		pi := c.pods[uid]
		if pi == nil || b.isGone(pi.p) {
			continue
		}
		if out.RemovingShown == nil {
			out.RemovingShown = map[types.UID]bool{}
		}
		out.RemovingShown[uid] = true
		if ni := c.placedNode(pi.h.nodeName); ni != nil && pi.bound() {
			ni.again = true
		}
	}
}

// creating records the reservations being created that the cache shows,
// and those it does not show yet by node: their nodes are charged again
// with them.
func (b *build) creating() {
	c, out := b.c, b.out
	for key := range b.in.Creating {
		shown := false
		for _, p := range c.reservationsOn[key] {
			if shown = !b.isGone(p); shown {
				break
			}
		}
		if shown {
			if out.CreatingShown == nil {
				out.CreatingShown = map[NodeGPU]bool{}
			}
			out.CreatingShown[key] = true
		}
		if ni := c.placedNode(key.Node); ni != nil {
			ni.again = true // charged with the reservation it waits for
			if !shown {
				if b.creatingOn == nil {
					b.creatingOn = map[string][]NodeGPU{}
				}
				b.creatingOn[key.Node] = append(b.creatingOn[key.Node], key)
			}
		}
	}
}

// failedReservations lists the reservation pods the kubelet failed, by
// namespace and name.
func (b *build) failedReservations() {
	for _, p := range b.c.failed {
		if !b.isGone(p) {
			b.out.FailedReservations = append(b.out.FailedReservations, p)
		}
	}
	slices.SortFunc(b.out.FailedReservations, func(x, y *corev1.Pod) int {
		return cmp.Or(strings.Compare(x.Namespace, y.Namespace), strings.Compare(x.Name, y.Name))
	})
}

// chargeLeftOut records the reservations of the nodes left out and the
// fractions on their GPUs: off the snapshot only those matter, so that they
// can be removed.
func (b *build) chargeLeftOut() {
	c := b.c
	for _, ni := range b.off {
		c.chargeOff(ni.name, ni.n, c.podsOf(ni, b.offAssumed[ni.name], b.gone), b.in, b.out.Reservations, b.offFracs)
		delete(b.offAssumed, ni.name)
	}
	for name, sps := range b.offAssumed { // being bound to a node without pods, left out or gone
		var n *corev1.Node
		if ni := c.nodes[name]; ni != nil {
			n = ni.n
		}
		c.chargeOff(name, n, sps, b.in, b.out.Reservations, b.offFracs)
	}
}

// chargePlaced returns the placed nodes as placement sees them, the parts'
// own (a part is not changed after it is made; snapshots share it): each
// node's part as it was when neither the node, its pods nor anything else
// in the inputs moved it, else charged again; it adds their reservations
// and capacity to the snapshot.
func (b *build) chargePlaced() []*nodePart {
	c, out := b.c, b.out
	parts := make([]*nodePart, 0, len(b.placed))
	for _, ni := range b.placed {
		part := ni.last
		if b.gone != nil && ni.holds(b.gone) {
			part = charge(ni.n, ni.facts, c.podsOf(ni, ni.assumed, b.gone), b.in, b.creatingOn[ni.name])
			part.again = true // not kept
			c.charged++
		} else if part == nil || part.again || ni.again || part.gen != ni.gen || part.facts != ni.facts {
			part = charge(ni.n, ni.facts, c.podsOf(ni, ni.assumed, nil), b.in, b.creatingOn[ni.name])
			part.gen, part.again = ni.gen, ni.again
			ni.last = part
			c.charged++
		} else {
			c.taken++
		}
		clear(ni.assumed) // the pods, not the slots, are let go
		ni.assumed = ni.assumed[:0]
		for _, kr := range part.reservations {
			out.Reservations[kr.key] = kr.r
		}
		part.in = c.snaps
		parts = append(parts, part)
		out.GPUCapacityMilli += int64(len(part.node.GPUs)+ni.facts.partitioned) * placement.MilliPerGPU
		out.CPUCapacityMilli += part.node.CPUMilli
		out.MemoryCapacityBytes += part.node.MemoryBytes
	}
	clear(c.scratch)
	c.scratch = c.scratch[:0]
	return parts
}

// sortBusiest returns the parts' nodes (the parts': not changed after they
// are made) in placement's order, busiest first (busier). Most parts are
// taken as they were, so they keep the order they had in the last
// snapshot: only the parts made since are sorted, and merged in. A what-if
// (gone) is sorted whole and does not change the order kept.
func (b *build) sortBusiest(parts []*nodePart) []*placement.Node {
	c := b.c
	if b.gone != nil || c.oneShot {
		slices.SortFunc(parts, busier)
		return nodesOf(parts)
	}
	kept := make([]*nodePart, 0, len(parts))
	for _, p := range c.order {
		if p.in == c.snaps {
			kept = append(kept, p) // in order already
		}
	}
	var fresh []*nodePart
	for _, p := range parts {
		if p.ordered != c.ordered || c.ordered == 0 {
			fresh = append(fresh, p)
		}
	}
	slices.SortFunc(fresh, busier)
	merged := parts[:0] // parts is read no more
	i, j := 0, 0
	for i < len(kept) && j < len(fresh) {
		if busier(fresh[j], kept[i]) < 0 {
			merged, j = append(merged, fresh[j]), j+1
		} else {
			merged, i = append(merged, kept[i]), i+1
		}
	}
	merged = append(append(merged, kept[i:]...), fresh[j:]...)
	for _, p := range merged {
		p.ordered = c.snaps
	}
	c.order, c.ordered = append(c.order[:0], merged...), c.snaps
	return nodesOf(merged)
}

// busier orders parts by GPU milli in use, most first, then by node name.
// Placement gives ties to the node that comes first, so equal choices go
// to the busiest node: work packs onto nodes already in use, and lightly
// used ones can empty for the autoscaler to remove. The cache's order is a
// map's, so without this ties would fall at random, differently each cycle.
func busier(a, b *nodePart) int {
	if c := cmp.Compare(b.usedMilli(), a.usedMilli()); c != 0 {
		return c
	}
	return strings.Compare(a.node.Name, b.node.Name)
}

// usedMilli is the GPU milli in use on the part's node; a GPU shared (held
// by a reservation), even an idle one, makes the node busier.
func (p *nodePart) usedMilli() int {
	if !p.hasUsed {
		u := 0
		for _, g := range p.node.GPUs {
			u += placement.MilliPerGPU - g.FreeMilli
			if g.Reserved {
				u++
			}
		}
		p.used, p.hasUsed = u, true
	}
	return p.used
}

// nodesOf is the parts' nodes, in order.
func nodesOf(parts []*nodePart) []*placement.Node {
	nodes := make([]*placement.Node, len(parts))
	for i, p := range parts {
		nodes[i] = &p.node
	}
	return nodes
}

// settleReservations counts the fractions of the nodes left out on their
// reservations and drops the reservations that hold nothing.
func (b *build) settleReservations() {
	out := b.out
	for key, n := range b.offFracs {
		if r := out.Reservations[key]; r != nil {
			r.Fractions += n
		}
	}
	for k, r := range out.Reservations {
		// Fractions on a GPU without a reservation pod stay: its
		// reservation was lost (preempted, evicted, deleted) or is still
		// to be made. The scheduler makes it (again) in this cycle, or,
		// when the GPU was given whole to another pod meanwhile
		// (TakenBy), evicts the fractions there.
		if r.Pod == nil && r.Fractions == 0 && r.TakenBy == nil {
			delete(out.Reservations, k)
		}
	}
}

// plain tells whether in holds nothing but what a snapshot reads of the
// cache and the DRA usage: no pod being bound, reservation being removed
// or created, node settling or drifted. A snapshot of plain inputs with no
// node draining before its deadline (the drain ends then) is steady: it
// depends on the cache and the DRA usage alone (nodes in mode dra are
// charged from it), not on the time, and is made again as it was until an
// event moves the cache or the usage changes.
func plain(in *Inputs) bool {
	return len(in.Assumed) == 0 && len(in.Removing) == 0 && len(in.Creating) == 0 &&
		len(in.Settling) == 0 && len(in.Drifted) == 0
}

// placedNode returns the node named name when the snapshot being made
// places on it, else nil.
func (c *Cache) placedNode(name string) *nodeInfo {
	if ni := c.nodes[name]; ni != nil && ni.snap == c.snaps && ni.n != nil {
		return ni
	}
	return nil
}

// podsOf returns the pods charged to a node, bound and assumed, but those
// gone says (nil: none), in c's scratch slice: used until the next call.
func (c *Cache) podsOf(ni *nodeInfo, assumed []slotPod, gone func(*corev1.Pod) bool) []slotPod {
	c.scratch = c.scratch[:0]
	for _, pi := range ni.pods {
		if gone == nil || !gone(pi.p) {
			c.scratch = append(c.scratch, slotPod{p: pi.p, f: pi.facts(c.timeslice)})
		}
	}
	c.scratch = append(c.scratch, assumed...) // the snapshot left gone ones out
	return c.scratch
}

// holds tells whether a pod gone says is bound to the node.
func (ni *nodeInfo) holds(gone func(*corev1.Pod) bool) bool {
	for _, pi := range ni.pods {
		if gone(pi.p) {
			return true
		}
	}
	return false
}

// chargeOff records the reservations of a node left out of the snapshot
// (n; nil when gone) as orphaned, and counts the fractions on their GPUs,
// bound or being bound: a reservation stays until its fractions end.
func (c *Cache) chargeOff(name string, n *corev1.Node, pods []slotPod, in *Inputs, rs map[NodeGPU]*Reservation, offFracs map[NodeGPU]int) {
	slices.SortFunc(pods, func(a, b slotPod) int { return strings.Compare(string(a.p.UID), string(b.p.UID)) })
	for _, sp := range pods {
		switch {
		case sp.f.reservation:
			trackOffNode(rs, sp.p, name, n, in.Now, in.Drifted[name])
		case sp.f.d.Fraction > 0 && (sp.p.Spec.NodeName != "" || sp.assumedGPU != ""):
			offFracs[NodeGPU{name, cmp.Or(sp.assumedGPU, sp.f.fractionGPU())}]++
		}
	}
}
