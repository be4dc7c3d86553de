package consolidation

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/predicates"
)

// Options configure the consolidation controller.
type Options struct {
	// Planner configures what may move and how it is simulated.
	Planner PlannerOptions
	// Interval is the time between passes.
	Interval time.Duration
	// StableFor is how long a node must stay the best candidate before its
	// drain starts (and then only while no work is pending): arrivals right
	// after a dip should not find their capacity gone.
	StableFor time.Duration
	// DrainTimeout bounds a drain, from its start to Karpenter removing the
	// node; past it the drain is abandoned (the taint removed).
	DrainTimeout time.Duration
	// MaxDrainingNodes is how many nodes drain at once (drained nodes
	// waiting for Karpenter not counted).
	MaxDrainingNodes int
	// MaxInFlight is the disruption budget: evictions start only while
	// fewer moved pods than this are still going (terminating) or waiting
	// to be placed again. A gang larger than it moves alone.
	MaxInFlight int
	// MaxMovesPerWindow evictions at most per MoveWindow.
	MaxMovesPerWindow int
	MoveWindow        time.Duration
	// DeleteDrainedNodes deletes a drained node once nothing but DaemonSet
	// and static pods runs there: Karpenter's documented manual disruption
	// (its finalizer drains and terminates the node at once), instead of
	// waiting for its emptiness consolidation (consolidateAfter, then its
	// own validation). Only nodes the coordinator tainted gpufrac.io/draining
	// and drained; the chart's admission policy holds it to those.
	DeleteDrainedNodes bool
}

// DefaultOptions are the coordinator's flag defaults.
func DefaultOptions() Options {
	return Options{
		Planner:          PlannerOptions{MinSavingPerMove: 0.5},
		Interval:         10 * time.Second,
		StableFor:        2 * time.Minute,
		DrainTimeout:     10 * time.Minute,
		MaxDrainingNodes: 1,
		MaxInFlight:      4, MaxMovesPerWindow: 10, MoveWindow: time.Minute,
	}
}

// Kube is the controller's writes to the API server.
type Kube interface {
	// Evict evicts a pod through the Eviction API.
	Evict(ctx context.Context, pod *corev1.Pod) error
	// DeleteReservation deletes a reservation pod.
	DeleteReservation(ctx context.Context, pod *corev1.Pod) error
	// Taint puts the gpufrac.io/draining taint with the deadline (Unix
	// seconds) on a node; Untaint removes it.
	Taint(ctx context.Context, node string, deadline int64) error
	Untaint(ctx context.Context, node string) error
	// Node reads a node as the API server has it now (not an informer's
	// cache).
	Node(ctx context.Context, name string) (*corev1.Node, error)
	// DeleteNode deletes a drained node, its UID and resourceVersion as
	// preconditions (Conflict when the node was replaced or changed since
	// n was read).
	DeleteNode(ctx context.Context, n *corev1.Node) error
	// PodsOnNode lists the pods bound to a node as the API server has them
	// now (not an informer's cache).
	PodsOnNode(ctx context.Context, node string) ([]*corev1.Pod, error)
}

// Controller drains the nodes the Planner finds, one pass at a time.
// Pass runs on one goroutine (Run's).
type Controller struct {
	opts     Options
	planner  *Planner
	read     func() (Cluster, error)
	kube     Kube
	recorder record.EventRecorder
	clock    clock.WithTicker
	metrics  *metrics

	best      string    // the best candidate of the last passes, "" for none
	bestSince time.Time // when best became it
	moves     []time.Time
	drained   map[string]bool // draining node -> its drain was counted as drained
	// deleted: UIDs of drained nodes deleted (or found gone), until the
	// informer no longer lists them: one DELETE and one count per node.
	deleted map[types.UID]bool
}

// New returns a controller; read lists the cluster (from informers).
func New(o Options, read func() (Cluster, error), kube Kube, recorder record.EventRecorder, clk clock.WithTicker, reg prometheus.Registerer) (*Controller, error) {
	def := DefaultOptions()
	if o.Interval <= 0 {
		o.Interval = def.Interval
	}
	if o.DrainTimeout <= 0 {
		o.DrainTimeout = def.DrainTimeout
	}
	if o.MaxDrainingNodes <= 0 {
		o.MaxDrainingNodes = def.MaxDrainingNodes
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = def.MaxInFlight
	}
	if o.MaxMovesPerWindow <= 0 || o.MoveWindow <= 0 {
		o.MaxMovesPerWindow, o.MoveWindow = def.MaxMovesPerWindow, def.MoveWindow
	}
	if o.StableFor < 0 {
		o.StableFor = 0
	}
	p, err := NewPlanner(o.Planner)
	if err != nil {
		return nil, err
	}
	if recorder == nil {
		recorder = &record.FakeRecorder{}
	}
	if clk == nil {
		clk = clock.RealClock{}
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	return &Controller{opts: o, planner: p, read: read, kube: kube, recorder: recorder, clock: clk, metrics: m, drained: map[string]bool{}, deleted: map[types.UID]bool{}}, nil
}

// Run runs passes every Interval until ctx ends.
func (c *Controller) Run(ctx context.Context) {
	logger := klog.FromContext(ctx)
	t := c.clock.NewTicker(c.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		if _, err := c.Pass(ctx); err != nil {
			logger.Error(err, "Consolidation pass failed")
		}
	}
}

// PassResult says what one pass did.
type PassResult struct {
	// Started names the node whose drain started ("" for none).
	Started string
	// Evicted, Refused and Failed count this pass's evictions.
	Evicted, Refused, Failed int
	// Released counts reservations deleted.
	Released int
	// Drained and Abandoned name the drains that ended this pass.
	Drained, Abandoned []string
	// Deleted names the drained nodes deleted this pass (DeleteDrainedNodes).
	Deleted []string
	// Verdicts are the planner's verdicts (nil when it did not look for a
	// new drain).
	Verdicts []NodeVerdict
}

// Pass runs one pass: (1) read the cluster, (2) carry on with each draining
// node (abandon, evict within the budget, release reservations), (3) look
// for a new drain.
func (c *Controller) Pass(ctx context.Context) (PassResult, error) {
	start := c.clock.Now()
	defer func() { c.metrics.observePass(c.clock.Since(start)) }()
	var res PassResult

	// 1. Read.
	cl, err := c.read()
	if err != nil {
		c.metrics.errors.WithLabelValues(ActionRead).Inc()
		return res, fmt.Errorf("reading the cluster: %w", err)
	}
	var draining []*corev1.Node
	for _, n := range cl.Nodes {
		if predicates.Draining(n) {
			draining = append(draining, n)
		}
	}
	sort.Slice(draining, func(i, j int) bool { return draining[i].Name < draining[j].Name })
	for name := range c.drained {
		if !containsNode(draining, name) {
			delete(c.drained, name)
		}
	}
	if len(c.deleted) > 0 {
		listed := make(map[types.UID]bool, len(cl.Nodes))
		for _, n := range cl.Nodes {
			listed[n.UID] = true
		}
		for uid := range c.deleted {
			if !listed[uid] {
				delete(c.deleted, uid)
			}
		}
	}

	// 2. Drains under way. A drained node waits for Karpenter; it does not
	// count against MaxDrainingNodes (Karpenter's removal takes tens of
	// seconds and would serialise the drains).
	// Work waiting for capacity gets the draining nodes back: Karpenter
	// would otherwise buy a node while one stands idle behind the taint.
	inFlight := c.inFlight(cl)
	defer func() { c.metrics.inFlight.Set(float64(inFlight)) }()
	starved := c.planner.Starved(cl)
	left, moving := 0, 0
	for _, n := range draining {
		if starved > 0 && n.DeletionTimestamp == nil && !karpenterDisrupting(n) {
			if !c.abandon(ctx, n, fmt.Sprintf("%d pods wait for capacity (NoCapacity): the node takes work again instead of Karpenter buying more", starved), &res) {
				left++
			}
			continue
		}
		if c.carryOn(ctx, cl, n, &inFlight, &res) {
			left++
			if !c.drained[n.Name] && n.DeletionTimestamp == nil && !karpenterDisrupting(n) {
				moving++
			}
		}
	}
	c.metrics.draining.Set(float64(left))

	// 3. A new drain.
	c.consider(ctx, cl, moving, &res)
	return res, nil
}

// karpenterDisrupting tells whether Karpenter is removing the node already.
func karpenterDisrupting(n *corev1.Node) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == taintKarpenterDisrupted {
			return true
		}
	}
	return false
}

func containsNode(nodes []*corev1.Node, name string) bool {
	for _, n := range nodes {
		if n.Name == name {
			return true
		}
	}
	return false
}

// inFlight counts moved pods not settled yet: the coordinator's pods
// terminating on draining nodes, and its pods waiting to be placed (the
// re-created ones among them). Read from the cluster, so a restarted
// coordinator counts what its predecessor evicted.
func (c *Controller) inFlight(cl Cluster) int {
	draining := map[string]bool{}
	for _, n := range cl.Nodes {
		if predicates.Draining(n) {
			draining[n.Name] = true
		}
	}
	pending, _ := c.planner.PendingWork(cl)
	n := pending
	for _, p := range cl.Pods {
		if p.DeletionTimestamp != nil && draining[p.Spec.NodeName] && p.Spec.SchedulerName == c.opts.Planner.schedulerName() && !predicates.Terminal(p) {
			n++
		}
	}
	return n
}

func (o PlannerOptions) schedulerName() string {
	if o.SchedulerName == "" {
		return api.SchedulerName
	}
	return o.SchedulerName
}

// carryOn advances one drain; it returns false when the drain ended (abandoned).
func (c *Controller) carryOn(ctx context.Context, cl Cluster, n *corev1.Node, inFlight *int, res *PassResult) bool {
	logger := klog.FromContext(ctx).WithValues("node", n.Name)
	if n.DeletionTimestamp != nil || karpenterDisrupting(n) {
		return true // Karpenter removes it now, draining what is left itself
	}
	deadline, _ := predicates.DrainDeadline(n)
	now := c.clock.Now()
	if now.Unix() > deadline {
		why := fmt.Sprintf("the drain did not finish within %s", c.opts.DrainTimeout)
		if c.drained[n.Name] {
			why = fmt.Sprintf("the node was drained but not removed within %s (does its NodePool consolidate empty nodes?)", c.opts.DrainTimeout)
		}
		return !c.abandon(ctx, n, why, res)
	}
	plan, err := c.planner.Remaining(cl, n.Name)
	if err != nil {
		return !c.abandon(ctx, n, err.Error(), res)
	}
	if len(plan.Pods) == 0 {
		if plan.Terminating > 0 {
			return true // wait for the pods to go: their GPUs are still held
		}
		for _, r := range plan.Reservations {
			if err := c.kube.DeleteReservation(ctx, r); err != nil && !apierrors.IsNotFound(err) {
				c.metrics.errors.WithLabelValues(ActionRelease).Inc()
				logger.Error(err, "Releasing a reservation of a drained node", "pod", klog.KObj(r))
				continue
			}
			res.Released++
			c.metrics.released.Inc()
			c.recorder.Eventf(r, corev1.EventTypeNormal, "ReservationRemoved", "node %s is drained for consolidation: its GPU %s is free", n.Name, predicates.ReservedGPU(r))
		}
		if len(plan.Reservations) == 0 && !c.drained[n.Name] {
			c.drained[n.Name] = true
			res.Drained = append(res.Drained, n.Name)
			c.metrics.drains.WithLabelValues(OutcomeDrained).Inc()
			price, _ := c.opts.Planner.Prices.NodePrice(n, nodeGPUs(n))
			c.metrics.drainedGPUs.Add(float64(nodeGPUs(n)))
			c.metrics.saving.Add(price)
			c.recorder.Eventf(n, corev1.EventTypeNormal, "ConsolidationDrained", "no gpufrac pod or reservation is left: Karpenter may remove the node (saves %s per hour)", savingText(n, c.opts.Planner))
			logger.Info("Node drained for consolidation", "gpus", nodeGPUs(n), "saving", price)
		}
		if len(plan.Reservations) == 0 && c.opts.DeleteDrainedNodes {
			c.deleteDrained(ctx, cl, n, res)
		}
		return true
	}
	c.evict(ctx, cl, n, plan, inFlight, res)
	return true
}

// deleteDrained hands a drained node to Karpenter's termination by
// deleting it, once every pod left there belongs to the node as Karpenter
// counts it (a DaemonSet's, a static pod, a pod its Node owns); any other
// pod, terminating ones included, keeps it. Only a Node that Karpenter's
// finalizer holds is deleted - elsewhere the delete would remove the Node
// object and leave its machine running - and not one annotated
// karpenter.sh/do-not-disrupt, nor within deleteMargin of the drain's
// deadline: past it placement takes the node back.
//
// The informers may be behind the API server, and a pod can be bound while
// this runs (a tenant's pod that tolerates the drain taint or has nodeName
// set; the coordinator's own placement once the deadline passed). So, in
// this order: (1) the node is read from the API server and must still be
// this node (UID), drained by this drain; (2) its pods are listed from the
// API server; (3) the deadline is checked again after that list, with the
// margin, and the list and delete are bounded by it (a slow list must not
// let the delete land after placement took the node back); (4) the delete
// carries the node's UID and resourceVersion from (1) as preconditions, so
// a node changed since (its taint removed or rewritten) is not deleted.
// A node is deleted once (the informer may list it unchanged for a while);
// one found gone or replaced is left alone. A failed or refused delete is
// retried on the next pass; Karpenter's own consolidation removes the node
// anyway.
func (c *Controller) deleteDrained(ctx context.Context, cl Cluster, n *corev1.Node, res *PassResult) {
	logger := klog.FromContext(ctx).WithValues("node", n.Name)
	if c.deleted[n.UID] {
		return
	}
	if why := c.undeletable(n); why != "" {
		logger.V(2).Info("Drained node not deleted", "reason", why)
		return
	}
	if p := keepsNode(cl.Pods, n.Name); p != nil {
		logger.V(4).Info("Drained node not deleted: a pod runs there", "pod", klog.KObj(p))
		return
	}
	// 1. The node as the API server has it.
	live, err := c.kube.Node(ctx, n.Name)
	switch {
	case apierrors.IsNotFound(err):
		c.deleted[n.UID] = true
		logger.V(2).Info("Drained node not deleted: it is gone")
		return
	case err != nil:
		c.metrics.errors.WithLabelValues(ActionDelete).Inc()
		logger.Error(err, "Reading a drained node before deleting it; retried on the next pass")
		return
	case live.UID != n.UID:
		c.deleted[n.UID] = true
		logger.V(2).Info("Drained node not deleted: a node of the same name replaced it", "uid", live.UID)
		return
	}
	if why := c.undeletable(live); why != "" {
		logger.V(2).Info("Drained node not deleted: the API server's node differs from the informer's", "reason", why)
		return
	}
	deadline, _ := predicates.DrainDeadline(live)
	ctx, cancel := context.WithTimeout(ctx, time.Unix(deadline, 0).Add(-deleteMargin).Sub(c.clock.Now()))
	defer cancel()
	// 2. Its pods as the API server has them.
	pods, err := c.kube.PodsOnNode(ctx, n.Name)
	if err != nil {
		c.metrics.errors.WithLabelValues(ActionDelete).Inc()
		logger.Error(err, "Listing the pods of a drained node before deleting it; retried on the next pass")
		return
	}
	if p := keepsNode(pods, n.Name); p != nil {
		logger.V(2).Info("Drained node not deleted: a pod was bound there since the informers were read", "pod", klog.KObj(p))
		return
	}
	// 3. The deadline again: the list may have outlasted it.
	if why := c.undeletable(live); why != "" {
		logger.V(2).Info("Drained node not deleted: its drain ended while its pods were listed", "reason", why)
		return
	}
	// 4. The delete, under the node's UID and resourceVersion.
	err = c.kube.DeleteNode(ctx, live)
	switch {
	case err == nil:
	case apierrors.IsNotFound(err):
		c.deleted[n.UID] = true
		logger.V(2).Info("Drained node not deleted: it is gone", "err", err)
		return
	case apierrors.IsConflict(err):
		// Replaced, or changed since step 1 (its taint, a label): the next
		// pass reads it again and decides anew.
		logger.V(2).Info("Drained node not deleted: it changed since it was read; retried on the next pass", "err", err)
		return
	default:
		c.metrics.errors.WithLabelValues(ActionDelete).Inc()
		c.recorder.Eventf(n, corev1.EventTypeWarning, "ConsolidationDeleteFailed", "deleting the drained node failed; retried on the next pass (Karpenter's own consolidation removes it anyway): %v", err)
		logger.Error(err, "Deleting a drained node")
		return
	}
	c.deleted[n.UID] = true
	res.Deleted = append(res.Deleted, n.Name)
	c.metrics.deleted.Inc()
	c.recorder.Event(n, corev1.EventTypeNormal, "ConsolidationNodeDeleted", "drained, with no pod left but DaemonSets': deleted so that Karpenter terminates it now")
	logger.Info("Deleted a drained node")
}

// deleteMargin is how long before its drain's deadline a drained node is no
// longer deleted: the delete's round trip must end before placement takes
// the node back.
const deleteMargin = 30 * time.Second

// undeletable says why a drained node may not be deleted ("" when it may),
// at the clock's now.
func (c *Controller) undeletable(n *corev1.Node) string {
	if !slices.Contains(n.Finalizers, KarpenterTerminationFinalizer) {
		return "no finalizer " + KarpenterTerminationFinalizer + ": without Karpenter's termination the delete would remove the Node object and leave its machine running"
	}
	if n.Annotations[api.AnnotationDoNotDisrupt] == "true" {
		return "the node is annotated " + api.AnnotationDoNotDisrupt + " (a delete is not held by it)"
	}
	deadline, ok := predicates.DrainDeadline(n)
	if !ok {
		return "the node has no taint " + api.TaintDraining
	}
	if c.clock.Now().Add(deleteMargin).Unix() >= deadline {
		return fmt.Sprintf("the drain's deadline is less than %s away: placement takes the node back", deleteMargin)
	}
	return ""
}

// keepsNode returns a pod bound to node that keeps it from being deleted:
// one not finished that is neither a DaemonSet's, nor static, nor owned by
// a Node (nil when there is none).
func keepsNode(pods []*corev1.Pod, node string) *corev1.Pod {
	for _, p := range pods {
		if p.Spec.NodeName == node && !predicates.Terminal(p) && !ownedByDaemonSet(p) && !isMirror(p) && !ownedByNode(p) {
			return p
		}
	}
	return nil
}

// evict evicts the plan's units within the budget: at most MaxInFlight
// moves in flight (a unit larger than that only when none is) and
// MaxMovesPerWindow per MoveWindow.
func (c *Controller) evict(ctx context.Context, cl Cluster, n *corev1.Node, plan Plan, inFlight *int, res *PassResult) {
	logger := klog.FromContext(ctx).WithValues("node", n.Name)
	now := c.clock.Now()
	kept := c.moves[:0]
	for _, t := range c.moves {
		if now.Sub(t) < c.opts.MoveWindow {
			kept = append(kept, t)
		}
	}
	c.moves = kept
	// The pods PodDisruptionBudgets cover go first, the rest only once
	// none is left: a budget can turn to refusing after the plan (its
	// tenant makes a pod unready), and the drain then stops there until it
	// is abandoned; the other pods, often other tenants', should not be
	// restarted for a drain that may never finish.
	pdbs := pdbsByNamespace(cl.PDBs)
	units := plan.Units
	var covered [][]*corev1.Pod
	for _, unit := range units {
		if slices.ContainsFunc(unit, func(p *corev1.Pod) bool { return len(pdbsOf(pdbs, p)) > 0 }) {
			covered = append(covered, unit)
		}
	}
	if len(covered) > 0 {
		units = covered
	}
	for _, unit := range units {
		if *inFlight > 0 && *inFlight+len(unit) > c.opts.MaxInFlight {
			logger.V(2).Info("Consolidation budget: moves in flight", "inFlight", *inFlight, "max", c.opts.MaxInFlight)
			return
		}
		if len(c.moves) > 0 && len(c.moves)+len(unit) > c.opts.MaxMovesPerWindow {
			logger.V(2).Info("Consolidation budget: moves per window", "moves", len(c.moves), "max", c.opts.MaxMovesPerWindow, "window", c.opts.MoveWindow)
			return
		}
		if len(unit) > 1 {
			// A gang moves whole or not at all: when its PodDisruptionBudgets
			// would refuse a member, none is evicted (retried on a later pass).
			if why := pdbAllows(pdbs, unit); why != "" {
				for _, p := range unit {
					res.Refused++
					c.metrics.evictions.WithLabelValues(ResultRefused).Inc()
					c.recorder.Eventf(p, corev1.EventTypeWarning, "ConsolidationEvictionRefused", "gang of %d pods not evicted to drain node %s, it moves whole: %s; retried later", len(unit), n.Name, why)
				}
				logger.V(2).Info("Gang not moved: a PodDisruptionBudget forbids it", "pod", klog.KObj(unit[0]), "why", why)
				continue
			}
		}
		for _, p := range unit {
			err := c.kube.Evict(ctx, p)
			switch {
			case err == nil || apierrors.IsNotFound(err):
				res.Evicted++
				c.metrics.evictions.WithLabelValues(ResultEvicted).Inc()
				c.moves = append(c.moves, now)
				*inFlight++
				c.recorder.Eventf(p, corev1.EventTypeNormal, "ConsolidationMove",
					"evicted to drain node %s, which Karpenter can then remove (saves %s per hour); its controller re-creates the pod and the coordinator places it on another node", n.Name, savingText(n, c.opts.Planner))
				logger.Info("Moved a pod off a draining node", "pod", klog.KObj(p))
			case apierrors.IsTooManyRequests(err):
				res.Refused++
				c.metrics.evictions.WithLabelValues(ResultRefused).Inc()
				c.recorder.Eventf(p, corev1.EventTypeWarning, "ConsolidationEvictionRefused", "eviction to drain node %s refused (a PodDisruptionBudget); retried later: %v", n.Name, err)
				logger.V(2).Info("Eviction refused", "pod", klog.KObj(p), "err", err)
			default:
				res.Failed++
				c.metrics.evictions.WithLabelValues(ResultFailed).Inc()
				c.recorder.Eventf(p, corev1.EventTypeWarning, "ConsolidationEvictionFailed", "eviction to drain node %s failed; retried later: %v", n.Name, err)
				logger.Error(err, "Evicting a pod off a draining node", "pod", klog.KObj(p))
			}
		}
	}
}

func savingText(n *corev1.Node, o PlannerOptions) string {
	price, src := o.Prices.NodePrice(n, nodeGPUs(n))
	if o.Prices.Empty() {
		return fmt.Sprintf("%d GPUs", int(price))
	}
	return fmt.Sprintf("%.2f (%s price)", price, src)
}

// abandon removes the drain taint; it returns true when it did.
func (c *Controller) abandon(ctx context.Context, n *corev1.Node, why string, res *PassResult) bool {
	if err := c.kube.Untaint(ctx, n.Name); err != nil && !apierrors.IsNotFound(err) {
		c.metrics.errors.WithLabelValues(ActionUntaint).Inc()
		c.recorder.Eventf(n, corev1.EventTypeWarning, "ConsolidationUntaintFailed", "abandoning the drain (%s) failed, the node keeps taint %s; retried on the next pass: %v", why, api.TaintDraining, err)
		klog.FromContext(ctx).Error(err, "Abandoning a drain", "node", n.Name)
		return false
	}
	delete(c.drained, n.Name)
	res.Abandoned = append(res.Abandoned, n.Name)
	c.metrics.drains.WithLabelValues(OutcomeAbandoned).Inc()
	c.recorder.Eventf(n, corev1.EventTypeWarning, "ConsolidationDrainAbandoned", "drain abandoned, the node takes work again: %s", why)
	klog.FromContext(ctx).Info("Drain abandoned", "node", n.Name, "reason", why)
	return true
}

// consider starts a new drain when the budget allows one, no work is
// pending, and the same node has been the best candidate for StableFor.
func (c *Controller) consider(ctx context.Context, cl Cluster, draining int, res *PassResult) {
	logger := klog.FromContext(ctx)
	best, verdicts := c.planner.Candidates(cl)
	res.Verdicts = verdicts
	c.metrics.verdicts(verdicts)
	if draining >= c.opts.MaxDrainingNodes {
		return
	}
	if best == nil {
		c.best = ""
		return
	}
	now := c.clock.Now()
	if best.Node != c.best {
		c.best, c.bestSince = best.Node, now
	}
	// Pending work (its room is simulated first) only defers the start: at
	// a peak a pod arrives every few seconds, and restarting the stability
	// window on each would keep every drain off until the day ends.
	if pending, placeholders := c.planner.PendingWork(cl); pending > 0 || placeholders > 0 {
		logger.V(4).Info("No new drain now: work is pending", "pending", pending, "placeholders", placeholders)
		return
	}
	if now.Sub(c.bestSince) < c.opts.StableFor {
		logger.V(4).Info("Consolidation candidate", "node", best.Node, "saving", best.Saving, "moves", best.Moves(), "since", c.bestSince)
		return
	}
	deadline := now.Add(c.opts.DrainTimeout).Unix()
	if err := c.kube.Taint(ctx, best.Node, deadline); err != nil {
		c.metrics.errors.WithLabelValues(ActionTaint).Inc()
		logger.Error(err, "Starting a drain", "node", best.Node)
		return
	}
	c.best = ""
	res.Started = best.Node
	c.metrics.drains.WithLabelValues(OutcomeStarted).Inc()
	var node *corev1.Node
	for _, n := range cl.Nodes {
		if n.Name == best.Node {
			node = n
		}
	}
	msg := fmt.Sprintf("draining for consolidation: %d pods move to other nodes (%s), saving %.2f per hour (%s price); deadline %s",
		best.Moves(), podList(best.Pods), best.Saving, best.PriceSource, time.Unix(deadline, 0).UTC().Format(time.RFC3339))
	if node != nil {
		c.recorder.Event(node, corev1.EventTypeNormal, "ConsolidationDrainStarted", msg)
	}
	logger.Info("Drain started", "node", best.Node, "moves", best.Moves(), "saving", best.Saving, "priceSource", best.PriceSource)
}

func podList(pods []*corev1.Pod) string {
	const most = 8
	var b strings.Builder
	for i, p := range pods {
		if i == most {
			fmt.Fprintf(&b, ", and %d more", len(pods)-most)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(p.Namespace + "/" + p.Name)
	}
	return b.String()
}

// KarpenterTerminationFinalizer is the finalizer Karpenter puts on the
// Nodes it launched: deleting such a Node makes Karpenter drain it and
// terminate its machine before the Node goes.
const KarpenterTerminationFinalizer = "karpenter.sh/termination"
