package scheduler

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/placement"
	"github.com/gpufrac/gpufrac/coordinator/podrequest"
	"github.com/gpufrac/gpufrac/coordinator/reservation"
	"github.com/gpufrac/gpufrac/coordinator/state"
)

// TestPlans: a plan is kept while its node, its GPU and its reservation
// still hold on the snapshot, and assumed there; recorded again, a plan on
// the same node and GPU keeps the time its pod began to wait.
func TestPlans(t *testing.T) {
	now := time.Date(2026, 11, 30, 1, 0, 0, 0, time.UTC)
	frac := podInfo{pod: fracPod("f", "q", 30), Parsed: podrequest.Parsed{Request: placement.Request{CPUMilli: 1000, ShareMilli: 300}}}
	w := &workload{pods: []podInfo{frac}}
	onGPU0 := placement.Decision{Node: "n1", GPUs: []string{"GPU-n1-0"}, GPUIndices: []int{0}, MilliPerGPU: 300}
	reservationOf := func(edit func(p *corev1.Pod)) *corev1.Pod {
		p := reservation.PodAt("n1", "GPU-n1-0", 0, reservation.DefaultOptions())
		p.UID, p.Spec.NodeName, p.Status.Phase = "r", "n1", corev1.PodRunning
		p.Annotations[api.AnnotationReservedGPU] = "GPU-n1-0"
		if edit != nil {
			edit(p)
		}
		return p
	}
	for _, tc := range []struct {
		name  string
		plan  *plan // w's pod's plan (nil: none)
		nodes []*corev1.Node
		pods  []*corev1.Pod
		kept  bool
	}{
		{name: "no plan", nodes: []*corev1.Node{h100Node("n1", "p", 2)}},
		{name: "the reservation admitted", plan: &plan{Decision: onGPU0, seen: true}, nodes: []*corev1.Node{h100Node("n1", "p", 2)},
			pods: []*corev1.Pod{reservationOf(nil)}, kept: true},
		{name: "the reservation not shown yet", plan: &plan{Decision: onGPU0}, nodes: []*corev1.Node{h100Node("n1", "p", 2)}, kept: true},
		{name: "the reservation shown once, gone since", plan: &plan{Decision: onGPU0, seen: true}, nodes: []*corev1.Node{h100Node("n1", "p", 2)}},
		{name: "the reservation being deleted", plan: &plan{Decision: onGPU0, seen: true}, nodes: []*corev1.Node{h100Node("n1", "p", 2)},
			pods: []*corev1.Pod{reservationOf(func(p *corev1.Pod) { ts := metav1.NewTime(now); p.DeletionTimestamp = &ts })}},
		{name: "the reservation failed", plan: &plan{Decision: onGPU0, seen: true}, nodes: []*corev1.Node{h100Node("n1", "p", 2)},
			pods: []*corev1.Pod{reservationOf(func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed })}},
		{name: "the node gone", plan: &plan{Decision: onGPU0}, nodes: []*corev1.Node{h100Node("n2", "p", 2)}},
		{name: "the node's GPUs changed", plan: &plan{Decision: placement.Decision{Node: "n1", GPUs: []string{"GPU-old"}, GPUIndices: []int{0}, MilliPerGPU: 300}},
			nodes: []*corev1.Node{h100Node("n1", "p", 2)}},
		{name: "the node cordoned", plan: &plan{Decision: onGPU0}, nodes: []*corev1.Node{func() *corev1.Node {
			n := h100Node("n1", "p", 2)
			n.Spec.Unschedulable = true
			return n
		}()}},
		{name: "the node tainted since", plan: &plan{Decision: onGPU0}, nodes: []*corev1.Node{func() *corev1.Node {
			n := h100Node("n1", "p", 2)
			n.Spec.Taints = []corev1.Taint{{Key: "dedicated", Value: "other-team", Effect: corev1.TaintEffectNoSchedule}}
			return n
		}()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap, err := state.Build(state.Inputs{Nodes: tc.nodes, Pods: tc.pods, Now: now})
			if err != nil {
				t.Fatal(err)
			}
			ps := plans{}
			if tc.plan != nil {
				ps[frac.pod.UID] = *tc.plan
			}
			free := func() int { // GPU-n1-0's true free milli, 0 without n1
				if i, ok := snap.Index("n1"); ok {
					return snap.Node(i).GPUs[0].FreeMilli
				}
				return 0
			}
			before := free()
			ds := ps.keep(snap, w)
			if kept := ds != nil; kept != tc.kept {
				t.Fatalf("kept %v, want %v", kept, tc.kept)
			}
			if want := map[bool]int{true: 300, false: 0}[tc.kept]; before-free() != want {
				t.Errorf("%d milli-GPU assumed on GPU-n1-0, want %d", before-free(), want)
			}
			if ps.anyOf(w) != (tc.plan != nil) || ps.firstOf(w) != (tc.plan != nil) {
				t.Errorf("anyOf %v, firstOf %v: want both %v", ps.anyOf(w), ps.firstOf(w), tc.plan != nil)
			}
		})
	}

	t.Run("record", func(t *testing.T) {
		snap, err := state.Build(state.Inputs{Nodes: []*corev1.Node{h100Node("n1", "p", 2)}, Pods: []*corev1.Pod{reservationOf(nil)}, Now: now})
		if err != nil {
			t.Fatal(err)
		}
		onGPU1 := placement.Decision{Node: "n1", GPUs: []string{"GPU-n1-1"}, GPUIndices: []int{1}, MilliPerGPU: 300}
		earlier := now.Add(-time.Minute)
		for _, st := range []struct {
			name  string
			d     placement.Decision
			since time.Time
			seen  bool
		}{
			{"on the GPU it waited for", onGPU0, earlier, true},
			{"on another GPU", onGPU1, now, false},
		} {
			previous := plans{frac.pod.UID: {Decision: onGPU0, since: earlier}}
			ps := plans{}
			ps.record(previous, w, []placement.Decision{st.d}, snap, now)
			got, ok := ps[types.UID("f")]
			if !ok || !got.since.Equal(st.since) || got.seen != st.seen {
				t.Errorf("%s: plan %+v (recorded %v), want since %v, seen %v", st.name, got, ok, st.since, st.seen)
			}
		}
	})
}
