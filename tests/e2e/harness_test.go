// Package e2e runs gpufrac end to end on the local cluster test bed: a real
// control plane, kwok nodes whose GPUs are served by real gpufrac-node
// processes on mock NVML, and the real gpufrac-coordinator.
package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/tests/cluster"
	"github.com/gpufrac/gpufrac/tests/invariants"
)

// repoRoot finds the repository root (where go.mod is).
func repoRoot(t testing.TB) string {
	t.Helper()
	dir, _ := os.Getwd()
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("repository root not found")
		}
		dir = parent
	}
}

// builds holds one build per gpufrac command for the whole test binary:
// tests run in parallel, and a binary must not be rewritten while another
// test's processes run it.
var builds sync.Map // command name -> *build

type build struct {
	once sync.Once
	path string
	err  error
}

// buildBinary builds a gpufrac command into bin/, once per test binary (go
// build itself skips the work when bin/ is up to date).
func buildBinary(t testing.TB, name string) string {
	t.Helper()
	return buildBinaryAs(t, name, name)
}

// buildBinaryAs builds command cmd with extra go build flags into bin/out,
// once per test binary.
func buildBinaryAs(t testing.TB, cmdName, out string, flags ...string) string {
	t.Helper()
	v, _ := builds.LoadOrStore(out, &build{})
	b := v.(*build)
	b.once.Do(func() {
		root := repoRoot(t)
		b.path = filepath.Join(root, "bin", out)
		args := append(append([]string{"build"}, flags...), "-o", b.path, "./cmd/"+cmdName)
		cmd := exec.Command("go", args...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("building %s: %v\n%s", cmdName, err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// startCluster starts the test bed with node agents on every GPU node. Each
// test has a control plane of its own, so the tests that call it run in
// parallel (t.Parallel at their top; go test -parallel bounds how many): most
// of their time is spent waiting for Karpenter, kwok and the coordinator.
func startCluster(t *testing.T, opts cluster.Options) *cluster.Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end: needs the local cluster (make tools)")
	}
	buildBinary(t, "gpufrac-node")
	if opts.NodeAgents == nil {
		opts.NodeAgents = &cluster.NodeAgentOptions{}
	}
	// The harness installs gpufrac's cluster objects (Queue CRD, namespaces,
	// priority classes, RBAC) and its admission policies: every test runs
	// under them.
	return cluster.StartForTest(t, opts)
}

var queueGVR = schema.GroupVersionResource{Group: "gpufrac.io", Version: "v1alpha1", Resource: "queues"}

// addGPUNodes adds n mock-H100 nodes named prefix-0.. in a pool and waits for their agents.
func addGPUNodes(t *testing.T, c *cluster.Cluster, prefix, pool string, n int) []string {
	t.Helper()
	var names []string
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("%s-%d", prefix, i)
		labels := map[string]string{api.LabelGPUNode: "true", api.LabelGPUProduct: cluster.H100Product}
		if pool != "" {
			labels[api.LabelNodePool] = pool
		}
		if _, err := c.AddNode(t.Context(), cluster.NodeSpec{Name: name, Labels: labels, Capacity: cluster.ResourceList(map[corev1.ResourceName]string{
			corev1.ResourceCPU: "192", corev1.ResourceMemory: "2Ti", corev1.ResourcePods: "250",
		})}); err != nil {
			t.Fatal(err)
		}
		names = append(names, name)
	}
	for _, name := range names {
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		if _, err := c.WaitForNodeAgent(ctx, name); err != nil {
			cancel()
			t.Fatalf("node agent of %s: %v", name, err)
		}
		cancel()
		// The coordinator needs the inventory and the fraction capacity, and
		// a node without the not-ready taint new nodes start with (pods do not
		// tolerate it: a test that hits the control plane right away, say
		// restarts the API server, would keep it for the restart's duration).
		waitFor(t, 30*time.Second, name+" to publish GPUs", func(ctx context.Context) (bool, error) {
			n, err := c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			for _, taint := range n.Spec.Taints {
				if taint.Key == corev1.TaintNodeNotReady {
					return false, nil
				}
			}
			q := n.Status.Allocatable[api.ResourceFraction]
			return n.Annotations[api.AnnotationGPUInventory] != "" && q.Value() == 800, nil
		})
	}
	return names
}

// applyFile creates every object of a multi-document YAML file (AlreadyExists is fine).
func applyFile(tb testing.TB, c *cluster.Cluster, path string) {
	tb.Helper()
	if _, err := cluster.NewApplier(c.Client, c.Dynamic).ApplyFile(tb.Context(), path); err != nil {
		tb.Fatal(err)
	}
}

// applyYAML creates every object of multi-document YAML (AlreadyExists is fine).
func applyYAML(tb testing.TB, c *cluster.Cluster, data []byte) {
	tb.Helper()
	if _, err := cluster.NewApplier(c.Client, c.Dynamic).Apply(tb.Context(), "test YAML", data); err != nil {
		tb.Fatal(err)
	}
}

// coordinator is a running gpufrac-coordinator process.
type coordinator struct {
	cmd *exec.Cmd
	log string
}

// startCoordinator runs the real coordinator against the cluster.
func startCoordinator(t *testing.T, c *cluster.Cluster, id string, args ...string) *coordinator {
	t.Helper()
	return startCoordinatorBin(t, c, filepath.Join(repoRoot(t), "bin", "gpufrac-coordinator"), id, nil, args...)
}

// startCoordinatorBin runs a coordinator binary with extra environment.
func startCoordinatorBin(t *testing.T, c *cluster.Cluster, bin, id string, env []string, args ...string) *coordinator {
	t.Helper()
	logPath := filepath.Join(c.LogDir(), "coordinator-"+id+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	all := coordinatorArgs(t, c, id, args...)
	cmd := exec.Command(bin, all...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	co := &coordinator{cmd: cmd, log: logPath}
	t.Cleanup(func() {
		co.stop(syscall.SIGTERM)
		f.Close()
		logTailOnFailure(t, id, logPath)
	})
	return co
}

// coordinatorArgs are the arguments of a coordinator process, as the
// chart's Deployment runs it: its arguments (the kubelet's expansion, with
// the pod name id) and its ServiceAccount, with exactly the rights the chart
// grants and the identity the admission policies trust. A local process
// differs in its kubeconfig and metrics address (off); the tests shorten
// leader election, and args come last (the last value of a flag wins).
func coordinatorArgs(t *testing.T, c *cluster.Cluster, id string, args ...string) []string {
	t.Helper()
	in := c.Installed()
	chartArgs, err := in.CoordinatorProcessArgs(c.Dir, id)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := c.ServiceAccountKubeconfig(t.Context(), in.Namespace, in.Coordinator.ServiceAccount, nil)
	if err != nil {
		t.Fatal(err)
	}
	return append(append(cluster.ReplaceFlag(chartArgs, "metrics-addr", ""), "--kubeconfig="+kubeconfig,
		"--lease-duration=4s", "--renew-deadline=3s", "--retry-period=500ms"), args...)
}

// logTailOnFailure logs the end of a coordinator's log when the test failed.
func logTailOnFailure(t *testing.T, id, logPath string) {
	if !t.Failed() {
		return
	}
	b, _ := os.ReadFile(logPath)
	if len(b) > 20000 {
		b = b[len(b)-20000:]
	}
	t.Logf("coordinator %s log (tail):\n%s", id, b)
}

func (co *coordinator) stop(sig syscall.Signal) {
	if co.cmd.ProcessState != nil {
		return
	}
	_ = syscall.Kill(-co.cmd.Process.Pid, sig)
	done := make(chan struct{})
	go func() { _ = co.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-co.cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
}

// waitFor polls cond every 100ms until it holds or limit passes.
func waitFor(t testing.TB, limit time.Duration, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	if err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, cond); err != nil {
		if ctx.Err() == nil { // cond failed before the limit
			t.Fatalf("waiting for %s: %v", what, err)
		}
		t.Fatalf("timed out after %s waiting for %s: %v", limit, what, err)
	}
}

// podsOf lists the pods with a label in a namespace.
func podsOf(t testing.TB, c *cluster.Cluster, ns, selector string) []corev1.Pod {
	t.Helper()
	l, err := c.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

func scheduledReason(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return c.Reason
		}
	}
	return ""
}

// checkInvariants asserts tests/invariants on the cluster once it settles,
// for tests whose coordinator keeps idle reservations for its default grace.
func checkInvariants(t *testing.T, c *cluster.Cluster) {
	t.Helper()
	invariants.Eventually(t, c.Client, c.Dynamic, invariants.Options{AllowIdleReservations: true}, 60*time.Second)
}
