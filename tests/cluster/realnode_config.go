package cluster

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// nodeMounts are the node's directories (relative to its directory) and the
// paths the namespace's init bind-mounts them on: what the kubelet and
// containerd hard-code, or what is simplest left at its default.
var nodeMounts = []struct{ dir, target string }{
	// The kubelet's root: its device-plugins directory is always
	// /var/lib/kubelet/device-plugins, whatever --root-dir says.
	{"kubelet", "/var/lib/kubelet"},
	// containerd's state (socket, shims' sockets, runc's state, pods' netns).
	{"run", "/run/containerd"},
	{"cdi/etc", "/etc/cdi"},
	{"cdi/run", "/var/run/cdi"},
	// The kubelet's container logs (CRI log paths are absolute).
	{"pods", "/var/log/pods"},
	// libcni's result cache.
	{"cni/lib", "/var/lib/cni"},
}

// writeFiles writes the node's directories and configuration: the init
// script, containerd's config, the CNI network, the kubelet's config and
// kubeconfig (a client certificate for system:node:<name>).
func (n *RealNode) writeFiles() error {
	dirs := []string{"containerd", "cni/net.d", "cni/ipam", "dev"}
	for _, m := range nodeMounts {
		dirs = append(dirs, m.dir)
	}
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(n.dir, d), 0o755); err != nil {
			return fmt.Errorf("creating the node's directories: %w", err)
		}
	}
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.kubeletCfg = kubeletPorts{port: ports[0], healthz: ports[1]}
	n.mu.Unlock()

	cert, key, err := n.c.pki.clientCert("system:node:"+n.name, []string{"system:nodes"})
	if err != nil {
		return err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["gpufrac"] = &clientcmdapi.Cluster{Server: n.c.apiURL, CertificateAuthorityData: n.c.pki.caPEM}
	cfg.AuthInfos["kubelet"] = &clientcmdapi.AuthInfo{ClientCertificateData: cert, ClientKeyData: key}
	cfg.Contexts["gpufrac"] = &clientcmdapi.Context{Cluster: "gpufrac", AuthInfo: "kubelet"}
	cfg.CurrentContext = "gpufrac"
	if err := clientcmd.WriteToFile(*cfg, n.path("kubelet.kubeconfig")); err != nil {
		return fmt.Errorf("writing the kubelet's kubeconfig: %w", err)
	}

	cni, err := json.MarshalIndent(map[string]any{
		"cniVersion": "1.0.0",
		"name":       "gpufrac-" + n.name,
		"plugins": []any{map[string]any{
			"type":      "bridge",
			"bridge":    n.Bridge(),
			"isGateway": true,
			// Pods only talk to the host (API server proxy, kubelet probes).
			"ipMasq":      false,
			"hairpinMode": true,
			"ipam": map[string]any{
				"type":    "host-local",
				"ranges":  [][]map[string]string{{{"subnet": n.PodSubnet()}}},
				"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
				"dataDir": filepath.Join(n.dir, "cni", "ipam"),
			},
		}},
	}, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding the CNI config: %w", err)
	}
	files := map[string]string{
		"init.sh":                       n.initScript(),
		"containerd.toml":               n.containerdConfig(),
		"kubelet.yaml":                  n.kubeletConfig(ports[0], ports[1]),
		"cni/net.d/10-gpufrac.conflist": string(cni),
	}
	for name, content := range files {
		if err := os.WriteFile(n.path(name), []byte(content), 0o644); err != nil {
			return fmt.Errorf("writing %s: %w", name, err)
		}
	}
	return nil
}

// initScript is PID 1 of the node's namespaces: it bind-mounts the node's
// directories, says so with a file, and then only reaps orphans (shims) and
// waits to be killed.
func (n *RealNode) initScript() string {
	var b strings.Builder
	b.WriteString("set -eu\n")
	for _, m := range nodeMounts {
		fmt.Fprintf(&b, "mkdir -p %s\nmount --bind %s %s\n", m.target, strconv.Quote(filepath.Join(n.dir, m.dir)), m.target)
	}
	fmt.Fprintf(&b, "touch %s\n", strconv.Quote(n.path("ns.ready")))
	// bash reaps any child on SIGCHLD while it waits, adopted orphans included.
	b.WriteString("while :; do sleep 3600 & wait $! || true; done\n")
	return b.String()
}

// containerdConfig is containerd's configuration (version 3, containerd 2.x):
// everything under the node's directory, CDI on, no registry in use (images
// are imported), runc with cgroupfs.
func (n *RealNode) containerdConfig() string {
	q := strconv.Quote
	return fmt.Sprintf(`version = 3
root = %s
state = "/run/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[ttrpc]
  address = "/run/containerd/containerd.sock.ttrpc"

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = %s
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = %s

  [plugins.'io.containerd.cri.v1.runtime']
    cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
    # Pods' network namespaces under /run/containerd (the node's own directory),
    # not the host's /var/run/netns.
    netns_mounts_under_state_dir = true
    # Root here may lack CAP_SYS_RESOURCE (this Firecracker VM's does), and
    # without it no process may lower its oom_score_adj: runc fails to start
    # a sandbox at -998 ("failed to update /proc/self/oom_score_adj:
    # Permission denied"). Clamp containers' scores to containerd's own.
    restrict_oom_score_adj = %s
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = "runc"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = %s
          # The kubelet's cgroupDriver is cgroupfs.
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = [%s]
      conf_dir = %s
      max_conf_num = 1

  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
`, q(filepath.Join(n.dir, "containerd")), q(n.opts.Snapshotter), q(n.opts.SandboxImage), strconv.FormatBool(!hasCapability(capSysResource)),
		q(n.opts.RuncPath), q(n.opts.CNIBinDir), q(filepath.Join(n.dir, "cni", "net.d")))
}

// kubeletConfig is the kubelet's configuration. The settings that differ
// from the kubelet's defaults, and why:
//   - failCgroupV1: false: this machine has cgroup v1 (hybrid); 1.35+ refuses
//     to start on v1 unless told.
//   - cgroupDriver: cgroupfs: no systemd manages this machine's cgroups
//     (containerd's runc options say SystemdCgroup = false to match).
//   - cgroupRoot /gpufrac-<node>: the node's pods (kubepods/<qos>/pod<uid>)
//     under a cgroup of its own, as on a real node but apart from the
//     machine's other work and other nodes; StartRealNode creates it (the
//     kubelet wants it to exist) and Stop removes it. With cgroupsPerQOS
//     false, as first tried, the kubelet gives containerd no cgroup parent
//     and every container lands in /k8s.io/<id>, left behind on stop.
//   - failSwapOn: false: the machine may have swap; the node need not care.
//   - address: the node IP (a /32 on the harness's service link, see
//     RealNode.NodeIP), healthzBindAddress 127.0.0.1, readOnlyPort 0: this
//     machine only, no unauthenticated port.
//   - evictionHard at 1 % and image GC at 100 %: the shared disk's fill
//     level must not evict test pods or delete imported images (nothing can
//     be pulled back).
//   - resolvConf "": pods get no host resolver (no network beyond loopback).
func (n *RealNode) kubeletConfig(port, healthz int) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %s
port: %d
healthzBindAddress: 127.0.0.1
healthzPort: %d
readOnlyPort: 0
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: %s
authorization:
  mode: Webhook
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
cgroupDriver: cgroupfs
failCgroupV1: false
cgroupsPerQOS: true
cgroupRoot: %s
failSwapOn: false
resolvConf: ""
clusterDomain: cluster.local
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%%"
  nodefs.inodesFree: "1%%"
  imagefs.available: "1%%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
nodeStatusUpdateFrequency: 2s
syncFrequency: %s
fileCheckFrequency: 5s
`, n.NodeIP(), port, healthz, strconv.Quote(n.c.pki.caFile), n.CgroupRoot(), RealNodeSyncPeriod)
}

// RealNodeSyncPeriod is the real kubelet's syncFrequency: how long it may
// take to act on a pod whose container changed under it (a test that
// waits for something not to happen waits at least this long).
const RealNodeSyncPeriod = 10 * time.Second

// capSysResource is CAP_SYS_RESOURCE's bit number.
const capSysResource = 24

// hasCapability reports whether this process has capability bit in its
// effective set.
func hasCapability(bit uint) bool {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if hex, ok := strings.CutPrefix(line, "CapEff:"); ok {
			v, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
			return err == nil && v&(1<<bit) != 0
		}
	}
	return false
}
