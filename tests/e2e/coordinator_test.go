package e2e

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
	"github.com/gpufrac/gpufrac/tests/builders"
	"github.com/gpufrac/gpufrac/tests/cluster"
)

// queuesYAML makes top-level queues with GPU quotas that take pods from
// every namespace.
func queuesYAML(quotas map[string]string) []byte {
	var b strings.Builder
	for name, gpus := range quotas {
		fmt.Fprintf(&b, "---\napiVersion: gpufrac.io/v1alpha1\nkind: Queue\nmetadata: {name: %s}\nspec:\n  namespaces: [\"*\"]\n  resources:\n    gpu: {quota: %q}\n", name, gpus)
	}
	return []byte(b.String())
}

func create(t *testing.T, c *cluster.Cluster, pods ...*corev1.Pod) {
	t.Helper()
	for _, p := range pods {
		p.Spec.SchedulerName = api.SchedulerName
		if _, err := c.Client.CoreV1().Pods(p.Namespace).Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating pod %s: %v", p.Name, err)
		}
	}
}

func pod(name, queue string) *builders.PodWrapper {
	return builders.MakePod(name, "default").Queue(queue).CPU("1").Memory("1Gi").Label("e2e", "yes")
}

// running waits until every listed pod runs.
func running(t *testing.T, c *cluster.Cluster, limit time.Duration, names ...string) map[string]*corev1.Pod {
	t.Helper()
	out := map[string]*corev1.Pod{}
	waitFor(t, limit, fmt.Sprintf("%d pods Running", len(names)), func(ctx context.Context) (bool, error) {
		for _, n := range names {
			p, err := c.Client.CoreV1().Pods("default").Get(ctx, n, metav1.GetOptions{})
			if err != nil || p.Status.Phase != corev1.PodRunning {
				return false, nil
			}
			out[n] = p
		}
		return true, nil
	})
	return out
}

func TestCoordinatorPlacesWholeAndFractionPods(t *testing.T) {
	t.Parallel()
	c := startCluster(t, cluster.Options{})
	buildBinary(t, "gpufrac-coordinator")
	addGPUNodes(t, c, "gpu", "", 2)
	applyYAML(t, c, queuesYAML(map[string]string{"team-a": "8", "team-b": "8"}))
	startCoordinator(t, c, "c1", "--leader-elect=false")

	create(t, c,
		pod("whole-a", "team-a").GPUs(2).Obj(),
		pod("whole-b", "team-a").GPUs(1).Obj(),
		pod("frac-30", "team-b").Fraction(30).Obj(),
		pod("frac-60a", "team-b").Fraction(60).Obj(),
		pod("frac-60b", "team-b").Fraction(60).Obj(),
	)
	pods := running(t, c, 60*time.Second, "whole-a", "whole-b", "frac-30", "frac-60a", "frac-60b")

	// Fractions: the node agent writes back the GPU the kubelet's PodResources
	// shows, and it gives the GPUs the coordinator planned. Pods of the same
	// size are interchangeable, so the planned and given GPUs must agree as
	// multisets per size, not necessarily pod by pod.
	gpuOf := map[string]string{}
	planned := map[int][]string{}
	given := map[int][]string{}
	size := map[string]int{"frac-30": 30, "frac-60a": 60, "frac-60b": 60}
	for _, n := range []string{"frac-30", "frac-60a", "frac-60b"} {
		p := pods[n]
		want := p.Annotations[api.AnnotationGPU]
		if want == "" {
			t.Fatalf("%s has no %s annotation", n, api.AnnotationGPU)
		}
		var got string
		waitFor(t, 20*time.Second, n+" allocated-gpu write-back", func(ctx context.Context) (bool, error) {
			q, err := c.Client.CoreV1().Pods("default").Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			got = q.Annotations[api.AnnotationAllocatedGPU]
			return got != "", nil
		})
		agent := c.NodeAgent(p.Spec.NodeName)
		found := false
		for _, a := range agent.Kubelet.Allocations() {
			if a.Pod.Name == n && a.Resource == api.ResourceFraction {
				g, err := resource.GPUOfUnits(a.DeviceIDs)
				if err != nil || g != got {
					t.Errorf("%s: PodResources units on %s (%v), allocated-gpu says %s", n, g, err, got)
				}
				found = true
			}
		}
		if !found {
			t.Errorf("%s has no fraction devices in %s's PodResources", n, p.Spec.NodeName)
		}
		planned[size[n]] = append(planned[size[n]], p.Spec.NodeName+"/"+want)
		given[size[n]] = append(given[size[n]], p.Spec.NodeName+"/"+got)
		gpuOf[n] = got
	}
	for sz := range planned {
		sort.Strings(planned[sz])
		sort.Strings(given[sz])
		if diff := cmp.Diff(planned[sz], given[sz]); diff != "" {
			t.Errorf("%d%% fractions: GPUs planned vs given (-planned +given):\n%s", sz, diff)
		}
	}
	if gpuOf["frac-60a"] == gpuOf["frac-60b"] {
		t.Errorf("two 60%% fractions share GPU %s", gpuOf["frac-60a"])
	}
	// Whole GPUs: the devices are in PodResources, and none carries a fraction.
	for _, n := range []string{"whole-a", "whole-b"} {
		p := pods[n]
		for _, a := range c.NodeAgent(p.Spec.NodeName).Kubelet.Allocations() {
			if a.Pod.Name == n {
				for _, id := range a.DeviceIDs {
					for f, g := range gpuOf {
						if g == id {
							t.Errorf("%s holds GPU %s whole while %s has a fraction on it", n, id, f)
						}
					}
				}
			}
		}
	}
	checkInvariants(t, c)
}

func TestGangBindsAllOrNothingInOnePool(t *testing.T) {
	t.Parallel()
	c := startCluster(t, cluster.Options{})
	buildBinary(t, "gpufrac-coordinator")
	addGPUNodes(t, c, "a", "pool-a", 2)
	addGPUNodes(t, c, "b", "pool-b", 2)
	applyYAML(t, c, queuesYAML(map[string]string{"train": "32", "other": "8"}))
	startCoordinator(t, c, "c1", "--leader-elect=false")

	// Take 2 GPUs in pool-b so only pool-a can hold 16 whole GPUs.
	create(t, c, pod("filler", "other").GPUs(2).NodeSelector(api.LabelNodePool, "pool-b").Obj())
	running(t, c, 60*time.Second, "filler")

	var names []string
	for i := 0; i < 16; i++ {
		n := fmt.Sprintf("gang-%02d", i)
		names = append(names, n)
		create(t, c, pod(n, "train").GPUs(1).PodGroup("job-1").MinMember(16).Obj())
	}
	pods := running(t, c, 90*time.Second, names...)
	nodes := map[string]bool{}
	for _, p := range pods {
		if !strings.HasPrefix(p.Spec.NodeName, "a-") {
			t.Errorf("%s on %s, outside pool-a", p.Name, p.Spec.NodeName)
		}
		nodes[p.Spec.NodeName] = true
	}
	t.Logf("gang of 16 on %d nodes of pool-a", len(nodes))

	// A second gang of 16 cannot fit anywhere (14 GPUs free): nothing of it binds.
	var second []string
	for i := 0; i < 16; i++ {
		n := fmt.Sprintf("gang2-%02d", i)
		second = append(second, n)
		create(t, c, pod(n, "train").GPUs(1).PodGroup("job-2").MinMember(16).Obj())
	}
	waitFor(t, 30*time.Second, "the second gang to report NoCapacity", func(ctx context.Context) (bool, error) {
		for _, n := range second {
			p, err := c.Client.CoreV1().Pods("default").Get(ctx, n, metav1.GetOptions{})
			if err != nil || scheduledReason(p) != api.ReasonNoCapacity {
				return false, nil
			}
		}
		return true, nil
	})
	for _, n := range second {
		p, _ := c.Client.CoreV1().Pods("default").Get(t.Context(), n, metav1.GetOptions{})
		if p.Spec.NodeName != "" {
			t.Errorf("%s was bound to %s although its gang cannot fit", n, p.Spec.NodeName)
		}
	}
	checkInvariants(t, c)
}

func TestOverQuotaStaysPendingAndReclaimReturnsQuota(t *testing.T) {
	t.Parallel()
	c := startCluster(t, cluster.Options{})
	buildBinary(t, "gpufrac-coordinator")
	addGPUNodes(t, c, "gpu", "", 1) // 8 GPUs
	applyYAML(t, c, queuesYAML(map[string]string{"team-a": "4", "team-b": "4"}))
	startCoordinator(t, c, "c1", "--leader-elect=false")

	// team-b borrows team-a's idle quota: 8 GPUs, 4 of them over quota.
	var b []string
	for i := 0; i < 8; i++ {
		n := fmt.Sprintf("b-%d", i)
		b = append(b, n)
		create(t, c, pod(n, "team-b").GPUs(1).Obj())
	}
	running(t, c, 60*time.Second, b...)
	// A ninth team-b pod: over quota and no room: OverQuota, never Unschedulable.
	create(t, c, pod("b-extra", "team-b").GPUs(1).Obj())
	waitFor(t, 20*time.Second, "b-extra OverQuota", func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods("default").Get(ctx, "b-extra", metav1.GetOptions{})
		return err == nil && scheduledReason(p) == api.ReasonOverQuota, nil
	})

	// team-a comes back for its 4 GPUs: team-b's over-quota pods are reclaimed.
	var a []string
	for i := 0; i < 4; i++ {
		n := fmt.Sprintf("a-%d", i)
		a = append(a, n)
		create(t, c, pod(n, "team-a").GPUs(1).Obj())
	}
	running(t, c, 90*time.Second, a...)
	left := 0
	for _, p := range podsOf(t, c, "default", "e2e=yes") {
		if strings.HasPrefix(p.Name, "b-") && p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			left++
		}
		if r := scheduledReason(&p); r == corev1.PodReasonUnschedulable {
			t.Errorf("%s has reason Unschedulable", p.Name)
		}
	}
	if left != 4 {
		t.Errorf("team-b runs %d pods after reclaim, want its deserved 4", left)
	}
	checkInvariants(t, c)
}

func TestLeaderKilledMidRunLosesAndDuplicatesNothing(t *testing.T) {
	t.Parallel()
	c := startCluster(t, cluster.Options{})
	buildBinary(t, "gpufrac-coordinator")
	addGPUNodes(t, c, "gpu", "", 2) // 16 GPUs
	applyYAML(t, c, queuesYAML(map[string]string{"q": "32"}))
	coords := map[string]*coordinator{
		"c1": startCoordinator(t, c, "c1", "--leader-elect=true"),
		"c2": startCoordinator(t, c, "c2", "--leader-elect=true"),
	}

	// 6 fractions of 40% (3 GPUs) and 6 whole GPUs, then a gang of 4: 13 of 16 GPUs.
	var names []string
	for i := 0; i < 12; i++ {
		n := fmt.Sprintf("w-%02d", i)
		names = append(names, n)
		if i%2 == 0 {
			create(t, c, pod(n, "q").Fraction(40).Obj())
		} else {
			create(t, c, pod(n, "q").GPUs(1).Obj())
		}
		if i == 5 {
			running(t, c, 60*time.Second, names...)
			leader := leaseHolder(t, c)
			coords[leader].stop(syscall.SIGKILL) // the leader dies mid-run
			t.Logf("killed the leader %s", leader)
		}
	}
	for i := 0; i < 4; i++ {
		n := fmt.Sprintf("gang-%d", i)
		names = append(names, n)
		create(t, c, pod(n, "q").GPUs(1).PodGroup("g").MinMember(4).Obj())
	}
	pods := running(t, c, 120*time.Second, names...)

	// Nothing over-committed: whole GPUs and fraction units per node within capacity,
	// fractions per GPU at most 100%, and no pod failed admission.
	whole := map[string]int{}
	frac := map[string]int{}
	for _, p := range pods {
		for _, ctr := range p.Spec.Containers {
			if q, ok := ctr.Resources.Limits[api.ResourceGPU]; ok {
				whole[p.Spec.NodeName] += int(q.Value())
			}
			if q, ok := ctr.Resources.Limits[api.ResourceFraction]; ok {
				// The GPU the pod actually got: same-size fractions are
				// interchangeable, so the plan may differ pod by pod.
				var g string
				waitFor(t, 30*time.Second, p.Name+" allocated-gpu", func(ctx context.Context) (bool, error) {
					q, err := c.Client.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
					if err != nil {
						return false, nil
					}
					g = q.Annotations[api.AnnotationAllocatedGPU]
					return g != "", nil
				})
				frac[p.Spec.NodeName+"/"+g] += int(q.Value())
			}
		}
	}
	for n, w := range whole {
		if w > 8 {
			t.Errorf("node %s has %d whole GPUs bound", n, w)
		}
	}
	for g, f := range frac {
		if f > 100 {
			t.Errorf("GPU %s has %d%% of fractions", g, f)
		}
	}
	for _, p := range podsOf(t, c, "default", "e2e=yes") {
		if p.Status.Phase == corev1.PodFailed {
			t.Errorf("%s failed: %s", p.Name, p.Status.Message)
		}
	}
	checkInvariants(t, c)
}

// leaseHolder returns the identity holding the coordinator's Lease.
func leaseHolder(t *testing.T, c *cluster.Cluster) string {
	t.Helper()
	var holder string
	waitFor(t, 30*time.Second, "a coordinator leader", func(ctx context.Context) (bool, error) {
		l, err := c.Client.CoordinationV1().Leases(api.ComponentNamespace).Get(ctx, "gpufrac-coordinator", metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return false, nil
		}
		holder = *l.Spec.HolderIdentity
		return holder != "", nil
	})
	return holder
}
