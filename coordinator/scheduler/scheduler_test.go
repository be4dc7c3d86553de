package scheduler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/coordinator/reservation"
	"github.com/gpufrac/gpufrac/coordinator/scheduler/schedulertest"
	"github.com/gpufrac/gpufrac/coordinator/state"
	"github.com/gpufrac/gpufrac/tests/builders"
)

type staticQueues []*v1alpha1.Queue

func (s staticQueues) Queues() ([]*v1alpha1.Queue, []InvalidQueue, error) { return s, nil, nil }

// cluster is a scheduler over fixed objects, bindings applied in memory.
type cluster struct {
	t      testing.TB
	s      *Scheduler
	b      *schedulertest.Binder
	pods   cache.Indexer
	nodes  cache.Indexer
	policy string
}

func newCluster(t testing.TB, policy string, nodes []*corev1.Node, queues []*v1alpha1.Queue, pods ...*corev1.Pod) *cluster {
	t.Helper()
	return newClusterWith(t, Options{Policy: policy, BindWorkers: 1}, Deps{Queues: staticQueues(queues)}, nodes, pods...)
}

// newClusterWith is a scheduler of opts over nodes and pods given as data,
// with the fake binder as Binder, Evictor and Releaser; deps gives the rest
// (queues, clock, reservation manager, registry).
func newClusterWith(t testing.TB, opts Options, deps Deps, nodes []*corev1.Node, pods ...*corev1.Pod) *cluster {
	t.Helper()
	c := &cluster{t: t, b: schedulertest.NewBinder()}
	c.pods = newFeedStore(func(o any) { c.s.OnPod(o) }, func(old, o any) { c.s.OnPodUpdate(old, o, changedBeyondVersion(old, o)) }, func(o any) { c.s.OnPodDelete(o) })
	c.nodes = newFeedStore(func(o any) { c.s.OnNode(o) }, func(old, o any) { c.s.OnNodeUpdate(old, o, changedBeyondVersion(old, o)) }, func(o any) { c.s.OnNodeDelete(o) })
	deps.Pods, deps.Nodes = corelisters.NewPodLister(c.pods), corelisters.NewNodeLister(c.nodes)
	deps.Binder, deps.Evictor, deps.Releaser = c.b, c.b, c.b
	s, err := New(opts, deps)
	if err != nil {
		t.Fatal(err)
	}
	c.s = s
	for _, n := range nodes {
		_ = c.nodes.Add(n)
	}
	for _, p := range pods {
		_ = c.pods.Add(p)
	}
	return c
}

// feedStore is an indexer that hands each change to the scheduler's
// handlers, as an informer does: the listers and the scheduler's cache
// see the same objects. A test changes an object by Update with a new
// one (or the same one changed), never in place alone.
type feedStore struct {
	cache.Indexer
	add    func(obj any)
	update func(old, obj any)
	del    func(obj any)
}

// changedBeyondVersion is the coordinator's informers' changed (app's
// transform.go) for the tests' objects, which are not trimmed: whether an
// update changed more than the resourceVersion.
func changedBeyondVersion(old, cur any) bool {
	o, ok1 := old.(metav1.Object)
	c, ok2 := cur.(metav1.Object)
	if !ok1 || !ok2 {
		return true
	}
	a, b := o.(runtime.Object).DeepCopyObject().(metav1.Object), c.(runtime.Object).DeepCopyObject().(metav1.Object)
	a.SetResourceVersion("")
	b.SetResourceVersion("")
	return !equality.Semantic.DeepEqual(a, b)
}

func newFeedStore(add func(any), update func(old, obj any), del func(any)) *feedStore {
	return &feedStore{Indexer: cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{}), add: add, update: update, del: del}
}

// Add is Update: an object under a key already held replaces it, as an
// informer's relist does.
func (f *feedStore) Add(obj any) error { return f.Update(obj) }

func (f *feedStore) Update(obj any) error {
	old, exists, err := f.Indexer.Get(obj)
	if err != nil {
		return err
	}
	if err := f.Indexer.Update(obj); err != nil {
		return err
	}
	if exists {
		f.update(old, obj)
	} else {
		f.add(obj)
	}
	return nil
}

func (f *feedStore) Delete(obj any) error {
	old, exists, err := f.Indexer.Get(obj)
	if err != nil || !exists {
		return err
	}
	if err := f.Indexer.Delete(obj); err != nil {
		return err
	}
	f.del(old)
	return nil
}

// cycle runs one cycle, then applies the queued bindings to the pods, as the
// API server and informers would.
func (c *cluster) cycle() Result {
	c.t.Helper()
	res, err := c.s.Cycle(c.t.Context())
	if err != nil {
		c.t.Fatal(err)
	}
	c.applyBinds()
	return res
}

// applyBinds runs the queued bindings and applies them to the pods, as the
// API server and informers would.
func (c *cluster) applyBinds() {
	c.t.Helper()
	for {
		select {
		case task := <-c.s.binds:
			if err := c.s.runBind(c.t.Context(), task); err != nil {
				continue // the scheduler forgot the assumption, as after a failed binding in Run
			}
			p := task.pod.DeepCopy()
			p.Spec.NodeName = task.node
			if p.Annotations == nil {
				p.Annotations = map[string]string{}
			}
			for k, v := range task.annotations {
				p.Annotations[k] = v
			}
			_ = c.pods.Update(p)
			c.s.OnPod(p)
		default:
			return
		}
	}
}

func (c *cluster) boundTo(pod string) string { return c.b.BoundTo(pod) }

func (c *cluster) reason(pod string) string {
	r, _ := c.b.Reason(pod)
	return r
}

// h100Node is a Ready node with n GPUs published in fraction mode.
func h100Node(name, pool string, n int) *corev1.Node {
	node := builders.MakeNode(name).GPUs(n).FractionUnits(n * 100).CPU("128").Memory("1Ti").Pool(pool).Product("NVIDIA-H100-80GB-HBM3").Obj()
	inv := make([]api.GPUInfo, n)
	for i := range inv {
		inv[i] = api.GPUInfo{UUID: fmt.Sprintf("GPU-%s-%d", name, i), Index: i, Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81920, Mode: "fraction", Healthy: true}
	}
	s, _ := api.EncodeInventory(inv)
	if node.Annotations == nil {
		node.Annotations = map[string]string{}
	}
	node.Annotations[api.AnnotationGPUInventory] = s
	return node
}

func queueOf(name, gpus string) *v1alpha1.Queue {
	return builders.MakeQueue(name).GPUQuota(gpus).Namespaces("default").Obj()
}

func gpuPod(name, queue string, n int) *corev1.Pod {
	return builders.MakePod(name, "default").Queue(queue).GPUs(n).CPU("1").UID(name).Obj()
}

func fracPod(name, queue string, pct int) *corev1.Pod {
	return builders.MakePod(name, "default").Queue(queue).Fraction(pct).CPU("1").UID(name).Obj()
}

// admitted makes p a Running pod the coordinator bound to node in an
// earlier cycle (or before a restart): its binding recorded the queue.
func admitted(p *corev1.Pod, node string) *corev1.Pod {
	p.Spec.NodeName = node
	p.Status.Phase = corev1.PodRunning
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	p.Annotations[api.AnnotationAdmittedQueue] = p.Labels[api.LabelQueue]
	return p
}

func TestFractionsGetAGPUAndNeverOverlap(t *testing.T) {
	c := newCluster(t, "binpack", []*corev1.Node{h100Node("n1", "a", 2)}, []*v1alpha1.Queue{queueOf("q", "8")},
		fracPod("sixty-a", "q", 60), fracPod("sixty-b", "q", 60), fracPod("thirty", "q", 30), fracPod("ten", "q", 10))
	c.cycle()
	gpu := map[string]string{}
	for _, p := range []string{"sixty-a", "sixty-b", "thirty", "ten"} {
		if c.boundTo(p) != "n1" {
			t.Fatalf("%s bound to %q (reason %s: %s)", p, c.boundTo(p), c.reason(p), c.b.Messages[p])
		}
		gpu[p] = c.b.Annotations[p][api.AnnotationGPU]
		if !strings.HasPrefix(gpu[p], "GPU-n1-") {
			t.Fatalf("%s annotated gpu %q", p, gpu[p])
		}
	}
	if gpu["sixty-a"] == gpu["sixty-b"] {
		t.Errorf("two 60%% fractions share %s", gpu["sixty-a"])
	}
	used := map[string]int{}
	for p, g := range gpu {
		used[g] += map[string]int{"sixty-a": 60, "sixty-b": 60, "thirty": 30, "ten": 10}[p]
	}
	for g, u := range used {
		if u > 100 {
			t.Errorf("GPU %s over-committed: %d%%", g, u)
		}
	}
}

func TestTenTensFillOneGPUUnderBinpack(t *testing.T) {
	var pods []*corev1.Pod
	for i := 0; i < 10; i++ {
		pods = append(pods, fracPod(fmt.Sprintf("ten-%d", i), "q", 10))
	}
	c := newCluster(t, "binpack", []*corev1.Node{h100Node("n1", "a", 8)}, []*v1alpha1.Queue{queueOf("q", "8")}, pods...)
	c.cycle()
	gpus := map[string]bool{}
	for _, p := range pods {
		gpus[c.b.Annotations[p.Name][api.AnnotationGPU]] = true
	}
	if len(gpus) != 1 {
		t.Errorf("ten 10%% fractions used %d GPUs, want 1: %v", len(gpus), gpus)
	}
}

func TestOverQuotaIsNeverUnschedulable(t *testing.T) {
	// One 4-GPU node, queue deserves 2 GPUs; a second queue deserves the rest.
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 4)},
		[]*v1alpha1.Queue{queueOf("small", "2"), queueOf("other", "2")},
		gpuPod("p1", "small", 2), gpuPod("p2", "small", 2), gpuPod("p3", "small", 2))
	c.cycle()
	if c.boundTo("p1") == "" {
		t.Fatalf("p1 within quota not bound: %s", c.b.Messages["p1"])
	}
	// p2 borrows the idle queue's share (preemptible, within fair share); p3 has no room at all.
	if r := c.reason("p3"); r != api.ReasonOverQuota && r != api.ReasonOverLimit {
		t.Errorf("p3 reason %q (%s), want OverQuota", r, c.b.Messages["p3"])
	}
	for p, r := range c.b.Reasons {
		if r == corev1.PodReasonUnschedulable || r == api.ReasonNoCapacity && p == "p3" {
			t.Errorf("%s got reason %s", p, r)
		}
	}
}

func TestGangAllOrNothingInOnePool(t *testing.T) {
	nodes := []*corev1.Node{
		h100Node("a1", "pool-a", 4), h100Node("a2", "pool-a", 4), h100Node("a3", "pool-a", 4), h100Node("a4", "pool-a", 4),
		h100Node("b1", "pool-b", 8), h100Node("b2", "pool-b", 4),
	}
	var gang []*corev1.Pod
	for i := 0; i < 16; i++ {
		gang = append(gang, builders.MakePod(fmt.Sprintf("g-%02d", i), "default").Queue("q").GPUs(1).CPU("1").
			PodGroup("train").MinMember(16).UID(fmt.Sprintf("g-%02d", i)).Obj())
	}
	c := newCluster(t, "", nodes, []*v1alpha1.Queue{queueOf("q", "32")}, gang...)
	c.cycle()
	pools := map[string]bool{}
	for _, p := range gang {
		n := c.boundTo(p.Name)
		if n == "" {
			t.Fatalf("%s not bound: %s %s", p.Name, c.reason(p.Name), c.b.Messages[p.Name])
		}
		pools[n[:1]] = true
	}
	if len(pools) != 1 || !pools["a"] {
		t.Errorf("gang spread over pools %v, want only pool-a (the only one with 16 GPUs)", pools)
	}
}

func TestGangTooBigBindsNothing(t *testing.T) {
	var gang []*corev1.Pod
	for i := 0; i < 6; i++ {
		gang = append(gang, builders.MakePod(fmt.Sprintf("g-%d", i), "default").Queue("q").GPUs(1).
			PodGroup("big").MinMember(6).UID(fmt.Sprintf("g-%d", i)).Obj())
	}
	c := newCluster(t, "", []*corev1.Node{h100Node("a1", "a", 4), h100Node("b1", "b", 4)}, []*v1alpha1.Queue{queueOf("q", "8")}, gang...)
	c.s.opts.ElasticPools = true // pools may grow: the gang waits (with static pools it is InvalidRequest)
	c.cycle()
	for _, p := range gang {
		if n := c.boundTo(p.Name); n != "" {
			t.Errorf("%s bound to %s although the gang fits no single pool", p.Name, n)
		}
		if r := c.reason(p.Name); r != api.ReasonNoCapacity {
			t.Errorf("%s reason %q, want NoCapacity", p.Name, r)
		}
	}
}

func TestGangLargerThanEveryPoolIsInvalid(t *testing.T) {
	var gang []*corev1.Pod
	for i := 0; i < 10; i++ {
		gang = append(gang, builders.MakePod(fmt.Sprintf("g-%d", i), "default").Queue("q").GPUs(1).
			PodGroup("huge").MinMember(10).UID(fmt.Sprintf("g-%d", i)).Obj())
	}
	c := newCluster(t, "", []*corev1.Node{h100Node("a1", "a", 8), h100Node("b1", "b", 8)}, []*v1alpha1.Queue{queueOf("q", "16")}, gang...)
	c.cycle()
	for _, p := range gang {
		if r := c.reason(p.Name); r != api.ReasonInvalidRequest || !strings.Contains(c.b.Messages[p.Name], "largest node pool has 8") {
			t.Errorf("%s: reason %q msg %q, want InvalidRequest naming the largest pool", p.Name, r, c.b.Messages[p.Name])
		}
	}
	// With pools that can grow (Karpenter), the gang waits for capacity instead.
	c2 := newCluster(t, "", []*corev1.Node{h100Node("a1", "a", 8)}, []*v1alpha1.Queue{queueOf("q", "16")}, gang...)
	c2.s.opts.ElasticPools = true
	c2.cycle()
	if r := c2.reason("g-0"); r != api.ReasonNoCapacity {
		t.Errorf("elastic pools: reason %q, want NoCapacity", r)
	}
}

func TestIncompleteGangWaits(t *testing.T) {
	var gang []*corev1.Pod
	for i := 0; i < 3; i++ {
		gang = append(gang, builders.MakePod(fmt.Sprintf("g-%d", i), "default").Queue("q").GPUs(1).
			PodGroup("g").MinMember(4).UID(fmt.Sprintf("g-%d", i)).Obj())
	}
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 8)}, []*v1alpha1.Queue{queueOf("q", "8")}, gang...)
	c.cycle()
	for _, p := range gang {
		if c.boundTo(p.Name) != "" || c.reason(p.Name) != api.ReasonGangIncomplete {
			t.Errorf("%s bound=%q reason=%q, want pending GangIncomplete", p.Name, c.boundTo(p.Name), c.reason(p.Name))
		}
	}
	// The fourth member arrives: the whole gang binds.
	last := builders.MakePod("g-3", "default").Queue("q").GPUs(1).PodGroup("g").MinMember(4).UID("g-3").Obj()
	_ = c.pods.Add(last)
	c.cycle()
	for _, n := range []string{"g-0", "g-1", "g-2", "g-3"} {
		if c.boundTo(n) == "" {
			t.Errorf("%s not bound once the gang is complete", n)
		}
	}
}

func TestInvalidRequests(t *testing.T) {
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 8)}, []*v1alpha1.Queue{queueOf("q", "8")},
		builders.MakePod("no-queue", "default").GPUs(1).UID("no-queue").Obj(),
		builders.MakePod("unknown-queue", "default").Queue("nope").GPUs(1).UID("unknown-queue").Obj(),
		builders.MakePod("too-big", "default").Queue("q").Fraction(150).UID("too-big").Obj(),
		builders.MakePod("both", "default").Queue("q").Fraction(30).GPUs(1).UID("both").Obj(),
		builders.MakePod("env", "default").Queue("q").GPUs(1).Env(api.EnvVisibleDevices, "all").UID("env").Obj(),
		builders.MakePod("init-frac", "default").Queue("q").InitContainer("setup").Fraction(20).UID("init-frac").Obj(),
	)
	c.cycle()
	for _, p := range []string{"no-queue", "unknown-queue", "too-big", "both", "env", "init-frac"} {
		if c.boundTo(p) != "" || c.reason(p) != api.ReasonInvalidRequest || c.b.Messages[p] == "" {
			t.Errorf("%s: bound=%q reason=%q msg=%q, want InvalidRequest with a message", p, c.boundTo(p), c.reason(p), c.b.Messages[p])
		}
	}
}

func TestNonPreemptibleGetsDoNotDisrupt(t *testing.T) {
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 8)}, []*v1alpha1.Queue{queueOf("q", "8")},
		builders.MakePod("np", "default").Queue("q").GPUs(1).Preemptible(false).UID("np").Obj(),
		builders.MakePod("p", "default").Queue("q").GPUs(1).UID("p").Obj())
	c.cycle()
	if got := c.b.Annotations["np"][api.AnnotationDoNotDisrupt]; got != "true" {
		t.Errorf("non-preemptible pod annotations %v, want do-not-disrupt", c.b.Annotations["np"])
	}
	if _, set := c.b.Annotations["p"][api.AnnotationDoNotDisrupt]; set {
		t.Errorf("preemptible pod got do-not-disrupt")
	}
}

func TestReclaimReturnsAStarvedQueueItsQuota(t *testing.T) {
	// team-b borrowed all 4 GPUs while team-a was idle; team-a (deserves 2) now asks for 2.
	var pods []*corev1.Pod
	for i := 0; i < 4; i++ {
		pods = append(pods, admitted(gpuPod(fmt.Sprintf("b-%d", i), "team-b", 1), "n1"))
	}
	pods = append(pods, gpuPod("a-0", "team-a", 2))
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 4)}, []*v1alpha1.Queue{queueOf("team-a", "2"), queueOf("team-b", "2")}, pods...)
	c.cycle()
	sort.Strings(c.b.Evicted)
	if len(c.b.Evicted) != 2 {
		t.Fatalf("evicted %v, want two team-b pods", c.b.Evicted)
	}
	for _, e := range c.b.Evicted {
		if !strings.HasPrefix(e, "b-") {
			t.Errorf("evicted %s, not a team-b pod", e)
		}
	}
	if r := c.reason("a-0"); r != api.ReasonNoCapacity || !strings.Contains(c.b.Messages["a-0"], "reclaiming") {
		t.Errorf("a-0 reason %q msg %q", r, c.b.Messages["a-0"])
	}
	// While victims run, nothing more is evicted.
	c.cycle()
	if len(c.b.Evicted) != 2 {
		t.Errorf("second cycle evicted more: %v", c.b.Evicted)
	}
	// Victims gone: team-a's pod binds.
	for _, e := range c.b.Evicted {
		obj, _, _ := c.pods.GetByKey("default/" + e)
		_ = c.pods.Delete(obj)
		c.s.OnPodDelete(obj)
	}
	c.cycle()
	if c.boundTo("a-0") != "n1" {
		t.Errorf("a-0 not bound after reclaim: %s %s", c.reason("a-0"), c.b.Messages["a-0"])
	}
}

type recordingStatus struct {
	mu sync.Mutex
	st map[string]v1alpha1.QueueStatus
	n  int
}

func (r *recordingStatus) WriteQueueStatus(_ context.Context, name string, st v1alpha1.QueueStatus) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.st[name] = st
	r.n++
	return nil
}

func TestQueueStatusIsPublished(t *testing.T) {
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 2)}, []*v1alpha1.Queue{queueOf("q", "1"), queueOf("idle", "1")},
		gpuPod("p1", "q", 1), fracPod("f1", "q", 50),
		builders.MakePod("np", "default").Queue("q").GPUs(1).Preemptible(false).UID("np").Obj())
	rec := &recordingStatus{st: map[string]v1alpha1.QueueStatus{}}
	c.s.deps.Status = rec
	c.cycle()
	c.cycle() // bound pods now come from the "informer"
	st := rec.st["q"]
	if got := st.Allocated["gpu"]; got.MilliValue() != 1500 {
		t.Errorf("allocated gpu = %s, want 1.5 (p1 + f1); status %+v", got.String(), st)
	}
	if got := st.PendingGangs; got != 1 {
		t.Errorf("pendingGangs = %d, want 1 (np: no whole GPU left)", got)
	}
	if got := st.Requested["gpu"]; got.MilliValue() != 1000 {
		t.Errorf("requested gpu = %s, want 1", got.String())
	}
	writes := rec.n
	c.cycle()
	if rec.n != writes {
		t.Errorf("an unchanged status was written again (%d -> %d writes)", writes, rec.n)
	}
}

// fakeReserver creates reservation pods straight into the cluster's pods, as
// bound and (when admit) already given their GPU by the node agent.
type fakeReserver struct {
	c           *cluster
	admit       bool
	lag         bool // the informer does not show the pods created
	ensureErr   int  // the next ensureErr Ensure calls fail
	ensured     []string
	attempts    []int
	removed     int
	removedPods []string
}

func (f *fakeReserver) Ensure(_ context.Context, node, gpu string, attempt int) error {
	f.ensured = append(f.ensured, node+"/"+gpu)
	f.attempts = append(f.attempts, attempt)
	if f.ensureErr > 0 {
		f.ensureErr--
		return errors.New("reservation create refused (injected)")
	}
	p := reservation.PodAt(node, gpu, attempt, reservation.DefaultOptions())
	p.UID = types.UID(p.Name)
	if f.admit {
		p.Annotations[api.AnnotationReservedGPU] = gpu
	}
	if f.lag {
		return nil
	}
	return f.c.pods.Add(p)
}

func (f *fakeReserver) Reconcile(_ context.Context, rs map[state.NodeGPU]*state.Reservation, wanted map[state.NodeGPU]bool, _ map[types.UID]bool) int {
	for k, r := range rs {
		if r.Pod != nil && r.Fractions == 0 && !wanted[k] {
			_ = f.c.pods.Delete(r.Pod)
			f.removed++
		}
	}
	return f.removed
}

func (f *fakeReserver) Removing() map[types.UID]bool { return nil }

func (f *fakeReserver) RemoveFailed(_ context.Context, pods []*corev1.Pod) int {
	for _, p := range pods {
		_ = f.c.pods.Delete(p)
		f.removedPods = append(f.removedPods, p.Name)
	}
	return len(pods)
}

func TestFractionsWaitForTheirReservation(t *testing.T) {
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 2)}, []*v1alpha1.Queue{queueOf("q", "8")},
		fracPod("f1", "q", 40), fracPod("f2", "q", 40))
	r := &fakeReserver{c: c}
	c.s.deps.Reserver = r
	c.cycle()
	if len(r.ensured) != 1 {
		t.Fatalf("reservations created %v, want one for the GPU both 40%% pods share", r.ensured)
	}
	for _, p := range []string{"f1", "f2"} {
		if c.boundTo(p) != "" || c.reason(p) != api.ReasonReservationPending {
			t.Errorf("%s bound=%q reason=%q, want pending ReservationPending", p, c.boundTo(p), c.reason(p))
		}
	}
	// A whole-GPU pod arriving now must not take the reserved GPU.
	_ = c.pods.Add(gpuPod("whole", "q", 1))
	c.cycle()
	if len(r.ensured) != 1 {
		t.Errorf("a second reservation was created while the first waits: %v", r.ensured)
	}
	// The node agent writes the GPU the kubelet gave the reservation: fractions bind there.
	obj, _, _ := c.pods.GetByKey(api.ReservationNamespace + "/" + reservation.Name("n1", strings.TrimPrefix(r.ensured[0], "n1/")))
	res := obj.(*corev1.Pod).DeepCopy()
	res.Annotations[api.AnnotationReservedGPU] = res.Annotations[api.AnnotationGPU]
	_ = c.pods.Update(res)
	c.cycle()
	for _, p := range []string{"f1", "f2"} {
		if got := c.b.Annotations[p][api.AnnotationGPU]; got != res.Annotations[api.AnnotationReservedGPU] {
			t.Errorf("%s bound with GPU %q, want the reserved %s", p, got, res.Annotations[api.AnnotationReservedGPU])
		}
	}
	if c.boundTo("whole") == "" {
		t.Errorf("the whole-GPU pod did not get the other GPU: %s", c.b.Messages["whole"])
	}
	// The fractions end: the reservation goes (the fake removes at once; the real one after its grace).
	for _, p := range []string{"f1", "f2"} {
		obj, _, _ := c.pods.GetByKey("default/" + p)
		q := obj.(*corev1.Pod).DeepCopy()
		q.Status.Phase = corev1.PodSucceeded
		_ = c.pods.Update(q)
	}
	c.cycle()
	if r.removed != 1 {
		t.Errorf("reservations removed = %d, want 1", r.removed)
	}
}

// A node Karpenter brings is placed on NewNodeSettle after it lost its
// karpenter.sh/unregistered taint (NoExecute; a pod bound the moment it goes
// may meet a taint manager that still sees it), however long ago it was
// created; nodes the first cycle finds are placed on at once.
func TestNewNodeSettlesOnceItsTaintIsGone(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC))
	c := settlingCluster(t, clk, h100Node("old", "a", 1))
	c.expectBound(clk, 0, "old", "a node the first cycle found")

	c = settlingCluster(t, clk, h100Node("old", "a", 1))
	_ = c.pods.Add(admitted(gpuPod("busy", "q", 1), "old"))
	c.expectBound(clk, 0, "", "old is full")
	fresh := c.addUnregistered(clk)
	c.expectBound(clk, time.Second, "", "new is not registered")
	c.expectBound(clk, 5*time.Second, "", "new is not registered, 6 s old")
	c.register(fresh)
	c.expectBound(clk, 0, "", "the moment its taint went")
	c.expectBound(clk, 2*time.Second, "", "2 s after its taint went, within NewNodeSettle")
	select { // wake-ups of the cycles so far
	case <-c.s.wake:
	default:
	}
	clk.Step(time.Second)
	select {
	case <-c.s.wake:
	default:
		t.Fatal("no wake-up the moment new settled: it would wait for the next tick")
	}
	c.expectBound(clk, 0, "new", "once it settled")
}

// A coordinator that starts (restarted, or a new leader) while a node
// settles keeps the settle: it never saw the node's NoExecute taint go, but
// the node's records say when it became usable (Karpenter's registration of
// it, its Ready condition, its creation), kept by the API to the second, so
// each counts as the end of its second. Before, the first cycle bound to
// every node it found at once, and a pod bound the moment the taint went
// could meet a taint manager that still saw it (kubernetes#119862).
func TestRestartKeepsTheSettleOfANodeJustRegistered(t *testing.T) {
	now := time.Date(2026, 11, 24, 12, 0, 0, int(400*time.Millisecond), time.UTC)
	shown := func(ago time.Duration) time.Time { return now.Add(-ago).Truncate(time.Second) } // as the API keeps it
	for _, tc := range []struct {
		name       string
		registered time.Duration // NodeClaim Registered this long ago; 0: no NodeClaim
		ready      time.Duration // node Ready this long ago; 0: no time recorded
		created    time.Duration // node created this long ago; 0: no time recorded
		left       time.Duration // settle left at the first cycle; 0: bound at once
	}{
		{name: "registered 100 ms ago", registered: 100 * time.Millisecond, ready: time.Hour, created: time.Hour, left: 3 * time.Second},
		{name: "registered 2.5 s ago: 600 ms left (its second counted whole)", registered: 2500 * time.Millisecond, left: 600 * time.Millisecond},
		{name: "Ready 100 ms ago", ready: 100 * time.Millisecond, left: 3 * time.Second},
		{name: "created 100 ms ago", created: 100 * time.Millisecond, left: 3 * time.Second},
		{name: "registered a minute ago", registered: time.Minute, ready: time.Minute, created: time.Minute},
		// Karpenter's clock an hour ahead of the coordinator's: no longer
		// than a settle from the moment the node is first seen, never held.
		{name: "registered an hour ahead (clock skew)", registered: -time.Hour, ready: time.Minute, created: time.Minute, left: 3 * time.Second},
		{name: "nothing recorded, the node's registration not shown: settles from now", left: 3 * time.Second},
		{
			// Karpenter removed the unregistered taint but its NodeClaim's
			// Registered condition is not written yet (or the claim
			// informer listed before it was): created and Ready long ago.
			name: "created and Ready a minute ago, the registration not shown: settles from now", ready: time.Minute, created: time.Minute, left: 3 * time.Second,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(now)
			fresh := h100Node("new", "a", 1)
			if tc.ready > 0 {
				fresh.Status.Conditions[0].LastTransitionTime = metav1.NewTime(shown(tc.ready))
			}
			if tc.created > 0 {
				fresh.CreationTimestamp = metav1.NewTime(shown(tc.created))
			}
			registered := func(node string) time.Time {
				if node != "new" || tc.registered == 0 {
					return time.Time{}
				}
				return shown(tc.registered)
			}
			c := newClusterWith(t, Options{BindWorkers: 1, NewNodeSettle: 3 * time.Second},
				Deps{Queues: staticQueues{queueOf("q", "8")}, Clock: clk, NodeRegistered: registered},
				[]*corev1.Node{h100Node("old", "a", 1), fresh}, gpuPod("w", "q", 1), admitted(gpuPod("busy", "q", 1), "old"))
			if tc.left == 0 {
				c.expectBound(clk, 0, "new", "the first cycle, the node usable long ago")
				return
			}
			c.expectBound(clk, 0, "", "the first cycle, within the node's settle")
			c.expectBound(clk, tc.left-100*time.Millisecond, "", "100 ms before the node settled")
			c.expectBound(clk, 100*time.Millisecond, "new", "once the node settled")
		})
	}
}

// Fractions placed on a node that settles have their reservation made
// while it settles (a reservation pod tolerates every taint: the taint
// manager never deletes it) and are bound the moment it settled, on the
// reserved GPU, with no reservation asked for again: before, the
// reservation was asked for only then, and the fractions waited for the
// kubelet's admission on top of the settle.
func TestFractionsReserveWhileTheirNodeSettles(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC))
	c := settlingCluster(t, clk, h100Node("old", "a", 1))
	_ = c.pods.Delete(gpuPod("w", "q", 1))
	_ = c.pods.Add(admitted(gpuPod("busy", "q", 1), "old"))
	r := &fakeReserver{c: c, admit: true}
	c.s.deps.Reserver = r
	c.cycle()
	fresh := c.addUnregistered(clk)
	_ = c.pods.Add(fracPod("f", "q", 40))
	clk.Step(time.Second)
	c.cycle()
	if len(r.ensured) != 0 || c.boundTo("f") != "" {
		t.Fatalf("while new is not registered: reservations %v, f bound to %q; want none", r.ensured, c.boundTo("f"))
	}
	c.register(fresh)
	c.cycle()
	if want := []string{"new/GPU-new-0"}; !slices.Equal(r.ensured, want) {
		t.Fatalf("the moment new's taint went: reservations %v, want %v (made while it settles)", r.ensured, want)
	}
	clk.Step(time.Second)
	c.cycle()
	if n := c.boundTo("f"); n != "" {
		t.Fatalf("f bound to %s 1 s after new's taint went, within NewNodeSettle", n)
	}
	clk.Step(2 * time.Second)
	c.cycle()
	if n, gpu := c.boundTo("f"), c.b.Annotations["f"][api.AnnotationGPU]; n != "new" || gpu != "GPU-new-0" {
		t.Fatalf("once new settled: f bound to %q GPU %q, want new GPU-new-0 (its reservation's)", n, gpu)
	}
	if len(r.ensured) != 1 {
		t.Errorf("reservations %v: one was asked for again", r.ensured)
	}
}

// A pod placed on a node that settles is bound there only once it settled:
// a taint put on the node meanwhile (an admin's NoExecute, Karpenter's
// karpenter.sh/disrupted) must be honoured then, as a fresh placement would.
// Bound by the plan made before, a pod that does not tolerate a NoExecute
// taint is deleted by the taint manager the moment it lands: the very loss
// the settle is there to prevent.
func TestPlanOnASettlingNodeHonoursATaintPutMeanwhile(t *testing.T) {
	for _, tc := range []struct {
		name      string
		effect    corev1.TaintEffect
		tolerates bool
		want      string
	}{
		{"NoExecute", corev1.TaintEffectNoExecute, false, ""},
		{"NoSchedule", corev1.TaintEffectNoSchedule, false, ""},
		{"NoExecute tolerated", corev1.TaintEffectNoExecute, true, "new"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC))
			c := settlingCluster(t, clk, h100Node("old", "a", 1))
			if tc.tolerates {
				w := gpuPod("w", "q", 1)
				w.Spec.Tolerations = []corev1.Toleration{{Key: "maintenance", Operator: corev1.TolerationOpExists}}
				_ = c.pods.Update(w)
			}
			registered := c.heldOnNew(clk)
			tainted := registered.DeepCopy()
			tainted.Spec.Taints = []corev1.Taint{{Key: "maintenance", Effect: tc.effect}}
			_ = c.nodes.Update(tainted)
			c.expectBound(clk, time.Second, "", "tainted, still settling")
			c.expectBound(clk, 3*time.Second, tc.want, "once new settled, tainted "+string(tc.effect))
		})
	}
}

// A workload held on a settling node is bound once the node settled only
// when the bind queue has room, like every other: its plan lets it pass the
// queue's check (a plan waiting for reservations must stay wanted), but a
// cycle never waits for the bind workers. Before, a full queue at that
// moment blocked the cycle in the send until the workers made room.
func TestHeldWorkloadWaitsForRoomInTheBindQueue(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC))
	c := settlingCluster(t, clk, h100Node("old", "a", 1))
	c.heldOnNew(clk)
	// Other pods fill the bind queue when new settles.
	c.s.binds = make(chan bindTask, 1)
	c.s.binds <- bindTask{pod: gpuPod("other", "q", 1), node: "old"}
	clk.Step(3 * time.Second)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	res, err := c.s.Cycle(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ctx.Err() != nil {
		t.Fatal("the cycle waited for room in the bind queue")
	}
	if res.Pending[ReasonWaitingToBind] != 1 || c.boundTo("w") != "" {
		t.Fatalf("queue full: pending %v, w bound to %q; want w WaitingToBind", res.Pending, c.boundTo("w"))
	}
	<-c.s.binds // the workers bound the other pod
	c.expectBound(clk, 0, "new", "room in the bind queue")
}

// addUnregistered adds node new (one GPU) as Karpenter brings it: created
// now, tainted karpenter.sh/unregistered (NoExecute) until it registers.
func (c *cluster) addUnregistered(clk *clocktesting.FakeClock) *corev1.Node {
	fresh := h100Node("new", "a", 1)
	fresh.CreationTimestamp = metav1.NewTime(clk.Now())
	fresh.Spec.Taints = []corev1.Taint{{Key: "karpenter.sh/unregistered", Effect: corev1.TaintEffectNoExecute}}
	_ = c.nodes.Add(fresh)
	return fresh
}

// register removes n's taints, as Karpenter does when n registers, and
// returns the node as updated.
func (c *cluster) register(n *corev1.Node) *corev1.Node {
	registered := n.DeepCopy()
	registered.Spec.Taints = nil
	_ = c.nodes.Update(registered)
	return registered
}

// heldOnNew fills node old of a settlingCluster, brings node new as
// Karpenter does (tainted karpenter.sh/unregistered, then registered) and
// runs the cycle that places w there while new settles. It returns new.
func (c *cluster) heldOnNew(clk *clocktesting.FakeClock) *corev1.Node {
	c.t.Helper()
	_ = c.pods.Add(admitted(gpuPod("busy", "q", 1), "old"))
	c.expectBound(clk, 0, "", "old is full")
	fresh := c.addUnregistered(clk)
	c.expectBound(clk, time.Second, "", "new is not registered")
	registered := c.register(fresh)
	c.expectBound(clk, 0, "", "the moment its taint went")
	if _, planned := c.s.plans["w"]; !planned {
		c.t.Fatal("w was not placed on new while it settles")
	}
	return registered
}

// A node consolidation gives back (its gpufrac.io/draining taint removed)
// settles like a new node: placeholders of earlier versions, which
// kube-scheduler binds, may be pending for its free GPUs; the coordinator
// binds nothing there for NewNodeSettle, so it never races kube-scheduler
// for the same GPU.
func TestReturnedNodeSettlesLikeANewOne(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC))
	back := drainedNode("back", clk.Now().Add(time.Hour))
	c := settlingCluster(t, clk, back)
	c.expectBound(clk, 0, "", "draining: no room")
	untainted := back.DeepCopy()
	untainted.Spec.Taints = nil
	_ = c.nodes.Update(untainted)
	c.expectBound(clk, time.Second, "", "1 s after its drain ended, within NewNodeSettle")
	c.expectBound(clk, 3*time.Second, "back", "once the returned node settled")
}

// A node given back stays out of the snapshot for its whole settle, even
// when it loses a NoExecute taint in a later cycle of it: held instead, it
// would get reservations while placeholders of earlier versions, which
// kube-scheduler binds, may still be pending for its GPUs.
func TestReturnedNodeStaysOutWhenItLosesANoExecuteTaintWhileItSettles(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC))
	back := drainedNode("back", clk.Now().Add(time.Hour))
	back.Spec.Taints = append(back.Spec.Taints, corev1.Taint{Key: "example.com/maintenance", Effect: corev1.TaintEffectNoExecute})
	c := settlingCluster(t, clk, back)
	_ = c.pods.Delete(gpuPod("w", "q", 1))
	_ = c.pods.Add(fracPod("f", "q", 40))
	r := &fakeReserver{c: c, admit: true}
	c.s.deps.Reserver = r
	c.cycle()
	given := back.DeepCopy()
	given.Spec.Taints = given.Spec.Taints[1:] // the drain ends
	_ = c.nodes.Update(given)
	clk.Step(time.Second)
	c.cycle()
	untainted := given.DeepCopy()
	untainted.Spec.Taints = nil
	_ = c.nodes.Update(untainted)
	clk.Step(time.Second)
	c.cycle()
	if len(r.ensured) != 0 || c.boundTo("f") != "" {
		t.Fatalf("2 s after its drain ended (1 s after its NoExecute taint went): reservations %v, f bound to %q; want none", r.ensured, c.boundTo("f"))
	}
	clk.Step(3 * time.Second)
	c.cycle()
	if want := []string{"back/GPU-back-0"}; !slices.Equal(r.ensured, want) {
		t.Fatalf("once settled: reservations %v, want %v", r.ensured, want)
	}
}

// A drain's taint that outlives its deadline (consolidation turned off
// mid-drain: the coordinator may no longer write nodes) keeps the node out
// only until then; it then settles like a node given back and takes work.
func TestDrainTaintPastItsDeadlineNoLongerKeepsTheNode(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC))
	c := settlingCluster(t, clk, drainedNode("left", clk.Now().Add(time.Minute)))
	c.expectBound(clk, 0, "", "before the drain's deadline")
	c.expectBound(clk, time.Minute, "", "at the drain's deadline")
	c.expectBound(clk, time.Second, "", "past the deadline (the taint stays), before the node settled")
	c.expectBound(clk, 3*time.Second, "left", "past the drain's deadline, the node settled")
}

// drainedNode is an hour-old 1-GPU node tainted gpufrac.io/draining until deadline.
func drainedNode(name string, deadline time.Time) *corev1.Node {
	n := h100Node(name, "a", 1)
	n.CreationTimestamp = metav1.NewTime(deadline.Add(-2 * time.Hour))
	n.Spec.Taints = []corev1.Taint{{Key: api.TaintDraining, Value: strconv.FormatInt(deadline.Unix(), 10), Effect: corev1.TaintEffectNoSchedule}}
	return n
}

// expectBound steps the clock, runs a cycle and checks where w is bound ("" for nowhere).
func (c *cluster) expectBound(clk *clocktesting.FakeClock, step time.Duration, want, when string) {
	c.t.Helper()
	clk.Step(step)
	c.cycle()
	if n := c.boundTo("w"); n != want {
		c.t.Fatalf("%s: w bound to %q, want %q", when, n, want)
	}
}

// settlingCluster is node alone with NewNodeSettle 3 s and a pending
// whole-GPU pod w of queue q.
func settlingCluster(t *testing.T, clk *clocktesting.FakeClock, node *corev1.Node) *cluster {
	t.Helper()
	return newClusterWith(t, Options{BindWorkers: 1, NewNodeSettle: 3 * time.Second},
		Deps{Queues: staticQueues{queueOf("q", "8")}, Clock: clk}, []*corev1.Node{node}, gpuPod("w", "q", 1))
}

// A Karpenter node deleted and made again under the same name between two
// cycles (a new Node object, another UID) settles as a new node does, even
// when the coordinator never saw the new one tainted: the taint manager
// may have seen its karpenter.sh/unregistered taint. Before, settlingNodes
// knew nodes by name only and took it for the node it already knew.
func TestNodeMadeAgainUnderItsNameSettlesLikeANewOne(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC))
	c := settlingCluster(t, clk, h100Node("old", "a", 1))
	_ = c.pods.Add(admitted(gpuPod("busy", "q", 1), "old"))
	first := h100Node("new", "a", 1)
	first.UID = "new-1"
	_ = c.nodes.Add(first)
	busyNew := admitted(gpuPod("busy-new", "q", 1), "new")
	_ = c.pods.Add(busyNew)
	c.expectBound(clk, 0, "", "old and new are full")
	c.expectBound(clk, 10*time.Second, "", "old and new are full, 10 s on")

	// new is deleted with its pod and made again, registered by the next cycle.
	_ = c.pods.Delete(busyNew)
	_ = c.nodes.Delete(first)
	again := h100Node("new", "a", 1)
	again.UID = "new-2"
	_ = c.nodes.Add(again)
	c.expectBound(clk, time.Second, "", "new made again a moment ago, within NewNodeSettle")
	c.expectBound(clk, 3*time.Second, "new", "new made again, settled")
}

// The parses of a cycle use the GPU models of the nodes it lists, also
// those of a node that appeared since the last cycle: the bound pods are
// read beside the snapshot with the last cycle's models, and read again
// when the snapshot tells others. A pod asking only for a model a new node
// brings is placed there in the cycle that lists it, and a pod asking for
// another model never is, its parse kept from cycle to cycle.
func TestParsesUseTheModelsOfANodeAddedThisCycle(t *testing.T) {
	a100 := h100Node("a100", "p", 1)
	a100.Labels[api.LabelGPUProduct] = "NVIDIA-A100-SXM4-80GB"
	wantsH100 := builders.MakePod("wants-h100", "default").Queue("q").GPUs(1).CPU("1").UID("wants-h100").GPUModels("H100").Obj()
	wantsA100 := builders.MakePod("wants-a100", "default").Queue("q").GPUs(1).CPU("1").UID("wants-a100").GPUModels("a100").Obj()
	busy := admitted(gpuPod("busy", "q", 1), "a100")
	for _, p := range []*corev1.Pod{wantsH100, wantsA100, busy} {
		p.ResourceVersion = "1" // parses kept by object, as informers' pods are
	}
	c := newCluster(t, "", []*corev1.Node{a100}, []*v1alpha1.Queue{queueOf("q", "8")}, wantsH100, wantsA100, busy)
	c.cycle()
	if n := c.boundTo("wants-h100"); n != "" {
		t.Fatalf("wants-h100 bound to %q with no H100 in the cluster", n)
	}
	_ = c.nodes.Add(h100Node("h100", "p", 2))
	c.cycle()
	if n := c.boundTo("wants-h100"); n != "h100" {
		t.Errorf("wants-h100 bound to %q in the cycle that listed node h100, want h100", n)
	}
	c.cycle()
	if n := c.boundTo("wants-a100"); n != "" {
		t.Errorf("wants-a100 bound to %q: only node a100 has its model, and it is full", n)
	}
	if !slices.Equal(c.s.models, []string{"NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"}) {
		t.Errorf("models = %v, want both, sorted", c.s.models)
	}
}

// TestGangNeverSpansAPoolAndUnpooledNodes: static nodes without a pool label
// beside a Karpenter pool. A gang that fits neither alone is not placed
// across both: the nodes of no pool are a pool of their own.
func TestGangNeverSpansAPoolAndUnpooledNodes(t *testing.T) {
	gang := gangOf("g", 6)
	c := newCluster(t, "", []*corev1.Node{h100Node("a1", "a", 4), h100Node("s1", "", 4)}, []*v1alpha1.Queue{queueOf("q", "8")}, gang...)
	c.s.opts.ElasticPools = true
	c.cycle()
	for _, p := range gang {
		if n := c.boundTo(p.Name); n != "" {
			t.Errorf("%s bound to %s: the gang spans pool a and the unpooled nodes", p.Name, n)
		}
	}
	// Four fit the unpooled nodes and not pool a: the gang goes there whole.
	four := gangOf("f", 4)
	c2 := newCluster(t, "", []*corev1.Node{h100Node("a1", "a", 2), h100Node("s1", "", 4)}, []*v1alpha1.Queue{queueOf("q", "8")}, four...)
	c2.cycle()
	for _, p := range four {
		if n := c2.boundTo(p.Name); n != "s1" {
			t.Errorf("%s bound to %q (%s), want s1", p.Name, n, c2.b.Messages[p.Name])
		}
	}
}
