package state

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/dra"
	"github.com/gpufrac/gpufrac/coordinator/placement"
)

// built is what a test compares of a snapshot: every node as placement
// sees it, and what the coordinator reads besides.
type built struct {
	Nodes                                                   []string
	NoFraction, DRANodes                                    map[string]bool
	Reservations                                            map[string]string
	Failed                                                  []string
	RemovingShown                                           map[types.UID]bool
	CreatingShown                                           map[NodeGPU]bool
	ScalarMilli                                             map[string]int64
	GPUCapacityMilli, CPUCapacityMilli, MemoryCapacityBytes int64
}

// describe builds in afresh and describes the snapshot.
func describe(t *testing.T, in Inputs) built {
	t.Helper()
	s, err := Build(in)
	if err != nil {
		t.Fatal(err)
	}
	return describeSnapshot(s)
}

// describeCached describes the snapshot the cache makes of in's other
// inputs.
func describeCached(t *testing.T, c *Cache, in Inputs) built {
	t.Helper()
	in.Nodes, in.Pods = nil, nil
	s, err := c.UpdateSnapshot(in)
	if err != nil {
		t.Fatal(err)
	}
	d := describeSnapshot(s)
	scribble(t, s)
	// Handed back as the coordinator's cycle does: the next snapshot is
	// made in its arrays, and must be what a fresh read gives all the same.
	c.Recycle(s)
	return d
}

// scribble changes a snapshot as a cycle does (a pod placed, a reservation
// added to the map): the cache's next snapshots must not show it.
func scribble(t *testing.T, s *Snapshot) {
	t.Helper()
	s.AddReservation(NodeGPU{"scribbled", "gpu"}, &Reservation{})
	for i := 0; i < s.Len(); i++ {
		if n := s.Node(i); n.CPUMilli-n.UsedCPUMilli >= 100 {
			r := placement.Request{CPUMilli: 100}
			if err := s.Assume(&r, placement.Decision{Node: n.Name, NodeIndex: i}); err != nil {
				t.Fatalf("placing on %s: %v", n.Name, err)
			}
			return
		}
	}
}

// informer feeds a Cache as an informer does: it keeps the objects it last
// showed, keyed as an informer keys them, and sends each change as an
// event (a new object under a key, a new object under an old key, a key
// gone). An object it showed already sends nothing.
type informer struct {
	c     *Cache
	nodes map[string]*corev1.Node
	pods  map[string]*corev1.Pod
}

func newInformer(c *Cache) *informer {
	return &informer{c: c, nodes: map[string]*corev1.Node{}, pods: map[string]*corev1.Pod{}}
}

// show sends the events that make the cache hold nodes and pods.
func (inf *informer) show(nodes []*corev1.Node, pods []*corev1.Pod) {
	seen := map[string]bool{}
	for _, n := range nodes {
		seen[n.Name] = true
		switch old := inf.nodes[n.Name]; {
		case old == nil:
			inf.c.AddNode(n)
		case old != n:
			inf.c.UpdateNode(old, n)
		}
		inf.nodes[n.Name] = n
	}
	for name, n := range inf.nodes {
		if !seen[name] {
			inf.c.DeleteNode(n)
			delete(inf.nodes, name)
		}
	}
	clear(seen)
	for _, p := range pods {
		key := p.Namespace + "/" + p.Name
		seen[key] = true
		switch old := inf.pods[key]; {
		case old == nil:
			inf.c.AddPod(p)
		case old != p:
			inf.c.UpdatePod(old, p)
		}
		inf.pods[key] = p
	}
	for key, p := range inf.pods {
		if !seen[key] {
			inf.c.DeletePod(p)
			delete(inf.pods, key)
		}
	}
}

// describeSnapshot is what a test compares of s.
func describeSnapshot(s *Snapshot) built {
	out := built{NoFraction: s.NoFraction, DRANodes: s.DRANodes, Reservations: map[string]string{}, ScalarMilli: s.ScalarMilli,
		RemovingShown: s.RemovingShown, CreatingShown: s.CreatingShown,
		GPUCapacityMilli: s.GPUCapacityMilli, CPUCapacityMilli: s.CPUCapacityMilli, MemoryCapacityBytes: s.MemoryCapacityBytes}
	for i := 0; i < s.Len(); i++ {
		out.Nodes = append(out.Nodes, fmt.Sprintf("%+v", s.Node(i)))
	}
	for k, r := range s.Reservations {
		name, taken := "(no pod)", ""
		if r.Pod != nil {
			name = r.Pod.Name
		}
		if r.TakenBy != nil {
			taken = r.TakenBy.Name
		}
		out.Reservations[k.Node+"/"+k.GPU] = fmt.Sprintf("%s ready=%v fractions=%d orphaned=%q lost=%v gone=%v idle=%v taken=%q stranded=%d",
			name, r.Ready, r.Fractions, r.Orphaned, r.NodeLost, r.NodeGone, r.NodeIdle, taken, len(r.Stranded))
	}
	for _, p := range s.FailedReservations {
		out.Failed = append(out.Failed, p.Name)
	}
	return out
}

// TestCacheBuildsWhatAFreshReadBuilds: a Cache's snapshots, the first and
// the next ones, and after objects are replaced (as an informer does: a new
// object, never a change to the old one) or deleted, give what a Build that
// reads every object gives.
func TestCacheBuildsWhatAFreshReadBuilds(t *testing.T) {
	versioned := func(objs ...metav1.Object) {
		for _, o := range objs {
			o.SetResourceVersion("1")
		}
	}
	frac := node("frac", 4).inventory("fraction").n
	excl := node("excl", 2).inventory("exclusive").n
	ts := node("ts", 2).partitionedInv("timeslice", 2, 4, "").n
	dra := draNode("dra", 2)
	down := node("down", 2).inventory("fraction").notReady().n
	plain := node("plain", 2).n // no inventory
	nodes := []*corev1.Node{frac, excl, ts, dra, down, plain}
	planned := pod("planned").on("frac").fraction(30, "frac-gpu1").cpu("2").p
	admitted := pod("admitted").on("frac").fraction(30, "frac-gpu1").p
	admitted.Annotations[api.AnnotationAllocatedGPU] = "frac-gpu2"
	assumed := pod("assumed").fraction(50, "").p
	whole := pod("whole").on("excl").gpus(1).p
	whole.Annotations[api.AnnotationAllocatedGPU] = "excl-gpu1"
	wholeUnknown := pod("whole-unknown").on("frac").gpus(1).p
	res := reservation("res", 1, "frac-gpu1", "frac-gpu1")
	res.Spec.NodeName = "frac"
	asking := reservation("asking", 2, "frac-gpu3", "")
	asking.Spec.NodeName = "frac"
	offRes := reservation("off-res", 3, "down-gpu0", "down-gpu0")
	offRes.Spec.NodeName = "down"
	offFrac := pod("off-frac").on("down").fraction(20, "down-gpu0").p
	replica := pod("replica").on("ts").scalar(shared, 3).p
	onDRA := pod("on-dra").on("dra").cpu("1").p
	failedRes := reservation("failed-res", 4, "frac-gpu0", "")
	failedRes.Spec.NodeName = "frac"
	failedRes.Status.Phase = corev1.PodFailed
	pending := pod("pending").fraction(10, "").p
	pods := []*corev1.Pod{planned, admitted, assumed, whole, wholeUnknown, res, asking, offRes, offFrac, replica, onDRA, failedRes, pending}
	for _, n := range nodes {
		versioned(n)
	}
	for _, p := range pods {
		versioned(p)
	}
	cache := NewCache("")
	inf := newInformer(cache)
	check := func(step string) {
		t.Helper()
		inf.show(nodes, pods)
		fresh := Inputs{Nodes: nodes, Pods: pods, PoolLabel: api.LabelNodePool, Assumed: assumedOn(assumed, "frac", "frac-gpu0")}
		want := describe(t, fresh)
		if d := cmp.Diff(want, describeCached(t, cache, fresh)); d != "" {
			t.Errorf("%s: the cache's snapshot differs from a fresh read (-fresh +cached):\n%s", step, d)
		}
	}
	check("first snapshot")
	check("second snapshot")
	if len(cache.pods) == 0 || len(cache.nodes) == 0 {
		t.Fatalf("the cache kept nothing: %d pods, %d nodes", len(cache.pods), len(cache.nodes))
	}

	// The informer replaces objects: the planned fraction is admitted on
	// another GPU, the asking reservation is told its GPU, a node grows.
	p2 := planned.DeepCopy()
	p2.Annotations[api.AnnotationAllocatedGPU] = "frac-gpu3"
	p2.ResourceVersion = "2"
	a2 := asking.DeepCopy()
	a2.Annotations[api.AnnotationReservedGPU] = "frac-gpu3"
	a2.ResourceVersion = "2"
	e2 := excl.DeepCopy()
	e2.Status.Allocatable[corev1.ResourceCPU] = resource.MustParse("96")
	e2.ResourceVersion = "2"
	pods[0], pods[6], nodes[1] = p2, a2, e2
	check("objects replaced")
	// A pod gone is forgotten.
	pods = pods[1:]
	check("a pod gone")
	if _, ok := cache.pods[p2.UID]; ok {
		t.Error("the cache still holds a pod deleted")
	}
	if cache.taken == 0 {
		t.Error("no node was taken as it was")
	}
}

// assumedOn is the Assumed of one pod placed on node (and GPU).
func assumedOn(p *corev1.Pod, node, gpu string) map[types.UID]Assumed {
	return map[types.UID]Assumed{p.UID: {Node: node, GPU: gpu}}
}

// TestCachedNodesMatchAFreshBuildThroughChurn drives a cluster through
// random changes, as informers and the scheduler make them between cycles,
// and checks after each that the Cache fed by the informer's events, which
// takes each node whose generation did not move since its last part, gives
// what a Build that reads every object gives: pods bound, admitted, replaced and
// deleted; reservations asking, told their GPU, failed, being deleted,
// removed or created (Inputs.Removing, Inputs.Creating); pods assumed;
// nodes cordoned, not Ready, drained past their deadline, settling, their
// GPUs turned unhealthy; DRA usage changing under the same objects; nodes
// deleted and made again under the same name (a new object, maybe of
// another kind); pods made again under their name on another node; and
// objects replaced by equal ones (an informer's resync). The pods come in a
// new order each time, as a lister's do.
func TestCachedNodesMatchAFreshBuildThroughChurn(t *testing.T) {
	for seed := uint64(1); seed <= 12; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			churn(t, seed, 250, false)
		})
	}
}

// TestSteadySnapshotsMatchAFreshBuildThroughChurn is the churn above on a
// cluster that is often steady (no DRA node, no pod being bound, nothing
// being created, removed, settling or drifted): the cache hands out copies
// of its last snapshot while no event moved it, and each must be what a
// fresh Build gives, whatever the cycles did to the copies before.
func TestSteadySnapshotsMatchAFreshBuildThroughChurn(t *testing.T) {
	reused := 0
	for seed := uint64(1); seed <= 12; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			reused += churn(t, seed, 250, true)
		})
	}
	if reused < 100 {
		t.Fatalf("%d snapshots handed out again in 12 × 250 steps: the churn does not test it", reused)
	}
	t.Logf("%d snapshots handed out again", reused)
}

// churn drives a cache through steps of random change. plain leaves out
// DRA nodes and the inputs that are not events (pods being bound,
// reservations being removed or created, settling nodes, DRA usage), so
// that snapshots are often steady and handed out again.
func churn(t *testing.T, seed uint64, steps int, plain bool) (reused int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 7))
	version := 0
	versioned := func(o metav1.Object) {
		version++
		o.SetResourceVersion(fmt.Sprint(version))
	}
	start := time.Date(2026, 11, 25, 3, 0, 0, 0, time.UTC)
	now := start
	mk := []func(name string) *corev1.Node{
		func(name string) *corev1.Node { return node(name, 4).inventory("fraction").n },
		func(name string) *corev1.Node { return node(name, 4).inventory("fraction").n },
		func(name string) *corev1.Node { return node(name, 2).inventory("exclusive").n },
		func(name string) *corev1.Node { return node(name, 2).partitionedInv("timeslice", 2, 4, "").n },
		func(name string) *corev1.Node { return draNode(name, 2) },
		func(name string) *corev1.Node { return node(name, 2).n },
	}
	if plain {
		mk = slices.Delete(mk, 4, 5) // no DRA node
	}
	var nodes []*corev1.Node
	var gone []*corev1.Node // nodes deleted, to be made again
	for i := 0; i < 10; i++ {
		n := mk[i%len(mk)](fmt.Sprintf("n%d", i))
		if i%3 == 0 {
			delete(n.Labels, api.LabelNodePool) // a static node: never idle
		}
		versioned(n)
		nodes = append(nodes, n)
	}
	gpu := func(n *corev1.Node) string { return fmt.Sprintf("%s-gpu%d", n.Name, rng.IntN(4)) }
	pickNode := func() *corev1.Node { return nodes[rng.IntN(len(nodes))] }
	serial := 0
	newPod := func() *corev1.Pod {
		serial++
		name := fmt.Sprintf("p%d", serial)
		n := pickNode()
		var p *corev1.Pod
		switch rng.IntN(7) {
		case 0:
			p = pod(name).on(n.Name).cpu("1").gpus(1 + rng.IntN(2)).p
			if rng.IntN(2) == 0 {
				p.Annotations[api.AnnotationAllocatedGPU] = gpu(n)
			}
		case 1, 2:
			p = pod(name).on(n.Name).cpu("500m").fraction(10*(1+rng.IntN(6)), gpu(n)).p
			if rng.IntN(2) == 0 {
				p.Annotations[api.AnnotationAllocatedGPU] = gpu(n)
			}
		case 3:
			g := gpu(n)
			got := ""
			if rng.IntN(3) > 0 {
				got = g
			}
			p = reservation(name, rng.IntN(60), g, got)
			p.Spec.NodeName = n.Name
		case 4:
			p = pod(name).fraction(20, "").p // pending
		case 5:
			p = pod(name).on(n.Name).scalar(shared, 1+int64(rng.IntN(3))).p
		default:
			p = pod(name).on(n.Name).cpu("2").p
		}
		versioned(p)
		return p
	}
	var pods []*corev1.Pod
	for i := 0; i < 60; i++ {
		pods = append(pods, newPod())
	}
	assumed := map[types.UID]Assumed{}
	removing := map[types.UID]bool{}
	creating := map[NodeGPU]bool{}
	settlingNodes := map[string]bool{}
	usage := dra.Usage{}
	cache := NewCache("")
	inf := newInformer(cache)
	for step := 0; step < steps; step++ {
		what := rng.IntN(16)
		if plain && what >= 7 && what <= 11 {
			what = 15 // the inputs that are not events stay empty
		}
		switch what {
		case 0, 1: // a new pod
			pods = append(pods, newPod())
		case 2: // a pod gone
			if len(pods) > 0 {
				i := rng.IntN(len(pods))
				pods = slices.Delete(pods, i, i+1)
			}
		case 3, 4, 5: // a pod replaced: admitted, told its GPU, ended, being deleted
			if len(pods) == 0 {
				break
			}
			i := rng.IntN(len(pods))
			p := pods[i].DeepCopy()
			switch rng.IntN(5) {
			case 0:
				p.Annotations[api.AnnotationAllocatedGPU] = fmt.Sprintf("%s-gpu%d", p.Spec.NodeName, rng.IntN(4))
			case 1:
				p.Annotations[api.AnnotationReservedGPU] = p.Annotations[api.AnnotationGPU]
			case 2:
				p.Status.Phase = []corev1.PodPhase{corev1.PodRunning, corev1.PodSucceeded, corev1.PodFailed}[rng.IntN(3)]
			case 3:
				ts := metav1.NewTime(now)
				p.DeletionTimestamp = &ts
			default:
				if p.Spec.NodeName == "" {
					p.Spec.NodeName = pickNode().Name // bound
				}
			}
			versioned(p)
			pods[i] = p
		case 6: // a node replaced: cordoned, not Ready, a GPU unhealthy, drained, grown
			i := rng.IntN(len(nodes))
			n := nodes[i].DeepCopy()
			switch rng.IntN(5) {
			case 0:
				n.Spec.Unschedulable = !n.Spec.Unschedulable
			case 1:
				c := &n.Status.Conditions[0]
				c.Status = map[corev1.ConditionStatus]corev1.ConditionStatus{corev1.ConditionTrue: corev1.ConditionFalse, corev1.ConditionFalse: corev1.ConditionTrue}[c.Status]
			case 2:
				if _, ok := n.Annotations[api.AnnotationGPUInventory]; ok {
					(&nodeB{n}).withGPU(rng.IntN(2), func(g *api.GPUInfo) { g.Healthy = !g.Healthy })
				}
			case 3:
				deadline := now.Add(time.Duration(rng.IntN(4)) * time.Second).Unix()
				n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: api.TaintDraining, Value: fmt.Sprint(deadline), Effect: corev1.TaintEffectNoSchedule})
			default:
				n.Status.Allocatable[corev1.ResourceCPU] = *resource.NewQuantity(int64(32+rng.IntN(64)), resource.DecimalSI)
			}
			versioned(n)
			nodes[i] = n
		case 7: // a pod assumed, or its binding shown
			if rng.IntN(2) == 0 && len(pods) > 0 {
				p := pods[rng.IntN(len(pods))]
				n := pickNode()
				assumed[p.UID] = Assumed{Node: n.Name, GPU: gpu(n)}
			} else {
				clear(assumed)
			}
		case 8: // a reservation being removed, or forgotten
			if len(pods) > 0 && rng.IntN(2) == 0 {
				removing[pods[rng.IntN(len(pods))].UID] = true
			} else {
				clear(removing)
			}
		case 9: // a reservation created, not shown yet
			if rng.IntN(2) == 0 {
				n := pickNode()
				creating[NodeGPU{n.Name, gpu(n)}] = true
			} else {
				clear(creating)
			}
		case 10: // a node settling, or settled
			n := pickNode()
			settlingNodes[n.Name] = !settlingNodes[n.Name]
		case 11: // DRA usage changes (claims are not pod objects)
			usage = dra.Usage{}
			for _, n := range nodes {
				if rng.IntN(2) == 0 {
					usage[n.Name] = map[string]dra.GPUUse{fmt.Sprintf("%s-gpu0", n.Name): {UsedMilli: rng.IntN(1001)}}
				}
			}
		case 12: // time passes (drains reach their deadline)
			now = now.Add(time.Second)
		case 13: // nodes and pods made again under their names; what-if Builds
			switch rng.IntN(4) {
			case 0: // a node deleted
				if len(nodes) > 1 {
					i := rng.IntN(len(nodes))
					gone = append(gone, nodes[i])
					nodes = slices.Delete(nodes, i, i+1)
				}
			case 1: // a node made again under its old name: a new object
				if len(gone) > 0 {
					i := rng.IntN(len(gone))
					n := mk[rng.IntN(len(mk))](gone[i].Name)
					versioned(n)
					nodes = append(nodes, n)
					gone = slices.Delete(gone, i, i+1)
				}
			case 2: // a pod made again under its name elsewhere (a new UID)
				if len(pods) > 0 {
					i := rng.IntN(len(pods))
					p := pods[i].DeepCopy()
					p.UID = types.UID(fmt.Sprintf("%s-%d", p.UID, step))
					p.Spec.NodeName = pickNode().Name
					versioned(p)
					pods[i] = p
				}
			default: // objects replaced by equal ones: an informer's resync
				for i := range pods {
					if rng.IntN(4) == 0 {
						pods[i] = pods[i].DeepCopy()
					}
				}
				if len(nodes) > 0 {
					i := rng.IntN(len(nodes))
					nodes[i] = nodes[i].DeepCopy()
				}
			}
		default: // nothing changed: the next cycle
		}
		// A lister lists in a map's order, another each cycle.
		rng.Shuffle(len(pods), func(i, j int) { pods[i], pods[j] = pods[j], pods[i] })
		fresh := Inputs{Nodes: nodes, Pods: pods, PoolLabel: api.LabelNodePool, Assumed: assumed, Removing: removing,
			Creating: creating, Settling: settlingNodes, DRAUsage: usage, Now: now}
		inf.show(nodes, pods)
		want := describe(t, fresh)
		if d := cmp.Diff(want, describeCached(t, cache, fresh)); d != "" {
			t.Fatalf("step %d: the cache's snapshot differs from a fresh read (-fresh +cached):\n%s", step, d)
		}
		if step%5 == 0 { // a what-if: some pods gone (reclaim's victims)
			gone := map[types.UID]bool{}
			for _, p := range pods {
				if rng.IntN(6) == 0 {
					gone[p.UID] = true
				}
			}
			left := fresh
			left.Pods = slices.DeleteFunc(slices.Clone(pods), func(p *corev1.Pod) bool { return gone[p.UID] })
			want := describe(t, left)
			in := fresh
			in.Nodes, in.Pods = nil, nil
			s, err := cache.SnapshotWithout(in, func(p *corev1.Pod) bool { return gone[p.UID] })
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(want, describeSnapshot(s)); d != "" {
				t.Fatalf("step %d: the cache's snapshot without %d pods differs from a fresh read of the rest (-fresh +cached):\n%s", step, len(gone), d)
			}
		}
	}
	if cache.taken == 0 || cache.charged == 0 {
		t.Fatalf("nodes taken as they were %d times, charged %d times: the churn tests neither", cache.taken, cache.charged)
	}
	return cache.reused
}

// TestCachedPartIsNotTheEventsOrder: the pods of a node come to the cache
// in the order of their events, and a node's part taken as it was is the
// one charged after the last event, so it must be what any order gives:
// here two reservations of one GPU (one being deleted, one made for the
// same GPU) and a fraction without a planned GPU beside one planned on a
// GPU, added, deleted and added again in other orders.
func TestCachedPartIsNotTheEventsOrder(t *testing.T) {
	n := node("n", 2).inventory("fraction").n
	old := reservation("old", 1, "n-gpu0", "n-gpu0")
	deleted := metav1.NewTime(time.Date(2026, 11, 24, 10, 1, 0, 0, time.UTC))
	old.DeletionTimestamp = &deleted
	made := reservation("made", 2, "n-gpu0", "n-gpu0")
	unplanned := pod("unplanned").on("n").fraction(30, "").p
	planned := pod("planned").on("n").fraction(30, "n-gpu1").p
	cache := NewCache("")
	cache.AddNode(n)
	for _, pods := range [][]*corev1.Pod{{old, made, unplanned, planned}, {made, old, planned, unplanned}, {planned, unplanned, old, made}} {
		for _, p := range pods {
			cache.DeletePod(p)
		}
		for _, p := range pods {
			cache.AddPod(p)
		}
		in := Inputs{Nodes: []*corev1.Node{n}, Pods: pods, PoolLabel: api.LabelNodePool}
		for range 2 { // charged, then taken as it was
			if d := cmp.Diff(describe(t, in), describeCached(t, cache, in)); d != "" {
				t.Errorf("pods added as %s, %s, %s, %s: the cache's snapshot differs from a fresh read (-fresh +cached):\n%s",
					pods[0].Name, pods[1].Name, pods[2].Name, pods[3].Name, d)
			}
		}
	}
}

// TestUpdateSnapshotRefusesObjects: a Cache has nodes and pods from its
// events; objects handed in Inputs would be ignored, so they are refused.
func TestUpdateSnapshotRefusesObjects(t *testing.T) {
	if _, err := NewCache("").UpdateSnapshot(Inputs{Nodes: []*corev1.Node{node("n", 1).n}}); err == nil {
		t.Error("UpdateSnapshot took nodes in Inputs")
	}
}

// TestUpdateSnapshotChargesOnlyTheNodesThatMoved: after a snapshot, a
// snapshot with no event since charges no node again; an event charges
// again only the nodes it touched (a pod moved between two nodes touches
// both), and what else in Inputs changes a node (a pod being bound there)
// charges that node.
func TestUpdateSnapshotChargesOnlyTheNodesThatMoved(t *testing.T) {
	a, b, c := node("a", 2).inventory("fraction").n, node("b", 2).inventory("fraction").n, node("c", 2).inventory("fraction").n
	onA := pod("on-a").on("a").fraction(30, "a-gpu0").p
	onB := pod("on-b").on("b").gpus(1).p
	pending := pod("pending").fraction(20, "").p
	for _, tc := range []struct {
		name   string
		events func(*Cache)
		in     Inputs
		want   int // nodes charged
	}{
		{name: "no event", events: func(*Cache) {}, want: 0},
		{name: "a node replaced", events: func(c *Cache) { c.UpdateNode(b, b.DeepCopy()) }, want: 1},
		{name: "a pod replaced", events: func(c *Cache) { c.UpdatePod(onA, onA.DeepCopy()) }, want: 1},
		{name: "a pod deleted", events: func(c *Cache) { c.DeletePod(onB) }, want: 1},
		{name: "a pod made again on another node", events: func(c *Cache) {
			p := onA.DeepCopy()
			p.UID, p.Spec.NodeName = "on-a-2", "c"
			c.UpdatePod(onA, p)
		}, want: 2},
		{name: "a pending pod changes", events: func(c *Cache) { c.UpdatePod(pending, pending.DeepCopy()) }, want: 0},
		{name: "a pod being bound", events: func(*Cache) {}, in: Inputs{Assumed: assumedOn(pending, "c", "c-gpu0")}, want: 1},
		{name: "a node deleted", events: func(c *Cache) { c.DeleteNode(shownNode(c, "c")) }, want: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cache := NewCache("")
			newInformer(cache).show([]*corev1.Node{a, b, c}, []*corev1.Pod{onA, onB, pending})
			if _, err := cache.UpdateSnapshot(Inputs{}); err != nil {
				t.Fatal(err)
			}
			before := cache.charged
			tc.events(cache)
			if _, err := cache.UpdateSnapshot(tc.in); err != nil {
				t.Fatal(err)
			}
			if got := cache.charged - before; got != tc.want {
				t.Errorf("%d nodes charged again, want %d", got, tc.want)
			}
		})
	}
}

// TestSteadySnapshotIsMadeAgainOnlyWhileNothingMoved: a snapshot that
// depends on the cache alone is handed out again (a copy) until an event
// moves the cache; one that depends on the time (a node draining) or on
// inputs that are not events is made afresh. Each is what a fresh Build of
// the same objects gives.
func TestSteadySnapshotIsMadeAgainOnlyWhileNothingMoved(t *testing.T) {
	now := time.Date(2026, 11, 30, 1, 0, 0, 0, time.UTC)
	a, b := node("a", 2).inventory("fraction").n, node("b", 2).inventory("fraction").n
	drained := node("d", 2).inventory("fraction").n
	drained.Spec.Taints = []corev1.Taint{{Key: api.TaintDraining, Value: fmt.Sprint(now.Add(time.Second).Unix()), Effect: corev1.TaintEffectNoSchedule}}
	onA := pod("on-a").on("a").fraction(30, "a-gpu0").p
	pending := pod("pending").fraction(20, "").p
	failed := reservation("failed", 1, "b-gpu1", "")
	failed.Spec.NodeName = "b"
	failed.Status.Phase = corev1.PodFailed
	type world struct {
		nodes []*corev1.Node
		pods  []*corev1.Pod
		in    Inputs
		cache *Cache
	}
	past := node("e", 2).inventory("fraction").n
	past.Spec.Taints = []corev1.Taint{{Key: api.TaintDraining, Value: fmt.Sprint(now.Add(-time.Second).Unix()), Effect: corev1.TaintEffectNoSchedule}}
	for _, tc := range []struct {
		name   string
		nodes  []*corev1.Node
		usage  dra.Usage // the first snapshot's
		change func(w *world)
		reused bool
	}{
		{name: "no event", change: func(*world) {}, reused: true},
		{name: "a pending pod changes", change: func(w *world) { w.pods[1] = pending.DeepCopy() }, reused: true},
		{name: "a pod replaced", change: func(w *world) { w.pods[0] = onA.DeepCopy() }},
		{name: "a failed reservation deleted", change: func(w *world) { w.pods = w.pods[:2] }},
		{name: "a node added", change: func(w *world) { w.nodes = append(w.nodes, node("c", 2).inventory("fraction").n) }},
		{name: "a pod being bound", change: func(w *world) { w.in.Assumed = assumedOn(pending, "b", "b-gpu0") }},
		{name: "a node settling", change: func(w *world) { w.in.Settling = map[string]bool{"b": true} }},
		{name: "another pool label", change: func(w *world) { w.in.PoolLabel = "pool" }},
		{name: "a node drains, its deadline passes", nodes: []*corev1.Node{drained},
			change: func(w *world) { w.in.Now = now.Add(2 * time.Second) }},
		{name: "a drain past its deadline, time passes", nodes: []*corev1.Node{past},
			change: func(w *world) { w.in.Now = now.Add(time.Minute) }, reused: true},
		{name: "a drain past its deadline, no time given", nodes: []*corev1.Node{past},
			change: func(w *world) { w.in.Now = time.Time{} }},
		{name: "DRA usage as it was", nodes: []*corev1.Node{draNode("x", 2)}, usage: dra.Usage{"x": {"x-gpu0": {UsedMilli: 300, Holders: []string{"default/c"}}}},
			change: func(w *world) {
				w.in.DRAUsage = dra.Usage{"x": {"x-gpu0": {UsedMilli: 300, Holders: []string{"default/c"}}}} // a new map, equal
			}, reused: true},
		{name: "DRA usage changed", nodes: []*corev1.Node{draNode("x", 2)}, usage: dra.Usage{"x": {"x-gpu0": {UsedMilli: 300, Holders: []string{"default/c"}}}},
			change: func(w *world) {
				w.in.DRAUsage = dra.Usage{"x": {"x-gpu0": {UsedMilli: 600, Holders: []string{"default/c", "default/d"}}}}
			}},
		{name: "DRA usage gone", nodes: []*corev1.Node{draNode("x", 2)}, usage: dra.Usage{"x": {"x-gpu0": {UsedMilli: 300, Holders: []string{"default/c"}}}},
			change: func(w *world) { w.in.DRAUsage = nil }},
		{name: "a what-if in between", change: func(w *world) {
			in := w.in
			if _, err := w.cache.SnapshotWithout(in, func(p *corev1.Pod) bool { return p.Name == "on-a" }); err != nil {
				t.Fatal(err)
			}
		}, reused: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &world{nodes: append([]*corev1.Node{a, b}, tc.nodes...), pods: []*corev1.Pod{onA, pending, failed},
				in: Inputs{PoolLabel: api.LabelNodePool, Now: now, DRAUsage: tc.usage}}
			cache := NewCache("")
			w.cache = cache
			inf := newInformer(cache)
			inf.show(w.nodes, w.pods)
			describeCached(t, cache, w.in) // and scribbled on
			before := cache.reused
			tc.change(w)
			inf.show(w.nodes, w.pods)
			got := describeCached(t, cache, w.in)
			if reused := cache.reused > before; reused != tc.reused {
				t.Errorf("snapshot handed out again: %v, want %v", reused, tc.reused)
			}
			fresh := w.in
			fresh.Nodes, fresh.Pods = w.nodes, w.pods
			if d := cmp.Diff(describe(t, fresh), got); d != "" {
				t.Errorf("the cache's snapshot differs from a fresh read (-fresh +cached):\n%s", d)
			}
		})
	}
}

// shownNode is the node named name that the cache holds.
func shownNode(c *Cache, name string) *corev1.Node { return c.nodes[name].n }

// TestBuildCountsEveryPodItIsGiven: pods made by hand (what-ifs, tests)
// may have no UID, or one UID twice: each counts, as the old Build counted
// every object listed. A node name twice (even one left out) is an error.
func TestBuildCountsEveryPodItIsGiven(t *testing.T) {
	a := node("a", 2).inventory("fraction").n
	p1, p2 := pod("p1").on("a").cpu("1").p, pod("p2").on("a").cpu("1").p
	noUID1, noUID2 := p1.DeepCopy(), p2.DeepCopy()
	noUID1.UID, noUID2.UID = "", ""
	twin := p2.DeepCopy()
	twin.UID = p1.UID
	for _, tc := range []struct {
		name string
		pods []*corev1.Pod
	}{
		{"two pods", []*corev1.Pod{p1, p2}},
		{"two pods without a UID", []*corev1.Pod{noUID1, noUID2}},
		{"two pods with one UID", []*corev1.Pod{p1, twin}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Build(Inputs{Nodes: []*corev1.Node{a}, Pods: tc.pods})
			if err != nil {
				t.Fatal(err)
			}
			if got := s.Node(0).UsedCPUMilli; got != 2000 {
				t.Errorf("%d milli-CPU used, want 2000", got)
			}
		})
	}
	if _, err := Build(Inputs{Nodes: []*corev1.Node{node("a", 2).inventory("fraction").notReady().n, a}}); err == nil {
		t.Error("Build took a node name twice")
	}
}

// TestLeftOutNodeKeepsNoPart: a node left out of the snapshot (here
// cordoned) lets its last part go, so that the pods in it (a reservation
// deleted meanwhile) are not kept alive while it stays out.
func TestLeftOutNodeKeepsNoPart(t *testing.T) {
	n := node("a", 2).inventory("fraction").n
	r := reservation("res", 1, "a-gpu0", "a-gpu0")
	r.Spec.NodeName = "a"
	c := NewCache("")
	c.AddNode(n)
	c.AddPod(r)
	if _, err := c.UpdateSnapshot(Inputs{}); err != nil {
		t.Fatal(err)
	}
	if c.nodes["a"].last == nil {
		t.Fatal("the placed node kept no part")
	}
	cordoned := n.DeepCopy()
	cordoned.Spec.Unschedulable = true
	c.UpdateNode(n, cordoned)
	c.DeletePod(r)
	if _, err := c.UpdateSnapshot(Inputs{}); err != nil {
		t.Fatal(err)
	}
	if c.nodes["a"].last != nil {
		t.Error("the node left out still holds its last part")
	}
}

// TestSnapshotWithoutLeavesOutWhatGoneSays: a what-if leaves out the pods
// gone names, and keeps no part: the next snapshot has them again.
func TestSnapshotWithoutLeavesOutWhatGoneSays(t *testing.T) {
	n := node("a", 2).inventory("fraction").n
	p1, p2 := pod("p1").on("a").cpu("1").p, pod("p2").on("a").cpu("1").p
	c := NewCache("")
	c.AddNode(n)
	c.AddPod(p1)
	c.AddPod(p2)
	full, err := c.UpdateSnapshot(Inputs{})
	if err != nil {
		t.Fatal(err)
	}
	without, err := c.SnapshotWithout(Inputs{}, func(p *corev1.Pod) bool { return p.UID == p1.UID })
	if err != nil {
		t.Fatal(err)
	}
	if got, want := without.Node(0).UsedCPUMilli, full.Node(0).UsedCPUMilli-1000; got != want {
		t.Errorf("without p1: %d milli-CPU used, want %d", got, want)
	}
	again, err := c.UpdateSnapshot(Inputs{})
	if err != nil {
		t.Fatal(err)
	}
	if got := again.Node(0).UsedCPUMilli; got != full.Node(0).UsedCPUMilli {
		t.Errorf("after the what-if: %d milli-CPU used, want %d (its part was kept)", got, full.Node(0).UsedCPUMilli)
	}
}
