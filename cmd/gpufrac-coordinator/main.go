// Command gpufrac-coordinator is gpufrac's GPU-aware secondary scheduler:
// queues with quota and fair share, gangs, fragmentation-aware placement.
package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/cmd/internal/crdapply"
	"github.com/gpufrac/gpufrac/cmd/internal/probes"
	"github.com/gpufrac/gpufrac/cmd/internal/version"
	"github.com/gpufrac/gpufrac/coordinator/app"
	"github.com/gpufrac/gpufrac/coordinator/placeholder"
	"github.com/gpufrac/gpufrac/coordinator/placement"
	"github.com/gpufrac/gpufrac/coordinator/podrequest"
	"github.com/gpufrac/gpufrac/coordinator/pricing"
	"github.com/gpufrac/gpufrac/coordinator/reservation"
	"github.com/gpufrac/gpufrac/coordinator/scheduler"
)

func main() {
	klog.InitFlags(nil)
	var cfg app.Config
	var kubeconfig, metricsAddr, pprofAddr string
	var seed uint64
	s := &cfg.Scheduler
	flag.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file; empty uses the in-cluster config")
	flag.StringVar(&metricsAddr, "metrics-addr", "127.0.0.1:8080", "address of /metrics, /healthz and /readyz (empty disables); loopback by default, the manifests bind the pod IP")
	flag.StringVar(&pprofAddr, "pprof-addr", "", "loopback address (127.0.0.1:6060) to serve Go runtime profiles on (/debug/pprof/); empty, the default, serves none")
	flag.BoolVar(&cfg.LeaderElect, "leader-elect", true, "elect a leader on a Lease so only one replica schedules")
	flag.StringVar(&cfg.LeaseNamespace, "lease-namespace", api.ComponentNamespace, "namespace of the leader-election Lease")
	flag.StringVar(&cfg.LeaseName, "lease-name", "gpufrac-coordinator", "name of the leader-election Lease")
	flag.StringVar(&cfg.Identity, "identity", os.Getenv("POD_NAME"), "this replica's identity in the Lease (default hostname_pid)")
	flag.DurationVar(&cfg.LeaseDuration, "lease-duration", 15*time.Second, "leader-election lease duration")
	flag.DurationVar(&cfg.RenewDeadline, "renew-deadline", 10*time.Second, "leader-election renew deadline")
	flag.DurationVar(&cfg.RetryPeriod, "retry-period", 2*time.Second, "leader-election retry period")
	flag.StringVar(&s.SchedulerName, "scheduler-name", api.SchedulerName, "schedulerName of the pods to schedule")
	flag.StringVar(&s.PoolLabel, "pool-label", api.LabelNodePool, "node label that groups nodes into pools (gangs stay in one)")
	flag.StringVar(&s.Policy, "policy", placement.DefaultPolicy, "placement policy")
	flag.Uint64Var(&seed, "seed", 1, "seed of the placement policy's random choices")
	flag.IntVar(&s.BindWorkers, "bind-workers", scheduler.DefaultBindWorkers, "bindings in flight at once (as many goroutines run the other API writes)")
	var qps float64
	flag.Float64Var(&qps, "kube-api-qps", app.DefaultQPS, "API requests per second the coordinator's client may make (bindings, reservation pods, status); events have a client of their own with the same limit")
	flag.IntVar(&cfg.Burst, "kube-api-burst", app.DefaultBurst, "burst of the coordinator's API client above --kube-api-qps")
	flag.StringVar(&s.TimesliceResource, "timeslice-resource", api.DefaultTimesliceResource, "resource name of time-sliced replicas (the nodes' timeslice.resourceName)")
	npPrio := int(podrequest.DefaultNonPreemptiblePriority)
	flag.IntVar(&npPrio, "non-preemptible-priority", npPrio, "pods with this priority or higher are non-preemptible (0 and negative values allowed)")
	flag.DurationVar(&s.NewNodeSettle, "new-node-settle", scheduler.DefaultNewNodeSettle, "how long nothing is bound to a node after it lost a NoExecute taint (karpenter.sh/unregistered when Karpenter registers it) or Karpenter brought it, for kube-controller-manager's taint manager to see the taint gone (kubernetes#119862); its fractions' reservations are made meanwhile; a node first seen after a restart settles from its NodeClaim's Registered/Initialized time, its Ready time or its creation; 0 binds at once, as kube-scheduler does")
	flag.BoolVar(&s.AvoidDriftedNodes, "avoid-drifted-nodes", true, "place nothing new on nodes whose Karpenter NodeClaim is Drifted (nor move work there in consolidation), as on cordoned nodes: their reservations end with their fractions, so Karpenter can replace them once nothing protected runs there; pods already there stay; pods that fit only there wait with reason DriftedNodesOnly")
	var placeBudget time.Duration
	flag.DurationVar(&placeBudget, "place-budget", scheduler.DefaultPlaceBudget, "how long one scheduling cycle places work that fits before it leaves the rest, in order, to the next cycle (which starts at once); 0 places all a cycle can")
	flag.DurationVar(&s.IdleResync, "idle-resync", scheduler.DefaultIdleResync, "while the cluster is idle (the last cycle left nothing pending or in flight), run a cycle only on a change (an informer event, a binding or write done) or once this long has passed; negative runs a cycle every second regardless")
	flag.DurationVar(&s.GangBindTimeout, "gang-bind-timeout", scheduler.DefaultGangBindTimeout, "how long a gang may hold GPUs bound in part (a member's binding failed) before its bound members are evicted and it is placed again whole")
	cfg.Reservation = reservation.DefaultOptions()
	flag.BoolVar(&cfg.Reservations, "reservations", true, "hold every shared GPU with a reservation pod (needed whenever anything else may take whole GPUs)")
	flag.StringVar(&cfg.Reservation.Image, "reservation-image", cfg.Reservation.Image, "image of reservation pods")
	flag.StringVar(&cfg.Reservation.PriorityClassName, "reservation-priority-class", cfg.Reservation.PriorityClassName, "priority class of reservation pods")
	flag.DurationVar(&cfg.Reservation.Grace, "reservation-grace", cfg.Reservation.Grace, "how long a reservation outlives the last fraction on its GPU")
	flag.DurationVar(&cfg.Reservation.EmptyNodeGrace, "reservation-empty-node-grace", cfg.Reservation.EmptyNodeGrace, "replaces --reservation-grace, when shorter, on a Karpenter node (karpenter.sh/nodepool) where nothing else uses the node's GPUs: there the reservation alone keeps an autoscaler from removing the node (negative: --reservation-grace everywhere)")
	flag.DurationVar(&cfg.Reservation.AdmitTimeout, "reservation-admit-timeout", cfg.Reservation.AdmitTimeout, "how long a reservation may wait for its GPU before it is replaced")
	s.Placeholder = placeholder.DefaultOptions()
	flag.BoolVar(&cfg.Placeholders, "placeholders", true, "create placeholder pods so the autoscaler (Karpenter) provisions GPUs for admitted work that has no room")
	flag.StringVar(&s.Placeholder.Image, "placeholder-image", s.Placeholder.Image, "image of placeholder pods")
	flag.StringVar(&s.Placeholder.PriorityClassName, "placeholder-priority-class", s.Placeholder.PriorityClassName, "priority class of placeholder pods (the lowest)")
	flag.StringVar(&s.Placeholder.GPUCountLabel, "gpu-count-label", s.Placeholder.GPUCountLabel, "node label with a node's GPU count that the autoscaler's instance types carry (karpenter.k8s.aws/instance-gpu-count on AWS): without a price table for their types, placeholders prefer the smallest nodes that hold them, so Karpenter buys the cheapest such type instead of one large node for all; empty: Karpenter's own packing")
	flag.BoolVar(&cfg.KubeChecks, "kube-checks", true, "check what kube-scheduler checks beyond GPUs, CPU, memory, node affinity and taints (volumes and their binding, topology spread, inter-pod affinity, host ports) with kube-scheduler's own plugins, for the pods that use them; needs read access to PVs, PVCs, StorageClasses and CSI objects and the right to bind volumes")
	flag.BoolVar(&cfg.Kueue, "kueue", false, "read Kueue's Workloads (kueue.x-k8s.io/v1beta2), for the queues whose quota Kueue keeps (spec.admission: Kueue): their pods are placed once Kueue admitted them; off, those pods wait")
	draOn := flag.Bool("dra", true, "read ResourceSlices, ResourceClaims and DeviceClasses (resource.k8s.io/v1, where served) and allocate the claims of its pods on nodes in mode dra; false leaves resource claims to other schedulers and needs no RBAC on resource.k8s.io")
	priceTable := costFlags(&cfg)
	printVersion := flag.Bool("version", false, "print the version and exit")
	applyCRDs := flag.String("apply-crds", "", "instead of scheduling: server-side apply (field manager "+crdapply.FieldManager+", forced) the gpufrac CustomResourceDefinitions in this directory's *.yaml files to those that exist, wait until they are established, and exit; the chart's pre-install/pre-upgrade hook, since Helm never upgrades its crds/. A CRD that does not exist is left to Helm (never created, never deleted)")
	crdOpts := crdapply.Options{Timeout: time.Minute}
	flag.StringVar(&crdOpts.Version, "apply-crds-version", "", "with --apply-crds: the chart version whose CRDs these are, recorded on each CRD ("+crdapply.VersionAnnotation+"); a CRD a newer chart version applied is refused (a downgrade would drop the newer fields of every stored object) unless --apply-crds-allow-downgrade")
	flag.BoolVar(&crdOpts.AllowDowngrade, "apply-crds-allow-downgrade", false, "with --apply-crds-version: apply the CRDs even over those a newer chart version applied")
	flag.Parse()
	cfg.NoDRA = !*draOn
	if *printVersion {
		fmt.Println("gpufrac-coordinator", version.Get())
		return
	}
	if *applyCRDs != "" {
		if err := runApplyCRDs(*applyCRDs, kubeconfig, crdOpts); err != nil {
			klog.ErrorS(err, "Applying the CustomResourceDefinitions failed", "dir", *applyCRDs)
			klog.FlushAndExit(klog.ExitFlushTimeout, 1)
		}
		klog.Flush()
		return
	}
	s.Seed = seed
	cfg.QPS = float32(qps)
	if qps <= 0 || cfg.Burst <= 0 {
		klog.ErrorS(nil, "--kube-api-qps and --kube-api-burst must be positive", "qps", qps, "burst", cfg.Burst)
		klog.FlushAndExit(klog.ExitFlushTimeout, 2)
	}
	if l := s.Placeholder.GPUCountLabel; l != "" {
		// A label no node may carry makes every placeholder invalid: no
		// capacity is ever asked for.
		if errs := validation.IsQualifiedName(l); len(errs) > 0 {
			klog.ErrorS(nil, "--gpu-count-label is not a label key", "value", l, "problems", errs)
			klog.FlushAndExit(klog.ExitFlushTimeout, 2)
		}
	}
	if s.NewNodeSettle < 0 {
		klog.ErrorS(nil, "--new-node-settle must not be negative (0 binds at once)", "value", s.NewNodeSettle)
		klog.FlushAndExit(klog.ExitFlushTimeout, 2)
	}
	switch {
	case placeBudget < 0:
		klog.ErrorS(nil, "--place-budget must not be negative (0 places without a budget)", "value", placeBudget)
		klog.FlushAndExit(klog.ExitFlushTimeout, 2)
	case placeBudget == 0:
		s.PlaceBudget = -1 // Options: negative is no budget
	default:
		s.PlaceBudget = placeBudget
	}
	if npPrio < math.MinInt32 || npPrio > math.MaxInt32 {
		klog.ErrorS(nil, "--non-preemptible-priority is outside the range of a pod priority (int32)", "value", npPrio)
		klog.FlushAndExit(klog.ExitFlushTimeout, 2)
	}
	s.NonPreemptiblePriority = ptr.To(int32(npPrio))
	cfg.Version = version.Get()
	faults, err := faultPoint()
	if err != nil {
		klog.ErrorS(err, "Invalid fault point")
		klog.FlushAndExit(klog.ExitFlushTimeout, 2)
	}
	cfg.Faults = faults
	if cfg.Prices, err = pricing.Load(*priceTable); err != nil {
		klog.ErrorS(err, "Invalid --price-table")
		klog.FlushAndExit(klog.ExitFlushTimeout, 2)
	}

	// A soft memory limit below the container's (the chart sets
	// GPUFRAC_MEMORY_LIMIT from limits.memory): see app.MemoryLimit.
	if limit, err := app.MemoryLimit(os.Getenv(app.EnvMemoryLimit), os.Getenv("GOMEMLIMIT")); err != nil {
		klog.ErrorS(err, "No Go memory limit set; the runtime's default applies")
	} else if limit > 0 {
		klog.InfoS("Go memory limit set below the container's", "bytes", limit)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx = klog.NewContext(ctx, klog.Background())
	if err := run(ctx, cfg, kubeconfig, metricsAddr, pprofAddr); err != nil {
		klog.ErrorS(err, "gpufrac-coordinator failed")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
	klog.Flush()
}

// restConfig is the kubeconfig's, or the in-cluster config without one.
func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	return rest.InClusterConfig()
}

// runApplyCRDs is --apply-crds: the chart's CRD upgrade hook.
func runApplyCRDs(dir, kubeconfig string, o crdapply.Options) error {
	crds, err := crdapply.Read(dir)
	if err != nil {
		return err
	}
	rc, err := restConfig(kubeconfig)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(klog.NewContext(ctx, klog.Background()), 2*time.Minute)
	defer cancel()
	klog.InfoS("Applying CustomResourceDefinitions", "crds", crdapply.Names(crds), "version", version.Get())
	_, err = crdapply.Apply(ctx, dyn, crds, o)
	return err
}

func run(ctx context.Context, cfg app.Config, kubeconfig, metricsAddr, pprofAddr string) error {
	rc, err := restConfig(kubeconfig)
	if err != nil {
		return err
	}
	a, err := app.New(cfg, rc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if metricsAddr != "" {
		srv, err := probes.Start(ctx, metricsAddr, a.Registry(), a.Ready)
		if err != nil {
			return err
		}
		defer func() { cancel(); srv.Wait() }()
	}
	if pprofAddr != "" {
		srv, err := probes.StartProfiling(ctx, pprofAddr)
		if err != nil {
			return err
		}
		defer func() { cancel(); srv.Wait() }()
	}
	return a.Run(ctx)
}
