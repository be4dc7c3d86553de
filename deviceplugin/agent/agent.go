// Package agent is gpufrac-node's composition root: it wires the NVML
// library, the admin's config, health, pod hints, metrics and the
// device-plugin endpoints, and runs them until its context ends.
package agent

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/NVIDIA/go-gpuallocator/gpuallocator"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/cdi"
	"github.com/gpufrac/gpufrac/deviceplugin/config"
	"github.com/gpufrac/gpufrac/deviceplugin/enforcement"
	"github.com/gpufrac/gpufrac/deviceplugin/health"
	"github.com/gpufrac/gpufrac/deviceplugin/metrics"
	"github.com/gpufrac/gpufrac/deviceplugin/miglayout"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/deviceplugin/plugin"
	"github.com/gpufrac/gpufrac/deviceplugin/pods"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
)

// Config is gpufrac-node's configuration, filled from flags by main.
type Config struct {
	// NodeName is this node's name (required with API access).
	NodeName string
	// KubeletDir is the kubelet's device-plugin directory.
	KubeletDir string
	// PodResourcesSocket is the kubelet's PodResources socket ("" disables it).
	PodResourcesSocket string
	// ConfigFile is the admin's partitioning config ("" uses the defaults).
	ConfigFile string
	// DeviceListStrategy is how GPUs reach containers.
	DeviceListStrategy resource.DeviceListStrategy
	// HealthQuietPeriod is how long a GPU stays unhealthy after a critical Xid.
	HealthQuietPeriod time.Duration
	// HealthProbeInterval is how often GPUs are probed through NVML.
	HealthProbeInterval time.Duration
	// IgnoredXids never mark a GPU unhealthy (nil: health.DefaultIgnoredXids).
	IgnoredXids []uint64
	// Version is reported in gpufrac_build_info.
	Version string
	// ProcRoot is the procfs the GPU memory watchdog maps PIDs through
	// ("" is /proc; tests use a fixture tree).
	ProcRoot string
	// SchedulerName is the coordinator's scheduler name: only pods with it
	// have their gpufrac.io/gpu placement hint read ("" is api.SchedulerName).
	SchedulerName string
	// CDISpecDirs are the node's CDI spec directories, checked with the cdi
	// device-list strategy (nil: cdi.DefaultSpecDirs).
	CDISpecDirs []string
	// CDICheckInterval is how often the CDI specs are checked (0: cdi.DefaultInterval).
	CDICheckInterval time.Duration
	// MIGCheckInterval is how often the MIG layout manager checks pending
	// changes and the GPUs' MIG states (0: its default, 5s).
	MIGCheckInterval time.Duration
	// CDIRegenerate is the admin's command that writes the node's CDI spec
	// anew (nvidia-ctk cdi generate), run after every MIG layout change
	// gpufrac-node makes; nil: never run (the admin regenerates the spec).
	CDIRegenerate *CDIRegenerateConfig
	// DRA is how the node meets the kubelet when its config puts it in mode
	// dra.
	DRA DRAConfig
	// NodeResyncInterval is how often writes of the Node's annotations
	// (the GPU inventory, the config error) that failed are tried again
	// (0: DefaultNodeResyncInterval).
	NodeResyncInterval time.Duration
}

// CDIRegenerateConfig is the CDI spec regeneration command (cdi.Regenerator).
type CDIRegenerateConfig struct {
	// Steps are run in order, each an argv whose program is an absolute path.
	Steps [][]string
	// Timeout bounds each step (0: cdi.DefaultRegenerateTimeout).
	Timeout time.Duration
	// Backoff spaces retries of a failed run (zero: cdi.DefaultRegenerateBackoff).
	Backoff wait.Backoff
	// Staged and Output: the steps write the spec to Staged and the agent
	// installs it at Output only once it is a valid spec with devices
	// (cdi.RegenerateOptions); both empty: the steps write the spec
	// themselves.
	Staged, Output string
}

// DefaultNodeResyncInterval is how often failed writes of the Node's
// annotations are tried again by default.
const DefaultNodeResyncInterval = 30 * time.Second

// Agent is a running gpufrac-node.
type Agent struct {
	cfg    Config
	lib    nvidia.Lib
	client kubernetes.Interface // nil: standalone, no API access
	reg    *prometheus.Registry

	manager  *plugin.Manager // nil in mode dra
	dra      *draServing     // nil unless in mode dra
	deps     resource.Deps   // what Build reads; set once in Run
	checker  *health.Checker
	hint     *pods.Hint
	podRes   *pods.PodResources
	watchdog *enforcement.Watchdog
	metrics  *metrics.Metrics
	cdi      *cdi.Checker               // nil unless the device-list strategy is cdi
	regen    *cdi.Regenerator           // nil unless Config.CDIRegenerate is set
	events   events.EventBroadcaster    // nil: standalone
	recorder events.EventRecorderLogger // nil: standalone, events are dropped
	gpus     []nvidia.GPU
	topology []*gpuallocator.Device

	labelsMu   sync.Mutex
	labels     map[string]string // this node's labels, which choose its config group; guarded by labelsMu
	labelsRead bool              // the labels were read (always, without API access); guarded by labelsMu

	applyMu       sync.Mutex                     // serialises config applications
	servingChosen atomic.Bool                    // set once the serving path (device plugins or DRA) is chosen
	registered    atomic.Pointer[plugin.Manager] // the manager, for Ready, once started
	draReady      atomic.Pointer[draServing]     // the DRA driver, for Ready, once started
	cdiChecker    atomic.Pointer[cdi.Checker]    // the CDI check, for Ready, once started

	migLayout  *miglayout.Manager                // nil when the NVML backend has no MIG
	builtin    *config.File                      // the built-in defaults, which never reshape MIG
	failClosed *config.File                      // what an invalid config at start gives: whole GPUs only; never reshapes MIG
	current    *config.File                      // config last applied; guarded by applyMu
	awaiting   *config.File                      // config with node groups waiting for the node's labels (failClosed served meanwhile); guarded by applyMu
	closed     bool                              // serving failClosed since start; guarded by applyMu
	policy     atomic.Pointer[config.NodePolicy] // resolved policy in force

	cfgErrMu       sync.Mutex    // guards configErr and configErrStale; held while writing the annotation
	configErr      *string       // what the Node's config-error annotation must say (nil: absent)
	configErrStale bool          // the annotation may not say configErr: its last write failed
	invMu          sync.Mutex    // guards lastInventory
	lastInventory  string        // last inventory annotation written
	modes          []config.Mode // per-GPU modes in force, by index
}

// New returns an agent on lib; client may be nil (standalone mode).
func New(cfg Config, lib nvidia.Lib, client kubernetes.Interface) *Agent {
	if cfg.HealthQuietPeriod <= 0 {
		cfg.HealthQuietPeriod = 5 * time.Minute
	}
	if cfg.DeviceListStrategy == "" {
		cfg.DeviceListStrategy = resource.StrategyDeviceSpecs
	}
	a := &Agent{cfg: cfg, lib: lib, reg: prometheus.NewRegistry()}
	if client != nil {
		a.client = client
	}
	return a
}

// Registry is the agent's metrics registry.
func (a *Agent) Registry() *prometheus.Registry { return a.reg }

// Ready returns nil once every resource is registered with the kubelet (in
// mode dra: once the kubelet accepted the DRA driver), and the reason
// otherwise (for /readyz). It is safe to call while Run runs.
func (a *Agent) Ready() error {
	if d := a.draReady.Load(); d != nil {
		if !a.draRegistered() {
			return errors.New("DRA driver not registered with the kubelet")
		}
	} else if m := a.registered.Load(); m == nil || !m.Registered() {
		return errors.New("device plugins not registered with the kubelet")
	}
	if c := a.cdiChecker.Load(); c != nil {
		return c.Ready()
	}
	return nil
}

// Resources lists the resources being served (in mode dra, the driver).
func (a *Agent) Resources() []string {
	if a.dra != nil {
		return []string{api.DRADriver}
	}
	if a.manager == nil {
		return nil
	}
	return a.manager.Resources()
}

// Run starts everything and blocks until ctx ends. It fails only when the
// node cannot be served at all (NVML does not start, no kubelet directory),
// or when the DRA driver can no longer serve the kubelet. What the steps
// started is stopped before it returns, in reverse: the serving path,
// PodResources, the components, the event broadcaster (once nothing
// records), NVML.
func (a *Agent) Run(ctx context.Context) error {
	if err := a.startNVML(); err != nil {
		return err
	}
	defer a.stopNVML(ctx)
	if err := a.discoverGPUs(ctx); err != nil {
		return err
	}
	parts := startComponents(ctx)
	defer a.stopComponents(parts)
	ctx = parts.ctx

	// 1. Kubernetes side: events on the Node, node labels, pod hints.
	if err := a.recordEvents(ctx); err != nil {
		return err
	}
	labelsErr := a.readLabels(ctx)
	if a.openPodResources(ctx) {
		defer a.podRes.Close()
	}
	a.startHints(parts)
	// 2. Metrics and health.
	a.startHealth(ctx, parts)
	// 3. The CDI check, and the regeneration of the CDI spec.
	if err := a.startCDIRegeneration(parts); err != nil {
		return err
	}
	if err := a.startCDI(parts); err != nil {
		return err
	}
	// 4. The admin's config: MIG layouts, then the config at start.
	deps := a.startPartitioning(ctx, parts)
	start, err := a.loadConfig(ctx, parts, deps)
	if err != nil {
		return err
	}
	// 5. The serving path, chosen once from the config at start.
	if err := a.startServing(ctx, start.file); err != nil {
		return err
	}
	defer a.stopServing(parts)
	// 6. The config at start served. The watchdog comes first: it reads
	// the DRA driver's claims, and apply sets its policy.
	a.watchdog = a.newWatchdog(ctx, parts)
	if err := a.apply(ctx, start.file, deps); err != nil {
		return fmt.Errorf("applying config: %w", err)
	}
	a.reportFailingClosed(ctx, parts, deps, start.err, labelsErr)
	// 7. The Node's annotations kept written, the watchdog run.
	a.startNodeResync(parts)
	parts.Go("memory-watchdog", a.watchdog.Run)
	return a.serve(ctx)
}

// startNVML starts NVML; stopNVML shuts it down.
func (a *Agent) startNVML() error {
	if err := a.lib.Init(); err != nil {
		return fmt.Errorf("starting NVML: %w", err)
	}
	return nil
}

func (a *Agent) stopNVML(ctx context.Context) {
	if err := a.lib.Shutdown(); err != nil {
		klog.FromContext(ctx).Error(err, "Shutting down NVML")
	}
}

// discoverGPUs lists the GPUs and their topology. Without the topology
// whole GPUs are allocated in index order.
func (a *Agent) discoverGPUs(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	gpus, err := a.lib.GPUs()
	if err != nil {
		return fmt.Errorf("listing GPUs: %w", err)
	}
	a.gpus = gpus
	if a.topology, err = nvidia.AllocatorDevices(a.lib); err != nil {
		logger.Error(err, "GPU topology unavailable; whole GPUs are allocated in index order")
	}
	logger.Info("Discovered GPUs", "count", len(gpus), "node", a.cfg.NodeName)
	return nil
}

// components runs the agent's long-lived parts, each in a goroutine on one
// context, and stops them together.
type components struct {
	ctx    context.Context
	cancel context.CancelFunc
	logger klog.Logger
	wg     sync.WaitGroup
}

// startComponents returns components on a context that ends with ctx or
// with stop.
func startComponents(ctx context.Context) *components {
	c := &components{logger: klog.FromContext(ctx)}
	c.ctx, c.cancel = context.WithCancel(ctx)
	return c
}

// Go runs fn until the components' context ends. An error it returns
// before then is logged; the others run on.
func (c *components) Go(name string, fn func(context.Context) error) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		if err := fn(c.ctx); err != nil && c.ctx.Err() == nil {
			c.logger.Error(err, "Component stopped", "component", name)
		}
	}()
}

// stop cancels the components' context and waits for every one to return.
func (c *components) stop() {
	c.cancel()
	c.wg.Wait()
}

// stopComponents stops the components, then the event broadcaster: a Run
// that fails half-way stops what it started (cancel before waiting, or it
// waits for them forever), and nothing records once the broadcaster goes.
func (a *Agent) stopComponents(parts *components) {
	parts.stop()
	if a.events != nil {
		a.events.Shutdown()
	}
}

// recordEvents starts the event broadcaster (events on the Node and on
// pods) with API access; without, events are dropped.
func (a *Agent) recordEvents(ctx context.Context) error {
	if a.client == nil {
		return nil
	}
	var err error
	a.events, a.recorder, err = startEvents(ctx, a.client)
	return err
}

// openPodResources opens the kubelet's PodResources socket and tells
// whether it did (then Run closes it). Without it gpufrac-node cannot tell
// which GPUs are held, and refuses what would need it.
func (a *Agent) openPodResources(ctx context.Context) bool {
	logger := klog.FromContext(ctx)
	if a.cfg.PodResourcesSocket != "" {
		pr, err := pods.NewPodResources(a.cfg.PodResourcesSocket, 100*time.Millisecond, nil)
		if err != nil {
			logger.Error(err, "PodResources unavailable; placement ignores existing allocations")
		} else {
			a.podRes = pr
		}
	}
	if a.podRes == nil {
		logger.Info("Without the kubelet's PodResources gpufrac-node cannot tell which GPUs are held whole or shared: it refuses whole GPUs, fractions and replicas")
		return false
	}
	return true
}

// startHints starts the pod hint (which pod an allocation is for, from the
// node's pods) with API access. It starts before the serving path, so its
// informer syncs while the device plugins register.
func (a *Agent) startHints(parts *components) {
	if a.client == nil {
		return
	}
	a.hint = pods.NewHint(a.client, a.cfg.NodeName, a.podRes, pods.WithSchedulerName(a.cfg.SchedulerName))
	parts.Go("pod-hints", a.hint.Run)
}

// usage is what the kubelet has allocated, from PodResources (nil without).
func (a *Agent) usage() resource.UsageSource {
	if a.podRes == nil {
		return nil
	}
	return a.podRes
}

// startHealth starts the GPU health checker and registers the metrics.
// A health change updates the device plugins (or republishes the DRA
// devices, tainted or not) and the inventory; a critical Xid is an event
// on the Node.
func (a *Agent) startHealth(ctx context.Context, parts *components) {
	logger := klog.FromContext(ctx)
	uuids := make([]string, len(a.gpus))
	for i, g := range a.gpus {
		uuids[i] = g.UUID
	}
	a.checker = health.NewChecker(a.lib, uuids, health.Options{
		IgnoredXids:   a.cfg.IgnoredXids,
		QuietPeriod:   a.cfg.HealthQuietPeriod,
		ProbeInterval: a.cfg.HealthProbeInterval,
		OnChange: func() {
			if a.manager != nil {
				a.manager.UpdateAll()
			}
			if a.dra != nil {
				// Taint (or untaint) every device of the GPU.
				if err := a.apply(ctx, nil, a.deps); err != nil {
					logger.Error(err, "Republishing DRA devices after a health change")
				}
			}
			a.publishInventory(ctx)
		},
		OnXid: func(ev nvidia.XidEvent, critical bool) {
			if a.metrics != nil {
				a.metrics.Xid(ev, critical)
			}
			if critical {
				a.nodeEvent(corev1.EventTypeWarning, "GPUXid", actionCheckHealth, "GPU %s reported critical Xid %d; unhealthy for %s", ev.UUID, ev.Xid, a.cfg.HealthQuietPeriod)
			}
		},
	})
	a.metrics = metrics.New(a.reg, metrics.Sources{
		Lib: a.lib, GPUs: func() []nvidia.GPU { return a.gpus }, Healthy: a.checker.Healthy, Usage: a.usage(),
	}, a.cfg.Version)
	a.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	parts.Go("health", a.checker.Run)
}

// startCDI starts the CDI check with the cdi device-list strategy: every
// device name handed out must resolve in the node's CDI specs (written by
// the NVIDIA container toolkit), checked now, on spec changes and after
// every config or MIG layout change.
func (a *Agent) startCDI(parts *components) error {
	if a.cfg.DeviceListStrategy != resource.StrategyCDI {
		return nil
	}
	var startTriggered bool // only Run's goroutine calls OnChange
	c, err := cdi.New(cdi.Options{
		SpecDirs: a.cfg.CDISpecDirs, Interval: a.cfg.CDICheckInterval, Registerer: a.reg,
		OnChange: func(st cdi.Status) {
			if st.OK() {
				a.nodeEvent(corev1.EventTypeNormal, "CDISpecResolved", actionCheckCDI, "every GPU and MIG device served resolves in the node's CDI specs")
				return
			}
			a.nodeEvent(corev1.EventTypeWarning, "CDISpecMissing", actionCheckCDI, "%s", a.cdi.Describe(st))
			// Once at start, unless a MIG layout change already ran it: a
			// spec generated before this node's MIG layout was (re)made,
			// or none at all.
			if a.regen != nil && !startTriggered && !a.regen.Triggered() {
				startTriggered = true
				a.regen.Trigger("devices served were missing from the CDI specs at start")
			}
		},
	})
	if err != nil {
		return err
	}
	a.cdi = c
	a.cdiChecker.Store(c)
	parts.Go("cdi", c.Run)
	return nil
}

// startCDIRegeneration starts the admin's CDI spec regeneration command,
// when configured: run after every MIG layout change gpufrac-node makes
// (apply) and once at start if the CDI check finds devices missing; a
// failure is a Warning event and retried with backoff, never fatal.
func (a *Agent) startCDIRegeneration(parts *components) error {
	rc := a.cfg.CDIRegenerate
	if rc == nil {
		return nil
	}
	r, err := cdi.NewRegenerator(cdi.RegenerateOptions{
		Steps: rc.Steps, Timeout: rc.Timeout, Backoff: rc.Backoff, Registerer: a.reg, Staged: rc.Staged, Output: rc.Output,
		OnResult: func(why string, err error) {
			if err != nil {
				a.nodeEvent(corev1.EventTypeWarning, "CDISpecRegenerationFailed", actionRegenerateCDI,
					"the CDI spec regeneration command failed (run because %s): %v; retried with backoff, and the devices it would add stay out of the CDI specs until it succeeds (gpufrac-node's log has its output)", why, err)
				return
			}
			a.nodeEvent(corev1.EventTypeNormal, "CDISpecRegenerated", actionRegenerateCDI, "the CDI spec regeneration command succeeded (run because %s)", why)
		},
	})
	if err != nil {
		return err
	}
	a.regen = r
	parts.Go("cdi-regenerate", r.Run)
	return nil
}

// configAtStart is the config at start, and why the node fails closed
// instead (nil: it does not).
type configAtStart struct {
	file *config.File
	err  error
}

// loadConfig reads the admin's config and starts watching it: a valid
// change is applied, a rejected one keeps the last good config and is an
// event on the Node. A config at start that does not load or check gives
// failClosed (whole GPUs only) and the reason. Without a config file the
// built-in defaults are served.
func (a *Agent) loadConfig(ctx context.Context, parts *components, deps resource.Deps) (configAtStart, error) {
	logger := klog.FromContext(ctx)
	check := func(f *config.File) error { return a.check(ctx, f, deps) }
	a.builtin = &config.File{Version: config.Version}
	a.failClosed = &config.File{Version: config.Version, Default: config.Policy{Mode: config.ModeExclusive}}
	start := configAtStart{file: a.builtin}
	if a.cfg.ConfigFile == "" {
		return start, nil
	}
	w, err := config.NewWatcher(a.cfg.ConfigFile,
		config.WithRegisterer(a.reg),
		config.WithCheck(check),
		config.WithOnChange(func(_, f *config.File) {
			logger.Info("Config changed; applying")
			if err := a.apply(ctx, f, deps); err != nil {
				logger.Error(err, "Applying new config")
			}
		}),
		config.WithOnReject(func(err error) {
			logger.Error(err, "Config rejected; keeping the last good config")
			a.nodeEvent(corev1.EventTypeWarning, "GPUConfigRejected", actionLoadConfig, "gpufrac-node kept its last good config: %v", err)
		}))
	if err != nil {
		return start, fmt.Errorf("watching config: %w", err)
	}
	f, err := w.Load(ctx)
	if err == nil {
		err = check(f)
	}
	if err != nil {
		start = configAtStart{file: a.failClosed, err: err}
	} else {
		start.file = f
	}
	parts.Go("config", w.Run)
	return start, nil
}

// startServing starts the serving path, chosen once from the config at
// start: the DRA driver for a node in mode dra, device plugins otherwise
// (a config that does not resolve, for want of the node's labels say,
// serves device plugins). Until it is chosen, check accepts either path;
// from then on a config that moves the node to the other path is refused.
// The device plugins register again when the kubelet restarts, and tell
// PodResources (allocObserver.KubeletRestarted).
func (a *Agent) startServing(ctx context.Context, f *config.File) error {
	if np, err := f.Resolve(a.nodeLabels(), len(a.gpus)); err == nil && np.DRA && !a.cfg.DRA.Disabled {
		if err := a.startDRA(ctx); err != nil {
			return err
		}
		a.draReady.Store(a.dra)
	} else {
		a.manager = plugin.NewManager(a.cfg.KubeletDir, allocObserver{a})
		if err := a.manager.Start(ctx); err != nil {
			return fmt.Errorf("starting device plugins: %w", err)
		}
		a.registered.Store(a.manager)
	}
	a.servingChosen.Store(true)
	return nil
}

// stopServing stops the serving path: the DRA driver's servers and slice
// publishing, or the device plugins. Those stop with the components'
// context, which it ends first: a Run that failed after they started
// would otherwise wait for them forever.
func (a *Agent) stopServing(parts *components) {
	if a.dra != nil {
		a.stopDRA()
		return
	}
	parts.cancel()
	a.manager.Wait()
}

// reportFailingClosed reports the node failing closed (an event and the
// Node's config-error annotation) when the config at start is unusable
// (startErr), or when a config with node groups waits for the node's
// labels, which could not be read at start (labelsErr). Those are then
// read until they can be, and the config that waited is applied
// (awaitLabels). Whether a config waits is read before that starts, as
// awaitLabels applies it.
func (a *Agent) reportFailingClosed(ctx context.Context, parts *components, deps resource.Deps, startErr, labelsErr error) {
	if labelsErr != nil {
		a.applyMu.Lock()
		awaiting := a.awaiting != nil
		a.applyMu.Unlock()
		if startErr == nil && awaiting {
			startErr = fmt.Errorf("the node's labels, which choose its config group, cannot be read: %w", labelsErr)
		}
		parts.Go("node-labels", func(ctx context.Context) error { return a.awaitLabels(ctx, deps) })
	}
	if startErr != nil {
		a.reportFailClosed(ctx, startErr)
	}
}

// startNodeResync starts retrying failed writes of the Node's annotations
// (the GPU inventory, the config error), with API access and a node name.
func (a *Agent) startNodeResync(parts *components) {
	if a.client != nil && a.cfg.NodeName != "" {
		parts.Go("node-annotations", a.resyncNode)
	}
}

// serve blocks until ctx ends (nil) or the DRA driver reports a fatal
// error (returned: gpufrac-node exits to be restarted rather than stay
// deaf to the kubelet).
func (a *Agent) serve(ctx context.Context) error {
	var draFatal chan error // nil without DRA: never ready
	if a.dra != nil {
		draFatal = a.dra.fatal
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-draFatal:
		return fmt.Errorf("the DRA driver %s cannot serve the kubelet any more: %w", api.DRADriver, err)
	}
}

// check tells whether f can be applied: it resolves for this node, keeps
// the serving path chosen at start, and builds (device-plugin resources or
// the DRA pool).
func (a *Agent) check(ctx context.Context, f *config.File, deps resource.Deps) error {
	np, err := f.Resolve(a.nodeLabels(), len(a.gpus))
	if err != nil {
		return err
	}
	if np.DRA && a.cfg.DRA.Disabled {
		return ErrDRADisabled
	}
	if a.servingChosen.Load() && np.DRA != (a.dra != nil) {
		return ErrServingChanged
	}
	if np.DRA {
		_, err := a.buildDRA(ctx, np)
		return err
	}
	_, err = a.build(ctx, f, deps)
	return err
}

// build resolves f for this node and builds its resources. A GPU whose MIG
// state NVML cannot read is left out (logged) and served again at the MIG
// layout manager's next check where it can be read then, as mode dra does
// (migEnabled).
func (a *Agent) build(ctx context.Context, f *config.File, deps resource.Deps) ([]resource.Resource, error) {
	np, err := f.Resolve(a.nodeLabels(), len(a.gpus))
	if err != nil {
		return nil, err
	}
	deps.Policy = &np
	deps.Unread = func(g nvidia.GPU, err error) {
		klog.FromContext(ctx).Error(err, "Cannot read the GPU's MIG state; the GPU is not served until it can be read", "gpu", g.UUID)
		a.oweMIGRebuild()
	}
	return resource.Build(np.GPUModes, a.gpus, deps)
}

// apply applies f (nil: the config waiting for the node's labels, else the
// config last applied, for the MIG layout manager's retries and once the
// labels are read): MIG layouts first, then the resources Build derives.
//
// A config with node groups is applied only once the node's labels are
// known: without them no group matches, and the default policy would be
// served on a node its admin configured otherwise (shared where it meant
// exclusive, say). Until then the node fails closed (failClosed) and the
// config waits (awaiting).
func (a *Agent) apply(ctx context.Context, f *config.File, deps resource.Deps) error {
	a.applyMu.Lock()
	defer a.applyMu.Unlock()
	if f == nil {
		if f = a.awaiting; f == nil {
			if f = a.current; f == nil {
				return nil
			}
		}
	}
	if f != a.failClosed {
		a.awaiting = nil
		if len(f.Groups) > 0 && !a.labelsKnown() {
			a.awaiting, f = f, a.failClosed
		}
	}
	// The serving path was chosen at start, perhaps before the labels
	// could be read: a config that now puts the node on the other path
	// needs a restart, and the node fails closed until then.
	if f != a.failClosed && a.servingChosen.Load() {
		if np, err := f.Resolve(a.nodeLabels(), len(a.gpus)); err == nil && np.DRA != (a.dra != nil) {
			why := ErrServingChanged
			if np.DRA && a.cfg.DRA.Disabled {
				why = ErrDRADisabled
			}
			a.reportFailClosed(ctx, fmt.Errorf("the node's labels, read after start, choose its config group: %w", why))
			f = a.failClosed
		}
	}
	// Reshape MIG before Build reads it; only an admin's config does, so a
	// missing or broken config file never destroys a MIG layout.
	if np, err := f.Resolve(a.nodeLabels(), len(a.gpus)); err == nil && a.migLayout != nil && f != a.builtin && f != a.failClosed {
		a.regenerateAfter(a.migLayout.Apply(ctx, np))
	} else if a.migLayout != nil && (f == a.builtin || f == a.failClosed) {
		a.migLayout.Forget()
	}
	if a.dra != nil {
		if err := a.applyDRALocked(ctx, f); err != nil {
			a.oweMIGRebuild()
			return err
		}
	} else if err := a.applyPluginsLocked(ctx, f, deps); err != nil {
		a.oweMIGRebuild()
		return err
	}
	a.current = f
	switch {
	case f == a.failClosed:
		a.closed = true
	case a.closed:
		a.closed = false
		a.reportReopened(ctx)
	}
	return nil
}

// oweMIGRebuild has the MIG layout manager retry the apply: it recorded the
// GPUs' MIG states before this apply failed, so it would not notice them
// again.
func (a *Agent) oweMIGRebuild() {
	if a.migLayout != nil {
		a.migLayout.Owe()
	}
}

// regenerateAfter triggers the CDI spec regeneration when the MIG layout
// manager changed a GPU: its new MIG devices are in no spec yet.
func (a *Agent) regenerateAfter(statuses []miglayout.Status) {
	if a.regen == nil {
		return
	}
	var changed []string
	for _, s := range statuses {
		if s.Changed {
			changed = append(changed, strconv.Itoa(s.Index))
		}
	}
	if len(changed) > 0 {
		a.regen.Trigger("gpufrac-node changed the MIG layout of GPU " + strings.Join(changed, ", "))
	}
}

// applyPluginsLocked serves the device-plugin resources of f (applyMu held).
func (a *Agent) applyPluginsLocked(ctx context.Context, f *config.File, deps resource.Deps) error {
	res, err := a.build(ctx, f, deps)
	if err != nil {
		return err
	}
	if a.cdi != nil {
		res = a.cdi.Checked(res)
	}
	if np, err := f.Resolve(a.nodeLabels(), len(a.gpus)); err == nil {
		a.invMu.Lock()
		a.modes = np.GPUModes
		a.invMu.Unlock()
		a.policy.Store(&np)
		if a.watchdog != nil {
			a.watchdog.SetPolicy(enforcement.PolicyOf(np.Policy))
		}
		a.publishInventory(ctx)
	}
	if err := a.manager.Apply(ctx, res); err != nil {
		return err
	}
	klog.FromContext(ctx).Info("Serving resources", "resources", a.manager.Resources())
	return nil
}

// failClosedDRA is failClosed for a node in mode dra: every GPU published
// whole (exclusive), nothing shared, no MIG reshaped.
var failClosedDRA = &config.File{Version: config.Version,
	Default: config.Policy{Mode: config.ModeDRA, DRA: config.DRAConfig{GPUMode: config.ModeExclusive}}}

// applyDRALocked publishes the DRA pool of f (applyMu held); failing
// closed, every GPU whole.
func (a *Agent) applyDRALocked(ctx context.Context, f *config.File) error {
	g := f
	if f == a.failClosed {
		g = failClosedDRA
	}
	np, err := g.Resolve(a.nodeLabels(), len(a.gpus))
	if err != nil {
		return err
	}
	if !np.DRA {
		return ErrServingChanged
	}
	if err := a.publishDRA(ctx, np); err != nil {
		return err
	}
	a.invMu.Lock()
	a.modes = np.GPUModes
	a.invMu.Unlock()
	a.policy.Store(&np)
	if a.watchdog != nil {
		a.watchdog.SetPolicy(enforcement.PolicyOf(np.Policy))
	}
	a.publishInventory(ctx)
	return nil
}

// readLabels reads this node's labels, which choose its config group,
// trying a few times (startLabelsBackoff: six reads within about three
// seconds). Without API access there are none to read. It returns why they
// could not be read; awaitLabels keeps trying.
func (a *Agent) readLabels(ctx context.Context) error {
	if a.client == nil {
		a.setLabels(nil)
		return nil
	}
	var err error
	_ = wait.ExponentialBackoffWithContext(ctx, startLabelsBackoff, func(ctx context.Context) (bool, error) {
		err = a.getLabels(ctx)
		return err == nil, nil
	})
	if err == nil {
		return nil
	}
	klog.FromContext(ctx).Error(err, "Reading node labels failed; configs with node groups wait for them, whole GPUs only meanwhile", "node", a.cfg.NodeName)
	return err
}

// getLabels reads the node's labels once.
func (a *Agent) getLabels(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	node, err := a.client.CoreV1().Nodes().Get(rctx, a.cfg.NodeName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading node %s: %w", a.cfg.NodeName, err)
	}
	a.setLabels(node.Labels)
	return nil
}

// awaitLabels reads the node's labels until it succeeds or ctx ends,
// waiting labelsBackoff between reads (1 s doubling up to
// maxLabelsBackoff, jittered), then applies the config that waited for
// them.
func (a *Agent) awaitLabels(ctx context.Context, deps resource.Deps) error {
	delay := labelsBackoff.DelayFunc()
	err := delay.Until(ctx, false, true, func(ctx context.Context) (bool, error) {
		if err := a.getLabels(ctx); err != nil {
			klog.FromContext(ctx).V(2).Info("Reading node labels failed; will retry", "node", a.cfg.NodeName, "err", err)
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return nil // ctx ended
	}
	klog.FromContext(ctx).Info("Read the node's labels; applying the config that waited for them", "node", a.cfg.NodeName)
	return a.apply(ctx, nil, deps)
}

// maxLabelsBackoff bounds the wait between two reads of the node's labels.
const maxLabelsBackoff = 30 * time.Second

// The waits between reads of the node's labels are up to 10 % longer at
// random, so a rollout's agents do not retry in step.
var (
	// startLabelsBackoff: readLabels reads six times, 200, 320, 510, 820
	// and 1310 ms apart (the start of the agent waits for them).
	startLabelsBackoff = wait.Backoff{Duration: 200 * time.Millisecond, Factor: 1.6, Jitter: 0.1, Steps: 6}
	// labelsBackoff: awaitLabels waits 1 s, doubling up to
	// maxLabelsBackoff, then steady until ctx ends.
	labelsBackoff = wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.1, Steps: math.MaxInt32, Cap: maxLabelsBackoff}
)

func (a *Agent) setLabels(l map[string]string) {
	a.labelsMu.Lock()
	a.labels, a.labelsRead = l, true
	a.labelsMu.Unlock()
}

// nodeLabels is this node's labels as last read (nil before).
func (a *Agent) nodeLabels() map[string]string {
	a.labelsMu.Lock()
	defer a.labelsMu.Unlock()
	return a.labels
}

// labelsKnown tells whether the node's labels were read.
func (a *Agent) labelsKnown() bool {
	a.labelsMu.Lock()
	defer a.labelsMu.Unlock()
	return a.labelsRead
}

// allocObserver counts allocations, tells PodResources which devices were
// just given and drops its cache: the kubelet records an allocation only
// after Allocate returns, and the next admission must see it (a whole GPU
// must never be given while a fraction on it is still unlisted).
type allocObserver struct{ a *Agent }

func (o allocObserver) Allocated(res string, ids []string, d time.Duration, err error) {
	o.a.metrics.Allocated(res, ids, d, err)
	if o.a.podRes == nil {
		return
	}
	if err == nil {
		o.a.podRes.Answered(res, ids)
	}
	o.a.podRes.Invalidate()
}

// KubeletRestarted implements plugin.RestartObserver: PodResources waits
// for the restarted kubelet's pods before it calls GPUs free.
func (o allocObserver) KubeletRestarted() {
	if o.a.podRes != nil {
		o.a.podRes.KubeletRestarted()
	}
}

// newWatchdog builds the GPU memory watchdog. Without API access it cannot
// map processes to pods, so it only reports; without PodResources no
// container has a known limit. Its policy is set by apply.
func (a *Agent) newWatchdog(ctx context.Context, parts *components) *enforcement.Watchdog {
	o := enforcement.Options{
		GPUs: a.gpus, Processes: a.lib, Resolver: enforcement.ProcFS{Root: a.cfg.ProcRoot},
		Killer: enforcement.NewKiller(a.cfg.ProcRoot), Registerer: a.reg,
	}
	if a.podRes != nil {
		o.Devices = a.podRes
	}
	if a.dra != nil {
		o.Claims = a.dra.driver
	}
	if a.client == nil {
		klog.FromContext(ctx).Info("No API access: the GPU memory watchdog cannot map processes to pods and only reports")
		return enforcement.New(o)
	}
	o.Evictor, o.Recorder = enforcement.NewEvictor(a.client.PolicyV1()), a.recorder
	if inf, err := enforcement.NewPodInformer(a.client, a.cfg.NodeName); err != nil {
		klog.FromContext(ctx).Error(err, "GPU memory watchdog cannot watch pods; it only reports")
	} else {
		o.Pods = inf
		parts.Go("memory-watchdog-pods", inf.Run)
	}
	return enforcement.New(o)
}

// startPartitioning starts the MIG layout manager (when the NVML backend
// supports MIG) and the time-slicing metrics, and returns what Build reads
// (also kept as a.deps): the topology, health, PodResources, pod hints and
// the MIG inventory. Pending MIG changes are retried by applying the
// current config again.
func (a *Agent) startPartitioning(ctx context.Context, parts *components) resource.Deps {
	deps := &resource.Deps{Topology: a.topology, Health: a.checker.Healthy, Usage: a.usage(), Strategy: a.cfg.DeviceListStrategy}
	if a.hint != nil {
		deps.Hint = a.hint
	}
	var allocs miglayout.AllocationsFunc
	if a.podRes != nil {
		allocs = a.allocations
	}
	metrics.NewTimesliceCollector(a.reg, metrics.TimesliceSources{Offer: a.timesliceOffer, Allocations: allocs})
	if lib, ok := a.lib.(nvidia.MIGLib); ok {
		deps.MIG = lib
		a.migLayout = miglayout.NewManager(lib, a.gpus, miglayout.Options{
			Allocations: allocs,
			Registerer:  a.reg,
			Interval:    a.cfg.MIGCheckInterval,
			Event: func(warning bool, reason, message string) {
				typ := corev1.EventTypeNormal
				if warning {
					typ = corev1.EventTypeWarning
				}
				a.nodeEvent(typ, reason, actionReshapeMIG, "%s", message)
			},
			Retry: func(ctx context.Context) error {
				return a.apply(ctx, nil, *deps)
			},
		})
		parts.Go("mig-layout", a.migLayout.Run)
	}
	a.deps = *deps
	return *deps
}

// allocations lists the device IDs the kubelet has allocated, by resource.
func (a *Agent) allocations(ctx context.Context) (map[string][]string, error) {
	as, err := a.podRes.List(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for _, x := range as {
		out[x.Resource] = append(out[x.Resource], x.DeviceIDs...)
	}
	if a.dra != nil {
		// What prepared claims hold, by GPU and MIG UUID: PodResources
		// names claim devices only by the driver's device names.
		out[api.DRADriver] = append(out[api.DRADriver], a.draAllocations()...)
	}
	return out, nil
}

// timesliceOffer is the time-slicing of the policy in force.
func (a *Agent) timesliceOffer() metrics.TimesliceOffer {
	np := a.policy.Load()
	if np == nil {
		return metrics.TimesliceOffer{}
	}
	o := metrics.TimesliceOffer{Sharing: np.Policy.Timeslice.Sharing()}
	for i, m := range np.GPUModes {
		if m == config.ModeTimeslice && i < len(a.gpus) {
			o.GPUs = append(o.GPUs, a.gpus[i].UUID)
		}
	}
	return o
}
