package kubecheck

// Review of issue 28: kubecheck under hostile input, odd event orders and
// concurrency. Tests that fail show a defect (see the review report).

import (
	"context"
	"fmt"
	"sync"
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

	"github.com/gpufrac/gpufrac/coordinator/placeholder"
)

// newCheckerWithObjects is newChecker with API objects (claims, classes,
// volumes, namespaces) in the clientset before the informers start.
func newCheckerWithObjects(t *testing.T, api []runtime.Object, feed ...any) *Checker {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	client := fake.NewClientset(api...)
	factory := informers.NewSharedInformerFactory(client, 0)
	c, err := New(ctx, Options{Factory: factory, Client: client})
	if err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	synced := append(Synced(factory), factory.Core().V1().Namespaces().Informer().HasSynced)
	if !toolscache.WaitForCacheSync(ctx.Done(), synced...) {
		t.Fatal("not synced")
	}
	logger := klog.Background()
	ph, nh := c.PodHandler(logger), c.NodeHandler(logger)
	for _, o := range feed {
		switch o := o.(type) {
		case *corev1.Node:
			nh.OnAdd(o, false)
		case *corev1.Pod:
			ph.OnAdd(o, false)
		}
	}
	return c
}

func claimOf(ns, name, class string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("uid-" + name)},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: &class,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
}

// TestReview28PlaceholderTopologyStaysSmall: VolumeTopology gives one node
// selector per claim (the class's allowed topologies, or the bound PV's node
// affinity), duplicates included, and placeholder.podFor ANDs them into the
// placeholder's required node affinity as the cross product of their terms.
// A class (or a PV: the CSI external-provisioner writes one term per
// accessible topology, two for a regional disk) with two terms, and a
// tenant's pod with k claims of it (or one claim mounted k times), makes
// 2^k terms of k requirements each: 16 claims make 65,536 terms, 30 make a
// billion, and the coordinator runs out of memory building the placeholder,
// in every cycle, for as long as the pod is pending. The placeholder's
// affinity must stay small (deduplicated, or capped).
func TestKubeReview28PlaceholderTopologyStaysSmall(t *testing.T) {
	mode := storagev1.VolumeBindingWaitForFirstConsumer
	class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "regional"}, Provisioner: "pd.csi.storage.gke.io",
		VolumeBindingMode: &mode, AllowedTopologies: []corev1.TopologySelectorTerm{
			{MatchLabelExpressions: []corev1.TopologySelectorLabelRequirement{{Key: corev1.LabelTopologyZone, Values: []string{"z1"}}}},
			{MatchLabelExpressions: []corev1.TopologySelectorLabelRequirement{{Key: corev1.LabelTopologyZone, Values: []string{"z2"}}}},
		}}
	const claims = 14
	objs := []runtime.Object{class}
	p := pod("p", "", nil)
	for i := range claims {
		name := fmt.Sprintf("data-%d", i)
		objs = append(objs, claimOf("ns", name, "regional"))
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: name}}})
	}
	c := newCheckerWithObjects(t, objs, node("n1", "z1"))
	topo := c.VolumeTopology(p)
	t.Logf("VolumeTopology gave %d selectors for %d claims of one class", len(topo), claims)
	start := time.Now()
	pods := placeholder.Plan([]placeholder.Item{{Workload: "ns/p", Pod: p, GPUs: 1, Topology: topo}}, placeholder.DefaultOptions())
	took := time.Since(start)
	if len(pods) != 1 {
		t.Fatalf("%d placeholders, want 1", len(pods))
	}
	terms := pods[0].Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	reqs := 0
	for _, term := range terms {
		reqs += len(term.MatchExpressions)
	}
	t.Logf("placeholder: %d node selector terms, %d requirements, built in %v", len(terms), reqs, took)
	if len(terms) > 64 {
		t.Errorf("the placeholder's required affinity has %d terms (%d requirements) for %d claims of one two-zone class: it doubles with each claim", len(terms), reqs, claims)
	}
}

// TestReview28DomainTopologyHonoursExistingAntiAffinity: kube-scheduler
// rejects a node for a pod when a pod already in the node's domain has a
// required anti-affinity matching it (symmetry). A new node in zone z1,
// where "guard" forbids app=a by zone, can never take the pod; the
// placeholder must not ask Karpenter for one there, or Karpenter buys a GPU
// node the pod never uses (and the placeholder, landed, keeps it).
func TestKubeReview28DomainTopologyHonoursExistingAntiAffinity(t *testing.T) {
	guard := pod("guard", "n1", map[string]string{"app": "guard"})
	guard.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{
		{LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "a"}}, TopologyKey: corev1.LabelTopologyZone}}}}
	c := newCheckerWithObjects(t, nil, node("n1", "z1"), node("n2", "z2"), guard)
	if err := c.Begin(klog.Background()); err != nil {
		t.Fatal(err)
	}
	defer c.End(klog.Background())
	p := pod("new", "", map[string]string{"app": "a"})
	// The check itself knows: z1 is rejected.
	pc, err := c.Check(context.Background(), p)
	if err != nil || pc == nil {
		t.Fatalf("check: %v %v", pc, err)
	}
	if ok, _ := pc.Allows(context.Background(), "n1"); ok {
		t.Fatal("n1 allowed: the test relies on guard's anti-affinity rejecting it")
	}
	got := ""
	for _, ns := range c.Topology(p) {
		got += ns.String()
	}
	if got == "" {
		t.Errorf("placeholder topology is empty: a new node in z1 is allowed although guard's anti-affinity rejects the pod in all of z1")
	}
}

// TestReview28DomainTopologyHonoursNamespaceSelector: a term's
// namespaceSelector selects the namespaces it counts (with its namespaces
// list, a union). DomainTopology counts every namespace when the selector
// is set: a term whose selector matches no namespace counts nothing in
// kube-scheduler, yet the placeholder is kept out of every zone holding a
// pod of that label in any namespace.
func TestKubeReview28DomainTopologyHonoursNamespaceSelector(t *testing.T) {
	app := map[string]string{"app": "a"}
	other := pod("other", "n1", app)
	other.Namespace = "elsewhere"
	nss := []runtime.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "elsewhere"}},
	}
	c := newCheckerWithObjects(t, nss, node("n1", "z1"), node("n2", "z2"), other)
	if err := c.Begin(klog.Background()); err != nil {
		t.Fatal(err)
	}
	defer c.End(klog.Background())
	p := pod("new", "", nil)
	p.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
		LabelSelector:     &metav1.LabelSelector{MatchLabels: app},
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "none"}},
		TopologyKey:       corev1.LabelTopologyZone,
	}}}}
	pc, err := c.Check(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if ok, why := pc.Allows(context.Background(), "n1"); !ok {
		t.Fatalf("kube-scheduler rejects n1 (%v): the test relies on the term matching no namespace", why)
	}
	got := ""
	for _, ns := range c.Topology(p) {
		got += ns.String()
	}
	if got != "" {
		t.Errorf("placeholder topology %s, want none: the term's namespaceSelector matches no namespace", got)
	}
}

// TestReview28ConcurrentHandlersAndCycle: the informer's handlers run on
// their own goroutines while the cycle begins, checks, assumes, forgets and
// ends, and bind workers reserve and unreserve (run with -race). Afterwards
// the anti-affinity counter equals the number of bound pods with a required
// anti-affinity, and nothing stays assumed.
func TestKubeReview28ConcurrentHandlersAndCycle(t *testing.T) {
	db := map[string]string{"app": "db"}
	anti := func(p *corev1.Pod) *corev1.Pod {
		p.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{
			{LabelSelector: &metav1.LabelSelector{MatchLabels: db}, TopologyKey: corev1.LabelHostname}}}}
		return p
	}
	var nodes []any
	for i := range 8 {
		nodes = append(nodes, node(fmt.Sprintf("n%d", i), fmt.Sprintf("z%d", i%2)))
	}
	c := newCheckerWithObjects(t, nil, nodes...)
	logger := klog.Background()
	ph := c.PodHandler(logger)
	ctx := context.Background()
	const n = 200
	var wg sync.WaitGroup
	// Informer: pods appear bound, some finish, some are deleted.
	wg.Go(func() {
		for i := range n {
			p := anti(pod(fmt.Sprintf("bound-%d", i), fmt.Sprintf("n%d", i%8), db))
			ph.OnAdd(p, false)
			if i%3 == 0 {
				done := p.DeepCopy()
				done.Status.Phase = corev1.PodSucceeded
				ph.OnUpdate(p, done)
				ph.OnDelete(done)
			}
		}
	})
	// Cycle: pending pods assumed, then confirmed, failed or rolled back.
	wg.Go(func() {
		for i := range n {
			if err := c.Begin(logger); err != nil {
				t.Error(err)
				return
			}
			p := anti(pod(fmt.Sprintf("pending-%d", i), "", db))
			if pc, err := c.Check(ctx, p); err != nil {
				t.Error(err)
			} else if pc != nil {
				pc.Allows(ctx, "n0")
			}
			c.DomainTopology(p)
			node := fmt.Sprintf("n%d", i%8)
			if err := c.Assume(logger, p, node); err != nil {
				t.Error(err)
			}
			switch i % 3 {
			case 0: // bound and shown bound, then deleted
				b := p.DeepCopy()
				b.Spec.NodeName = node
				ph.OnUpdate(p, b)
				ph.OnDelete(b)
			case 1: // binding failed
				c.Forget(logger, p)
			case 2: // deleted while assumed
				ph.OnDelete(p)
			}
			c.End(logger)
		}
	})
	wg.Wait()
	want := int64(0)
	for i := range n {
		if i%3 != 0 {
			want++
		}
	}
	if got := c.antiAffinity.Load(); got != want {
		t.Errorf("anti-affinity counter %d, want %d (bound pods with a required anti-affinity left)", got, want)
	}
	c.mu.Lock()
	left := len(c.assumed)
	c.mu.Unlock()
	if left != 0 {
		t.Errorf("%d pods still assumed", left)
	}
}
