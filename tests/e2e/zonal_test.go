package e2e

// Issue 28, where Karpenter buys: a placeholder carries where a new node
// must be for its pod, so that what Karpenter buys can take the pod. The
// node affinity of the PVs a pod's claims are bound to (a zonal disk's
// zone: kubecheck.Checker.VolumeTopology) and the zones its hard zone
// spread allows (kubecheck.Checker.DomainTopology) are ANDed into the
// placeholder's required node affinity. These tests run on Karpenter's kwok
// provider with GPU types offered in two zones, and free GPUs in zone a
// only, on a node Karpenter bought there for another pod.

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/placeholder"
	"github.com/gpufrac/gpufrac/tests/cluster"
)

const (
	zoneA = "test-zone-a"
	zoneB = "test-zone-b"
	// zonalClass is the StorageClass of the zonal disks: a CSI driver that
	// nothing serves (kwok runs the pods without mounting anything); its
	// volumes are pre-bound here, so no provisioner is asked.
	zonalClass  = "zonal"
	zonalDriver = "zonal.csi.e2e.gpufrac.io"
)

// zonalCluster starts the test bed with Karpenter's kwok provider selling
// the default GPU types (1 and 8 mock H100s) in zones a and b. Its NodePools
// never consolidate: the node bought in zone a for base pods keeps its free
// GPUs (consolidation would replace an 8-GPU node running one 1-GPU pod
// with a 1-GPU node).
func zonalCluster(t *testing.T) *cluster.Cluster {
	t.Helper()
	types := cluster.DefaultInstanceTypes()
	for i := range types {
		if types[i].GPUProduct != "" {
			types[i].Zones = []string{zoneA, zoneB}
		}
	}
	pools := cluster.DefaultNodePools(types)
	for i := range pools {
		pools[i].ConsolidateAfter = -1
	}
	c := startCluster(t, cluster.Options{
		Karpenter:  &cluster.KarpenterOptions{InstanceTypes: types, NodePools: pools},
		NodeAgents: &cluster.NodeAgentOptions{StopGracePeriod: 5 * time.Second},
	})
	buildBinary(t, "gpufrac-coordinator")
	return c
}

// baseNodes has Karpenter buy one GPU node per zone given, each for a
// 1-GPU base pod of queue pinned there (its zone and instance type), and
// returns the nodes by zone once the pods run. A gpu-8x-h100 is left with 7
// free GPUs, a gpu-1x-h100 with none.
func baseNodes(t *testing.T, c *cluster.Cluster, queue string, typeByZone map[string]string) map[string]string {
	t.Helper()
	var names []string
	for _, zone := range sortedKeys(typeByZone) {
		n := "base-" + strings.TrimPrefix(zone, "test-")
		names = append(names, n)
		create(t, c, pod(n, queue).GPUs(1).Preemptible(false).
			NodeSelector(corev1.LabelTopologyZone, zone).NodeSelector(corev1.LabelInstanceTypeStable, typeByZone[zone]).Obj())
	}
	pods := running(t, c, 3*time.Minute, names...)
	out := map[string]string{}
	for _, p := range pods {
		z := nodeZone(t, c, p.Spec.NodeName)
		if _, ok := typeByZone[z]; !ok || out[z] != "" {
			t.Fatalf("base pod %s runs on %s in zone %q", p.Name, p.Spec.NodeName, z)
		}
		out[z] = p.Spec.NodeName
	}
	waitFor(t, 30*time.Second, "no placeholder left for the base pods", func(ctx context.Context) (bool, error) {
		return len(systemPods(t, c, api.RolePlaceholder)) == 0, nil
	})
	return out
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// nodeZone is the node's topology.kubernetes.io/zone.
func nodeZone(t testing.TB, c *cluster.Cluster, node string) string {
	t.Helper()
	n, err := c.Client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("node %s: %v", node, err)
	}
	return n.Labels[corev1.LabelTopologyZone]
}

// freeGPUs is the node's allocatable nvidia.com/gpu less what its
// running and pending pods bound there request.
func freeGPUs(t testing.TB, c *cluster.Cluster, node string) int64 {
	t.Helper()
	n, err := c.Client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("node %s: %v", node, err)
	}
	q := n.Status.Allocatable[api.ResourceGPU]
	free := q.Value()
	l, err := c.Client.CoreV1().Pods("").List(context.Background(), metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range l.Items {
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		for _, ctr := range p.Spec.Containers {
			r := ctr.Resources.Requests[api.ResourceGPU]
			free -= r.Value()
		}
	}
	return free
}

// nodeClaim is what the tests read of a Karpenter NodeClaim.
type nodeClaim struct {
	name, zone, instanceType, node string
}

func (nc nodeClaim) String() string {
	return fmt.Sprintf("%s (%s in %s, node %q)", nc.name, nc.instanceType, nc.zone, nc.node)
}

// listNodeClaims lists the NodeClaims by name.
func listNodeClaims(t testing.TB, c *cluster.Cluster) map[string]nodeClaim {
	t.Helper()
	l, err := c.Dynamic.Resource(cluster.NodeClaimResource()).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]nodeClaim{}
	for _, u := range l.Items {
		node, _, _ := unstructured.NestedString(u.Object, "status", "nodeName")
		out[u.GetName()] = nodeClaim{name: u.GetName(), zone: u.GetLabels()[corev1.LabelTopologyZone],
			instanceType: u.GetLabels()[corev1.LabelInstanceTypeStable], node: node}
	}
	return out
}

// newNodeClaims lists the NodeClaims not in before.
func newNodeClaims(t testing.TB, c *cluster.Cluster, before map[string]nodeClaim) []nodeClaim {
	t.Helper()
	var out []nodeClaim
	for name, nc := range listNodeClaims(t, c) {
		if _, ok := before[name]; !ok {
			out = append(out, nc)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// placeholderWatch records every placeholder pod seen, polling every 100 ms
// (placeholders live from their creation until their work is placed on the
// node Karpenter bought: seconds at least).
type placeholderWatch struct {
	mu   sync.Mutex
	seen map[string]corev1.Pod
	stop chan struct{}
	done chan struct{}
}

func watchPlaceholders(t *testing.T, c *cluster.Cluster) *placeholderWatch {
	w := &placeholderWatch{seen: map[string]corev1.Pod{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			l, err := c.Client.CoreV1().Pods(api.ReservationNamespace).List(context.Background(),
				metav1.ListOptions{LabelSelector: api.LabelRole + "=" + api.RolePlaceholder})
			if err == nil {
				w.mu.Lock()
				for _, p := range l.Items {
					if _, ok := w.seen[p.Name]; !ok {
						w.seen[p.Name] = p
					}
				}
				w.mu.Unlock()
			}
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(w.end)
	return w
}

// end stops the watch (idempotent).
func (w *placeholderWatch) end() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// placeholders are the placeholders seen so far for workloads whose key
// starts with prefix ("default/zonal").
func (w *placeholderWatch) placeholders(prefix string) []corev1.Pod {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []corev1.Pod
	for _, p := range w.seen {
		for _, wl := range strings.Split(p.Annotations[placeholder.AnnotationWorkloads], ",") {
			if strings.HasPrefix(wl, prefix) {
				out = append(out, p)
				break
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// requiredAffinity is a pod's required node affinity (nil when none).
func requiredAffinity(p *corev1.Pod) *corev1.NodeSelector {
	if p.Spec.Affinity == nil || p.Spec.Affinity.NodeAffinity == nil {
		return nil
	}
	return p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
}

// admits tells whether a pod's node selector and required node affinity
// admit the node, as Karpenter and kube-scheduler read them.
func admits(t testing.TB, c *cluster.Cluster, p *corev1.Pod, node string) bool {
	t.Helper()
	n, err := c.Client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("node %s: %v", node, err)
	}
	ok, err := nodeaffinity.GetRequiredNodeAffinity(p).Match(n)
	if err != nil {
		t.Fatalf("matching %s's affinity against %s: %v", p.Name, node, err)
	}
	return ok
}

// zoneTerms says what each term of a required node affinity requires of
// the zone label ("In [b]", "NotIn [a]"; "" for a term that says nothing
// of it).
func zoneTerms(ns *corev1.NodeSelector) []string {
	if ns == nil {
		return []string{""}
	}
	var out []string
	for _, term := range ns.NodeSelectorTerms {
		var says []string
		for _, e := range term.MatchExpressions {
			if e.Key == corev1.LabelTopologyZone {
				says = append(says, fmt.Sprintf("%s %v", e.Operator, e.Values))
			}
		}
		out = append(out, strings.Join(says, " && "))
	}
	return out
}

// createZonalDisk creates a zonal disk as a cloud's CSI driver has it: a PV
// of class zonal whose node affinity requires zone, pre-bound to claim
// (spec.claimRef), and the claim naming it (spec.volumeName); the PV
// controller completes the binding. It waits until the claim is Bound.
func createZonalDisk(t *testing.T, c *cluster.Cluster, claim, zone string) {
	t.Helper()
	ctx := t.Context()
	sc := &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: zonalClass},
		Provisioner:       zonalDriver,
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer),
		ReclaimPolicy:     ptr.To(corev1.PersistentVolumeReclaimRetain),
	}
	if _, err := c.Client.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pvName := "disk-" + claim
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pvName},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("100Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              zonalClass,
			VolumeMode:                    ptr.To(corev1.PersistentVolumeFilesystem),
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				CSI: &corev1.CSIPersistentVolumeSource{Driver: zonalDriver, VolumeHandle: "vol-" + claim, FSType: "ext4"},
			},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
					Key: corev1.LabelTopologyZone, Operator: corev1.NodeSelectorOpIn, Values: []string{zone},
				}}}},
			}},
			ClaimRef: &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: "default", Name: claim},
		},
	}
	if _, err := c.Client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: claim, Namespace: "default"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: ptr.To(zonalClass),
			VolumeName:       pvName,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("100Gi")}},
		},
	}
	if _, err := c.Client.CoreV1().PersistentVolumeClaims("default").Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "claim "+claim+" Bound to "+pvName, func(ctx context.Context) (bool, error) {
		got, err := c.Client.CoreV1().PersistentVolumeClaims("default").Get(ctx, claim, metav1.GetOptions{})
		return err == nil && got.Status.Phase == corev1.ClaimBound && got.Spec.VolumeName == pvName, nil
	})
}

// withClaim mounts claim in the pod.
func withClaim(p *corev1.Pod, claim string) *corev1.Pod {
	p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "data", VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim},
	}})
	p.Spec.Containers[0].VolumeMounts = append(p.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "data", MountPath: "/data"})
	p.Spec.TerminationGracePeriodSeconds = ptr.To[int64](0)
	return p
}

// runsOutside waits until pod name runs, failing as soon as it is bound to
// a node in zone, and returns it with the PodScheduled=False reasons and
// messages it had meanwhile. tick, when set, runs at every poll.
func runsOutside(t *testing.T, c *cluster.Cluster, name, zone string, limit time.Duration, tick func(ctx context.Context) error) (*corev1.Pod, []string) {
	t.Helper()
	var said []string
	var p *corev1.Pod
	waitFor(t, limit, name+" Running outside "+zone, func(ctx context.Context) (bool, error) {
		if tick != nil {
			if err := tick(ctx); err != nil {
				return false, err
			}
		}
		q, err := c.Client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		if q.Spec.NodeName != "" && nodeZone(t, c, q.Spec.NodeName) == zone {
			return false, fmt.Errorf("%s bound to %s in %s", name, q.Spec.NodeName, zone)
		}
		if m := scheduledReason(q) + ": " + scheduledMessage(q); scheduledReason(q) != "" && !slices.Contains(said, m) {
			said = append(said, m)
		}
		p = q
		return q.Status.Phase == corev1.PodRunning, nil
	})
	return p, said
}

// checkZonalPlaceholders checks that each placeholder asks zone (In [zone]
// in every term of its required affinity) and admits neither node not.
func checkZonalPlaceholders(t *testing.T, c *cluster.Cluster, phs []corev1.Pod, zone, not string) {
	t.Helper()
	if len(phs) == 0 {
		t.Fatalf("no placeholder seen")
	}
	for _, ph := range phs {
		ra := requiredAffinity(&ph)
		t.Logf("placeholder %s: node selector %v, zone by term %q, required affinity %v", ph.Name, ph.Spec.NodeSelector, zoneTerms(ra), ra)
		for _, zt := range zoneTerms(ra) {
			if zt != fmt.Sprintf("In [%s]", zone) {
				t.Errorf("placeholder %s: a term of its required affinity asks the zone %q; want In [%s] in every term", ph.Name, zt, zone)
			}
		}
		if admits(t, c, &ph, not) {
			t.Errorf("placeholder %s admits %s, outside %s: Karpenter may take its free GPUs for it", ph.Name, not, zone)
		}
	}
}

// checkBoughtFor checks that Karpenter bought one NodeClaim since before,
// in zone, that p runs on its node, and that the placeholders admit it.
func checkBoughtFor(t *testing.T, c *cluster.Cluster, before map[string]nodeClaim, p *corev1.Pod, zone string, phs []corev1.Pod, took time.Duration) {
	t.Helper()
	bought := newNodeClaims(t, c, before)
	t.Logf("%s Running on %s after %s; NodeClaims bought for it: %v", p.Name, p.Spec.NodeName, took.Round(time.Millisecond), bought)
	if len(bought) != 1 || bought[0].zone != zone {
		t.Errorf("NodeClaims bought for %s: %v; want one in %s", p.Name, bought, zone)
	}
	if z := nodeZone(t, c, p.Spec.NodeName); z != zone {
		t.Errorf("%s runs on %s in %q; want %s", p.Name, p.Spec.NodeName, z, zone)
	}
	if len(bought) == 1 && bought[0].node != p.Spec.NodeName {
		t.Errorf("%s runs on %s, not on the node Karpenter bought for it (%s)", p.Name, p.Spec.NodeName, bought[0])
	}
	for _, ph := range phs {
		if !admits(t, c, &ph, p.Spec.NodeName) {
			t.Errorf("placeholder %s does not admit %s, the node bought for it", ph.Name, p.Spec.NodeName)
		}
	}
}

// TestZonalVolumeBuysANodeInItsZone: a 1-GPU pod whose claim is bound to a
// disk in zone b, while the only GPU node is in zone a, with 7 free GPUs
// (an 8-GPU node Karpenter bought for a base pod pinned there).
//
// Without kube-scheduler's checks (--kube-checks=false, first) the
// coordinator places the pod by its GPUs alone: it runs (kwok says so) on
// the zone-a node, where a real kubelet could never attach its disk.
//
// With them, VolumeBinding rejects the zone-a node ("didn't match
// PersistentVolume's node affinity") however many GPUs it has free, and the
// placeholder asks for the disk's zone: its required node affinity has the
// PV's zone b ANDed in every term, so it admits no zone-a node. Without
// that, Karpenter would be free to take the zone-a node's GPUs for the
// placeholder or to buy in either zone (their prices are equal), and a node
// in zone a would never take the pod. Karpenter buys exactly one node, in
// zone b, and the pod runs on it.
//
// Last, a claim not bound yet, of a class whose disks are made in zone b
// only (allowedTopologies, WaitForFirstConsumer): the placeholder asks the
// class's zone, Karpenter buys there, and the disk is provisioned for the
// node the pod runs on.
func TestZonalVolumeBuysANodeInItsZone(t *testing.T) {
	t.Parallel()
	c := zonalCluster(t)
	applyYAML(t, c, queuesYAML(map[string]string{"team-a": "16"}))
	createZonalDisk(t, c, "data-zonal", zoneB)

	blind := startCoordinator(t, c, "blind", "--leader-elect=false", "--kube-checks=false")
	began := time.Now()
	nodeA := baseNodes(t, c, "team-a", map[string]string{zoneA: "gpu-8x-h100"})[zoneA]
	t.Logf("base node %s in %s with %d free GPUs after %s", nodeA, zoneA, freeGPUs(t, c, nodeA), time.Since(began).Round(time.Millisecond))
	if f := freeGPUs(t, c, nodeA); f != 7 {
		t.Fatalf("base node %s has %d free GPUs, want 7", nodeA, f)
	}

	t.Run("without kube checks the pod runs where its disk is not", func(t *testing.T) {
		claimsBefore := listNodeClaims(t, c)
		create(t, c, withClaim(pod("zonal-blind", "team-a").GPUs(1).Obj(), "data-zonal"))
		p := running(t, c, 60*time.Second, "zonal-blind")["zonal-blind"]
		z := nodeZone(t, c, p.Spec.NodeName)
		t.Logf("checks off: the pod of the zone-b disk runs on %s in %s", p.Spec.NodeName, z)
		if p.Spec.NodeName != nodeA || z != zoneA {
			t.Errorf("checks off: the pod runs on %s in %q; want the free GPUs of %s in %s (placement sees GPUs only)", p.Spec.NodeName, z, nodeA, zoneA)
		}
		if nc := newNodeClaims(t, c, claimsBefore); len(nc) != 0 {
			t.Errorf("checks off: NodeClaims %v created though the pod found room", nc)
		}
		if err := c.Client.CoreV1().Pods("default").Delete(t.Context(), "zonal-blind", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, "zonal-blind gone", func(ctx context.Context) (bool, error) {
			_, err := c.Client.CoreV1().Pods("default").Get(ctx, "zonal-blind", metav1.GetOptions{})
			return err != nil, nil
		})
	})
	blind.stop(syscall.SIGTERM)
	co := startCoordinator(t, c, "c1", "--leader-elect=false")

	t.Run("with kube checks Karpenter buys in the disk's zone", func(t *testing.T) {
		claimsBefore := listNodeClaims(t, c)
		watch := watchPlaceholders(t, c)
		began := time.Now()
		create(t, c, withClaim(pod("zonal", "team-a").GPUs(1).Obj(), "data-zonal"))
		p, said := runsOutside(t, c, "zonal", zoneA, 3*time.Minute, nil)
		took := time.Since(began)
		watch.end()
		for _, m := range said {
			t.Logf("zonal pending: %s", m)
		}
		if !slices.ContainsFunc(said, func(m string) bool { return strings.Contains(m, "didn't match PersistentVolume's node affinity") }) {
			t.Errorf("zonal never said its disk's zone ruled out nodes (VolumeBinding: didn't match PersistentVolume's node affinity); it said %q", said)
		}
		phs := watch.placeholders("default/zonal")
		checkZonalPlaceholders(t, c, phs, zoneB, nodeA)
		checkBoughtFor(t, c, claimsBefore, p, zoneB, phs, took)
		if f := freeGPUs(t, c, nodeA); f != 7 {
			t.Errorf("base node %s has %d free GPUs, want still 7", nodeA, f)
		}
		waitFor(t, 30*time.Second, "no placeholder left", func(ctx context.Context) (bool, error) {
			return len(systemPods(t, c, api.RolePlaceholder)) == 0, nil
		})
	})

	// A claim not bound yet, of a class whose disks are made in zone b only
	// (allowedTopologies): its class's topology is what the placeholder
	// asks. The test plays the CSI provisioner: once the coordinator's
	// VolumeBinding names the node (annotation selected-node), it makes the
	// disk in that node's zone, pre-bound to the claim; the PV controller
	// binds them and the coordinator's PreBind, which waits for that, lets
	// the pod bind.
	t.Run("with kube checks an unbound claim of a class offered in zone b buys there", func(t *testing.T) {
		const class, claim = "zonal-b", "scratch"
		sc := &storagev1.StorageClass{
			ObjectMeta:        metav1.ObjectMeta{Name: class},
			Provisioner:       zonalDriver,
			VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer),
			ReclaimPolicy:     ptr.To(corev1.PersistentVolumeReclaimDelete),
			AllowedTopologies: []corev1.TopologySelectorTerm{{MatchLabelExpressions: []corev1.TopologySelectorLabelRequirement{
				{Key: corev1.LabelTopologyZone, Values: []string{zoneB}},
			}}},
		}
		if _, err := c.Client.StorageV1().StorageClasses().Create(t.Context(), sc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pvc := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: claim, Namespace: "default"},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName: ptr.To(class),
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("50Gi")}},
			},
		}
		if _, err := c.Client.CoreV1().PersistentVolumeClaims("default").Create(t.Context(), pvc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		claimsBefore := listNodeClaims(t, c)
		watch := watchPlaceholders(t, c)
		began := time.Now()
		create(t, c, withClaim(pod("provisioned", "team-a").GPUs(1).Obj(), claim))
		provisionedIn := ""
		provision := func(ctx context.Context) error {
			if provisionedIn != "" {
				return nil
			}
			got, err := c.Client.CoreV1().PersistentVolumeClaims("default").Get(ctx, claim, metav1.GetOptions{})
			if err != nil || got.Annotations[annSelectedNode] == "" {
				return nil
			}
			node := got.Annotations[annSelectedNode]
			zone := nodeZone(t, c, node)
			if zone != zoneB {
				return fmt.Errorf("claim %s asked to be provisioned for %s in %q; its class offers %s only", claim, node, zone, zoneB)
			}
			pv := &corev1.PersistentVolume{
				ObjectMeta: metav1.ObjectMeta{Name: "pvc-" + string(got.UID), Annotations: map[string]string{"pv.kubernetes.io/provisioned-by": zonalDriver}},
				Spec: corev1.PersistentVolumeSpec{
					Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("50Gi")},
					AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
					StorageClassName:              class,
					VolumeMode:                    ptr.To(corev1.PersistentVolumeFilesystem),
					PersistentVolumeSource: corev1.PersistentVolumeSource{
						CSI: &corev1.CSIPersistentVolumeSource{Driver: zonalDriver, VolumeHandle: "vol-" + string(got.UID), FSType: "ext4"},
					},
					NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{
						NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
							Key: corev1.LabelTopologyZone, Operator: corev1.NodeSelectorOpIn, Values: []string{zone},
						}}}},
					}},
					ClaimRef: &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: "default", Name: claim, UID: got.UID},
				},
			}
			if _, err := c.Client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("provisioning %s: %w", pv.Name, err)
			}
			provisionedIn = node
			t.Logf("provisioned %s in %s for %s after %s", pv.Name, zone, node, time.Since(began).Round(time.Millisecond))
			return nil
		}
		p, said := runsOutside(t, c, "provisioned", zoneA, 3*time.Minute, provision)
		took := time.Since(began)
		watch.end()
		for _, m := range said {
			t.Logf("provisioned pending: %s", m)
		}
		if len(said) == 0 {
			t.Errorf("provisioned never said why it waited")
		}
		phs := watch.placeholders("default/provisioned")
		checkZonalPlaceholders(t, c, phs, zoneB, nodeA)
		checkBoughtFor(t, c, claimsBefore, p, zoneB, phs, took)
		if provisionedIn != p.Spec.NodeName {
			t.Errorf("the disk was provisioned for %q; the pod runs on %s", provisionedIn, p.Spec.NodeName)
		}
		got, err := c.Client.CoreV1().PersistentVolumeClaims("default").Get(t.Context(), claim, metav1.GetOptions{})
		if err != nil || got.Status.Phase != corev1.ClaimBound {
			t.Errorf("claim %s not Bound once its pod runs: %v %+v", claim, err, got.Status)
		}
		if f := freeGPUs(t, c, nodeA); f != 7 {
			t.Errorf("base node %s has %d free GPUs, want still 7", nodeA, f)
		}
		waitFor(t, 30*time.Second, "no placeholder left", func(ctx context.Context) (bool, error) {
			return len(systemPods(t, c, api.RolePlaceholder)) == 0, nil
		})
		volumesBoundWithoutRetries(t, co, 1)
		checkInvariants(t, c)
	})
}

// spreadGPUDeployment creates a Deployment of 1-GPU pods, labelled app=name,
// spread over zones (maxSkew 1, DoNotSchedule).
func spreadGPUDeployment(t *testing.T, c *cluster.Cluster, name, queue string, replicas int32) {
	t.Helper()
	tmpl := pod(name, queue).GPUs(1).Label("app", name).Obj()
	own := &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}}
	tmpl.Spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{
		MaxSkew: 1, TopologyKey: corev1.LabelTopologyZone, WhenUnsatisfiable: corev1.DoNotSchedule, LabelSelector: own,
	}}
	tmpl.Spec.TerminationGracePeriodSeconds = ptr.To[int64](0)
	tmpl.Spec.SchedulerName = api.SchedulerName
	createDeployment(t, c, name, replicas, own, tmpl)
}

// TestSpreadPlaceholdersAskTheZoneTheSpreadNeeds: a Deployment of three
// 1-GPU pods spread over zones (maxSkew 1, DoNotSchedule). Zone a has an
// 8-GPU node with 7 free GPUs, zone b a 1-GPU node, full (each bought by
// Karpenter for a base pod pinned there): zone b is a domain of the spread
// with no room. (A zone no node is in is no domain to kube-scheduler's
// spread: with no node in zone b, all three would run in zone a, rightly.)
// One replica runs in zone a; a second there would make the skew 2, so the
// others wait, and their placeholders must not admit zone a (NotIn [a],
// what the spread allows a new node): else Karpenter could take them for
// the free GPUs of zone a, or buy there, and the replicas would wait
// forever. Karpenter buys in zone b only, one node at most per waiting
// replica, and the three run with a skew of at most 1.
func TestSpreadPlaceholdersAskTheZoneTheSpreadNeeds(t *testing.T) {
	t.Parallel()
	c := zonalCluster(t)
	applyYAML(t, c, queuesYAML(map[string]string{"team-a": "16"}))
	startCoordinator(t, c, "c1", "--leader-elect=false")
	began := time.Now()
	base := baseNodes(t, c, "team-a", map[string]string{zoneA: "gpu-8x-h100", zoneB: "gpu-1x-h100"})
	nodeA, nodeB := base[zoneA], base[zoneB]
	t.Logf("base nodes after %s: %s in %s (%d free GPUs), %s in %s (%d free)", time.Since(began).Round(time.Millisecond),
		nodeA, zoneA, freeGPUs(t, c, nodeA), nodeB, zoneB, freeGPUs(t, c, nodeB))
	if freeGPUs(t, c, nodeA) != 7 || freeGPUs(t, c, nodeB) != 0 {
		t.Fatalf("base nodes: %s has %d free GPUs (want 7), %s has %d (want 0)", nodeA, freeGPUs(t, c, nodeA), nodeB, freeGPUs(t, c, nodeB))
	}

	claimsBefore := listNodeClaims(t, c)
	watch := watchPlaceholders(t, c)
	began = time.Now()
	const replicas = 3
	spreadGPUDeployment(t, c, "spread", "team-a", replicas)

	// Until all run, zone a runs at most one more replica than zone b (the
	// skew counts bound pods), but for a moment: the coordinator may place a
	// replica on zone b's new node while that node settles (its pod bound
	// --new-node-settle, 100 ms, after the node became usable) and count it,
	// as kube-scheduler counts a pod it assumed while its binding is under
	// way, and bind another in zone a in the same cycle. A skew of 2 among
	// bound pods that lasts is a spread broken.
	const skewGrace = 5 * time.Second
	var pods []corev1.Pod
	var said []string
	var skewSince time.Time
	var skews []string
	waitFor(t, 4*time.Minute, fmt.Sprintf("%d replicas of spread Running", replicas), func(ctx context.Context) (bool, error) {
		perZone := map[string]int{}
		all := podsOf(t, c, "default", "app=spread")
		for _, p := range all {
			if p.Spec.NodeName != "" {
				perZone[nodeZone(t, c, p.Spec.NodeName)]++
			} else if m := scheduledReason(&p) + ": " + scheduledMessage(&p); scheduledReason(&p) != "" && !slices.Contains(said, m) {
				said = append(said, m)
			}
		}
		switch skewed := perZone[zoneA]-perZone[zoneB] > 1; {
		case skewed && skewSince.IsZero():
			skewSince = time.Now()
			skews = append(skews, fmt.Sprintf("%v", perZone))
		case skewed && time.Since(skewSince) > skewGrace:
			return false, fmt.Errorf("replicas bound per zone %v for %s: skew over 1", perZone, time.Since(skewSince).Round(time.Millisecond))
		case !skewed && !skewSince.IsZero():
			skews[len(skews)-1] += fmt.Sprintf(" for %s", time.Since(skewSince).Round(time.Millisecond))
			skewSince = time.Time{}
		}
		pods = appPods(t, c, "spread")
		return len(pods) == replicas && len(all) == replicas, nil
	})
	if len(skews) > 0 {
		t.Logf("bound replicas per zone skewed by 2 for a moment (a replica bound in zone a while its zone-b peer waited for its node to settle): %v", skews)
	}
	took := time.Since(began)
	watch.end()
	for _, m := range said {
		t.Logf("spread pending: %s", m)
	}

	perZone := map[string]int{}
	for _, p := range pods {
		perZone[nodeZone(t, c, p.Spec.NodeName)]++
	}
	bought := newNodeClaims(t, c, claimsBefore)
	t.Logf("%d replicas Running after %s, per zone %v, per node %v; NodeClaims bought for them: %v",
		replicas, took.Round(time.Millisecond), perZone, podsPerNode(pods), bought)
	if d := perZone[zoneA] - perZone[zoneB]; d > 1 || d < -1 || perZone[zoneA]+perZone[zoneB] != replicas {
		t.Errorf("replicas per zone %v; want %d over %s and %s with a skew of at most 1", perZone, replicas, zoneA, zoneB)
	}
	// One placeholder per waiting replica, each asking zone b: at most one
	// node per replica zone a did not take. Once one runs in zone b the
	// spread lets the next into zone a's free GPUs, so a node may be left
	// idle (the placeholders' domains are counted once per cycle, not
	// replica after replica, as Karpenter's own simulation of the spread
	// would); Karpenter consolidates it (not here: the pools never do).
	if len(bought) == 0 || len(bought) > replicas-1 {
		t.Errorf("Karpenter bought %d nodes for the %d replicas zone a could not take", len(bought), replicas-1)
	}
	used := podsPerNode(pods)
	idle := 0
	for _, nc := range bought {
		if nc.zone != zoneB {
			t.Errorf("NodeClaim %s bought in %q; the spread allowed only %s", nc, nc.zone, zoneB)
		}
		if used[nc.node] == 0 {
			idle++
		}
	}
	t.Logf("%d of the %d nodes bought run no replica", idle, len(bought))

	phs := watch.placeholders("default/spread")
	if len(phs) == 0 {
		t.Fatalf("no placeholder seen for the replicas of spread")
	}
	for _, ph := range phs {
		ra := requiredAffinity(&ph)
		t.Logf("placeholder %s (for %s): zone by term %q, required affinity %v", ph.Name, ph.Annotations[placeholder.AnnotationWorkloads], zoneTerms(ra), ra)
		if admits(t, c, &ph, nodeA) {
			t.Errorf("placeholder %s admits %s in %s, where the spread forbids another replica", ph.Name, nodeA, zoneA)
		}
		for _, zt := range zoneTerms(ra) {
			if zt != fmt.Sprintf("NotIn [%s]", zoneA) {
				t.Errorf("placeholder %s: a term of its required affinity asks the zone %q; want NotIn [%s] in every term", ph.Name, zt, zoneA)
			}
		}
	}
	waitFor(t, 30*time.Second, "no placeholder left", func(ctx context.Context) (bool, error) {
		return len(systemPods(t, c, api.RolePlaceholder)) == 0, nil
	})
	checkInvariants(t, c)
}
