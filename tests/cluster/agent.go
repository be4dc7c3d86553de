package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
	"github.com/gpufrac/gpufrac/tests/kubeletsim"
)

const (
	// DefaultGPUModel is the mock GPU model of a GPU node whose nvidia.com/gpu.product
	// label names no known model.
	DefaultGPUModel = "dgxh100"
	// A100Product is the nvidia.com/gpu.product value of the dgxa100 mock's GPUs.
	A100Product = "NVIDIA-A100-SXM4-40GB"
	// NodeAgentBinary is gpufrac-node's file name in the bin dir (`make build`).
	NodeAgentBinary = "gpufrac-node"
	// nodeAgentPrefix starts the component name of every node agent process.
	nodeAgentPrefix = "gpufrac-node-"
)

// ErrNodeAgentFailed is returned (wrapped, with the cause) by WaitForNodeAgent when
// the node's agent could not start.
var ErrNodeAgentFailed = errors.New("node agent failed")

// NodeAgentOptions configures the node agents: for every kwok node labelled
// api.LabelGPUNode=true (Karpenter's included) the cluster runs a kubelet simulator
// and a real gpufrac-node on a mock GPU model registered with it, and the simulator
// acts as that node's kubelet: it patches the node's capacity and allocatable with
// the resources the plugin lists, and admits the pods bound to the node through
// the plugin before kwok runs them.
type NodeAgentOptions struct {
	// Binary is the gpufrac-node binary. Empty means <BinDir>/gpufrac-node.
	Binary string
	// Models maps a node's nvidia.com/gpu.product label to the mock model gpufrac-node
	// runs on. Nil means DefaultGPUModels(); unknown or missing labels get DefaultGPUModel.
	Models map[string]string
	// Config, when not empty, replaces the chart's node config (values
	// node.config) in the file passed to gpufrac-node as --config. Empty
	// means the agents read the chart's ConfigMap gpufrac-node-config as the
	// DaemonSet mounts it: the harness projects it into each agent's config
	// directory as the kubelet does (..data symlink swap), and follows its
	// edits after ConfigMapSyncDelay.
	Config string
	// ConfigMapSyncDelay is how long after an edit of the ConfigMap each
	// agent's mount is updated. Zero means DefaultConfigMapSyncDelay.
	ConfigMapSyncDelay time.Duration
	// Args are appended to gpufrac-node's arguments (e.g. "-v=4", "--health-quiet-period=2s").
	Args []string
	// StopGracePeriod is the simulators' kubeletsim.Options.StopGracePeriod: how long
	// a resource whose plugin went away keeps its (unhealthy) devices. Zero means the
	// kubelet's five minutes.
	StopGracePeriod time.Duration
	// PodSyncDelay is the simulators' kubeletsim.Options.PodSyncDelay: how
	// long after a kubelet restart PodResources lists no pod, as the real
	// kubelet's (0.9 s on the real node). Zero lists them at once.
	PodSyncDelay time.Duration
	// BeforeAllocate, when set, is every simulator's kubeletsim.Options.BeforeAllocate,
	// with the node's name: the hook to act mid-Allocate (it may block).
	BeforeAllocate func(ctx context.Context, node string, pod kubeletsim.PodRef, resource string, devices []string)
}

// DefaultGPUModels maps the GPU product labels of the go-nvml mock servers to
// their model names.
func DefaultGPUModels() map[string]string {
	return map[string]string{H100Product: "dgxh100", A100Product: "dgxa100"}
}

// NodeAgent is the running node agent of one kwok GPU node.
type NodeAgent struct {
	// Node is the node's name.
	Node string
	// Model is the mock GPU model gpufrac-node runs on (--nvml=mock:<Model>).
	Model string
	// Kubelet is the node's kubelet simulator: Allocations and the PodResources
	// socket show what each pod holds.
	Kubelet *kubeletsim.Kubelet
	// PodResourcesSocket is the node's PodResources v1 socket.
	PodResourcesSocket string
	// StateDir is gpufrac-node's --mock-state-dir: write Xids, processes and memory
	// use with nvidia.WriteMockXid and friends.
	StateDir string
	// MetricsAddr is host:port of gpufrac-node's /metrics, /healthz and /readyz.
	MetricsAddr string
	// LogPath is gpufrac-node's log file (kept with the cluster's logs).
	LogPath string
	// PID is gpufrac-node's process ID.
	PID int
	// ConfigPath is gpufrac-node's --config file: config.yaml of the mounted
	// ConfigMap gpufrac-node-config (a link through ..data), or a plain file
	// with NodeAgentOptions.Config. WriteConfig changes it.
	ConfigPath string
	// CDIDir is where gpufrac-node writes its per-claim CDI specs in mode dra
	// (dra.ResolveCDIEnv reads them as a container runtime would).
	CDIDir string
	// Kubeconfig is gpufrac-node's --kubeconfig: a token of the gpufrac-node
	// ServiceAccount bound to Pod, so the API server knows the agent's node.
	Kubeconfig string
	// Pod is the agent's pod on its node (from the DaemonSet's template), the
	// object its token is bound to.
	Pod *corev1.Pod

	// mount is the agent's ConfigMap mount; nil with NodeAgentOptions.Config.
	mount *configMount

	// sockDir and nodeDir are the agent's socket and file directories;
	// mockGPUs its --mock-gpus (0: the model's eight); cdi whether its
	// node has the toolkit's CDI specs (cdiStrategy).
	sockDir, nodeDir string
	mockGPUs         int
	cdi              bool

	// ctl restarts gpufrac-node and the simulator (faults.go); PID,
	// MetricsAddr and LogPath above describe the first gpufrac-node process.
	ctl *agentControl
}

// WriteConfig replaces this node agent's config file, so gpufrac-node's
// watcher applies it live: the hook for tests that repartition one node
// while the cluster runs. On an agent that mounts the ConfigMap it writes the
// mount as the kubelet does (a ..data swap) and lasts until the next edit of
// the ConfigMap; else it renames a new file over the old one. It fails when
// the agent was started without a config file.
func (a *NodeAgent) WriteConfig(content string) error {
	if a.ConfigPath == "" {
		return fmt.Errorf("writing the config of node %s: the node agent runs without --config", a.Node)
	}
	if a.mount != nil {
		dir, key := filepath.Split(a.ConfigPath)
		if err := a.mount.write(atomicWriter{dir: filepath.Clean(dir)}, map[string][]byte{key: []byte(content)}); err != nil {
			return fmt.Errorf("writing the config of node %s: %w", a.Node, err)
		}
		return nil
	}
	tmp := a.ConfigPath + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		return fmt.Errorf("writing the config of node %s: %w", a.Node, err)
	}
	if err := os.Rename(tmp, a.ConfigPath); err != nil {
		return fmt.Errorf("writing the config of node %s: %w", a.Node, err)
	}
	return nil
}

// Metrics returns the /metrics page of the agent's current gpufrac-node
// (after RestartAgent or Roll, the new process's).
func (a *NodeAgent) Metrics(ctx context.Context) (string, error) {
	addr := a.MetricsAddr
	if a.ctl != nil {
		_, addr = a.Process()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("reading the metrics of node %s: %w", a.Node, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("reading the metrics of node %s: %w", a.Node, err)
	}
	return string(b), nil
}

// agentEntry is a node agent from the moment its node is seen.
type agentEntry struct {
	ready chan struct{} // closed once agent or err is set
	agent *NodeAgent
	err   error
}

// NodeAgent returns the ready node agent of a node, or nil.
func (c *Cluster) NodeAgent(node string) *NodeAgent {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.agents[node]; e != nil {
		select {
		case <-e.ready:
			return e.agent
		default:
		}
	}
	return nil
}

// NodeAgents returns the ready node agents, by node name.
func (c *Cluster) NodeAgents() []*NodeAgent {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*NodeAgent
	for _, name := range slices.Sorted(maps.Keys(c.agents)) {
		e := c.agents[name]
		select {
		case <-e.ready:
			if e.agent != nil {
				out = append(out, e.agent)
			}
		default:
		}
	}
	return out
}

// WaitForNodeAgent waits until the node's agent has registered its resources with
// its kubelet simulator, and returns it. It fails with ErrNodeAgentFailed when the
// agent could not start, and when ctx ends first.
func (c *Cluster) WaitForNodeAgent(ctx context.Context, node string) (*NodeAgent, error) {
	for {
		c.mu.Lock()
		e := c.agents[node]
		changed := c.agentsChanged
		c.mu.Unlock()
		if e != nil {
			select {
			case <-e.ready:
				if e.err != nil {
					return nil, fmt.Errorf("%w on node %s: %w", ErrNodeAgentFailed, node, e.err)
				}
				return e.agent, nil
			case <-ctx.Done():
				return nil, fmt.Errorf("waiting for the node agent of %s: %w", node, ctx.Err())
			}
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the node agent of %s (not started yet): %w", node, ctx.Err())
		}
	}
}

// agentForAdmission returns the ready agent of a node for admission: nil when the
// node has no agent and will not get one (admit without devices), errAgentNotReady
// while its agent is starting or its GPU node was seen but not yet handled, and a
// rejection when the agent failed (no device plugin: as the kubelet, refuse).
func (c *Cluster) agentForAdmission(node string) (*NodeAgent, error) {
	c.mu.Lock()
	e := c.agents[node]
	c.mu.Unlock()
	if e == nil {
		if c.expectsAgent(node) {
			return nil, errAgentNotReady
		}
		return nil, nil
	}
	select {
	case <-e.ready:
	default:
		return nil, errAgentNotReady
	}
	if e.err != nil {
		return nil, &rejection{message: fmt.Sprintf("Allocate failed due to the node agent not running (%v), which is unexpected", e.err)}
	}
	return e.agent, nil
}

// expectsAgent reports whether a node agent will run for the node: node agents
// are on and the node is a kwok GPU node that still exists.
func (c *Cluster) expectsAgent(node string) bool {
	if c.opts.NodeAgents == nil || c.nodeLister == nil {
		return false
	}
	n, err := c.nodeLister.Get(node)
	return err == nil && n.Annotations[KwokNodeAnnotation] == KwokNodeAnnotationValue && n.DeletionTimestamp == nil
}

// setAgent records a node's agent entry and wakes WaitForNodeAgent callers.
func (c *Cluster) setAgent(node string, e *agentEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.agents[node] = e
	c.broadcastAgentsLocked()
}

// agentSettled wakes WaitForNodeAgent callers after an entry became ready.
func (c *Cluster) agentSettled() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.broadcastAgentsLocked()
}

// removeAgent forgets a node's agent entry if it is still e.
func (c *Cluster) removeAgent(node string, e *agentEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.agents[node] == e {
		delete(c.agents, node)
		c.broadcastAgentsLocked()
	}
}

func (c *Cluster) broadcastAgentsLocked() {
	close(c.agentsChanged)
	c.agentsChanged = make(chan struct{})
}

// modelFor picks the mock GPU model for a node from its product label.
func (c *Cluster) modelFor(node *corev1.Node) string {
	models := c.opts.NodeAgents.Models
	if models == nil {
		models = DefaultGPUModels()
	}
	if m, ok := models[node.Labels[api.LabelGPUProduct]]; ok {
		return m
	}
	return DefaultGPUModel
}

// runNodeAgent runs a node's agent until ctx ends (the node went or the cluster
// stops), then stops it and cleans up. It is the node informer's per-node hook.
func (c *Cluster) runNodeAgent(ctx context.Context, node *corev1.Node) {
	logger := klog.FromContext(ctx)
	entry := &agentEntry{ready: make(chan struct{})}
	c.setAgent(node.Name, entry)
	defer c.removeAgent(node.Name, entry)

	began := time.Now()
	agent, stop, err := c.startNodeAgent(ctx, node)
	entry.agent, entry.err = agent, err
	close(entry.ready)
	c.agentSettled()
	if err != nil {
		if ctx.Err() == nil {
			logger.Error(err, "Node agent failed to start")
		}
		return
	}
	defer stop()
	logger.V(2).Info("Node agent ready", "model", agent.Model, "pid", agent.PID, "metrics", agent.MetricsAddr,
		"duration", time.Since(began).Round(time.Millisecond))
	<-ctx.Done()
}

// startNodeAgent starts the kubelet simulator, the node status sync and
// gpufrac-node, and waits until gpufrac-node reports ready (every resource
// registered). stop undoes all of it.
func (c *Cluster) startNodeAgent(ctx context.Context, node *corev1.Node) (agent *NodeAgent, stop func(), err error) {
	var undo []func()
	undoAll := func() {
		for _, f := range slices.Backward(undo) {
			f()
		}
	}
	// Not the named result stop: a failing return sets that to nil.
	defer func() {
		if err != nil {
			undoAll()
		}
	}()

	// 1. Directories: sockets in a short temporary directory (a unix socket path
	// has at most 107 bytes), the rest with the cluster's files.
	sockDir, err := os.MkdirTemp("", "gfn")
	if err != nil {
		return nil, nil, fmt.Errorf("creating socket dir for node %s: %w", node.Name, err)
	}
	undo = append(undo, func() { _ = os.RemoveAll(sockDir) })
	nodeDir := filepath.Join(c.Dir, "agents", node.Name)
	stateDir := filepath.Join(nodeDir, "mock")
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return nil, nil, fmt.Errorf("creating agent dir for node %s: %w", node.Name, err)
	}
	agent = &NodeAgent{
		Node:               node.Name,
		Model:              c.modelFor(node),
		PodResourcesSocket: filepath.Join(sockDir, "pr.sock"),
		StateDir:           stateDir,
	}

	// 2. The kubelet simulator, and the node status following its device lists.
	agent.CDIDir = specDir(nodeDir)
	simOpts := kubeletsim.Options{
		NodeName:           node.Name,
		Dir:                filepath.Join(sockDir, "dp"),
		PodResourcesSocket: agent.PodResourcesSocket,
		StopGracePeriod:    c.opts.NodeAgents.StopGracePeriod,
		PodSyncDelay:       c.opts.NodeAgents.PodSyncDelay,
		PluginRegistryDir:  filepath.Join(sockDir, "reg"),
		Claims:             apiClaims{c.Client},
	}
	if hook := c.opts.NodeAgents.BeforeAllocate; hook != nil {
		simOpts.BeforeAllocate = func(ctx context.Context, pod kubeletsim.PodRef, resource string, devices []string) {
			hook(ctx, node.Name, pod, resource, devices)
		}
	}
	agent.Kubelet = kubeletsim.New(simOpts)
	if err := agent.Kubelet.Start(ctx); err != nil {
		return nil, nil, fmt.Errorf("starting the kubelet simulator of node %s: %w", node.Name, err)
	}
	undo = append(undo, agent.Kubelet.Stop)
	status := newStatusSync(c, node.Name)

	// 3. The node's mock GPUs and its NVIDIA toolkit. A node made from a
	// cloud instance type (Karpenter) has as many mock GPUs as the type
	// sells, not the DGX's eight.
	in := c.Installed()
	if q, ok := node.Status.Allocatable[api.ResourceGPU]; ok && q.Value() > 0 && q.Value() != 8 {
		agent.mockGPUs = int(q.Value())
	}
	agent.sockDir, agent.nodeDir = sockDir, nodeDir
	var specs *toolkitSpecs
	if agent.cdi = cdiStrategy(in); agent.cdi {
		// The node's NVIDIA toolkit: a spec for its GPUs now, and for its
		// MIG devices whenever they change, before the node status does.
		var err error
		specs, err = newToolkitSpecs(specDir(nodeDir), node.Name, agent.Model, agent.mockGPUs)
		if err != nil {
			return nil, nil, err
		}
		agent.Kubelet.OnChange(specs.update)
	}
	agent.Kubelet.OnChange(status.update)
	var wg sync.WaitGroup
	syncCtx, cancelSync := context.WithCancel(ctx)
	wg.Go(func() { status.run(syncCtx) })
	if specs != nil {
		// In mode dra the node's MIG devices show in its ResourceSlices.
		wg.Go(func() { specs.followDRA(syncCtx, c.Client, node.Name) })
	}
	undo = append(undo, func() { cancelSync(); wg.Wait() })

	// 4. Its identity: a pod of the DaemonSet on the node, and a token bound
	// to that pod.
	kubeconfig, pod, err := c.nodeAgentKubeconfig(ctx, node)
	if err != nil {
		return nil, nil, err
	}
	agent.Kubeconfig, agent.Pod = kubeconfig, pod
	undo = append(undo, func() {
		if err := c.deleteNodeAgentPod(context.WithoutCancel(ctx), pod); err != nil {
			klog.FromContext(ctx).Error(err, "Removing the node agent's pod")
		}
	})

	// 5. gpufrac-node.
	if mount := c.nodeConfigMount(); mount != nil {
		// The DaemonSet's volume: the ConfigMap in the agent's config directory.
		if err := mount.mount(ctx, filepath.Join(nodeDir, "config")); err != nil {
			return nil, nil, fmt.Errorf("mounting the node config of %s: %w", node.Name, err)
		}
		agent.mount = mount
	}
	comp, err := c.nodeAgentComponent(agent, in, c.nodeAgentBinary())
	if err != nil {
		return nil, nil, err
	}
	ports, p, err := c.startComponent(ctx, comp)
	if err != nil {
		return nil, nil, err
	}
	agent.ctl = &agentControl{c: c, comp: comp, node: &running{comp: comp, ports: ports, proc: p}}
	// Before the simulator stops: gpufrac-node should see its kubelet go last.
	undo = append(undo, agent.ctl.stop)
	agent.MetricsAddr = fmt.Sprintf("127.0.0.1:%d", ports[0])
	agent.LogPath = p.LogPath
	agent.PID = p.PID
	return agent, undoAll, nil
}

// cdiStrategy tells whether the chart's DaemonSet names devices by CDI
// (--device-list-strategy=cdi): the node then needs the
// toolkit's spec directory (cdi.go).
func cdiStrategy(in *Install) bool {
	strategy, _ := Flag(in.Node.Args, "device-list-strategy")
	return strategy == string(resource.StrategyCDI)
}

// nodeAgentComponent is gpufrac-node of the agent's node as the chart in
// runs it: the DaemonSet's arguments as the kubelet expands them, where a
// local process differs: its sockets, metrics port, config file and CDI spec
// directory are its own, and the harness adds the mock NVML and the
// kubeconfig of its identity. Without a ConfigMap mount it writes the config
// file (NodeAgentOptions.Config, else the chart's) too.
func (c *Cluster) nodeAgentComponent(agent *NodeAgent, in *Install, binary string) (component, error) {
	args, err := ExpandArgs(in.Node.Args, map[string]string{"NODE_NAME": agent.Node, "POD_IP": "127.0.0.1"})
	if err != nil {
		return component{}, fmt.Errorf("gpufrac-node arguments from the chart: %w", err)
	}
	if agent.mockGPUs > 0 {
		args = append(args, fmt.Sprintf("--mock-gpus=%d", agent.mockGPUs))
	}
	if agent.cdi {
		args = ReplaceFlag(args, "cdi-spec-dirs", specDir(agent.nodeDir))
	}
	args = ReplaceFlag(args, "kubelet-dir", filepath.Join(agent.sockDir, "dp"))
	args = ReplaceFlag(args, "pod-resources-socket", agent.PodResourcesSocket)
	args = append(args,
		"--nvml=mock:"+agent.Model,
		"--mock-state-dir="+agent.StateDir,
		"--kubeconfig="+agent.Kubeconfig,
		"--allow-standalone=false",
	)
	args = ReplaceFlag(args, "kubelet-registry-dir", filepath.Join(agent.sockDir, "reg"))
	args = ReplaceFlag(args, "dra-plugin-dir", filepath.Join(agent.sockDir, "drv"))
	args = ReplaceFlag(args, "dra-state-dir", filepath.Join(agent.nodeDir, "dra"))
	args = ReplaceFlag(args, "cdi-dir", agent.CDIDir)
	var path string
	if agent.mount == nil {
		cfg := cmp.Or(c.opts.NodeAgents.Config, in.NodeConfig)
		path = filepath.Join(agent.nodeDir, "config.yaml")
		if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
			return component{}, fmt.Errorf("writing gpufrac-node config for node %s: %w", agent.Node, err)
		}
	} else {
		// The ConfigMap is mounted at the directory of --config.
		flag, _ := Flag(args, "config")
		path = filepath.Join(agent.nodeDir, "config", filepath.Base(cmp.Or(flag, "config.yaml")))
	}
	args = ReplaceFlag(args, "config", path)
	agent.ConfigPath = path
	// The test's own arguments come last: the last value of a flag wins.
	args = append(args, c.opts.NodeAgents.Args...)
	return component{
		name:  nodeAgentPrefix + agent.Node,
		path:  binary,
		ports: 1,
		args: func(ports []int) ([]string, error) {
			return ReplaceFlag(slices.Clone(args), "metrics-addr", fmt.Sprintf("127.0.0.1:%d", ports[0])), nil
		},
		ready: func(ctx context.Context, ports []int) error {
			return probeHTTP(ctx, http.DefaultClient, fmt.Sprintf("http://127.0.0.1:%d/readyz", ports[0]), nil)
		},
	}, nil
}

// apiClaims reads resource claims for a kubelet simulator.
type apiClaims struct{ cs kubernetes.Interface }

func (a apiClaims) GetClaim(ctx context.Context, ns, name string) (*resourceapi.ResourceClaim, error) {
	return a.cs.ResourceV1().ResourceClaims(ns).Get(ctx, name, metav1.GetOptions{})
}

// nodeAgentBinary is the gpufrac-node binary the agents run.
func (c *Cluster) nodeAgentBinary() string {
	if b := c.opts.NodeAgents.Binary; b != "" {
		return b
	}
	return filepath.Join(c.binDir, NodeAgentBinary)
}

// isNodeAgentProcess reports whether a component is a node agent.
func isNodeAgentProcess(name string) bool { return strings.HasPrefix(name, nodeAgentPrefix) }
