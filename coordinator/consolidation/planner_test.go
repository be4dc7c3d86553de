package consolidation

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/placeholder"
	"github.com/gpufrac/gpufrac/coordinator/pricing"
	"github.com/gpufrac/gpufrac/tests/builders"
)

// The cluster as data: Karpenter nodes of pool "gpu", 1×H100 and 8×H100,
// every GPU in fraction mode, priced as in the test bed.

func prices(t testing.TB) *pricing.Table {
	t.Helper()
	tab, err := pricing.Parse([]byte(`
instanceTypes:
  - {name: gpu-8x-h100, gpus: 8, price: 98.32}
  - {name: gpu-1x-h100, gpus: 1, price: 14.19}
`))
	if err != nil {
		t.Fatal(err)
	}
	return tab
}

// karpNode is a Ready Karpenter node of pool gpu with n fraction-mode GPUs.
func karpNode(name string, n int) *builders.NodeWrapper {
	typ := fmt.Sprintf("gpu-%dx-h100", n)
	return builders.MakeNode(name).Pool("gpu").Label(corev1.LabelInstanceTypeStable, typ).
		Product("NVIDIA-H100-80GB-HBM3").Inventory("fraction", n).CPU("192").Memory("2Ti")
}

// staticNode is a GPU node no NodePool owns.
func staticNode(name string, n int) *builders.NodeWrapper {
	return builders.MakeNode(name).Product("NVIDIA-H100-80GB-HBM3").Inventory("fraction", n)
}

// job is a preemptible pod of the coordinator owned by a ReplicaSet, bound to node.
func job(name, node string) *builders.PodWrapper {
	return builders.MakePod(name, "default").UID(name).Queue("q").Node(node).OwnedBy("apps/v1", "ReplicaSet", "rs-"+name)
}

// frac is a running fraction of pct percent on GPU i of node.
func frac(name, node string, gpu, pct int) *builders.PodWrapper {
	return job(name, node).Fraction(pct).Annotation(api.AnnotationGPU, builders.GPUUUID(node, gpu)).
		Annotation(api.AnnotationAllocatedGPU, builders.GPUUUID(node, gpu))
}

// whole is a running whole-GPU pod holding GPU i of node.
func whole(name, node string, gpu int) *builders.PodWrapper {
	return job(name, node).GPUs(1).Annotation(api.AnnotationAllocatedGPU, builders.GPUUUID(node, gpu))
}

// reservation is the reservation pod of GPU i of node.
func reservation(node string, gpu int) *corev1.Pod {
	g := builders.GPUUUID(node, gpu)
	return builders.MakePod("gpufrac-reservation-"+node+"-"+fmt.Sprint(gpu), api.ReservationNamespace).UID("res-"+g).Node(node).
		SchedulerName("").Label(api.LabelRole, api.RoleReservation).GPUs(1).
		Annotation(api.AnnotationGPU, g).Annotation(api.AnnotationReservedGPU, g).Annotation(api.AnnotationDoNotDisrupt, "true").Obj()
}

func objs(ws ...*builders.PodWrapper) []*corev1.Pod {
	out := make([]*corev1.Pod, 0, len(ws))
	for _, w := range ws {
		out = append(out, w.Obj())
	}
	return out
}

func nodes(ws ...*builders.NodeWrapper) []*corev1.Node {
	out := make([]*corev1.Node, 0, len(ws))
	for _, w := range ws {
		out = append(out, w.Obj())
	}
	return out
}

func planner(t testing.TB, mod func(*PlannerOptions)) *Planner {
	t.Helper()
	o := PlannerOptions{Prices: prices(t), MinSavingPerMove: 0.5}
	if mod != nil {
		mod(&o)
	}
	p, err := NewPlanner(o)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func podNames(pods []*corev1.Pod) []string {
	out := []string{}
	for _, p := range pods {
		out = append(out, p.Name)
	}
	return out
}

func verdictOf(vs []NodeVerdict, node string) NodeVerdict {
	for _, v := range vs {
		if v.Node == node {
			return v
		}
	}
	return NodeVerdict{}
}

// The day's tail: an 8×H100 kept up by two 40% fractions while two 1×H100
// nodes each run a 30% fraction. Draining the 8× saves the most.
func dayTail() Cluster {
	return Cluster{
		Nodes: nodes(karpNode("big", 8), karpNode("one-a", 1), karpNode("one-b", 1)),
		Pods: append(objs(
			frac("f1", "big", 0, 40), frac("f2", "big", 1, 40),
			frac("a1", "one-a", 0, 30), frac("b1", "one-b", 0, 30),
		), reservation("big", 0), reservation("big", 1), reservation("one-a", 0), reservation("one-b", 0)),
	}
}

func TestCandidatesPrefersTheLargestSaving(t *testing.T) {
	tests := []struct {
		name       string
		cluster    Cluster
		mod        func(*PlannerOptions)
		wantNode   string
		wantPods   []string
		wantSaving float64
		verdicts   map[string]Verdict
	}{
		{
			name: "the 8x pinned by two fractions goes: they fit on the 1x nodes", cluster: dayTail(),
			wantNode: "big", wantPods: []string{"f1", "f2"}, wantSaving: 98.32,
			verdicts: map[string]Verdict{"big": VerdictCandidate, "one-a": VerdictCandidate, "one-b": VerdictCandidate},
		},
		{
			name: "without a price table savings are GPUs", cluster: dayTail(), mod: func(o *PlannerOptions) { o.Prices = nil },
			wantNode: "big", wantPods: []string{"f1", "f2"}, wantSaving: 8,
		},
		{
			name: "the 8x runs a non-preemptible pod: a 1x goes instead (equal savings: by name)",
			cluster: func() Cluster {
				c := dayTail()
				c.Pods = append(c.Pods, whole("np", "big", 2).Preemptible(false).Obj())
				return c
			}(),
			wantNode: "one-a", wantPods: []string{"a1"}, wantSaving: 14.19,
			verdicts: map[string]Verdict{"big": VerdictProtected},
		},
		{
			name: "a tenant's do-not-disrupt on a preemptible pod protects the node too",
			cluster: func() Cluster {
				c := dayTail()
				c.Pods[0].Annotations[api.AnnotationDoNotDisrupt] = "true"
				return c
			}(),
			wantNode: "one-a", wantPods: []string{"a1"}, wantSaving: 14.19,
			verdicts: map[string]Verdict{"big": VerdictProtected},
		},
		{
			name: "a bare pod has nothing to re-create it: protected unless allowed",
			cluster: func() Cluster {
				c := dayTail()
				c.Pods[0].OwnerReferences = nil
				return c
			}(),
			wantNode: "one-a", wantPods: []string{"a1"}, wantSaving: 14.19,
			verdicts: map[string]Verdict{"big": VerdictProtected},
		},
		{
			name: "a pod on a local volume cannot land elsewhere: protected",
			cluster: func() Cluster {
				c := dayTail()
				c.Pods[0].Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
					PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}}}
				return c
			}(),
			wantNode: "one-a", wantPods: []string{"a1"}, wantSaving: 14.19,
			verdicts: map[string]Verdict{"big": VerdictProtected},
		},
		{
			name: "bare pods move when the admin allows it",
			cluster: func() Cluster {
				c := dayTail()
				c.Pods[0].OwnerReferences = nil
				return c
			}(),
			mod:      func(o *PlannerOptions) { o.MoveBarePods = true },
			wantNode: "big", wantPods: []string{"f1", "f2"}, wantSaving: 98.32,
		},
		{
			name: "the 1x nodes have too little room for two 80% fractions: nothing fits anywhere",
			cluster: Cluster{
				Nodes: nodes(karpNode("big", 8), karpNode("one-a", 1)),
				Pods:  objs(frac("f1", "big", 0, 80), frac("f2", "big", 1, 80), frac("a1", "one-a", 0, 30)),
			},
			wantNode: "one-a", wantPods: []string{"a1"}, wantSaving: 14.19,
			verdicts: map[string]Verdict{"big": VerdictDoesNotFit},
		},
		{
			name: "the saving does not outweigh the restarts",
			cluster: Cluster{
				Nodes: nodes(karpNode("one-a", 1), karpNode("one-b", 1)),
				Pods:  objs(frac("a1", "one-a", 0, 10), frac("a2", "one-a", 0, 10), frac("b1", "one-b", 0, 10)),
			},
			mod:      func(o *PlannerOptions) { o.MinSavingPerMove = 10 }, // $14.19 for two restarts is below $20
			wantNode: "one-b", wantPods: []string{"b1"}, wantSaving: 14.19,
			verdicts: map[string]Verdict{"one-a": VerdictBelowThreshold, "one-b": VerdictCandidate},
		},
		{
			name: "static nodes are never drained: Karpenter could not remove them",
			cluster: Cluster{
				Nodes: nodes(staticNode("static", 8), karpNode("one-a", 1)),
				Pods:  objs(frac("s1", "static", 0, 30), frac("a1", "one-a", 0, 30)),
			},
			wantNode: "one-a", wantPods: []string{"a1"}, wantSaving: 14.19,
			verdicts: map[string]Verdict{"static": VerdictNotRemovable},
		},
		{
			// The scheduler places nothing new on drifted nodes: the 8x's
			// fractions have nowhere to go, and a 1x's move to the 8x.
			name: "drifted nodes are no destination",
			cluster: func() Cluster {
				c := dayTail()
				c.Drifted = map[string]bool{"one-a": true, "one-b": true}
				return c
			}(),
			wantNode: "one-a", wantPods: []string{"a1"}, wantSaving: 14.19,
			verdicts: map[string]Verdict{"big": VerdictDoesNotFit, "one-a": VerdictCandidate, "one-b": VerdictCandidate},
		},
		{
			// one-a runs nothing but an idle reservation: Karpenter removes
			// it, so b1 goes to one-c, not there.
			name: "an empty node is Karpenter's own business, and no destination",
			cluster: Cluster{
				Nodes: nodes(karpNode("one-a", 1), karpNode("one-b", 1), karpNode("one-c", 1)),
				Pods:  append(objs(frac("b1", "one-b", 0, 30), frac("c1", "one-c", 0, 40)), reservation("one-a", 0)),
			},
			wantNode: "one-b", wantPods: []string{"b1"}, wantSaving: 14.19,
			verdicts: map[string]Verdict{"one-a": VerdictNothingToMove, "one-b": VerdictCandidate, "one-c": VerdictCandidate},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			best, vs := planner(t, tt.mod).Candidates(tt.cluster)
			if best == nil {
				t.Fatalf("no candidate; verdicts %+v", vs)
			}
			if best.Node != tt.wantNode || best.Saving != tt.wantSaving {
				t.Errorf("best drain %s saving %v, want %s saving %v; verdicts %+v", best.Node, best.Saving, tt.wantNode, tt.wantSaving, vs)
			}
			if diff := cmp.Diff(tt.wantPods, podNames(best.Pods)); diff != "" {
				t.Errorf("pods to move (-want +got):\n%s", diff)
			}
			for node, want := range tt.verdicts {
				if got := verdictOf(vs, node); got.Verdict != want {
					t.Errorf("node %s: verdict %q (%s), want %q", node, got.Verdict, got.Reason, want)
				}
			}
		})
	}
}

func TestCandidatesFindsNothing(t *testing.T) {
	pdb := func(allowed int32) *policyv1.PodDisruptionBudget {
		min := intstr.FromInt32(1)
		return &policyv1.PodDisruptionBudget{
			ObjectMeta: metav1.ObjectMeta{Name: "keep", Namespace: "default"},
			Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: &min, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "serve"}}},
			Status:     policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: allowed},
		}
	}
	tests := []struct {
		name     string
		cluster  Cluster
		verdicts map[string]Verdict
		reason   string
	}{
		{
			name: "a PodDisruptionBudget allows no disruption",
			cluster: Cluster{
				Nodes: nodes(karpNode("one-a", 1), karpNode("one-b", 1)),
				Pods:  objs(frac("a1", "one-a", 0, 30).Label("app", "serve"), frac("b1", "one-b", 0, 30).Label("app", "serve")),
				PDBs:  []*policyv1.PodDisruptionBudget{pdb(0)},
			},
			verdicts: map[string]Verdict{"one-a": VerdictPDB, "one-b": VerdictPDB},
			reason:   "default/keep allows 0 disruptions and the move needs 1",
		},
		{
			// policy/v1: an empty selector covers every pod of the namespace.
			name: "a PodDisruptionBudget with an empty selector covers every pod of its namespace",
			cluster: Cluster{
				Nodes: nodes(karpNode("one-a", 1), karpNode("one-b", 1)),
				Pods:  objs(frac("a1", "one-a", 0, 30), frac("b1", "one-b", 0, 30)),
				PDBs: func() []*policyv1.PodDisruptionBudget {
					b := pdb(0)
					b.Spec.Selector = &metav1.LabelSelector{}
					return []*policyv1.PodDisruptionBudget{b}
				}(),
			},
			verdicts: map[string]Verdict{"one-a": VerdictPDB, "one-b": VerdictPDB},
			reason:   "default/keep allows 0 disruptions",
		},
		{
			name: "another scheduler's GPU pod cannot be simulated: protected",
			cluster: Cluster{
				Nodes: nodes(karpNode("one-a", 1), karpNode("big", 8)),
				Pods:  objs(whole("theirs", "one-a", 0).SchedulerName("")),
			},
			verdicts: map[string]Verdict{"one-a": VerdictProtected, "big": VerdictNothingToMove},
			reason:   `scheduled by "default-scheduler"`,
		},
		{
			// The binding recorded it non-preemptible; its author took the
			// annotation off after: still protected.
			name: "a pod admitted non-preemptible stays protected whatever its author edits",
			cluster: Cluster{
				Nodes: nodes(karpNode("one-a", 1), karpNode("big", 8)),
				Pods:  objs(frac("a1", "one-a", 0, 30).Annotation(api.AnnotationAdmittedPreemptible, "false")),
			},
			verdicts: map[string]Verdict{"one-a": VerdictProtected, "big": VerdictNothingToMove},
			reason:   "was admitted non-preemptible",
		},
		{
			// Moving the work onto a node Karpenter removes anyway saves
			// nothing and restarts it: a whole-GPU job on a 1x node stays.
			name: "the only room is on nodes that run nothing: no drain",
			cluster: Cluster{
				Nodes: nodes(karpNode("one-a", 1), karpNode("one-b", 1), karpNode("one-c", 1)),
				Pods:  append(objs(whole("w1", "one-a", 0)), reservation("one-c", 0)),
			},
			verdicts: map[string]Verdict{"one-a": VerdictDoesNotFit, "one-b": VerdictNothingToMove, "one-c": VerdictNothingToMove},
		},
		{
			name: "a placeholder landed: the capacity is about to be used",
			cluster: Cluster{
				Nodes: nodes(karpNode("one-a", 1), karpNode("big", 8)),
				Pods: append(objs(frac("a1", "one-a", 0, 30)),
					builders.MakePod("gpufrac-placeholder-x-0", api.ReservationNamespace).UID("ph").Node("one-a").SchedulerName("").
						Label(api.LabelRole, api.RolePlaceholder).GPUs(1).Obj()),
			},
			verdicts: map[string]Verdict{"one-a": VerdictBusy},
		},
		{
			name: "fractions do not go to exclusive-mode GPUs",
			cluster: Cluster{
				Nodes: nodes(karpNode("one-a", 1), builders.MakeNode("excl").Pool("gpu").Product("NVIDIA-H100-80GB-HBM3").Inventory("exclusive", 8)),
				Pods:  objs(frac("a1", "one-a", 0, 30)),
			},
			verdicts: map[string]Verdict{"one-a": VerdictDoesNotFit, "excl": VerdictNothingToMove},
		},
		{
			// The Eviction API refuses a pod that more than one budget
			// covers (500, whatever they allow): a drain would evict the
			// rest of the node, fail on it until its deadline, be
			// abandoned, and start again.
			name: "a pod under two PodDisruptionBudgets cannot be evicted",
			cluster: Cluster{
				Nodes: nodes(karpNode("one-a", 1), karpNode("big", 8)),
				Pods:  objs(frac("a1", "one-a", 0, 30).Label("app", "serve")),
				PDBs: func() []*policyv1.PodDisruptionBudget {
					b := pdb(5)
					b2 := pdb(5)
					b2.Name = "keep-too"
					return []*policyv1.PodDisruptionBudget{b, b2}
				}(),
			},
			verdicts: map[string]Verdict{"one-a": VerdictPDB, "big": VerdictNothingToMove},
			reason:   "default/a1 is covered by 2 PodDisruptionBudgets (default/keep, default/keep-too)",
		},
		{
			// Owner references are the tenant's to write: a GPU pod naming
			// a DaemonSet as its controller is still a GPU pod, and its
			// node's reservations may not be released under it.
			name: "a GPU pod owned by a DaemonSet is not left behind: protected",
			cluster: Cluster{
				Nodes: nodes(karpNode("one-a", 1), karpNode("big", 8)),
				Pods: objs(builders.MakePod("ds-a1", "default").UID("ds-a1").Queue("q").Node("one-a").OwnedBy("apps/v1", "DaemonSet", "ds").
					Fraction(30).Annotation(api.AnnotationGPU, builders.GPUUUID("one-a", 0)).Annotation(api.AnnotationAllocatedGPU, builders.GPUUUID("one-a", 0))),
			},
			verdicts: map[string]Verdict{"one-a": VerdictProtected, "big": VerdictNothingToMove},
			reason:   "default/ds-a1 uses GPUs and is a DaemonSet or static pod",
		},
		{
			name: "pending work takes the room first",
			cluster: Cluster{
				Nodes: nodes(karpNode("one-a", 1), karpNode("one-b", 1)),
				Pods: objs(frac("a1", "one-a", 0, 60), frac("b1", "one-b", 0, 60),
					builders.MakePod("new", "default").UID("new").Queue("q").Fraction(40)),
			},
			verdicts: map[string]Verdict{"one-a": VerdictDoesNotFit, "one-b": VerdictDoesNotFit},
		},
		{
			name: "a node annotated do-not-disrupt is Karpenter's to keep",
			cluster: Cluster{
				Nodes: nodes(karpNode("one-a", 1), karpNode("big", 8)),
				Pods:  objs(frac("a1", "one-a", 0, 30)),
			},
			verdicts: map[string]Verdict{"one-a": VerdictNotRemovable},
		},
	}
	// The last case marks its node after the table is built.
	tests[len(tests)-1].cluster.Nodes[0].Annotations[api.AnnotationDoNotDisrupt] = "true"
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			best, vs := planner(t, nil).Candidates(tt.cluster)
			if best != nil {
				t.Errorf("candidate %s (%v), want none; verdicts %+v", best.Node, podNames(best.Pods), vs)
			}
			for node, want := range tt.verdicts {
				got := verdictOf(vs, node)
				if got.Verdict != want {
					t.Errorf("node %s: verdict %q (%s), want %q", node, got.Verdict, got.Reason, want)
				}
				if tt.reason != "" && want != VerdictNothingToMove && !strings.Contains(got.Reason, tt.reason) {
					t.Errorf("node %s: reason %q, want it to mention %q", node, got.Reason, tt.reason)
				}
			}
		})
	}
}

// A gang moves whole or not at all: draining one member's node moves every
// member, and they must fit together in one pool.
func TestGangsMoveWhole(t *testing.T) {
	member := func(name, node string, gpu int) *builders.PodWrapper {
		return whole(name, node, gpu).PodGroup("train").MinMember(2)
	}
	base := Cluster{
		Nodes: nodes(karpNode("one-a", 1), karpNode("one-b", 1), karpNode("big", 8)),
		Pods:  objs(member("g0", "one-a", 0), member("g1", "one-b", 0), whole("w", "big", 0)),
	}
	best, vs := planner(t, nil).Candidates(base)
	if best == nil || best.Node != "one-a" || best.Moves() != 2 {
		t.Fatalf("best %v, want one-a moving both members (big's pod has no room on the 1x nodes); verdicts %+v", best, vs)
	}
	for _, n := range []string{"one-a", "one-b"} {
		v := verdictOf(vs, n)
		if v.Verdict != VerdictCandidate {
			t.Fatalf("%s: %+v, want a candidate (both members fit on big)", n, v)
		}
	}
	plan, err := planner(t, nil).Remaining(withTaint(base, "one-a"), "one-a")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"g0", "g1"}, podNames(plan.Pods)); diff != "" {
		t.Errorf("draining one-a moves (-want +got):\n%s", diff)
	}
	if len(plan.Units) != 1 || len(plan.Units[0]) != 2 {
		t.Errorf("units %v, want the gang as one unit", plan.Units)
	}

	// A non-preemptible member elsewhere keeps the whole gang, so its node too.
	protected := base
	protected.Pods = objs(member("g0", "one-a", 0), member("g1", "one-b", 0).Preemptible(false), whole("w", "big", 0))
	_, vs = planner(t, nil).Candidates(protected)
	if v := verdictOf(vs, "one-a"); v.Verdict != VerdictProtected || !strings.Contains(v.Reason, "gang default/train moves whole") {
		t.Errorf("one-a: %+v, want protected by its gang", v)
	}

	// Two pools, and the gang may not be split: once one-a goes, pool gpu
	// has one GPU (one-b's), pool other has big's (w0 keeps big busy: a
	// node that runs nothing is no destination).
	split := Cluster{
		Nodes: nodes(karpNode("one-a", 1), karpNode("one-b", 1), karpNode("big", 8).Pool("other")),
		Pods:  objs(member("g0", "one-a", 0), member("g1", "one-b", 0), whole("w0", "big", 7)),
	}
	_, vs = planner(t, nil).Candidates(split)
	if v := verdictOf(vs, "one-a"); v.Verdict != VerdictCandidate {
		t.Errorf("one-a: %+v; the gang fits whole in pool other (big)", v)
	}
	split.Pods = append(split.Pods, whole("w1", "big", 0).Obj(), whole("w2", "big", 1).Obj(), whole("w3", "big", 2).Obj(),
		whole("w4", "big", 3).Obj(), whole("w5", "big", 4).Obj(), whole("w6", "big", 5).Obj())
	_, vs = planner(t, nil).Candidates(split)
	if v := verdictOf(vs, "one-a"); v.Verdict != VerdictDoesNotFit || !strings.Contains(v.Reason, "gang default/train") {
		t.Errorf("one-a: %+v; one GPU left in each pool, the gang of two fits in neither", v)
	}
}

func withTaint(c Cluster, node string) Cluster {
	out := c
	out.Nodes = make([]*corev1.Node, 0, len(c.Nodes))
	for _, n := range c.Nodes {
		n = n.DeepCopy()
		if n.Name == node {
			n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: api.TaintDraining, Value: "4102444800", Effect: corev1.TaintEffectNoSchedule})
		}
		out.Nodes = append(out.Nodes, n)
	}
	return out
}

func TestRemaining(t *testing.T) {
	c := withTaint(dayTail(), "big")
	p := planner(t, nil)
	plan, err := p.Remaining(c, "big")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"f1", "f2"}, podNames(plan.Pods)); diff != "" {
		t.Errorf("left to move (-want +got):\n%s", diff)
	}
	if len(plan.Reservations) != 2 {
		t.Errorf("%d reservations, want big's 2", len(plan.Reservations))
	}

	// The draining node is no candidate and no target.
	_, vs := p.Candidates(c)
	if v := verdictOf(vs, "big"); v.Verdict != VerdictDraining {
		t.Errorf("big: %+v, want draining", v)
	}

	// A non-preemptible pod placed there anyway (it tolerates the taint): abandon.
	withNP := c
	withNP.Pods = append(append([]*corev1.Pod(nil), c.Pods...), whole("np", "big", 3).Preemptible(false).Obj())
	if _, err := p.Remaining(withNP, "big"); !errors.Is(err, ErrCannotDrain) || !strings.Contains(err.Error(), "non-preemptible") {
		t.Errorf("Remaining with a non-preemptible pod: %v, want ErrCannotDrain", err)
	}

	// The room went: the 1x nodes filled up meanwhile.
	full := c
	full.Pods = append(append([]*corev1.Pod(nil), c.Pods...), frac("a2", "one-a", 0, 70).Obj(), frac("b2", "one-b", 0, 70).Obj())
	if _, err := p.Remaining(full, "big"); !errors.Is(err, ErrCannotDrain) || !strings.Contains(err.Error(), "would not fit") {
		t.Errorf("Remaining without room: %v, want ErrCannotDrain", err)
	}

	// Moved: the fractions are gone, the reservations stay for the controller to release.
	moved := c
	moved.Pods = nil
	for _, pod := range c.Pods {
		if pod.Name != "f1" && pod.Name != "f2" {
			moved.Pods = append(moved.Pods, pod)
		}
	}
	plan, err = p.Remaining(moved, "big")
	if err != nil || len(plan.Pods) != 0 || len(plan.Reservations) != 2 {
		t.Errorf("after the move: %v pods, %d reservations, %v; want none, 2, nil", podNames(plan.Pods), len(plan.Reservations), err)
	}
}

func TestPendingWork(t *testing.T) {
	pending := func(name, reason string) *corev1.Pod {
		p := builders.MakePod(name, "default").UID(name).Queue("q").Fraction(30).Obj()
		if reason != "" {
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: reason}}
		}
		return p
	}
	nowhere := pending("nowhere", api.ReasonNoCapacity)
	nowhere.Spec.NodeSelector = map[string]string{"tenant.example/nowhere": "true"}
	c := Cluster{Nodes: nodes(karpNode("one-a", 1)), Pods: []*corev1.Pod{
		pending("fresh", ""), pending("nocap", api.ReasonNoCapacity), pending("over", api.ReasonOverQuota), nowhere,
		pending("bad", api.ReasonInvalidRequest), pending("gang", api.ReasonGangIncomplete),
		func() *corev1.Pod {
			p := pending("gated", "SchedulingGated")
			p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "example.com/hold"}}
			return p
		}(),
		builders.MakePod("gpufrac-placeholder-x-0", api.ReservationNamespace).UID("ph").SchedulerName("").Label(api.LabelRole, api.RolePlaceholder).Obj(),
		builders.MakePod("gpufrac-placeholder-y-0", api.ReservationNamespace).UID("ph-y").SchedulerName("").Label(api.LabelRole, api.RolePlaceholder).
			Annotation(placeholder.AnnotationWorkloads, "default/nowhere").Obj(),
		builders.MakePod("gpufrac-placeholder-z-0", api.ReservationNamespace).UID("ph-z").SchedulerName("").Label(api.LabelRole, api.RolePlaceholder).
			Annotation(placeholder.AnnotationWorkloads, "default/nowhere,default/nocap").Obj(),
	}}
	p := planner(t, nil)
	n, ph := p.PendingWork(c)
	if n != 2 || ph != 2 {
		t.Errorf("PendingWork = %d pending, %d placeholders; want 2 (fresh, NoCapacity; not the pod no node could hold), 2 (not the one made only for it)", n, ph)
	}
	if got := p.Starved(c); got != 1 {
		t.Errorf("Starved = %d, want 1 (nocap; not the pod no node could hold)", got)
	}
}
