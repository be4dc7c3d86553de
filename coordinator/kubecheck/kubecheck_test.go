package kubecheck

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

func node(name, zone string) *corev1.Node {
	alloc := corev1.ResourceList{corev1.ResourcePods: resource.MustParse("110"), corev1.ResourceCPU: resource.MustParse("8"),
		corev1.ResourceMemory: resource.MustParse("32Gi"), corev1.ResourceEphemeralStorage: resource.MustParse("100Gi")}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		corev1.LabelHostname: name, corev1.LabelTopologyZone: zone}},
		Status: corev1.NodeStatus{Allocatable: alloc, Capacity: alloc}}
}

func pod(name, nodeName string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID(name), Labels: labels},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "c"}}}}
}

func newChecker(t *testing.T, objs ...any) *Checker {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	client := fake.NewClientset()
	factory := informers.NewSharedInformerFactory(client, 0)
	c, err := New(ctx, Options{Factory: factory, Client: client})
	if err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	if !toolscache.WaitForCacheSync(ctx.Done(), Synced(factory)...) {
		t.Fatal("not synced")
	}
	logger := klog.Background()
	ph, nh := c.PodHandler(logger), c.NodeHandler(logger)
	for _, o := range objs {
		switch o := o.(type) {
		case *corev1.Node:
			nh.OnAdd(o, false)
		case *corev1.Pod:
			ph.OnAdd(o, false)
		}
	}
	_ = time.Second
	return c
}

func TestSpreadAndAntiAffinity(t *testing.T) {
	app := map[string]string{"app": "a"}
	c := newChecker(t, node("n1", "z1"), node("n2", "z2"), pod("p1", "n1", app))
	p := pod("new", "", app)
	p.Spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: corev1.LabelTopologyZone,
		WhenUnsatisfiable: corev1.DoNotSchedule, LabelSelector: &metav1.LabelSelector{MatchLabels: app}}}
	if !c.Needs(p) {
		t.Fatal("spread pod needs no check")
	}
	ctx := context.Background()
	if err := c.Begin(klog.Background()); err != nil {
		t.Fatal(err)
	}
	pc, err := c.Check(ctx, p)
	if err != nil || pc == nil {
		t.Fatalf("check: %v %v", pc, err)
	}
	if ok, why := pc.Allows(ctx, "n1"); ok {
		t.Errorf("n1 allowed: would skew zone z1")
	} else {
		t.Logf("n1: %v", why)
	}
	if ok, why := pc.Allows(ctx, "n2"); !ok {
		t.Errorf("n2 rejected: %v", why)
	}
	// Assume a pod on n2: now both zones have one, either is fine.
	if err := c.Assume(klog.Background(), pod("p2", "", app), "n2"); err != nil {
		t.Fatal(err)
	}
	pc, _ = c.Check(ctx, p)
	if ok, why := pc.Allows(ctx, "n1"); !ok {
		t.Errorf("n1 rejected after assume: %v", why)
	}
	c.End(klog.Background())
	plain := pod("plain", "", nil)
	if c.Needs(plain) {
		t.Error("plain pod needs a check")
	}
	if err := c.Begin(klog.Background()); err != nil {
		t.Fatal(err)
	}
	if pc, err := c.Check(ctx, plain); pc != nil || err != nil {
		t.Errorf("plain pod: %v %v", pc, err)
	}
}

func TestTopologyForPlaceholders(t *testing.T) {
	app := map[string]string{"app": "a"}
	c := newChecker(t, node("n1", "z1"), node("n2", "z1"), node("n3", "z2"),
		pod("p1", "n1", app), pod("p2", "n2", app), pod("other", "n3", map[string]string{"app": "b"}))
	if err := c.Begin(klog.Background()); err != nil {
		t.Fatal(err)
	}
	defer c.End(klog.Background())
	sel := &metav1.LabelSelector{MatchLabels: app}
	cases := []struct {
		name string
		edit func(p *corev1.Pod)
		want string
	}{
		{"nothing", func(*corev1.Pod) {}, ""},
		{"zone spread, skew 1: z1 holds 2, z2 none", func(p *corev1.Pod) {
			p.Spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: corev1.LabelTopologyZone,
				WhenUnsatisfiable: corev1.DoNotSchedule, LabelSelector: sel}}
		}, "topology.kubernetes.io/zone NotIn [z1]"},
		{"zone spread, skew 3 allows both", func(p *corev1.Pod) {
			p.Spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{MaxSkew: 3, TopologyKey: corev1.LabelTopologyZone,
				WhenUnsatisfiable: corev1.DoNotSchedule, LabelSelector: sel}}
		}, ""},
		{"hostname spread never restricts a new node", func(p *corev1.Pod) {
			p.Spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: corev1.LabelHostname,
				WhenUnsatisfiable: corev1.DoNotSchedule, LabelSelector: sel}}
		}, ""},
		{"zone anti-affinity", func(p *corev1.Pod) {
			p.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{
				{LabelSelector: sel, TopologyKey: corev1.LabelTopologyZone}}}}
		}, "topology.kubernetes.io/zone NotIn [z1]"},
		{"zone affinity", func(p *corev1.Pod) {
			p.Spec.Affinity = &corev1.Affinity{PodAffinity: &corev1.PodAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{
				{LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "b"}}, TopologyKey: corev1.LabelTopologyZone}}}}
		}, "topology.kubernetes.io/zone In [z2]"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := pod("new", "", app)
			tc.edit(p)
			got := ""
			for _, ns := range c.Topology(p) {
				for _, term := range ns.NodeSelectorTerms {
					for _, e := range term.MatchExpressions {
						got += fmt.Sprintf("%s %s %v", e.Key, e.Operator, e.Values)
					}
				}
			}
			if got != tc.want {
				t.Errorf("topology %q, want %q", got, tc.want)
			}
		})
	}
}

// TestOtherResources: a pod asking ephemeral storage is checked by
// NodeResourcesFit (placement counts CPU, memory and GPUs only); GPU
// resources are left to placement.
func TestOtherResources(t *testing.T) {
	c := newChecker(t, node("n1", "z1"))
	ctx := context.Background()
	if err := c.Begin(klog.Background()); err != nil {
		t.Fatal(err)
	}
	defer c.End(klog.Background())
	ask := func(rl corev1.ResourceList) *corev1.Pod {
		p := pod("p", "", nil)
		p.Spec.Containers[0].Resources.Requests = rl
		return p
	}
	gpus := ask(corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("16"), "gpufrac.io/gpu-fraction": resource.MustParse("30"),
		corev1.ResourceCPU: resource.MustParse("1")})
	if c.Needs(gpus) {
		t.Error("a pod asking GPUs and CPU needs kube-scheduler's checks")
	}
	if pc, err := c.Check(ctx, gpus); pc != nil || err != nil {
		t.Errorf("GPU pod: check %v, %v; want none", pc, err)
	}
	big := ask(corev1.ResourceList{corev1.ResourceEphemeralStorage: resource.MustParse("200Gi")})
	if !c.Needs(big) {
		t.Fatal("a pod asking ephemeral storage needs no check")
	}
	pc, err := c.Check(ctx, big)
	if err != nil || pc == nil {
		t.Fatalf("check %v, %v", pc, err)
	}
	if ok, why := pc.Allows(ctx, "n1"); ok || len(why) == 0 || why[0] != "Insufficient ephemeral-storage" {
		t.Errorf("200Gi of ephemeral storage on a 100Gi node: allowed %v, %v", ok, why)
	}
	small := ask(corev1.ResourceList{corev1.ResourceEphemeralStorage: resource.MustParse("1Gi"), "nvidia.com/gpu": resource.MustParse("16")})
	pc, _ = c.Check(ctx, small)
	if ok, why := pc.Allows(ctx, "n1"); !ok {
		t.Errorf("1Gi of ephemeral storage (and GPUs, placement's to count): rejected %v", why)
	}
}

// TestNotReadyUntilSynced: while the plugins' informers have not synced
// (the factory not started here; RBAC in a cluster), a pod that needs the
// checks gets ErrNotReady and one that does not is not held.
func TestNotReadyUntilSynced(t *testing.T) {
	client := fake.NewClientset()
	factory := informers.NewSharedInformerFactory(client, 0)
	c, err := New(t.Context(), Options{Factory: factory, Client: client})
	if err != nil {
		t.Fatal(err)
	}
	if c.Ready() {
		t.Fatal("ready before the informers synced")
	}
	p := pod("p", "", nil)
	p.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 80, HostPort: 80}}
	if _, err := c.Check(t.Context(), p); !errors.Is(err, ErrNotReady) {
		t.Errorf("check of a pod with a host port: %v, want ErrNotReady", err)
	}
	if pc, err := c.Check(t.Context(), pod("plain", "", nil)); pc != nil || err != nil {
		t.Errorf("check of a plain pod: %v, %v; want none", pc, err)
	}
}

// TestAssumeAgainOnlyWhatChanged: a pod assumed again where it is, as it
// is, keeps its assumption (a plan's pod carried from one cycle to the
// next); assumed as a changed object or on another node, the cache takes
// the new one, and a spread counts it by its labels now.
func TestAssumeAgainOnlyWhatChanged(t *testing.T) {
	app := map[string]string{"app": "a"}
	c := newChecker(t, node("n1", "z1"), node("n2", "z2"))
	logger := klog.Background()
	p := pod("p", "", app)
	p.ResourceVersion = "1"
	if err := c.Assume(logger, p, "n1"); err != nil {
		t.Fatal(err)
	}
	first := c.AssumedAs("p")
	if err := c.Assume(logger, p, "n1"); err != nil {
		t.Fatal(err)
	}
	if got := c.AssumedAs("p"); got != first {
		t.Errorf("assumed again where it is, as it is: the assumption was made anew")
	}
	relabelled := p.DeepCopy()
	relabelled.ResourceVersion, relabelled.Labels = "2", map[string]string{"app": "b"}
	if err := c.Assume(logger, relabelled, "n1"); err != nil {
		t.Fatal(err)
	}
	if got := c.AssumedAs("p"); got == first || got.Labels["app"] != "b" || got.Spec.NodeName != "n1" {
		t.Errorf("assumed as a changed object: %v, want the new object on n1", got)
	}
	// A pod of app a spread over the zones sees no pod of app a now.
	q := pod("q", "", app)
	q.Spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: corev1.LabelTopologyZone,
		WhenUnsatisfiable: corev1.DoNotSchedule, LabelSelector: &metav1.LabelSelector{MatchLabels: app}}}
	ctx := context.Background()
	if err := c.Begin(logger); err != nil {
		t.Fatal(err)
	}
	defer c.End(logger)
	pc, err := c.Check(ctx, q)
	if err != nil || pc == nil {
		t.Fatalf("check: %v %v", pc, err)
	}
	if ok, why := pc.Allows(ctx, "n1"); !ok {
		t.Errorf("q rejected on n1 (%v): the relabelled pod still counts as app a", why)
	}
	if err := c.Assume(logger, relabelled, "n2"); err != nil {
		t.Fatal(err)
	}
	if got := c.AssumedAs("p"); got == nil || got.Spec.NodeName != "n2" {
		t.Errorf("assumed on another node: %v, want on n2", got)
	}
}
