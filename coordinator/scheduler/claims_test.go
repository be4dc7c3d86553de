package scheduler

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/dra"
	"github.com/gpufrac/gpufrac/tests/builders"
)

func TestKubeSchedulerPlacingClaims(t *testing.T) {
	now := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	claims := map[string]*resourceapi.ResourceClaim{"default/gpu-30pct": builders.MakeClaim("gpu-30pct", "default").Shares(30).Obj()}
	classes := dra.GpufracClasses()
	s := &Scheduler{opts: Options{SchedulerName: "gpufrac-coordinator"}, clock: clocktesting.NewFakeClock(now),
		deps: Deps{DRA: &DRADeps{GetClaim: func(ns, name string) (*resourceapi.ResourceClaim, bool) {
			c, ok := claims[ns+"/"+name]
			return c, ok
		}, Classes: &classes}}}
	claimPod := func(name string, edit func(*corev1.Pod)) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, CreationTimestamp: metav1.NewTime(now.Add(-time.Hour))},
			Spec: corev1.PodSpec{
				SchedulerName:  corev1.DefaultSchedulerName,
				ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: new("gpu-30pct")}},
			},
		}
		if edit != nil {
			edit(p)
		}
		return p
	}
	deleted := metav1.NewTime(now)
	fromTemplate := func(created time.Time) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			p.CreationTimestamp = metav1.NewTime(created)
			p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: new("gpu-30pct")}}
		}
	}
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
		{"deleted", []*corev1.Pod{claimPod("a", func(p *corev1.Pod) { p.DeletionTimestamp = &deleted })}, ""},
		{"given up on", []*corev1.Pod{claimPod("a", func(p *corev1.Pod) {
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable}}
		}), claimPod("b", nil)}, "default/b"},
		// What kube-scheduler never tries to place: a tenant's pod that
		// would keep every claim of the coordinator waiting forever.
		{"scheduling gates", []*corev1.Pod{claimPod("a", func(p *corev1.Pod) {
			p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "example.com/hold"}}
		})}, ""},
		{"a scheduler that does not exist", []*corev1.Pod{claimPod("a", func(p *corev1.Pod) { p.Spec.SchedulerName = "nobody" })}, ""},
		{"a claim that does not exist", []*corev1.Pod{claimPod("a", func(p *corev1.Pod) {
			p.Spec.ResourceClaims[0].ResourceClaimName = new("never-made")
		})}, ""},
		{"a template's claim not made for an hour", []*corev1.Pod{claimPod("a", fromTemplate(now.Add(-time.Hour)))}, ""},
		// A claim kube-controller-manager is about to make: wait for it.
		{"a template's claim not made yet", []*corev1.Pod{claimPod("a", fromTemplate(now.Add(-time.Second)))}, "default/a"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := s.kubeSchedulerPlacingClaims(slices.Values(tt.pods)); got != tt.want {
				t.Errorf("kubeSchedulerPlacingClaims = %q, want %q", got, tt.want)
			}
		})
	}

	// Extended resources kube-scheduler serves through claims it makes
	// itself (KEP-5004): a class's extendedResourceName, and every class's
	// implicit deviceclass.resource.kubernetes.io/<class>. Without such a
	// class, nvidia.com/gpu is the device plugins' and no claim of ours.
	whole := builders.MakePod("w", "default").SchedulerName(corev1.DefaultSchedulerName).GPUs(1).Obj()
	implicit := builders.MakePod("i", "default").SchedulerName(corev1.DefaultSchedulerName).
		Resource(corev1.ResourceName(resourceapi.ResourceDeviceClassPrefix+api.DRAClassGPU), "1").Obj()
	if got := s.kubeSchedulerPlacingClaims(slices.Values([]*corev1.Pod{whole})); got != "" {
		t.Errorf("nvidia.com/gpu without a class mapping it: %q, want none", got)
	}
	if got := s.kubeSchedulerPlacingClaims(slices.Values([]*corev1.Pod{implicit})); got != "default/i" {
		t.Errorf("a class's implicit extended resource: %q, want default/i", got)
	}
	mapped := classes[0].DeepCopy()
	mapped.Name, mapped.Spec.ExtendedResourceName = "gpu-extended.gpufrac.io", new(api.ResourceGPU)
	classes = append(classes, mapped)
	if got := s.kubeSchedulerPlacingClaims(slices.Values([]*corev1.Pod{whole})); got != "default/w" {
		t.Errorf("nvidia.com/gpu mapped by a class: %q, want default/w", got)
	}
}
