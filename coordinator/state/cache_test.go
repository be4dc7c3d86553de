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

func describe(t *testing.T, in Inputs) built {
	t.Helper()
	s, err := Build(in)
	if err != nil {
		t.Fatal(err)
	}
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

// TestCacheBuildsWhatAFreshReadBuilds: Builds with a Cache, the first and
// the next ones, and after objects are replaced (as an informer does: a new
// object, never a change to the old one), give what a Build that reads
// every object gives.
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
	cache := NewCache()
	check := func(step string) {
		t.Helper()
		fresh := Inputs{Nodes: nodes, Pods: pods, PoolLabel: api.LabelNodePool, Assumed: assumedOn(assumed, "frac", "frac-gpu0")}
		cached := fresh
		cached.Cache = cache
		want := describe(t, fresh)
		if d := cmp.Diff(want, describe(t, cached)); d != "" {
			t.Errorf("%s: a Build with the cache differs from a fresh read (-fresh +cached):\n%s", step, d)
		}
	}
	check("first Build")
	check("second Build")
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
	// A pod gone is forgotten at the end of the next Build.
	pods = pods[1:]
	check("a pod gone")
	if _, ok := cache.pods[p2]; ok {
		t.Error("the cache still holds a pod no Build read")
	}
}

// assumedOn is the Assumed of one pod placed on node (and GPU).
func assumedOn(p *corev1.Pod, node, gpu string) map[types.UID]Assumed {
	return map[types.UID]Assumed{p.UID: {Node: node, GPU: gpu}}
}

// TestCachedNodesMatchAFreshBuildThroughChurn drives a cluster through
// random changes, as informers and the scheduler make them between cycles,
// and checks after each that a Build with the Cache, which takes each node
// whose object and pods are unchanged from the last Build, gives what a
// Build that reads every object gives: pods bound, admitted, replaced and
// deleted; reservations asking, told their GPU, failed, being deleted,
// removed or created (Inputs.Removing, Inputs.Creating); pods assumed;
// nodes cordoned, not Ready, drained past their deadline, settling, their
// GPUs turned unhealthy; DRA usage changing under the same objects; nodes
// deleted and made again under the same name (a new object, maybe of
// another kind); pods made again under their name on another node; and
// Builds of part of the pods with the same Cache between two cycles, as
// reclaim's what-if Builds (reclaimScope.without) make them. The pods come
// in a new order each Build, as a lister's do.
func TestCachedNodesMatchAFreshBuildThroughChurn(t *testing.T) {
	for seed := uint64(1); seed <= 12; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			churn(t, seed, 250)
		})
	}
}

func churn(t *testing.T, seed uint64, steps int) {
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
	cache := NewCache()
	for step := 0; step < steps; step++ {
		switch rng.IntN(16) {
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
			default: // a what-if Build of part of the pods, with the cache
				part := make([]*corev1.Pod, 0, len(pods))
				for _, p := range pods {
					if rng.IntN(8) > 0 {
						part = append(part, p)
					}
				}
				in := Inputs{Nodes: nodes, Pods: part, PoolLabel: api.LabelNodePool, Assumed: assumed, Removing: removing,
					Creating: creating, Settling: settlingNodes, DRAUsage: usage, Now: now}
				want := describe(t, in)
				in.Cache = cache
				if d := cmp.Diff(want, describe(t, in)); d != "" {
					t.Fatalf("step %d: a what-if Build with the cache differs from a fresh read (-fresh +cached):\n%s", step, d)
				}
			}
		default: // nothing changed: the next cycle
		}
		// A lister lists in a map's order, another each cycle.
		rng.Shuffle(len(pods), func(i, j int) { pods[i], pods[j] = pods[j], pods[i] })
		fresh := Inputs{Nodes: nodes, Pods: pods, PoolLabel: api.LabelNodePool, Assumed: assumed, Removing: removing,
			Creating: creating, Settling: settlingNodes, DRAUsage: usage, Now: now}
		cached := fresh
		cached.Cache = cache
		want := describe(t, fresh)
		if d := cmp.Diff(want, describe(t, cached)); d != "" {
			t.Fatalf("step %d: a Build with the cache differs from a fresh read (-fresh +cached):\n%s", step, d)
		}
	}
	if cache.taken == 0 || cache.charged == 0 {
		t.Fatalf("nodes taken as they were %d times, charged %d times: the churn tests neither", cache.taken, cache.charged)
	}
}

// TestCachedPartIsNotTheListersOrder: a lister lists pods in a map's order,
// another each cycle. A node's part taken as it was is the one charged in
// the last cycle's order, so it must be what any order gives: here two
// reservations of one GPU (one being deleted, one made for the same GPU)
// and a fraction without a planned GPU beside one planned on a GPU.
func TestCachedPartIsNotTheListersOrder(t *testing.T) {
	n := node("n", 2).inventory("fraction").n
	old := reservation("old", 1, "n-gpu0", "n-gpu0")
	deleted := metav1.NewTime(time.Date(2026, 11, 24, 10, 1, 0, 0, time.UTC))
	old.DeletionTimestamp = &deleted
	made := reservation("made", 2, "n-gpu0", "n-gpu0")
	unplanned := pod("unplanned").on("n").fraction(30, "").p
	planned := pod("planned").on("n").fraction(30, "n-gpu1").p
	for i, o := range []metav1.Object{n, old, made, unplanned, planned} {
		o.SetResourceVersion(fmt.Sprint(i + 1))
	}
	cache := NewCache()
	for _, pods := range [][]*corev1.Pod{{old, made, unplanned, planned}, {made, old, planned, unplanned}, {old, made, unplanned, planned}} {
		fresh := Inputs{Nodes: []*corev1.Node{n}, Pods: pods, PoolLabel: api.LabelNodePool}
		cached := fresh
		cached.Cache = cache
		if d := cmp.Diff(describe(t, fresh), describe(t, cached)); d != "" {
			t.Errorf("pods listed as %s, %s, %s, %s: a Build with the cache differs from a fresh read (-fresh +cached):\n%s",
				pods[0].Name, pods[1].Name, pods[2].Name, pods[3].Name, d)
		}
	}
}
