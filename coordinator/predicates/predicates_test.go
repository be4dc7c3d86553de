package predicates

import (
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/tests/builders"
)

func TestNodePredicates(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	drain := func(value string) func(n *corev1.Node) {
		return func(n *corev1.Node) {
			n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: api.TaintDraining, Value: value, Effect: corev1.TaintEffectNoSchedule})
		}
	}
	future, past := strconv.FormatInt(now.Add(time.Minute).Unix(), 10), strconv.FormatInt(now.Add(-time.Minute).Unix(), 10)
	for _, tt := range []struct {
		name                           string
		edit                           func(n *corev1.Node)
		ready, draining, drainingAtNow bool
	}{
		{name: "ready", ready: true},
		{name: "not ready", edit: func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionFalse }},
		{name: "no Ready condition", edit: func(n *corev1.Node) { n.Status.Conditions = nil }},
		{name: "cordoned", edit: func(n *corev1.Node) { n.Spec.Unschedulable = true }},
		{name: "being deleted", edit: func(n *corev1.Node) { n.DeletionTimestamp = &metav1.Time{Time: now} }},
		{name: "drained until later", edit: drain(future), draining: true, drainingAtNow: true},
		{name: "drain past its deadline", edit: drain(past), draining: true},
		{name: "a deadline that does not parse is passed", edit: drain("soon"), draining: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			n := builders.MakeNode("n").Obj()
			n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
			if tt.edit != nil {
				tt.edit(n)
			}
			if got := NodeReady(n); got != tt.ready {
				t.Errorf("NodeReady = %v, want %v", got, tt.ready)
			}
			if got := Draining(n); got != tt.draining {
				t.Errorf("Draining = %v, want %v", got, tt.draining)
			}
			if got := DrainingAt(n, now); got != tt.drainingAtNow {
				t.Errorf("DrainingAt(now) = %v, want %v", got, tt.drainingAtNow)
			}
			if tt.draining && !DrainingAt(n, time.Time{}) {
				t.Error("DrainingAt(zero time) = false: a zero now ignores the deadline")
			}
		})
	}
}

func TestPodPredicates(t *testing.T) {
	pod := func(phase corev1.PodPhase, ann map[string]string) *corev1.Pod {
		p := builders.MakePod("p", "default").Obj()
		p.Status.Phase = phase
		p.Annotations = ann
		return p
	}
	for _, phase := range []corev1.PodPhase{corev1.PodPending, corev1.PodRunning, corev1.PodUnknown} {
		if Terminal(pod(phase, nil)) {
			t.Errorf("Terminal(%s) = true", phase)
		}
	}
	for _, phase := range []corev1.PodPhase{corev1.PodSucceeded, corev1.PodFailed} {
		if !Terminal(pod(phase, nil)) {
			t.Errorf("Terminal(%s) = false", phase)
		}
	}
	planned := map[string]string{api.AnnotationGPU: "GPU-a"}
	given := map[string]string{api.AnnotationGPU: "GPU-a", api.AnnotationReservedGPU: "GPU-b", api.AnnotationAllocatedGPU: "GPU-c"}
	if g := ReservedGPU(pod("", planned)); g != "GPU-a" {
		t.Errorf("ReservedGPU before admission = %q, want the planned GPU-a", g)
	}
	if g := ReservedGPU(pod("", given)); g != "GPU-b" {
		t.Errorf("ReservedGPU = %q, want the kubelet's GPU-b", g)
	}
	if g := FractionGPU(pod("", planned)); g != "GPU-a" {
		t.Errorf("FractionGPU before admission = %q, want the planned GPU-a", g)
	}
	if g := FractionGPU(pod("", given)); g != "GPU-c" {
		t.Errorf("FractionGPU = %q, want the node agent's GPU-c", g)
	}
	r := pod(corev1.PodRunning, nil)
	r.Namespace, r.Labels = api.ReservationNamespace, map[string]string{api.LabelRole: api.RoleReservation}
	if !IsReservation(r) {
		t.Error("IsReservation(a reservation) = false")
	}
	// The label alone, in a tenant's namespace, makes no reservation.
	r.Namespace = "team-a"
	if IsReservation(r) {
		t.Error("IsReservation(a tenant's pod with the reservation label) = true")
	}
}

// TestNeverRan: a failed pod never ran when none of its containers started.
func TestNeverRan(t *testing.T) {
	started := metav1.NewTime(time.Date(2026, 11, 30, 1, 0, 0, 0, time.UTC))
	for _, tc := range []struct {
		name  string
		phase corev1.PodPhase
		init  []corev1.ContainerStatus
		main  []corev1.ContainerStatus
		want  bool
	}{
		{"failed, no status", corev1.PodFailed, nil, nil, true},
		{"failed, waiting", corev1.PodFailed, nil, []corev1.ContainerStatus{{Name: "m", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{}}}}, true},
		{"failed, terminated never started", corev1.PodFailed, nil, []corev1.ContainerStatus{{Name: "m", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 128}}}}, true},
		{"failed after it ran", corev1.PodFailed, nil, []corev1.ContainerStatus{{Name: "m", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, StartedAt: started}}}}, false},
		{"failed, an init container ran", corev1.PodFailed, []corev1.ContainerStatus{{Name: "i", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{StartedAt: started}}}}, nil, false},
		{"failed, ran before a restart", corev1.PodFailed, nil, []corev1.ContainerStatus{{Name: "m", LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{StartedAt: started}}}}, false},
		{"failed while running", corev1.PodFailed, nil, []corev1.ContainerStatus{{Name: "m", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}, false},
		{"running", corev1.PodRunning, nil, nil, false},
		{"succeeded", corev1.PodSucceeded, nil, nil, false},
	} {
		p := builders.MakePod("p", "default").Obj()
		p.Status.Phase, p.Status.InitContainerStatuses, p.Status.ContainerStatuses = tc.phase, tc.init, tc.main
		if got := NeverRan(p); got != tc.want {
			t.Errorf("%s: NeverRan = %v, want %v", tc.name, got, tc.want)
		}
	}
}
