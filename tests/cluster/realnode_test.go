package cluster_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/tests/cluster"
	"github.com/gpufrac/gpufrac/tests/images"
)

// requireRealNode skips the test where a real node cannot run, with the
// reason; on CI as root it fails instead (make tools installs what is missing).
func requireRealNode(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("real node: not in -short mode")
	}
	root, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	err = cluster.RealNodeRequirements(filepath.Join(root, "bin"))
	switch {
	case err == nil:
	case os.Geteuid() == 0 && os.Getenv("CI") == "true":
		t.Fatalf("%v (run make tools as root)", err)
	default:
		t.Skip(err)
	}
}

// TestRealNode runs a pod on a real kubelet and containerd: it gets an IP on
// the node's bridge, reaches the API server through the kubernetes Service
// with its ServiceAccount token, logs to the node's /var/log/pods, and keeps
// running across a kubelet and a containerd restart; Stop leaves no process,
// mount or link behind.
func TestRealNode(t *testing.T) {
	requireRealNode(t)
	logger, _ := ktesting.NewTestContext(t)
	ctx := klog.NewContext(t.Context(), logger)
	pauseTar := staticImage(t, "./tests/images/pause", cluster.DefaultSandboxImage)
	probeTar := staticImage(t, "./tests/cluster/testdata/realnode/probe", "gpufrac.test/probe:latest")

	c := cluster.StartForTest(t, cluster.Options{Bare: true})
	// A node that cannot start says which component failed and why.
	_, err := c.StartRealNode(ctx, cluster.RealNodeOptions{Name: "broken", KubeletArgs: []string{"--no-such-flag"}})
	if err == nil || !strings.Contains(err.Error(), "starting the kubelet") || !strings.Contains(err.Error(), "no-such-flag") {
		t.Fatalf("a kubelet with a bad flag: got error %v, want one naming the kubelet and the flag", err)
	}
	t.Logf("a broken node fails to start as it should: %.300s", err)

	began := time.Now()
	n, err := c.StartRealNode(ctx, cluster.RealNodeOptions{Name: "real-a"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("real node %s Ready in %s (dir %s)", n.Name(), time.Since(began).Round(time.Millisecond), n.Dir())
	// A second node beside it, left for the cluster's Stop to stop.
	n2, err := c.StartRealNode(ctx, cluster.RealNodeOptions{Name: "real-b"})
	if err != nil {
		t.Fatal(err)
	}
	if n2.Bridge() == n.Bridge() || n2.PodSubnet() == n.PodSubnet() || n2.NodeIP() == n.NodeIP() {
		t.Fatalf("two nodes share a bridge, subnet or IP: %s %s %s", n2.Bridge(), n2.PodSubnet(), n2.NodeIP())
	}
	for _, tar := range []string{pauseTar, probeTar} {
		if err := n.ImportImage(ctx, tar); err != nil {
			t.Fatal(err)
		}
	}
	devs, err := n.MockDevices(cluster.NVIDIADevices(2))
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(devs[0]); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		t.Fatalf("mock device %s: %v, mode %v", devs[0], err, fi.Mode())
	}

	pods := c.Client.CoreV1().Pods(metav1.NamespaceDefault)
	pod, err := pods.Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "probe"},
		Spec: corev1.PodSpec{
			NodeName:                      n.Name(),
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []corev1.Container{{
				Name: "probe", Image: "gpufrac.test/probe:latest", ImagePullPolicy: corev1.PullNever,
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	running := waitRunning(ctx, t, c, pod.Name)
	_, subnet, _ := net.ParseCIDR(n.PodSubnet())
	if ip := net.ParseIP(running.Status.PodIP); ip == nil || !subnet.Contains(ip) || running.Spec.HostNetwork {
		t.Fatalf("pod IP %q is not in the node's subnet %s", running.Status.PodIP, n.PodSubnet())
	}
	containerID := running.Status.ContainerStatuses[0].ContainerID
	// The container's cgroup is where a real node puts it: under the pod's, under its QoS class's.
	cg := filepath.Join("/sys/fs/cgroup/memory", n.CgroupRoot(), "kubepods", "besteffort", "pod"+string(pod.UID),
		strings.TrimPrefix(containerID, "containerd://"))
	if _, err := os.Stat(cg); err != nil {
		t.Errorf("the container's memory cgroup: %v", err)
	}
	t.Logf("pod %s Running, IP %s, container %s", pod.Name, running.Status.PodIP, containerID)

	// The container's log, on the node's disk: the probe reached the API server.
	logGlob := filepath.Join(n.PodLogDir(), "default_probe_"+string(pod.UID), "probe", "*.log")
	var log string
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		files, _ := filepath.Glob(logGlob)
		if len(files) == 0 {
			return false, nil
		}
		data, err := os.ReadFile(files[0])
		log = string(data)
		return err == nil && strings.Contains(log, "probe: ok 201"), nil
	}); err != nil {
		t.Fatalf("the probe's log (%s) never said it reached the API server: %v\n%s", logGlob, err, log)
	}
	t.Logf("probe log: %s", strings.TrimSpace(log[strings.Index(log, "probe: ok"):]))
	if want := `"username":"system:serviceaccount:default:default"`; !strings.Contains(strings.ReplaceAll(log, " ", ""), want) {
		t.Errorf("the probe was not authenticated as its ServiceAccount (want %s): %s", want, log)
	}
	// The same log through the API server, which asks the kubelet for it.
	apiLog, err := pods.GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil || !strings.Contains(string(apiLog), "probe: ok 201") {
		t.Errorf("pod log through the API server: %v: %s", err, apiLog)
	}

	// Restarts: the pod runs on in the same container.
	for _, r := range []struct {
		what    string
		restart func(context.Context) error
	}{{"kubelet", n.RestartKubelet}, {"containerd", n.RestartContainerd}} {
		began := time.Now()
		if err := r.restart(ctx); err != nil {
			t.Fatal(err)
		}
		if err := n.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
		took := time.Since(began)
		// Let the kubelet resync the pod with the restarted component: a
		// container it would restart is restarted within a sync period
		// (and a PLEG relist), so wait that long before saying it was not.
		time.Sleep(cluster.RealNodeSyncPeriod + 2*time.Second)
		p := waitRunning(ctx, t, c, pod.Name)
		if got := p.Status.ContainerStatuses[0]; got.ContainerID != containerID || got.RestartCount != 0 {
			t.Fatalf("after the %s restart the container is %s (restarts %d), want %s unrestarted", r.what, got.ContainerID, got.RestartCount, containerID)
		}
		t.Logf("%s restarted (node Ready again) in %s; pod still Running in the same container", r.what, took.Round(time.Millisecond))
	}

	pidNS := n.PIDNamespace()
	stopBegan := time.Now()
	if err := n.Stop(); err != nil {
		t.Fatalf("stopping the real node: %v", err)
	}
	t.Logf("real node stopped in %s", time.Since(stopBegan).Round(time.Millisecond))
	if pids := pidsIn(t, pidNS); len(pids) > 0 {
		t.Errorf("processes of the node's PID namespace %s left: %v", pidNS, pids)
	}
	if mounts, err := os.ReadFile("/proc/self/mountinfo"); err != nil {
		t.Fatal(err)
	} else if strings.Contains(string(mounts), n.Dir()) {
		t.Errorf("mounts of the node's directory %s left in the host's mount namespace", n.Dir())
	}
	if _, err := net.InterfaceByName(n.Bridge()); err == nil {
		t.Errorf("bridge %s left", n.Bridge())
	}
	if _, err := os.Stat(filepath.Join(n.Dir(), "containerd")); err == nil {
		t.Errorf("containerd's root %s left (its content and snapshots, kept for good in the cluster's directory)", filepath.Join(n.Dir(), "containerd"))
	}
	if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/memory", n.CgroupRoot())); err == nil {
		t.Errorf("cgroup %s left", n.CgroupRoot())
	}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if strings.HasPrefix(a.String(), n.NodeIP()+"/") {
				t.Errorf("node IP %s left on the host", n.NodeIP())
			}
		}
	}
	pidNS2 := n2.PIDNamespace()
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if pids := pidsIn(t, pidNS2); len(pids) > 0 {
		t.Errorf("processes of %s left after the cluster stopped: %v", n2.Name(), pids)
	}
	if _, err := net.InterfaceByName(n2.Bridge()); err == nil {
		t.Errorf("bridge %s left", n2.Bridge())
	}
	// The service link must be gone, unless another cluster (another test
	// binary) took the machine-wide lock and made its own meanwhile.
	if lock, err := os.Open("/run/gpufrac-realnode.lock"); err == nil {
		defer lock.Close()
		if syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
			if _, err := net.InterfaceByName("gpufrac-svc"); err == nil {
				t.Errorf("service link gpufrac-svc left after the cluster stopped")
			}
		} else {
			t.Log("another cluster holds the real-node lock now: not checking the service link")
		}
	}
}

// waitRunning waits until the pod is Running with a pod IP.
func waitRunning(ctx context.Context, t *testing.T, c *cluster.Cluster, name string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		var err error
		pod, err = c.Client.CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return pod.Status.Phase == corev1.PodRunning && pod.Status.PodIP != "" &&
			len(pod.Status.ContainerStatuses) == 1 && pod.Status.ContainerStatuses[0].Ready, nil
	})
	if err != nil {
		t.Fatalf("pod %s not Running: %v; status %+v", name, err, pod.Status)
	}
	return pod
}

// pidsIn lists the processes whose PID namespace is ns.
func pidsIn(t *testing.T, ns string) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []string
	for _, e := range entries {
		if got, err := os.Readlink(filepath.Join("/proc", e.Name(), "ns", "pid")); err == nil && got == ns {
			stat, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
			pids = append(pids, strings.Join(strings.Fields(string(stat))[:5], " "))
		}
	}
	return pids
}

// staticImage builds the repository's Go package pkg statically and writes
// an image archive named ref whose only file, /<base of pkg>, is its
// entrypoint (tests/images). It returns the archive's path.
func staticImage(t *testing.T, pkg, ref string) string {
	t.Helper()
	root, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	prog := filepath.Base(pkg)
	bin := filepath.Join(dir, prog)
	if err := images.BuildStatic(t.Context(), root, pkg, bin); err != nil {
		t.Fatal(err)
	}
	tar := filepath.Join(dir, prog+".tar")
	if _, err := images.Write(images.Spec{Ref: ref, Layers: [][]images.File{{{Src: bin, Dst: "/" + prog, Mode: 0o755}}},
		Config: v1.Config{Entrypoint: []string{"/" + prog}}}, tar); err != nil {
		t.Fatal(err)
	}
	return tar
}
