// Command gpufrac-node is the node agent: a kubelet device plugin serving
// whole, fractional, time-sliced and MIG GPUs discovered through NVML, or,
// on nodes whose config says mode dra, the DRA driver gpu.gpufrac.io.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/cmd/internal/probes"
	"github.com/gpufrac/gpufrac/cmd/internal/version"
	"github.com/gpufrac/gpufrac/deviceplugin/agent"
	"github.com/gpufrac/gpufrac/deviceplugin/cdi"
	"github.com/gpufrac/gpufrac/deviceplugin/dra"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/deviceplugin/pods"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
)

func main() {
	klog.InitFlags(nil)
	var o options
	cfg := &o.cfg
	flag.StringVar(&cfg.NodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME)")
	flag.StringVar(&cfg.KubeletDir, "kubelet-dir", "/var/lib/kubelet/device-plugins", "the kubelet's device-plugin directory")
	flag.StringVar(&cfg.PodResourcesSocket, "pod-resources-socket", "/var/lib/kubelet/pod-resources/kubelet.sock", "the kubelet's PodResources socket (empty disables)")
	flag.StringVar(&cfg.ConfigFile, "config", "", "the admin's partitioning config file (a mounted ConfigMap key); empty serves the defaults")
	flag.StringVar(&o.nvml, "nvml", "real", "NVML backend: real, mock:dgxh100 or mock:dgxa100")
	flag.IntVar(&o.mockGPUs, "mock-gpus", 0, "with a mock backend: the number of GPUs (0: the DGX's eight)")
	flag.StringVar(&o.mockState, "mock-state-dir", "", "with a mock backend: directory whose files set fake processes, memory use and Xid events")
	flag.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig for API access; empty uses the in-cluster config, or runs standalone outside a cluster")
	flag.StringVar(&o.metricsAddr, "metrics-addr", "127.0.0.1:9400", "address of /metrics, /healthz and /readyz (empty disables); loopback by default, the manifests bind the pod IP")
	flag.StringVar(&cfg.ProcRoot, "proc-root", "/proc", "procfs the GPU memory watchdog maps NVML's host PIDs through (gpufrac-node runs with hostPID); tests point it at a fixture tree")
	flag.StringVar(&o.strategy, "device-list-strategy", string(resource.StrategyDeviceSpecs), "how GPUs reach containers: device-specs or cdi")
	flag.DurationVar(&cfg.HealthQuietPeriod, "health-quiet-period", 5*time.Minute, "a GPU is healthy again after this long without a critical Xid")
	flag.DurationVar(&cfg.HealthProbeInterval, "health-probe-interval", time.Second, "how often GPUs are probed through NVML")
	flag.StringVar(&o.ignoredXids, "ignored-xids", "", "comma-separated Xids that never mark a GPU unhealthy, replacing the default application Xids 13,31,43,45,68,109")
	flag.StringVar(&cfg.SchedulerName, "scheduler-name", api.SchedulerName, "the coordinator's scheduler name: the gpufrac.io/gpu placement hint is read only from pods with this spec.schedulerName")
	flag.StringVar(&o.cdiSpecDirs, "cdi-spec-dirs", strings.Join(cdi.DefaultSpecDirs, ","), "with --device-list-strategy=cdi: comma-separated CDI spec directories every device handed out must resolve in")
	flag.DurationVar(&cfg.CDICheckInterval, "cdi-check-interval", cdi.DefaultInterval, "with --device-list-strategy=cdi: how often the CDI specs are checked (they are also watched)")
	flag.Func("cdi-regenerate-command", "a step of the admin's command that writes the node's CDI spec anew (nvidia-ctk cdi generate ...), run after every MIG layout change gpufrac-node makes and once at start if devices served are missing from the specs: the program's absolute path and its arguments, separated by spaces (no shell, no quoting); repeat the flag for more steps, run in order. Unset: never run", func(v string) error {
		argv := strings.Fields(v)
		if len(argv) == 0 {
			return errors.New("empty command")
		}
		o.regenSteps = append(o.regenSteps, argv)
		return cdi.ParseSteps(o.regenSteps)
	})
	flag.DurationVar(&o.regenTimeout, "cdi-regenerate-timeout", cdi.DefaultRegenerateTimeout, "with --cdi-regenerate-command: how long each step may run before it is killed (and retried with backoff)")
	flag.StringVar(&o.regenStaged, "cdi-regenerate-staged", "", "with --cdi-regenerate-command and --cdi-regenerate-output: where the steps write the new spec (a path only gpufrac-node and the steps use); gpufrac-node installs it at --cdi-regenerate-output only once the CDI library reads it as a valid nvidia.com/gpu spec with devices. Unset: the steps write the spec where the runtime reads it themselves")
	flag.StringVar(&o.regenOutput, "cdi-regenerate-output", "", "with --cdi-regenerate-staged: the spec file the container runtime reads (in a CDI spec directory), replaced atomically by a valid staged spec")
	flag.BoolVar(&o.standaloneOK, "allow-standalone", true, "run without API access when no kubeconfig and no in-cluster config exist")
	printVersion := flag.Bool("version", false, "print the version and exit")
	draOn := flag.Bool("dra", true, "serve nodes whose config says mode dra as the DRA driver "+api.DRADriver+"; false refuses such a config (the node fails closed or keeps its last good config), for a pod without the kubelet's plugin directories or RBAC on resource.k8s.io")
	flag.StringVar(&cfg.DRA.RegistryDir, "kubelet-registry-dir", kubeletplugin.KubeletRegistryDir, "mode dra: the kubelet's plugin registration directory")
	flag.StringVar(&cfg.DRA.PluginDir, "dra-plugin-dir", filepath.Join(kubeletplugin.KubeletPluginsDir, api.DRADriver), "mode dra: the driver's directory (its DRA socket)")
	flag.StringVar(&cfg.DRA.StateDir, "dra-state-dir", "", "mode dra: where the record of prepared claims is kept across restarts (default --dra-plugin-dir)")
	flag.StringVar(&cfg.DRA.CDIDir, "cdi-dir", dra.DefaultCDIDir, "mode dra: where per-claim CDI specs are written for the container runtime")
	flag.Parse()
	cfg.DRA.Disabled = !*draOn
	if *printVersion {
		fmt.Println("gpufrac-node", version.Get())
		return
	}

	// The agent's live heap is 3-4 MB and grows slowly at idle; at the
	// default GOGC=100 it doubles before each collection, which shows as
	// about 2 MiB of resident memory (docs/benchmarks-history.md, gpufrac-node).
	// GC runs stay rare at 50. GOGC in the environment wins.
	if _, ok := os.LookupEnv("GOGC"); !ok {
		debug.SetGCPercent(50)
	}
	if err := run(o); err != nil {
		klog.ErrorS(err, "gpufrac-node failed")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
	klog.Flush()
}

// options are the command line.
type options struct {
	cfg          agent.Config
	metricsAddr  string
	nvml         string
	mockState    string
	mockGPUs     int
	kubeconfig   string
	strategy     string
	ignoredXids  string
	cdiSpecDirs  string
	regenSteps   [][]string
	regenTimeout time.Duration
	regenStaged  string
	regenOutput  string
	standaloneOK bool
}

func run(o options) error {
	cfg := o.cfg
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx = klog.NewContext(ctx, klog.Background())
	cfg.Version = version.Get()

	var err error
	if cfg.DeviceListStrategy, err = resource.ParseDeviceListStrategy(o.strategy); err != nil {
		return err
	}
	for _, d := range strings.Split(o.cdiSpecDirs, ",") {
		if d = strings.TrimSpace(d); d != "" {
			cfg.CDISpecDirs = append(cfg.CDISpecDirs, d)
		}
	}
	if len(o.regenSteps) > 0 {
		if o.regenTimeout <= 0 {
			return fmt.Errorf("--cdi-regenerate-timeout=%s: want a positive duration", o.regenTimeout)
		}
		cfg.CDIRegenerate = &agent.CDIRegenerateConfig{Steps: o.regenSteps, Timeout: o.regenTimeout, Staged: o.regenStaged, Output: o.regenOutput}
	} else if o.regenStaged != "" || o.regenOutput != "" {
		return errors.New("--cdi-regenerate-staged and --cdi-regenerate-output need --cdi-regenerate-command")
	}
	if o.ignoredXids != "" {
		for _, s := range strings.Split(o.ignoredXids, ",") {
			x, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
			if err != nil {
				return fmt.Errorf("--ignored-xids: %q is not an Xid number", s)
			}
			cfg.IgnoredXids = append(cfg.IgnoredXids, x)
		}
	}
	lib, err := newLib(ctx, o.nvml, o.mockState, cfg.NodeName, o.mockGPUs)
	if err != nil {
		return err
	}
	client, rc, err := newClient(o.kubeconfig, o.standaloneOK)
	if err != nil {
		return err
	}
	if rc != nil {
		// Mode dra reads claims and publishes ResourceSlices through the
		// kubeletplugin and resourceslice helpers, on a clientset with its
		// own token bucket: a claim the kubelet waits for does not queue
		// behind the agent's events and pod patches.
		cfg.DRA.NewClient = func() (kubernetes.Interface, error) {
			c := rest.CopyConfig(rc)
			c.RateLimiter = nil
			return kubernetes.NewForConfig(pods.WithDefaults(c))
		}
	}
	var a *agent.Agent
	switch {
	case client == nil:
		a = agent.New(cfg, lib, nil) // a nil *kubernetes.Clientset would not be a nil kubernetes.Interface
	case cfg.NodeName == "":
		return errors.New("--node-name (or $NODE_NAME) is required with API access")
	default:
		a = agent.New(cfg, lib, client)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if o.metricsAddr != "" {
		srv, err := probes.Start(ctx, o.metricsAddr, a.Registry(), a.Ready)
		if err != nil {
			return err
		}
		defer func() { cancel(); srv.Wait() }()
	}
	return a.Run(ctx)
}

func newLib(ctx context.Context, flagValue, stateDir, nodeName string, gpus int) (nvidia.Lib, error) {
	if flagValue == "real" {
		return nvidia.NewReal(), nil
	}
	model, ok := strings.CutPrefix(flagValue, "mock:")
	if !ok {
		return nil, fmt.Errorf("--nvml=%q: want real or mock:<model> (%s)", flagValue, strings.Join(nvidia.MockModels(), ", "))
	}
	// Stable UUIDs per node: a restarted agent shows the kubelet the same devices.
	m, err := nvidia.NewMock(model, nvidia.WithUUIDSeed(nodeName), nvidia.WithGPUCount(gpus))
	if err != nil {
		return nil, fmt.Errorf("--nvml=%q: %w", flagValue, err)
	}
	if stateDir != "" {
		go func() {
			if err := m.SyncFromDir(ctx, stateDir); err != nil {
				klog.FromContext(ctx).Error(err, "Mock state directory sync stopped", "dir", stateDir)
			}
		}()
	}
	return m, nil
}

// newClient returns nil (standalone) when there is no way to reach the API,
// else client-go's clientset and the config it was built from
// (pods.WithDefaults: one token bucket for all the agent's API clients).
func newClient(kubeconfig string, standaloneOK bool) (*kubernetes.Clientset, *rest.Config, error) {
	var rc *rest.Config
	var err error
	if kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
		if errors.Is(err, rest.ErrNotInCluster) && standaloneOK {
			klog.InfoS("No API access: running standalone with best-fit fraction placement")
			return nil, nil, nil
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("building API client config: %w", err)
	}
	rc.UserAgent = "gpufrac-node"
	rc = pods.WithDefaults(rc)
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, nil, fmt.Errorf("building API client: %w", err)
	}
	return c, rc, nil
}
