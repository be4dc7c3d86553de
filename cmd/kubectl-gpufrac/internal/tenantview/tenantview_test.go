package tenantview

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/tests/builders"
)

func rejected(p *corev1.Pod) *corev1.Pod {
	p.Status.Reason, p.Status.Message = "UnexpectedAdmissionError", "no GPU"
	return p
}

func TestBuild(t *testing.T) {
	tests := []struct {
		name string
		pod  *corev1.Pod
		want []Pod // nil: left out
	}{
		{
			name: "a bound fraction whose GPU gpufrac-node has not written back shows the coordinator's choice",
			pod: builders.MakePod("f", "ns").Fraction(30).Queue("a").Node("n1").Phase(corev1.PodRunning).
				Annotation(api.AnnotationGPU, "GPU-1").Annotation(api.AnnotationAdmittedQueue, "a").Obj(),
			want: []Pod{{Namespace: "ns", Name: "f", Node: "n1", GPU: "GPU-1", Share: "30%", Percent: 30, Phase: "Running", Queue: "a"}},
		},
		{
			name: "the admitted queue wins over a label changed since",
			pod: builders.MakePod("f", "ns").Fraction(30).Queue("b").Node("n1").Phase(corev1.PodRunning).
				Annotation(api.AnnotationAllocatedGPU, "GPU-2").Annotation(api.AnnotationGPU, "GPU-1").Annotation(api.AnnotationAdmittedQueue, "a").Obj(),
			want: []Pod{{Namespace: "ns", Name: "f", Node: "n1", GPU: "GPU-2", Share: "30%", Percent: 30, Phase: "Running", Queue: "a"}},
		},
		{
			name: "a pod the kubelet rejected keeps its reason",
			pod:  rejected(builders.MakePod("r", "ns").GPUs(1).Node("n1").Phase(corev1.PodFailed).Obj()),
			want: []Pod{{Namespace: "ns", Name: "r", Node: "n1", Share: "1 GPU", Whole: 1, Phase: "Failed", Reason: "UnexpectedAdmissionError", Message: "no GPU"}},
		},
		{
			name: "other failed pods are left out",
			pod:  builders.MakePod("r", "ns").GPUs(1).Node("n1").Phase(corev1.PodFailed).Obj(),
		},
		{
			name: "MIG devices",
			pod:  builders.MakePod("m", "ns").Resource("nvidia.com/mig-1g.10gb", "2").SchedulerName("default-scheduler").Phase(corev1.PodPending).Obj(),
			want: []Pod{{Namespace: "ns", Name: "m", Share: "nvidia.com/mig-1g.10gb 2", Phase: "Pending"}},
		},
		{
			name: "pods without GPUs scheduled by another scheduler are left out",
			pod:  builders.MakePod("web", "ns").SchedulerName("default-scheduler").CPU("1").Obj(),
		},
		{
			name: "finished pods are left out",
			pod:  builders.MakePod("done", "ns").Fraction(10).Phase(corev1.PodSucceeded).Obj(),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Build("ns", []corev1.Pod{*tt.pod}).Pods
			want := tt.want
			if want == nil {
				want = []Pod{}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("pods (-want +got):\n%s", diff)
			}
		})
	}
}
