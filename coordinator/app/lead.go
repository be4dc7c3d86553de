package app

import (
	"context"
	"fmt"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1alpha2 "k8s.io/api/scheduling/v1alpha2"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	batchinformers "k8s.io/client-go/informers/batch/v1"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	batchlisters "k8s.io/client-go/listers/batch/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	policylisters "k8s.io/client-go/listers/policy/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/coordinator/binder"
	"github.com/gpufrac/gpufrac/coordinator/consolidation"
	"github.com/gpufrac/gpufrac/coordinator/dra"
	"github.com/gpufrac/gpufrac/coordinator/kubecheck"
	"github.com/gpufrac/gpufrac/coordinator/kueue"
	"github.com/gpufrac/gpufrac/coordinator/placeholder"
	"github.com/gpufrac/gpufrac/coordinator/reservation"
	"github.com/gpufrac/gpufrac/coordinator/scheduler"
)

// lead runs informers and the scheduler until ctx ends: the work of the
// replica that holds the lease. Every informer is registered and every
// handler added before the informers start, and nothing is scheduled
// before their caches synced. A step that fails ends lead with its error,
// once what the earlier steps started has stopped.
func (a *App) lead(ctx context.Context) error {
	l := a.newLeader()
	if err := l.discover(ctx); err != nil {
		return err
	}
	stopEvents := l.recordEvents(ctx)
	defer stopEvents()
	if err := l.newReserver(); err != nil {
		return err
	}
	defer l.waitForRemovals()
	if err := l.newKubeChecks(ctx); err != nil {
		return err
	}
	if err := l.newScheduler(); err != nil {
		return err
	}
	if err := l.watch(); err != nil {
		return err
	}
	if err := l.newConsolidator(); err != nil {
		return err
	}
	stopInformers := l.startInformers(ctx)
	defer stopInformers()
	if err := l.waitForCaches(ctx); err != nil {
		return err
	}
	l.schedule(ctx)
	return nil
}

// leader is what one term as leader builds: the informers, what the
// optional APIs add, the event recorder, and the scheduler and
// consolidator on them. lead fills it step by step.
type leader struct {
	app *App

	// factory and dynFactory are cluster-wide (dynFactory: Queues,
	// NodeClaims, Kueue's Workloads); sysFactory watches the reservation
	// namespace.
	factory    informers.SharedInformerFactory
	dynFactory dynamicinformer.DynamicSharedInformerFactory
	sysFactory informers.SharedInformerFactory

	pods  coreinformers.PodInformer
	nodes coreinformers.NodeInformer
	// handlersSynced tell when the scheduler's pod and node handlers have
	// had the informers' first lists (its cache is whole).
	handlersSynced []cache.InformerSynced
	namespaces     coreinformers.NamespaceInformer // they name their default queue (label gpufrac.io/default-queue)
	jobs           batchinformers.JobInformer
	jobLister      batchlisters.JobLister
	queues         informers.GenericInformer
	events         cache.SharedIndexInformer // Karpenter's Nominated events on placeholders

	// What the optional APIs add, each nil when its API is not served.
	nodeClaims     cache.SharedIndexInformer // Karpenter's NodeClaims
	claimLister    cache.GenericLister       // NodeClaims by name
	claimIndex     cache.Indexer             // NodeClaims by status.nodeName
	podGroups      cache.SharedIndexInformer
	podGroupLookup func(ns, name string) (*schedulingv1alpha2.PodGroup, bool)
	podGroupStatus scheduler.PodGroupStatusWriter
	kueue          cache.SharedIndexInformer // Kueue's Workloads, by owner; nil unless Config.Kueue
	kueueLookup    kueue.Lookup
	dra            *scheduler.DRADeps
	draInformers   []cache.SharedIndexInformer // ResourceSlices, ResourceClaims, DeviceClasses

	recorder     record.EventRecorder
	reservations *reservation.Manager // nil without Config.Reservations
	reserver     scheduler.Reserver   // reservations, or nil (never a nil *Manager)
	kube         *kubecheck.Checker   // nil without Config.KubeChecks
	sched        *scheduler.Scheduler
	consolidator *consolidation.Controller // nil without Config.Consolidation
	pdbs         cache.SharedIndexInformer // PodDisruptionBudgets, for consolidation only
}

// newLeader registers the informers of the APIs the coordinator always
// reads, each object trimmed to what it reads (transform.go).
func (a *App) newLeader() *leader {
	// The informers keep only what the coordinator reads, equal parts shared.
	transform := newSharer().transform
	l := &leader{app: a}
	l.factory = informers.NewSharedInformerFactoryWithOptions(a.client, 0, informers.WithTransform(transform))
	l.pods = l.factory.Core().V1().Pods()
	l.nodes = l.factory.Core().V1().Nodes()
	l.namespaces = l.factory.Core().V1().Namespaces()
	l.jobs = l.factory.Batch().V1().Jobs()
	l.jobLister = l.jobs.Lister() // registers the informer before Start
	l.dynFactory = dynamicinformer.NewDynamicSharedInformerFactory(a.dynamic, 0)
	l.queues = l.dynFactory.ForResource(v1alpha1.QueueGVR())
	// Karpenter's Nominated events on placeholders (in the reservation
	// namespace) tell which new nodes to prefer.
	l.sysFactory = informers.NewSharedInformerFactoryWithOptions(a.client, 0, informers.WithNamespace(api.ReservationNamespace), informers.WithTransform(transform))
	l.events = l.sysFactory.Core().V1().Events().Informer()
	return l
}

// discover asks the API server, in turn, whether it serves Karpenter's
// NodeClaims, PodGroups, Kueue's Workloads (when Config.Kueue) and
// resource claims, and registers the informers of those it serves. A
// failed discovery call is retried until ctx ends (servesGroupVersion).
func (l *leader) discover(ctx context.Context) error {
	for _, step := range []func(context.Context) error{l.discoverNodeClaims, l.discoverPodGroups, l.discoverKueue, l.discoverDRA} {
		if err := step(ctx); err != nil {
			return err
		}
	}
	return nil
}

// discoverNodeClaims registers the NodeClaim informer when Karpenter's
// CRD is installed: its NodeClaims tell which new nodes to prefer, and
// the pools can grow (Scheduler.ElasticPools, kept for the process).
func (l *leader) discoverNodeClaims(ctx context.Context) error {
	serves, err := servesGroupVersion(ctx, l.app.client.Discovery(), nodeClaimGVR.GroupVersion().String())
	if err != nil || !serves {
		return err
	}
	inf := l.dynFactory.ForResource(nodeClaimGVR)
	if err := inf.Informer().AddIndexers(cache.Indexers{nodeClaimByNode: nodeClaimNode}); err != nil {
		return fmt.Errorf("indexing NodeClaims by node: %w", err)
	}
	l.claimLister, l.claimIndex = inf.Lister(), inf.Informer().GetIndexer()
	l.nodeClaims = inf.Informer()
	l.app.cfg.Scheduler.ElasticPools = true // Karpenter can grow the pools
	return nil
}

// discoverPodGroups registers the PodGroup informer when
// scheduling.k8s.io/v1alpha2 is served (Kubernetes 1.36 with the
// GenericWorkload gate): a pod's spec.schedulingGroup names its gang.
func (l *leader) discoverPodGroups(ctx context.Context) error {
	serves, err := servesGroupVersion(ctx, l.app.client.Discovery(), schedulingv1alpha2.SchemeGroupVersion.String())
	if err != nil || !serves {
		return err
	}
	pgInf := l.factory.Scheduling().V1alpha2().PodGroups()
	l.podGroups = pgInf.Informer()
	l.podGroupLookup = func(ns, name string) (*schedulingv1alpha2.PodGroup, bool) {
		pg, err := pgInf.Lister().PodGroups(ns).Get(name)
		return pg, err == nil
	}
	l.podGroupStatus = scheduler.ClientPodGroupStatus{Client: l.app.client}
	return nil
}

// discoverKueue registers the informer of Kueue's Workloads, for the
// queues whose quota Kueue keeps, when Config.Kueue asks for it and
// kueue.x-k8s.io/v1beta2 is served.
func (l *leader) discoverKueue(ctx context.Context) error {
	if !l.app.cfg.Kueue {
		return nil
	}
	serves, err := servesGroupVersion(ctx, l.app.client.Discovery(), kueue.WorkloadResource.GroupVersion().String())
	if err != nil {
		return err
	}
	if !serves {
		klog.FromContext(ctx).Info("Kueue's API (kueue.x-k8s.io/v1beta2) is not served: the pods of queues whose quota Kueue keeps wait until it is and the coordinator restarts")
		return nil
	}
	inf := l.dynFactory.ForResource(kueue.WorkloadResource).Informer()
	if err := inf.AddIndexers(cache.Indexers{kueue.OwnerIndex: kueue.OwnerIndexFunc}); err != nil {
		return fmt.Errorf("indexing Kueue Workloads by owner: %w", err)
	}
	l.kueue = inf
	l.kueueLookup = kueueWorkloads(klog.FromContext(ctx), inf.GetIndexer())
	return nil
}

// discoverDRA registers the informers of resource claims, slices and
// device classes when resource.k8s.io/v1 is served (Kubernetes 1.34 on):
// the coordinator allocates its pods' claims on nodes in mode dra. With
// NoDRA (--dra=false) it reads none of them, as if not served.
func (l *leader) discoverDRA(ctx context.Context) error {
	if l.app.cfg.NoDRA {
		klog.FromContext(ctx).Info("DRA is turned off (--dra=false): resource.k8s.io is not read, resource claims are left to other schedulers")
		return nil
	}
	serves, err := servesGroupVersion(ctx, l.app.client.Discovery(), resourceapi.SchemeGroupVersion.String())
	if err != nil {
		return err
	}
	if !serves {
		klog.FromContext(ctx).Info("The API server serves no resource.k8s.io/v1: resource claims are left to other schedulers")
		return nil
	}
	sliceInf := l.factory.Resource().V1().ResourceSlices()
	claimInf := l.factory.Resource().V1().ResourceClaims()
	classInf := l.factory.Resource().V1().DeviceClasses()
	l.dra = &scheduler.DRADeps{
		Slices: func() ([]*resourceapi.ResourceSlice, error) { return sliceInf.Lister().List(labels.Everything()) },
		Claims: func() ([]*resourceapi.ResourceClaim, error) { return claimInf.Lister().List(labels.Everything()) },
		GetClaim: func(ns, name string) (*resourceapi.ResourceClaim, bool) {
			c, err := claimInf.Lister().ResourceClaims(ns).Get(name)
			return c, err == nil
		},
		Classes: dra.Classes{Lister: classInf.Lister()},
		Writer:  dra.NewWriter(l.app.client),
	}
	l.draInformers = []cache.SharedIndexInformer{sliceInf.Informer(), claimInf.Informer(), classInf.Informer()}
	return nil
}

// recordEvents starts the event broadcaster, on the App's event client of
// its own, and returns what shuts it down.
func (l *leader) recordEvents(ctx context.Context) (stop func()) {
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: l.app.events.CoreV1().Events("")})
	l.recorder = broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: api.SchedulerName})
	return broadcaster.Shutdown
}

// newReserver makes the reservation manager when Config.Reservations. Its
// removals run in the background, so as not to hold the scheduling cycle
// (docs/benchmarks-history.md, "Scale"); waitForRemovals waits for them.
func (l *leader) newReserver() error {
	if !l.app.cfg.Reservations {
		return nil
	}
	rm := reservation.NewManager(l.app.client, l.recorder, l.app.cfg.Reservation, nil)
	rm.RemoveInBackground(reservationRemovers)
	if err := rm.Register(l.app.reg); err != nil {
		return fmt.Errorf("registering reservation metrics: %w", err)
	}
	l.reservations, l.reserver = rm, rm
	return nil
}

// waitForRemovals waits for the reservation pods being deleted in the
// background: deletions decided under the lease end before it is released.
func (l *leader) waitForRemovals() {
	if l.reservations != nil {
		l.reservations.Wait()
	}
}

// newKubeChecks makes kube-scheduler's checks when Config.KubeChecks. It
// runs before the informers start: its plugins register their informers
// (PVs, PVCs, StorageClasses, CSI objects) in the factory, and its cache
// is fed the pods and nodes by handlers of its own, added before the
// scheduler's.
func (l *leader) newKubeChecks(ctx context.Context) error {
	if !l.app.cfg.KubeChecks {
		return nil
	}
	kube, err := kubecheck.New(ctx, kubecheck.Options{Factory: l.factory, Client: l.app.client})
	if err != nil {
		return err
	}
	logger := klog.FromContext(ctx)
	if _, err := l.pods.Informer().AddEventHandler(kube.PodHandler(logger)); err != nil {
		return fmt.Errorf("feeding kube-scheduler's cache pods: %w", err)
	}
	if _, err := l.nodes.Informer().AddEventHandler(kube.NodeHandler(logger)); err != nil {
		return fmt.Errorf("feeding kube-scheduler's cache nodes: %w", err)
	}
	l.kube = kube
	return nil
}

// newScheduler makes the scheduler on the informers' listers, the binder,
// the reserver, placeholders (when Config.Placeholders) and what the
// optional APIs add.
func (l *leader) newScheduler() error {
	a := l.app
	a.cfg.Scheduler.Placeholder.Prices = a.cfg.Prices
	bnd := binder.New(a.client, l.recorder)
	var placeholders scheduler.Placeholders
	if a.cfg.Placeholders {
		placeholders = placeholder.NewManager(a.client, l.recorder)
	}
	var kueueSynced func() bool
	if l.kueue != nil {
		kueueSynced = l.kueue.HasSynced
	}
	sched, err := scheduler.New(a.cfg.Scheduler, scheduler.Deps{
		Pods:       l.pods.Lister(),
		Nodes:      l.nodes.Lister(),
		Namespaces: l.namespaces.Lister(),
		Jobs: func(ns, name string) (*batchv1.Job, bool) {
			j, err := l.jobLister.Jobs(ns).Get(name)
			return j, err == nil
		},
		PodGroups:      l.podGroupLookup,
		PodGroupStatus: l.podGroupStatus,
		Kueue:          l.kueueLookup,
		KueueSynced:    kueueSynced,
		Queues:         scheduler.QueuesFromLister(l.queues.Lister()),
		Binder:         bnd,
		Evictor:        bnd,
		Releaser:       bnd,
		Reserver:       l.reserver,
		NodeClaims:     l.nodeOfClaim,
		NodeRegistered: l.nodeRegistered,
		NodeDrifted:    l.nodeDrifted,
		Placeholders:   placeholders,
		Status:         scheduler.DynamicStatusWriter{Client: a.dynamic},
		Recorder:       l.recorder,
		Faults:         a.cfg.Faults,
		Registry:       a.reg,
		DRA:            l.dra,
		Kube:           l.kube,
	})
	if err != nil {
		return err
	}
	l.sched = sched
	return nil
}

// nodeOfClaim is the node NodeClaim name became ("" when none, or
// without Karpenter).
func (l *leader) nodeOfClaim(name string) string {
	if l.claimLister == nil {
		return ""
	}
	obj, err := l.claimLister.Get(name)
	if err != nil {
		return ""
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return ""
	}
	n, _, _ := unstructured.NestedString(u.Object, "status", "nodeName")
	return n
}

// nodeRegistered is when Karpenter registered and initialized node, the
// latest of its NodeClaims' times (zero when none, or without Karpenter).
func (l *leader) nodeRegistered(node string) time.Time {
	if l.claimIndex == nil {
		return time.Time{}
	}
	objs, err := l.claimIndex.ByIndex(nodeClaimByNode, node)
	if err != nil {
		return time.Time{}
	}
	var at time.Time
	for _, obj := range objs {
		if u, ok := obj.(*unstructured.Unstructured); ok {
			if t := nodeClaimRegistered(u); t.After(at) {
				at = t
			}
		}
	}
	return at
}

// nodeDrifted tells whether a NodeClaim of node is Drifted (false without
// Karpenter's CRD, or when none names the node).
func (l *leader) nodeDrifted(node string) bool {
	if l.claimIndex == nil {
		return false
	}
	objs, err := l.claimIndex.ByIndex(nodeClaimByNode, node)
	if err != nil {
		return false
	}
	for _, obj := range objs {
		if u, ok := obj.(*unstructured.Unstructured); ok && nodeClaimDrifted(u) {
			return true
		}
	}
	return false
}

// watch adds the scheduler's event handlers, before the informers start:
// pods are handed to it (an update only when something it reads
// changed), Karpenter's events too, and every other event of what it
// reads wakes it (a node's only when something it reads changed).
func (l *leader) watch() error {
	sched := l.sched
	wake := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { sched.Wake() },
		UpdateFunc: func(_, _ any) { sched.Wake() },
		DeleteFunc: func(any) { sched.Wake() },
	}
	// Pods and nodes feed the scheduler's cache and bound-pod ledger: every
	// event that changes what the scheduler reads (changed), which wakes it.
	podReg, err := l.pods.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    sched.OnPod,
		UpdateFunc: func(old, obj any) { sched.OnPodUpdate(old, obj, changed(old, obj)) },
		DeleteFunc: sched.OnPodDelete,
	})
	if err != nil {
		return fmt.Errorf("watching pods: %w", err)
	}
	nodeReg, err := l.nodes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    sched.OnNode,
		UpdateFunc: func(old, obj any) { sched.OnNodeUpdate(old, obj, changed(old, obj)) },
		DeleteFunc: sched.OnNodeDelete,
	})
	if err != nil {
		return fmt.Errorf("watching nodes: %w", err)
	}
	// The cache is whole once these handlers have had the informers'
	// first lists, not when the informers have synced (waitForCaches).
	l.handlersSynced = []cache.InformerSynced{podReg.HasSynced, nodeReg.HasSynced}
	// A pending pod of a Job waits for the Job in the cache (its gang is
	// read from it): the Job's arrival must wake the cycle.
	if _, err := l.jobs.Informer().AddEventHandler(wake); err != nil {
		return fmt.Errorf("watching jobs: %w", err)
	}
	if _, err := l.namespaces.Informer().AddEventHandler(wake); err != nil {
		return fmt.Errorf("watching namespaces: %w", err)
	}
	if _, err := l.queues.Informer().AddEventHandler(wake); err != nil {
		return fmt.Errorf("watching queues: %w", err)
	}
	if _, err := l.events.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    sched.OnEvent,
		UpdateFunc: func(_, obj any) { sched.OnEvent(obj) },
	}); err != nil {
		return fmt.Errorf("watching events: %w", err)
	}
	if l.podGroups != nil {
		if _, err := l.podGroups.AddEventHandler(wake); err != nil {
			return fmt.Errorf("watching PodGroups: %w", err)
		}
	}
	if l.kube != nil {
		// Not waited for: pods that need the checks wait for them
		// (KubeChecksNotReady) and the rest is scheduled, should RBAC keep
		// them from syncing.
		if _, err := l.factory.Core().V1().PersistentVolumeClaims().Informer().AddEventHandler(wake); err != nil {
			return fmt.Errorf("watching claims: %w", err)
		}
		if _, err := l.factory.Core().V1().PersistentVolumes().Informer().AddEventHandler(wake); err != nil {
			return fmt.Errorf("watching volumes: %w", err)
		}
	}
	for _, inf := range l.draInformers {
		if _, err := inf.AddEventHandler(wake); err != nil {
			return fmt.Errorf("watching resource claims, slices and classes: %w", err)
		}
	}
	if l.nodeClaims != nil {
		// A NodeClaim's registration times settle its node (see
		// scheduler.NodeRegistrations).
		if _, err := l.nodeClaims.AddEventHandler(wake); err != nil {
			return fmt.Errorf("watching NodeClaims: %w", err)
		}
	}
	if l.kueue != nil {
		// An admission lets pods of a Kueue queue be placed. Not waited
		// for with the others: a coordinator that may not list Workloads
		// (the right comes with the chart's kueue.enabled) still schedules
		// every other queue, and the pods of Kueue queues say why they wait.
		if _, err := l.kueue.AddEventHandler(wake); err != nil {
			return fmt.Errorf("watching Kueue Workloads: %w", err)
		}
	}
	return nil
}

// newConsolidator makes the consolidation controller when
// Config.Consolidation, on an informer of PodDisruptionBudgets of its own.
func (l *leader) newConsolidator() error {
	if !l.app.cfg.Consolidation {
		return nil
	}
	pdbInf := l.factory.Policy().V1().PodDisruptionBudgets()
	c, err := l.app.consolidator(l.recorder, l.pods.Lister(), l.nodes.Lister(), pdbInf.Lister(), l.jobLister, l.nodeDrifted)
	if err != nil {
		return err
	}
	l.consolidator, l.pdbs = c, pdbInf.Informer()
	return nil
}

// startInformers starts every informer registered so far, and returns
// what stops them: the factories' Shutdown waits for their goroutines,
// which end with ctx.
func (l *leader) startInformers(ctx context.Context) (stop func()) {
	l.factory.Start(ctx.Done())
	l.dynFactory.Start(ctx.Done())
	l.sysFactory.Start(ctx.Done())
	return func() {
		l.sysFactory.Shutdown()
		l.dynFactory.Shutdown()
		l.factory.Shutdown()
	}
}

// waitForCaches waits until the informers of what is scheduled from have
// synced, then calls the App ready (Ready): nothing is scheduled from a
// partial view. PVs, PVCs and the other informers of kube-scheduler's
// checks, and Kueue's Workloads, are not waited for (see watch).
func (l *leader) waitForCaches(ctx context.Context) error {
	synced := []cache.InformerSynced{l.pods.Informer().HasSynced, l.nodes.Informer().HasSynced, l.namespaces.Informer().HasSynced,
		l.jobs.Informer().HasSynced, l.queues.Informer().HasSynced, l.events.HasSynced}
	for _, inf := range append([]cache.SharedIndexInformer{l.nodeClaims, l.pdbs, l.podGroups}, l.draInformers...) {
		if inf != nil {
			synced = append(synced, inf.HasSynced)
		}
	}
	synced = append(synced, l.handlersSynced...)
	if !cache.WaitForNamedCacheSyncWithContext(ctx, synced...) {
		return fmt.Errorf("waiting for informers: %w", ctx.Err())
	}
	l.app.synced.Store(true)
	return nil
}

// schedule runs the scheduling cycle, and the consolidation controller
// beside it, until ctx ends; it returns once both have.
func (l *leader) schedule(ctx context.Context) {
	klog.FromContext(ctx).Info("Caches synced; scheduling", "scheduler", l.app.cfg.Scheduler.SchedulerName, "consolidation", l.app.cfg.Consolidation)
	var wg sync.WaitGroup
	if l.consolidator != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.consolidator.Run(ctx)
		}()
	}
	l.sched.Run(ctx)
	wg.Wait()
}

// consolidator builds the consolidation controller on the informers' listers.
func (a *App) consolidator(recorder record.EventRecorder, pods corelisters.PodLister, nodes corelisters.NodeLister,
	pdbs policylisters.PodDisruptionBudgetLister, jobs batchlisters.JobLister, drifted scheduler.NodeDrift) (*consolidation.Controller, error) {
	o := a.cfg.ConsolidationOptions
	s := a.cfg.Scheduler
	o.Planner.SchedulerName, o.Planner.PoolLabel, o.Planner.Policy, o.Planner.Seed = s.SchedulerName, s.PoolLabel, s.Policy, s.Seed
	o.Planner.TimesliceResource, o.Planner.Prices = s.TimesliceResource, a.cfg.Prices
	o.Planner.NonPreemptiblePriority = s.NonPreemptiblePriority
	o.Planner.Jobs = func(ns, name string) (*batchv1.Job, bool) {
		j, err := jobs.Jobs(ns).Get(name)
		return j, err == nil
	}
	read := func() (consolidation.Cluster, error) {
		var c consolidation.Cluster
		var err error
		if c.Nodes, err = nodes.List(labels.Everything()); err != nil {
			return c, fmt.Errorf("listing nodes: %w", err)
		}
		if c.Pods, err = pods.List(labels.Everything()); err != nil {
			return c, fmt.Errorf("listing pods: %w", err)
		}
		if c.PDBs, err = pdbs.List(labels.Everything()); err != nil {
			return c, fmt.Errorf("listing PodDisruptionBudgets: %w", err)
		}
		if s.AvoidDriftedNodes && drifted != nil {
			for _, n := range c.Nodes {
				if drifted(n.Name) {
					if c.Drifted == nil {
						c.Drifted = map[string]bool{}
					}
					c.Drifted[n.Name] = true
				}
			}
		}
		return c, nil
	}
	return consolidation.New(o, read, consolidation.APIWriter{Client: a.client}, recorder, clock.RealClock{}, a.reg)
}

// kueueWorkloads answers the Workloads an owner has, from the informer's
// owner index. One that does not read (a schema Kueue changed) is logged
// and left out: its pods wait.
func kueueWorkloads(logger klog.Logger, idx cache.Indexer) kueue.Lookup {
	return func(namespace string, owner types.UID) []*kueue.Workload {
		objs, err := idx.ByIndex(kueue.OwnerIndex, string(owner))
		if err != nil {
			return nil
		}
		var ws []*kueue.Workload
		for _, o := range objs {
			u, ok := o.(*unstructured.Unstructured)
			if !ok || u.GetNamespace() != namespace {
				continue
			}
			w, err := kueue.FromUnstructured(u)
			if err != nil {
				logger.Error(err, "Skipping a Kueue Workload")
				continue
			}
			ws = append(ws, w)
		}
		return ws
	}
}
