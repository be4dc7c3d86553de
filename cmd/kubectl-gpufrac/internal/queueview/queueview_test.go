package queueview

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/tests/builders"
)

func bound(name, q string) *builders.PodWrapper {
	return builders.MakePod(name, "ns").Queue(q).Node("n1").Phase(corev1.PodRunning).Annotation(api.AnnotationAdmittedQueue, q)
}

func TestBuild(t *testing.T) {
	tests := []struct {
		name   string
		queues []*v1alpha1.Queue
		pods   []*corev1.Pod
		claims []resourceapi.ResourceClaim
		// defaults is namespace -> its default queue.
		defaults map[string]string
		// want is queue -> used milli-GPU, running pods.
		want map[string][2]int64
		// wantPending is queue -> reason -> pods.
		wantPending map[string]map[string]int
	}{
		{
			name:   "whole GPUs and fractions add up; a MIG device is charged the coordinator's fallback worth",
			queues: []*v1alpha1.Queue{builders.MakeQueue("a").GPUQuota("4").Obj()},
			pods: []*corev1.Pod{
				bound("w", "a").GPUs(2).Obj(),
				bound("f", "a").Fraction(25).Obj(),
				bound("m", "a").Resource("nvidia.com/mig-1g.10gb", "1").Obj(),
			},
			want:        map[string][2]int64{"a": {2000 + 250 + 143, 3}},
			wantPending: map[string]map[string]int{"a": {}},
		},
		{
			name:   "pods not admitted by the coordinator, finished pods and the queue label after admission do not count",
			queues: []*v1alpha1.Queue{builders.MakeQueue("a").Obj(), builders.MakeQueue("b").Obj()},
			pods: []*corev1.Pod{
				builders.MakePod("kube", "ns").GPUs(1).Queue("a").Node("n1").Phase(corev1.PodRunning).Obj(),
				bound("done", "a").GPUs(1).Phase(corev1.PodSucceeded).Obj(),
				bound("moved", "a").Fraction(40).Label(api.LabelQueue, "b").Obj(),
			},
			want:        map[string][2]int64{"a": {400, 1}, "b": {0, 0}},
			wantPending: map[string]map[string]int{"a": {}, "b": {}},
		},
		{
			name:   "pods holding GPUs through claims are charged what the claims ask; without their claims, nothing",
			queues: []*v1alpha1.Queue{builders.MakeQueue("a").Obj()},
			pods: []*corev1.Pod{
				bound("share", "a").Claim("gpu", "c-share").Obj(),
				bound("two", "a").Claim("gpu", "c-two").Obj(),
				bound("lost", "a").Claim("gpu", "c-missing").Obj(),
			},
			claims: []resourceapi.ResourceClaim{
				*builders.MakeClaim("c-share", "ns").Shares(40).Obj(),
				*builders.MakeClaim("c-two", "ns").WholeGPUs(2).Obj(),
			},
			want:        map[string][2]int64{"a": {400 + 2000, 2}},
			wantPending: map[string]map[string]int{"a": {}},
		},
		{
			name: "a queue pods name that does not exist shows up unknown, pending pods without a condition are Waiting",
			pods: []*corev1.Pod{
				bound("x", "ghost").Fraction(10).Obj(),
				builders.MakePod("new", "ns").Fraction(10).Queue("ghost").Phase(corev1.PodPending).Obj(),
				builders.MakePod("quota", "ns").Fraction(10).Queue("ghost").PendingFor(api.ReasonOverLimit, "limit 1").Obj(),
				builders.MakePod("cpu", "ns").SchedulerName("default-scheduler").CPU("1").Queue("ghost").Obj(),
			},
			want:        map[string][2]int64{"ghost": {100, 1}},
			wantPending: map[string]map[string]int{"ghost": {ReasonWaiting: 1, api.ReasonOverLimit: 1}},
		},
		{
			name:     "a pending pod without a queue label counts under its namespace's default queue, as the coordinator charges it; another scheduler's does not",
			queues:   []*v1alpha1.Queue{builders.MakeQueue("team").Obj()},
			defaults: map[string]string{"ns": "team"},
			pods: []*corev1.Pod{
				builders.MakePod("plain", "ns").Fraction(10).PendingFor(api.ReasonOverQuota, "quota").Obj(),
				builders.MakePod("elsewhere", "other").Fraction(10).Obj(),
				builders.MakePod("kube", "ns").SchedulerName("default-scheduler").GPUs(1).Obj(),
			},
			want:        map[string][2]int64{"team": {0, 0}},
			wantPending: map[string]map[string]int{"team": {api.ReasonOverQuota: 1}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var queues []v1alpha1.Queue
			for _, q := range tt.queues {
				queues = append(queues, *q)
			}
			var pods []corev1.Pod
			for _, p := range tt.pods {
				pods = append(pods, *p)
			}
			v := Build(queues, pods, tt.claims, tt.defaults)
			got := map[string][2]int64{}
			gotPending := map[string]map[string]int{}
			for _, q := range v.Queues {
				got[q.Name] = [2]int64{q.UsedMilliGPU, int64(q.Running)}
				gotPending[q.Name] = q.Pending
				if q.UsedGPUs != FormatMilli(q.UsedMilliGPU) {
					t.Errorf("queue %s: usedGPUs %q for %d milli", q.Name, q.UsedGPUs, q.UsedMilliGPU)
				}
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("used, running (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantPending, gotPending); diff != "" {
				t.Errorf("pending (-want +got):\n%s", diff)
			}
		})
	}
}

func TestFormatMilli(t *testing.T) {
	for m, want := range map[int64]string{0: "0", 300: "0.3", 1000: "1", 1250: "1.25", 2143: "2.143"} {
		if got := FormatMilli(m); got != want {
			t.Errorf("FormatMilli(%d) = %q, want %q", m, got, want)
		}
	}
}
