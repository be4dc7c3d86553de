package scheduler

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestKubeSchedulerPlacingClaims(t *testing.T) {
	s := &Scheduler{opts: Options{SchedulerName: "gpufrac-coordinator"}}
	claimPod := func(name string, edit func(*corev1.Pod)) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			Spec: corev1.PodSpec{
				SchedulerName:  corev1.DefaultSchedulerName,
				ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: new("gpu-30pct")}},
			},
		}
		if edit != nil {
			edit(p)
		}
		return p
	}
	now := metav1.NewTime(time.Now())
	tests := []struct {
		name string
		pods []*corev1.Pod
		want string
	}{
		{"none", nil, ""},
		{"kube-scheduler placing one", []*corev1.Pod{claimPod("a", nil)}, "default/a"},
		{"ours", []*corev1.Pod{claimPod("a", func(p *corev1.Pod) { p.Spec.SchedulerName = "gpufrac-coordinator" })}, ""},
		{"bound", []*corev1.Pod{claimPod("a", func(p *corev1.Pod) { p.Spec.NodeName = "n" })}, ""},
		{"no claims", []*corev1.Pod{claimPod("a", func(p *corev1.Pod) { p.Spec.ResourceClaims = nil })}, ""},
		{"deleted", []*corev1.Pod{claimPod("a", func(p *corev1.Pod) { p.DeletionTimestamp = &now })}, ""},
		{"given up on", []*corev1.Pod{claimPod("a", func(p *corev1.Pod) {
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable}}
		}), claimPod("b", nil)}, "default/b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := s.kubeSchedulerPlacingClaims(tt.pods); got != tt.want {
				t.Errorf("kubeSchedulerPlacingClaims = %q, want %q", got, tt.want)
			}
		})
	}
}
