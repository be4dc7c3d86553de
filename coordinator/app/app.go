// Package app is gpufrac-coordinator's composition root: informers, leader
// election, the scheduler and the metrics/probe server.
package app

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1alpha2 "k8s.io/api/scheduling/v1alpha2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	batchlisters "k8s.io/client-go/listers/batch/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	policylisters "k8s.io/client-go/listers/policy/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
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
	"github.com/gpufrac/gpufrac/coordinator/pricing"
	"github.com/gpufrac/gpufrac/coordinator/reservation"
	"github.com/gpufrac/gpufrac/coordinator/scheduler"
)

// nodeClaimGVR is Karpenter's NodeClaim resource.
var nodeClaimGVR = schema.GroupVersionResource{Group: "karpenter.sh", Version: "v1", Resource: "nodeclaims"}

// nodeClaimByNode is the index of NodeClaims by the node they became.
const nodeClaimByNode = "nodeName"

// nodeClaimNode indexes a NodeClaim by its status.nodeName.
func nodeClaimNode(obj any) ([]string, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, nil
	}
	if n, _, _ := unstructured.NestedString(u.Object, "status", "nodeName"); n != "" {
		return []string{n}, nil
	}
	return nil, nil
}

// nodeClaimRegistered is the latest lastTransitionTime of a NodeClaim's
// Registered and Initialized conditions that are True: Karpenter removes the
// node's karpenter.sh/unregistered taint (NoExecute) as it registers it, and
// its startup taints before it calls it initialized. Zero when neither is
// True or a time does not parse. NodeClaims are Karpenter's to write.
func nodeClaimRegistered(u *unstructured.Unstructured) time.Time {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	var at time.Time
	for _, c := range conds {
		m, ok := c.(map[string]any)
		if !ok || (m["type"] != "Registered" && m["type"] != "Initialized") || m["status"] != "True" {
			continue
		}
		s, _ := m["lastTransitionTime"].(string)
		if t, err := time.Parse(time.RFC3339, s); err == nil && t.After(at) {
			at = t
		}
	}
	return at
}

// Config is the coordinator's configuration, filled from flags by main.
type Config struct {
	// LeaderElect turns on leader election on a Lease.
	LeaderElect bool
	// LeaseNamespace and LeaseName name the Lease.
	LeaseNamespace, LeaseName string
	// Identity is this replica's identity in the Lease (default: hostname + pid).
	Identity string
	// LeaseDuration, RenewDeadline and RetryPeriod tune leader election.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Scheduler configures the scheduling cycle.
	Scheduler scheduler.Options
	// Placeholders turns on placeholder pods that ask the autoscaler for capacity.
	Placeholders bool
	// Reservations turns on reservation pods for shared GPUs.
	Reservations bool
	// Reservation configures reservation pods.
	Reservation reservation.Options
	// QPS and Burst are the API client's rate limit (bindings, reservation
	// pods, status writes; events have a client of their own with the
	// same limit). Zero means DefaultQPS and DefaultBurst.
	QPS   float32
	Burst int
	// Consolidation turns on GPU-aware consolidation (coordinator/consolidation).
	Consolidation bool
	// ConsolidationOptions configure it; the scheduler's name, pool label,
	// policy, seed, replica resource and non-preemptible priority are
	// copied from Scheduler.
	ConsolidationOptions consolidation.Options
	// Prices is the admin's price table (nil: none). Placeholders ask for
	// the cheapest instance types it lists; consolidation drains the node
	// whose removal saves the most.
	Prices *pricing.Table
	// Kueue turns on reading Kueue's Workloads (kueue.x-k8s.io/v1beta2) for
	// the queues whose quota Kueue keeps; the chart grants the right with
	// it (kueue.enabled).
	Kueue bool
	// NoDRA leaves resource.k8s.io alone, as on a cluster that does not
	// serve it: no informers on ResourceSlices, ResourceClaims and
	// DeviceClasses, pods' claims left to other schedulers. The chart sets
	// it with dra.enabled: false, which grants no RBAC there.
	NoDRA bool
	// KubeChecks runs kube-scheduler's filter plugins (volumes, topology
	// spread, inter-pod affinity, host ports) for the pods that use them,
	// and binds their volumes before them (coordinator/kubecheck). The chart
	// grants the reads of PVs, PVCs, StorageClasses and CSI objects and the
	// volume binding writes it needs.
	KubeChecks bool
	// Version is reported in gpufrac_build_info.
	Version string
	// Faults pauses the coordinator at a fault point: set only by binaries
	// built with -tags faultinject, for the chaos suite.
	Faults scheduler.Faults
}

// DefaultQPS and DefaultBurst are the API client's default rate limit.
// Binding is one request per pod (fractions' annotations ride on the
// Binding): they allow bursts like kube-scheduler's defaults do (50 QPS,
// 100 burst) and more.
const (
	DefaultQPS   = 200
	DefaultBurst = 400
)

// reservationRemovers is how many reservation pods the coordinator deletes
// at once in the background.
const reservationRemovers = 16

// App is a running coordinator.
type App struct {
	cfg    Config
	rest   *rest.Config
	client kubernetes.Interface
	// events records events through a client of its own, as kube-scheduler
	// does: its rate limiter is not the one bindings wait on.
	events kubernetes.Interface
	// election renews the lease through a client of its own, as kube-scheduler's
	// does: behind a burst of bindings in the shared client's rate limiter a
	// renewal would miss its deadline and the replica would lose the lease.
	election kubernetes.Interface
	dynamic  dynamic.Interface
	reg      *prometheus.Registry
	leading  atomic.Bool
	synced   atomic.Bool
	// leadFn is the work done while leading: lead, or a test's stand-in.
	leadFn func(ctx context.Context) error
}

// New returns a coordinator talking to the API server of rc.
func New(cfg Config, rc *rest.Config) (*App, error) {
	rc = rest.CopyConfig(rc)
	rc.UserAgent = "gpufrac-coordinator"
	rc.QPS, rc.Burst = cfg.QPS, cfg.Burst
	if rc.QPS <= 0 {
		rc.QPS = DefaultQPS
	}
	if rc.Burst <= 0 {
		rc.Burst = DefaultBurst
	}
	if cfg.Scheduler.ReservationReportDelay == 0 {
		cfg.Scheduler.ReservationReportDelay = scheduler.DefaultReservationReportDelay
	}
	if cfg.Scheduler.GangReportDelay == 0 {
		cfg.Scheduler.GangReportDelay = scheduler.DefaultGangReportDelay
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("building client: %w", err)
	}
	events, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("building event client: %w", err)
	}
	erc := rest.CopyConfig(rc)
	erc.UserAgent = "gpufrac-coordinator/leader-election"
	election, err := kubernetes.NewForConfig(erc)
	if err != nil {
		return nil, fmt.Errorf("building leader-election client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("building dynamic client: %w", err)
	}
	if cfg.Identity == "" {
		host, _ := os.Hostname()
		cfg.Identity = fmt.Sprintf("%s_%d", host, os.Getpid())
	}
	a := &App{cfg: cfg, rest: rc, client: client, events: events, election: election, dynamic: dyn,
		reg: prometheus.NewRegistry()}
	a.leadFn = a.lead
	if err := a.registerMetrics(); err != nil {
		return nil, fmt.Errorf("registering metrics: %w", err)
	}
	return a, nil
}

// Leading tells whether this replica holds the lease (always true without leader election).
func (a *App) Leading() bool { return a.leading.Load() }

// Registry is the coordinator's metrics registry.
func (a *App) Registry() *prometheus.Registry { return a.reg }

// Ready returns nil when the replica can do its work, and the reason
// otherwise (for /readyz): caches synced as leader, or standing by. A
// standby replica is healthy; it simply waits for the lease.
func (a *App) Ready() error {
	if a.leading.Load() && !a.synced.Load() {
		return errors.New("caches not synced")
	}
	return nil
}

// Run schedules while leading, until ctx ends (the main serves Registry and
// Ready). Losing the lease ends Run with an error, so the process restarts
// and never schedules from a stale view; work under the lease that fails
// ends Run with its error.
//
// Everything under the lease stops before the lease is released (the
// client-go leader-election example's warning): client-go's elector, with
// ReleaseOnCancel, gives the lease up as soon as its context ends while
// OnStartedLeading's goroutine may still run. So the elector runs on a
// context of its own, which is cancelled only once the work returned.
func (a *App) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	if !a.cfg.LeaderElect {
		a.leading.Store(true)
		defer a.leading.Store(false)
		return a.leadFn(ctx)
	}
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, a.cfg.LeaseNamespace, a.cfg.LeaseName,
		a.election.CoreV1(), a.election.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: a.cfg.Identity})
	if err != nil {
		return fmt.Errorf("creating lease lock: %w", err)
	}

	// electCtx outlives ctx until the work has stopped; it keeps ctx's logger.
	electCtx, stopElecting := context.WithCancel(context.WithoutCancel(ctx))
	defer stopElecting()
	var (
		mu       sync.Mutex // guards closing and working
		closing  bool       // Run is ending: no work starts any more
		working  bool       // the work under the lease was started
		workDone = make(chan error, 1)
	)
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		ReleaseOnCancel: true,
		LeaseDuration:   a.cfg.LeaseDuration,
		RenewDeadline:   a.cfg.RenewDeadline,
		RetryPeriod:     a.cfg.RetryPeriod,
		Name:            a.cfg.LeaseName,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(lctx context.Context) {
				mu.Lock()
				if closing {
					mu.Unlock()
					return
				}
				working = true
				mu.Unlock()
				// The work ends when the lease is lost (lctx) or Run's ctx ends.
				wctx, cancel := context.WithCancel(lctx)
				stop := context.AfterFunc(ctx, cancel)
				logger.Info("Started leading", "identity", a.cfg.Identity)
				a.leading.Store(true)
				err := a.leadFn(wctx)
				a.leading.Store(false)
				stop()
				cancel()
				workDone <- err
			},
			OnStoppedLeading: func() { a.leading.Store(false) },
		},
	})
	if err != nil {
		return fmt.Errorf("configuring leader election: %w", err)
	}
	electorDone := make(chan struct{})
	go func() {
		defer close(electorDone)
		le.Run(electCtx)
	}()

	var workErr error
	lost := false
	select {
	case <-ctx.Done():
	case workErr = <-workDone:
		mu.Lock()
		working = false
		mu.Unlock()
	case <-electorDone:
		lost = true // renewing failed: the elector cancelled the work's context
	}
	mu.Lock()
	closing = true
	wait := working
	mu.Unlock()
	if wait {
		workErr = <-workDone // the work stops before the lease is released
	}
	stopElecting() // releases the lease if still held
	<-electorDone
	switch {
	case workErr != nil:
		return workErr
	case ctx.Err() == nil:
		// The work ends by itself only when the lease was lost.
		return fmt.Errorf("lost the lease %s/%s: leadership lost (renewing failed: %v)", a.cfg.LeaseNamespace, a.cfg.LeaseName, lost)
	}
	return nil
}

// lead runs informers and the scheduler until ctx ends.
// discoveryBackoff paces the retries of a failed discovery call.
var discoveryBackoff = wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: math.MaxInt32, Cap: 10 * time.Second}

// servesGroupVersion says whether the API server serves gv. Only NotFound
// means no; any other error is retried with backoff until ctx ends, since
// turning Karpenter's or DRA's part off for a whole leadership on one
// failed call would place pods as if neither existed.
func servesGroupVersion(ctx context.Context, disc discovery.DiscoveryInterface, gv string) (bool, error) {
	logger := klog.FromContext(ctx)
	var serves bool
	err := wait.ExponentialBackoffWithContext(ctx, discoveryBackoff, func(context.Context) (bool, error) {
		_, err := disc.ServerResourcesForGroupVersion(gv)
		switch {
		case err == nil:
			serves = true
			return true, nil
		case apierrors.IsNotFound(err):
			return true, nil
		}
		logger.Error(err, "Discovering an API group failed; retrying", "groupVersion", gv)
		return false, nil
	})
	if err != nil {
		return false, fmt.Errorf("discovering %s: %w", gv, err)
	}
	return serves, nil
}

func (a *App) lead(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	// The informers keep only what the coordinator reads, equal parts shared
	// (transform.go).
	transform := newSharer().transform
	factory := informers.NewSharedInformerFactoryWithOptions(a.client, 0, informers.WithTransform(transform))
	podInf := factory.Core().V1().Pods()
	nodeInf := factory.Core().V1().Nodes()
	// Namespaces name their default queue (label gpufrac.io/default-queue).
	nsInf := factory.Core().V1().Namespaces()
	jobInf := factory.Batch().V1().Jobs()
	jobLister := jobInf.Lister() // registers the informer before Start
	dynFactory := dynamicinformer.NewDynamicSharedInformerFactory(a.dynamic, 0)
	queueInf := dynFactory.ForResource(v1alpha1.QueueGVR())

	// Karpenter's Nominated events on placeholders (in the reservation
	// namespace), and its NodeClaims when the CRD is installed, tell which
	// new nodes to prefer.
	sysFactory := informers.NewSharedInformerFactoryWithOptions(a.client, 0, informers.WithNamespace(api.ReservationNamespace), informers.WithTransform(transform))
	eventInf := sysFactory.Core().V1().Events().Informer()
	var claimLister cache.GenericLister
	var claimIndex cache.Indexer // NodeClaims by status.nodeName
	var claimSynced cache.InformerSynced = func() bool { return true }
	var nodeClaimInf cache.SharedIndexInformer
	servesClaims, err := servesGroupVersion(ctx, a.client.Discovery(), nodeClaimGVR.GroupVersion().String())
	if err != nil {
		return err
	}
	if servesClaims {
		inf := dynFactory.ForResource(nodeClaimGVR)
		if err := inf.Informer().AddIndexers(cache.Indexers{nodeClaimByNode: nodeClaimNode}); err != nil {
			return fmt.Errorf("indexing NodeClaims by node: %w", err)
		}
		claimLister, claimSynced, claimIndex = inf.Lister(), inf.Informer().HasSynced, inf.Informer().GetIndexer()
		nodeClaimInf = inf.Informer()
		a.cfg.Scheduler.ElasticPools = true // Karpenter can grow the pools
	}

	// PodGroups (scheduling.k8s.io/v1alpha2, Kubernetes 1.36 with the
	// GenericWorkload gate): a pod's spec.schedulingGroup names its gang.
	var podGroups func(ns, name string) (*schedulingv1alpha2.PodGroup, bool)
	var podGroupStatus scheduler.PodGroupStatusWriter
	var podGroupInf cache.SharedIndexInformer
	servesPodGroups, err := servesGroupVersion(ctx, a.client.Discovery(), schedulingv1alpha2.SchemeGroupVersion.String())
	if err != nil {
		return err
	}
	if servesPodGroups {
		pgInf := factory.Scheduling().V1alpha2().PodGroups()
		podGroupInf = pgInf.Informer()
		podGroups = func(ns, name string) (*schedulingv1alpha2.PodGroup, bool) {
			pg, err := pgInf.Lister().PodGroups(ns).Get(name)
			return pg, err == nil
		}
		podGroupStatus = scheduler.ClientPodGroupStatus{Client: a.client}
	}

	// Kueue's Workloads, for the queues whose quota Kueue keeps.
	var kueueLookup kueue.Lookup
	var kueueInf cache.SharedIndexInformer
	var kueueSynced func() bool
	if a.cfg.Kueue {
		servesKueue, err := servesGroupVersion(ctx, a.client.Discovery(), kueue.WorkloadResource.GroupVersion().String())
		if err != nil {
			return err
		}
		if servesKueue {
			kueueInf = dynFactory.ForResource(kueue.WorkloadResource).Informer()
			if err := kueueInf.AddIndexers(cache.Indexers{kueue.OwnerIndex: kueue.OwnerIndexFunc}); err != nil {
				return fmt.Errorf("indexing Kueue Workloads by owner: %w", err)
			}
			kueueLookup = kueueWorkloads(logger, kueueInf.GetIndexer())
			kueueSynced = kueueInf.HasSynced
		} else {
			logger.Info("Kueue's API (kueue.x-k8s.io/v1beta2) is not served: the pods of queues whose quota Kueue keeps wait until it is and the coordinator restarts")
		}
	}

	// Resource claims (resource.k8s.io/v1, served since Kubernetes 1.34):
	// the coordinator allocates its pods' claims on nodes in mode dra.
	var draDeps *scheduler.DRADeps
	var draSynced []cache.InformerSynced
	servesDRA := false
	if !a.cfg.NoDRA {
		if servesDRA, err = servesGroupVersion(ctx, a.client.Discovery(), resourceapi.SchemeGroupVersion.String()); err != nil {
			return err
		}
	}
	if servesDRA {
		sliceInf := factory.Resource().V1().ResourceSlices()
		claimInf := factory.Resource().V1().ResourceClaims()
		classInf := factory.Resource().V1().DeviceClasses()
		draDeps = &scheduler.DRADeps{
			Slices: func() ([]*resourceapi.ResourceSlice, error) { return sliceInf.Lister().List(labels.Everything()) },
			Claims: func() ([]*resourceapi.ResourceClaim, error) { return claimInf.Lister().List(labels.Everything()) },
			GetClaim: func(ns, name string) (*resourceapi.ResourceClaim, bool) {
				c, err := claimInf.Lister().ResourceClaims(ns).Get(name)
				return c, err == nil
			},
			Classes: dra.Classes{Lister: classInf.Lister()},
			Writer:  dra.NewWriter(a.client),
		}
		draSynced = []cache.InformerSynced{sliceInf.Informer().HasSynced, claimInf.Informer().HasSynced, classInf.Informer().HasSynced}
	} else if a.cfg.NoDRA {
		logger.Info("DRA is turned off (--dra=false): resource.k8s.io is not read, resource claims are left to other schedulers")
	} else {
		logger.Info("The API server serves no resource.k8s.io/v1: resource claims are left to other schedulers")
	}

	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: a.events.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: api.SchedulerName})

	a.cfg.Scheduler.Placeholder.Prices = a.cfg.Prices
	bnd := binder.New(a.client, recorder)
	var reserver scheduler.Reserver
	if a.cfg.Reservations {
		rm := reservation.NewManager(a.client, recorder, a.cfg.Reservation, nil)
		// Removals must not hold the scheduling cycle (docs/benchmarks.md, "Scale").
		rm.RemoveInBackground(reservationRemovers)
		if err := rm.Register(a.reg); err != nil {
			return fmt.Errorf("registering reservation metrics: %w", err)
		}
		reserver = rm
		// Deletions decided under the lease end before it is released.
		defer rm.Wait()
	}
	var kube *kubecheck.Checker
	if a.cfg.KubeChecks {
		// Before Start: its plugins register their informers (PVs, PVCs,
		// StorageClasses, CSI objects) in the factory.
		if kube, err = kubecheck.New(ctx, kubecheck.Options{Factory: factory, Client: a.client}); err != nil {
			return err
		}
		if _, err := podInf.Informer().AddEventHandler(kube.PodHandler(logger)); err != nil {
			return fmt.Errorf("feeding kube-scheduler's cache pods: %w", err)
		}
		if _, err := nodeInf.Informer().AddEventHandler(kube.NodeHandler(logger)); err != nil {
			return fmt.Errorf("feeding kube-scheduler's cache nodes: %w", err)
		}
	}
	sched, err := scheduler.New(a.cfg.Scheduler, scheduler.Deps{
		Pods:       podInf.Lister(),
		Nodes:      nodeInf.Lister(),
		Namespaces: nsInf.Lister(),
		Jobs: func(ns, name string) (*batchv1.Job, bool) {
			j, err := jobLister.Jobs(ns).Get(name)
			return j, err == nil
		},
		PodGroups:      podGroups,
		PodGroupStatus: podGroupStatus,
		Kueue:          kueueLookup,
		KueueSynced:    kueueSynced,
		Queues:         scheduler.QueuesFromLister(queueInf.Lister()),
		Binder:         bnd,
		Evictor:        bnd,
		Releaser:       bnd,
		Reserver:       reserver,
		NodeClaims: func(name string) string {
			if claimLister == nil {
				return ""
			}
			obj, err := claimLister.Get(name)
			if err != nil {
				return ""
			}
			u, ok := obj.(*unstructured.Unstructured)
			if !ok {
				return ""
			}
			n, _, _ := unstructured.NestedString(u.Object, "status", "nodeName")
			return n
		},
		NodeRegistered: func(node string) time.Time {
			if claimIndex == nil {
				return time.Time{}
			}
			objs, err := claimIndex.ByIndex(nodeClaimByNode, node)
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
		},
		Placeholders: func() scheduler.Placeholders {
			if a.cfg.Placeholders {
				return placeholder.NewManager(a.client, recorder)
			}
			return nil
		}(),
		Status:   scheduler.DynamicStatusWriter{Client: a.dynamic},
		Recorder: recorder,
		Faults:   a.cfg.Faults,
		Registry: a.reg,
		DRA:      draDeps,
		Kube:     kube,
	})
	if err != nil {
		return err
	}
	wake := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { sched.Wake() },
		UpdateFunc: func(_, _ any) { sched.Wake() },
		DeleteFunc: func(any) { sched.Wake() },
	}
	if _, err := podInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: sched.OnPod,
		UpdateFunc: func(old, obj any) {
			if changed(old, obj) {
				sched.OnPod(obj)
			}
		},
		DeleteFunc: sched.OnPodDelete,
	}); err != nil {
		return fmt.Errorf("watching pods: %w", err)
	}
	nodeWake := wake
	nodeWake.UpdateFunc = func(old, obj any) {
		if changed(old, obj) {
			sched.Wake()
		}
	}
	if _, err := nodeInf.Informer().AddEventHandler(nodeWake); err != nil {
		return fmt.Errorf("watching nodes: %w", err)
	}
	// A pending pod of a Job waits for the Job in the cache (its gang is
	// read from it): the Job's arrival must wake the cycle.
	if _, err := jobInf.Informer().AddEventHandler(wake); err != nil {
		return fmt.Errorf("watching jobs: %w", err)
	}
	if _, err := nsInf.Informer().AddEventHandler(wake); err != nil {
		return fmt.Errorf("watching namespaces: %w", err)
	}
	if _, err := queueInf.Informer().AddEventHandler(wake); err != nil {
		return fmt.Errorf("watching queues: %w", err)
	}
	if _, err := eventInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    sched.OnEvent,
		UpdateFunc: func(_, obj any) { sched.OnEvent(obj) },
	}); err != nil {
		return fmt.Errorf("watching events: %w", err)
	}
	if podGroupInf != nil {
		if _, err := podGroupInf.AddEventHandler(wake); err != nil {
			return fmt.Errorf("watching PodGroups: %w", err)
		}
	}
	synced := []cache.InformerSynced{podInf.Informer().HasSynced, nodeInf.Informer().HasSynced, nsInf.Informer().HasSynced, jobInf.Informer().HasSynced, queueInf.Informer().HasSynced, eventInf.HasSynced, claimSynced}
	if kube != nil {
		// Not waited for: pods that need the checks wait for them
		// (KubeChecksNotReady) and the rest is scheduled, should RBAC keep
		// them from syncing.
		if _, err := factory.Core().V1().PersistentVolumeClaims().Informer().AddEventHandler(wake); err != nil {
			return fmt.Errorf("watching claims: %w", err)
		}
		if _, err := factory.Core().V1().PersistentVolumes().Informer().AddEventHandler(wake); err != nil {
			return fmt.Errorf("watching volumes: %w", err)
		}
	}
	var consolidator *consolidation.Controller
	if a.cfg.Consolidation {
		pdbInf := factory.Policy().V1().PodDisruptionBudgets()
		consolidator, err = a.consolidator(recorder, podInf.Lister(), nodeInf.Lister(), pdbInf.Lister(), jobLister)
		if err != nil {
			return err
		}
		synced = append(synced, pdbInf.Informer().HasSynced)
	}
	factory.Start(ctx.Done())
	dynFactory.Start(ctx.Done())
	sysFactory.Start(ctx.Done())
	defer factory.Shutdown()
	defer dynFactory.Shutdown()
	defer sysFactory.Shutdown()
	if draDeps != nil {
		for _, inf := range []cache.SharedIndexInformer{factory.Resource().V1().ResourceSlices().Informer(), factory.Resource().V1().ResourceClaims().Informer(), factory.Resource().V1().DeviceClasses().Informer()} {
			if _, err := inf.AddEventHandler(wake); err != nil {
				return fmt.Errorf("watching resource claims, slices and classes: %w", err)
			}
		}
	}
	if nodeClaimInf != nil {
		// A NodeClaim's registration times settle its node (see
		// scheduler.NodeRegistrations).
		if _, err := nodeClaimInf.AddEventHandler(wake); err != nil {
			return fmt.Errorf("watching NodeClaims: %w", err)
		}
	}
	synced = append(synced, draSynced...)
	if podGroupInf != nil {
		synced = append(synced, podGroupInf.HasSynced)
	}
	if kueueInf != nil {
		// An admission lets pods of a Kueue queue be placed. Not waited
		// for with the others: a coordinator that may not list Workloads
		// (the right comes with the chart's kueue.enabled) still schedules
		// every other queue, and the pods of Kueue queues say why they wait.
		if _, err := kueueInf.AddEventHandler(wake); err != nil {
			return fmt.Errorf("watching Kueue Workloads: %w", err)
		}
	}
	if !cache.WaitForNamedCacheSyncWithContext(ctx, synced...) {
		return fmt.Errorf("waiting for informers: %w", ctx.Err())
	}
	a.synced.Store(true)
	logger.Info("Caches synced; scheduling", "scheduler", a.cfg.Scheduler.SchedulerName, "consolidation", a.cfg.Consolidation)
	var wg sync.WaitGroup
	if consolidator != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			consolidator.Run(ctx)
		}()
	}
	sched.Run(ctx)
	wg.Wait()
	return nil
}

// consolidator builds the consolidation controller on the informers' listers.
func (a *App) consolidator(recorder record.EventRecorder, pods corelisters.PodLister, nodes corelisters.NodeLister,
	pdbs policylisters.PodDisruptionBudgetLister, jobs batchlisters.JobLister) (*consolidation.Controller, error) {
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
