package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/tests/cluster"
	"github.com/gpufrac/gpufrac/tests/invariants"
)

// spotTypes are the test bed's instance types with spot offerings on the GPU
// types (spot prices about a third of on-demand, as H100 spot often is), or
// without them (spot withdrawn: the cloud has no spot capacity left).
func spotTypes(spot bool) []cluster.InstanceType {
	types := cluster.DefaultInstanceTypes()
	for i := range types {
		if spot && types[i].GPUProduct != "" {
			types[i].SpotPrice = types[i].Price * 0.35
		}
	}
	return types
}

// spotPools are two GPU NodePools that may buy spot and on-demand
// (Karpenter takes spot while it is offered and falls back to on-demand:
// the pattern Karpenter's docs give for spot with a fallback), gpu-a
// weighted first, and the CPU pool. Karpenter's own consolidation is off:
// it is not what this test is about, and it would remove nodes under it.
func spotPools(types []cluster.InstanceType) []cluster.NodePool {
	var gpu []string
	for _, it := range types {
		if it.GPUProduct != "" {
			gpu = append(gpu, it.Name)
		}
	}
	pool := func(name string, weight int32) cluster.NodePool {
		return cluster.NodePool{Name: name, Labels: map[string]string{api.LabelGPUNode: "true"}, InstanceTypes: gpu,
			CapacityTypes: []string{cluster.CapacitySpot, cluster.CapacityOnDemand}, ConsolidateAfter: -1, Weight: weight}
	}
	pools := []cluster.NodePool{pool("gpu-a", 5), pool("gpu-b", 1)}
	for _, np := range cluster.DefaultNodePools(types) {
		if np.Labels[api.LabelGPUNode] != "true" {
			pools = append(pools, np)
		}
	}
	return pools
}

// gangReplicaSet creates a ReplicaSet of members pods of gpus GPUs each
// that form one gang (pod group name, min-member members): a controller
// that makes a new pod for each one lost, and whose pods run until deleted
// (kwok completes a Job's pods at once).
func gangReplicaSet(t *testing.T, c *cluster.Cluster, name, queue string, members int32, gpus int) {
	t.Helper()
	tmpl := pod(name, queue).GPUs(gpus).PodGroup(name).MinMember(int(members)).Label("gang", name).Obj()
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: appsv1.ReplicaSetSpec{
			Replicas: ptr.To(members),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"gang": name}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: tmpl.Labels, Annotations: tmpl.Annotations},
				Spec:       tmpl.Spec,
			},
		},
	}
	if _, err := c.Client.AppsV1().ReplicaSets("default").Create(t.Context(), rs, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating ReplicaSet %s: %v", name, err)
	}
}

// gangPods are the gang's pods that are not terminating or ended.
func gangPods(t *testing.T, c *cluster.Cluster, gang string) []corev1.Pod {
	t.Helper()
	var out []corev1.Pod
	for _, p := range podsOf(t, c, "default", "gang="+gang) {
		if p.DeletionTimestamp == nil && p.Status.Phase != corev1.PodFailed && p.Status.Phase != corev1.PodSucceeded {
			out = append(out, p)
		}
	}
	return out
}

// capacityAndPool are the node's karpenter.sh/capacity-type and
// karpenter.sh/nodepool.
func capacityAndPool(t *testing.T, c *cluster.Cluster, node string) (capacity, pool string) {
	t.Helper()
	n, err := c.Client.CoreV1().Nodes().Get(t.Context(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("node %s: %v", node, err)
	}
	return n.Labels[cluster.LabelCapacityType], n.Labels[api.LabelNodePool]
}

// streamJob is one short job of the spot day's stream and what it waited.
type streamJob struct {
	name    string
	created time.Time
	wait    time.Duration // creation to Running; 0 while it has not run
	node    string
	after   bool // created after the interruption
}

// Issue 31, spot interruptions: a day on spot GPU nodes with a spot
// interruption in the middle of it. A training gang (a ReplicaSet of two
// 2-GPU pods, one pod group: only an 8-GPU type holds a pod), a Deployment of fractions and a
// stream of short fraction jobs run on spot nodes Karpenter bought for the
// coordinator's placeholders. At midday the cloud runs short of spot (its
// spot offerings withdrawn: the provider restarted with on-demand ones
// only), and the gang's node and a node of the fractions are interrupted as
// Karpenter's interruption controller does it (their NodeClaims deleted, so
// Karpenter drains them; the ReplicaSet makes new pods) and reclaimed two seconds
// later (the Node objects deleted: the cloud's two minutes, compressed).
// The gang is placed again whole (its two new pods bound together, never
// one alone for long) in one pool, on new capacity its placeholders ask
// for, which Karpenter now buys on-demand; the fractions of the lost node
// run again elsewhere; the stream goes on. No GPU is given twice at any
// moment (checked every second throughout), every invariant holds once the
// work has settled, and nothing is left behind: no placeholder, no
// reservation of a lost node, no pod of the old gang. Every short job's
// wait is logged.
func TestSpotInterruptionMidDay(t *testing.T) {
	t.Parallel()
	types := spotTypes(true)
	c := startCluster(t, cluster.Options{
		Karpenter:  &cluster.KarpenterOptions{InstanceTypes: types, NodePools: spotPools(types)},
		NodeAgents: &cluster.NodeAgentOptions{StopGracePeriod: 5 * time.Second},
	})
	buildBinary(t, "gpufrac-coordinator")
	dumpOnFailure(t, c)
	applyYAML(t, c, queuesYAML(map[string]string{"day": "16"}))
	startCoordinator(t, c, "c1", "--leader-elect=false", "--reservation-grace=5s")

	// No GPU given twice, every second, from the start to the end. (The
	// write-back of a pod's GPU comes a moment after it runs: that gap is
	// not checked here, but by the settled checks.)
	watchCtx, stopWatch := context.WithCancel(t.Context())
	var (
		watchWG sync.WaitGroup
		checks  int
	)
	watchWG.Add(1)
	go func() {
		defer watchWG.Done()
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-watchCtx.Done():
				return
			case <-tick.C:
			}
			vs, err := invariants.Check(watchCtx, c.Client, c.Dynamic, invariants.Options{NoWriteBack: true})
			if err != nil {
				continue // the API server is slow under load: the next tick checks again
			}
			checks++
			for _, v := range vs {
				if v.Invariant == invariants.GPU {
					t.Errorf("GPU invariant broken: %s", v)
				}
			}
		}
	}()
	t.Cleanup(func() { stopWatch(); watchWG.Wait() })

	// Morning: the gang, the fractions, the stream of short jobs.
	gangReplicaSet(t, c, "train", "day", 2, 2)
	fractionDeployment(t, c, "embed", "day", 4, 40)
	var (
		mu          sync.Mutex
		waits       []*streamJob
		interrupted bool
	)
	streamCtx, stopStream := context.WithCancel(t.Context())
	var streamWG sync.WaitGroup
	streamWG.Add(1)
	go func() {
		defer streamWG.Done()
		for i := 0; streamCtx.Err() == nil; i++ {
			w := &streamJob{name: fmt.Sprintf("job-%02d", i), created: time.Now()}
			p := pod(w.name, "day").Fraction(30).Label("stream", "yes").Obj()
			var err error
			for try := 0; try < 5 && streamCtx.Err() == nil; try++ {
				if _, err = c.Client.CoreV1().Pods("default").Create(streamCtx, p, metav1.CreateOptions{}); err == nil || apierrors.IsAlreadyExists(err) {
					err = nil
					break
				}
				time.Sleep(time.Second) // a slow or restarting API server: try again
			}
			if err != nil {
				if streamCtx.Err() == nil {
					t.Errorf("creating %s: %v", w.name, err)
				}
				return
			}
			mu.Lock()
			w.after = interrupted
			waits = append(waits, w)
			mu.Unlock()
			streamWG.Add(1)
			go func() { // runs 12 s, then ends (the script deletes it, as a job that finished)
				defer streamWG.Done()
				for streamCtx.Err() == nil {
					got, err := c.Client.CoreV1().Pods("default").Get(streamCtx, w.name, metav1.GetOptions{})
					if err == nil && got.Status.Phase == corev1.PodRunning {
						mu.Lock()
						w.wait, w.node = time.Since(w.created), got.Spec.NodeName
						mu.Unlock()
						break
					}
					time.Sleep(200 * time.Millisecond)
				}
				select {
				case <-streamCtx.Done():
				case <-time.After(12 * time.Second):
				}
				_ = c.Client.CoreV1().Pods("default").Delete(context.Background(), w.name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
			}()
			select {
			case <-streamCtx.Done():
			case <-time.After(4 * time.Second):
			}
		}
	}()
	t.Cleanup(func() { stopStream(); streamWG.Wait() })

	var gang []corev1.Pod
	waitFor(t, 3*time.Minute, "the gang's two pods running", func(context.Context) (bool, error) {
		gang = gangPods(t, c, "train")
		return len(gang) == 2 && gang[0].Status.Phase == corev1.PodRunning && gang[1].Status.Phase == corev1.PodRunning, nil
	})
	embed := waitApp(t, c, "embed", 4, 3*time.Minute)
	for _, n := range gpuNodes(t, c) {
		if capacity := n.Labels[cluster.LabelCapacityType]; capacity != cluster.CapacitySpot {
			t.Errorf("node %s (%s) bought as %q while spot was offered", n.Name, n.Labels[corev1.LabelInstanceTypeStable], capacity)
		}
	}
	// The nodes to interrupt: the gang's, and one of the fractions'.
	lost := map[string]bool{embed[0].Spec.NodeName: true}
	oldGang := map[string]bool{}
	for _, p := range gang {
		lost[p.Spec.NodeName] = true
		oldGang[p.Name] = true
	}
	oldEmbed := map[string]bool{}
	for _, p := range embed {
		if lost[p.Spec.NodeName] {
			oldEmbed[p.Name] = true
		}
	}
	t.Logf("morning: gang on %v, fractions %v on the nodes to interrupt %v; %d GPU nodes, all spot",
		[]string{gang[0].Spec.NodeName, gang[1].Spec.NodeName}, slices.Sorted(maps.Keys(oldEmbed)), slices.Sorted(maps.Keys(lost)), len(gpuNodes(t, c)))
	// Invariants once the morning has settled (the stream's ended jobs may
	// leave reservations in their grace).
	invariants.Eventually(t, c.Client, c.Dynamic, invariants.Options{AllowIdleReservations: true}, 60*time.Second)
	var reservedBefore []string
	for node := range lost {
		for _, r := range reservationsOn(t, c, node) {
			reservedBefore = append(reservedBefore, string(r.UID))
		}
	}
	if len(reservedBefore) == 0 {
		t.Fatalf("no reservation on the nodes to interrupt %v, though fractions %v run there", slices.Sorted(maps.Keys(lost)), slices.Sorted(maps.Keys(oldEmbed)))
	}

	// Midday: spot runs short, then the interruption. The NodeClaims known
	// now are the morning's (the provider restart waits for launches in
	// flight); any made later is bought without spot.
	time.Sleep(8 * time.Second) // the stream runs a while on the morning's nodes
	if err := c.SetInstanceTypes(t.Context(), spotTypes(false)); err != nil {
		t.Fatal(err)
	}
	claims, err := c.Dynamic.Resource(cluster.NodeClaimResource()).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	morning := map[string]bool{}
	for _, u := range claims.Items {
		morning[u.GetName()] = true
	}
	began := time.Now()
	mu.Lock()
	interrupted = true
	mu.Unlock()
	for node := range lost {
		claim := nodeClaimOf(t, c, node)
		if claim == "" {
			t.Fatalf("no NodeClaim for node %s", node)
		}
		if err := c.Dynamic.Resource(cluster.NodeClaimResource()).Delete(t.Context(), claim, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Logf("interrupted node %s (NodeClaim %s)", node, claim)
	}
	time.Sleep(time.Until(began.Add(2 * time.Second)))
	for node := range lost {
		if err := c.Client.CoreV1().Nodes().Delete(t.Context(), node, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	t.Logf("reclaimed %v %s after the interruption", slices.Sorted(maps.Keys(lost)), time.Since(began).Round(100*time.Millisecond))

	// The gang runs again whole: its two new pods bound together, in one
	// pool, on a node bought on-demand.
	boundAt := map[string]time.Time{}
	waitFor(t, 3*time.Minute, "the gang running again whole, off the lost nodes", func(context.Context) (bool, error) {
		gang = gangPods(t, c, "train")
		var newPods []corev1.Pod
		for _, p := range gang {
			if !oldGang[p.Name] {
				newPods = append(newPods, p)
			}
		}
		for _, p := range newPods {
			if _, seen := boundAt[p.Name]; !seen && p.Spec.NodeName != "" {
				boundAt[p.Name] = time.Now()
			}
		}
		if len(boundAt) == 1 {
			for name, at := range boundAt {
				if time.Since(at) > 10*time.Second {
					t.Errorf("gang member %s bound %s ago, its other member still not: the gang is placed in part", name, time.Since(at).Round(time.Second))
					return true, nil
				}
			}
		}
		if len(newPods) != 2 {
			return false, nil
		}
		for _, p := range newPods {
			if p.Status.Phase != corev1.PodRunning || lost[p.Spec.NodeName] {
				return false, nil
			}
		}
		gang = newPods
		return true, nil
	})
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("the gang runs again %s after the interruption, on %v", time.Since(began).Round(100*time.Millisecond), []string{gang[0].Spec.NodeName, gang[1].Spec.NodeName})
	pools := map[string]bool{}
	onNew := false
	for _, p := range gang {
		capacity, pool := capacityAndPool(t, c, p.Spec.NodeName)
		pools[pool] = true
		if claim := nodeClaimOf(t, c, p.Spec.NodeName); !morning[claim] {
			onNew = true
			if capacity != cluster.CapacityOnDemand {
				t.Errorf("gang pod %s on new node %s bought as %q with spot withdrawn", p.Name, p.Spec.NodeName, capacity)
			}
		}
	}
	if len(pools) != 1 {
		t.Errorf("the gang runs across pools %v", pools)
	}
	if !onNew {
		t.Fatalf("the gang runs again on the morning's nodes %v: no new capacity was bought for it, so the test shows nothing of the fallback", []string{gang[0].Spec.NodeName, gang[1].Spec.NodeName})
	}
	waitFor(t, 3*time.Minute, "four fractions running again, none on a lost node", func(context.Context) (bool, error) {
		pods := appPods(t, c, "embed")
		if len(pods) != 4 {
			return false, nil
		}
		for _, p := range pods {
			if oldEmbed[p.Name] || lost[p.Spec.NodeName] || p.Annotations[api.AnnotationAllocatedGPU] == "" {
				return false, nil
			}
		}
		return true, nil
	})
	t.Logf("the fractions %v of the lost nodes run again %s after the interruption", slices.Sorted(maps.Keys(oldEmbed)), time.Since(began).Round(100*time.Millisecond))

	// Afternoon: the stream runs a while longer, then stops; everything settles.
	time.Sleep(12 * time.Second)
	stopStream()
	stopped := time.Now()
	streamWG.Wait()
	waitFor(t, 60*time.Second, "the lost nodes' reservations to go", func(context.Context) (bool, error) {
		for _, r := range reservationsOn(t, c, "") {
			if slices.Contains(reservedBefore, string(r.UID)) {
				return false, nil
			}
		}
		return true, nil
	})
	settled(t, c, "after the interruption")
	waitFor(t, 60*time.Second, "no placeholder left", func(context.Context) (bool, error) {
		return len(systemPods(t, c, api.RolePlaceholder)) == 0, nil
	})
	waitFor(t, 2*time.Minute, "the old gang's pods gone", func(context.Context) (bool, error) {
		for _, p := range podsOf(t, c, "default", "gang=train") {
			if oldGang[p.Name] && p.Status.Phase != corev1.PodFailed {
				return false, nil
			}
		}
		return true, nil
	})
	claims, err = c.Dynamic.Resource(cluster.NodeClaimResource()).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range claims.Items {
		if morning[u.GetName()] || !launched(u) {
			continue
		}
		if ct := u.GetLabels()[cluster.LabelCapacityType]; ct != cluster.CapacityOnDemand {
			t.Errorf("NodeClaim %s made after spot was withdrawn is %q", u.GetName(), ct)
		}
	}
	stopWatch()
	watchWG.Wait()

	// The day's jobs and their waits.
	mu.Lock()
	defer mu.Unlock()
	sort.Slice(waits, func(i, j int) bool { return waits[i].created.Before(waits[j].created) })
	var b strings.Builder
	var longest time.Duration
	for _, w := range waits {
		when := "before"
		if w.after {
			when = "after"
		}
		if w.wait == 0 {
			fmt.Fprintf(&b, "\n  %s (created %s the interruption, at %s): had not run when the stream stopped", w.name, when, w.created.Format("15:04:05.0"))
			if d := stopped.Sub(w.created); d > 90*time.Second {
				t.Errorf("%s waited %s and never ran", w.name, d.Round(time.Second))
			}
			continue
		}
		longest = max(longest, w.wait)
		fmt.Fprintf(&b, "\n  %s (created %s the interruption, at %s): waited %s, ran on %s", w.name, when, w.created.Format("15:04:05.0"), w.wait.Round(10*time.Millisecond), w.node)
	}
	t.Logf("the day's short jobs: %d, longest wait %s; no GPU given twice in %d checks, one a second:%s", len(waits), longest.Round(10*time.Millisecond), checks, b.String())
	if checks < 10 {
		t.Errorf("the GPU invariant was checked only %d times", checks)
	}
}

// launched tells whether Karpenter launched the NodeClaim (its Launched
// condition is True: its capacity type is known).
func launched(u unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Launched" && m["status"] == "True" {
			return true
		}
	}
	return false
}

// nodeClaimOf is the name of the NodeClaim of node ("" when none).
func nodeClaimOf(t *testing.T, c *cluster.Cluster, node string) string {
	t.Helper()
	claims, err := c.Dynamic.Resource(cluster.NodeClaimResource()).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range claims.Items {
		if n, _, _ := unstructured.NestedString(u.Object, "status", "nodeName"); n == node {
			return u.GetName()
		}
	}
	return ""
}
