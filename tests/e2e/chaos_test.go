package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/scheduler"
	"github.com/gpufrac/gpufrac/tests/builders"
	"github.com/gpufrac/gpufrac/tests/cluster"
	"github.com/gpufrac/gpufrac/tests/invariants"
	"github.com/gpufrac/gpufrac/tests/kubeletsim"
)

// The chaos suite (issue 13): each fault hits while a burst of fractions, a
// gang and whole-GPU work is being scheduled, and afterwards the work runs
// and tests/invariants finds nothing wrong. The moments "mid-gang-bind" and
// "mid-reservation-creation" are hit deterministically: the coordinator is
// built with -tags faultinject and pauses at a fault point
// (GPUFRAC_FAULT_PAUSE, package coordinator/faultpoint), writes a marker
// file, and the test kills it with SIGKILL there. "Mid-Allocate" is the
// kubelet simulator's BeforeAllocate hook holding an Allocate while the
// simulator restarts. Three clusters run side by side, two or three faults
// each.

// chaosArgs are every chaos coordinator's flags: reservations go 2 s after
// their last fraction (the invariants want no idle one), a gang bound in
// part is rolled back after 10 s, and fractions are packed (binpack) so the
// bursts fit the small test bed.
var chaosArgs = []string{"--leader-elect=true", "--reservation-grace=2s", "--gang-bind-timeout=10s", "--policy=binpack"}

// chaosCoordinator builds the coordinator with its fault points wired.
func chaosCoordinator(t *testing.T) string {
	t.Helper()
	return buildBinaryAs(t, "gpufrac-coordinator", "gpufrac-coordinator-chaos", "-tags=faultinject")
}

// supervisedCoordinator is a coordinator started again whenever it exits,
// as its Deployment would (a coordinator that lost its lease exits).
type supervisedCoordinator struct {
	mu      sync.Mutex
	cmd     *exec.Cmd
	stopped bool
	done    chan struct{}
}

// supervise runs a coordinator under supervision until the test ends.
func supervise(t *testing.T, c *cluster.Cluster, bin, id string, args ...string) *supervisedCoordinator {
	t.Helper()
	s := &supervisedCoordinator{done: make(chan struct{})}
	logPath := filepath.Join(c.LogDir(), "coordinator-"+id+".log")
	all := coordinatorArgs(t, c, id, args...)
	start := func() (*exec.Cmd, error) {
		f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		cmd := exec.Command(bin, all...)
		cmd.Stdout, cmd.Stderr = f, f
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		return cmd, cmd.Start()
	}
	cmd, err := start()
	if err != nil {
		t.Fatal(err)
	}
	s.cmd = cmd
	go func() {
		defer close(s.done)
		for {
			s.mu.Lock()
			cur := s.cmd
			s.mu.Unlock()
			_ = cur.Wait()
			s.mu.Lock()
			if s.stopped {
				s.mu.Unlock()
				return
			}
			time.Sleep(500 * time.Millisecond)
			next, err := start()
			if err != nil {
				s.mu.Unlock()
				return
			}
			s.cmd = next
			s.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		s.stop(syscall.SIGTERM)
		logTailOnFailure(t, id, logPath)
	})
	return s
}

// stop ends supervision and the current process (SIGKILL after 10 s).
func (s *supervisedCoordinator) stop(sig syscall.Signal) {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return
	}
	s.stopped = true
	pid := s.cmd.Process.Pid
	s.mu.Unlock()
	_ = syscall.Kill(-pid, sig)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		<-s.done
	}
}

// waitLeader waits until id holds the coordinator's lease.
func waitLeader(t *testing.T, c *cluster.Cluster, id string) {
	t.Helper()
	waitFor(t, 30*time.Second, id+" to lead", func(ctx context.Context) (bool, error) {
		l, err := c.Client.CoordinationV1().Leases(api.ComponentNamespace).Get(ctx, "gpufrac-coordinator", metav1.GetOptions{})
		return err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == id, nil
	})
}

// waitMarker waits for a paused coordinator's fault point marker.
func waitMarker(t *testing.T, path string, limit time.Duration) {
	t.Helper()
	waitFor(t, limit, "the coordinator to pause at its fault point", func(context.Context) (bool, error) {
		_, err := os.Stat(path)
		return err == nil, nil
	})
}

// burst is work submitted at once: fractions, a whole-GPU pod and a gang.
type burst struct {
	fractions, whole, gang []string
}

func (b burst) all() []string {
	return append(append(append([]string(nil), b.fractions...), b.whole...), b.gang...)
}

// burstShape sizes a burst: fractions of pct percent, one pod of wholeGPUs,
// a gang of gang one-GPU pods; nodeSel pins every pod to one node ("" for any).
type burstShape struct {
	fractions, pct, wholeGPUs, gang int
	nodeSel                         string
}

// submit creates a burst named prefix-* in queue q, as fast as it can.
func submit(t *testing.T, c *cluster.Cluster, prefix string, s burstShape) burst {
	t.Helper()
	var b burst
	mk := func(name string) *builders.PodWrapper {
		w := pod(name, "q").Label("chaos", prefix)
		if s.nodeSel != "" {
			w = w.NodeSelector(corev1.LabelHostname, s.nodeSel)
		}
		return w
	}
	for i := range s.fractions {
		n := fmt.Sprintf("%s-f%d", prefix, i)
		create(t, c, mk(n).Fraction(s.pct).Obj())
		b.fractions = append(b.fractions, n)
	}
	if s.wholeGPUs > 0 {
		n := prefix + "-w"
		create(t, c, mk(n).GPUs(s.wholeGPUs).Obj())
		b.whole = append(b.whole, n)
	}
	for i := range s.gang {
		n := fmt.Sprintf("%s-g%d", prefix, i)
		create(t, c, mk(n).GPUs(1).PodGroup(prefix+"-gang").MinMember(s.gang).Obj())
		b.gang = append(b.gang, n)
	}
	return b
}

// deletePods deletes pods of the default namespace (gone or going is fine).
func deletePods(t *testing.T, c *cluster.Cluster, names ...string) {
	t.Helper()
	zero := int64(0)
	for _, n := range names {
		_ = c.Client.CoreV1().Pods("default").Delete(t.Context(), n, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	}
	waitFor(t, 60*time.Second, fmt.Sprintf("%d pods to go", len(names)), func(ctx context.Context) (bool, error) {
		for _, n := range names {
			if _, err := c.Client.CoreV1().Pods("default").Get(ctx, n, metav1.GetOptions{}); err == nil {
				return false, nil
			}
		}
		return true, nil
	})
}

// reservationsOn lists the reservation pods bound to node ("" for all).
func reservationsOn(t *testing.T, c *cluster.Cluster, node string) []corev1.Pod {
	t.Helper()
	var out []corev1.Pod
	for _, p := range podsOf(t, c, api.ReservationNamespace, api.LabelRole+"="+api.RoleReservation) {
		if node == "" || p.Spec.NodeName == node {
			out = append(out, p)
		}
	}
	return out
}

// dumpOnFailure logs every pod with its node, phase, reason and GPU
// annotations, and the nodes' GPU inventories, when the test fails (before
// the cluster stops).
func dumpOnFailure(t *testing.T, c *cluster.Cluster) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		var b strings.Builder
		l, err := c.Client.CoreV1().Pods("").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Logf("listing pods: %v", err)
			return
		}
		for _, p := range l.Items {
			fmt.Fprintf(&b, "\n  %s/%s node=%s phase=%s reason=%s gpu=%s allocated=%s reserved=%s deleting=%v",
				p.Namespace, p.Name, p.Spec.NodeName, p.Status.Phase, scheduledReason(&p), p.Annotations[api.AnnotationGPU],
				p.Annotations[api.AnnotationAllocatedGPU], p.Annotations[api.AnnotationReservedGPU], p.DeletionTimestamp != nil)
		}
		if nodes, err := c.Client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{}); err == nil {
			for _, n := range nodes.Items {
				fmt.Fprintf(&b, "\n  node %s gpu=%v fraction=%v inventory=%s", n.Name, n.Status.Allocatable[api.ResourceGPU],
					n.Status.Allocatable[api.ResourceFraction], n.Annotations[api.AnnotationGPUInventory])
			}
		}
		t.Logf("cluster state at failure:%s", b.String())
	})
}

// settled checks the invariants once the work has had time to settle.
func settled(t *testing.T, c *cluster.Cluster, what string) {
	t.Helper()
	began := time.Now()
	invariants.Eventually(t, c.Client, c.Dynamic, invariants.Options{}, 60*time.Second)
	t.Logf("%s: invariants hold (settled in %s)", what, time.Since(began).Round(100*time.Millisecond))
}

// TestChaosCoordinatorKilledMidGangBindAndMidReservationCreation kills the
// leading coordinator with SIGKILL at two exact moments: after the first
// member of a gang was bound and before the next (mid-gang-bind), and after
// the first reservation pod of a burst was created and before the others
// (mid-reservation-creation). A standby takes over each time; the bursts
// run whole, and nothing is double-booked or left over.
func TestChaosCoordinatorKilledMidGangBindAndMidReservationCreation(t *testing.T) {
	t.Parallel()
	c := startCluster(t, cluster.Options{})
	dumpOnFailure(t, c)
	bin := chaosCoordinator(t)
	addGPUNodes(t, c, "gpu", "", 2) // 16 GPUs
	applyYAML(t, c, queuesYAML(map[string]string{"q": "16"}))
	shape := burstShape{fractions: 5, pct: 30, wholeGPUs: 2, gang: 3}

	// 1. Mid-gang-bind. One binding at a time, so the pause leaves the gang
	// bound in part.
	marker := filepath.Join(t.TempDir(), "gang")
	c1 := startCoordinatorBin(t, c, bin, "c1", []string{"GPUFRAC_FAULT_PAUSE=" + scheduler.FaultGangMemberBound + "=" + marker},
		append([]string{"--bind-workers=1"}, chaosArgs...)...)
	waitLeader(t, c, "c1")
	c2 := supervise(t, c, bin, "c2", chaosArgs...)
	a := submit(t, c, "a", shape)
	waitMarker(t, marker, 60*time.Second)
	bound := 0
	for _, n := range a.gang {
		if p, err := c.Client.CoreV1().Pods("default").Get(t.Context(), n, metav1.GetOptions{}); err == nil && p.Spec.NodeName != "" {
			bound++
		}
	}
	c1.stop(syscall.SIGKILL)
	if bound == 0 || bound == len(a.gang) {
		t.Fatalf("%d of %d gang members bound when the leader was killed, want some but not all", bound, len(a.gang))
	}
	t.Logf("killed the leader with %d of %d gang members bound", bound, len(a.gang))
	running(t, c, 120*time.Second, a.all()...)
	settled(t, c, "after the kill mid-gang-bind")

	// 2. Mid-reservation-creation: c3 leads (c2 steps down), pauses after
	// creating the first reservation of burst b, and dies there.
	marker = filepath.Join(t.TempDir(), "reservation")
	c3 := startCoordinatorBin(t, c, bin, "c3", []string{"GPUFRAC_FAULT_PAUSE=" + scheduler.FaultReservationCreated + "=" + marker},
		append([]string{"--bind-workers=1"}, chaosArgs...)...)
	c2.stop(syscall.SIGTERM)
	waitLeader(t, c, "c3")
	supervise(t, c, bin, "c4", chaosArgs...)
	before := map[string]bool{}
	for _, r := range reservationsOn(t, c, "") {
		before[r.Name] = true
	}
	b := submit(t, c, "b", shape)
	waitMarker(t, marker, 60*time.Second)
	var created []string
	for _, r := range reservationsOn(t, c, "") {
		if !before[r.Name] {
			created = append(created, r.Name)
		}
	}
	c3.stop(syscall.SIGKILL)
	if len(created) == 0 {
		t.Fatal("the coordinator paused after creating a reservation, but no new reservation exists")
	}
	t.Logf("killed the leader after it created reservation(s) %v for burst b", created)
	running(t, c, 120*time.Second, b.all()...)
	settled(t, c, "after the kill mid-reservation-creation")
}

// TestChaosAPIServerNodeAgentAndKubeletRestarts restarts, each while a
// burst is being scheduled: the API server (etcd kept); gpufrac-node with
// live allocations (SIGKILL, then it must rebuild from PodResources,
// register again and keep enforcing memory limits on the fractions it
// served before); the kubelet simulator in the middle of an Allocate.
func TestChaosAPIServerNodeAgentAndKubeletRestarts(t *testing.T) {
	t.Parallel()
	procRoot := filepath.Join(t.TempDir(), "proc")
	var armed atomic.Pointer[func(pod kubeletsim.PodRef)]
	c := startCluster(t, cluster.Options{NodeAgents: &cluster.NodeAgentOptions{
		Config: watchdogConfig,
		Args:   []string{"--proc-root=" + procRoot},
		BeforeAllocate: func(_ context.Context, _ string, pod kubeletsim.PodRef, _ string, _ []string) {
			if f := armed.Load(); f != nil {
				(*f)(pod)
			}
		},
	}})
	dumpOnFailure(t, c)
	bin := chaosCoordinator(t)
	node := addGPUNodes(t, c, "gpu", "", 1)[0]
	agent := c.NodeAgent(node)
	applyYAML(t, c, queuesYAML(map[string]string{"q": "8"}))
	supervise(t, c, bin, "c1", chaosArgs...)
	waitLeader(t, c, "c1")

	// 1. The API server restarts while burst a is being scheduled.
	a := submit(t, c, "a", burstShape{fractions: 5, pct: 30, wholeGPUs: 2, gang: 3})
	if err := c.RestartAPIServer(t.Context()); err != nil {
		t.Fatal(err)
	}
	running(t, c, 120*time.Second, a.all()...)
	settled(t, c, "after the API server restart")

	// 2. gpufrac-node dies (SIGKILL) and starts again while burst b is being
	// scheduled; burst a's fractions keep running on their GPUs.
	w := &watchdogBed{c: c, agent: agent, procRoot: procRoot}
	pods := w.writtenBack(t, a.fractions...)
	var pair []*corev1.Pod
	for _, p := range pods {
		if p.Annotations[api.AnnotationAllocatedGPU] == pods[0].Annotations[api.AnnotationAllocatedGPU] {
			pair = append(pair, p)
		}
	}
	if len(pair) < 2 {
		t.Fatalf("binpack put no two fractions of burst a on one GPU")
	}
	w.gpu = pair[0].Annotations[api.AnnotationAllocatedGPU]
	w.limitBytes = w.limitOf(t, node, 30)
	w.over, w.under = w.startContainer(t, pair[0], 0), w.startContainer(t, pair[1], 1)
	deletePods(t, c, append(a.whole, a.gang...)...)
	b := submit(t, c, "b", burstShape{fractions: 3, pct: 30, wholeGPUs: 1, gang: 2})
	regs := agent.Kubelet.Registrations(string(api.ResourceFraction))
	if err := agent.RestartAgent(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := agent.Kubelet.Registrations(string(api.ResourceFraction)); got <= regs {
		t.Errorf("%s registered %d times after the restart, want more than %d", api.ResourceFraction, got, regs)
	}
	// It enforces the limits of the fractions it served before it died.
	w.over.used, w.under.used = w.limitBytes+16<<30, w.limitBytes/3
	w.writeProcesses(t, w.over, w.under)
	w.waitEvent(t, w.over.pod, "GPUMemoryLimitExceeded", mibString(w.over.used), mibString(w.limitBytes), w.gpu)
	running(t, c, 120*time.Second, b.all()...)
	settled(t, c, "after the gpufrac-node restart")

	// 3. The kubelet simulator restarts while it admits a pod of burst c:
	// the Allocate is held between choosing devices and calling the plugin.
	deletePods(t, c, append(b.whole, b.gang...)...)
	reached, release := make(chan kubeletsim.PodRef, 1), make(chan struct{})
	var once sync.Once
	hold := func(pod kubeletsim.PodRef) {
		if !strings.HasPrefix(pod.Name, "c-") {
			return
		}
		once.Do(func() {
			reached <- pod
			<-release
		})
	}
	armed.Store(&hold)
	cb := submit(t, c, "c", burstShape{fractions: 2, pct: 30, wholeGPUs: 1, gang: 2})
	var held kubeletsim.PodRef
	select {
	case held = <-reached:
	case <-time.After(60 * time.Second):
		t.Fatal("no pod of burst c reached the kubelet's Allocate")
	}
	if err := agent.RestartKubelet(t.Context(), func() { close(release) }); err != nil {
		t.Fatal(err)
	}
	armed.Store(nil)
	t.Logf("restarted the kubelet simulator while it allocated to %s", held)
	running(t, c, 120*time.Second, cb.all()...)
	settled(t, c, "after the kubelet restart mid-Allocate")
}

// TestChaosNodeLossAndMIGSwitch deletes a GPU node under running fractions
// (an involuntary loss, as a spot interruption), switches another node to
// MIG while its shared GPUs hold reservations, and cordons a third to drain
// it, each while a burst is being scheduled: the reservations of the lost
// node go at once, those of the switched and the cordoned node once their
// fractions have, and the MIG layout then applies.
func TestChaosNodeLossAndMIGSwitch(t *testing.T) {
	t.Parallel()
	c := startCluster(t, cluster.Options{NodeAgents: &cluster.NodeAgentOptions{
		Config: partitionConfig,
		Args:   []string{"--device-list-strategy=cdi"},
	}})
	dumpOnFailure(t, c)
	bin := chaosCoordinator(t)
	nodes := addGPUNodes(t, c, "gpu", "", 3)
	agent := c.NodeAgent(nodes[2])
	applyYAML(t, c, queuesYAML(map[string]string{"q": "24"}))
	supervise(t, c, bin, "c1", chaosArgs...)
	waitLeader(t, c, "c1")
	small := func(node string) burstShape {
		return burstShape{fractions: 3, pct: 30, wholeGPUs: 1, gang: 2, nodeSel: node}
	}

	// 1. Node gpu-1 is lost under running fractions while burst b is being
	// scheduled on gpu-0.
	a := submit(t, c, "a", burstShape{fractions: 5, pct: 30, nodeSel: nodes[1]})
	running(t, c, 90*time.Second, a.all()...)
	if len(reservationsOn(t, c, nodes[1])) == 0 {
		t.Fatalf("no reservation on %s under its fractions", nodes[1])
	}
	b := submit(t, c, "b", small(nodes[0]))
	if err := c.Client.CoreV1().Nodes().Delete(t.Context(), nodes[1], metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the reservations of the lost node to go", func(context.Context) (bool, error) {
		return len(reservationsOn(t, c, nodes[1])) == 0, nil
	})
	running(t, c, 120*time.Second, b.all()...)
	settled(t, c, "after the node loss")

	// 2. gpu-2 runs fractions, so its shared GPUs hold reservations; the
	// admin switches it to MIG while burst d is being scheduled on gpu-0,
	// then its fractions end.
	cf := submit(t, c, "c", burstShape{fractions: 5, pct: 30, nodeSel: nodes[2]})
	running(t, c, 90*time.Second, cf.all()...)
	if len(reservationsOn(t, c, nodes[2])) == 0 {
		t.Fatalf("no reservation on %s under its fractions", nodes[2])
	}
	deletePods(t, c, append(b.whole, b.gang...)...)
	d := submit(t, c, "d", small(nodes[0]))
	if err := agent.WriteConfig(strings.Replace(partitionConfig, "default:\n  mode: fraction", "default:\n  mode: mig", 1)); err != nil {
		t.Fatal(err)
	}
	// The node says its GPUs are in mode mig (the layout waits: they are in
	// use), then the fractions end.
	waitFor(t, 30*time.Second, nodes[2]+"'s inventory to say mig", func(ctx context.Context) (bool, error) {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, nodes[2], metav1.GetOptions{})
		return err == nil && shapeOf(n).Modes["mig"] == 8, nil
	})
	deletePods(t, c, cf.fractions...)
	waitFor(t, 30*time.Second, "the reservations of the node switched to MIG to go", func(context.Context) (bool, error) {
		return len(reservationsOn(t, c, nodes[2])) == 0, nil
	})
	waitShape(t, c, nodes[2], 60*time.Second, migShape())
	running(t, c, 120*time.Second, d.all()...)
	settled(t, c, "after the switch to MIG")

	// 3. gpu-0 is cordoned to be drained while burst e is being scheduled;
	// its fractions end: their reservations go, and with them the
	// karpenter.sh/do-not-disrupt that would pin the node.
	if len(reservationsOn(t, c, nodes[0])) == 0 {
		t.Fatalf("no reservation on %s under its fractions", nodes[0])
	}
	deletePods(t, c, append(d.whole, d.gang...)...)
	e := submit(t, c, "e", burstShape{fractions: 3, pct: 30, wholeGPUs: 1, gang: 2})
	n0, err := c.Client.CoreV1().Nodes().Get(t.Context(), nodes[0], metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n0.Spec.Unschedulable = true
	if _, err := c.Client.CoreV1().Nodes().Update(t.Context(), n0, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The drain: every pod on gpu-0 ends; so does burst e, which has nowhere
	// else to run (gpu-1 is gone, gpu-2 serves MIG devices).
	var drained []string
	for _, p := range podsOf(t, c, "default", "e2e=yes") {
		if p.Spec.NodeName == nodes[0] || slices.Contains(e.all(), p.Name) {
			drained = append(drained, p.Name)
		}
	}
	deletePods(t, c, drained...)
	waitFor(t, 30*time.Second, "the reservations of the cordoned node to go", func(context.Context) (bool, error) {
		return len(reservationsOn(t, c, nodes[0])) == 0, nil
	})
	settled(t, c, "after the cordon")
}
