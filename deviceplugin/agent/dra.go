package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/cdi"
	"github.com/gpufrac/gpufrac/deviceplugin/config"
	"github.com/gpufrac/gpufrac/deviceplugin/dra"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/mig"
)

// DRAConfig is where gpufrac-node meets the kubelet as a DRA driver (nodes
// in mode dra).
type DRAConfig struct {
	// Disabled turns mode dra off: a config that puts this node in mode dra
	// is refused as invalid (ErrDRADisabled), as the chart's dra.enabled:
	// false has the pod without the kubelet's plugin directories and
	// without RBAC on resource.k8s.io.
	Disabled bool
	// Client is what the driver reads claims and publishes ResourceSlices
	// with: client-go's typed clientset, as the kubeletplugin and
	// resourceslice helpers take it. Nil: mode dra cannot be served.
	Client kubernetes.Interface
	// NewClient builds Client when it is nil, once the node serves DRA
	// (gpufrac-node builds it with its own token bucket, so that claims the
	// kubelet waits for do not queue behind the agent's other requests).
	NewClient func() (kubernetes.Interface, error)
	// RegistryDir is the kubelet's plugin registration directory
	// ("" is kubeletplugin.KubeletRegistryDir).
	RegistryDir string
	// PluginDir is the driver's own directory, where the DRA socket lives
	// ("" is <kubeletplugin.KubeletPluginsDir>/gpu.gpufrac.io).
	PluginDir string
	// StateDir holds the prepared-claims record ("" is PluginDir).
	StateDir string
	// CDIDir is where per-claim CDI specs are written ("" is dra.DefaultCDIDir).
	CDIDir string
	// SliceSyncDelay is how long after someone else changed or deleted the
	// node's slices they are checked again (0: DefaultSliceSyncDelay).
	SliceSyncDelay time.Duration
	// NodeCheckInterval is how often the Node's UID is read again, so the
	// slices' owner follows a Node deleted and registered again
	// (0: DefaultNodeCheckInterval).
	NodeCheckInterval time.Duration
}

// ErrServingChanged rejects a config that moves the node between device
// plugins and DRA: the kubelet would see the same GPUs offered twice, so
// gpufrac-node changes its serving path only when it restarts.
var ErrServingChanged = errors.New("switching a node between device plugins (modes exclusive, fraction, timeslice, mig) and DRA (mode dra) needs a restart of gpufrac-node")

// ErrDRADisabled rejects a config that puts the node in mode dra when DRA
// is turned off (DRAConfig.Disabled).
var ErrDRADisabled = errors.New("mode dra is turned off for gpufrac-node (--dra=false, the chart's dra.enabled: false): it has no access to the kubelet's plugin registry nor RBAC on resource.k8s.io; turn dra.enabled on or choose another mode")

// draServing is the running DRA driver of a node in mode dra.
type draServing struct {
	driver *dra.Driver
	// helper is the kubeletplugin helper: plugin registration and the DRA
	// gRPC service, calling driver.
	helper *kubeletplugin.Helper
	// registration is the kubelet's last word on the registration.
	registration *registrationStatus
	// publisher publishes the node's ResourceSlices; stopPublisher ends it
	// and waits.
	publisher     *slicePublisher
	stopPublisher func()
	// fatal receives the driver's first fatal background error: Run
	// returns it, and gpufrac-node exits to be restarted.
	fatal chan error
}

// startDRA starts the DRA driver: the prepared-claims record, the kubelet
// plugin registration and DRA service (kubeletplugin.Start), and the
// ResourceSlice publisher (a resourceslice controller, see slicePublisher).
// Slices are published by publishDRA.
func (a *Agent) startDRA(ctx context.Context) error {
	c := a.cfg.DRA
	if c.Client == nil && c.NewClient != nil && a.client != nil {
		var err error
		if c.Client, err = c.NewClient(); err != nil {
			return fmt.Errorf("starting the DRA driver: building its API client: %w", err)
		}
	}
	if c.Client == nil || a.client == nil || a.cfg.NodeName == "" {
		return errors.New("mode dra needs API access (a kubeconfig or the in-cluster config) and --node-name")
	}
	registryDir := c.RegistryDir
	if registryDir == "" {
		registryDir = kubeletplugin.KubeletRegistryDir
	}
	pluginDir := c.PluginDir
	if pluginDir == "" {
		pluginDir = filepath.Join(kubeletplugin.KubeletPluginsDir, api.DRADriver)
	}
	stateDir := c.StateDir
	if stateDir == "" {
		stateDir = pluginDir
	}
	// The kubelet makes the registry directory; the driver's own is ours.
	if err := os.MkdirAll(pluginDir, 0o750); err != nil {
		return fmt.Errorf("starting the DRA driver: %w", err)
	}
	o := dra.Options{NodeName: a.cfg.NodeName, StateDir: stateDir, CDIDir: c.CDIDir, Strategy: a.cfg.DeviceListStrategy}
	if a.cdi != nil {
		o.Unresolved = a.cdi.Unresolved
	}
	driver, err := dra.NewDriver(o)
	if err != nil {
		return fmt.Errorf("starting the DRA driver: %w", err)
	}
	logger := klog.FromContext(ctx)
	reg := &registrationStatus{logger: logger}
	helper, err := kubeletplugin.Start(klog.NewContext(ctx, klog.LoggerWithName(logger, "kubeletplugin")), driver,
		kubeletplugin.DriverName(api.DRADriver),
		kubeletplugin.KubeClient(c.Client),
		kubeletplugin.NodeName(a.cfg.NodeName),
		kubeletplugin.RegistrarDirectoryPath(registryDir),
		kubeletplugin.PluginDataDirectoryPath(pluginDir),
		kubeletplugin.GRPCInterceptor(reg.intercept),
	)
	if err != nil {
		return fmt.Errorf("starting the DRA driver %s: %w", api.DRADriver, err)
	}
	pub := newSlicePublisher(c, a.cfg.NodeName, driver.HandleError)
	pubCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		pub.Run(klog.NewContext(pubCtx, klog.LoggerWithName(logger, "resourceslices")))
	}()
	a.dra = &draServing{driver: driver, helper: helper, registration: reg, publisher: pub, fatal: make(chan error, 1),
		stopPublisher: func() { cancel(); <-done }}
	driver.OnFatal(func(err error) {
		select {
		case a.dra.fatal <- err:
		default:
		}
	})
	driver.OnTaintsDropped(func() {
		if err := a.apply(ctx, nil, a.deps); err != nil {
			klog.FromContext(ctx).Error(err, "Republishing DRA devices without taints")
		}
	})
	logger.Info("Serving GPUs through DRA", "driver", api.DRADriver, "registryDir", registryDir, "pluginDir", pluginDir, "stateDir", stateDir, "preparedClaims", len(driver.Prepared()))
	return nil
}

// stopDRA stops the kubelet's servers (their sockets go) and slice
// publishing. Published slices stay: the kubelet removes them when the
// plugin is gone for good.
func (a *Agent) stopDRA() {
	if a.dra != nil {
		a.dra.helper.Stop()
		a.dra.stopPublisher()
	}
}

// registrationStatus keeps the kubelet's NotifyRegistrationStatus, seen by
// a gRPC interceptor of the helper's servers: the helper's own
// RegistrationStatus reads a field its gRPC handler writes without a lock
// (a data race with /readyz, which asks at any time).
type registrationStatus struct {
	logger klog.Logger
	mu     sync.Mutex
	st     *registerapi.RegistrationStatus // nil before the kubelet said anything
}

// intercept is a grpc.UnaryServerInterceptor that records each
// RegistrationStatus the kubelet sends before the helper handles it.
func (r *registrationStatus) intercept(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if st, ok := req.(*registerapi.RegistrationStatus); ok {
		r.mu.Lock()
		r.st = &registerapi.RegistrationStatus{PluginRegistered: st.GetPluginRegistered(), Error: st.GetError()}
		r.mu.Unlock()
		if st.GetPluginRegistered() {
			r.logger.V(2).Info("Registered with the kubelet", "driver", api.DRADriver)
		} else {
			r.logger.Error(nil, "The kubelet refused the DRA driver's registration", "driver", api.DRADriver, "reason", st.GetError())
		}
	}
	return handler(ctx, req)
}

// registered tells whether the kubelet's last word accepted the driver.
func (r *registrationStatus) registered() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.st != nil && r.st.PluginRegistered
}

// draGPUs is what the driver publishes for a resolved policy: each GPU's
// mode and health, and the GPU instances of GPUs in mode mig.
func (a *Agent) draGPUs(ctx context.Context, np config.NodePolicy) []dra.GPU {
	out := make([]dra.GPU, len(a.gpus))
	for i, g := range a.gpus {
		out[i] = dra.GPU{GPU: g, Healthy: a.checker == nil || a.checker.Healthy(g.UUID)}
		if i < len(np.GPUModes) {
			out[i].Mode = np.GPUModes[i]
		}
		if out[i].Mode == config.ModeMIG {
			out[i].MIG = a.migInstances(ctx, g)
		} else {
			out[i].MIGEnabled = a.migEnabled(ctx, g)
		}
	}
	return out
}

// migEnabled tells whether a GPU's MIG mode is on. When NVML cannot tell
// (logged) it says true: the GPU is left out rather than published whole
// while it may be in MIG mode with its MIG devices in use.
func (a *Agent) migEnabled(ctx context.Context, g nvidia.GPU) bool {
	lib, ok := a.lib.(nvidia.MIGLib)
	if !ok || !g.MIGCapable {
		return false
	}
	mode, err := lib.MIGMode(g.UUID)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Cannot read the MIG mode; the GPU is not published until it can be read", "gpu", g.UUID)
		// Publish it again at the MIG layout manager's next check, if the
		// read works then (a read that keeps failing is its own change).
		a.oweMIGRebuild()
		return true
	}
	return mode.Current
}

// migInstances lists a GPU's GPU instances while its MIG mode is on
// (empty otherwise, or when NVML cannot tell: logged, and a rebuild owed
// to the MIG layout manager, as migEnabled does).
func (a *Agent) migInstances(ctx context.Context, g nvidia.GPU) []mig.GPUInstance {
	lib, ok := a.lib.(nvidia.MIGLib)
	if !ok || !g.MIGCapable {
		return nil
	}
	mode, err := lib.MIGMode(g.UUID)
	if err == nil && !mode.Current {
		return nil
	}
	var instances []mig.GPUInstance
	if err == nil {
		instances, err = lib.MIGInstances(g.UUID)
	}
	if err != nil {
		klog.FromContext(ctx).Error(err, "MIG devices not published", "gpu", g.UUID)
		a.oweMIGRebuild()
		return nil
	}
	return instances
}

// buildDRA builds the pool a resolved policy publishes (without unhealthy
// GPUs once the API server is known to drop device taints).
func (a *Agent) buildDRA(ctx context.Context, np config.NodePolicy) (dra.Published, error) {
	gpus := a.draGPUs(ctx, np)
	if a.dra != nil && a.dra.driver.TaintsDropped() {
		gpus = dra.WithoutUnhealthy(gpus)
	}
	return dra.Build(a.cfg.NodeName, gpus)
}

// publishDRA publishes the pool of np and tells the driver what its device
// names stand for.
func (a *Agent) publishDRA(ctx context.Context, np config.NodePolicy) error {
	p, err := a.buildDRA(ctx, np)
	if err != nil {
		return err
	}
	a.dra.driver.SetTargets(p.Targets)
	if a.cdi != nil {
		// The node's CDI check covers the GPUs and MIG devices published.
		var names []string
		for _, t := range p.Targets {
			uuid := t.GPU.UUID
			if t.View == api.DRAViewMIG {
				uuid = t.MIG.UUID
			}
			names = append(names, cdi.Name(uuid))
		}
		a.cdi.SetWanted(names)
	}
	a.dra.publisher.Publish(p.Resources)
	klog.FromContext(ctx).Info("Publishing DRA devices", "driver", api.DRADriver, "devices", len(p.Targets))
	return nil
}

// draRegistered tells whether the kubelet accepted the driver's registration.
func (a *Agent) draRegistered() bool {
	return a.dra.registration.registered()
}

// draAllocations lists what prepared claims hold, for the MIG layout
// manager: GPU UUIDs, and MIG UUIDs for MIG devices.
func (a *Agent) draAllocations() []string {
	var out []string
	for _, c := range a.dra.driver.Prepared() {
		for _, d := range c.Devices {
			if d.MIG != "" {
				out = append(out, d.MIG)
				continue
			}
			out = append(out, d.GPU)
		}
	}
	return out
}
