package e2e

// Issue 28: what kube-scheduler checks, the coordinator checks too. These
// tests run kube-scheduler's own checks through the real coordinator on the
// test bed: local volumes bound where the pods go (WaitForFirstConsumer,
// the PV controller of the cluster's kube-controller-manager finishing the
// bindings), topology spread and pod anti-affinity, and a gang's volumes
// bound only once the whole gang is placed.

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/tests/cluster"
)

// localClass is the StorageClass of the tests' local volumes: no
// provisioner, bound when the first pod using a claim is scheduled.
const localClass = "local"

// annSelectedNode is the annotation kube-scheduler's VolumeBinding writes on
// a claim it asks a provisioner to provision on a node.
const annSelectedNode = "volume.kubernetes.io/selected-node"

// createLocalClass creates the StorageClass local (WaitForFirstConsumer,
// kubernetes.io/no-provisioner), as the docs of local volumes advise.
func createLocalClass(t *testing.T, c *cluster.Cluster) {
	t.Helper()
	sc := &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: localClass},
		Provisioner:       "kubernetes.io/no-provisioner",
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer),
		ReclaimPolicy:     ptr.To(corev1.PersistentVolumeReclaimRetain),
	}
	if _, err := c.Client.StorageV1().StorageClasses().Create(t.Context(), sc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// createLocalPV creates a local PV of class local on one node (required
// node affinity on kubernetes.io/hostname, as local PVs must have).
func createLocalPV(t *testing.T, c *cluster.Cluster, name, node, size string) {
	t.Helper()
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"e2e-local": "yes"}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              localClass,
			VolumeMode:                    ptr.To(corev1.PersistentVolumeFilesystem),
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				Local: &corev1.LocalVolumeSource{Path: "/mnt/disks/" + name},
			},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
					Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{node},
				}}}},
			}},
		},
	}
	if _, err := c.Client.CoreV1().PersistentVolumes().Create(t.Context(), pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// pvNode is the hostname a local PV's node affinity requires.
func pvNode(pv *corev1.PersistentVolume) string {
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return ""
	}
	for _, term := range pv.Spec.NodeAffinity.Required.NodeSelectorTerms {
		for _, e := range term.MatchExpressions {
			if e.Key == corev1.LabelHostname && len(e.Values) == 1 {
				return e.Values[0]
			}
		}
	}
	return ""
}

// localPVs lists the tests' local PVs by name.
func localPVs(t testing.TB, c *cluster.Cluster) map[string]*corev1.PersistentVolume {
	t.Helper()
	l, err := c.Client.CoreV1().PersistentVolumes().List(context.Background(), metav1.ListOptions{LabelSelector: "e2e-local=yes"})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*corev1.PersistentVolume{}
	for i := range l.Items {
		out[l.Items[i].Name] = &l.Items[i]
	}
	return out
}

// claimCheck is a claim of a pod, with its volume and that volume's node.
type claimCheck struct {
	pod, node, claim string
	phase            corev1.PersistentVolumeClaimPhase
	volume, pvNode   string
	selectedNode     string
}

func (cc claimCheck) String() string {
	return fmt.Sprintf("pod %s on %q: claim %s %s, volume %q on %q, selected-node %q",
		cc.pod, cc.node, cc.claim, cc.phase, cc.volume, cc.pvNode, cc.selectedNode)
}

// claimsOf reads the claims of pods (their persistentVolumeClaim volumes).
func claimsOf(t testing.TB, c *cluster.Cluster, pods []corev1.Pod) []claimCheck {
	t.Helper()
	pvs := localPVs(t, c)
	var out []claimCheck
	for _, p := range pods {
		for _, v := range p.Spec.Volumes {
			if v.PersistentVolumeClaim == nil {
				continue
			}
			cc := claimCheck{pod: p.Name, node: p.Spec.NodeName, claim: v.PersistentVolumeClaim.ClaimName}
			pvc, err := c.Client.CoreV1().PersistentVolumeClaims(p.Namespace).Get(context.Background(), cc.claim, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("claim %s of pod %s: %v", cc.claim, p.Name, err)
			}
			cc.phase, cc.volume, cc.selectedNode = pvc.Status.Phase, pvc.Spec.VolumeName, pvc.Annotations[annSelectedNode]
			if pv := pvs[cc.volume]; pv != nil {
				cc.pvNode = pvNode(pv)
			}
			out = append(out, cc)
		}
	}
	return out
}

// volumesFollowPods waits until every claim of the pods is Bound, then
// asserts that each pod runs on the node of its claim's local volume.
func volumesFollowPods(t *testing.T, c *cluster.Cluster, pods []corev1.Pod, limit time.Duration) []claimCheck {
	t.Helper()
	var ccs []claimCheck
	waitFor(t, limit, "every claim Bound", func(ctx context.Context) (bool, error) {
		ccs = claimsOf(t, c, pods)
		for _, cc := range ccs {
			if cc.phase != corev1.ClaimBound {
				return false, nil
			}
		}
		return len(ccs) > 0, nil
	})
	for _, cc := range ccs {
		if cc.pvNode == "" || cc.node != cc.pvNode {
			t.Errorf("%s: the pod is not on its volume's node", cc)
		}
	}
	return ccs
}

// statefulSetOnLocal creates a StatefulSet (pods started in parallel) of
// fraction pods, each with a claim of class local from volumeClaimTemplates.
func statefulSetOnLocal(t *testing.T, c *cluster.Cluster, name, queue string, replicas int32, pct int) {
	t.Helper()
	tmpl := pod(name, queue).Fraction(pct).Label("app", name).Obj()
	tmpl.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
	tmpl.Spec.TerminationGracePeriodSeconds = ptr.To[int64](0)
	ss := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: appsv1.StatefulSetSpec{
			Replicas:            ptr.To(replicas),
			ServiceName:         name,
			PodManagementPolicy: appsv1.ParallelPodManagement,
			Selector:            &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template:            corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: tmpl.Labels, Annotations: tmpl.Annotations}, Spec: tmpl.Spec},
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{{
				ObjectMeta: metav1.ObjectMeta{Name: "data"},
				Spec: corev1.PersistentVolumeClaimSpec{
					AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					StorageClassName: ptr.To(localClass),
					Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
				},
			}},
		},
	}
	if _, err := c.Client.AppsV1().StatefulSets("default").Create(t.Context(), ss, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating statefulset %s: %v", name, err)
	}
}

// deleteStatefulSet deletes a StatefulSet, its pods and its claims, and
// waits until they are gone.
func deleteStatefulSet(t *testing.T, c *cluster.Cluster, name string) {
	t.Helper()
	ctx := t.Context()
	fg := metav1.DeletePropagationForeground
	if err := c.Client.AppsV1().StatefulSets("default").Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &fg}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "the pods of "+name+" gone", func(ctx context.Context) (bool, error) {
		for _, p := range podsOf(t, c, "default", "app="+name) {
			_ = c.Client.CoreV1().Pods("default").Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		}
		return len(podsOf(t, c, "default", "app="+name)) == 0, nil
	})
	l, err := c.Client.CoreV1().PersistentVolumeClaims("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, pvc := range l.Items {
		if strings.HasPrefix(pvc.Name, "data-"+name+"-") {
			if err := c.Client.CoreV1().PersistentVolumeClaims("default").Delete(ctx, pvc.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Fatal(err)
			}
		}
	}
	waitFor(t, 30*time.Second, "the claims of "+name+" gone", func(ctx context.Context) (bool, error) {
		l, err := c.Client.CoreV1().PersistentVolumeClaims("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, pvc := range l.Items {
			if strings.HasPrefix(pvc.Name, "data-"+name+"-") {
				return false, nil
			}
		}
		return true, nil
	})
}

// podsPerNode counts pods by node.
func podsPerNode(pods []corev1.Pod) map[string]int {
	out := map[string]int{}
	for _, p := range pods {
		out[p.Spec.NodeName]++
	}
	return out
}

// TestStatefulSetOfFractionsOnLocalVolumes: a StatefulSet of 30% fractions
// whose claims (volumeClaimTemplates, class local: WaitForFirstConsumer, no
// provisioner) can only be met by local PVs, one or two per node. Each node
// has GPUs enough for every pod, so placement alone would pack them (it
// packs fractions); the PVs decide where each pod may go.
//
// Without kube-scheduler's checks (--kube-checks=false, first) the
// coordinator places the pods by their GPUs alone: every pod is bound and
// "Running", but no claim is ever bound (nothing runs VolumeBinding: with
// WaitForFirstConsumer the PV controller waits for the scheduler), so on a
// real node every pod would wait forever for its volume; and pods packed on
// a node with fewer PVs than pods could never get one (the packing puts all
// four on one node). With the checks (the default, second) every claim is
// Bound (without a retry of the coordinator's making), and every pod runs on the node of its volume:
// the assertions of the second subtest, which the first shows failing
// without the checks.
func TestStatefulSetOfFractionsOnLocalVolumes(t *testing.T) {
	t.Parallel()
	c := startCluster(t, cluster.Options{})
	buildBinary(t, "gpufrac-coordinator")
	nodes := addGPUNodes(t, c, "gpu", "", 3)
	applyYAML(t, c, queuesYAML(map[string]string{"db": "8"}))
	createLocalClass(t, c)
	// 4 PVs: one on gpu-0, one on gpu-1, two on gpu-2; 4 replicas.
	perNode := map[string]int{nodes[0]: 1, nodes[1]: 1, nodes[2]: 2}
	for _, n := range slices.Sorted(maps.Keys(perNode)) {
		for i := 0; i < perNode[n]; i++ {
			createLocalPV(t, c, fmt.Sprintf("local-%s-%d", n, i), n, "10Gi")
		}
	}
	const replicas = 4

	t.Run("without kube checks", func(t *testing.T) {
		co := startCoordinator(t, c, "nochecks", "--leader-elect=false", "--kube-checks=false")
		statefulSetOnLocal(t, c, "off", "db", replicas, 30)
		pods := waitApp(t, c, "off", replicas, 60*time.Second)
		// Bound and run by kwok; give the PV controller time it would need.
		time.Sleep(5 * time.Second)
		ccs := claimsOf(t, c, pods)
		bound := 0
		for _, cc := range ccs {
			t.Logf("checks off: %s", cc)
			if cc.phase == corev1.ClaimBound {
				bound++
			}
		}
		per := podsPerNode(pods)
		var crowded []string
		for n, k := range per {
			if k > perNode[n] {
				crowded = append(crowded, fmt.Sprintf("%s: %d pods, %d PVs", n, k, perNode[n]))
			}
		}
		sort.Strings(crowded)
		t.Logf("checks off: pods per node %v; nodes with more pods than PVs: %v", per, crowded)
		if bound != 0 {
			t.Errorf("checks off: %d claims Bound; expected none (nothing runs VolumeBinding for the coordinator's pods)", bound)
		}
		for name, pv := range localPVs(t, c) {
			if pv.Spec.ClaimRef != nil || pv.Status.Phase != corev1.VolumeAvailable {
				t.Errorf("checks off: PV %s is %s, claimed by %v; expected Available", name, pv.Status.Phase, pv.Spec.ClaimRef)
			}
		}
		deleteStatefulSet(t, c, "off")
		co.stop(syscall.SIGTERM)
	})

	t.Run("with kube checks", func(t *testing.T) {
		co := startCoordinator(t, c, "checks", "--leader-elect=false")
		began := time.Now()
		statefulSetOnLocal(t, c, "db", "db", replicas, 30)
		pods := waitApp(t, c, "db", replicas, 90*time.Second)
		ccs := volumesFollowPods(t, c, pods, 60*time.Second)
		t.Logf("checks on: %d pods running with their volumes bound in %s", len(pods), time.Since(began).Round(time.Millisecond))
		for _, cc := range ccs {
			t.Logf("checks on: %s", cc)
		}
		seen := map[string]string{}
		for _, cc := range ccs {
			if other, ok := seen[cc.volume]; ok {
				t.Errorf("volume %s bound to two claims: %s and %s", cc.volume, other, cc.claim)
			}
			seen[cc.volume] = cc.claim
		}
		for n, k := range podsPerNode(pods) {
			if k > perNode[n] {
				t.Errorf("node %s runs %d pods of the StatefulSet and has %d PVs", n, k, perNode[n])
			}
		}
		volumesBoundWithoutRetries(t, co, replicas)
		checkInvariants(t, c)
	})
}

// labelNodes sets labels on nodes.
func labelNodes(t *testing.T, c *cluster.Cluster, labels map[string]string, nodes ...string) {
	t.Helper()
	var b strings.Builder
	for k, v := range labels {
		if b.Len() > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, "%q:%q", k, v)
	}
	patch := []byte(`{"metadata":{"labels":{` + b.String() + `}}}`)
	for _, n := range nodes {
		if _, err := c.Client.CoreV1().Nodes().Patch(t.Context(), n, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// spreadDeployment creates a Deployment of 30% fractions, labelled
// app=name, spread over zones and nodes (maxSkew 1, DoNotSchedule) and
// with a required anti-affinity to its own pods by hostname.
func spreadDeployment(t *testing.T, c *cluster.Cluster, name, queue string, replicas int32) {
	t.Helper()
	tmpl := pod(name, queue).Fraction(30).Label("app", name).Obj()
	own := &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}}
	for _, key := range []string{corev1.LabelTopologyZone, corev1.LabelHostname} {
		tmpl.Spec.TopologySpreadConstraints = append(tmpl.Spec.TopologySpreadConstraints, corev1.TopologySpreadConstraint{
			MaxSkew: 1, TopologyKey: key, WhenUnsatisfiable: corev1.DoNotSchedule, LabelSelector: own,
		})
	}
	tmpl.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{LabelSelector: own, TopologyKey: corev1.LabelHostname}},
	}}
	tmpl.Spec.TerminationGracePeriodSeconds = ptr.To[int64](0)
	createDeployment(t, c, name, replicas, own, tmpl)
}

// spreadOf checks that the running pods are at most one per node and
// returns their count per zone.
func spreadOf(t *testing.T, c *cluster.Cluster, pods []corev1.Pod, zoneOf map[string]string) map[string]int {
	t.Helper()
	perZone := map[string]int{}
	for n, k := range podsPerNode(pods) {
		if k > 1 {
			t.Errorf("node %s runs %d pods with an anti-affinity to each other by hostname", n, k)
		}
		perZone[zoneOf[n]] += k
	}
	return perZone
}

// volumesBoundWithoutRetries asserts that the coordinator's volume
// bindings (VolumeBinding's PreBind) did not fail for a reason of its own
// making: a binding that reads the pod's node from an empty spec.nodeName,
// or more failed bindings than pods (two members of a gang picking one PV
// fail again and again). A failure the API server causes (a conflict with
// the PV controller's own write) is retried, by kube-scheduler as by the
// coordinator, and is tolerated once per pod.
func volumesBoundWithoutRetries(t *testing.T, co *coordinator, pods int) {
	t.Helper()
	log, err := os.ReadFile(co.log)
	if err != nil {
		t.Fatal(err)
	}
	const failed = "binding the volumes of pod"
	var lines []string
	n := 0
	for _, l := range strings.Split(string(log), "\n") {
		if !strings.Contains(l, failed) {
			continue
		}
		if strings.Contains(l, `node "" not found`) {
			t.Errorf("a volume binding read the pod's node from an empty spec.nodeName: %s", l)
		}
		if n++; n <= 3 {
			lines = append(lines, l)
		}
	}
	if n > 0 {
		t.Logf("the coordinator logged %d failed volume bindings, e.g.\n%s", n, strings.Join(lines, "\n"))
	}
	if n > pods {
		t.Errorf("%d failed volume bindings for %d pods: more than one retry a pod", n, pods)
	}
}

// runningOf waits until n pods of app run (more may be pending) and
// returns the running ones.
func runningOf(t *testing.T, c *cluster.Cluster, app string, n int, limit time.Duration) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	waitFor(t, limit, fmt.Sprintf("%d pods of %s Running", n, app), func(ctx context.Context) (bool, error) {
		pods = appPods(t, c, app)
		return len(pods) == n, nil
	})
	return pods
}

// pendingWith waits until a pod of app is pending with a PodScheduled=False
// message holding every one of words, and returns that pod.
func pendingWith(t *testing.T, c *cluster.Cluster, app string, limit time.Duration, words ...string) corev1.Pod {
	t.Helper()
	var found corev1.Pod
	var last string
	waitFor(t, limit, fmt.Sprintf("a pending pod of %s saying %q", app, words), func(ctx context.Context) (bool, error) {
		for _, p := range podsOf(t, c, "default", "app="+app) {
			if p.Spec.NodeName != "" || p.DeletionTimestamp != nil {
				continue
			}
			m := scheduledMessage(&p)
			last = scheduledReason(&p) + ": " + m
			ok := m != ""
			for _, w := range words {
				ok = ok && strings.Contains(m, w)
			}
			if ok {
				found = p
				return true, nil
			}
		}
		return false, nil
	})
	t.Logf("%s pending: %s: %s (last seen %q)", found.Name, scheduledReason(&found), scheduledMessage(&found), last)
	return found
}

// TestSpreadAndAntiAffinityAsKubeSchedulerWould: 30% fractions, which
// placement alone packs on one GPU, with topology spread over zones and
// nodes (maxSkew 1, DoNotSchedule) and a required anti-affinity to each
// other by hostname. Zone a has three GPU nodes, zone b one: the
// anti-affinity alone would let 4 replicas run (one per node), but the zone
// spread allows 2 in a and 1 in b; the 4th waits, in kube-scheduler's
// words. A second node in zone b takes it. With 5 nodes, 5 replicas run
// (3 in a, 2 in b, one per node); a 6th, beyond the node count, waits,
// rejected by the spread in zone a and by the anti-affinity in zone b.
func TestSpreadAndAntiAffinityAsKubeSchedulerWould(t *testing.T) {
	t.Parallel()
	c := startCluster(t, cluster.Options{})
	buildBinary(t, "gpufrac-coordinator")
	a := addGPUNodes(t, c, "a", "", 3)
	b := addGPUNodes(t, c, "b", "", 1)
	zoneOf := map[string]string{}
	labelNodes(t, c, map[string]string{corev1.LabelTopologyZone: "zone-a"}, a...)
	labelNodes(t, c, map[string]string{corev1.LabelTopologyZone: "zone-b"}, b...)
	for _, n := range a {
		zoneOf[n] = "zone-a"
	}
	for _, n := range b {
		zoneOf[n] = "zone-b"
	}
	applyYAML(t, c, queuesYAML(map[string]string{"web": "8"}))
	startCoordinator(t, c, "c1", "--leader-elect=false")

	// 4 replicas: 3 run (2 in zone a, 1 in zone b), the 4th is held by the spread.
	spreadDeployment(t, c, "web", "web", 4)
	pods := runningOf(t, c, "web", 3, 60*time.Second)
	p := pendingWith(t, c, "web", 30*time.Second, "didn't match pod topology spread constraints")
	if perZone := spreadOf(t, c, pods, zoneOf); perZone["zone-a"] != 2 || perZone["zone-b"] != 1 {
		t.Errorf("3 replicas run %v per zone; want 2 in zone-a and 1 in zone-b", perZone)
	}
	// It stays pending: nothing else changed.
	time.Sleep(3 * time.Second)
	if q, err := c.Client.CoreV1().Pods("default").Get(t.Context(), p.Name, metav1.GetOptions{}); err != nil || q.Spec.NodeName != "" {
		t.Errorf("%s was bound (%v) though the spread forbids every node", p.Name, err)
	}

	// A second node in zone b: the 4th replica runs there.
	b2 := addGPUNodes(t, c, "b2", "", 1)
	labelNodes(t, c, map[string]string{corev1.LabelTopologyZone: "zone-b"}, b2...)
	zoneOf[b2[0]] = "zone-b"
	pods = runningOf(t, c, "web", 4, 60*time.Second)
	if perZone := spreadOf(t, c, pods, zoneOf); perZone["zone-a"] != 2 || perZone["zone-b"] != 2 {
		t.Errorf("4 replicas run %v per zone; want 2 and 2", perZone)
	}
	for _, q := range pods {
		if q.Name == p.Name && q.Spec.NodeName != b2[0] {
			t.Errorf("%s went to %s; the only node the spread and the anti-affinity allow is %s", q.Name, q.Spec.NodeName, b2[0])
		}
	}

	// 6 replicas on 5 nodes: 5 run, one per node; the 6th waits.
	scaleDeployment(t, c, "web", 6)
	pods = runningOf(t, c, "web", 5, 60*time.Second)
	perZone := spreadOf(t, c, pods, zoneOf)
	if d := perZone["zone-a"] - perZone["zone-b"]; d > 1 || d < -1 {
		t.Errorf("5 replicas run %v per zone: skew %d", perZone, d)
	}
	t.Logf("5 replicas per zone: %v, per node: %v", perZone, podsPerNode(pods))
	pendingWith(t, c, "web", 30*time.Second, "didn't match pod anti-affinity rules", "didn't match pod topology spread constraints")
	if n := len(appPods(t, c, "web")); n != 5 {
		t.Errorf("%d replicas run on 5 nodes", n)
	}
	checkInvariants(t, c)
}

// TestGangWithVolumesBindsThemOnlyWhenWhole: a gang of 8 pods of 2 whole
// GPUs each (16 GPUs), each with its own claim of class local. Local PVs
// are plenty (8 on each node, of different sizes); GPUs are what is short:
// two nodes of 8 GPUs, 2 of them taken by a pod of another queue (within
// its quota: nothing is reclaimed). Placement fits 7 members and rolls the
// gang back, cycle after cycle; meanwhile none of its volumes is touched:
// no PV claimed, no claim bound or given a selected-node annotation. Once a
// third node joins, all 8 are bound, every claim Bound to a PV on its pod's
// node and no more than 8 PVs claimed.
//
// The gang's volume bindings must not fail more than once a pod (two
// members picking one PV fail again and again): a failure sends the whole
// gang back to pending and leaves the PVs already written bound (the PV
// controller completes them), each pinning its pod to a node for the next
// attempts. A conflict the API server causes may fail one, and is retried.
func TestGangWithVolumesBindsThemOnlyWhenWhole(t *testing.T) {
	t.Parallel()
	c := startCluster(t, cluster.Options{})
	buildBinary(t, "gpufrac-coordinator")
	nodes := addGPUNodes(t, c, "gpu", "", 2)
	const late = "late-0" // added once the gang waits
	applyYAML(t, c, queuesYAML(map[string]string{"train": "32", "other": "8"}))
	createLocalClass(t, c)
	for _, n := range append(slices.Clone(nodes), late) {
		for i := 0; i < 8; i++ {
			// Sizes differ: VolumeBinding takes the smallest PV that fits.
			createLocalPV(t, c, fmt.Sprintf("local-%s-%d", n, i), n, fmt.Sprintf("%dGi", 10+i))
		}
	}
	co := startCoordinator(t, c, "c1", "--leader-elect=false")
	create(t, c, pod("filler", "other").GPUs(2).NodeSelector(corev1.LabelHostname, nodes[1]).Obj())
	running(t, c, 60*time.Second, "filler")

	const size = 8
	var names []string
	for i := 0; i < size; i++ {
		n := fmt.Sprintf("gang-%d", i)
		names = append(names, n)
		claim := "data-" + n
		pvc := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: claim, Namespace: "default"},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName: ptr.To(localClass),
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
			},
		}
		if _, err := c.Client.CoreV1().PersistentVolumeClaims("default").Create(t.Context(), pvc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		p := pod(n, "train").GPUs(2).PodGroup("job").MinMember(size).Label("app", "gang").Obj()
		p.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim},
		}}}
		p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
		create(t, c, p)
	}

	// 14 free GPUs for a gang of 16: every member pending, no volume touched.
	waitFor(t, 30*time.Second, "every gang member pending with a reason", func(ctx context.Context) (bool, error) {
		gang := podsOf(t, c, "default", "app=gang")
		for _, p := range gang {
			if p.Spec.NodeName != "" {
				return false, fmt.Errorf("%s bound to %s though the gang cannot fit", p.Name, p.Spec.NodeName)
			}
			if scheduledReason(&p) == "" {
				return false, nil
			}
		}
		return len(gang) == size, nil
	})
	time.Sleep(5 * time.Second) // more cycles placing 7 members and rolling back
	pending := podsOf(t, c, "default", "app=gang")
	t.Logf("gang pending: %s: %s", scheduledReason(&pending[0]), scheduledMessage(&pending[0]))
	for _, cc := range claimsOf(t, c, pending) {
		if cc.phase != corev1.ClaimPending || cc.volume != "" || cc.selectedNode != "" || cc.node != "" {
			t.Errorf("while the gang cannot fit: %s", cc)
		}
	}
	for name, pv := range localPVs(t, c) {
		if pv.Spec.ClaimRef != nil || pv.Status.Phase != corev1.VolumeAvailable {
			t.Errorf("while the gang cannot fit: PV %s is %s, claimed by %v", name, pv.Status.Phase, pv.Spec.ClaimRef)
		}
	}

	// A third node: the gang fits whole.
	addGPUNodes(t, c, "late", "", 1)
	began := time.Now()
	pods := running(t, c, 120*time.Second, names...)
	t.Logf("gang of %d running %s after the third node's agent was up", size, time.Since(began).Round(time.Millisecond))
	var list []corev1.Pod
	for _, n := range names {
		list = append(list, *pods[n])
	}
	t.Logf("gang per node: %v", podsPerNode(list))
	for _, cc := range volumesFollowPods(t, c, list, 60*time.Second) {
		t.Logf("%s", cc)
	}
	claimed := 0
	for _, pv := range localPVs(t, c) {
		if pv.Spec.ClaimRef != nil {
			claimed++
		}
	}
	if claimed != size {
		t.Errorf("%d PVs claimed for a gang of %d", claimed, size)
	}
	volumesBoundWithoutRetries(t, co, len(list))
	checkInvariants(t, c)
}

// createDeployment creates a Deployment in default of replicas pods like
// tmpl, selected by own.
func createDeployment(t *testing.T, c *cluster.Cluster, name string, replicas int32, own *metav1.LabelSelector, tmpl *corev1.Pod) {
	t.Helper()
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: own,
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: tmpl.Labels, Annotations: tmpl.Annotations}, Spec: tmpl.Spec},
		},
	}
	if _, err := c.Client.AppsV1().Deployments("default").Create(t.Context(), d, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating deployment %s: %v", name, err)
	}
}
