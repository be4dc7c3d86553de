// Package cluster runs a real, local Kubernetes control plane for gpufrac's
// integration and end-to-end tests: etcd, kube-apiserver, kube-scheduler,
// kube-controller-manager and kwok (fake nodes and pod lifecycle), optionally with
// Karpenter's kwok provider, Kueue and the KubeRay operator, all on 127.0.0.1 with
// free ports and one temporary directory per cluster, so several test packages can
// each run their own cluster side by side.
//
// kwok runs a pod only once the harness has admitted it (annotation
// AnnotationAdmitted, a condition the cluster adds to kwok's pod-ready stage), as a
// kubelet admits a pod before it starts containers. With Options.NodeAgents every
// kwok GPU node (label gpufrac.io/gpu-node=true, Karpenter's nodes included) gets a
// kubelet simulator and a real gpufrac-node on mock GPUs: the simulator sets the
// node's capacity and allocatable from the plugin's ListAndWatch, admits the pods
// bound to the node through GetPreferredAllocation and Allocate (a failure ends the
// pod Failed with reason UnexpectedAdmissionError and the plugin's message, as the
// kubelet does) and serves the node's PodResources. Pods on nodes without an agent
// are admitted without devices.
//
// Cluster.StartRealNode adds a real node, as root: the kubelet and containerd
// (CDI on, runc, a CNI bridge) in a mount and PID namespace of the node's own,
// with the kubernetes Service's address proxied to the API server so pods
// reach it (see RealNode; one cluster with real nodes per machine at a time).
//
// The binaries come from the repository's bin/ directory (`make tools`; gpufrac-node
// from `make build`). Start and StartForTest fail with "run make tools" when one is
// missing.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
)

const (
	// DefaultStartTimeout bounds Start when Options.StartTimeout is zero,
	// plus operatorStartTimeout for each operator it starts. A control
	// plane starts in about 17 s; the margin is for a machine the whole
	// suite loads (make test runs its packages side by side on 2 cores).
	DefaultStartTimeout = 120 * time.Second
	// operatorStartTimeout is what each of Karpenter, Kueue and KubeRay adds
	// to DefaultStartTimeout: their CRDs (KubeRay's are megabytes) are
	// established by an API server that shares a loaded machine with the
	// suite (a cold CI run once spent over 60 s on KubeRay's alone).
	operatorStartTimeout = 60 * time.Second

	// componentReadyTimeout bounds the wait for one component to report
	// ready. kube-apiserver is ready in about 13 s; a make test run once saw
	// it take over 45 s beside the other suites.
	componentReadyTimeout = 90 * time.Second
	// portAttempts is how often a component is restarted on fresh ports when a port
	// it was given was taken in the meantime.
	portAttempts = 3

	// KwokNodeAnnotation is the annotation (value KwokNodeAnnotationValue) that makes
	// the cluster's kwok manage a node. Karpenter's kwok provider sets it on the
	// nodes it creates; AddNode sets it too.
	KwokNodeAnnotation = "kwok.x-k8s.io/node"
	// KwokNodeAnnotationValue is the value of KwokNodeAnnotation.
	KwokNodeAnnotationValue = "fake"
)

// Options configures a cluster. The zero value is a cluster without Karpenter and
// without node agents.
type Options struct {
	// BinDir holds the tool binaries. Empty means <repository root>/bin, where the
	// repository root is found by walking up from the working directory to gpufrac's go.mod.
	BinDir string
	// Dir is the cluster's directory; it must not exist or be empty. Empty means a
	// new temporary directory.
	Dir string
	// StartTimeout bounds Start. Zero means DefaultStartTimeout, plus a
	// minute for each operator started (Karpenter, Kueue, KubeRay).
	StartTimeout time.Duration
	// Karpenter, when not nil, also installs Karpenter's CRDs, a KWOKNodeClass and the
	// NodePools, and runs Karpenter's kwok provider.
	Karpenter *KarpenterOptions
	// Kueue, when not nil, also installs Kueue's CRDs, runs its manager and
	// registers its webhooks for the frameworks it manages (see KueueOptions).
	// The manager needs a metrics certificate under /etc/kueue, which the
	// harness writes when it is missing (as root; see ensureKueueMetricsCert).
	Kueue *KueueOptions
	// KubeRay, when not nil, also installs KubeRay's CRDs (RayCluster, RayJob,
	// RayService) and runs its operator (see KubeRayOptions).
	KubeRay *KubeRayOptions
	// OnNode, when not nil, is called once for every kwok node (annotation
	// kwok.x-k8s.io/node=fake) labelled gpufrac.io/gpu-node=true, including nodes
	// Karpenter creates, as seen by a node informer. It runs in its own goroutine; its
	// ctx is cancelled when the node is deleted or the cluster stops, and Stop waits
	// for it to return. Node agents (NodeAgents) run beside it, not through it.
	OnNode func(ctx context.Context, node *corev1.Node)
	// NodeAgents, when not nil, runs a real gpufrac-node with a kubelet simulator for
	// every kwok GPU node (see NodeAgentOptions and Cluster.NodeAgent).
	NodeAgents *NodeAgentOptions
	// Chart says how gpufrac's Helm chart (deployments/helm/gpufrac) is
	// installed: its objects are applied at start, and the node agents run
	// with its DaemonSet's arguments, config and identity. No values files
	// means TestbedValues(); the release namespace is ChartNamespace.
	Chart ChartOptions
	// Bare leaves gpufrac out: none of its cluster objects is installed (for
	// tests of those objects themselves). It cannot be combined with NodeAgents.
	Bare bool
	// NoAdmissionPolicies installs the chart with admissionPolicies.enabled=
	// false, for tests of what happens where an admin left them out. By
	// default every cluster runs under them.
	NoAdmissionPolicies bool
	// ExtraArgs are appended to a control-plane component's arguments, by
	// component name (etcd, kube-apiserver, kube-scheduler,
	// kube-controller-manager, kwok); for a flag given twice the last value
	// wins. The scale benchmark tunes heartbeats and turns on audit logging
	// with them.
	ExtraArgs map[string][]string
}

// Cluster is a running local control plane. Its exported fields are read-only.
type Cluster struct {
	// RESTConfig authenticates as a cluster admin (system:masters). Copy it with
	// rest.CopyConfig before changing it.
	RESTConfig *rest.Config
	// KubeconfigPath is an admin kubeconfig file for the cluster.
	KubeconfigPath string
	// Client is an admin clientset.
	Client kubernetes.Interface
	// Dynamic is an admin dynamic client (CRDs, Karpenter objects).
	Dynamic dynamic.Interface
	// Dir is the cluster's temporary directory; logs are under Dir/logs.
	Dir string

	opts    Options
	logger  klog.Logger
	binDir  string
	pki     *pki
	apiURL  string
	started time.Time

	// mu guards the fields below it.
	mu            sync.Mutex
	procs         []*process                       // every process started, in start order
	nodeCtx       map[types.UID]context.CancelFunc // node UID -> cancels that node's OnNode call and agent
	stopping      bool                             // set by Stop; no OnNode call starts after it
	agents        map[string]*agentEntry           // node name -> its node agent, from start to stop
	agentsChanged chan struct{}                    // closed and replaced whenever agents changes
	apiServer     *running                         // kube-apiserver, for RestartAPIServer
	karpenter     *running                         // Karpenter's provider, for SetInstanceTypes
	karpenterMu   sync.Mutex                       // serializes SetInstanceTypes
	kueue         *running                         // Kueue's manager
	kueueWebhooks string                           // the name of Kueue's webhook configurations; "" before they are made
	kuberay       *running                         // the KubeRay operator
	instanceTypes string                           // the provider's instance-types file
	install       *Install                         // what InstallChart last installed
	configMount   *configMount                     // the node agents' ConfigMap volume; nil with NodeAgentOptions.Config
	realNodes     []*RealNode                      // StartRealNode's nodes, in start order
	realHost      *realNodeHost                    // what the real nodes share; nil without real nodes
	gpuNode       string                           // StartGPUNode's node ("" for none): the DaemonSet it applies is that node's

	ctx         context.Context // the cluster's lifetime: cancelled by Stop or the caller's ctx
	cancel      context.CancelFunc
	informers   informers.SharedInformerFactory // kwok GPU nodes
	nodeLister  corelisters.NodeLister          // of informers; nil without OnNode and NodeAgents
	admission   *admission
	hooks       sync.WaitGroup // running OnNode calls and node agents
	controllers sync.WaitGroup // the admission controller's goroutines

	realHostMu sync.Mutex // serializes making realHost (it may wait for a machine-wide lock)
	// dirLock is the flock that says Dir's owner lives (stale.go); nil for
	// a directory the caller chose.
	dirLock *os.File

	stopOnce sync.Once
	stopErr  error
}

// Start starts a cluster and waits until it is ready: etcd healthy, the API server's
// /readyz OK, the default namespace and its default ServiceAccount present,
// kube-scheduler, kube-controller-manager and kwok answering their health checks,
// gpufrac's cluster objects installed and its admission policies in force (unless
// Options say otherwise), and, with Karpenter, its CRDs established, its objects
// created and its /readyz OK, with Kueue, its CRDs established, its /readyz OK
// and its webhooks admitting through the API server, and, with KubeRay, its
// CRDs established and its operator's /readyz OK.
//
// ctx bounds the life of the cluster: when it is cancelled the cluster stops (call
// Stop anyway to wait for that). Startup itself is bounded by Options.StartTimeout.
// On error everything started so far is stopped again, and the logs stay in the
// directory the error names.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	logger := klog.FromContext(ctx)
	binDir := opts.BinDir
	if binDir == "" {
		root, err := RepoRoot()
		if err != nil {
			return nil, err
		}
		binDir = filepath.Join(root, "bin")
	}
	if err := checkTools(binDir, opts); err != nil {
		return nil, err
	}
	if opts.Bare && opts.NodeAgents != nil {
		return nil, errors.New("a bare cluster (Options.Bare) has no identity for node agents")
	}
	if opts.NodeAgents != nil {
		bin := opts.NodeAgents.Binary
		if bin == "" {
			bin = filepath.Join(binDir, NodeAgentBinary)
		}
		if _, err := os.Stat(bin); err != nil {
			return nil, fmt.Errorf("node agents need gpufrac-node (run make build): %w", err)
		}
	}
	if opts.Dir == "" {
		reapStaleClusterDirs(logger, os.TempDir(), staleClusterDirAge, time.Now())
	}
	dir, err := clusterDir(opts.Dir)
	if err != nil {
		return nil, err
	}
	var dirLock *os.File
	if opts.Dir == "" {
		if dirLock, err = lockClusterDir(dir); err != nil {
			return nil, errors.Join(err, os.RemoveAll(dir))
		}
	}
	for _, sub := range []string{"logs", "home"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return nil, fmt.Errorf("creating cluster dir: %w", err)
		}
	}

	lifeCtx, cancel := context.WithCancel(ctx)
	c := &Cluster{
		Dir:           dir,
		dirLock:       dirLock,
		opts:          opts,
		logger:        logger,
		binDir:        binDir,
		started:       time.Now(),
		nodeCtx:       map[types.UID]context.CancelFunc{},
		agents:        map[string]*agentEntry{},
		agentsChanged: make(chan struct{}),
		ctx:           lifeCtx,
		cancel:        cancel,
	}
	// Whoever ends the cluster's life (Stop or the caller's ctx), the processes go.
	context.AfterFunc(lifeCtx, func() { _ = c.Stop() })

	timeout := opts.StartTimeout
	if timeout == 0 {
		timeout = DefaultStartTimeout
		for _, on := range []bool{opts.Karpenter != nil, opts.Kueue != nil, opts.KubeRay != nil} {
			if on {
				timeout += operatorStartTimeout
			}
		}
	}
	startCtx, cancelStart := context.WithTimeout(lifeCtx, timeout)
	defer cancelStart()
	if err := c.start(startCtx); err != nil {
		stopErr := c.Stop()
		return nil, errors.Join(fmt.Errorf("starting cluster (logs in %s): %w", c.LogDir(), err), stopErr)
	}
	logger.Info("Local cluster ready", "dir", dir, "apiServer", c.apiURL, "duration", time.Since(c.started).Round(time.Millisecond))
	return c, nil
}

// LogDir is the directory that holds one log file per component.
func (c *Cluster) LogDir() string { return filepath.Join(c.Dir, "logs") }

// Processes lists every process the cluster started (including ones already stopped,
// and failed attempts on a taken port), in start order.
func (c *Cluster) Processes() []Process {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Process, 0, len(c.procs))
	for _, p := range c.procs {
		out = append(out, p.Process)
	}
	return out
}

// MemoryHighWater returns each running component's peak resident set size in bytes
// (VmHWM from /proc), by component name. Components that are gone are left out.
func (c *Cluster) MemoryHighWater() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int64{}
	for _, p := range c.procs {
		if p.exited() {
			continue
		}
		if hwm, err := vmHWM(p.PID); err == nil {
			out[p.Name] = hwm
		}
	}
	return out
}

// start runs the startup stages in order.
func (c *Cluster) start(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	var err error
	// 1. Key material and per-component kubeconfigs.
	if c.pki, err = writePKI(filepath.Join(c.Dir, "pki")); err != nil {
		return err
	}

	// 2. etcd.
	etcdPorts, _, err := c.startComponent(ctx, component{
		name:  "etcd",
		ports: 2,
		args: func(ports []int) ([]string, error) {
			dataDir := filepath.Join(c.Dir, "etcd")
			// A failed attempt may have left member data for other peer URLs.
			if err := os.RemoveAll(dataDir); err != nil {
				return nil, fmt.Errorf("clearing etcd data dir: %w", err)
			}
			client, peer := "http://127.0.0.1:"+strconv.Itoa(ports[0]), "http://127.0.0.1:"+strconv.Itoa(ports[1])
			return append([]string{
				"--name=gpufrac", "--data-dir=" + dataDir,
				"--listen-client-urls=" + client, "--advertise-client-urls=" + client,
				"--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
				"--initial-cluster=gpufrac=" + peer,
				// Test data need not survive a crash; fsync dominates etcd's latency otherwise.
				"--unsafe-no-fsync",
			}, c.opts.ExtraArgs["etcd"]...), nil
		},
		ready: func(ctx context.Context, ports []int) error {
			return probeHTTP(ctx, http.DefaultClient, fmt.Sprintf("http://127.0.0.1:%d/health", ports[0]), nil)
		},
	})
	if err != nil {
		return err
	}

	// 3. kube-apiserver.
	tlsClient, err := c.httpsClient()
	if err != nil {
		return err
	}
	adminAuth := http.Header{"Authorization": []string{"Bearer " + c.pki.tokens["admin"]}}
	apiComp := component{
		name:  "kube-apiserver",
		ports: 1,
		args: func(ports []int) ([]string, error) {
			return append([]string{
				"--etcd-servers=http://127.0.0.1:" + strconv.Itoa(etcdPorts[0]),
				"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
				"--secure-port=" + strconv.Itoa(ports[0]),
				"--cert-dir=" + filepath.Join(c.Dir, "kube-apiserver"),
				"--tls-cert-file=" + c.pki.servingCert, "--tls-private-key-file=" + c.pki.servingKey,
				"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
				"--service-account-key-file=" + c.pki.saPub,
				"--service-account-signing-key-file=" + c.pki.saKey,
				"--token-auth-file=" + c.pki.tokenAuthFile,
				// Client certificates signed by the cluster CA: a real node's kubelet
				// (StartRealNode) joins with one as system:node:<name>.
				"--client-ca-file=" + c.pki.caFile,
				"--kubelet-client-certificate=" + c.pki.kubeletClientCert,
				"--kubelet-client-key=" + c.pki.kubeletClientKey,
				// Node names do not resolve here; node IPs route (RealNode.NodeIP).
				"--kubelet-preferred-address-types=InternalIP,Hostname",
				"--authorization-mode=Node,RBAC",
				"--service-cluster-ip-range=" + c.pki.serviceIPRange,
				// No real endpoints for the kubernetes Service: nothing in the cluster dials it.
				"--endpoint-reconciler-type=none",
				"--allow-privileged=true",
				"--profiling=false",
				// gpufrac's security model needs no flag on 1.34: the PodSecurity and
				// ValidatingAdmissionPolicy admission plugins are on by default, and
				// the node of the pod a service-account token is bound to goes into the
				// token and the request's user info (ServiceAccountTokenPodNodeInfo,
				// GA and locked on since 1.32).
			}, c.opts.ExtraArgs["kube-apiserver"]...), nil
		},
		ready: func(ctx context.Context, ports []int) error {
			return probeHTTP(ctx, tlsClient, fmt.Sprintf("https://127.0.0.1:%d/readyz", ports[0]), adminAuth)
		},
	}
	apiPorts, apiProc, err := c.startComponent(ctx, apiComp)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.apiServer = &running{comp: apiComp, ports: apiPorts, proc: apiProc}
	c.mu.Unlock()
	c.apiURL = "https://127.0.0.1:" + strconv.Itoa(apiPorts[0])
	if err := c.writeKubeconfigs(); err != nil {
		return err
	}
	if err := c.makeClients(); err != nil {
		return err
	}

	// 4. kube-scheduler, kube-controller-manager and kwok, side by side.
	stageFiles, err := filepath.Glob(filepath.Join(c.binDir, "kwok-stages", "*.yaml"))
	if err != nil || len(stageFiles) == 0 {
		return fmt.Errorf("finding kwok stages in %s (run make tools): %v", filepath.Join(c.binDir, "kwok-stages"), err)
	}
	// Pods run only once the harness admitted them (see admission).
	if stageFiles, err = gatedStages(stageFiles, filepath.Join(c.Dir, "kwok-stages")); err != nil {
		return err
	}
	secureReady := func(path string) func(ctx context.Context, ports []int) error {
		return func(ctx context.Context, ports []int) error {
			return probeHTTP(ctx, tlsClient, fmt.Sprintf("https://127.0.0.1:%d%s", ports[0], path), nil)
		}
	}
	controlPlane := []component{
		{
			name:  "kube-scheduler",
			ports: 1,
			args: func(ports []int) ([]string, error) {
				return append([]string{
					"--kubeconfig=" + c.componentKubeconfig("kube-scheduler"),
					"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(ports[0]),
					"--tls-cert-file=" + c.pki.servingCert, "--tls-private-key-file=" + c.pki.servingKey,
					"--leader-elect=false",
				}, c.opts.ExtraArgs["kube-scheduler"]...), nil
			},
			ready: secureReady("/readyz"),
		},
		{
			name:  "kube-controller-manager",
			ports: 1,
			args: func(ports []int) ([]string, error) {
				return append([]string{
					"--kubeconfig=" + c.componentKubeconfig("kube-controller-manager"),
					"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(ports[0]),
					"--tls-cert-file=" + c.pki.servingCert, "--tls-private-key-file=" + c.pki.servingKey,
					"--leader-elect=false",
					// csrsigning needs a signing CA we do not have; nothing here issues CSRs.
					"--controllers=*,-csrsigning",
					"--use-service-account-credentials=false",
					"--service-account-private-key-file=" + c.pki.saKey,
					"--root-ca-file=" + c.pki.caFile,
				}, c.opts.ExtraArgs["kube-controller-manager"]...), nil
			},
			ready: secureReady("/healthz"),
		},
		{
			name:  "kwok",
			ports: 1,
			// kwok reads ~/.kwok/kwok.yaml (or $KWOK_WORKDIR/kwok.yaml) when present: point
			// both at the cluster dir so a user's kwok config never leaks in.
			env: []string{"KWOK_WORKDIR=" + filepath.Join(c.Dir, "kwok")},
			args: func(ports []int) ([]string, error) {
				args := []string{
					"--kubeconfig=" + c.componentKubeconfig("kwok"),
					"--manage-all-nodes=false",
					"--manage-nodes-with-annotation-selector=" + KwokNodeAnnotation + "=" + KwokNodeAnnotationValue,
					"--server-address=127.0.0.1:" + strconv.Itoa(ports[0]),
					// The default pod CIDR is a /24: 254 pods in all.
					"--cidr=10.244.0.1/16",
				}
				for _, f := range stageFiles {
					args = append(args, "--config="+f)
				}
				return append(args, c.opts.ExtraArgs["kwok"]...), nil
			},
			ready: func(ctx context.Context, ports []int) error {
				return probeHTTP(ctx, http.DefaultClient, fmt.Sprintf("http://127.0.0.1:%d/healthz", ports[0]), nil)
			},
		},
	}
	errs := make([]error, len(controlPlane))
	var wg sync.WaitGroup
	for i, comp := range controlPlane {
		wg.Go(func() {
			_, _, errs[i] = c.startComponent(ctx, comp)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}

	// 5. The default namespace and its ServiceAccount (made by kube-controller-manager);
	// pods cannot be created before the latter exists.
	if err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	}); err != nil {
		return fmt.Errorf("waiting for the default ServiceAccount: %w", err)
	}
	logger.V(2).Info("Control plane ready", "duration", time.Since(c.started).Round(time.Millisecond))

	// 6. What a gpufrac installation brings besides its programs: the Queue
	// CRD, namespaces, priority classes, RBAC and the admission policies.
	if !c.opts.Bare {
		if err := c.installGpufrac(ctx); err != nil {
			return err
		}
	}

	// 7. Karpenter.
	if c.opts.Karpenter != nil {
		if err := c.startKarpenter(ctx); err != nil {
			return err
		}
	}

	// 8. Kueue.
	if c.opts.Kueue != nil {
		if err := c.startKueue(ctx); err != nil {
			return err
		}
	}

	// 9. KubeRay.
	if c.opts.KubeRay != nil {
		if err := c.startKubeRay(ctx); err != nil {
			return err
		}
	}

	// 10. The OnNode hook and the node agents, last, so they only ever see a ready
	// cluster; then pod admission, which needs to know the GPU nodes.
	if na := c.opts.NodeAgents; na != nil && na.Config == "" && c.Installed() != nil && c.Installed().NodeConfig != "" {
		m, err := newConfigMount(c.ctx, c.Client, c.Installed().Namespace, NodeConfigMap, na.ConfigMapSyncDelay)
		if err != nil {
			return err
		}
		c.mu.Lock()
		c.configMount = m
		c.mu.Unlock()
	}
	if c.opts.OnNode != nil || c.opts.NodeAgents != nil {
		if err := c.startNodeInformer(ctx); err != nil {
			return err
		}
	}
	c.admission = newAdmission(c)
	if err := c.admission.start(c.ctx, ctx, &c.controllers); err != nil {
		return err
	}
	return nil
}

// nodeConfigMount returns the node agents' ConfigMap mount, nil when they
// read NodeAgentOptions.Config.
func (c *Cluster) nodeConfigMount() *configMount {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.configMount
}

// clusterDir creates the cluster's directory: dir when given (it must not exist
// or be empty), else a new temporary one.
func clusterDir(dir string) (string, error) {
	if dir == "" {
		d, err := os.MkdirTemp("", "gpufrac-cluster-")
		if err != nil {
			return "", fmt.Errorf("creating cluster dir: %w", err)
		}
		return d, nil
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("creating cluster dir: %w", err)
	}
	if entries, err := os.ReadDir(abs); err == nil && len(entries) > 0 {
		return "", fmt.Errorf("creating cluster dir: %s exists and is not empty", abs)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return "", fmt.Errorf("creating cluster dir: %w", err)
	}
	return abs, nil
}

// component describes how to start and probe one process.
type component struct {
	name  string
	bin   string   // file name in the bin dir; empty means name
	path  string   // the binary's path, overriding bin
	ports int      // fresh 127.0.0.1 ports the component needs per attempt
	env   []string // besides HOME
	args  func(ports []int) ([]string, error)
	ready func(ctx context.Context, ports []int) error
}

// startComponent starts comp and waits until its ready probe succeeds. If the process
// dies because a port was taken meanwhile (another cluster starting at the same time),
// it starts again on fresh ports, up to portAttempts times. It returns the ports used
// and the process.
func (c *Cluster) startComponent(ctx context.Context, comp component) ([]int, *process, error) {
	logger := klog.FromContext(ctx).WithValues("component", comp.name)
	logPath := filepath.Join(c.LogDir(), comp.name+".log")
	for attempt := 1; ; attempt++ {
		ports, err := freePorts(comp.ports)
		if err != nil {
			return nil, nil, err
		}
		began := time.Now()
		p, err := c.launch(ctx, comp, ports)
		if p == nil {
			return nil, nil, err
		}
		if err == nil {
			logger.V(2).Info("Component ready", "pid", p.PID, "ports", ports, "duration", time.Since(began).Round(time.Millisecond))
			return ports, p, nil
		}
		if stopErr := p.stop(time.Second); stopErr != nil {
			err = errors.Join(err, stopErr)
		}
		if attempt < portAttempts && p.portConflict() {
			logger.Info("Port taken, restarting on fresh ports", "ports", ports, "attempt", attempt)
			continue
		}
		return nil, nil, fmt.Errorf("starting %s (log %s): %w\n--- last lines of %s ---\n%s",
			comp.name, logPath, err, logPath, p.logTail(20))
	}
}

// launch starts comp on the given ports and waits until its ready probe
// succeeds. It returns the process (nil when it could not start) and, when
// it started but never got ready, why.
func (c *Cluster) launch(ctx context.Context, comp component, ports []int) (*process, error) {
	bin := filepath.Join(c.binDir, comp.name)
	switch {
	case comp.path != "":
		bin = comp.path
	case comp.bin != "":
		bin = filepath.Join(c.binDir, comp.bin)
	}
	args, err := comp.args(ports)
	if err != nil {
		return nil, err
	}
	env := append([]string{"HOME=" + filepath.Join(c.Dir, "home")}, comp.env...)
	p, err := c.track(startProcess(comp.name, bin, args, env, filepath.Join(c.LogDir(), comp.name+".log")))
	if err != nil {
		return nil, err
	}
	return p, waitReady(ctx, p, func(ctx context.Context) error { return comp.ready(ctx, ports) })
}

// track records a started process so Stop can end it, or stops it at once when Stop
// has begun (the caller's ctx may end the cluster while it is still starting).
func (c *Cluster) track(p *process, err error) (*process, error) {
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.stopping {
		// Stop has already taken its list of processes: this one would outlive it.
		c.mu.Unlock()
		return nil, errors.Join(errors.New("cluster is stopping"), p.stop(time.Second))
	}
	defer c.mu.Unlock()
	c.procs = append(c.procs, p)
	return p, nil
}

// waitReady polls ready until it succeeds, the process exits, or the component's
// timeout (or ctx) runs out.
func waitReady(ctx context.Context, p *process, ready func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, componentReadyTimeout)
	defer cancel()
	ticker := time.NewTicker(100 * time.Millisecond)
	defer ticker.Stop()
	var last error
	for {
		if p.exited() {
			return fmt.Errorf("%s exited before it was ready: %v", p.Name, p.err)
		}
		if last = ready(ctx); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s to be ready: %w (last probe: %v)", p.Name, ctx.Err(), last)
		case <-p.done:
		case <-ticker.C:
		}
	}
}

// Stop stops everything the cluster started: the OnNode calls, then Karpenter, Kueue
// (its webhook configurations removed first), the KubeRay operator, kwok,
// kube-controller-manager and kube-scheduler (SIGTERM to each process group,
// SIGKILL after a grace period), then the API server, then etcd. It waits until every process has exited,
// removes etcd's data and keeps the logs. It is safe to call
// more than once and from several goroutines; later calls wait for the first and
// return its result.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() { c.stopErr = c.stop() })
	return c.stopErr
}

func (c *Cluster) stop() error {
	began := time.Now()
	c.mu.Lock()
	c.stopping = true
	c.mu.Unlock()
	c.cancel()
	if c.informers != nil {
		c.informers.Shutdown()
	}
	if c.admission != nil {
		c.admission.stop()
	}
	c.hooks.Wait()
	c.controllers.Wait()
	if m := c.nodeConfigMount(); m != nil {
		m.stop()
	}
	// Real nodes are clients of the API server: they go first.
	realNodesErr := c.stopRealNodes()

	// Kueue's webhooks fail closed: none may outlive its manager.
	c.unregisterKueueWebhooks()

	c.mu.Lock()
	procs := append([]*process(nil), c.procs...)
	c.mu.Unlock()
	// Clients of the API server first, all at once (node agents normally stopped
	// with their node's hook already); then the API server; then etcd.
	tiers := [][]string{
		{"karpenter", "kueue", kuberayOperator, "kwok", "kube-controller-manager", "kube-scheduler"},
		{"kube-apiserver"},
		{"etcd"},
	}
	grace := map[string]time.Duration{"kube-apiserver": 10 * time.Second}
	errs := make([]error, len(procs))
	for t, tier := range tiers {
		var wg sync.WaitGroup
		for i, p := range procs {
			if !slices.Contains(tier, p.Name) && (t != 0 || !isNodeAgentProcess(p.Name)) {
				continue
			}
			g, ok := grace[p.Name]
			if !ok {
				g = 5 * time.Second
			}
			wg.Go(func() { errs[i] = p.stop(g) })
		}
		wg.Wait()
	}
	errs = append(errs, realNodesErr, os.RemoveAll(filepath.Join(c.Dir, "etcd")))
	c.logger.V(2).Info("Local cluster stopped", "dir", c.Dir, "duration", time.Since(began).Round(time.Millisecond))
	return errors.Join(errs...)
}

// httpsClient trusts only the cluster's CA.
func (c *Cluster) httpsClient() (*http.Client, error) {
	tlsConfig, err := rest.TLSConfigFor(&rest.Config{TLSClientConfig: rest.TLSClientConfig{CAData: c.pki.caPEM}})
	if err != nil {
		return nil, fmt.Errorf("building TLS config: %w", err)
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfig}}, nil
}

// makeClients fills RESTConfig, Client and Dynamic.
func (c *Cluster) makeClients() error {
	c.RESTConfig = &rest.Config{
		Host:            c.apiURL,
		BearerToken:     c.pki.tokens["admin"],
		TLSClientConfig: rest.TLSClientConfig{CAData: c.pki.caPEM},
		// Tests create objects in bursts; client-go's default 5 QPS would pace them.
		QPS:   200,
		Burst: 400,
	}
	var err error
	if c.Client, err = kubernetes.NewForConfig(c.RESTConfig); err != nil {
		return fmt.Errorf("creating clientset: %w", err)
	}
	if c.Dynamic, err = dynamic.NewForConfig(c.RESTConfig); err != nil {
		return fmt.Errorf("creating dynamic client: %w", err)
	}
	return nil
}
