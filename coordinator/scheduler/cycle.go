package scheduler

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/coordinator/binder"
	"github.com/gpufrac/gpufrac/coordinator/kubecheck"
	"github.com/gpufrac/gpufrac/coordinator/placeholder"
	"github.com/gpufrac/gpufrac/coordinator/placement"
	"github.com/gpufrac/gpufrac/coordinator/predicates"
	"github.com/gpufrac/gpufrac/coordinator/state"
)

// cycle is one scheduling cycle: what it read and what it decided. It lives
// for one call of Scheduler.Cycle; what lasts from cycle to cycle is on the
// Scheduler.
type cycle struct {
	s      *Scheduler
	ctx    context.Context
	logger klog.Logger
	start  time.Time
	res    Result
	stages stageTimes

	// Read by snapshot.
	assumed map[types.UID]state.Assumed
	nodes   []*corev1.Node
	// pods are every pod, listed when first needed (allPods): most
	// cycles read the ledger and the cache instead.
	pods      []*corev1.Pod
	podsErr   error
	listed    bool
	queues    []*v1alpha1.Queue
	badQueues []InvalidQueue
	inputs    state.Inputs
	// dra is what the cycle sees of DRA: slices, claims, the allocations
	// counted, and whether kube-scheduler is placing pods with claims (nil
	// without DRA).
	dra         *draCycle
	snap        *state.Snapshot
	books       *books
	boundDemand []boundDemand
	gangs       *gangsPlaced
	parsing     bool // the parses were begun: they are swept when the cycle ends
	// held names the nodes that settle in this cycle and are placed on,
	// their pods bound once they settled (see settlingNodes).
	held map[string]bool

	// Gathered by collect.
	pending    []*corev1.Pod   // pods of this scheduler that wait for a node
	existing   []*corev1.Pod   // placeholder pods
	liveGroups map[string]bool // placeholder groups with placeholders (collect); those of liveItems are added when asked (live)
	// liveItems: the first placeholder item of each admitted workload
	// asked about; their groups are live (live names them).
	liveItems []*placeholder.Item
	asking    map[string]bool // workloads placeholders were made for
	workloads []*workload
	deferred  int // pending pods whose Job or claims the caches do not show yet

	// Decided by place.
	wanted    map[state.NodeGPU]bool // GPUs whose reservation fractions wait for
	plans     plans                  // pods waiting for reservations -> their placement
	demand    []placeholder.Item     // admitted work with no room: asks for capacity
	withdrawn map[types.UID]bool     // placeholders deleted before their work was bound elsewhere
	reclaimIn *reclaimScope          // what reclaim reads, built once for the cycle
	full      bool                   // the bind queue has no room for the next workload
	budget    *placeBudget
	hinted    bool        // some placeholder group has landed nodes or nominated NodeClaims
	kube      *kubeChecks // kube-scheduler's filter plugins, begun on the first pod that needs them
	// driftSnap is the drifted nodes' snapshot (driftedSnapshot), built
	// once driftBuilt.
	driftSnap  *state.Snapshot
	driftBuilt bool
}

// Cycle runs one scheduling cycle, phase by phase: snapshot (read the world),
// collect (pending pods into workloads), order, place (admit, place, reserve
// and bind each workload), reconcile (reservations and placeholders) and
// report. It returns how many pods it sent to binding and why the others
// wait.
func (s *Scheduler) Cycle(ctx context.Context) (Result, error) {
	c, err := s.runCycle(ctx)
	return c.res, err
}

// runCycle runs one cycle and returns it.
func (s *Scheduler) runCycle(ctx context.Context) (*cycle, error) {
	start := s.clock.Now()
	verbose := klog.FromContext(ctx).V(2).Enabled()
	var (
		cpu0       cpuUse
		preFilters uint64
	)
	if verbose {
		cpu0 = readCPUUse()
		if s.deps.Kube != nil {
			preFilters = s.deps.Kube.PreFilters()
		}
	}
	c := &cycle{
		s: s, ctx: ctx, logger: klog.FromContext(ctx), start: start,
		res:    Result{Pending: map[string]int{}},
		stages: stageTimes{clock: s.clock, last: start},
	}
	defer func() {
		if c.parsing {
			s.sweepParses()
		}
		if c.kube != nil {
			s.kubeCarried = c.kube.end(s.plans)
		}
		// The next cycle's snapshot is made in this one's arrays: nothing
		// reads it after the cycle (quiet reads what the state snapshot
		// holds besides them).
		s.stateCache.Recycle(c.snap)
	}()
	if err := c.snapshot(); err != nil {
		return c, err
	}
	c.stages.done("snapshot")
	c.collect()
	c.stages.done("collect")
	c.order()
	c.placeWorkloads()
	c.stages.done("place")
	c.reconcile()
	c.stages.done("reservations")
	c.report()
	c.stages.done("report")
	if verbose {
		cpu := readCPUUse().since(cpu0)
		kv := []any{"pending", len(c.pending), "bound", c.res.Bound, "waiting", c.res.Pending,
			"duration", s.clock.Since(start), "processCPU", cpu.process, "gcCPU", cpu.gc}
		if s.deps.Kube != nil {
			kv = append(kv, "kubePreFilters", s.deps.Kube.PreFilters()-preFilters)
		}
		c.logger.V(2).Info("Scheduling cycle", append(kv, c.stages.kv...)...)
	}
	return c, nil
}

// snapshot reads the world and builds the cycle's snapshot and queue books.
func (c *cycle) snapshot() error {
	if err := c.read(); err != nil {
		return err
	}
	return c.build()
}

// read reads what the snapshot is made from besides the cache: the pods
// being bound, the nodes, the queues, DRA's objects and the nodes settling
// or drifted.
func (c *cycle) read() error {
	s := c.s
	// Assumed pods first: a binding the informer shows after this copy is
	// in the ledger and the cache (its handlers take it before they forget
	// the assumption), so no pod is missed by both and placed twice.
	c.assumed = s.takeAssumed(c.logger, c.start)
	var err error
	if c.nodes, err = s.deps.Nodes.List(labels.Everything()); err != nil {
		return fmt.Errorf("listing nodes: %w", err)
	}
	if c.queues, c.badQueues, err = s.deps.Queues.Queues(); err != nil {
		return fmt.Errorf("listing queues: %w", err)
	}
	draNow, draUsage, err := s.readDRA(c.start)
	if err != nil {
		return err
	}
	c.dra = draNow

	c.inputs = state.Inputs{Nodes: c.nodes, Assumed: c.assumed, PoolLabel: s.opts.PoolLabel, TimesliceResource: s.opts.TimesliceResource,
		DRAUsage: draUsage, Now: c.start}
	if s.deps.Reserver != nil {
		c.inputs.Removing = s.deps.Reserver.Removing()
		c.inputs.Creating = s.creatingReservations()
	}
	if s.opts.NewNodeSettle > 0 {
		c.inputs.Settling, c.held = s.settlingNodes(c.nodes, c.start)
	}
	c.inputs.Drifted = s.driftedNodes(c.nodes)
	return nil
}

// build builds the snapshot (the cache's) and the queue books (the
// bound-pod ledger's).
func (c *cycle) build() error {
	s := c.s
	// The snapshot is built while the pods bound or being bound are
	// charged to their queues (readBound): two passes over every pod, on
	// two goroutines. The parses use the last cycle's GPU models, scalar
	// worth and nodes in mode dra, which the snapshot tells; when they
	// changed the pods are read again.
	if s.models == nil {
		// The first cycle: the parses need the models (the snapshot tells
		// them later cycles).
		s.models = state.Models(c.nodes)
	}
	s.beginParses()
	s.gangIDs.turn()
	c.parsing = true
	var (
		buildErr error
		built    = make(chan struct{})
	)
	go func() {
		defer close(built)
		in := c.inputs
		in.Nodes = nil // the cache's, from its events
		c.snap, buildErr = s.stateCache.UpdateSnapshot(in)
	}()
	var err error
	c.books, err = newBooks(c.queues, c.badQueues)
	if err == nil {
		c.boundDemand, c.gangs, err = s.readBound(c.dra, c.allPods, c.assumed, c.books)
	}
	<-built
	if buildErr != nil {
		return buildErr
	}
	if err != nil {
		return err
	}
	s.models = c.snap.Models
	s.scalarMilli = c.snap.ScalarMilli
	s.draNodes = c.snap.DRANodes
	if !s.parsesValid() {
		s.beginParses()
		if c.books, err = newBooks(c.queues, c.badQueues); err != nil {
			return err
		}
		if c.boundDemand, c.gangs, err = s.readBound(c.dra, c.allPods, c.assumed, c.books); err != nil {
			return err
		}
	}
	if c.dra != nil {
		c.dra.busy = s.kubeSchedulerPlacingClaims(maps.Values(s.bound.unbound))
	}
	c.books.setCapacity(c.snap)
	return nil
}

// allPods lists every pod, once per cycle, when first asked: the cycle
// reads the pods from the bound-pod ledger and the cache, and lists them
// only where those do not say enough (the ledger's first read, reclaim,
// drifted nodes).
func (c *cycle) allPods() ([]*corev1.Pod, error) {
	if !c.listed {
		c.listed = true
		if c.pods, c.podsErr = c.s.deps.Pods.List(labels.Everything()); c.podsErr != nil {
			c.podsErr = fmt.Errorf("listing pods: %w", c.podsErr)
		}
	}
	return c.pods, c.podsErr
}

// takeAssumed copies the pods being bound, forgetting those whose binding's
// outcome stayed unknown for bindUnknownHold: taken for not bound, they go
// back to pending.
func (s *Scheduler) takeAssumed(logger klog.Logger, now time.Time) map[types.UID]state.Assumed {
	s.mu.Lock()
	defer s.mu.Unlock()
	assumed := make(map[types.UID]state.Assumed, len(s.assumed))
	for uid, a := range s.assumed {
		if a.unknown && now.Sub(a.since) >= bindUnknownHold {
			logger.V(2).Info("Binding outcome still unknown and the pod not shown bound; it is placed again", "podUID", uid, "node", a.Node)
			delete(s.assumed, uid)
			if s.deps.Kube != nil {
				s.deps.Kube.Forget(logger, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: uid}})
			}
			continue
		}
		assumed[uid] = a.Assumed
	}
	return assumed
}

// collect gathers the pending pods of this scheduler into workloads (gangs
// and single pods) and takes out those that may not be placed this cycle:
// invalid requests, gangs too large or rolling back, workloads in a
// binding back-off.
func (c *cycle) collect() {
	s := c.s
	s.forgetSaid()
	if err := s.pruneReclaims(c.allPods, c.start); err != nil {
		c.logger.Error(err, "Pruning the reclaims in flight; tried again in the next cycle")
	}
	c.liveGroups = map[string]bool{}
	c.asking = map[string]bool{}
	// The ledger's pods (readBound brought them up to the events taken):
	// the placeholders, and the pods not shown bound.
	for _, p := range s.bound.placeholders() {
		c.existing = append(c.existing, p)
		c.liveGroups[p.Labels[placeholder.LabelGroup]] = true
		if p.DeletionTimestamp == nil {
			for _, k := range strings.Split(p.Annotations[placeholder.AnnotationWorkloads], ",") {
				c.asking[k] = true
			}
		}
	}
	for _, p := range s.bound.unbound {
		if _, busy := c.assumed[p.UID]; busy {
			continue
		}
		// A pod with scheduling gates may not be bound until they are gone
		// (the API server refuses the binding; its PodScheduled condition
		// says SchedulingGated): placed, it would hold capacity and a
		// reservation, and its binding would fail in every cycle.
		if !predicates.Terminal(p) && p.DeletionTimestamp == nil && p.Spec.SchedulerName == s.opts.SchedulerName &&
			len(p.Spec.SchedulingGates) == 0 {
			c.pending = append(c.pending, p)
		}
	}
	workloads, invalid, deferred := s.group(c.dra, c.pending, c.gangs, c.books)
	c.deferred = deferred
	workloads, invalid = s.dropOversizedGangs(c.snap, workloads, invalid)
	for _, iv := range invalid {
		s.markPending(c.ctx, iv.pod, "", binder.ReasonInvalidRequest, iv.message, &c.res)
	}
	// Gangs bound in part for longer than GangBindTimeout give their GPUs
	// back; their pending members wait until the evicted ones are gone.
	rollingBack := s.checkGangBinds(c.ctx, c.gangs.census)
	workloads = slices.DeleteFunc(workloads, func(w *workload) bool {
		msg, rolling := rollingBack[w.id()]
		if rolling {
			c.leave(w, wait(binder.ReasonGangIncomplete, msg))
		}
		return rolling
	})
	workloads = c.holdForKueue(workloads)
	// Workloads whose binding failed a moment ago wait out their back-off.
	c.workloads = s.holdBackedOff(c.ctx, workloads, c.start, &c.res)
	c.books.demand(c.workloads)
}

// order sorts the workloads: queues by dominant share, then priority, then
// age; workloads placed in an earlier cycle and waiting for their
// reservations first (their capacity was promised, and placing a new pod
// before them could plan it onto the same GPU).
func (c *cycle) order() {
	s := c.s
	sortWorkloads(c.workloads, c.books)
	sort.SliceStable(c.workloads, func(i, j int) bool {
		return s.plans.firstOf(c.workloads[i]) && !s.plans.firstOf(c.workloads[j])
	})
	s.feedDemand(c.snap, c.boundDemand, c.workloads, c.books)
}

// outcome is how one workload leaves the place phase. Pending for a reason:
// with write set, the reason is written on its pods (PodScheduled); without,
// it is only counted (the pods are being served). The zero outcome leaves
// nothing to do: the pods were bound, or accounted for as they were placed.
type outcome struct {
	bound  bool // sent to binding
	reason string
	msg    string
	write  bool
}

// wait is a pending outcome whose reason is written on the pods.
func wait(reason, msg string) outcome { return outcome{reason: reason, msg: msg, write: true} }

// counted is a pending outcome that is counted but not written.
func counted(reason string) outcome { return outcome{reason: reason} }

// leave gives w's pods the outcome o.
func (c *cycle) leave(w *workload, o outcome) {
	if o.reason == "" {
		return
	}
	for _, p := range w.pods {
		if o.write {
			c.s.markPending(c.ctx, p.pod, w.queue, o.reason, o.msg, &c.res)
		} else {
			c.res.pending(w.queue, o.reason, p.pod)
		}
	}
}

// placeWorkloads admits and places the workloads in order, each to its outcome.
func (c *cycle) placeWorkloads() {
	s := c.s
	c.wanted = map[state.NodeGPU]bool{}
	c.plans = plans{}
	c.withdrawn = map[types.UID]bool{}
	c.reclaimIn = newReclaimScope(c.inputs, c.allPods, s.stateCache, c.dra, c.start)
	c.budget = s.placeBudget()
	c.kube = s.newKubeChecks(c)
	c.kube.forgetCarriedOutside(c.workloads, s.plans)
	c.hinted = s.hints.hinted()
	for _, w := range c.workloads {
		o := c.placeWorkload(w)
		c.leave(w, o)
		s.tellPodGroup(c.ctx, w, o)
	}
	if c.budget.cut {
		s.Wake() // the rest is placed in the next cycle, not an Interval later
	}
	s.plans = c.plans
}

// keepAsking keeps w's placeholders asking for capacity, and its group's
// hints, while w is left for a later cycle (the bind queue full, the place
// budget spent) after it asked Karpenter for capacity before: its
// placeholders would go otherwise (and Karpenter drop the node it was
// buying), or the node bought for it be forgotten, for as long as the work
// ahead of it fills the bind queue or spends the budget.
func (c *cycle) keepAsking(w *workload) {
	if !c.asking[w.key] && !c.hinted {
		return
	}
	items := c.s.items(w, c.snap, c.existing, c.kube)
	c.markLive(items)
	if c.asking[w.key] {
		c.demand = append(c.demand, c.kube.withDomains(items)...)
	}
}

// placeWorkload admits, places, reserves for and binds one workload.
func (c *cycle) placeWorkload(w *workload) outcome {
	v, o, ok := c.admit(w)
	if !ok {
		c.kube.forgetCarried(w)
		return o
	}
	items := c.s.items(w, c.snap, c.existing, c.kube)
	c.markLive(items)
	decisions, placeErr := c.decide(w, items)
	if errors.Is(placeErr, kubecheck.ErrNotReady) {
		// Not a lack of capacity: no reclaim, no placeholder.
		return wait(api.ReasonKubeChecksNotReady, placeErr.Error())
	}
	if placeErr != nil {
		return c.noRoom(w, v, items, placeErr)
	}
	return c.commit(w, decisions)
}

// admit tells whether w may be placed in this cycle, with its queue's
// verdict; else (ok false) w's outcome: a gang missing members, no room in
// the bind queue or the cycle's budget, claims while kube-scheduler places
// pods with claims, or its queue's refusal.
func (c *cycle) admit(w *workload) (v verdict, o outcome, ok bool) {
	s := c.s
	if w.incomplete != "" {
		// Members created in a burst arrive within moments: a gang says
		// it waits only once it has waited GangReportDelay.
		o := wait(binder.ReasonGangIncomplete, w.incomplete)
		o.write = c.start.Sub(w.created) >= s.opts.GangReportDelay
		return v, o, false
	}
	// Workloads are placed in order until the bind queue cannot take the
	// next one: the rest waits for the next cycle (no reason is written,
	// their pods are being served), so a cycle never waits for bindings and
	// nothing later overtakes them. A workload placed in an earlier cycle
	// and waiting for reservations keeps its plan: dropped, its
	// reservations would no longer be wanted.
	planned := s.plans.anyOf(w)
	if c.full = c.full || !s.bindRoom(len(w.pods)); c.full && !planned {
		c.keepAsking(w)
		return v, counted(ReasonWaitingToBind), false
	}
	if !c.budget.admit(planned) {
		c.keepAsking(w)
		return v, counted(ReasonNextCycle), false
	}
	if c.dra.busyPod() != "" && w.claimsGPU() {
		return v, wait(api.ReasonWaitingForKubeScheduler, fmt.Sprintf(
			"kube-scheduler is placing pods with resource claims (%s); this pod's claims wait until it is done, so two schedulers never give the same GPU away", c.dra.busyPod())), false
	}
	if v = c.books.check(w); !v.allowed {
		return v, wait(v.reason, v.message), false
	}
	return v, outcome{}, true
}

// decide places w: on its plan of the last cycle when that still holds
// (kube-scheduler's checks included), else afresh, preferring the nodes
// its placeholders brought.
func (c *cycle) decide(w *workload, items []placeholder.Item) ([]placement.Decision, error) {
	s := c.s
	decisions := s.plans.keep(c.snap, w)
	if decisions != nil {
		// Its nodes still pass kube-scheduler's checks, or it is placed again.
		if moved, err := c.kube.keep(w, decisions); err != nil || moved != "" {
			c.logger.V(2).Info("Plan dropped: kube-scheduler's checks", "workload", w.key, "why", moved, "err", err)
			decisions = nil
		}
	}
	if decisions != nil {
		return decisions, nil
	}
	c.kube.forgetCarried(w)
	return s.placePreferring(c.dra, c.snap, w, s.preferredNodes(items), c.kube)
}

// commit takes w's placement: its queue's books, its placeholders
// withdrawn, its reservations made, then its pods sent to binding, or its
// plan kept while it waits for reservations, a settling node or the bind
// queue.
func (c *cycle) commit(w *workload, decisions []placement.Decision) outcome {
	s := c.s
	c.books.assume(w)
	// Its placeholders go before its reservations are made (see
	// withdrawPlaceholders).
	if s.withdrawPlaceholders(c.ctx, w, c.existing, c.withdrawn) {
		return wait(binder.ReasonNoCapacity, "room found; waiting for its Karpenter placeholders to be withdrawn before binding")
	}
	if waitMsg := s.reserve(c.ctx, w, decisions, c.snap, c.wanted); waitMsg != "" {
		// The capacity stays taken in this cycle's snapshot and books, and
		// the pods keep their GPUs in the next cycle.
		c.plans.record(s.plans, w, decisions, c.snap, c.start)
		s.markWaiting(c.ctx, w, waitMsg, c.plans, c.snap, c.start, &c.res)
		c.budget.placed()
		return outcome{} // each pod counted or told by markWaiting
	}
	if c.holds(decisions) {
		// Placed on a node that settles: bound once it has, on the same
		// GPUs, whose reservations are made meanwhile.
		c.plans.record(s.plans, w, decisions, c.snap, c.start)
		c.budget.placed()
		return counted(ReasonNodeSettling)
	}
	if !s.bindRoom(len(w.pods)) {
		// Planned in an earlier cycle, it passed the queue's check above
		// (its reservations stay wanted); it keeps its plan and is bound
		// when there is room: a cycle never waits for the bind workers.
		c.full = true
		c.plans.record(s.plans, w, decisions, c.snap, c.start)
		return counted(ReasonWaitingToBind)
	}
	volumes := c.kube.gate(w)
	claims, allocErr := s.allocateClaims(c.ctx, c.dra, w, decisions, c.snap.DRANodes)
	if allocErr != nil {
		volumes.unreserveAll(c.ctx)
		return wait(binder.ReasonNoCapacity, "resource claims do not fit the node placement chose: "+allocErr.Error())
	}
	c.kube.sending(w)
	s.bind(c.ctx, w, decisions, c.snap, claims, volumes)
	c.res.Bound += len(w.pods)
	c.budget.placed()
	return outcome{bound: true}
}

// holds tells whether a decision places a pod on a node that settles.
func (c *cycle) holds(ds []placement.Decision) bool {
	for _, d := range ds {
		if c.held[d.Node] {
			return true
		}
	}
	return false
}

// noRoom is the outcome of a workload admitted by its queue that placement
// found no room for: over its deserved quota it waits for free capacity and
// never asks for more; within quota it reclaims from queues above theirs or,
// failing that, asks Karpenter for capacity through its placeholders.
func (c *cycle) noRoom(w *workload, verdict verdict, items []placeholder.Item, placeErr error) outcome {
	if verdict.overQuota {
		return wait(binder.ReasonOverQuota, fmt.Sprintf("queue %s is over its deserved quota and the cluster has no free capacity for this pod: %s", w.queue, placeErr))
	}
	if m := c.s.reclaim(c.ctx, w, c.books, c.reclaimIn, c.kube); m != "" {
		return wait(binder.ReasonNoCapacity, m)
	}
	c.demand = append(c.demand, c.kube.withDomains(items)...)
	if nodes, ok := c.fitsOnlyDrifted(w); ok {
		return wait(api.ReasonDriftedNodesOnly, driftedMessage(nodes, placeErr))
	}
	return wait(binder.ReasonNoCapacity, placeErr.Error())
}

// reconcile brings the cluster's reservations and placeholders in line with
// what the cycle decided, and evicts fractions stranded on a GPU given whole.
func (c *cycle) reconcile() {
	s := c.s
	s.evictStranded(c.ctx, c.snap)
	s.ensureReservations(c.ctx, c.snap)
	if s.deps.Reserver != nil {
		s.deps.Reserver.Reconcile(c.ctx, c.snap.Reservations, c.wanted, c.snap.RemovingShown)
		s.deps.Reserver.RemoveFailed(c.ctx, c.snap.FailedReservations)
	}
	s.syncPlaceholders(c.ctx, c.demand, c.existing, settlingIn(c.snap, c.nodes, c.held), c.withdrawn)
	s.pruneHints(c.live, c.nodes)
	c.liveItems = nil // the items, kept for live, are let go with them
}

// markLive marks the group of a workload's placeholder items live.
func (c *cycle) markLive(items []placeholder.Item) {
	if len(items) > 0 {
		c.liveItems = append(c.liveItems, &items[0])
	}
}

// live names the placeholder groups with placeholders or admitted pending
// work. Naming the groups of the work (placeholder.GroupOf) is left to
// here, for the cycles that keep a hint.
func (c *cycle) live() map[string]bool {
	for _, it := range c.liveItems {
		c.liveGroups[placeholder.GroupOf(*it)] = true
	}
	c.liveItems = nil
	return c.liveGroups
}

// queueFigures are the queues' GPU figures for the metrics: usage from the
// books, quota and limit from the Queues. An invalid queue has no usage.
func (c *cycle) queueFigures() []queueFigures {
	figs := make([]queueFigures, 0, len(c.queues)+len(c.badQueues))
	for _, q := range c.queues {
		f := queueFigures{name: q.Name}
		if used, np, ok := c.books.tree.Usage(q.Name); ok {
			f.allocatedMilli, f.nonPreemptMilli = used.GPUMilli, np.GPUMilli
		}
		if g := q.Spec.Resources.GPU; g != nil {
			f.quota, f.limit = g.Quota, g.Limit
		}
		figs = append(figs, f)
	}
	for _, iq := range c.badQueues {
		figs = append(figs, queueFigures{name: iq.Name, invalid: true})
	}
	return figs
}

// report writes the queues' status and the cycle's metrics.
func (c *cycle) report() {
	s := c.s
	var waiting []*workload
	for _, w := range c.workloads {
		if _, placed := s.isAssumed(w); !placed {
			waiting = append(waiting, w)
		}
	}
	s.writeQueueStatus(c.ctx, c.books, waiting, c.queues, c.badQueues)
	s.tellBoundPodGroups(c.ctx, c.gangs.census)
	s.forgetPodGroups(c.workloads, c.gangs.census)
	s.metrics.cycle(c.start, s.clock.Since(c.start), c.res)
	s.metrics.queues(c.queueFigures(), c.res)
}
