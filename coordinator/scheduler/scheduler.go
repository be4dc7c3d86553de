// Package scheduler is the coordinator's scheduling cycle: it takes the
// pending pods of gpufrac-scheduler, decides who runs (queues with quota and
// fair share, gangs all-or-nothing inside one node pool) and where
// (coordinator/placement on a snapshot of the cluster), then binds through
// the binder. Pods that stay pending get a PodScheduled reason that says why
// - never "Unschedulable".
//
// Every cycle rebuilds its snapshot from the informers plus the pods it is
// still binding (assumed), so a restarted coordinator resumes from what the
// API server says: bound pods and their annotations.
package scheduler

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	schedulingv1alpha2 "k8s.io/api/scheduling/v1alpha2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/binder"
	"github.com/gpufrac/gpufrac/coordinator/dra"
	"github.com/gpufrac/gpufrac/coordinator/kubecheck"
	"github.com/gpufrac/gpufrac/coordinator/kueue"
	"github.com/gpufrac/gpufrac/coordinator/placeholder"
	"github.com/gpufrac/gpufrac/coordinator/placement"
	"github.com/gpufrac/gpufrac/coordinator/reservation"
	"github.com/gpufrac/gpufrac/coordinator/state"
)

// Options configure the scheduler.
type Options struct {
	// SchedulerName is the schedulerName of the pods it schedules.
	SchedulerName string
	// PoolLabel is the node label that groups nodes into pools.
	PoolLabel string
	// Policy is the placement policy (placement.Policies()).
	Policy string
	// Seed seeds the placement policy's random choices.
	Seed uint64
	// BindWorkers is how many bindings run at once (DefaultBindWorkers);
	// as many writer goroutines run the cycle's other API writes.
	BindWorkers int
	// NonPreemptiblePriority: pods at or above it are non-preemptible; nil
	// means podrequest.DefaultNonPreemptiblePriority (0 is a threshold like
	// any other: every pod of priority 0 or more is non-preemptible).
	NonPreemptiblePriority *int32
	// MaxGPUsPerPod bounds nvidia.com/gpu per pod (one node's GPUs).
	MaxGPUsPerPod int
	// Interval is the longest wait between cycles.
	Interval time.Duration
	// IdleResync bounds how long Run skips cycles while the cluster is
	// idle: after a quiet cycle (see cycle.quiet) Run runs the next only on
	// an event, or once IdleResync has passed since the last. Zero means
	// DefaultIdleResync; negative, never skip.
	IdleResync time.Duration
	// GangReportDelay is how long a gang waits for its members (from the
	// creation of its oldest pending member) before its pods say so
	// (PodScheduled=False, reason GangIncomplete, and an event): a Job's
	// pods arrive within moments, and telling each one that it waits for
	// the others would cost two API writes per member for nothing. Zero
	// reports at once. The coordinator uses DefaultGangReportDelay.
	GangReportDelay time.Duration
	// ReservationReportDelay is how long fractions wait for their GPU's
	// reservation before their pods say so (PodScheduled=False, reason
	// ReservationPending, and an event); shorter waits are part of binding
	// and cost no API write. Zero reports at once. The coordinator uses
	// DefaultReservationReportDelay.
	ReservationReportDelay time.Duration
	// NewNodeSettle keeps pods off nodes that became usable less than this
	// ago: Karpenter's new nodes, nodes that lost a NoExecute taint or were
	// given back by consolidation (see settlingNodes); 0 binds there at
	// once, as kube-scheduler does. The coordinator's flag defaults to
	// DefaultNewNodeSettle.
	NewNodeSettle time.Duration
	// ElasticPools says node pools can grow (Karpenter is installed): a gang
	// larger than every pool then waits for capacity instead of being refused.
	ElasticPools bool
	// AvoidDriftedNodes places nothing new on nodes whose Karpenter
	// NodeClaim is Drifted (Deps.NodeDrifted), as on cordoned ones: their
	// reservations end with their fractions and Karpenter can replace
	// them. Pods already there stay. Pods that would fit only there wait
	// with the reason api.ReasonDriftedNodesOnly (and ask Karpenter for
	// capacity like NoCapacity). False places there as on any node.
	AvoidDriftedNodes bool
	// GangBindTimeout bounds how long a gang may hold GPUs bound in part
	// (fewer than min-member members bound, say because a binding failed):
	// past it the bound members are evicted and the gang is placed again
	// whole. Zero means DefaultGangBindTimeout.
	GangBindTimeout time.Duration
	// PlaceBudget bounds how long a cycle places workloads it has not
	// placed before: once it is spent (and at least one workload was
	// placed) the rest wait for the next cycle, in the same order, as when
	// the bind queue is full (placed on a node that settles counts as
	// placed; those that asked Karpenter for capacity keep their
	// placeholders and hints meanwhile). Zero means DefaultPlaceBudget;
	// negative, no budget.
	PlaceBudget time.Duration
	// Placeholder configures placeholder pods.
	Placeholder placeholder.Options
	// TimesliceResource is the time-sliced replica resource the node agents
	// serve ("" means api.DefaultTimesliceResource); it and MIG devices
	// (nvidia.com/mig-*) are placed as scalar resources.
	TimesliceResource string
}

// Reserver manages reservation pods (coordinator/reservation.Manager).
type Reserver interface {
	Ensure(ctx context.Context, node, gpu string, attempt int) error
	Reconcile(ctx context.Context, rs map[state.NodeGPU]*state.Reservation, wanted map[state.NodeGPU]bool, shown map[types.UID]bool) int
	// RemoveFailed removes reservation pods that ended Failed.
	RemoveFailed(ctx context.Context, pods []*corev1.Pod) int
	// Removing lists the reservation pods Reconcile deleted that may still
	// be in the informer's cache (state.Inputs.Removing).
	Removing() map[types.UID]bool
}

// Binder writes bindings and pending reasons.
type Binder interface {
	Bind(ctx context.Context, pod *corev1.Pod, node string, annotations map[string]string) error
	MarkPending(ctx context.Context, pod *corev1.Pod, reason, message string) error
}

// Deps are the scheduler's collaborators.
type Deps struct {
	Pods  corelisters.PodLister
	Nodes corelisters.NodeLister
	// Namespaces reads the namespaces' default queues (label
	// gpufrac.io/default-queue); nil: no namespace has one.
	Namespaces corelisters.NamespaceLister
	// Jobs finds a pod's owning batch/v1 Job (gangs derived from parallelism); may be nil.
	Jobs func(namespace, name string) (*batchv1.Job, bool)
	// PodGroups finds a PodGroup (scheduling.k8s.io/v1alpha2: Kubernetes'
	// own gangs); nil when the API server serves none.
	PodGroups func(namespace, name string) (*schedulingv1alpha2.PodGroup, bool)
	// PodGroupStatus writes the PodGroups' PodGroupScheduled condition; nil
	// writes none.
	PodGroupStatus PodGroupStatusWriter
	// Kueue answers the Workloads Kueue keeps, for the queues whose quota
	// Kueue keeps (spec.admission: Kueue); nil when the coordinator does
	// not read them, and the pods of those queues wait.
	Kueue kueue.Lookup
	// KueueSynced tells whether Kueue's Workloads have been read (nil:
	// always): until then the pods of those queues wait, and nothing else
	// does (a coordinator that may not list Workloads still schedules).
	KueueSynced func() bool
	Queues      QueueSource
	Binder      Binder
	// Reserver creates and removes reservation pods; nil binds fractions
	// without reservations (only safe when nothing else uses the GPUs).
	Reserver Reserver
	// Placeholders creates placeholder pods for admitted work without room
	// (capacity requests for Karpenter); nil disables them.
	Placeholders Placeholders
	// NodeClaims resolves Karpenter NodeClaims to nodes (nil: none known).
	NodeClaims NodeClaimNodes
	// NodeRegistered tells when Karpenter registered a node (nil: never
	// known); settlingNodes reads it for nodes it has not seen before.
	NodeRegistered NodeRegistrations
	// NodeDrifted tells which nodes Karpenter marked Drifted (nil: none),
	// read with Options.AvoidDriftedNodes.
	NodeDrifted NodeDrift
	// Status writes Queue status; nil disables it.
	Status StatusWriter
	// Evictor evicts pods to reclaim quota; nil disables reclaim.
	Evictor Evictor
	// Releaser evicts the bound members of a gang that did not bind whole;
	// nil disables the rollback.
	Releaser Releaser
	// Recorder records events on Queues (an invalid queue); nil records none.
	Recorder record.EventRecorder
	// Clock is the scheduler's clock; nil means the real one.
	Clock clock.Clock
	// Faults is the chaos suite's hook at the Fault* points (binaries built
	// with -tags faultinject); nil everywhere else.
	Faults   Faults
	Registry prometheus.Registerer
	// DRA reads slices and claims and writes allocations, for nodes in
	// mode dra; nil: the coordinator allocates no claims.
	DRA *DRADeps
	// Kube runs kube-scheduler's filter plugins (volumes, topology spread,
	// inter-pod affinity, host ports) for the pods that need them, and
	// binds their volumes before them; nil checks none of it.
	Kube *kubecheck.Checker
}

// Scheduler runs scheduling cycles. Wake and the On* handlers are safe from
// informer handlers; Cycle runs on one goroutine.
type Scheduler struct {
	opts    Options
	deps    Deps
	clock   clock.Clock
	placer  *placement.Placer
	metrics *metrics
	wake    chan struct{}
	binds   chan bindTask
	// gates run the volume gates of workloads before their bindings are
	// queued (bind); Run waits for them.
	gates sync.WaitGroup
	// events counts what may change a cycle's outcome: wake-ups (every
	// informer event), bindings and API writes done.
	events atomic.Uint64
	// nodeEvents counts the node informer's events that change what the
	// gang census reads of the nodes (which exist, their pools): a gang's
	// census is counted again when it moved.
	nodeEvents atomic.Uint64
	// idle is what Run knows of the last cycle it ran, used only by Run.
	idle idleState

	// writes runs the cycle's API writes other than bindings (its own
	// lock); allocator allocates claims on nodes in mode dra.
	writes    *writer
	allocator *dra.Allocator

	// Guarded by mu: read and written from more than one goroutine (the
	// cycle, the bind workers, the writers, the informer handlers).
	mu      sync.Mutex
	assumed map[types.UID]assumedPod // pods being bound -> where
	// selfEvicted: pod this scheduler evicted itself (a gang rollback, a
	// fraction off a GPU taken) -> true, until its delete is seen: its
	// DisruptionTarget is the coordinator's doing, no lost work (reportLost).
	selfEvicted map[types.UID]bool
	// reserveCreated: GPU -> when its reservation pod was created, until
	// the informer shows it (see reservationEcho).
	reserveCreated map[state.NodeGPU]time.Time
	// inflight: pod -> claim allocations made and not yet shown by the
	// informer.
	inflight map[types.UID]inflight

	// What lasts from one cycle to the next, each in a type of its own
	// file: with its own lock (taken inside mu where the holder of mu needs
	// it, never the other way round), or used only by the cycle goroutine.
	bindFailed   *bindFailures             // bind back-offs, gangs' last binding errors; own lock
	reclaims     *reclaimTracking          // reclaim's victims awaited and refused; own lock
	hints        *placeholderHints         // placeholder groups' landed and nominated nodes, release cooldown; own lock
	said         *podReasons               // pod -> the pending reason last written or queued; own lock
	statusSaid   *lastSaid[string, string] // queue -> the status last written or queued (statusKey); own lock
	invalidSaid  *lastSaid[string, string] // invalid queue -> the problem last reported in an event; own lock
	podGroupSaid *lastSaid[string, string] // PodGroup -> the PodGroupScheduled condition last written or queued; own lock
	// gangPartial: gang bound in part -> when a cycle first saw it so;
	// gangEvicted: members evicted by a gang rollback, until they are gone;
	// strandedEvicted: fractions evicted off a GPU given whole to another
	// pod, while still shown running there. Cycle goroutine only.
	gangPartial     partialGangs
	gangEvicted     evictionsSent
	strandedEvicted evictionsSent
	// settle: each node's settle taints and since when it is usable, and
	// the wake-up when the next settling node settles (settlingNodes).
	// Cycle goroutine only.
	settle *nodeSettle
	// plans: pod waiting for reservations -> its placement. Cycle
	// goroutine only (cycle.quiet reads it under mu).
	plans plans

	// stateCache holds the nodes and pods the informers' events showed
	// (the On* handlers feed it), for the cycles' snapshots.
	stateCache *state.Cache

	// bound: what the pods bound add to a cycle (readBound), kept between
	// cycles and brought up to date with the pod informer's events.
	bound *boundLedger

	// What cycles keep of each pod from one cycle to the next, used only
	// by the cycle goroutine: the parses. The GPU models, scalar worth (MIG
	// or replica resource -> milli-GPU per unit) and nodes in mode dra are
	// the last snapshot's: a cycle's parses begin with them before its own
	// snapshot is built, and are made again when they changed (snapshot).
	parses      parseCache
	models      []string
	scalarMilli map[string]int64
	draNodes    map[string]bool
	// gangIDs: the gangs' IDs the last two cycles asked for.
	gangIDs gangIDs
	// kubeCarried: the pods the last cycle left assumed in
	// kube-scheduler's cache for their plans (kubeChecks.end).
	kubeCarried map[types.UID]placedPod
}

type assumedPod struct {
	state.Assumed
	since time.Time
	// unknown: its binding's outcome is unknown (binder.ErrBindingUnknown),
	// learned at since. It stays assumed until the informer shows it bound
	// or gone, or for bindUnknownHold (step 1 of Cycle).
	unknown bool
}

// bindUnknownHold is how long a pod whose binding's outcome is unknown stays
// assumed while the informer shows it neither bound nor gone. The API
// server answered neither the binding nor the reads back, and its watch may
// be as slow to come back; forgotten at once, a pod it did bind would stop
// counting on its GPU until the informer shows it, and another pod could be
// placed into that share. Past the hold the pod is taken for not bound and
// placed again (were it bound after all, that second binding is refused:
// the pod is already assigned).
const bindUnknownHold = 30 * time.Second

type bindTask struct {
	pod         *corev1.Pod
	node        string
	annotations map[string]string
	gang        string // the pod's gang (gangID; "" for none)
	workload    string // the pod's workload (its gang, or itself)
	// claims are written before the binding (pods on nodes in mode dra).
	claims []dra.Planned
	// volumes binds the volumes of the pod's workload before the binding
	// (nil: none to bind).
	volumes *volumeGate
}

// New returns a scheduler.
func New(o Options, d Deps) (*Scheduler, error) {
	if o.SchedulerName == "" {
		o.SchedulerName = api.SchedulerName
	}
	if o.SchedulerName == placeholder.SchedulerName {
		return nil, fmt.Errorf("scheduler name %q is the one of placeholder pods, which no scheduler may serve: choose another", o.SchedulerName)
	}
	if o.PoolLabel == "" {
		o.PoolLabel = api.LabelNodePool
	}
	if o.Policy == "" {
		o.Policy = placement.DefaultPolicy
	}
	if o.BindWorkers <= 0 {
		o.BindWorkers = DefaultBindWorkers
	}
	if o.MaxGPUsPerPod <= 0 {
		o.MaxGPUsPerPod = 8
	}
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if o.IdleResync == 0 {
		o.IdleResync = DefaultIdleResync
	}
	if o.GangBindTimeout <= 0 {
		o.GangBindTimeout = DefaultGangBindTimeout
	}
	if o.PlaceBudget == 0 {
		o.PlaceBudget = DefaultPlaceBudget
	}
	if o.Placeholder.PoolLabel == "" {
		o.Placeholder.PoolLabel = o.PoolLabel
	}
	p, err := placement.New(o.Policy, placement.Options{Seed: o.Seed})
	if err != nil {
		return nil, err
	}
	if d.Registry == nil {
		d.Registry = prometheus.NewRegistry()
	}
	if d.Clock == nil {
		d.Clock = clock.RealClock{}
	}
	m, err := newMetrics(d.Registry)
	if err != nil {
		return nil, err
	}
	s := &Scheduler{
		opts: o, deps: d, clock: d.Clock, placer: p, metrics: m,
		wake:        make(chan struct{}, 1),
		binds:       make(chan bindTask, 4096),
		assumed:     map[types.UID]assumedPod{},
		reclaims:    newReclaimTracking(),
		statusSaid:  newLastSaid[string, string](),
		invalidSaid: newLastSaid[string, string](),
		hints:       newPlaceholderHints(),

		settle:          newNodeSettle(),
		gangPartial:     partialGangs{},
		gangEvicted:     evictionsSent{},
		strandedEvicted: evictionsSent{},
		selfEvicted:     map[types.UID]bool{},
		podGroupSaid:    newLastSaid[string, string](),
		allocator:       dra.NewAllocator(),
		inflight:        map[types.UID]inflight{},
		bindFailed:      newBindFailures(),
		stateCache:      state.NewCache(o.TimesliceResource),
		bound:           newBoundLedger(),
		said:            newPodReasons(binder.MessageRefresh),
		reserveCreated:  map[state.NodeGPU]time.Time{},
		writes:          newWriter(),
	}
	s.writes.done = func() { s.events.Add(1) }
	return s, nil
}

// Faults is a hook at moments a test stops the coordinator at (package
// faultpoint); Reached may block until ctx ends.
type Faults interface {
	Reached(ctx context.Context, point string)
}

// The fault points.
const (
	// FaultBind is reached before each binding.
	FaultBind = "bind"
	// FaultGangMemberBound is reached after a gang member's binding succeeded.
	FaultGangMemberBound = "gang-member-bound"
	// FaultReserve is reached before each reservation pod is created.
	FaultReserve = "reserve"
	// FaultReservationCreated is reached after a reservation pod was created.
	FaultReservationCreated = "reservation-created"
)

func (s *Scheduler) fault(ctx context.Context, point string) {
	if s.deps.Faults != nil {
		s.deps.Faults.Reached(ctx, point)
	}
}

// Wake asks for a cycle soon. Every informer event comes through here.
func (s *Scheduler) Wake() {
	s.events.Add(1)
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// OnPod is the pod informer's add handler: the pod goes into the cache,
// and one that shows up bound is no longer assumed.
func (s *Scheduler) OnPod(obj any) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	s.stateCache.AddPod(p)
	s.bound.changed(p)
	s.podShown(p)
}

// OnPodUpdate is the pod informer's update handler: the cache and the
// bound-pod ledger take the new object. changed says whether it changes
// what the scheduler reads; an update that does not (a container's state,
// a condition the informers drop) is equal to the object held but for its
// resourceVersion: the ledger holds it in its place, and no node is charged
// again, no pod read again, no cycle woken.
func (s *Scheduler) OnPodUpdate(old, obj any, changed bool) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	if !changed {
		s.bound.unchanged(p) // held in place of the last, not read again
		return
	}
	o, _ := old.(*corev1.Pod)
	s.stateCache.UpdatePod(o, p)
	if o != nil && o.UID != p.UID {
		// Made again under its name: the old pod is gone.
		s.bound.deleted(o)
		s.podGone(o)
	}
	s.bound.changed(p)
	s.podShown(p)
}

// podShown forgets the assumption of a pod shown bound and wakes the
// scheduler.
func (s *Scheduler) podShown(p *corev1.Pod) {
	if p.Spec.NodeName != "" {
		s.mu.Lock()
		delete(s.assumed, p.UID)
		s.mu.Unlock()
	}
	s.Wake()
}

// OnNode is the node informer's add handler.
func (s *Scheduler) OnNode(obj any) {
	if n, ok := obj.(*corev1.Node); ok {
		s.stateCache.AddNode(n)
		s.nodeEvents.Add(1)
		s.Wake()
	}
}

// OnNodeUpdate is the node informer's update handler; changed as in
// OnPodUpdate (a heartbeat changes nothing).
func (s *Scheduler) OnNodeUpdate(old, obj any, changed bool) {
	n, ok := obj.(*corev1.Node)
	if !ok || !changed {
		return
	}
	o, _ := old.(*corev1.Node)
	s.stateCache.UpdateNode(o, n)
	if o == nil || o.Labels[s.opts.PoolLabel] != n.Labels[s.opts.PoolLabel] {
		s.nodeEvents.Add(1) // what the census reads of it: its pool
	}
	s.Wake()
}

// OnNodeDelete is the node informer's delete handler.
func (s *Scheduler) OnNodeDelete(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if n, ok := obj.(*corev1.Node); ok {
		s.stateCache.DeleteNode(n)
	}
	s.nodeEvents.Add(1)
	s.Wake()
}

// noteSelfEvicted records that this scheduler evicts p itself (on), so
// that its deletion is not reported as lost work, or that the eviction
// failed (off).
func (s *Scheduler) noteSelfEvicted(p *corev1.Pod, on bool) {
	s.mu.Lock()
	if on {
		s.selfEvicted[p.UID] = true
	} else {
		delete(s.selfEvicted, p.UID)
	}
	s.mu.Unlock()
}

// OnPodDelete is the pod informer's delete handler.
func (s *Scheduler) OnPodDelete(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if p, ok := obj.(*corev1.Pod); ok {
		s.stateCache.DeletePod(p)
		s.bound.deleted(p)
		s.podGone(p)
	}
	s.Wake()
}

// podGone forgets what the scheduler holds of a pod deleted (or made again
// under its name) and reports it lost unless the scheduler evicted it.
func (s *Scheduler) podGone(p *corev1.Pod) {
	s.mu.Lock()
	delete(s.assumed, p.UID)
	self := s.selfEvicted[p.UID]
	delete(s.selfEvicted, p.UID)
	s.mu.Unlock()
	if !self {
		s.reportLost(p)
	}
}

// Run runs cycles until ctx ends: after every wake-up, at least every
// Options.Interval. Bindings run on BindWorkers goroutines.
func (s *Scheduler) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { s.writes.run(ctx, s.opts.BindWorkers) })
	for i := 0; i < s.opts.BindWorkers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.bindLoop(ctx)
		}()
	}
	defer wg.Wait()
	defer s.gates.Wait()
	t := time.NewTicker(s.opts.Interval)
	defer t.Stop()
	for {
		began := time.Now()
		s.cycleIfChanged(ctx)
		took := time.Since(began)
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
			// Batch the burst of informer events behind this wake-up, and
			// rest as long as the cycle took (at most Interval): cycles
			// take at most half a core, and leave the rest to the bind
			// workers, the informers and, on a small control-plane node,
			// the API server. Bindings do not wait: the bind queue holds
			// what earlier cycles decided.
			rest := max(20*time.Millisecond, min(took, s.opts.Interval)) - time.Since(began.Add(took))
			select {
			case <-ctx.Done():
				return
			case <-time.After(rest):
			}
		case <-t.C:
		}
	}
}

func (s *Scheduler) bindLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case t := <-s.binds:
			_ = s.runBind(ctx, t)
		}
	}
}

// runBind writes one binding. On failure the pod is no longer assumed: it
// goes back to pending and the next cycle places it again. When the outcome
// is unknown (binder.ErrBindingUnknown) it stays assumed where it was
// placed, so its GPUs keep counting, until the informer shows it bound or
// gone or bindUnknownHold passes; meanwhile no cycle places it again.
func (s *Scheduler) runBind(ctx context.Context, t bindTask) error {
	s.unsay(t.pod)
	s.fault(ctx, FaultBind)
	start := s.clock.Now()
	err := t.volumes.pass(ctx)
	if len(t.claims) > 0 && err == nil {
		// Claims first, as kube-scheduler does: the kubelet prepares them
		// once the pod is bound.
		if err = s.writeClaims(ctx, t.pod, t.claims); err != nil {
			err = fmt.Errorf("writing the claims of pod %s/%s: %w", t.pod.Namespace, t.pod.Name, err)
		}
	}
	if err == nil {
		err = s.deps.Binder.Bind(ctx, t.pod, t.node, t.annotations)
		switch {
		case err == nil || len(t.claims) == 0:
		case errors.Is(err, binder.ErrBindingUnknown):
			// The API server may have bound the pod: its claims stay
			// (taken back, a bound pod would run without its devices and
			// they would go to another pod). The pod stays assumed (below):
			// if it is bound the informer shows it, else once
			// bindUnknownHold passes a cycle finds its claims allocated and
			// binds it where they are.
			klog.FromContext(ctx).Info("Binding outcome unknown; the pod's resource claims are kept", "pod", klog.KObj(t.pod), "node", t.node)
		default:
			s.deps.DRA.Writer.Undo(ctx, t.pod, t.claims)
			s.dropInflight(t.pod.UID)
		}
	}
	s.metrics.bind(err, s.clock.Since(start))
	s.events.Add(1)
	if err == nil && t.gang != "" {
		s.fault(ctx, FaultGangMemberBound)
	}
	if err != nil {
		unknown := errors.Is(err, binder.ErrBindingUnknown)
		if !unknown {
			t.volumes.unreserve(ctx, t.pod.UID)
			s.forgetKube(ctx, t.pod)
		}
		if unknown {
			klog.FromContext(ctx).Error(err, "Binding outcome unknown; the pod stays assumed until the informer shows it", "pod", klog.KObj(t.pod), "node", t.node, "hold", bindUnknownHold)
		} else {
			klog.FromContext(ctx).Error(err, "Binding failed; the pod goes back to pending", "pod", klog.KObj(t.pod), "node", t.node)
		}
		s.mu.Lock()
		a, held := s.assumed[t.pod.UID]
		if held && unknown {
			// Not re-added when the informer already showed it bound or gone.
			a.unknown, a.since = true, s.clock.Now()
			s.assumed[t.pod.UID] = a
		} else {
			delete(s.assumed, t.pod.UID)
		}
		s.bindFailed.failed(t, err, s.clock.Now())
		s.mu.Unlock()
		if unknown && !held {
			// Shown bound (kube-scheduler's cache confirmed it) or gone
			// already: an assumption left would outlive the pod.
			s.forgetKube(ctx, t.pod)
		}
		s.Wake()
	}
	return err
}

// Result summarises one cycle.
type Result struct {
	// Bound is the number of pods sent to binding.
	Bound int
	// Pending counts pods left pending, by reason.
	Pending map[string]int
	// OldestPending is the creation time of the oldest pod left pending, by
	// reason (gpufrac_pending_pods_oldest_age_seconds).
	OldestPending map[string]time.Time
	// QueuePending counts pods left pending by their workload's queue ("" for
	// a pod whose request could not be read) and reason
	// (gpufrac_queue_pending_pods).
	QueuePending map[QueueReason]int
}

// QueueReason is a queue and a pending reason.
type QueueReason struct{ Queue, Reason string }

// pending counts p, of queue, as left pending for reason.
func (r *Result) pending(queue, reason string, p *corev1.Pod) {
	r.Pending[reason]++
	if r.QueuePending == nil {
		r.QueuePending = map[QueueReason]int{}
	}
	r.QueuePending[QueueReason{queue, reason}]++
	if r.OldestPending == nil {
		r.OldestPending = map[string]time.Time{}
	}
	if t, ok := r.OldestPending[reason]; !ok || p.CreationTimestamp.Time.Before(t) {
		r.OldestPending[reason] = p.CreationTimestamp.Time
	}
}

// settlingNodes are the nodes that became usable within NewNodeSettle
// (nodeSettle.settling): out are left out of the snapshot while they
// settle, held are placed on but bound to only once they settled. It
// wakes the scheduler the moment the first settles.
func (s *Scheduler) settlingNodes(nodes []*corev1.Node, now time.Time) (out, held map[string]bool) {
	out, held, soonest := s.settle.settling(nodes, now, s.opts.NewNodeSettle, s.recordedUsable)
	if out != nil || held != nil {
		// A cycle the moment the first settles, not up to Interval later.
		s.settle.wakeAfter(s.clock, soonest, s.Wake)
	}
	return out, held
}

// recordedUsable is when n became usable as its records tell, for a node
// whose taints this scheduler never saw: the latest of its Ready
// condition's transition (its not-ready taint goes after it), Karpenter's
// registration of it (NodeRegistered: its karpenter.sh/unregistered taint
// goes then) and, for Karpenter's nodes, its creation. The API keeps these
// times to the second, so each counts as the end of its second; and a time
// ahead of now (clock skew) counts as now, so a node settles no longer than
// NewNodeSettle from the moment it is first seen. A Karpenter node whose
// registration is not shown (NodeRegistered zero) counts as usable now.
// Zero when none is known.
// The times are the kubelet's, kube-controller-manager's and Karpenter's
// writes, none a tenant's.
func (s *Scheduler) recordedUsable(n *corev1.Node, now time.Time) time.Time {
	var at time.Time
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
			at = c.LastTransitionTime.Time
		}
	}
	if _, karpenters := n.Labels[api.LabelNodePool]; karpenters && n.CreationTimestamp.After(at) {
		at = n.CreationTimestamp.Time
	}
	if s.deps.NodeRegistered != nil {
		r := s.deps.NodeRegistered(n.Name)
		if _, karpenters := n.Labels[api.LabelNodePool]; karpenters && r.IsZero() {
			// Karpenter's node, its registration not shown: Karpenter
			// removes the unregistered taint before it writes the
			// NodeClaim's Registered condition and nodeName, and the two
			// informers list at different moments; neither the node's
			// creation nor its Ready time says when the taint went. Settle
			// from now.
			return now
		}
		if r.After(at) {
			at = r
		}
	}
	if at.IsZero() {
		return at
	}
	if at = at.Truncate(time.Second).Add(time.Second); at.After(now) {
		return now
	}
	return at
}

// DefaultNewNodeSettle is the coordinator's --new-node-settle. The settle
// guards the taint eviction race (settlingNodes), which needs the taint
// manager to learn of a taint's removal later than the coordinator learns
// of it plus a binding's round trip. Measured on the test bed
// (docs/benchmarks.md, "The taint-eviction race, measured": 800 bindings
// at each wait d after the binder's informer showed the taint gone, idle
// and under ~300 writes/s of other load), a binding at once lost 1 pod in
// 800 and none was lost at 25 ms or more; the controller was at most 30 ms
// behind the binder. 100 ms is three times that; it was 300 ms, chosen
// without data, which was all that kept new-node jobs slower than
// kube-scheduler's in the issue 16 comparison. A busier control plane may
// lag more: raise it.
const DefaultNewNodeSettle = 100 * time.Millisecond

// DefaultBindWorkers is Options.BindWorkers' default. A worker waits for
// one request at a time, so the workers bind at most BindWorkers per
// request latency: at 50,000 pods on a loaded API server 16 workers bound
// 62 pods/s while the coordinator's 200 QPS budget went half used (85,440
// requests in 800 s; docs/benchmarks-history.md, "Scale"), which is 0.26 s a
// binding. With 64 the client's rate limit is the bound again.
const DefaultBindWorkers = 64

// stageTimes collects how long each stage of a cycle took, for the
// cycle's log line (as Kueue logs its scheduling stages at V(2)).
type stageTimes struct {
	clock clock.PassiveClock
	last  time.Time
	kv    []any // stage name, duration, ...
}

// done records that the stage called name ends now.
func (t *stageTimes) done(name string) {
	now := t.clock.Now()
	t.kv = append(t.kv, name, now.Sub(t.last))
	t.last = now
}

// ReasonNodeSettling counts, in Result.Pending and gpufrac_pending_pods,
// the pods placed on a node that settles (settlingNodes): they are bound
// once it has. It is never written on a pod.
const ReasonNodeSettling = "NodeSettling"

// ReasonWaitingToBind counts, in Result.Pending and gpufrac_pending_pods,
// the pods a cycle did not place because the bind queue was full: they are
// served in order as soon as it has room. It is never written on a pod.
const ReasonWaitingToBind = "WaitingToBind"

// ReasonNextCycle counts, in Result.Pending and gpufrac_pending_pods, the
// pods a cycle did not place because its place budget (Options.PlaceBudget)
// was spent: the next cycle places them, in the same order. It is never
// written on a pod.
const ReasonNextCycle = "NextCycle"

// DefaultPlaceBudget is Options.PlaceBudget's default. At 5,000 nodes a
// cycle that placed all it could placed a bind queue's worth (4,096 pods)
// at once, and took 4 to 7 s on a loaded control-plane node while the
// cycles around it took 0.4 s (docs/benchmarks-history.md, "Scale"); the bind
// workers take a hundred or two a second, so a quarter of a second of
// placing per cycle keeps them fed.
const DefaultPlaceBudget = 250 * time.Millisecond

// placeBudget is the place stage's budget of one cycle (Options.PlaceBudget).
// It counts the time spent on workloads not placed before that were placed
// (bound, or planned to wait for reservations): one that does not fit costs
// what it did before, and never keeps the workloads behind it from their
// turn.
type placeBudget struct {
	clock  clock.PassiveClock
	limit  time.Duration // <0: none
	used   time.Duration
	began  time.Time // the current workload's start
	timing bool      // the current workload counts
	cut    bool      // a workload waits for the next cycle
}

func (s *Scheduler) placeBudget() *placeBudget {
	return &placeBudget{clock: s.clock, limit: s.opts.PlaceBudget}
}

// admit tells whether the next workload is placed this cycle; one planned in
// an earlier cycle always is (dropped, its reservations would no longer be
// wanted).
func (b *placeBudget) admit(planned bool) bool {
	b.timing = false
	if planned {
		return true
	}
	if b.cut = b.cut || (b.limit >= 0 && b.used >= b.limit); b.cut {
		return false
	}
	b.began, b.timing = b.clock.Now(), true
	return true
}

// placed records that the workload admitted last was placed.
func (b *placeBudget) placed() {
	if b.timing {
		b.used += b.clock.Since(b.began)
		b.timing = false
	}
}

// bindRoom tells whether the bind queue can take n more bindings now. An
// empty queue takes any workload, however large (its binding then waits
// for the workers).
func (s *Scheduler) bindRoom(n int) bool {
	queued := len(s.binds)
	return queued == 0 || queued+n <= cap(s.binds)
}

// isAssumed tells whether w's first pod is being bound (w was placed this cycle).
func (s *Scheduler) isAssumed(w *workload) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.assumed[w.pods[0].pod.UID]
	return a.Node, ok
}

// placePreferring places w on the preferred nodes (where its placeholders
// landed) when it fits there whole, else anywhere: a preference, never a
// requirement.
func (s *Scheduler) placePreferring(v *draCycle, snap *state.Snapshot, w *workload, prefer map[string]bool, kc *kubeChecks) ([]placement.Decision, error) {
	if len(prefer) > 0 {
		pinned := *w
		pinned.pods = make([]podInfo, len(w.pods))
		for i, p := range w.pods {
			p.Request = *withOnlyNodes(&p.Request, prefer)
			pinned.pods[i] = p
		}
		if ds, err := s.place(v, snap, &pinned, kc); err == nil {
			return ds, nil
		}
	}
	return s.place(v, snap, w, kc)
}

// place puts every pending pod of w on snap, all or nothing. A gang stays in
// one node pool: the pool of its members already bound, else the first pool
// (by name) where it fits whole. With kc, each pod also passes
// kube-scheduler's filter plugins, and is assumed into their snapshot.
func (s *Scheduler) place(v *draCycle, snap *state.Snapshot, w *workload, kc *kubeChecks) ([]placement.Decision, error) {
	pools := []string{""}
	if w.gang {
		pools = w.candidatePools(snap)
	}
	var lastErr error
	for _, pool := range pools {
		cp := snap.Checkpoint()
		m := kc.mark()
		ds, err := s.placeAll(v, snap, w, pool, kc)
		if err == nil {
			if err := snap.Commit(cp); err != nil {
				return nil, err
			}
			return ds, nil
		}
		kc.rollback(m)
		if rbErr := snap.Rollback(cp); rbErr != nil {
			return nil, rbErr
		}
		lastErr = err
	}
	if lastErr == nil {
		lastErr = fmt.Errorf("no node pool can hold the gang")
	}
	return nil, lastErr
}

func (s *Scheduler) placeAll(v *draCycle, snap *state.Snapshot, w *workload, pool string, kc *kubeChecks) ([]placement.Decision, error) {
	ds := make([]placement.Decision, 0, len(w.pods))
	for i := range w.pods {
		r := w.pods[i].Request
		if w.gang {
			r = placement.InPool(r, pool)
		}
		pc, err := kc.check(w.pods[i].pod)
		if err != nil {
			return nil, fmt.Errorf("checking pod %s as kube-scheduler does: %w", w.pods[i].pod.Name, err)
		}
		if pc != nil {
			r.Filter = podFilter{ctx: kc.ctx, pc: pc}
		}
		d, err := s.placeOne(v, snap, &r)
		if err != nil {
			if w.gang {
				return nil, fmt.Errorf("gang %s (%d pods) does not fit%s: pod %s: %w", w.key, len(w.pods), inPool(pool), w.pods[i].pod.Name, err)
			}
			return nil, err
		}
		if err := snap.Assume(&r, d); err != nil {
			return nil, err
		}
		if err := kc.placed(w.pods[i].pod, d.Node, pc); err != nil {
			return nil, fmt.Errorf("pod %s: %w", w.pods[i].pod.Name, err)
		}
		ds = append(ds, d)
	}
	return ds, nil
}

// placeOne places r, keeping fractions off nodes whose GPUs have no known
// UUIDs or are not in fraction mode.
func (s *Scheduler) placeOne(v *draCycle, snap *state.Snapshot, r *placement.Request) (placement.Decision, error) {
	exclude := map[string]bool{}
	if r.ShareMilli > 0 {
		maps.Copy(exclude, snap.NoFraction)
	}
	if v.busyPod() != "" && (r.GPUs > 0 || r.ShareMilli > 0) {
		// GPU extended resources are served there through claims too.
		maps.Copy(exclude, snap.DRANodes)
	}
	if len(exclude) == 0 {
		return s.placer.Place(snap.Snapshot, r)
	}
	return s.placer.Place(snap.Snapshot, withExcludedNodes(r, exclude))
}

func inPool(pool string) string {
	if pool == "" {
		return ""
	}
	return " in node pool " + pool
}

// bind records the assumption and queues the bindings (each with the claims
// to write before it, by pod index).
func (s *Scheduler) bind(ctx context.Context, w *workload, ds []placement.Decision, snap *state.Snapshot, claims map[int][]dra.Planned, volumes *volumeGate) {
	now := s.clock.Now()
	s.mu.Lock()
	for i, d := range ds {
		gpu := ""
		if w.pods[i].Request.ShareMilli > 0 && len(d.GPUs) == 1 {
			gpu = d.GPUs[0]
		}
		p := w.pods[i].pod
		s.assumed[p.UID] = assumedPod{Assumed: state.Assumed{Node: d.Node, GPU: gpu, Pod: types.NamespacedName{Namespace: p.Namespace, Name: p.Name}}, since: now}
	}
	s.mu.Unlock()
	tasks := make([]bindTask, 0, len(ds))
	for i, d := range ds {
		p := w.pods[i]
		ann := map[string]string{}
		if p.Request.ShareMilli > 0 && len(d.GPUs) == 1 {
			ann[api.AnnotationGPU] = d.GPUs[0]
		}
		if p.NonPreemptible {
			// Karpenter must not disrupt the node of non-preemptible work.
			ann[api.AnnotationDoNotDisrupt] = "true"
		}
		// The queue charged, and how, for the books of every later cycle
		// (and of a restarted coordinator): only bound pods that carry the
		// queue are charged, and only pods admitted non-preemptible (within
		// the deserved quota) are protected from reclaim, whatever
		// gpufrac.io/preemptible says later. A gang is admitted as one.
		ann[api.AnnotationAdmittedQueue] = w.queue
		ann[api.AnnotationAdmittedPreemptible] = strconv.FormatBool(!w.nonPreemptible)
		ann[api.AnnotationAdmittedGang] = p.GangName()
		if ref := metav1.GetControllerOf(p.pod); ref != nil && w.kueue {
			// The Kueue Workload's slot it takes (holdForKueue checked it).
			ann[api.AnnotationAdmittedOwner] = string(ref.UID)
		}
		klog.FromContext(ctx).V(4).Info("Placed pod", "pod", klog.KObj(p.pod), "node", d.Node, "gpus", d.GPUs, "queue", w.queue, "claims", describeClaims(claims[i]))
		tasks = append(tasks, bindTask{pod: p.pod, node: d.Node, annotations: ann, gang: w.id(), workload: w.key, claims: claims[i], volumes: volumes})
	}
	if volumes == nil {
		s.queueBinds(ctx, tasks)
		return
	}
	// The volumes are bound first, off the bind workers: VolumeBinding's
	// PreBind waits for the PV controller (a provisioner can take minutes),
	// and a tenant's claims that are never provisioned must not hold the
	// workers every other pod is bound by. The bindings are queued once the
	// gate passed; when it failed, each fails at once in runBind.
	s.gates.Go(func() {
		_ = volumes.pass(ctx)
		s.queueBinds(ctx, tasks)
	})
}

// queueBinds hands tasks to the bind workers; when Run ends first, what was
// not sent is forgotten.
func (s *Scheduler) queueBinds(ctx context.Context, tasks []bindTask) {
	for i, t := range tasks {
		select {
		case s.binds <- t:
		case <-ctx.Done():
			// Run is ending and its bind workers with it: forget what was not sent.
			s.mu.Lock()
			for _, q := range tasks[i:] {
				delete(s.assumed, q.pod.UID)
			}
			s.mu.Unlock()
			for _, q := range tasks[i:] {
				s.forgetKube(ctx, q.pod)
			}
			return
		}
	}
}

// reserve makes sure every GPU a fraction of w goes to is held by an
// admitted reservation. It returns "" when w can be bound now, else a message
// for its pods (after creating the missing reservations). A gang waits whole.
func (s *Scheduler) reserve(ctx context.Context, w *workload, ds []placement.Decision, snap *state.Snapshot, wanted map[state.NodeGPU]bool) string {
	if s.deps.Reserver == nil {
		return ""
	}
	var waiting []string
	for i, d := range ds {
		if w.pods[i].Request.ShareMilli == 0 || len(d.GPUs) != 1 || snap.DRANodes[d.Node] {
			// Nodes in mode dra need no reservation: a GPU shared by
			// claims consumes its counters, which keep whole-GPU claims off.
			continue
		}
		key := state.NodeGPU{Node: d.Node, GPU: d.GPUs[0]}
		wanted[key] = true
		r := snap.Reservations[key]
		if r != nil && r.Ready {
			continue
		}
		if r == nil {
			// Created by ensureReservations at the end of step 5, all at
			// once; later workloads this cycle see the same key.
			snap.AddReservation(key, &state.Reservation{Pod: nil})
		}
		waiting = append(waiting, fmt.Sprintf("GPU %s on %s", d.GPUs[0], d.Node))
	}
	if len(waiting) == 0 {
		return ""
	}
	return fmt.Sprintf("waiting for the reservation of %s to be admitted (gpufrac.io/reserved-gpu)", strings.Join(waiting, ", "))
}

// reservationNames are the names of the reservation pods in snap, held or
// failed: a name in it is taken (see reservationAttempt).
func reservationNames(snap *state.Snapshot) map[string]bool {
	taken := make(map[string]bool, len(snap.Reservations)+len(snap.FailedReservations))
	for _, r := range snap.Reservations {
		if r.Pod != nil {
			taken[r.Pod.Name] = true
		}
	}
	for _, p := range snap.FailedReservations {
		taken[p.Name] = true // until it is removed: a create would meet AlreadyExists
	}
	return taken
}

// reservationAttempt is the first attempt number whose reservation name is
// not taken by a reservation that holds another GPU (see reservation.NameAt).
func reservationAttempt(taken map[string]bool, node, gpu string) int {
	for k := 0; ; k++ {
		if !taken[reservation.NameAt(node, gpu, k)] {
			return k
		}
	}
}

// dropOversizedGangs refuses, when node pools cannot grow, gangs that need
// more GPUs than the largest pool has in all: they could never be placed.
func (s *Scheduler) dropOversizedGangs(snap *state.Snapshot, ws []*workload, invalid []invalidPod) ([]*workload, []invalidPod) {
	if s.opts.ElasticPools {
		return ws, invalid
	}
	largest := -1 // the largest pool's GPUs, counted for the first complete gang
	kept := ws[:0]
	for _, w := range ws {
		need, shares := 0, 0
		for _, p := range w.pods {
			need += p.Request.GPUs
			shares += p.Request.ShareMilli
		}
		need += (shares + placement.MilliPerGPU - 1) / placement.MilliPerGPU
		if w.gang && w.incomplete == "" && largest < 0 {
			poolGPUs := map[string]int{}
			for i := 0; i < snap.Len(); i++ {
				poolGPUs[snap.NodePool(i)] += snap.NodeGPUs(i)
			}
			largest = 0
			for _, g := range poolGPUs {
				largest = max(largest, g)
			}
		}
		if w.gang && w.incomplete == "" && need > largest {
			for _, p := range w.pods {
				invalid = append(invalid, invalidPod{pod: p.pod, message: fmt.Sprintf(
					"gang %s needs %d GPUs but the largest node pool has %d: it can never be placed whole", w.key, need, largest)})
			}
			continue
		}
		kept = append(kept, w)
	}
	return kept, invalid
}

// sortWorkloads orders workloads: queue order first, then priority, then age.
func sortWorkloads(ws []*workload, b *books) {
	rank := b.queueRank()
	sort.SliceStable(ws, func(i, j int) bool {
		a, c := ws[i], ws[j]
		if ra, rc := rank[a.queue], rank[c.queue]; ra != rc {
			return ra < rc
		}
		if a.priority != c.priority {
			return a.priority > c.priority
		}
		if !a.created.Equal(c.created) {
			return a.created.Before(c.created)
		}
		return a.key < c.key
	})
}
