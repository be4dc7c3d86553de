package cluster_test

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/tests/cluster"
)

// holdGate is a scheduling gate on the test's Job pods: kwok completes a
// Job's pod as soon as it runs, which would free its quota at once; gated,
// an admitted Job's pod exists but holds its quota until the test lets it run.
const holdGate = "gpufrac.test/hold"

// TestKueue: a ClusterQueue with 1 CPU and two Jobs of 600m each, labelled for
// its LocalQueue and created without suspend. Kueue's Job webhook suspends
// both; exactly one is admitted (its Workload Admitted, the Job unsuspended,
// its pod created) while the other stays suspended, without pods, its
// Workload not admitted. Once the admitted Job's pod runs (placed by the
// default scheduler on a kwok node) and completes, the other is admitted.
func TestKueue(t *testing.T) {
	clusterTest(t)
	c := cluster.StartForTest(t, cluster.Options{
		Kueue: &cluster.KueueOptions{},
		// Kueue's CRDs and its manager's start come on top of the control plane's.
		StartTimeout: 3 * time.Minute,
	})
	ctx := t.Context()
	if !c.KueueRunning() {
		t.Fatal("KueueRunning() = false after Start")
	}
	checkLoopbackOnly(t, c, "kueue")

	const node = "kueue-node" // 32 CPUs: the queue's quota, not the node, holds Jobs back
	if _, err := c.AddNode(ctx, cluster.NodeSpec{Name: node}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "node ready", nodeReady(c, node))

	// Kueue's objects: a flavor, a 1-CPU queue over it, a LocalQueue.
	const ns, flavor, cq, lq = "kueue-test", "default-flavor", "one-cpu", "jobs"
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cqObj, err := cluster.ClusterQueueObject(cluster.ClusterQueue{
		Name: cq, Flavor: flavor, QueueingStrategy: "StrictFIFO",
		Quotas: cluster.ResourceList(map[corev1.ResourceName]string{corev1.ResourceCPU: "1", corev1.ResourceMemory: "1Gi"}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Dynamic.Resource(cluster.ResourceFlavorResource()).Create(ctx, cluster.ResourceFlavorObject(flavor, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Dynamic.Resource(cluster.ClusterQueueResource()).Create(ctx, cqObj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Dynamic.Resource(cluster.LocalQueueResource()).Namespace(ns).Create(ctx, cluster.LocalQueueObject(ns, lq, cq), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "ClusterQueue and LocalQueue active", func(ctx context.Context) (bool, error) {
		q, err := c.Dynamic.Resource(cluster.ClusterQueueResource()).Get(ctx, cq, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		l, err := c.Dynamic.Resource(cluster.LocalQueueResource()).Namespace(ns).Get(ctx, lq, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return cluster.ConditionTrue(q, "Active") && cluster.ConditionTrue(l, "Active"), nil
	})

	// Two Jobs, created without suspend: the webhook suspends them.
	jobs := []string{"job-a", "job-b"}
	for _, name := range jobs {
		created, err := c.Client.BatchV1().Jobs(ns).Create(ctx, kueueJob(ns, name, lq), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if s := created.Spec.Suspend; s == nil || !*s {
			t.Fatalf("Job %s created with spec.suspend %s: Kueue's Job webhook did not suspend it", name,
				map[bool]string{true: "unset", false: "false"}[s == nil])
		}
	}

	// Exactly one admitted: its Workload Admitted, the Job unsuspended, its pod there.
	var admitted, held string
	waitFor(t, 60*time.Second, "one Job admitted and running its pod", func(ctx context.Context) (bool, error) {
		state, err := kueueJobStates(ctx, c, ns, jobs)
		if err != nil {
			return false, err
		}
		var ready []string
		for _, name := range jobs {
			if s := state[name]; s.admitted && !s.suspended && s.pods > 0 {
				ready = append(ready, name)
			}
		}
		if len(ready) > 1 {
			return false, fmt.Errorf("both Jobs admitted within a 1-CPU quota: %+v", state)
		}
		if len(ready) == 1 {
			admitted = ready[0]
			held = jobs[0]
			if admitted == jobs[0] {
				held = jobs[1]
			}
		}
		return len(ready) == 1, nil
	})
	t.Logf("admitted %s, held %s", admitted, held)

	// The other stays suspended, without pods, its Workload not admitted, while
	// the first holds the quota (Kueue decides within a second or two).
	heldState := func(ctx context.Context) (kueueJobState, error) {
		state, err := kueueJobStates(ctx, c, ns, []string{held})
		return state[held], err
	}
	waitFor(t, 30*time.Second, "the held Job's Workload", func(ctx context.Context) (bool, error) {
		s, err := heldState(ctx)
		return s.workload, err
	})
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		s, err := heldState(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !s.workload || s.admitted || s.quotaReserved || !s.suspended || s.pods > 0 {
			t.Fatalf("Job %s got past a full queue: %+v", held, s)
		}
	}

	// Let the admitted Job's pod run: the default scheduler places it on the
	// kwok node, kwok runs and completes it, the Job completes and Kueue gives
	// its quota to the other.
	pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + admitted})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("pods of %s: %v (err %v)", admitted, pods, err)
	}
	pod := pods.Items[0].Name
	ungate(t, c, ns, pod)
	waitFor(t, 60*time.Second, "the admitted Job's pod placed and completed", func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if p.Spec.NodeName != "" && p.Spec.NodeName != node {
			return false, fmt.Errorf("pod %s placed on %s, not %s", pod, p.Spec.NodeName, node)
		}
		return p.Status.Phase == corev1.PodSucceeded, nil
	})
	waitFor(t, 60*time.Second, "the held Job admitted once the quota is free", func(ctx context.Context) (bool, error) {
		s, err := heldState(ctx)
		return s.admitted && !s.suspended && s.pods > 0, err
	})
}

// kueueJob is a Job of one 600m-CPU pod for a LocalQueue, without spec.suspend.
func kueueJob(ns, name, queue string) *batchv1.Job {
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{cluster.KueueQueueNameLabel: queue}},
		Spec: batchv1.JobSpec{
			Parallelism:  ptr.To[int32](1),
			Completions:  ptr.To[int32](1),
			BackoffLimit: ptr.To[int32](0),
			Template: corev1.PodTemplateSpec{
				Spec: corev1.PodSpec{
					RestartPolicy:   corev1.RestartPolicyNever,
					SchedulingGates: []corev1.PodSchedulingGate{{Name: holdGate}},
					Containers: []corev1.Container{{
						Name:  "main",
						Image: "registry.k8s.io/pause:3.10",
						Resources: corev1.ResourceRequirements{
							Requests: cluster.ResourceList(map[corev1.ResourceName]string{corev1.ResourceCPU: "600m", corev1.ResourceMemory: "100Mi"}),
						},
					}},
					TerminationGracePeriodSeconds: ptr.To[int64](0),
				},
			},
		},
	}
}

// kueueJobState is what Kueue did with a Job.
type kueueJobState struct {
	suspended     bool
	workload      bool // a Workload owned by the Job exists
	quotaReserved bool
	admitted      bool
	pods          int
}

// kueueJobStates reads the Jobs, their Workloads (found by owner) and pods.
func kueueJobStates(ctx context.Context, c *cluster.Cluster, ns string, names []string) (map[string]kueueJobState, error) {
	wls, err := c.Dynamic.Resource(cluster.WorkloadResource()).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := map[string]kueueJobState{}
	for _, name := range names {
		job, err := c.Client.BatchV1().Jobs(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + name})
		if err != nil {
			return nil, err
		}
		s := kueueJobState{suspended: ptr.Deref(job.Spec.Suspend, false), pods: len(pods.Items)}
		for i := range wls.Items {
			if ownedBy(&wls.Items[i], job) {
				s.workload = true
				s.quotaReserved = cluster.ConditionTrue(&wls.Items[i], cluster.KueueQuotaReserved)
				s.admitted = cluster.ConditionTrue(&wls.Items[i], cluster.KueueAdmitted)
			}
		}
		out[name] = s
	}
	return out, nil
}

func ownedBy(obj *unstructured.Unstructured, job *batchv1.Job) bool {
	return slices.ContainsFunc(obj.GetOwnerReferences(), func(r metav1.OwnerReference) bool { return r.UID == job.UID })
}

// ungate removes the test's scheduling gate from a pod.
func ungate(t *testing.T, c *cluster.Cluster, ns, name string) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := c.Client.CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		p.Spec.SchedulingGates = slices.DeleteFunc(p.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == holdGate })
		_, err = c.Client.CoreV1().Pods(ns).Update(t.Context(), p, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("removing the scheduling gate of pod %s: %v", name, err)
	}
}

// checkLoopbackOnly fails the test unless every TCP socket the named
// component listens on is bound to 127.0.0.1.
func checkLoopbackOnly(t *testing.T, c *cluster.Cluster, component string) {
	t.Helper()
	var pid int
	for _, p := range c.Processes() {
		if p.Name == component {
			pid = p.PID
		}
	}
	if pid == 0 {
		t.Fatalf("no process %s", component)
	}
	addrs, err := listenAddrs(pid)
	if err != nil {
		t.Fatal(err)
	}
	if len(addrs) == 0 {
		t.Fatalf("%s (pid %d) listens on nothing", component, pid)
	}
	for _, a := range addrs {
		if !strings.HasPrefix(a, "127.0.0.1:") {
			t.Errorf("%s listens on %s, not on the loopback address only (all: %v)", component, a, addrs)
		}
	}
	t.Logf("%s listens on %v", component, addrs)
}

// listenAddrs lists the TCP addresses a process listens on, from its open
// sockets and /proc/net/tcp{,6}.
func listenAddrs(pid int) ([]string, error) {
	fds, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "fd"))
	if err != nil {
		return nil, err
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "fd", fd.Name()))
		if inode, ok := strings.CutPrefix(target, "socket:["); err == nil && ok {
			inodes[strings.TrimSuffix(inode, "]")] = true
		}
	}
	var addrs []string
	for _, table := range []string{"tcp", "tcp6"} {
		f, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "net", table))
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || fields[3] != "0A" || !inodes[fields[9]] { // 0A: LISTEN
				continue
			}
			addr, err := procNetAddr(fields[1])
			if err != nil {
				f.Close()
				return nil, err
			}
			addrs = append(addrs, addr)
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return nil, err
		}
	}
	return addrs, nil
}

// procNetAddr decodes /proc/net/tcp's "0100007F:1F90" (address bytes in host
// order, 32-bit words) into "127.0.0.1:8080".
func procNetAddr(s string) (string, error) {
	hexIP, hexPort, ok := strings.Cut(s, ":")
	raw, err := hex.DecodeString(hexIP)
	if !ok || err != nil || (len(raw) != 4 && len(raw) != 16) {
		return "", fmt.Errorf("decoding address %q", s)
	}
	port, err := strconv.ParseUint(hexPort, 16, 16)
	if err != nil {
		return "", fmt.Errorf("decoding address %q: %w", s, err)
	}
	ip := make(net.IP, len(raw))
	for i := 0; i < len(raw); i += 4 {
		ip[i], ip[i+1], ip[i+2], ip[i+3] = raw[i+3], raw[i+2], raw[i+1], raw[i]
	}
	return net.JoinHostPort(ip.String(), strconv.FormatUint(port, 10)), nil
}
