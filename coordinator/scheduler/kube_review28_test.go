package scheduler

// Review of issue 28 (kube-scheduler's checks in the coordinator): tests of
// what a hostile tenant, a failing API server or an unlucky event order can
// do to the kube checks. Each test states the expected behaviour; those that
// fail show a defect of the change (see the review report).

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/coordinator/binder"
	"github.com/gpufrac/gpufrac/coordinator/scheduler/schedulertest"
	"github.com/gpufrac/gpufrac/tests/builders"
)

// TestKubeReview28VolumeGateDoesNotWedgeBindWorkers: VolumeBinding's
// PreBind waits for the PV controller (up to BindTimeoutSeconds, 600 s by
// default, which the app does not change). kube-scheduler runs each
// binding cycle on its own goroutine, so a slow or never-completing claim
// (a class whose provisioner is down, a claim with a selector, which the PV
// controller never provisions) delays only its own pod. The coordinator runs
// the wait on its bounded pool of bind workers, and every member of a gang
// waits in the gate's sync.Once on a worker of its own: one tenant's gang of
// BindWorkers pods with such claims holds every bind worker, and no other
// pod of the cluster is bound until the timeout.
//
// Here: two bind workers, a gang of two whose claims are never provisioned
// (no PV controller; timeout 30 s) placed before a plain pod. The plain pod
// must be bound promptly.
func TestKubeReview28VolumeGateDoesNotWedgeBindWorkers(t *testing.T) {
	sc := storageClass("csi", "csi.example.com", storagev1.VolumeBindingWaitForFirstConsumer)
	g := map[string]string{"app": "gang"}
	var pods []*corev1.Pod
	for i := range 2 {
		p := withClaim(kpod(fmt.Sprintf("g-%d", i), i, g), fmt.Sprintf("data-%d", i))
		p.Labels[api.LabelPodGroup] = "g"
		p.Annotations = map[string]string{api.AnnotationMinMember: "2"}
		pods = append(pods, p)
	}
	pods = append(pods, kpod("plain", 5, nil))
	c := newKubeCluster(t, kubeOpts{bindTimeout: 30}, []*corev1.Node{h100Node("n1", "a", 8), h100Node("n2", "a", 8)}, pods,
		sc, pvcOf("data-0", "csi"), pvcOf("data-1", "csi"))
	if _, err := c.s.Cycle(t.Context()); err != nil {
		t.Fatal(err)
	}
	// The gang's bindings wait for its volume gate off the bind queue
	// (Scheduler.bind); plain's is queued.
	if n := len(c.s.binds); n != 1 {
		t.Fatalf("%d bindings queued, want 1 (plain's; the gang's wait for their volumes)", n)
	}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for range 2 { // Options.BindWorkers = 2
		wg.Go(func() { c.s.bindLoop(ctx) })
	}
	defer func() { cancel(); wg.Wait() }()
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) && c.boundTo("plain") == "" {
		time.Sleep(50 * time.Millisecond)
	}
	if c.boundTo("plain") == "" {
		t.Errorf("plain pod not bound within 3 s: both bind workers wait on the gang's volume gate (VolumeBinding's PreBind and the gate's sync.Once) for up to BindTimeoutSeconds")
	}
}

// TestKubeReview28ReclaimSeesVictimsGone: a queue over its deserved quota
// holds borrowed GPUs on n1 with pods whose required anti-affinity rejects
// every pod not of their app (app NotIn [b], by hostname). A pod of a queue
// below its deserved quota finds no room; kube-scheduler's preemption would
// remove the victims (and their anti-affinity, PreFilterExtensions.RemovePod)
// before running the filters, and evict. The coordinator's reclaim checks
// fits() with kube-scheduler's snapshot still holding the victims, so their
// anti-affinity always rejects, and it evicts nobody, ever: by adding one
// anti-affinity term to its pods, a tenant makes its borrowed GPUs
// unreclaimable.
func TestKubeReview28ReclaimSeesVictimsGone(t *testing.T) {
	antiOthers := func(p *corev1.Pod) *corev1.Pod {
		p.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
				TopologyKey: corev1.LabelHostname,
				LabelSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
					{Key: "app", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"b"}}}},
			}}}}
		return p
	}
	var pods []*corev1.Pod
	for i := range 8 {
		pods = append(pods, admitted(antiOthers(builders.MakePod(fmt.Sprintf("b-%d", i), "default").Queue("team-b").GPUs(1).CPU("1").
			UID(fmt.Sprintf("b-%d", i)).Label("app", "b").Obj()), "n1"))
	}
	pods = append(pods, builders.MakePod("a-1", "default").Queue("team-a").GPUs(1).CPU("1").UID("a-1").Label("app", "a").Obj())
	queues := []*v1alpha1.Queue{
		builders.MakeQueue("team-a").GPUQuota("4").Namespaces("default").Obj(),
		builders.MakeQueue("team-b").GPUQuota("0").Namespaces("default").Obj(),
	}
	// Control: the same cluster without the anti-affinity is reclaimed.
	t.Run("control: no anti-affinity, reclaim evicts", func(t *testing.T) {
		plain := make([]*corev1.Pod, len(pods))
		for i, p := range pods {
			plain[i] = p.DeepCopy()
			plain[i].Spec.Affinity = nil
		}
		c := newKubeCluster(t, kubeOpts{queues: queues}, []*corev1.Node{h100Node("n1", "a", 8)}, plain)
		c.kubeCycle()
		if ev := c.b.EvictedPods(); len(ev) == 0 {
			t.Fatalf("control evicted nothing (%s): the test relies on reclaim evicting team-b", msg(c.b, "a-1"))
		}
	})
	t.Run("victims' anti-affinity", func(t *testing.T) {
		c := newKubeCluster(t, kubeOpts{queues: queues}, []*corev1.Node{h100Node("n1", "a", 8)}, pods)
		c.kubeCycle()
		if ev := c.b.EvictedPods(); len(ev) == 0 {
			t.Errorf("nothing evicted for a-1 (%s): team-b (deserved 0, using 8) keeps its borrowed GPUs because its victims' own anti-affinity is still counted by the reclaim's fit test", msg(c.b, "a-1"))
		}
	})
}

// TestKubeReview28UnknownBindingOfDeletedPodForgetsAssumption: a pod placed
// and assumed in kube-scheduler's cache is deleted. The kube handler's
// delete ran before the cycle assumed it (the cycle reads the lister at its
// start; handlers run on their own goroutines), the scheduler's OnPodDelete
// after the binding was queued, and the binding's outcome is unknown
// (binder.ErrBindingUnknown). runBind keeps the kube assumption when the
// outcome is unknown and s.assumed no longer holds the pod (it assumes the
// informer showed it bound), so nothing ever forgets it: a ghost pod holds
// its host port (and would hold its anti-affinity and spread count) in
// kube-scheduler's cache for the rest of the leader's term.
func TestKubeReview28UnknownBindingOfDeletedPodForgetsAssumption(t *testing.T) {
	ghost := withHostPort(kpod("ghost", 0, nil), 8080)
	c := newKubeCluster(t, kubeOpts{}, []*corev1.Node{h100Node("n1", "a", 8)}, []*corev1.Pod{ghost})
	// The kube handler sees the deletion first (nothing assumed yet).
	c.podsH.OnDelete(ghost)
	if _, err := c.s.Cycle(t.Context()); err != nil { // still in the cycle's lister
		t.Fatal(err)
	}
	// The scheduler's handler sees it after the binding was queued.
	_ = c.pods.Delete(ghost)
	c.s.OnPodDelete(ghost)
	c.b.NextBindErr = fmt.Errorf("timeout: %w", binder.ErrBindingUnknown)
	if bound := c.kubeApplyBinds(); len(bound) != 0 {
		t.Fatalf("bound %v", bound)
	}
	// A new pod wants the same host port on the only node.
	_ = c.pods.Add(withHostPort(kpod("next", 1, nil), 8080))
	c.kubeCycle()
	if n := c.boundTo("next"); n != "n1" {
		t.Errorf("next bound to %q (%s), want n1: the deleted pod is still assumed in kube-scheduler's cache", n, msg(c.b, "next"))
	}
}

// TestKubeReview28GateFailureLeavesNoAssumption: the API server refuses the
// volume binding (Forbidden: the chart's RBAC off, or a conflict). The gate
// fails, every member goes back to pending, and nothing stays assumed in
// kube-scheduler's cache: a pod with the same host port as a member fits on
// the node afterwards.
func TestKubeReview28GateFailureLeavesNoAssumption(t *testing.T) {
	sc := storageClass("csi", "csi.example.com", storagev1.VolumeBindingWaitForFirstConsumer)
	p := withHostPort(withClaim(kpod("p", 0, nil), "data"), 8080)
	c := newKubeCluster(t, kubeOpts{}, []*corev1.Node{h100Node("n1", "a", 8)}, []*corev1.Pod{p}, sc, pvcOf("data", "csi"))
	c.client.PrependReactor("update", "persistentvolumeclaims", forbidden)
	c.client.PrependReactor("patch", "persistentvolumeclaims", forbidden)
	c.kubeCycle()
	if n := c.boundTo("p"); n != "" {
		t.Fatalf("p bound to %s although its claim could not be bound", n)
	}
	if c.b.BindCalls != 0 {
		t.Fatalf("%d pod bindings sent after the volume binding failed", c.b.BindCalls)
	}
	_ = c.pods.Delete(p)
	c.podsH.OnDelete(p)
	c.s.OnPodDelete(p)
	_ = c.pods.Add(withHostPort(kpod("next", 1, nil), 8080))
	c.kubeCycle()
	if n := c.boundTo("next"); n != "n1" {
		t.Errorf("next bound to %q (%s), want n1", n, msg(c.b, "next"))
	}
}

// TestKubeReview28AntiAffinityCounterSettles: the anti-affinity counter
// (Needs for every pod) returns to zero once the pods with a required
// anti-affinity are placed, bound, shown, finished and deleted, or placed
// and rolled back: a counter that stayed positive would make every later
// pod of the cluster pay for the checks; one that went negative would skip
// them.
func TestKubeReview28AntiAffinityCounterSettles(t *testing.T) {
	db := map[string]string{"app": "db"}
	var pods []*corev1.Pod
	for i := range 3 {
		pods = append(pods, antiAffine(kpod(fmt.Sprintf("db-%d", i), i, db), corev1.LabelHostname, db))
	}
	c := newKubeCluster(t, kubeOpts{}, []*corev1.Node{h100Node("n1", "a", 8), h100Node("n2", "a", 8)}, pods)
	c.kubeCycle() // db-0, db-1 bound; db-2 waits
	c.kubeCycle()
	plain := kpod("plain", 9, nil)
	if !c.kube.Needs(plain) {
		t.Fatal("with bound anti-affinity pods a plain pod needs no check")
	}
	// db-2 goes away pending; db-0 and db-1 finish, then are deleted.
	_ = c.pods.Delete(pods[2])
	c.podsH.OnDelete(pods[2])
	c.s.OnPodDelete(pods[2])
	for _, name := range []string{"db-0", "db-1"} {
		obj, _, _ := c.pods.GetByKey("default/" + name)
		old := obj.(*corev1.Pod)
		done := old.DeepCopy()
		done.Status.Phase = corev1.PodSucceeded
		_ = c.pods.Update(done)
		c.podsH.OnUpdate(old, done)
		_ = c.pods.Delete(done)
		c.podsH.OnDelete(done)
		c.s.OnPodDelete(done)
	}
	c.kubeCycle()
	if c.kube.Needs(plain) {
		t.Errorf("no anti-affinity pod is left, yet a plain pod still needs the checks (the counter stayed positive)")
	}
}

// TestKubeReview28ClaimsFailureAfterGateForgetsAssumption: placeWorkload
// calls kubeChecks.gate before allocateClaims; gate marks every pod of the
// workload as sent to binding. When the claims do not fit
// (allocateClaims fails: "resource claims do not fit the node placement
// chose") the pods are not sent, but end() forgets only the pods not marked
// sent: they stay assumed in kube-scheduler's cache with no binding and no
// informer event to confirm or forget them. Until the pod happens to be
// placed elsewhere or deleted, a pending pod holds its host port (its
// anti-affinity, its spread count) on that node. This replays
// placeWorkload's steps on the kube checks (a DRA allocator failing is what
// the harness lacks).
func TestKubeReview28ClaimsFailureAfterGateForgetsAssumption(t *testing.T) {
	p := withHostPort(kpod("p", 0, nil), 8080)
	c := newKubeCluster(t, kubeOpts{}, []*corev1.Node{h100Node("n1", "a", 8)}, []*corev1.Pod{p})
	ctx := t.Context()
	newChecks := func() *kubeChecks {
		return &kubeChecks{k: c.kube, ctx: ctx, logger: klog.FromContext(ctx), reserved: map[types.UID]placedPod{}, sent: map[types.UID]bool{}}
	}
	k := newChecks()
	pc, err := k.check(p)
	if err != nil || pc == nil {
		t.Fatalf("check: %v %v", pc, err)
	}
	if err := k.placed(p, "n1", pc); err != nil {
		t.Fatal(err)
	}
	w := &workload{key: "default/p", pods: []podInfo{{pod: p}}}
	volumes := k.gate(w)
	// allocateClaims failed: placeWorkload returns without binding.
	volumes.unreserveAll(ctx)
	k.end(nil) // no plan for the next cycle

	// The next cycle: another pod wants port 8080 on n1.
	q := withHostPort(kpod("q", 1, nil), 8080)
	k2 := newChecks()
	defer k2.end(nil)
	qc, err := k2.check(q)
	if err != nil {
		t.Fatal(err)
	}
	if ok, why := qc.Allows(ctx, "n1"); !ok {
		t.Errorf("q rejected on n1 (%v): p, never sent to binding, is still assumed there", why)
	}
}

// TestKubeReview28PodBindingFailsAfterVolumesBound: the volume gate
// passed (the claim is bound to n1's local PV), then the pod's binding
// fails. The pod goes back to pending with nothing left assumed or
// reserved, and the next cycle binds it on n1, where its volume now is.
func TestKubeReview28PodBindingFailsAfterVolumesBound(t *testing.T) {
	sc := storageClass("local", noProvisioner, storagev1.VolumeBindingWaitForFirstConsumer)
	pod := withHostPort(withClaim(kpod("p", 0, nil), "data"), 8080)
	nodes := []*corev1.Node{h100Node("n1", "a", 1), h100Node("n2", "a", 8)}
	c := newKubeCluster(t, kubeOpts{policy: "bestfit", pvController: true}, nodes, []*corev1.Pod{pod},
		sc, pvcOf("data", "local"), localPV("pv-n1", "n1", "local"), localPV("pv-n2", "n2", "local"))
	c.b.NextBindErr = schedulertest.ErrInjected
	c.kubeCycle()
	if n := c.boundTo("p"); n != "" {
		t.Fatalf("p bound to %s despite the injected failure", n)
	}
	claim, err := c.client.CoreV1().PersistentVolumeClaims("default").Get(t.Context(), "data", metav1.GetOptions{})
	if err != nil || claim.Spec.VolumeName == "" {
		t.Fatalf("claim not bound by the gate: %v %v", claim, err)
	}
	want := claim.Spec.VolumeName[len("pv-"):]
	c.s.bindFailed.clearBackoffs() // the back-off is tested elsewhere
	deadline := time.Now().Add(3 * time.Second)
	for c.boundTo("p") == "" && time.Now().Before(deadline) {
		c.kubeCycle()
		time.Sleep(20 * time.Millisecond)
	}
	if n := c.boundTo("p"); n != want {
		t.Errorf("p bound to %q (%s), want %s where its claim was bound", n, msg(c.b, "p"), want)
	}
}

// TestKubeReview28UnknownBindingHoldThenPlacedAgain: a binding whose
// outcome stays unknown keeps the pod assumed (in both the coordinator's
// books and kube-scheduler's cache) for bindUnknownHold; then both forget
// it, and the pod is placed again, without its own old assumption
// rejecting it (host port).
func TestKubeReview28UnknownBindingHoldThenPlacedAgain(t *testing.T) {
	p := withHostPort(kpod("p", 0, nil), 8080)
	c := newKubeCluster(t, kubeOpts{}, []*corev1.Node{h100Node("n1", "a", 8)}, []*corev1.Pod{p})
	clk := clocktesting.NewFakeClock(kubeEpoch.Add(time.Hour))
	c.s.clock = clk
	c.b.NextBindErr = fmt.Errorf("timeout: %w", binder.ErrBindingUnknown)
	c.kubeCycle()
	if n := c.boundTo("p"); n != "" {
		t.Fatalf("p bound to %s", n)
	}
	other := withHostPort(kpod("other", 1, nil), 8080)
	_ = c.pods.Add(other)
	c.kubeCycle()
	if n := c.boundTo("other"); n != "" {
		t.Fatalf("other bound to %s while p's binding outcome is unknown there", n)
	}
	_ = c.pods.Delete(other)
	c.podsH.OnDelete(other)
	c.s.OnPodDelete(other)
	clk.Step(bindUnknownHold + time.Second)
	c.s.bindFailed.clearBackoffs()
	c.kubeCycle()
	if n := c.boundTo("p"); n != "n1" {
		t.Errorf("p bound to %q (%s) after the hold, want n1", n, msg(c.b, "p"))
	}
}

// TestKubeReview28RestartAfterPreBind: the leader ran VolumeBinding's
// PreBind (the claim carries volume.kubernetes.io/selected-node: n2, and a
// static PV's claimRef names the other claim) and died before the pods'
// bindings. The new leader starts from the API objects only: it must place
// each pod where its half-bound volume is (bestfit alone picks n1) and
// complete the bindings.
func TestKubeReview28RestartAfterPreBind(t *testing.T) {
	csi := storageClass("csi", "csi.example.com", storagev1.VolumeBindingWaitForFirstConsumer)
	local := storageClass("local", noProvisioner, storagev1.VolumeBindingWaitForFirstConsumer)
	dyn := pvcOf("dyn", "csi")
	dyn.Annotations = map[string]string{"volume.kubernetes.io/selected-node": "n2"}
	static := pvcOf("static", "local")
	pv := localPV("pv-n2", "n2", "local")
	pv.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: "default", Name: "static", UID: static.UID}
	a := withClaim(kpod("a", 0, nil), "dyn")
	b := withClaim(kpod("b", 1, nil), "static")
	nodes := []*corev1.Node{h100Node("n1", "a", 2), h100Node("n2", "a", 8)}
	c := newKubeCluster(t, kubeOpts{policy: "bestfit", pvController: true}, nodes, []*corev1.Pod{a, b},
		csi, local, dyn, static, pv, localPV("pv-n1", "n1", "local"))
	deadline := time.Now().Add(5 * time.Second)
	for (c.boundTo("a") == "" || c.boundTo("b") == "") && time.Now().Before(deadline) {
		c.kubeCycle()
		c.s.bindFailed.clearBackoffs()
		time.Sleep(20 * time.Millisecond)
	}
	if n := c.boundTo("a"); n != "n2" {
		t.Errorf("a bound to %q (%s), want n2 (its claim's selected node)", n, msg(c.b, "a"))
	}
	if n := c.boundTo("b"); n != "n2" {
		t.Errorf("b bound to %q (%s), want n2 (the PV whose claimRef names its claim)", n, msg(c.b, "b"))
	}
}

// forbidden answers a write as an API server without the chart's RBAC does.
func forbidden(a k8stesting.Action) (bool, runtime.Object, error) {
	return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: a.GetResource().Resource}, "x", fmt.Errorf("RBAC: access denied"))
}

// TestKubeReview28ExistingAntiAffinityCostIsBounded: any pod of the cluster
// (a CPU-only pod of kube-scheduler's, in any namespace) with a required
// anti-affinity turns the checks on for every pending pod (Needs), and
// each check pays InterPodAffinity's existing anti-affinity count: every
// term of every such pod, matched against the pending pod. A tenant's few
// bound pods with thousands of terms each make every pending pod of every
// queue pay for them, in every cycle, on top of what placement costs: the
// pending pods that wait for GPUs (here the cluster is full) are tried again
// each cycle, and a pod that does not fit is never charged to the place
// budget.
func TestKubeReview28ExistingAntiAffinityCostIsBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("timing")
	}
	build := func() ([]*corev1.Node, []*corev1.Pod) {
		var nodes []*corev1.Node
		var pods []*corev1.Pod
		for i := range 50 {
			n := fmt.Sprintf("n%d", i)
			nodes = append(nodes, h100Node(n, "a", 8))
			// Each node's GPUs are taken.
			name := fmt.Sprintf("full-%d", i)
			pods = append(pods, admitted(builders.MakePod(name, "default").Queue("q").GPUs(8).CPU("1").UID(name).Obj(), n))
		}
		const hostile, terms = 50, 3000
		for i := range hostile {
			name := fmt.Sprintf("hostile-%d", i)
			p := builders.MakePod(name, "tenant").CPU("10m").UID(name).Obj()
			p.Spec.SchedulerName = "default-scheduler"
			p.Spec.NodeName = fmt.Sprintf("n%d", i%50)
			p.Status.Phase = corev1.PodRunning
			var ts []corev1.PodAffinityTerm
			for k := range terms {
				ts = append(ts, corev1.PodAffinityTerm{TopologyKey: corev1.LabelHostname,
					NamespaceSelector: &metav1.LabelSelector{},
					LabelSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
						{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: []string{fmt.Sprintf("nope-%d", k)}}}}})
			}
			p.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: ts}}
			pods = append(pods, p)
		}
		for i := range 200 {
			pods = append(pods, kpod(fmt.Sprintf("waiting-%d", i), i, nil))
		}
		return nodes, pods
	}
	cycleTime := func(o kubeOpts) time.Duration {
		nodes, pods := build()
		c := newKubeCluster(t, o, nodes, pods)
		start := time.Now()
		c.kubeCycle()
		return time.Since(start)
	}
	without := cycleTime(kubeOpts{noKube: true})
	with := cycleTime(kubeOpts{})
	t.Logf("a cycle of 200 waiting pods took %v without kube checks, %v with them (50 bound pods of 3,000 anti-affinity terms)", without, with)
	if with > 5*without+500*time.Millisecond {
		t.Errorf("the cycle took %v with kube checks against %v without: the checks of pods that wait for GPUs are paid again every cycle", with, without)
	}
}
