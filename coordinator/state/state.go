// Package state turns what the API server says about nodes and pods into
// the placement snapshot the scheduling cycle works on: per node, its GPUs
// (from the inventory gpufrac-node publishes) and what bound, assumed and
// other schedulers' pods already take of GPUs, CPU and memory. It is pure:
// listers feed it, nothing here talks to the API.
//
// Whole GPUs and fractions are placed on GPUs (only GPUs in mode exclusive
// or fraction). MIG devices (nvidia.com/mig-*) and time-sliced replicas
// (nvidia.com/gpu.shared, or the configured name) are placement scalars:
// each node's allocatable count minus what its pods request. Their worth
// in GPU terms, for queues, comes from the inventory (ScalarMilli).
package state

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/request"
	"github.com/gpufrac/gpufrac/coordinator/dra"
	"github.com/gpufrac/gpufrac/coordinator/placement"
	"github.com/gpufrac/gpufrac/coordinator/predicates"
)

// Assumed is a pod the coordinator has placed and is binding: it counts as
// bound to Node until the informer shows the binding.
type Assumed struct {
	Node string
	// GPU is the fraction's GPU UUID ("" for whole-GPU and CPU pods).
	GPU string
	// Pod names the pod, for a reader that must read it again (empty when
	// not told).
	Pod types.NamespacedName
}

// Inputs are what a snapshot is built from: the cluster's objects (for
// Build; a Cache has them from its events) and what the scheduler knows
// besides them.
type Inputs struct {
	Nodes []*corev1.Node
	// Pods are all pods; bound ones (or assumed ones) take resources.
	Pods []*corev1.Pod
	// Assumed maps pods being bound by the coordinator to their placement.
	Assumed map[types.UID]Assumed
	// PoolLabel is the node label naming the node pool.
	PoolLabel string
	// TimesliceResource is the time-sliced replica resource; "" means
	// api.DefaultTimesliceResource.
	TimesliceResource string
	// DRAUsage is what allocated resource claims (written or in flight) hold
	// of the GPUs of nodes in mode dra, by node and GPU UUID. On those nodes
	// GPUs are charged from claims, not from pods' GPU resources.
	DRAUsage dra.Usage
	// Removing names reservation pods the coordinator deleted (pod UID ->
	// true) that the informer may still show as they were: like those it
	// shows terminating, they hold their GPU but take no new fraction.
	Removing map[types.UID]bool
	// Creating names the reservations the coordinator created lately (node
	// and GPU asked for) that Pods may not show yet. One not shown is
	// counted as a reservation pod asking for its GPU (chargeAsking): the
	// kubelet gives it a GPU of the node all the same, even when its GPU
	// turns out held and the fractions planned there are placed again.
	Creating map[NodeGPU]bool
	// NotBefore, when set, leaves out Karpenter's nodes (those labelled
	// karpenter.sh/nodepool) created after it: a node the autoscaler just
	// made is where the default scheduler binds placeholder pods within
	// moments, and a pod placed there before the placeholders show up as
	// bound would find their GPUs taken at admission. Other nodes get no
	// placeholders and are placed on at once.
	NotBefore time.Time
	// Settling names more nodes left out as if they were young (node name ->
	// true): nodes consolidation just gave back (scheduler.returnedNodes).
	Settling map[string]bool
	// Drifted names nodes left out like cordoned ones (node name -> true):
	// nodes whose Karpenter NodeClaim is Drifted, which Karpenter replaces
	// once nothing protected runs there. Nothing new is placed on them, and
	// their reservations are orphaned: removed as their fractions end. The
	// caller reads it from NodeClaims, never from what tenants can write.
	Drifted map[string]bool
	// Now, when set, ends drains at their deadline (DrainingAt): a node
	// whose gpufrac.io/draining taint has outlived it is placed on again,
	// the taint ignored. Zero: every draining taint counts.
	Now time.Time
}

// podHeader is what Build reads of every pod, pending ones included.
type podHeader struct {
	uid      types.UID
	nodeName string
	terminal bool
	// reservation: a gpufrac reservation pod; planned is its
	// gpufrac.io/gpu (read for every pod: Inputs.Creating).
	reservation bool
	planned     string
	// failedReservation: a reservation pod the kubelet failed, not being deleted.
	failedReservation bool
}

func podHeaderOf(p *corev1.Pod) podHeader {
	res := predicates.IsReservation(p)
	return podHeader{
		uid:               p.UID,
		nodeName:          p.Spec.NodeName,
		terminal:          predicates.Terminal(p),
		reservation:       res,
		planned:           p.Annotations[api.AnnotationGPU],
		failedReservation: res && p.Status.Phase == corev1.PodFailed && p.DeletionTimestamp == nil,
	}
}

// podFacts are what Build reads of a bound (or assumed) pod.
type podFacts struct {
	d request.Demand
	// reservation: a gpufrac reservation pod (IsReservation).
	reservation bool
	// planned, allocated and reserved are the annotations gpufrac.io/gpu,
	// gpufrac.io/allocated-gpu and gpufrac.io/reserved-gpu.
	planned, allocated, reserved string
	// allocatedList is allocated split at commas (whole-GPU pods).
	allocatedList []string
}

func podFactsOf(p *corev1.Pod, timeslice string) podFacts {
	f := podFacts{
		d:           request.Parse(p, request.Options{TimesliceResource: timeslice}).Demand(),
		reservation: predicates.IsReservation(p),
		planned:     p.Annotations[api.AnnotationGPU],
		allocated:   p.Annotations[api.AnnotationAllocatedGPU],
		reserved:    p.Annotations[api.AnnotationReservedGPU],
	}
	if f.d.Whole > 0 && f.allocated != "" {
		f.allocatedList = strings.Split(f.allocated, ",")
	}
	return f
}

// fractionGPU is FractionGPU of the pod.
func (f *podFacts) fractionGPU() string { return cmp.Or(f.allocated, f.planned) }

// reservedGPU is ReservedGPU of the pod.
func (f *podFacts) reservedGPU() string { return cmp.Or(f.reserved, f.planned) }

// nodeFacts are what Build reads of a node, whatever the pods on it. Its
// maps and slices are shared by the Builds that use it: read only.
type nodeFacts struct {
	cpuMilli, memoryBytes int64
	// scalars are the allocatable scalar resources (nil when none).
	scalars map[string]int64
	// gpus are the GPUs placed (nodeGPUs); fractionOK as nodeGPUs says.
	gpus       []api.GPUInfo
	fractionOK bool
	// gpuIndex maps a GPU ID to its index in gpus; inventory is every GPU
	// of the inventory by UUID.
	gpuIndex  map[string]int
	inventory map[string]api.GPUInfo
	// dra: the node serves its GPUs through DRA.
	dra bool
	// partitioned and scalarMilli are what partitioned says of the inventory.
	partitioned int
	scalarMilli map[string]int64
	// unschedulable, ready, deleting, draining and drainDeadline are what
	// nodeReadyAt and placedTaints read: spec.unschedulable, the Ready
	// condition, a deletion timestamp, and the gpufrac.io/draining taint
	// (DrainDeadline).
	unschedulable, ready, deleting, draining bool
	drainDeadline                            int64
	// product is the label nvidia.com/gpu.product.
	product string
}

// readyAt is nodeReadyAt of the node.
func (f *nodeFacts) readyAt(now time.Time) bool {
	return !f.unschedulable && !f.deleting && !f.drainingAt(now) && f.ready
}

// drainingAt is DrainingAt of the node.
func (f *nodeFacts) drainingAt(now time.Time) bool {
	return f.draining && (now.IsZero() || now.Unix() <= f.drainDeadline)
}

func nodeFactsOf(n *corev1.Node, timeslice string) *nodeFacts {
	f := &nodeFacts{
		cpuMilli:      n.Status.Allocatable.Cpu().MilliValue(),
		memoryBytes:   n.Status.Allocatable.Memory().Value(),
		gpuIndex:      map[string]int{},
		scalarMilli:   map[string]int64{},
		unschedulable: n.Spec.Unschedulable,
		ready:         predicates.ReadyCondition(n),
		deleting:      n.DeletionTimestamp != nil,
		product:       n.Labels[api.LabelGPUProduct],
	}
	f.drainDeadline, f.draining = predicates.DrainDeadline(n)
	inv, hasInv := inventory(n)
	f.inventory = make(map[string]api.GPUInfo, len(inv))
	for _, g := range inv {
		f.inventory[g.UUID] = g
	}
	f.dra = slices.ContainsFunc(inv, func(g api.GPUInfo) bool { return g.Driver == api.DRADriver })
	f.partitioned = partitioned(inv, f.scalarMilli)
	for name, q := range n.Status.Allocatable {
		if IsScalar(name, timeslice) && q.Value() > 0 {
			if f.scalars == nil {
				f.scalars = map[string]int64{}
			}
			f.scalars[string(name)] = q.Value()
		}
	}
	f.gpus, f.fractionOK = nodeGPUs(n, inv, hasInv, f.dra)
	for i, g := range f.gpus {
		f.gpuIndex[g.UUID] = i
	}
	return f
}

// slotPod is one pod charged to a node.
type slotPod struct {
	p          *corev1.Pod
	f          *podFacts
	assumedGPU string // the GPU of an assumed fraction
}

// IsScalar tells whether a resource is placed as a scalar: a MIG device of
// the mixed strategy (nvidia.com/mig-*) or the time-sliced replica
// resource (timeslice; "" means api.DefaultTimesliceResource).
func IsScalar(name corev1.ResourceName, timeslice string) bool {
	return request.Options{TimesliceResource: timeslice}.IsScalar(name)
}

// Snapshot is a placement snapshot plus what the coordinator needs besides it.
type Snapshot struct {
	*placement.Snapshot
	// NoFraction names nodes whose GPUs have no known UUIDs (no inventory)
	// or are not in fraction mode: fractions must not go there.
	NoFraction map[string]bool
	// DRANodes names the nodes whose gpufrac-node serves GPUs as DRA driver
	// (mode dra): pods get their GPUs there through resource claims.
	DRANodes map[string]bool
	// Reservations are the reservation pods by node and GPU UUID. A
	// reservation not yet told its GPU whose asked GPU another pod holds is
	// in none: it holds a GPU not known yet (chargeAsking). The map is the
	// snapshot's own to read, but may be shared with the Cache's kept
	// snapshot: it is changed only through AddReservation. The Reservations
	// in it may be shared with the other snapshots of a Cache (a node's
	// part taken as it was): read only.
	Reservations map[NodeGPU]*Reservation
	// sharedReservations: Reservations is shared, copied before a change.
	sharedReservations bool
	// FailedReservations are reservation pods that ended Failed (the kubelet
	// rejected them at admission): they hold nothing, but keep their name
	// until removed.
	FailedReservations []*corev1.Pod
	// RemovingShown are the pods of Inputs.Removing that Inputs.Pods still
	// shows, wherever they are (a node left out of the snapshot, a GPU
	// another pod holds, another reservation of the same GPU, terminal):
	// the reservation manager forgets a deletion only once the informer no
	// longer shows its pod.
	RemovingShown map[types.UID]bool
	// CreatingShown are the reservations of Inputs.Creating that Pods show.
	CreatingShown map[NodeGPU]bool
	// Models are the GPU products of all nodes, Ready or not (label
	// nvidia.com/gpu.product), sorted and unique: the models a pod's
	// gpufrac.io/gpu-models patterns are matched against.
	Models []string
	// pools are Pools, once asked for.
	pools []string
	// ScalarMilli is what one unit of each scalar resource is worth in
	// milli-GPU, from the inventories of the Ready nodes: a MIG device its
	// memory over its GPU's, a replica 1000/replicas. When GPUs differ, the
	// largest worth seen: a queue is charged what a unit may cost it.
	// Resources no inventory mentions are missing.
	ScalarMilli map[string]int64
	// GPUCapacityMilli, CPUCapacityMilli and MemoryCapacityBytes are the
	// cluster's schedulable capacity (Ready nodes). GPUs in modes mig and
	// timeslice count whole: queues are charged their devices in GPU terms.
	GPUCapacityMilli    int64
	CPUCapacityMilli    int64
	MemoryCapacityBytes int64
}

// Models are the GPU products of nodes (label nvidia.com/gpu.product),
// sorted and unique, as Build tells them in Snapshot.Models.
func Models(nodes []*corev1.Node) []string {
	var models []string
	for _, n := range nodes {
		models = addModel(models, n.Labels[api.LabelGPUProduct])
	}
	slices.Sort(models)
	return models
}

// addModel adds m to models when it is a model not there yet (a cluster
// has a few).
func addModel(models []string, m string) []string {
	if m == "" || len(models) > 0 && models[len(models)-1] == m || slices.Contains(models, m) {
		return models
	}
	return append(models, m)
}

// copy returns a snapshot that a cycle may change without changing s: the
// placement snapshot is a copy; the Reservations map is copied by the first
// AddReservation of either; the rest, which no reader writes, is shared.
func (s *Snapshot) copy() *Snapshot {
	s.sharedReservations = true
	c := *s
	c.Snapshot = s.Snapshot.Clone()
	c.FailedReservations = slices.Clone(s.FailedReservations)
	return &c
}

// AddReservation adds r as the reservation of key to Reservations (one the
// cycle is about to make).
func (s *Snapshot) AddReservation(key NodeGPU, r *Reservation) {
	if s.sharedReservations {
		s.Reservations = maps.Clone(s.Reservations)
		s.sharedReservations = false
	}
	s.Reservations[key] = r
}

// Pools are the node pools of the snapshot's nodes (placement.Node.Pool),
// sorted by name, the pool "" of nodes without the pool label last. Shared:
// read only.
func (s *Snapshot) Pools() []string {
	if s.pools != nil {
		return s.pools
	}
	seen := map[string]bool{}
	pools := []string{}
	for i := 0; i < s.Len(); i++ {
		if p := s.NodePool(i); !seen[p] {
			seen[p] = true
			pools = append(pools, p)
		}
	}
	sort.Strings(pools)
	if len(pools) > 0 && pools[0] == "" {
		pools = append(pools[1:], "") // the implicit pool of unlabelled nodes goes last
	}
	s.pools = pools
	return pools
}

// NodeGPU names one GPU of one node.
type NodeGPU struct{ Node, GPU string }

// Reservation is a reservation pod holding a GPU whole for its fractions.
// Every reservation pod bound to a node is one, whatever its node and GPU
// have become: one the coordinator can no longer use is Orphaned, and the
// reservation manager removes it once no fraction runs on its GPU.
type Reservation struct {
	Pod *corev1.Pod
	// Ready is true once the node agent wrote the GPU the kubelet gave it
	// (gpufrac.io/reserved-gpu): only then may fractions be bound to the GPU.
	Ready bool
	// Fractions counts the fraction pods on the GPU (bound or assumed).
	Fractions int
	// Orphaned says why no fraction may be placed on the GPU any more ("" when
	// they may): its node is gone, cordoned or not Ready, its GPU left
	// fraction mode, turned unhealthy or left the node's inventory, or the
	// reservation is being removed (Inputs.Removing, or terminating).
	Orphaned string
	// NodeLost is true when the reservation's node no longer exists or is not
	// Ready: no kubelet there confirms a graceful deletion.
	NodeLost bool
	// NodeGone is true when the node no longer exists: nothing runs there,
	// fractions included.
	NodeGone bool
	// TakenBy is a pod other than a reservation that the node agent gave
	// the GPU to whole (gpufrac.io/allocated-gpu) while fractions run
	// there: the reservation was lost (preempted, evicted, deleted) and the
	// GPU given away before it was made again; nil otherwise, and nil
	// whenever a reservation pod holds the GPU (the annotation is untrusted
	// input, see chargeFractions). Stranded are
	// the fraction pods admitted on the GPU meanwhile: they share it with
	// an exclusive pod, and no reservation can hold it for them any more.
	TakenBy  *corev1.Pod
	Stranded []*corev1.Pod
	// NodeIdle is true when no pod but reservations uses a GPU of the
	// reservation's (Ready) node, bound or assumed, and the node is
	// Karpenter's (labelled karpenter.sh/nodepool): the reservations alone
	// keep it from Karpenter's consolidation. A static node is never idle
	// here: nothing removes it, and a shorter grace would only make the
	// next fraction wait for a new reservation.
	NodeIdle bool
}

// nodeReadyAt is NodeReady with drains ending at their deadline (DrainingAt).
// A node being deleted stays out past it: consolidation may have deleted it
// (Karpenter's finalizer terminates it), and nothing placed there lasts.
func nodeReadyAt(n *corev1.Node, now time.Time) bool {
	return !n.Spec.Unschedulable && n.DeletionTimestamp == nil && !predicates.DrainingAt(n, now) && predicates.ReadyCondition(n)
}

// placedTaints are the taints placement honours: a draining taint past its
// deadline is left out (DrainingAt).
func placedTaints(n *corev1.Node, now time.Time) []corev1.Taint {
	if !predicates.Draining(n) || predicates.DrainingAt(n, now) {
		return n.Spec.Taints
	}
	return slices.DeleteFunc(slices.Clone(n.Spec.Taints), func(t corev1.Taint) bool { return t.Key == api.TaintDraining })
}

// fraction is one fraction pod on a node: the GPU the coordinator planned
// (gpufrac.io/gpu) and the GPU gpufrac-node gave (gpufrac.io/allocated-gpu,
// "" until admitted).
type fraction struct {
	pct             int
	planned, actual string
	pod             *corev1.Pod
}

type nodeAcc struct {
	fracs     []fraction // fraction pods on the node, charged by chargeFractions
	node      *placement.Node
	gpuIndex  map[string]int         // GPU ID -> index in node.GPUs (shared: read only)
	inventory map[string]api.GPUInfo // GPU UUID -> the node agent's record of it, every GPU (shared: read only)
	whole     int                    // whole GPUs taken by pods without a known GPU
	held      map[string]bool        // GPU ID -> held whole by a pod (written back); nil until one is
	exclusive map[string]*corev1.Pod // GPU ID -> a whole-GPU pod, not a reservation, the node agent gave it to; nil until one is
	reserved  map[string]bool        // GPU ID -> held by a usable reservation (shares only); nil until one is
	unplacedF []int                  // fraction percents on unknown GPUs
	// partitioned counts the healthy GPUs in modes mig and timeslice.
	partitioned int
	// dra: the node serves its GPUs through DRA (its inventory says so).
	dra bool
	// gpuWork: a pod other than a reservation uses a GPU of the node (a
	// fraction, whole GPUs, a MIG device or a replica, or resource claims),
	// bound or assumed.
	gpuWork bool
}

// settling tells whether n is one of Karpenter's nodes created after
// notBefore (see Inputs.NotBefore).
func settling(n *corev1.Node, notBefore time.Time) bool {
	if notBefore.IsZero() || !n.CreationTimestamp.Time.After(notBefore) {
		return false
	}
	_, made := n.Labels[api.LabelNodePool]
	return made
}

// charge makes a node's part of the snapshot from the node (n, read as f)
// and the pods on it, pod by pod, and the reservations created there that
// no pod shows yet (creating). It sorts pods.
func charge(n *corev1.Node, f *nodeFacts, pods []slotPod, in *Inputs, creating []NodeGPU) *nodePart {
	taints := n.Spec.Taints
	if f.draining && !f.drainingAt(in.Now) {
		taints = placedTaints(n, in.Now) // the drain's deadline passed: its taint is left out
	}
	pn := &placement.Node{
		Name:        n.Name,
		Labels:      n.Labels,
		Taints:      taints,
		Pool:        n.Labels[in.PoolLabel],
		Model:       n.Labels[api.LabelGPUProduct],
		CPUMilli:    f.cpuMilli,
		MemoryBytes: f.memoryBytes,
		Scalars:     maps.Clone(f.scalars),
	}
	if len(f.gpus) > 0 {
		pn.GPUs = make([]placement.GPU, len(f.gpus))
	}
	acc := &nodeAcc{node: pn, gpuIndex: f.gpuIndex, inventory: f.inventory, dra: f.dra, partitioned: f.partitioned}
	for i, g := range f.gpus {
		free := placement.MilliPerGPU
		if acc.dra {
			free -= in.DRAUsage[n.Name][g.UUID].UsedMilli
		}
		pn.GPUs[i] = placement.GPU{ID: g.UUID, FreeMilli: max(free, 0)}
		if pn.Model == "" {
			pn.Model = g.Model
		}
	}
	rs := map[NodeGPU]*Reservation{}
	var asking []askingReservation
	// Charged in UID order, not the listers' (a map's, new each List): two
	// reservations of one GPU (the last charged is its Reservation) and
	// fractions without a planned GPU (they take the open slots in turn)
	// charge differently in another order, and a part taken as it was
	// must be what charging the same pods again gives.
	slices.SortStableFunc(pods, func(a, b slotPod) int { return strings.Compare(string(a.p.UID), string(b.p.UID)) })
	for i := range pods {
		acc.charge(n.Name, &pods[i], rs, &asking, in)
	}
	for _, key := range creating {
		// Created, not shown yet: asking for its GPU, after every one shown.
		if !acc.dra {
			asking = append(asking, askingReservation{acc: acc, key: key})
		}
	}
	chargeAsking(asking, rs)
	chargeFractions(n.Name, acc, rs)
	settle(acc)
	part := &nodePart{facts: f, node: *pn, reservations: make([]keyedReservation, 0, len(rs))}
	idle := !acc.gpuWork && pn.Labels[api.LabelNodePool] != ""
	for k, r := range rs {
		r.NodeIdle = idle
		part.reservations = append(part.reservations, keyedReservation{key: k, r: r})
	}
	return part
}

// charge charges one pod to the node.
func (acc *nodeAcc) charge(nodeName string, sp *slotPod, reservations map[NodeGPU]*Reservation, asking *[]askingReservation, in *Inputs) {
	p, f := sp.p, sp.f
	d := &f.d
	acc.node.UsedCPUMilli += d.CPUMilli
	acc.node.UsedMemoryBytes += d.MemoryBytes
	// A pod with resource claims may hold a device of the node through
	// DRA, which the request model does not count: taken as GPU work.
	if d.Fraction > 0 || (d.Whole > 0 && !f.reservation) || len(d.Scalars) > 0 || len(p.Spec.ResourceClaims) > 0 {
		acc.gpuWork = true
	}
	for name, k := range d.Scalars {
		if free, ok := acc.node.Scalars[name]; ok {
			// Over-committed (allocatable shrank under running pods): nothing is free.
			acc.node.Scalars[name] = max(free-k, 0)
		}
	}
	if acc.dra {
		return // GPUs there are charged from claims (DRAUsage)
	}
	switch {
	case d.Fraction > 0:
		planned := f.planned
		if planned == "" {
			planned = sp.assumedGPU
		}
		acc.fracs = append(acc.fracs, fraction{pct: d.Fraction, planned: planned, actual: f.allocated, pod: p})
	case d.Whole > 0:
		if f.reservation {
			g := f.reservedGPU()
			key := NodeGPU{nodeName, g}
			orphaned := acc.orphaned(nodeName, g)
			if orphaned == "" && f.reserved != "" && (p.DeletionTimestamp != nil || in.Removing[p.UID]) {
				// Being removed: a fraction bound on its GPU now would run
				// on a GPU no reservation holds a moment later.
				orphaned = fmt.Sprintf("the reservation of GPU %s on %s is being removed", g, nodeName)
			}
			if _, placed := acc.gpuIndex[g]; placed && orphaned == "" && f.reserved == "" {
				// Not told its GPU yet: counted once every pod that was is
				// (chargeAsking).
				*asking = append(*asking, askingReservation{acc: acc, key: key, pod: p})
				return
			}
			acc.reserve(reservations, key, p, orphaned)
			return
		}
		if d.Whole <= placement.MaxKindGPUs {
			acc.node.Kinds[d.Whole]++
		}
		// The GPUs gpufrac-node gave the pod, once written back; the rest
		// (not admitted yet) take clean GPUs in settle.
		known := 0
		for _, g := range f.allocatedList {
			if i, ok := acc.gpuIndex[g]; ok && known < d.Whole {
				acc.node.GPUs[i].FreeMilli = 0
				acc.hold(g)
				if acc.exclusive == nil {
					acc.exclusive = map[string]*corev1.Pod{}
				}
				acc.exclusive[g] = p
				known++
			}
		}
		acc.whole += d.Whole - known
	}
}

// hold records GPU g as held whole by a pod.
func (acc *nodeAcc) hold(g string) {
	if acc.held == nil {
		acc.held = map[string]bool{}
	}
	acc.held[g] = true
}

// askingReservation is a reservation pod the node agent has not yet told
// the GPU it got (no gpufrac.io/reserved-gpu): key is the GPU it asks for.
type askingReservation struct {
	acc *nodeAcc
	key NodeGPU
	pod *corev1.Pod // nil: created, not shown yet (Inputs.Creating)
}

// reserve records p as the reservation of key.GPU. A reservation that is
// not orphaned holds its GPU for fractions; an orphaned one whose GPU is
// placed whole (exclusive mode) holds it until it is removed.
func (acc *nodeAcc) reserve(reservations map[NodeGPU]*Reservation, key NodeGPU, p *corev1.Pod, orphaned string) {
	r := reservations[key]
	if r == nil {
		r = &Reservation{}
		reservations[key] = r
	}
	r.Pod = p
	r.Ready = p != nil && key.GPU != "" && p.Annotations[api.AnnotationReservedGPU] == key.GPU
	r.Orphaned = orphaned
	i, placed := acc.gpuIndex[key.GPU]
	switch {
	case orphaned == "":
		if acc.reserved == nil {
			acc.reserved = map[string]bool{}
		}
		acc.reserved[key.GPU] = true
	case placed:
		acc.node.GPUs[i].FreeMilli = 0
		acc.hold(key.GPU)
	}
}

// chargeAsking counts the reservations not yet told their GPU, oldest
// first, each on the GPU it asks for - unless a pod is known to hold that
// GPU: a reservation told it got it, a whole-GPU pod whose GPUs were
// written back, or an older reservation asking for it. The kubelet then gave
// the reservation another GPU, not known yet: gpufrac-node hands the GPU a
// waiting reservation asks for to whichever one-GPU pod the kubelet admits
// first (Allocate does not say which pod it serves), so a whole-GPU pod
// admitted beside a reservation takes its GPU and the reservation the next
// one. Such a reservation is counted like a whole-GPU pod not yet admitted,
// on a clean GPU (settle). Counted on the GPU it asks for, two pods would
// share one GPU in the snapshot, the GPU the kubelet really gave would look
// free, and the coordinator would reserve it for fractions - a reservation
// the kubelet then fails with no GPU left.
func chargeAsking(asking []askingReservation, reservations map[NodeGPU]*Reservation) {
	slices.SortFunc(asking, func(a, b askingReservation) int {
		switch {
		case a.pod == nil || b.pod == nil:
			// Those not shown yet are the newest.
			if c := cmp.Compare(boolInt(a.pod == nil), boolInt(b.pod == nil)); c != 0 {
				return c
			}
			return cmp.Or(strings.Compare(a.key.Node, b.key.Node), strings.Compare(a.key.GPU, b.key.GPU))
		}
		if c := a.pod.CreationTimestamp.Compare(b.pod.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.pod.Name, b.pod.Name)
	})
	for _, a := range asking {
		_, placed := a.acc.gpuIndex[a.key.GPU]
		if !placed || a.acc.reserved[a.key.GPU] || a.acc.held[a.key.GPU] {
			a.acc.whole++
			continue
		}
		a.acc.reserve(reservations, a.key, a.pod, "")
	}
}

// chargeFractions charges a node's fraction pods to their GPUs. gpufrac-node
// treats pods of the same size as interchangeable: it gives the GPUs planned
// for that size, in whatever order the kubelet admits the pods. So an
// admitted pod is charged to the GPU it got, and the pods still waiting are
// charged to the planned GPUs of their size that no admitted pod took - not
// to their own annotation, which another pod of the same size may have used.
func chargeFractions(node string, acc *nodeAcc, reservations map[NodeGPU]*Reservation) {
	if len(acc.fracs) == 0 {
		return
	}
	left := map[int]map[string]int{} // size -> planned GPU -> planned slots not yet taken by an admitted pod
	for _, f := range acc.fracs {
		if f.planned == "" {
			continue
		}
		if left[f.pct] == nil {
			left[f.pct] = map[string]int{}
		}
		left[f.pct][f.planned]++
	}
	for _, f := range acc.fracs {
		if f.actual != "" && left[f.pct][f.actual] > 0 {
			left[f.pct][f.actual]--
		}
	}
	charge := func(g string, f fraction) bool {
		i, ok := acc.gpuIndex[g]
		if !ok {
			return false
		}
		acc.node.GPUs[i].FreeMilli -= f.pct * 10
		acc.node.Kinds[0]++
		key := NodeGPU{node, g}
		r := reservations[key]
		if r == nil {
			r = &Reservation{}
			reservations[key] = r
		}
		r.Fractions++
		if holder := acc.exclusive[g]; holder != nil && f.actual == g && r.Pod == nil {
			// Its reservation was lost and the GPU given whole. Untrusted
			// input: gpufrac.io/allocated-gpu is the node agent's (the
			// admission policies hold it to that), but where they are
			// missing a pod's author can write it. So it counts only on a
			// GPU no reservation pod holds: the kubelet gives a device to
			// one pod, and a whole-GPU pod naming a reserved GPU lies.
			r.TakenBy = holder
			r.Stranded = append(r.Stranded, f.pod)
		}
		return true
	}
	for _, f := range acc.fracs {
		g := f.actual
		if g == "" {
			// Waiting: take a planned slot of this size still open, own plan first.
			g = f.planned
			if left[f.pct][g] == 0 {
				for _, cand := range sortedKeys(left[f.pct]) {
					if left[f.pct][cand] > 0 {
						g = cand
						break
					}
				}
			}
			if left[f.pct][g] > 0 {
				left[f.pct][g]--
			}
		}
		if !charge(g, f) {
			acc.unplacedF = append(acc.unplacedF, f.pct)
			// On a GPU no longer placed (unhealthy, other mode): it still
			// keeps that GPU's reservation, if any, in use.
			if r := reservations[NodeGPU{node, g}]; g != "" && r != nil {
				r.Fractions++
			}
		}
	}
}

// orphaned says why fractions may not be placed on GPU g of this (Ready)
// node any more; "" when they may.
func (acc *nodeAcc) orphaned(node, g string) string {
	inv, known := acc.inventory[g]
	switch {
	case g == "":
		return fmt.Sprintf("the reservation on %s names no GPU", node)
	case !known:
		return fmt.Sprintf("GPU %s is not in the GPU inventory of %s", g, node)
	case !inv.Healthy:
		return fmt.Sprintf("GPU %s on %s is unhealthy", g, node)
	case inv.Mode != "fraction":
		return fmt.Sprintf("GPU %s on %s is in mode %s, not fraction", g, node, inv.Mode)
	}
	return ""
}

// trackOffNode records a reservation pod on a node left out of the
// snapshot (n) or gone (n nil) as orphaned, drifted ones (Inputs.Drifted)
// included. Nodes left out only because they are young (notBefore) are
// skipped: they are about to take fractions.
func trackOffNode(rs map[NodeGPU]*Reservation, p *corev1.Pod, node string, n *corev1.Node, now time.Time, drifted bool) {
	var why string
	switch {
	case n == nil:
		why = fmt.Sprintf("node %s no longer exists", node)
	case n.DeletionTimestamp != nil:
		why = fmt.Sprintf("node %s is being deleted", node)
	case n.Spec.Unschedulable:
		why = fmt.Sprintf("node %s is cordoned", node)
	case predicates.DrainingAt(n, now):
		why = fmt.Sprintf("node %s is drained for consolidation", node)
	case !nodeReadyAt(n, now):
		why = fmt.Sprintf("node %s is not Ready", node)
	case drifted:
		why = fmt.Sprintf("node %s is drifted (its Karpenter NodeClaim is Drifted)", node)
	default:
		return // young (NotBefore) or settling: about to take fractions
	}
	g := predicates.ReservedGPU(p)
	key := NodeGPU{node, g}
	if rs[key] == nil {
		rs[key] = &Reservation{}
	}
	r := rs[key]
	r.Pod, r.Orphaned = p, why
	r.NodeGone, r.NodeLost = n == nil, n == nil || !predicates.ReadyCondition(n)
	r.Ready = g != "" && p.Annotations[api.AnnotationReservedGPU] == g
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func sortedKeys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// settle charges fractions on unknown GPUs (best fit) and whole GPUs of pods
// whose GPU is unknown (clean GPUs first, in index order, as gpufrac-node's
// preferred allocation does).
func settle(acc *nodeAcc) {
	gs := acc.node.GPUs
	sort.Sort(sort.Reverse(sort.IntSlice(acc.unplacedF)))
	for _, pct := range acc.unplacedF {
		best := -1
		for i := range gs {
			if gs[i].FreeMilli >= pct*10 && (best < 0 || gs[i].FreeMilli < gs[best].FreeMilli) {
				best = i
			}
		}
		if best >= 0 {
			gs[best].FreeMilli -= pct * 10
		}
	}
	need := acc.whole
	for pass := 0; pass < 2 && need > 0; pass++ {
		for i := range gs {
			if need == 0 {
				break
			}
			clean := gs[i].FreeMilli == placement.MilliPerGPU && !acc.reserved[gs[i].ID] && !acc.held[gs[i].ID]
			if (pass == 0 && clean) || (pass == 1 && gs[i].FreeMilli > 0) {
				gs[i].FreeMilli = 0
				need--
			}
		}
	}
	for i := range gs {
		if gs[i].FreeMilli < 0 {
			gs[i].FreeMilli = 0 // over-committed by other schedulers; nothing is free
		}
		// A reserved GPU is held whole by its reservation pod, even with no
		// fraction on it yet (or during the reservation's grace): placement
		// never gives it to a whole-GPU request, which the kubelet could not
		// admit there.
		gs[i].Reserved = acc.reserved[gs[i].ID]
	}
}

// inventory reads the node's GPU inventory annotation; ok is false when it
// is missing or does not parse.
func inventory(n *corev1.Node) (inv []api.GPUInfo, ok bool) {
	raw := n.Annotations[api.AnnotationGPUInventory]
	if raw == "" {
		return nil, false
	}
	inv, err := api.DecodeInventory(raw)
	return inv, err == nil
}

// partitioned counts the healthy GPUs of an inventory in modes mig and
// timeslice and records what one of their MIG devices (mixed strategy) or
// replicas is worth in milli-GPU in milli, keeping the largest per resource.
func partitioned(inv []api.GPUInfo, milli map[string]int64) int {
	count := 0
	for _, g := range inv {
		if !g.Healthy || (g.Mode != "mig" && g.Mode != "timeslice") {
			continue
		}
		count++
		for _, d := range g.MIGDevices {
			if strings.HasPrefix(d.Resource, api.MIGResourcePrefix) {
				milli[d.Resource] = max(milli[d.Resource], g.MIGShareMilli(d))
			}
		}
		if m := g.ReplicaShareMilli(); m > 0 {
			name := g.ReplicaResource
			if name == "" {
				name = api.DefaultTimesliceResource
			}
			milli[name] = max(milli[name], m)
		}
	}
	return count
}

// nodeGPUs lists a node's schedulable GPUs: from its inventory inv when
// hasInv (healthy GPUs in exclusive or fraction mode), else anonymous GPUs
// from the nvidia.com/gpu allocatable count. fractionOK is false when
// fractions cannot be placed on the node (no inventory, or no GPU in
// fraction mode).
func nodeGPUs(n *corev1.Node, inv []api.GPUInfo, hasInv, draNode bool) (gpus []api.GPUInfo, fractionOK bool) {
	if hasInv {
		for _, g := range inv {
			if !g.Healthy || (g.Mode != "fraction" && g.Mode != "exclusive") {
				continue
			}
			if g.Mode == "fraction" {
				fractionOK = true
			}
			gpus = append(gpus, g)
		}
		// A node in mode dra serves no fraction resource: its GPUs in mode
		// fraction publish the shared views.
		return gpus, fractionOK && (draNode || n.Status.Allocatable.Name(api.ResourceFraction, "").Value() > 0)
	}
	count := n.Status.Allocatable.Name(api.ResourceGPU, "").Value()
	for i := int64(0); i < count; i++ {
		gpus = append(gpus, api.GPUInfo{UUID: fmt.Sprintf("%s/gpu-%d", n.Name, i), Index: int(i)})
	}
	return gpus, false
}
