package scheduler

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/coordinator/reservation"
	"github.com/gpufrac/gpufrac/coordinator/state"
)

// driftedSet is a NodeDrift over a fixed set, as Karpenter's NodeClaims
// would tell it.
func driftedSet(nodes ...string) NodeDrift {
	m := map[string]bool{}
	for _, n := range nodes {
		m[n] = true
	}
	return func(node string) bool { return m[node] }
}

// A node whose NodeClaim Karpenter marked Drifted takes no new pod while
// another fits; a pod that fits only there waits with DriftedNodesOnly;
// what already runs there stays. n1 runs a whole-GPU pod, so binpack
// prefers it to the empty n2.
func TestDriftedNodesTakeNoNewPods(t *testing.T) {
	full := func(node string) *corev1.Pod { return admitted(gpuPod("full-"+node, "q", 2), node) }
	for _, tc := range []struct {
		name       string
		avoid      bool
		drifted    NodeDrift
		existing   []*corev1.Pod // besides old, a whole-GPU pod on n1
		pod        *corev1.Pod
		wantNode   string
		wantReason string
	}{
		{name: "a whole-GPU pod goes to the node not drifted", avoid: true, drifted: driftedSet("n1"),
			pod: gpuPod("new", "q", 1), wantNode: "n2"},
		{name: "a fraction goes to the node not drifted", avoid: true, drifted: driftedSet("n1"),
			pod: fracPod("new", "q", 30), wantNode: "n2"},
		{name: "room only on the drifted node: waits with DriftedNodesOnly", avoid: true, drifted: driftedSet("n1"),
			existing: []*corev1.Pod{full("n2")}, pod: gpuPod("new", "q", 1), wantReason: api.ReasonDriftedNodesOnly},
		{name: "a fraction with room only on the drifted node waits with DriftedNodesOnly", avoid: true, drifted: driftedSet("n1"),
			existing: []*corev1.Pod{full("n2")}, pod: fracPod("new", "q", 30), wantReason: api.ReasonDriftedNodesOnly},
		{name: "no room even on the drifted node: NoCapacity", avoid: true, drifted: driftedSet("n1"),
			existing: []*corev1.Pod{full("n2")}, pod: gpuPod("new", "q", 2), wantReason: api.ReasonNoCapacity},
		{name: "both nodes drifted: waits with DriftedNodesOnly", avoid: true, drifted: driftedSet("n1", "n2"),
			pod: gpuPod("new", "q", 1), wantReason: api.ReasonDriftedNodesOnly},
		{name: "flag off: the drifted node is placed on as before", avoid: false, drifted: driftedSet("n1"),
			pod: gpuPod("new", "q", 1), wantNode: "n1"},
		{name: "flag off: a fraction too", avoid: false, drifted: driftedSet("n1"),
			pod: fracPod("new", "q", 30), wantNode: "n1"},
		{name: "flag off, room only on the drifted node: bound there", avoid: false, drifted: driftedSet("n1"),
			existing: []*corev1.Pod{full("n2")}, pod: gpuPod("new", "q", 1), wantNode: "n1"},
		{name: "no NodeClaims known (no Karpenter): as before", avoid: true, drifted: nil,
			pod: gpuPod("new", "q", 1), wantNode: "n1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pods := append([]*corev1.Pod{admitted(gpuPod("old", "q", 1), "n1"), tc.pod}, tc.existing...)
			c := newClusterWith(t, Options{Policy: "binpack", BindWorkers: 1, AvoidDriftedNodes: tc.avoid},
				Deps{Queues: staticQueues([]*v1alpha1.Queue{queueOf("q", "8")}), NodeDrifted: tc.drifted},
				[]*corev1.Node{h100Node("n1", "a", 2), h100Node("n2", "a", 2)}, pods...)
			for range 2 {
				c.cycle()
			}
			if got := c.boundTo("new"); got != tc.wantNode {
				t.Errorf("new pod bound to %q, want %q (reason %q: %s)", got, tc.wantNode, c.reason("new"), c.b.Messages["new"])
			}
			if tc.wantReason != "" {
				if got := c.reason("new"); got != tc.wantReason {
					t.Errorf("reason %q (%s), want %q", got, c.b.Messages["new"], tc.wantReason)
				}
				if tc.wantReason == api.ReasonDriftedNodesOnly && !strings.Contains(c.b.Messages["new"], "n1") {
					t.Errorf("message %q does not name the drifted node n1", c.b.Messages["new"])
				}
			}
			// What runs on the drifted node stays: no eviction, no release.
			if ev := c.b.EvictedPods(); len(ev) > 0 {
				t.Errorf("evicted %v, want none", ev)
			}
			if rel := c.b.ReleasedPods(); len(rel) > 0 {
				t.Errorf("released %v, want none", rel)
			}
			obj, _, _ := c.pods.GetByKey("default/old")
			if p := obj.(*corev1.Pod); p.Spec.NodeName != "n1" || p.DeletionTimestamp != nil {
				t.Errorf("the pod already on the drifted node moved or went: node %q deleted %v", p.Spec.NodeName, p.DeletionTimestamp)
			}
		})
	}
}

// TestDriftedNodeNominatedByKarpenterIsUsed: a pod that fits only on a
// drifted node waits, and its placeholder asks Karpenter for capacity; when
// Karpenter nominates the drifted node for it (it sees room there and buys
// nothing), the pod is placed there instead of waiting for a node that a
// fraction running there may keep from ever being replaced.
func TestDriftedNodeNominatedByKarpenterIsUsed(t *testing.T) {
	phs := &fakePlaceholders{}
	pods := []*corev1.Pod{admitted(gpuPod("old", "q", 1), "n1"), admitted(gpuPod("full-n2", "q", 2), "n2"), gpuPod("new", "q", 1)}
	c := newClusterWith(t, Options{Policy: "binpack", BindWorkers: 1, AvoidDriftedNodes: true},
		Deps{Queues: staticQueues([]*v1alpha1.Queue{queueOf("q", "8")}), NodeDrifted: driftedSet("n1"), Placeholders: phs},
		[]*corev1.Node{h100Node("n1", "a", 2), h100Node("n2", "a", 2)}, pods...)
	c.cycle()
	if got := c.reason("new"); got != api.ReasonDriftedNodesOnly {
		t.Fatalf("reason %q (%s), want %q", got, c.b.Messages["new"], api.ReasonDriftedNodesOnly)
	}
	if len(phs.created) == 0 {
		t.Fatal("no placeholder asked Karpenter for capacity")
	}
	c.s.OnEvent(&corev1.Event{
		Reason:         karpenterNominated,
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: api.ReservationNamespace, Name: phs.created[0]},
		Message:        "Pod should schedule on: node/n1",
	})
	for range 2 {
		c.cycle()
	}
	if got := c.boundTo("new"); got != "n1" {
		t.Errorf("new pod bound to %q, want n1, the drifted node Karpenter nominated (reason %q: %s)", got, c.reason("new"), c.b.Messages["new"])
	}
}

// A drifted node's reservations are orphaned: they take no new fraction,
// stay while a fraction runs on their GPU (Fractions counts it), and the
// reservation manager removes them once none does.
func TestDriftedNodeReservationsEndWithTheirFractions(t *testing.T) {
	node := h100Node("n1", "a", 2)
	gpu := "GPU-n1-0"
	res := reservation.PodAt("n1", gpu, 0, reservation.DefaultOptions())
	res.Annotations[api.AnnotationReservedGPU] = gpu
	f := admitted(fracPod("f", "q", 30), "n1")
	f.Annotations[api.AnnotationGPU] = gpu
	binding := fracPod("binding", "q", 30) // being bound: the informer does not show it bound yet
	for _, tc := range []struct {
		name      string
		drifted   map[string]bool
		pods      []*corev1.Pod
		assumed   map[types.UID]state.Assumed
		orphaned  bool
		fractions int
	}{
		{name: "drifted while a fraction is being bound there", drifted: map[string]bool{"n1": true}, pods: []*corev1.Pod{res, binding},
			assumed: map[types.UID]state.Assumed{binding.UID: {Node: "n1", GPU: gpu}}, orphaned: true, fractions: 1},
		{name: "drifted, a fraction runs", drifted: map[string]bool{"n1": true}, pods: []*corev1.Pod{res, f}, orphaned: true, fractions: 1},
		{name: "drifted, no fraction", drifted: map[string]bool{"n1": true}, pods: []*corev1.Pod{res}, orphaned: true},
		{name: "not drifted", pods: []*corev1.Pod{res, f}, fractions: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap, err := state.Build(state.Inputs{Nodes: []*corev1.Node{node}, Pods: tc.pods, Assumed: tc.assumed, Drifted: tc.drifted})
			if err != nil {
				t.Fatal(err)
			}
			r := snap.Reservations[state.NodeGPU{Node: "n1", GPU: gpu}]
			if r == nil {
				t.Fatal("no reservation in the snapshot")
			}
			if (r.Orphaned != "") != tc.orphaned || r.Fractions != tc.fractions {
				t.Errorf("orphaned %q fractions %d, want orphaned %v fractions %d", r.Orphaned, r.Fractions, tc.orphaned, tc.fractions)
			}
			if tc.orphaned && !strings.Contains(r.Orphaned, "drifted") {
				t.Errorf("orphaned %q, want it to say the node is drifted", r.Orphaned)
			}
			if _, in := snap.Index("n1"); in == (tc.drifted != nil) {
				t.Errorf("n1 in the snapshot: %v, want %v", in, tc.drifted == nil)
			}
		})
	}
}
