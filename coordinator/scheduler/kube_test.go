package scheduler

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/coordinator/kubecheck"
	"github.com/gpufrac/gpufrac/coordinator/placement"
	"github.com/gpufrac/gpufrac/coordinator/reservation"
	"github.com/gpufrac/gpufrac/tests/builders"
)

// kubeCluster is a cluster (scheduler over fixed objects, the fake binder)
// whose Deps.Kube is a real kubecheck.Checker on a fake clientset holding
// the same nodes and pods and the volume objects, fed by the handlers as the
// coordinator's informers feed it. Bindings are applied to the checker's
// cache too (kubeCycle), as the pod informer does in production.
type kubeCluster struct {
	*cluster
	client  *fake.Clientset
	factory informers.SharedInformerFactory
	kube    *kubecheck.Checker
	podsH   toolscache.ResourceEventHandler
	nodesH  toolscache.ResourceEventHandler
}

// kubeOpts tune newKubeCluster.
type kubeOpts struct {
	policy string
	// noKube leaves Deps.Kube nil (the coordinator before issue 28).
	noKube bool
	// pvController simulates the PV controller on the fake clientset (see
	// simulatePVController).
	pvController bool
	// bindTimeout is VolumeBinding's BindTimeoutSeconds (0: 5 s).
	bindTimeout int64
	queues      []*v1alpha1.Queue
}

func newKubeCluster(t *testing.T, o kubeOpts, nodes []*corev1.Node, pods []*corev1.Pod, objs ...runtime.Object) *kubeCluster {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	queues := o.queues
	if queues == nil {
		queues = []*v1alpha1.Queue{queueOf("q", "1000")}
	}
	deps := Deps{Queues: staticQueues(queues)}
	kc := &kubeCluster{}
	if !o.noKube {
		// The volume objects, nodes and pods are in the clientset before
		// the factory starts: VolumeBinding reads PVs, PVCs and
		// StorageClasses from its informers, and (in PreBind) the node and
		// the pod too.
		all := append([]runtime.Object{}, objs...)
		for _, n := range nodes {
			all = append(all, n.DeepCopy())
		}
		for _, p := range pods {
			all = append(all, p.DeepCopy())
		}
		kc.client = fake.NewClientset(all...)
		kc.factory = informers.NewSharedInformerFactory(kc.client, 0)
		timeout := o.bindTimeout
		if timeout == 0 {
			timeout = 5
		}
		k, err := kubecheck.New(ctx, kubecheck.Options{Factory: kc.factory, Client: kc.client, BindTimeoutSeconds: timeout})
		if err != nil {
			t.Fatal(err)
		}
		kc.kube = k
		if o.pvController {
			simulatePVController(ctx, t, kc.client, kc.factory)
		}
		kc.factory.Start(ctx.Done())
		for typ, ok := range kc.factory.WaitForCacheSync(ctx.Done()) {
			if !ok {
				t.Fatalf("informer of %v not synced", typ)
			}
		}
		logger := klog.Background()
		kc.podsH, kc.nodesH = k.PodHandler(logger), k.NodeHandler(logger)
		for _, n := range nodes {
			kc.nodesH.OnAdd(n, true)
		}
		for _, p := range pods {
			kc.podsH.OnAdd(p, true)
		}
		deps.Kube = k
	}
	policy := o.policy
	if policy == "" {
		policy = "binpack"
	}
	kc.cluster = newClusterWith(t, Options{Policy: policy, BindWorkers: 1}, deps, nodes, pods...)
	return kc
}

// kubeCycle runs one cycle and applies its bindings to the pods, the
// scheduler and kube-scheduler's cache (the pod informer's update), and
// returns the pods bound, in the order they were placed.
func (c *kubeCluster) kubeCycle() []string {
	c.t.Helper()
	if _, err := c.s.Cycle(c.t.Context()); err != nil {
		c.t.Fatal(err)
	}
	return c.kubeApplyBinds()
}

func (c *kubeCluster) kubeApplyBinds() []string {
	c.t.Helper()
	// Workloads with volumes queue their bindings once their volume gate
	// passed (Scheduler.bind).
	c.s.gates.Wait()
	var bound []string
	for {
		select {
		case task := <-c.s.binds:
			if err := c.s.runBind(c.t.Context(), task); err != nil {
				c.t.Logf("binding %s to %s failed: %v", task.pod.Name, task.node, err)
				continue
			}
			p := task.pod.DeepCopy()
			p.Spec.NodeName = task.node
			p.Status.Phase = corev1.PodRunning
			if p.Annotations == nil {
				p.Annotations = map[string]string{}
			}
			for k, v := range task.annotations {
				p.Annotations[k] = v
			}
			old, _, _ := c.pods.Get(task.pod)
			_ = c.pods.Update(p)
			c.s.OnPod(p)
			if c.podsH != nil {
				if old == nil {
					old = task.pod
				}
				c.podsH.OnUpdate(old, p)
			}
			bound = append(bound, task.pod.Name)
		default:
			return bound
		}
	}
}

// simulatePVController stands in for kube-controller-manager's PV
// controller, which VolumeBinding's PreBind waits for: a PV given a claimRef
// (a static binding) gets its claim bound to it; a claim given
// volume.kubernetes.io/selected-node (dynamic provisioning) gets a new
// local PV on that node, bound to it.
func simulatePVController(ctx context.Context, t *testing.T, client *fake.Clientset, factory informers.SharedInformerFactory) {
	bindClaim := func(ns, name, pv string) {
		pvc, err := client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil || pvc.Spec.VolumeName != "" {
			return
		}
		pvc.Spec.VolumeName = pv
		metav1.SetMetaDataAnnotation(&pvc.ObjectMeta, "pv.kubernetes.io/bind-completed", "yes")
		pvc.Status.Phase = corev1.ClaimBound
		if _, err := client.CoreV1().PersistentVolumeClaims(ns).Update(ctx, pvc, metav1.UpdateOptions{}); err != nil {
			t.Logf("PV controller: binding claim %s/%s: %v", ns, name, err)
		}
	}
	_, _ = factory.Core().V1().PersistentVolumes().Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, obj any) {
			pv := obj.(*corev1.PersistentVolume)
			if ref := pv.Spec.ClaimRef; ref != nil && pv.Status.Phase != corev1.VolumeBound {
				bindClaim(ref.Namespace, ref.Name, pv.Name)
			}
		},
	})
	_, _ = factory.Core().V1().PersistentVolumeClaims().Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, obj any) {
			pvc := obj.(*corev1.PersistentVolumeClaim)
			node := pvc.Annotations["volume.kubernetes.io/selected-node"]
			if node == "" || pvc.Spec.VolumeName != "" {
				return
			}
			pv := localPV("pvc-"+string(pvc.UID), node, *pvc.Spec.StorageClassName)
			pv.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: pvc.Namespace, Name: pvc.Name, UID: pvc.UID}
			pv.Status.Phase = corev1.VolumeBound
			if _, err := client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
				t.Logf("PV controller: provisioning for %s/%s: %v", pvc.Namespace, pvc.Name, err)
				return
			}
			bindClaim(pvc.Namespace, pvc.Name, pv.Name)
		},
	})
}

// Pods and volume objects.

var kubeEpoch = time.Unix(1_700_000_000, 0)

// kpod is a pending pod of queue q asking one whole GPU and a CPU, created
// i seconds after kubeEpoch (the cycle places older pods first).
func kpod(name string, i int, labels map[string]string) *corev1.Pod {
	w := builders.MakePod(name, "default").Queue("q").GPUs(1).CPU("1").UID(name).
		Created(metav1.NewTime(kubeEpoch.Add(time.Duration(i) * time.Second)))
	for k, v := range labels {
		w = w.Label(k, v)
	}
	return w.Obj()
}

func spreadOver(p *corev1.Pod, key string, maxSkew int32, sel map[string]string) *corev1.Pod {
	p.Spec.TopologySpreadConstraints = append(p.Spec.TopologySpreadConstraints, corev1.TopologySpreadConstraint{
		MaxSkew: maxSkew, TopologyKey: key, WhenUnsatisfiable: corev1.DoNotSchedule,
		LabelSelector: &metav1.LabelSelector{MatchLabels: sel}})
	return p
}

func podAffinityTerm(key string, sel map[string]string) corev1.PodAffinityTerm {
	return corev1.PodAffinityTerm{TopologyKey: key, LabelSelector: &metav1.LabelSelector{MatchLabels: sel}}
}

func antiAffine(p *corev1.Pod, key string, sel map[string]string) *corev1.Pod {
	if p.Spec.Affinity == nil {
		p.Spec.Affinity = &corev1.Affinity{}
	}
	if p.Spec.Affinity.PodAntiAffinity == nil {
		p.Spec.Affinity.PodAntiAffinity = &corev1.PodAntiAffinity{}
	}
	a := p.Spec.Affinity.PodAntiAffinity
	a.RequiredDuringSchedulingIgnoredDuringExecution = append(a.RequiredDuringSchedulingIgnoredDuringExecution, podAffinityTerm(key, sel))
	return p
}

func affine(p *corev1.Pod, key string, sel map[string]string) *corev1.Pod {
	if p.Spec.Affinity == nil {
		p.Spec.Affinity = &corev1.Affinity{}
	}
	if p.Spec.Affinity.PodAffinity == nil {
		p.Spec.Affinity.PodAffinity = &corev1.PodAffinity{}
	}
	a := p.Spec.Affinity.PodAffinity
	a.RequiredDuringSchedulingIgnoredDuringExecution = append(a.RequiredDuringSchedulingIgnoredDuringExecution, podAffinityTerm(key, sel))
	return p
}

func withHostPort(p *corev1.Pod, port int32) *corev1.Pod {
	c := &p.Spec.Containers[0]
	c.Ports = append(c.Ports, corev1.ContainerPort{ContainerPort: port, HostPort: port, Protocol: corev1.ProtocolTCP})
	return p
}

func withClaim(p *corev1.Pod, claim string) *corev1.Pod {
	p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: claim,
		VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}})
	return p
}

// zonedNode is an 8-GPU node of pool "a" in zone.
func zonedNode(name, zone string) *corev1.Node {
	n := h100Node(name, "a", 8)
	n.Labels[corev1.LabelTopologyZone] = zone
	return n
}

const noProvisioner = "kubernetes.io/no-provisioner"

func storageClass(name, provisioner string, mode storagev1.VolumeBindingMode) *storagev1.StorageClass {
	return &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: provisioner, VolumeBindingMode: &mode}
}

// localPV is a 10Gi local volume of class on node (its node affinity
// names the node by hostname).
func localPV(name, node, class string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name)},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("10Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			StorageClassName:              class,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: "/mnt/disks/" + name}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
			}}}},
		},
		Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeAvailable},
	}
}

// pvcOf is a 1Gi claim of class in namespace default; the PV controller
// needs its UID (the PV's claimRef names it).
func pvcOf(name, class string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: &class,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
		Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimPending},
	}
}

// boundPair is claim c bound to local PV pv on node, as the PV controller
// leaves them.
func boundPair(c, pv, node, class string) (*corev1.PersistentVolumeClaim, *corev1.PersistentVolume) {
	pvc := pvcOf(c, class)
	vol := localPV(pv, node, class)
	pvc.Spec.VolumeName = pv
	pvc.Annotations = map[string]string{"pv.kubernetes.io/bind-completed": "yes"}
	pvc.Status.Phase = corev1.ClaimBound
	vol.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: "default", Name: c, UID: pvc.UID}
	vol.Status.Phase = corev1.VolumeBound
	return pvc, vol
}

// nodesOf maps pod names to the nodes the fake binder bound them to.
func (c *kubeCluster) nodesOf(pods ...string) map[string]string {
	out := map[string]string{}
	for _, p := range pods {
		out[p] = c.boundTo(p)
	}
	return out
}

func countBy(m map[string]string, f func(node string) string) map[string]int {
	out := map[string]int{}
	for _, n := range m {
		out[f(n)]++
	}
	return out
}

var webApp = map[string]string{"app": "web"}

// spreadBurst is the Deployment-like burst of TestKubeChecksInTheCycle:
// four one-GPU pods with a hard zone spread (maxSkew 1), over two zones of
// two nodes.
func spreadBurst() ([]*corev1.Node, []*corev1.Pod) {
	nodes := []*corev1.Node{zonedNode("z1a", "z1"), zonedNode("z1b", "z1"), zonedNode("z2a", "z2"), zonedNode("z2b", "z2")}
	var pods []*corev1.Pod
	for i := range 4 {
		pods = append(pods, spreadOver(kpod(fmt.Sprintf("web-%d", i), i, webApp), corev1.LabelTopologyZone, 1, webApp))
	}
	return nodes, pods
}

var zoneOf = map[string]string{"z1a": "z1", "z1b": "z1", "z2a": "z2", "z2b": "z2"}

// TestKubeChecksInTheCycle: the cycle runs kube-scheduler's filter plugins
// (Deps.Kube) for the pods that need them, and assumes each pod it places
// into their snapshot, so the next pod of the same cycle sees it.
func TestKubeChecksInTheCycle(t *testing.T) {
	t.Run("a burst with a hard zone spread is spread 2/2 in one cycle", func(t *testing.T) {
		// binpack would put all four on one node: only the spread
		// constraint, checked against the pods placed before in the same
		// cycle (Assume), splits them.
		nodes, pods := spreadBurst()
		c := newKubeCluster(t, kubeOpts{}, nodes, pods)
		bound := c.kubeCycle()
		if len(bound) != 4 {
			t.Fatalf("bound %v in one cycle, want all 4; reasons %v", bound, c.b.Messages)
		}
		got := c.nodesOf("web-0", "web-1", "web-2", "web-3")
		if zones := countBy(got, func(n string) string { return zoneOf[n] }); zones["z1"] != 2 || zones["z2"] != 2 {
			t.Errorf("pods by zone %v (%v), want 2 in each", zones, got)
		}
	})

	t.Run("without Deps.Kube the same burst lands as before", func(t *testing.T) {
		nodes, pods := spreadBurst()
		c := newKubeCluster(t, kubeOpts{noKube: true}, nodes, pods)
		bound := c.kubeCycle()
		if len(bound) != 4 {
			t.Fatalf("bound %v, want all 4; reasons %v", bound, c.b.Messages)
		}
		got := c.nodesOf("web-0", "web-1", "web-2", "web-3")
		// binpack packs them: the spread constraint is not looked at.
		if nodes := countBy(got, func(n string) string { return n }); len(nodes) != 1 {
			t.Errorf("without kube checks binpack spread the pods over %v; the test relies on it packing them", nodes)
		}
	})

	t.Run("the spread holds across cycles, against bound pods", func(t *testing.T) {
		nodes, pods := spreadBurst()
		c := newKubeCluster(t, kubeOpts{}, nodes, pods[:3])
		if bound := c.kubeCycle(); len(bound) != 3 {
			t.Fatalf("first cycle bound %v, want 3", bound)
		}
		// z? has two, the other one: the fourth must go to the other zone.
		zones := countBy(c.nodesOf("web-0", "web-1", "web-2"), func(n string) string { return zoneOf[n] })
		want := "z1"
		if zones["z1"] == 2 {
			want = "z2"
		}
		_ = c.pods.Add(pods[3])
		c.kubeCycle()
		if n := c.boundTo("web-3"); zoneOf[n] != want {
			t.Errorf("web-3 bound to %q (zone %q), want zone %s (zones before %v)", n, zoneOf[n], want, zones)
		}
	})

	t.Run("required anti-affinity by hostname: two of three bound, the third waits with kube-scheduler's words", func(t *testing.T) {
		db := map[string]string{"app": "db"}
		var pods []*corev1.Pod
		for i := range 3 {
			pods = append(pods, antiAffine(kpod(fmt.Sprintf("db-%d", i), i, db), corev1.LabelHostname, db))
		}
		c := newKubeCluster(t, kubeOpts{}, []*corev1.Node{h100Node("n1", "a", 8), h100Node("n2", "a", 8)}, pods)
		bound := c.kubeCycle()
		got := c.nodesOf("db-0", "db-1")
		if len(bound) != 2 || got["db-0"] == "" || got["db-1"] == "" || got["db-0"] == got["db-1"] {
			t.Fatalf("bound %v on %v, want db-0 and db-1 on distinct nodes", bound, got)
		}
		if n := c.boundTo("db-2"); n != "" {
			t.Fatalf("db-2 bound to %s next to another db", n)
		}
		r, m := c.b.Reason("db-2")
		want := "0/2 nodes are available: 2 node(s) didn't match pod anti-affinity rules"
		if r != api.ReasonNoCapacity || m != want {
			t.Errorf("db-2: reason %q message %q, want %s %q", r, m, api.ReasonNoCapacity, want)
		}
		// Bound now (the informer shows them): still no room.
		c.kubeCycle()
		if n := c.boundTo("db-2"); n != "" {
			t.Errorf("db-2 bound to %s in the second cycle", n)
		}
		if _, m := c.b.Reason("db-2"); m != want {
			t.Errorf("db-2 second cycle: message %q, want %q", m, want)
		}
	})

	t.Run("a host port taken by a bound pod", func(t *testing.T) {
		// n1 holds a pod with host port 8080: binpack prefers n1 (it is
		// the fuller node), the port sends the first pod to n2, and the
		// second has no node left.
		busy := admitted(withHostPort(kpod("busy", 0, nil), 8080), "n1")
		p1 := withHostPort(kpod("p1", 1, nil), 8080)
		p2 := withHostPort(kpod("p2", 2, nil), 8080)
		free := kpod("free", 3, nil)
		c := newKubeCluster(t, kubeOpts{}, []*corev1.Node{h100Node("n1", "a", 8), h100Node("n2", "a", 8)}, []*corev1.Pod{busy, p1, p2, free})
		c.kubeCycle()
		if n := c.boundTo("p1"); n != "n2" {
			t.Errorf("p1 bound to %q, want n2 (n1's port 8080 is taken)", n)
		}
		if n := c.boundTo("free"); n != "n1" {
			t.Errorf("free (no port) bound to %q, want n1 (binpack)", n)
		}
		if n := c.boundTo("p2"); n != "" {
			t.Errorf("p2 bound to %s, where port 8080 is taken", n)
		}
		want := "0/2 nodes are available: 2 node(s) didn't have free ports for the requested pod ports"
		if _, m := c.b.Reason("p2"); m != want {
			t.Errorf("p2: message %q, want %q", m, want)
		}
	})

	t.Run("a gang of two with mutual anti-affinity and one node binds nothing", func(t *testing.T) {
		g := map[string]string{"app": "gang"}
		member := func(name string, i int) *corev1.Pod {
			p := antiAffine(kpod(name, i, g), corev1.LabelHostname, g)
			p.Labels[api.LabelPodGroup] = "g"
			p.Annotations = map[string]string{api.AnnotationMinMember: "2"}
			return p
		}
		// After the gang, a pod that may not share a node with any gang
		// member: the gang's failed attempt must have been forgotten
		// (rolled back from kube-scheduler's snapshot), or it waits too.
		solo := antiAffine(kpod("solo", 5, nil), corev1.LabelHostname, g)
		c := newKubeCluster(t, kubeOpts{}, []*corev1.Node{h100Node("n1", "a", 8)}, []*corev1.Pod{member("g-0", 0), member("g-1", 1), solo})
		c.kubeCycle()
		for _, p := range []string{"g-0", "g-1"} {
			if n := c.boundTo(p); n != "" {
				t.Errorf("%s bound to %s: the gang fits no node pair", p, n)
			}
			if r, m := c.b.Reason(p); r != api.ReasonNoCapacity || !strings.Contains(m, "didn't match pod anti-affinity rules") {
				t.Errorf("%s: reason %q message %q, want NoCapacity for anti-affinity", p, r, m)
			}
		}
		if n := c.boundTo("solo"); n != "n1" {
			t.Errorf("solo bound to %q (%s), want n1: the gang's rolled-back members still count", n, msg(c.b, "solo"))
		}
	})

	t.Run("the same gang on two nodes binds on distinct nodes", func(t *testing.T) {
		g := map[string]string{"app": "gang"}
		var pods []*corev1.Pod
		for i := range 2 {
			p := antiAffine(kpod(fmt.Sprintf("g-%d", i), i, g), corev1.LabelHostname, g)
			p.Labels[api.LabelPodGroup] = "g"
			p.Annotations = map[string]string{api.AnnotationMinMember: "2"}
			pods = append(pods, p)
		}
		c := newKubeCluster(t, kubeOpts{}, []*corev1.Node{h100Node("n1", "a", 8), h100Node("n2", "a", 8)}, pods)
		c.kubeCycle()
		if a, b := c.boundTo("g-0"), c.boundTo("g-1"); a == "" || b == "" || a == b {
			t.Errorf("gang bound to %q and %q, want two distinct nodes (%s)", a, b, msg(c.b, "g-0"))
		}
	})

	t.Run("required pod affinity to a bound pod's zone", func(t *testing.T) {
		cache := admitted(kpod("cache", 0, map[string]string{"app": "cache"}), "z2b")
		p := affine(kpod("near", 1, nil), corev1.LabelTopologyZone, map[string]string{"app": "cache"})
		nodes := []*corev1.Node{zonedNode("z1a", "z1"), zonedNode("z1b", "z1"), zonedNode("z2a", "z2"), zonedNode("z2b", "z2")}
		c := newKubeCluster(t, kubeOpts{policy: "spread"}, nodes, []*corev1.Pod{cache, p})
		c.kubeCycle()
		if n := c.boundTo("near"); zoneOf[n] != "z2" {
			t.Errorf("near bound to %q, want a node of zone z2 (%s)", n, msg(c.b, "near"))
		}
	})
}

// TestKubeChecksVolumes: VolumeBinding's checks and bindings in the cycle.
func TestKubeChecksVolumes(t *testing.T) {
	// bestfit takes the node with the least left: n1 (one GPU) over n2.
	nodes := func() []*corev1.Node { return []*corev1.Node{h100Node("n1", "a", 1), h100Node("n2", "a", 8)} }

	t.Run("a claim bound to a local PV on n2 takes the pod to n2", func(t *testing.T) {
		pvc, pv := boundPair("data", "pv-n2", "n2", "local")
		sc := storageClass("local", noProvisioner, storagev1.VolumeBindingWaitForFirstConsumer)
		pod := withClaim(kpod("p", 0, nil), "data")
		c := newKubeCluster(t, kubeOpts{policy: "bestfit"}, nodes(), []*corev1.Pod{pod}, sc, pvc, pv)
		c.kubeCycle()
		if n := c.boundTo("p"); n != "n2" {
			t.Errorf("p bound to %q (%s), want n2, where its volume is", n, msg(c.b, "p"))
		}
		// Control: without the checks bestfit picks n1.
		c0 := newKubeCluster(t, kubeOpts{policy: "bestfit", noKube: true}, nodes(), []*corev1.Pod{pod})
		c0.kubeCycle()
		if n := c0.boundTo("p"); n != "n1" {
			t.Errorf("without kube checks p bound to %q, want n1: the test relies on bestfit preferring n1", n)
		}
	})

	t.Run("a claim bound to a local PV on a node without room waits with the volume's reason", func(t *testing.T) {
		pvc, pv := boundPair("data", "pv-n1", "n1", "local")
		sc := storageClass("local", noProvisioner, storagev1.VolumeBindingWaitForFirstConsumer)
		hog := admitted(kpod("hog", 0, nil), "n1") // n1's only GPU
		pod := withClaim(kpod("p", 1, nil), "data")
		c := newKubeCluster(t, kubeOpts{policy: "bestfit"}, nodes(), []*corev1.Pod{hog, pod}, sc, pvc, pv)
		c.kubeCycle()
		if n := c.boundTo("p"); n != "" {
			t.Fatalf("p bound to %s, away from its volume on n1", n)
		}
		want := "0/2 nodes are available: 1 had insufficient GPU, 1 node(s) didn't match PersistentVolume's node affinity"
		if _, m := c.b.Reason("p"); m != want {
			t.Errorf("p: message %q, want %q", m, want)
		}
	})

	// WaitForFirstConsumer with two unbound local PVs, one per node: the pod
	// is placed on either (bestfit: n1), VolumeBinding reserves the PV of
	// that node, and its PreBind writes the PV's claimRef through the
	// clientset and waits for the PV controller to bind the claim
	// (simulated here on the fake clientset, see simulatePVController); the
	// pod is bound only after.
	t.Run("WaitForFirstConsumer: static binding to the chosen node's local PV", func(t *testing.T) {
		sc := storageClass("local", noProvisioner, storagev1.VolumeBindingWaitForFirstConsumer)
		pvc := pvcOf("data", "local")
		pod := withClaim(kpod("p", 0, nil), "data")
		c := newKubeCluster(t, kubeOpts{policy: "bestfit", pvController: true}, nodes(), []*corev1.Pod{pod},
			sc, pvc, localPV("pv-n1", "n1", "local"), localPV("pv-n2", "n2", "local"))
		c.kubeCycle()
		n := c.boundTo("p")
		if n == "" {
			t.Fatalf("p not bound after one cycle (%s)", msg(c.b, "p"))
		}
		pv, err := c.client.CoreV1().PersistentVolumes().Get(t.Context(), "pv-"+n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if ref := pv.Spec.ClaimRef; ref == nil || ref.Name != "data" || ref.UID != pvc.UID {
			t.Errorf("PV pv-%s claimRef %+v, want claim default/data", n, ref)
		}
		got, err := c.client.CoreV1().PersistentVolumeClaims("default").Get(t.Context(), "data", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Spec.VolumeName != "pv-"+n {
			t.Errorf("claim bound to %q, want pv-%s", got.Spec.VolumeName, n)
		}
	})

	t.Run("WaitForFirstConsumer: dynamic provisioning on the chosen node", func(t *testing.T) {
		sc := storageClass("csi", "csi.example.com", storagev1.VolumeBindingWaitForFirstConsumer)
		pvc := pvcOf("data", "csi")
		pod := withClaim(kpod("p", 0, nil), "data")
		c := newKubeCluster(t, kubeOpts{policy: "bestfit", pvController: true}, nodes(), []*corev1.Pod{pod}, sc, pvc)
		c.kubeCycle()
		n := c.boundTo("p")
		if n == "" {
			t.Fatalf("p not bound after one cycle (%s)", msg(c.b, "p"))
		}
		got, err := c.client.CoreV1().PersistentVolumeClaims("default").Get(t.Context(), "data", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if sel := got.Annotations["volume.kubernetes.io/selected-node"]; sel != n {
			t.Errorf("claim's selected-node %q, want %q, the node the pod was bound to", sel, n)
		}
	})

	// Without a PV controller, PreBind gives up after BindTimeoutSeconds
	// (1 s here): the volume binding fails, no pod binding is sent and the
	// pod stays pending. (On this branch PreBind fails earlier, at its first
	// check after 1 s, for the reason the two tests above fail: see
	// TestKubeChecksVolumes' WaitForFirstConsumer cases.)
	t.Run("WaitForFirstConsumer: no PV controller, the binding times out", func(t *testing.T) {
		sc := storageClass("local", noProvisioner, storagev1.VolumeBindingWaitForFirstConsumer)
		pod := withClaim(kpod("p", 0, nil), "data")
		c := newKubeCluster(t, kubeOpts{policy: "bestfit", bindTimeout: 1}, nodes(), []*corev1.Pod{pod},
			sc, pvcOf("data", "local"), localPV("pv-n1", "n1", "local"), localPV("pv-n2", "n2", "local"))
		start := time.Now()
		c.kubeCycle()
		if n := c.boundTo("p"); n != "" {
			t.Errorf("p bound to %s although its volume never bound", n)
		}
		if c.b.BindCalls != 0 {
			t.Errorf("%d pod bindings sent before the volume was bound", c.b.BindCalls)
		}
		t.Logf("binding failed after %v", time.Since(start))
	})
}

// TestKubeChecksSeeExistingAntiAffinityOfPodsPlacedInTheCycle: kube-scheduler
// rejects a node for an incoming pod when a pod already there has a required
// anti-affinity that matches the incoming pod (InterPodAffinity's "existing
// pods anti-affinity"), whether that pod is bound or only assumed. The
// coordinator sees it only for pods its cache shows bound: a pod placed
// earlier in the same cycle (or being bound, not yet shown by the informer)
// is missed, and the next pod lands next to it.
func TestKubeChecksSeeExistingAntiAffinityOfPodsPlacedInTheCycle(t *testing.T) {
	db := func() *corev1.Pod {
		return antiAffine(kpod("db", 0, map[string]string{"app": "db"}), corev1.LabelHostname, webApp)
	}
	nodes := func() []*corev1.Node { return []*corev1.Node{h100Node("n1", "a", 8), h100Node("n2", "a", 8)} }
	check := func(t *testing.T, c *kubeCluster) {
		t.Helper()
		if d, w := c.boundTo("db"), c.boundTo("web"); d == "" || w == "" || d == w {
			t.Errorf("db on %q, web on %q: want both bound on distinct nodes (db's anti-affinity forbids web on its node)", d, w)
		}
	}
	t.Run("bound in an earlier cycle and shown bound (control)", func(t *testing.T) {
		c := newKubeCluster(t, kubeOpts{}, nodes(), []*corev1.Pod{db()})
		c.kubeCycle()
		_ = c.pods.Add(kpod("web", 1, webApp))
		c.kubeCycle()
		check(t, c)
	})
	t.Run("placed earlier in the same cycle, web needs no check of its own", func(t *testing.T) {
		c := newKubeCluster(t, kubeOpts{}, nodes(), []*corev1.Pod{db(), kpod("web", 1, webApp)})
		c.kubeCycle()
		check(t, c)
	})
	t.Run("placed earlier in the same cycle, web has a host port", func(t *testing.T) {
		c := newKubeCluster(t, kubeOpts{}, nodes(), []*corev1.Pod{db(), withHostPort(kpod("web", 1, webApp), 9000)})
		c.kubeCycle()
		check(t, c)
	})
	t.Run("bound in an earlier cycle, not yet shown by the informer", func(t *testing.T) {
		c := newKubeCluster(t, kubeOpts{}, nodes(), []*corev1.Pod{db()})
		// The cycle places db; its binding is sent but not yet shown.
		if _, err := c.s.Cycle(t.Context()); err != nil {
			t.Fatal(err)
		}
		_ = c.pods.Add(kpod("web", 1, webApp))
		if _, err := c.s.Cycle(t.Context()); err != nil {
			t.Fatal(err)
		}
		c.kubeApplyBinds()
		check(t, c)
	})
}

// TestKubeChecksReclaimOnlyWhenEvictionsHelp: a queue below its deserved
// quota reclaims from queues above theirs when its pod finds no room. When
// kube-scheduler's checks reject the pod for a reason no victim holds (here
// the anti-affinity of its own queue's pod a-1 on the only node), evicting
// helps nothing: kube-scheduler's preemption, which runs the filters with
// the victims gone, would evict nobody. The coordinator's reclaim verifies
// that the pod fits once the victims are gone without the kube checks
// (Scheduler.fits places with no filter), and evicts.
func TestKubeChecksReclaimOnlyWhenEvictionsHelp(t *testing.T) {
	x := map[string]string{"app": "x"}
	for _, tc := range []struct {
		name string
		// bRunning: team-b's one-GPU pods on n1 (8 GPUs; team-a's a-1 takes one).
		bRunning int
		// antiX: a-2 may not share a node with a pod labelled app=x (a-1).
		antiX   bool
		evicted int
	}{
		{name: "GPUs free, only the anti-affinity rejects", bRunning: 5, antiX: true, evicted: 0},
		{name: "no GPU free and the anti-affinity rejects", bRunning: 7, antiX: true, evicted: 0},
		{name: "no GPU free, no anti-affinity (control: reclaim evicts)", bRunning: 7, antiX: false, evicted: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var pods []*corev1.Pod
			for i := range tc.bRunning {
				pods = append(pods, admitted(builders.MakePod(fmt.Sprintf("b-%d", i), "default").Queue("team-b").GPUs(1).CPU("1").UID(fmt.Sprintf("b-%d", i)).Obj(), "n1"))
			}
			a1 := admitted(builders.MakePod("a-1", "default").Queue("team-a").GPUs(1).CPU("1").UID("a-1").Label("app", "x").Obj(), "n1")
			a2 := builders.MakePod("a-2", "default").Queue("team-a").GPUs(1).CPU("1").UID("a-2").Obj()
			if tc.antiX {
				antiAffine(a2, corev1.LabelHostname, x)
			}
			pods = append(pods, a1, a2)
			queues := []*v1alpha1.Queue{
				builders.MakeQueue("team-a").GPUQuota("4").Namespaces("default").Obj(),
				builders.MakeQueue("team-b").GPUQuota("2").Namespaces("default").Obj(),
			}
			c := newKubeCluster(t, kubeOpts{queues: queues}, []*corev1.Node{h100Node("n1", "a", 8)}, pods)
			c.kubeCycle()
			if n := c.boundTo("a-2"); n != "" {
				t.Fatalf("a-2 bound to %s", n)
			}
			if ev := c.b.EvictedPods(); len(ev) != tc.evicted {
				t.Errorf("evicted %v for a-2 (%s), want %d evictions", ev, msg(c.b, "a-2"), tc.evicted)
			}
		})
	}
}

// TestKubeChecksCarryPlannedPodsBetweenCycles: a fraction that waits for
// its reservation stays assumed in kube-scheduler's cache from one cycle to
// the next while its plan holds (not taken out and put back in every cycle
// it waits), and is taken out when it no longer waits on that plan: its
// reservation removed (placed afresh, never checked with itself assumed),
// or the pod gone from the cycle's workloads.
func TestKubeChecksCarryPlannedPodsBetweenCycles(t *testing.T) {
	f := withHostPort(fracPod("f", "q", 40), 8080) // a host port: checked by kube-scheduler's plugins
	c := newKubeCluster(t, kubeOpts{}, []*corev1.Node{h100Node("n1", "a", 2)}, []*corev1.Pod{f})
	r := &fakeReserver{c: c.cluster}
	c.s.deps.Reserver = r

	c.kubeCycle()
	first := c.kube.AssumedAs("f")
	if first == nil || first.Spec.NodeName != "n1" || c.reason("f") != api.ReasonReservationPending {
		t.Fatalf("after the first cycle: f assumed as %v, reason %q; want assumed on n1, waiting for its reservation", first, c.reason("f"))
	}
	c.kubeCycle()
	if got := c.kube.AssumedAs("f"); got != first {
		t.Errorf("f still waits on its plan: assumed as %p after the second cycle, want the same assumption %p (not forgotten and assumed again)", got, first)
	}

	// Its reservation is removed: placed afresh, and assumed afresh.
	planned := r.ensured[0][len("n1/"):]
	obj, _, _ := c.pods.GetByKey(api.ReservationNamespace + "/" + reservation.Name("n1", planned))
	_ = c.pods.Delete(obj.(*corev1.Pod))
	c.kubeCycle()
	again := c.kube.AssumedAs("f")
	if again == first {
		t.Errorf("f placed afresh after its reservation went, but kube-scheduler's cache still holds the old assumption")
	}
	if again == nil || c.reason("f") != api.ReasonReservationPending {
		t.Fatalf("after its reservation went: f assumed as %v, reason %q; want placed again, waiting for a new reservation", again, c.reason("f"))
	}

	// Gone from the workloads (deleted; kube-scheduler's handler has not
	// seen it): its assumption goes with the next cycle.
	_ = c.pods.Delete(f)
	c.s.OnPodDelete(f)
	c.kubeCycle()
	if got := c.kube.AssumedAs("f"); got != nil {
		t.Errorf("f deleted: still assumed on %s", got.Spec.NodeName)
	}
	if len(c.s.kubeCarried) != 0 {
		t.Errorf("carried after f was deleted: %v", c.s.kubeCarried)
	}
}

// TestForgetCarriedOutside: before any workload is checked, the carried
// assumptions go for pods no workload of the cycle holds, and for the
// workloads that cannot keep their plans (not every pod planned, or waiting
// for members): only whole planned workloads keep theirs.
func TestForgetCarriedOutside(t *testing.T) {
	a, b, y, x, g := kpod("a", 0, nil), kpod("b", 1, nil), kpod("y", 2, nil), kpod("x", 3, nil), kpod("g", 4, nil)
	c := newKubeCluster(t, kubeOpts{}, []*corev1.Node{h100Node("n1", "a", 8)}, []*corev1.Pod{a, b, y, x, g})
	logger := klog.Background()
	carried := map[types.UID]placedPod{}
	for _, p := range []*corev1.Pod{a, b, x, g} {
		if err := c.kube.Assume(logger, p, "n1"); err != nil {
			t.Fatal(err)
		}
		carried[p.UID] = placedPod{pod: p, node: "n1", assumed: true}
	}
	planned := plan{Decision: placement.Decision{Node: "n1"}}
	ps := plans{"a": planned, "b": planned, "g": planned}
	ws := []*workload{
		{key: "default/a", pods: []podInfo{{pod: a}}},                                   // planned whole: kept
		{key: "default/b", gang: true, pods: []podInfo{{pod: y}, {pod: b}}},             // y has no plan
		{key: "default/g", gang: true, pods: []podInfo{{pod: g}}, incomplete: "1 of 2"}, // waits for members
	} // x: in no workload
	k := &kubeChecks{k: c.kube, ctx: t.Context(), logger: logger, carried: carried}
	k.forgetCarriedOutside(ws, ps)
	for name, want := range map[string]bool{"a": true, "b": false, "x": false, "g": false} {
		if got := c.kube.AssumedAs(types.UID(name)) != nil; got != want {
			t.Errorf("%s assumed: %v, want %v", name, got, want)
		}
		if _, got := k.carried[types.UID(name)]; got != want {
			t.Errorf("%s carried: %v, want %v", name, got, want)
		}
	}
}
