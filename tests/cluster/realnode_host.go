package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

const (
	// realNodeLockPath is the machine-wide lock: one cluster with real nodes
	// at a time (they share the service address and its dummy link).
	realNodeLockPath = "/run/gpufrac-realnode.lock"
	// ipForwardPath is the kernel's IPv4 forwarding switch, which the CNI
	// bridge plugin turns on for a gateway bridge; ipForwardSavedPath keeps
	// the value found before the first real node, until the last holder of
	// the real-node lock puts it back (a holder that crashed leaves it for
	// the next one).
	ipForwardPath      = "/proc/sys/net/ipv4/ip_forward"
	ipForwardSavedPath = "/run/gpufrac-realnode.ip_forward"
	// serviceLink is the dummy link that carries the kubernetes Service's address.
	serviceLink = "gpufrac-svc"
	// kubernetesServiceIP is the kubernetes Service's ClusterIP in the
	// cluster's service range (the API server's serving certificate names it).
	kubernetesServiceIP = "10.96.0.1"
)

// realNodeHost is what a cluster's real nodes share on the machine: the
// lock, the kubernetes Service's address on a dummy link and a TCP proxy on
// it to the API server. Without kube-proxy, pods' KUBERNETES_SERVICE_HOST
// (10.96.0.1:443) leads nowhere; like kube-proxy's IPVS mode, which binds
// ClusterIPs to a dummy link (kube-ipvs0), the address is local to the host,
// where a pod's packets arrive through its bridge, and the proxy stands in for
// the IPVS forwarding to the API server on 127.0.0.1.
type realNodeHost struct {
	lock     *os.File
	listener net.Listener
	proxies  sync.WaitGroup // the accept loop and one per connection

	// mu guards open.
	mu   sync.Mutex
	open map[net.Conn]struct{} // proxied connections (both ends), closed by close
}

// realNodeHost returns the cluster's shared real-node setup, making it on
// first use: it waits for the machine-wide lock (ctx bounds the wait).
func (c *Cluster) realNodeHost(ctx context.Context) (*realNodeHost, error) {
	c.realHostMu.Lock()
	defer c.realHostMu.Unlock()
	c.mu.Lock()
	h := c.realHost
	c.mu.Unlock()
	if h != nil {
		return h, nil
	}
	h, err := newRealNodeHost(ctx, c.apiURL)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopping {
		return nil, errors.Join(errors.New("cluster is stopping"), h.close())
	}
	c.realHost = h
	return h, nil
}

func newRealNodeHost(ctx context.Context, apiURL string) (*realNodeHost, error) {
	logger := klog.FromContext(ctx)
	u, err := url.Parse(apiURL)
	if err != nil {
		return nil, fmt.Errorf("parsing the API server's URL: %w", err)
	}
	lock, err := os.OpenFile(realNodeLockPath, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening the real-node lock: %w", err)
	}
	began := time.Now()
	for {
		err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			lock.Close()
			return nil, fmt.Errorf("taking the real-node lock %s: %w", realNodeLockPath, err)
		}
		select {
		case <-ctx.Done():
			lock.Close()
			return nil, fmt.Errorf("waiting for the real-node lock %s (another cluster runs real nodes): %w", realNodeLockPath, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
	if waited := time.Since(began); waited > time.Second {
		logger.Info("Waited for the machine-wide real-node lock", "duration", waited.Round(time.Millisecond))
	}
	h := &realNodeHost{lock: lock, open: map[net.Conn]struct{}{}}
	if err := saveIPForward(ipForwardPath, ipForwardSavedPath); err != nil {
		return nil, errors.Join(err, h.close())
	}
	// A crashed earlier holder may have left its link behind.
	_ = exec.Command("ip", "link", "del", serviceLink).Run()
	// A kernel without the dummy driver (this Firecracker VM's) gets an
	// empty bridge instead: any link that is up carries a local address.
	if out, err := exec.Command("ip", "link", "add", serviceLink, "type", "dummy").CombinedOutput(); err != nil {
		logger.V(2).Info("No dummy link, using a bridge for the service address", "err", strings.TrimSpace(string(out)))
		if out, err := exec.Command("ip", "link", "add", serviceLink, "type", "bridge").CombinedOutput(); err != nil {
			return nil, errors.Join(fmt.Errorf("adding link %s: %w: %s", serviceLink, err, out), h.close())
		}
	}
	for _, args := range [][]string{
		{"addr", "add", kubernetesServiceIP + "/32", "dev", serviceLink},
		{"link", "set", serviceLink, "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return nil, errors.Join(fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, out), h.close())
		}
	}
	if h.listener, err = net.Listen("tcp", net.JoinHostPort(kubernetesServiceIP, "443")); err != nil {
		return nil, errors.Join(fmt.Errorf("listening on the kubernetes Service's address: %w", err), h.close())
	}
	h.proxies.Go(func() { h.serve(logger, u.Host) })
	return h, nil
}

// serve forwards every connection to the API server until the listener closes.
func (h *realNodeHost) serve(logger klog.Logger, target string) {
	for {
		conn, err := h.listener.Accept()
		if err != nil {
			return
		}
		if a, ok := conn.RemoteAddr().(*net.TCPAddr); !ok || !serviceClientAllowed(a.IP) {
			// 10.96.0.1 is an address of the host: anything routed to it
			// from off the machine would reach the API server through here.
			logger.V(2).Info("Service proxy: refused a connection from off the real nodes", "from", conn.RemoteAddr())
			conn.Close()
			continue
		}
		h.proxies.Go(func() { h.proxyConn(logger, conn, target) })
	}
}

// realNodeNet holds the real nodes' pod subnets and node IPs (podSubnet, nodeIP).
var realNodeNet = &net.IPNet{IP: net.IPv4(10, 89, 0, 0).To4(), Mask: net.CIDRMask(16, 32)}

// serviceClientAllowed tells whether the service proxy serves a client at
// ip: a real node's pod or node address, or the host itself (loopback, or
// one of its addresses: a host-network pod dials from one), not a machine
// elsewhere that routes to the host's 10.96.0.1.
func serviceClientAllowed(ip net.IP) bool {
	if ip.IsLoopback() || realNodeNet.Contains(ip) {
		return true
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
			return true
		}
	}
	return false
}

// track records an open connection; false when close has begun (conn is closed then).
func (h *realNodeHost) track(conn net.Conn) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.open == nil {
		conn.Close()
		return false
	}
	h.open[conn] = struct{}{}
	return true
}

// untrack closes conn and forgets it.
func (h *realNodeHost) untrack(conn net.Conn) {
	h.mu.Lock()
	delete(h.open, conn)
	h.mu.Unlock()
	conn.Close()
}

// proxyConn copies bytes both ways between conn and target until either side closes.
func (h *realNodeHost) proxyConn(logger klog.Logger, conn net.Conn, target string) {
	if !h.track(conn) {
		return
	}
	defer h.untrack(conn)
	up, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		logger.V(2).Info("Service proxy: dialing the API server failed", "err", err)
		return
	}
	if !h.track(up) {
		return
	}
	defer h.untrack(up)
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		// Half-close so the other direction can finish.
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go cp(up, conn)
	go cp(conn, up)
	<-done
	<-done
}

// close stops the proxy, removes the dummy link and releases the lock.
func (h *realNodeHost) close() error {
	var errs []error
	if h.listener != nil {
		errs = append(errs, h.listener.Close())
	}
	// A pod's connection may never end by itself: its network namespace went
	// with the node, and no FIN or RST came from it.
	h.mu.Lock()
	for conn := range h.open {
		conn.Close()
	}
	h.open = nil
	h.mu.Unlock()
	h.proxies.Wait()
	if out, err := exec.Command("ip", "link", "del", serviceLink).CombinedOutput(); err != nil && !strings.Contains(string(out), "Cannot find device") {
		errs = append(errs, fmt.Errorf("deleting the dummy link %s: %w: %s", serviceLink, err, out))
	}
	if h.lock != nil {
		errs = append(errs, restoreIPForward(ipForwardPath, ipForwardSavedPath))
		errs = append(errs, h.lock.Close()) // releases the flock
	}
	return errors.Join(errs...)
}

// saveIPForward keeps the forwarding switch's value in saved, unless saved
// already holds one (a holder before this one crashed after the bridge
// plugin turned forwarding on: its saved value is the machine's own).
func saveIPForward(proc, saved string) error {
	if _, err := os.Stat(saved); err == nil {
		return nil
	}
	v, err := os.ReadFile(proc)
	if err != nil {
		return fmt.Errorf("reading %s: %w", proc, err)
	}
	if err := os.WriteFile(saved, v, 0o644); err != nil {
		return fmt.Errorf("saving %s: %w", proc, err)
	}
	return nil
}

// restoreIPForward puts the saved value back and forgets it.
func restoreIPForward(proc, saved string) error {
	v, err := os.ReadFile(saved)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading %s: %w", saved, err)
	}
	now, err := os.ReadFile(proc)
	if err != nil {
		return fmt.Errorf("reading %s: %w", proc, err)
	}
	if strings.TrimSpace(string(now)) != strings.TrimSpace(string(v)) {
		if err := os.WriteFile(proc, v, 0o644); err != nil {
			return fmt.Errorf("restoring %s to %s: %w", proc, strings.TrimSpace(string(v)), err)
		}
	}
	return os.Remove(saved)
}

// bridgeName is the CNI bridge of the cluster's real node number i (at most 15 bytes).
func bridgeName(i int) string { return "gpufrac-br" + strconv.Itoa(i) }

// podSubnet is the pod subnet of the cluster's real node number i.
func podSubnet(i int) string { return fmt.Sprintf("10.89.%d.0/24", i) }

// nodeIP is the InternalIP of the cluster's real node number i.
func nodeIP(i int) string { return fmt.Sprintf("10.89.255.%d", i+1) }

// childOf returns the PID of the only child of pid (unshare's forked child,
// the namespace's init).
func childOf(pid int) (int, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		return 0, err
	}
	fields := strings.Fields(string(data))
	if len(fields) != 1 {
		return 0, fmt.Errorf("process %d has children %q, want one", pid, fields)
	}
	return strconv.Atoi(fields[0])
}

// pidsInNamespace lists the live (non-zombie) processes in the PID namespace ns.
func pidsInNamespace(ns string) ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("listing processes: %w", err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if got, err := os.Readlink(filepath.Join("/proc", e.Name(), "ns", "pid")); err != nil || got != ns {
			continue
		}
		if state, err := procState(pid); err == nil && state != "Z" {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// procState is the state letter of /proc/<pid>/stat.
func procState(pid int) (string, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", err
	}
	s := string(data)
	end := strings.LastIndexByte(s, ')')
	fields := strings.Fields(s[end+1:])
	if end < 0 || len(fields) == 0 {
		return "", fmt.Errorf("parsing /proc/%d/stat", pid)
	}
	return fields[0], nil
}

// cgroupV1Mounts lists the mount points of cgroup v1 hierarchies.
func cgroupV1Mounts() ([]string, error) {
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var mounts []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) >= 3 && fields[2] == "cgroup" && !slices.Contains(mounts, fields[1]) {
			mounts = append(mounts, fields[1])
		}
	}
	return mounts, s.Err()
}

// cgroupHierarchies lists the mount points of the cgroup v1 hierarchies and
// of the hybrid setup's unified one.
func cgroupHierarchies() ([]string, error) {
	mounts, err := cgroupV1Mounts()
	if err != nil {
		return nil, fmt.Errorf("listing cgroup hierarchies: %w", err)
	}
	if unified := "/sys/fs/cgroup/unified"; !slices.Contains(mounts, unified) {
		if _, err := os.Stat(filepath.Join(unified, "cgroup.controllers")); err == nil {
			mounts = append(mounts, unified)
		}
	}
	return mounts, nil
}

// removeCgroups removes the cgroup root (and the empty cgroups below it) in
// every hierarchy; runc leaves a pod's cgroups behind when its processes
// were killed rather than deleted.
func removeCgroups(root string) error {
	mounts, err := cgroupHierarchies()
	if err != nil {
		return err
	}
	var errs []error
	for _, m := range mounts {
		top := filepath.Join(m, root)
		if _, err := os.Stat(top); err != nil {
			continue
		}
		var dirs []string
		_ = filepath.WalkDir(top, func(path string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		// Deepest first: a cgroup goes only once its children are gone.
		for _, d := range slices.Backward(dirs) {
			if err := syscall.Rmdir(d); err != nil && !errors.Is(err, syscall.ENOENT) {
				errs = append(errs, fmt.Errorf("removing cgroup %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}

// makeCgroups creates the cgroup root in every hierarchy (the kubelet
// checks that its cgroupRoot exists).
func makeCgroups(root string) error {
	mounts, err := cgroupHierarchies()
	if err != nil {
		return err
	}
	for _, m := range mounts {
		if err := os.MkdirAll(filepath.Join(m, root), 0o755); err != nil {
			return fmt.Errorf("creating cgroup %s: %w", filepath.Join(m, root), err)
		}
	}
	return nil
}

// overlayWorks mounts a small overlay under dir and unmounts it again.
func overlayWorks(dir string) error {
	base := filepath.Join(dir, ".overlay-check")
	defer os.RemoveAll(base)
	for _, d := range []string{"lower", "upper", "work", "merged"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			return err
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", filepath.Join(base, "lower"), filepath.Join(base, "upper"), filepath.Join(base, "work"))
	if err := syscall.Mount("overlay", filepath.Join(base, "merged"), "overlay", 0, opts); err != nil {
		return fmt.Errorf("mounting overlay: %w", err)
	}
	return syscall.Unmount(filepath.Join(base, "merged"), 0)
}
