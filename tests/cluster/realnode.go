package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/gpufrac/gpufrac/api"

	"github.com/gpufrac/gpufrac/tests/images"
)

// Binaries and host packages a real node needs (see RealNodeRequirements).
const (
	kubeletBinary    = "kubelet"
	containerdBinary = "containerd"
	shimBinary       = "containerd-shim-runc-v2"
	ctrBinary        = "ctr"
	// DefaultRuncPath is Debian's runc (apt-get install runc; make node-deps).
	DefaultRuncPath = "/usr/sbin/runc"
	// DefaultCNIBinDir holds Debian's CNI plugins (containernetworking-plugins).
	DefaultCNIBinDir = "/usr/lib/cni"

	// realNodeReadyTimeout bounds the wait for the Node object to be Ready.
	realNodeReadyTimeout = 90 * time.Second
	// realNodeGrace is how long the kubelet and containerd get after SIGTERM.
	realNodeGrace = 10 * time.Second
)

// RealNodeOptions configures a real node. The zero value is a node named
// "real-0" (by order of start) labelled gpufrac.io/gpu-node=true.
type RealNodeOptions struct {
	// Name is the Node's name. Empty means real-<n>, n counting the cluster's real nodes.
	Name string
	// Labels are the Node's labels, besides gpufrac.io/gpu-node=true. The
	// kubelet sets them at registration.
	Labels map[string]string
	// SandboxImage is the pod sandbox (pause) image, by name. It must be
	// imported (ImportImage) before the first pod runs: the node pulls nothing.
	// Empty means DefaultSandboxImage.
	SandboxImage string
	// Snapshotter is containerd's snapshotter; empty means overlayfs (native
	// where the directory's file system cannot host overlayfs).
	Snapshotter string
	// RuncPath and CNIBinDir default to DefaultRuncPath and DefaultCNIBinDir.
	RuncPath  string
	CNIBinDir string
	// KubeletArgs are appended to the kubelet's arguments.
	KubeletArgs []string
	// NoWaitReady returns as soon as the kubelet and containerd answer, without
	// waiting for the Node to be Ready.
	NoWaitReady bool
}

// DefaultSandboxImage is the sandbox image a real node uses unless told
// otherwise: tests/images' pause, under the name containerd and the chart's
// reservations ask for.
const DefaultSandboxImage = images.PauseRef

// RealNode is a real kubelet and containerd, run by the cluster as root on
// this machine. Both run in one mount and PID namespace of the node's own
// (its init is a shell that only reaps orphans), where the node's directories
// are bind-mounted over the paths the kubelet and containerd hard-code
// (/var/lib/kubelet, whose device-plugins directory the kubelet always uses,
// /run/containerd, /etc/cdi, /var/run/cdi, /var/log/pods, /var/lib/cni).
// Killing the namespace's init kills every shim and container with it, and
// the mounts vanish with the namespace. Pods get their IPs from a bridge of
// the node's own in the host's network namespace.
type RealNode struct {
	c      *Cluster
	name   string
	dir    string
	index  int
	opts   RealNodeOptions
	logger klog.Logger

	// mu guards the fields below it.
	mu         sync.Mutex
	ns         *process // unshare, whose child is the namespace's init
	initPID    int      // the init's PID in the host's PID namespace
	pidNS      string   // the namespace's identity (readlink /proc/<init>/ns/pid)
	containerd *process
	kubelet    *process
	kubeletCfg kubeletPorts

	stopOnce sync.Once
	stopErr  error
}

// kubeletPorts are the kubelet's ports on 127.0.0.1.
type kubeletPorts struct{ port, healthz int }

// Name is the Node's name.
func (n *RealNode) Name() string { return n.name }

// Dir is the node's directory (under the cluster's directory).
func (n *RealNode) Dir() string { return n.dir }

// CDIDirs are the host paths of the directories containerd reads CDI specs
// from: the node's /etc/cdi and /var/run/cdi.
func (n *RealNode) CDIDirs() (etc, run string) {
	return filepath.Join(n.dir, "cdi", "etc"), filepath.Join(n.dir, "cdi", "run")
}

// DevDir is the host path of the node's mock device directory (MockDevices).
func (n *RealNode) DevDir() string { return filepath.Join(n.dir, "dev") }

// KubeletRootDir is the host path of the node's /var/lib/kubelet.
func (n *RealNode) KubeletRootDir() string { return filepath.Join(n.dir, "kubelet") }

// PodLogDir is the host path of the node's /var/log/pods.
func (n *RealNode) PodLogDir() string { return filepath.Join(n.dir, "pods") }

// ContainerdSocket is the host path of containerd's socket.
func (n *RealNode) ContainerdSocket() string {
	return filepath.Join(n.dir, "run", "containerd.sock")
}

// PIDNamespace identifies the node's PID namespace ("pid:[inode]").
func (n *RealNode) PIDNamespace() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.pidNS
}

// Bridge is the name of the node's CNI bridge in the host network namespace.
func (n *RealNode) Bridge() string { return bridgeName(n.index) }

// NodeIP is the node's InternalIP, where the kubelet serves (the kubelet
// refuses a loopback node IP): a /32 the harness puts on its service link,
// reachable from this machine only.
func (n *RealNode) NodeIP() string { return nodeIP(n.index) }

// PodSubnet is the node's pod subnet.
func (n *RealNode) PodSubnet() string { return podSubnet(n.index) }

// RealNodeRequirements says why a real node cannot run here, nil when it can:
// root, the kubelet and containerd in binDir (make tools), runc and the CNI
// plugins (make node-deps), unshare and nsenter (util-linux) and ip (iproute2).
func RealNodeRequirements(binDir string) error {
	var missing []string
	if os.Geteuid() != 0 {
		return errors.New("a real node needs root (mounts, namespaces, cgroups, network links)")
	}
	for _, b := range []string{kubeletBinary, containerdBinary, shimBinary, ctrBinary} {
		if _, err := os.Stat(filepath.Join(binDir, b)); err != nil {
			missing = append(missing, filepath.Join(binDir, b)+" (make tools)")
		}
	}
	for _, f := range []string{DefaultRuncPath, filepath.Join(DefaultCNIBinDir, "bridge"),
		filepath.Join(DefaultCNIBinDir, "host-local"), filepath.Join(DefaultCNIBinDir, "loopback")} {
		if _, err := os.Stat(f); err != nil {
			missing = append(missing, f+" (make node-deps: apt-get install runc containernetworking-plugins)")
		}
	}
	for _, b := range []string{"unshare", "nsenter", "ip", "bash"} {
		if _, err := exec.LookPath(b); err != nil {
			missing = append(missing, b)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("a real node needs: %s", strings.Join(missing, ", "))
	}
	return nil
}

// StartRealNode starts a real node and waits until its Node is Ready (unless
// opts.NoWaitReady). The first real node of a cluster takes a machine-wide
// lock (one cluster with real nodes at a time: they share 10.96.0.1, the
// kubernetes Service's address, which the harness puts on a dummy link and
// proxies to the API server) and waits while another cluster holds it. The
// cluster's Stop stops its real nodes; Stop on the node stops it earlier.
// On error everything started for the node is stopped and the error names
// the component that failed with the tail of its log.
func (c *Cluster) StartRealNode(ctx context.Context, opts RealNodeOptions) (*RealNode, error) {
	if err := RealNodeRequirements(c.binDir); err != nil {
		return nil, err
	}
	began := time.Now()
	if _, err := c.realNodeHost(ctx); err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.stopping {
		c.mu.Unlock()
		return nil, errors.New("starting a real node: cluster is stopping")
	}
	index := len(c.realNodes)
	if opts.Name == "" {
		opts.Name = "real-" + strconv.Itoa(index)
	}
	n := &RealNode{
		c:      c,
		name:   opts.Name,
		dir:    filepath.Join(c.Dir, "nodes", opts.Name),
		index:  index,
		opts:   opts,
		logger: klog.FromContext(ctx).WithValues("node", opts.Name),
	}
	c.realNodes = append(c.realNodes, n)
	c.mu.Unlock()

	if err := n.start(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("starting real node %s (logs in %s): %w", n.name, c.LogDir(), err), n.Stop())
	}
	n.logger.Info("Real node ready", "dir", n.dir, "duration", time.Since(began).Round(time.Millisecond))
	return n, nil
}

// start writes the node's files, starts its namespace, containerd and the
// kubelet, and waits for the Node to be Ready.
func (n *RealNode) start(ctx context.Context) error {
	if n.opts.Snapshotter == "" {
		n.opts.Snapshotter = "overlayfs"
		if err := overlayWorks(n.dir); err != nil {
			n.logger.Info("overlayfs does not work in the node's directory, using the native snapshotter", "err", err)
			n.opts.Snapshotter = "native"
		}
	}
	if n.opts.SandboxImage == "" {
		n.opts.SandboxImage = DefaultSandboxImage
	}
	if n.opts.RuncPath == "" {
		n.opts.RuncPath = DefaultRuncPath
	}
	if n.opts.CNIBinDir == "" {
		n.opts.CNIBinDir = DefaultCNIBinDir
	}
	// A crashed earlier run (this machine-wide lock is ours now) may have left
	// its bridge and cgroups behind.
	n.cleanHost()
	if out, err := exec.Command("ip", "addr", "replace", n.NodeIP()+"/32", "dev", serviceLink).CombinedOutput(); err != nil {
		return fmt.Errorf("adding the node IP %s: %w: %s", n.NodeIP(), err, out)
	}
	if err := makeCgroups(n.CgroupRoot()); err != nil {
		return err
	}
	if err := n.writeFiles(); err != nil {
		return err
	}
	if err := n.startNamespace(ctx); err != nil {
		return err
	}
	if err := n.startContainerd(ctx); err != nil {
		return err
	}
	if err := n.startKubelet(ctx); err != nil {
		return err
	}
	if n.opts.NoWaitReady {
		return nil
	}
	return n.WaitReady(ctx)
}

// WaitReady waits until the Node object is Ready.
func (n *RealNode) WaitReady(ctx context.Context) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, realNodeReadyTimeout, true, func(ctx context.Context) (bool, error) {
		if err := n.aliveErr(); err != nil {
			return false, err
		}
		node, err := n.c.Client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				last = fmt.Sprintf("Ready=%s %s: %s", cond.Status, cond.Reason, cond.Message)
				return cond.Status == corev1.ConditionTrue, nil
			}
		}
		last = "no Ready condition yet"
		return false, nil
	})
	if err != nil {
		n.mu.Lock()
		kubelet := n.kubelet
		n.mu.Unlock()
		return fmt.Errorf("waiting for Node %s to be Ready: %w (last: %s)\n--- last lines of %s ---\n%s",
			n.name, err, last, kubelet.LogPath, kubelet.logTail(20))
	}
	return nil
}

// aliveErr says which of the node's processes has exited, nil when all run.
func (n *RealNode) aliveErr() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, p := range []*process{n.ns, n.containerd, n.kubelet} {
		if p != nil && p.exited() {
			return fmt.Errorf("%s exited: %v\n--- last lines of %s ---\n%s", p.Name, p.err, p.LogPath, p.logTail(20))
		}
	}
	return nil
}

// componentName names a node's component in logs and Processes.
func (n *RealNode) componentName(what string) string { return n.name + "-" + what }

// logPath is a node component's log file.
func (n *RealNode) logPath(what string) string {
	return filepath.Join(n.c.LogDir(), n.componentName(what)+".log")
}

// startNamespace starts the node's namespace: unshare runs init.sh as PID 1
// of a new PID namespace in a new mount namespace (private propagation, its
// own /proc); the script bind-mounts the node's directories and signals
// readiness with a file.
func (n *RealNode) startNamespace(ctx context.Context) error {
	args := []string{"--mount", "--pid", "--fork", "--kill-child", "--propagation", "private", "--mount-proc",
		"bash", n.path("init.sh")}
	p, err := n.c.track(startProcess(n.componentName("namespace"), mustLookPath("unshare"), args, n.env(), n.logPath("namespace")))
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.ns = p
	n.mu.Unlock()
	err = waitReady(ctx, p, func(context.Context) error {
		if _, err := os.Stat(n.path("ns.ready")); err != nil {
			return errors.New("mounts not made yet")
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("starting the node's namespace (log %s): %w\n--- last lines ---\n%s", p.LogPath, err, p.logTail(20))
	}
	pid, err := childOf(p.PID)
	if err != nil {
		return fmt.Errorf("finding the node's namespace init: %w", err)
	}
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid))
	if err != nil {
		return fmt.Errorf("reading the PID namespace of the node's init: %w", err)
	}
	n.mu.Lock()
	n.initPID, n.pidNS = pid, ns
	n.mu.Unlock()
	return nil
}

// inNamespace starts bin inside the node's namespaces (nsenter forks it into
// the PID namespace; nsenter and it share a process group, which stop signals).
func (n *RealNode) inNamespace(what, bin string, args []string) (*process, error) {
	n.mu.Lock()
	pid := n.initPID
	n.mu.Unlock()
	full := append([]string{"--target", strconv.Itoa(pid), "--mount", "--pid", "--", bin}, args...)
	return n.c.track(startProcess(n.componentName(what), mustLookPath("nsenter"), full, n.env(), n.logPath(what)))
}

// env is the environment of the node's processes: containerd finds the runc
// shim on PATH, next to itself in the bin dir.
func (n *RealNode) env() []string {
	return []string{
		"PATH=" + n.c.binDir + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=" + filepath.Join(n.c.Dir, "home"),
	}
}

// startContainerd starts containerd and waits until it answers on its socket.
func (n *RealNode) startContainerd(ctx context.Context) error {
	p, err := n.inNamespace("containerd", filepath.Join(n.c.binDir, containerdBinary), []string{"--config", n.path("containerd.toml")})
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.containerd = p
	n.mu.Unlock()
	if err := waitReady(ctx, p, n.ctrReady); err != nil {
		return fmt.Errorf("starting containerd (log %s): %w\n--- last lines of %s ---\n%s", p.LogPath, err, p.LogPath, p.logTail(20))
	}
	return nil
}

// ctrReady asks containerd for its version through ctr.
func (n *RealNode) ctrReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := n.ctr(ctx, "version")
	if err != nil {
		return fmt.Errorf("ctr version: %w: %s", err, lastLine(out))
	}
	return nil
}

// startKubelet starts the kubelet and waits until its /healthz answers.
func (n *RealNode) startKubelet(ctx context.Context) error {
	args := append([]string{
		"--config=" + n.path("kubelet.yaml"),
		"--kubeconfig=" + n.path("kubelet.kubeconfig"),
		"--root-dir=/var/lib/kubelet",
		"--hostname-override=" + n.name,
		"--node-ip=" + n.NodeIP(),
		"--node-labels=" + n.labels(),
		"--v=2",
	}, n.opts.KubeletArgs...)
	p, err := n.inNamespace("kubelet", filepath.Join(n.c.binDir, kubeletBinary), args)
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.kubelet = p
	ports := n.kubeletCfg
	n.mu.Unlock()
	err = waitReady(ctx, p, func(ctx context.Context) error {
		if err := n.aliveErr(); err != nil {
			return err
		}
		return probeHTTP(ctx, http.DefaultClient, fmt.Sprintf("http://127.0.0.1:%d/healthz", ports.healthz), nil)
	})
	if err != nil {
		return fmt.Errorf("starting the kubelet (log %s): %w\n--- last lines of %s ---\n%s", p.LogPath, err, p.LogPath, p.logTail(20))
	}
	return nil
}

// RestartKubelet stops the kubelet (SIGTERM, as systemd does) and starts it
// again with the same configuration; pods keep running meanwhile.
func (n *RealNode) RestartKubelet(ctx context.Context) error {
	n.mu.Lock()
	p := n.kubelet
	n.mu.Unlock()
	if p == nil {
		return errors.New("restarting the kubelet: not started")
	}
	if err := p.stop(realNodeGrace); err != nil {
		return fmt.Errorf("restarting the kubelet: %w", err)
	}
	return n.startKubelet(ctx)
}

// RestartContainerd stops containerd (SIGTERM) and starts it again; the
// shims, and so the containers, keep running meanwhile.
func (n *RealNode) RestartContainerd(ctx context.Context) error {
	n.mu.Lock()
	p := n.containerd
	n.mu.Unlock()
	if p == nil {
		return errors.New("restarting containerd: not started")
	}
	// Only containerd: the shims left its process group when they started (setsid).
	if err := p.stop(realNodeGrace); err != nil {
		return fmt.Errorf("restarting containerd: %w", err)
	}
	return n.startContainerd(ctx)
}

// ImportImage imports an OCI or Docker image archive into containerd's
// k8s.io namespace (the kubelet's images) and unpacks it for the node's
// snapshotter.
func (n *RealNode) ImportImage(ctx context.Context, tarPath string) error {
	out, err := n.ctr(ctx, "-n", "k8s.io", "images", "import", "--snapshotter", n.opts.Snapshotter, tarPath)
	if err != nil {
		return fmt.Errorf("importing %s into node %s: %w: %s", tarPath, n.name, err, strings.TrimSpace(string(out)))
	}
	n.logger.V(2).Info("Imported image", "archive", tarPath, "output", strings.TrimSpace(string(out)))
	return nil
}

// ctr runs ctr against the node's containerd (its socket is a file in the
// node's directory, reachable from the host's mount namespace).
func (n *RealNode) ctr(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(n.c.binDir, ctrBinary), append([]string{"--address", n.ContainerdSocket()}, args...)...)
	cmd.Env = n.env()
	return cmd.CombinedOutput()
}

// MockDevice is a character device node MockDevices creates.
type MockDevice struct {
	Name         string // file name under DevDir, e.g. nvidia0
	Major, Minor uint32
}

// mockUVMMajor is a made-up major for nvidia-uvm (the real one is dynamic).
const mockUVMMajor = 511

// NVIDIADevices are the device nodes of a machine with gpus NVIDIA GPUs:
// /dev/nvidia<i> (195, i), nvidiactl (195, 255) and nvidia-uvm (a made-up major).
func NVIDIADevices(gpus int) []MockDevice {
	devs := make([]MockDevice, 0, gpus+2)
	for i := range gpus {
		devs = append(devs, MockDevice{Name: "nvidia" + strconv.Itoa(i), Major: 195, Minor: uint32(i)})
	}
	return append(devs,
		MockDevice{Name: "nvidiactl", Major: 195, Minor: 255},
		MockDevice{Name: "nvidia-uvm", Major: mockUVMMajor, Minor: 0})
}

// MockDevices creates character device nodes (mode 0666) in the node's
// DevDir, never in the host's /dev, so CDI specs can point at them, and
// returns their host paths. No driver backs them: opening one fails.
func (n *RealNode) MockDevices(devs []MockDevice) ([]string, error) {
	if err := os.MkdirAll(n.DevDir(), 0o755); err != nil {
		return nil, fmt.Errorf("creating mock device dir: %w", err)
	}
	paths := make([]string, 0, len(devs))
	for _, d := range devs {
		path := filepath.Join(n.DevDir(), d.Name)
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("replacing mock device %s: %w", path, err)
		}
		if err := syscall.Mknod(path, syscall.S_IFCHR|0o666, int(mkdev(d.Major, d.Minor))); err != nil {
			return nil, fmt.Errorf("creating mock device %s (%d:%d): %w", path, d.Major, d.Minor, err)
		}
		// mknod applies the umask.
		if err := os.Chmod(path, 0o666); err != nil {
			return nil, fmt.Errorf("creating mock device %s: %w", path, err)
		}
		paths = append(paths, path)
	}
	return paths, nil
}

// mkdev encodes a device number as Linux's makedev does.
func mkdev(major, minor uint32) uint64 {
	return uint64(minor&0xff) | uint64(major&0xfff)<<8 | uint64(minor&^0xff)<<12 | uint64(major&^0xfff)<<32
}

// Stop stops the node: the kubelet and containerd get SIGTERM, then the
// namespace's init gets SIGKILL, which kills every process left in the
// namespace (shims, containers) and so removes its mounts. Stop waits until
// no process of the namespace is left and removes the node's bridge and
// cgroups; the node's directory and logs stay. Safe to call more than once.
func (n *RealNode) Stop() error {
	n.stopOnce.Do(func() { n.stopErr = n.stop() })
	return n.stopErr
}

func (n *RealNode) stop() error {
	began := time.Now()
	n.mu.Lock()
	ns, kubelet, ctrd, pidNS := n.ns, n.kubelet, n.containerd, n.pidNS
	n.mu.Unlock()
	var errs []error
	for _, p := range []*process{kubelet, ctrd} {
		if p != nil {
			errs = append(errs, p.stop(realNodeGrace))
		}
	}
	if ns != nil {
		n.mu.Lock()
		initPID := n.initPID
		n.mu.Unlock()
		if initPID > 0 {
			if err := syscall.Kill(initPID, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
				errs = append(errs, fmt.Errorf("killing the node's init: %w", err))
			}
		}
		// unshare reaps the init and exits; signalled before that, it would
		// leave the init a zombie for the machine's init to reap.
		select {
		case <-ns.done:
		case <-time.After(realNodeGrace):
		}
		errs = append(errs, ns.stop(time.Second))
	}
	if pidNS != "" {
		// The kernel kills the namespace's processes once its init is gone;
		// reaping them takes a moment.
		err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 10*time.Second, true,
			func(context.Context) (bool, error) {
				pids, err := pidsInNamespace(pidNS)
				return len(pids) == 0, err
			})
		if err != nil {
			pids, _ := pidsInNamespace(pidNS)
			errs = append(errs, fmt.Errorf("processes of node %s still alive: %v: %w", n.name, pids, err))
		}
	}
	errs = append(errs, n.cleanHost())
	if errors.Join(errs...) == nil {
		// Nothing of the node runs any more: drop its bulk (containerd's
		// content and snapshots, the imported image tarballs, the mock
		// driver's device nodes), a few hundred MB a run that the cluster's
		// directory, kept for its logs, would otherwise keep for good.
		for _, d := range realNodeBulk {
			errs = append(errs, os.RemoveAll(n.path(d)))
		}
	}
	n.logger.V(2).Info("Real node stopped", "duration", time.Since(began).Round(time.Millisecond))
	return errors.Join(errs...)
}

// realNodeBulk are the node's directories that Stop removes once nothing
// of the node runs: the rest (the kubelet's state, pods' logs, configs) is
// small and kept with the cluster's logs.
var realNodeBulk = []string{"containerd", "images", "driver"}

// cleanHost removes what the node leaves in the host's namespaces: its CNI
// bridge (pods' veths go with their network namespaces) and its cgroups.
func (n *RealNode) cleanHost() error {
	var errs []error
	// The node IP goes with the service link when the cluster stops; a node
	// stopped earlier gives it back now.
	_ = exec.Command("ip", "addr", "del", n.NodeIP()+"/32", "dev", serviceLink).Run()
	if _, err := net.InterfaceByName(n.Bridge()); err == nil {
		if out, err := exec.Command("ip", "link", "del", n.Bridge()).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("deleting bridge %s: %w: %s", n.Bridge(), err, out))
		}
	}
	errs = append(errs, removeCgroups(n.CgroupRoot()))
	return errors.Join(errs...)
}

// CgroupRoot is the kubelet's cgroupRoot, in every hierarchy: the node's
// pods run under <root>/kubepods/<qos>/pod<uid>/<container id>.
func (n *RealNode) CgroupRoot() string { return "/gpufrac-" + n.name }

// path is a file in the node's directory.
func (n *RealNode) path(name string) string { return filepath.Join(n.dir, name) }

// labels renders the node's labels for --node-labels.
func (n *RealNode) labels() string {
	labels := map[string]string{api.LabelGPUNode: "true"}
	for k, v := range n.opts.Labels {
		labels[k] = v
	}
	parts := make([]string, 0, len(labels))
	for k, v := range labels {
		parts = append(parts, k+"="+v)
	}
	return strings.Join(parts, ",")
}

// stopRealNodes stops every real node of the cluster, then releases the
// machine-wide lock, the service address and its proxy.
func (c *Cluster) stopRealNodes() error {
	c.mu.Lock()
	nodes := append([]*RealNode(nil), c.realNodes...)
	host := c.realHost
	c.realHost = nil
	c.mu.Unlock()
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() { errs[i] = n.Stop() })
	}
	wg.Wait()
	if host != nil {
		errs = append(errs, host.close())
	}
	return errors.Join(errs...)
}

// mustLookPath resolves a command on PATH (RealNodeRequirements checked it).
func mustLookPath(name string) string {
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	return name
}

// lastLine is the last non-empty line of out.
func lastLine(out []byte) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}
