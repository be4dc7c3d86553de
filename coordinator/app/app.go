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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"

	"github.com/gpufrac/gpufrac/coordinator/consolidation"
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

// nodeClaimDrifted tells whether a NodeClaim has the condition Drifted=True
// (Karpenter v1's ConditionTypeDrifted): Karpenter means to replace its
// node. NodeClaims are Karpenter's to write, tenants cannot; read without
// copying, once per Karpenter node and cycle.
func nodeClaimDrifted(u *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedFieldNoCopy(u.Object, "status", "conditions")
	list, _ := conds.([]any)
	for _, c := range list {
		if m, ok := c.(map[string]any); ok && m["type"] == "Drifted" && m["status"] == "True" {
			return true
		}
	}
	return false
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
