package podrequest_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/request"
	"github.com/gpufrac/gpufrac/coordinator/placement"
	"github.com/gpufrac/gpufrac/coordinator/podrequest"
	"github.com/gpufrac/gpufrac/tests/builders"
)

// FuzzParse feeds Parse arbitrary labels, annotations and quantities. Parse
// must never panic, must fail only with ErrInvalidRequest or ErrJobNotFound,
// and what it accepts must satisfy the request invariants.
func FuzzParse(f *testing.F) {
	f.Add("team-a", "", "", "", "", "30", "", "", "500m", "1Gi", int32(0), int32(0), "", "")
	f.Add("team-a", "llm", "4", "H100|A100", "false", "", "8", "", "4", "64Gi", int32(50), int32(0), "", "")
	f.Add("", "g", "0", "|", "maybe", "101", "1", "2", "-1", "1e3", int32(200), int32(4), "", "")
	f.Add("Team_A", "", "x", " h100 ", "TRUE", "1.5", "0.5", "30", "1m", "0.5", int32(-5), int32(1), "", "")
	f.Add("q", "", "2147483648", "", "", "1e400", "9999999999999999999", "", "", "", int32(100), int32(3), "", "")
	f.Add("team-a", "", "", "", "", "", "", "", "1", "1Gi", int32(0), int32(0), "2", "")
	f.Add("team-a", "", "", "", "", "", "", "", "", "", int32(0), int32(0), "", "1")
	f.Add("team-a", "", "", "", "", "", "0", "", "", "", int32(0), int32(0), "65", "")
	f.Add("team-a", "", "", "", "", "20", "", "", "", "", int32(0), int32(0), "1", "3")
	f.Add("team-a", "", "", "", "", "", "", "", "", "", int32(0), int32(0), "0.5", "-1")
	f.Fuzz(func(t *testing.T, queueLabel, group, minMember, models, preemptible,
		fraction, gpus, secondFraction, cpu, memory string, priority, parallelism int32, mig, replicas string) {
		job := builders.MakeJob("job", "ns").Parallelism(parallelism).Obj()
		w := builders.MakePod("p", "ns").Priority(priority).OwnedByJob(job)
		if queueLabel != "" {
			w.Label(api.LabelQueue, queueLabel)
		}
		if group != "" {
			w.Label(api.LabelPodGroup, group)
		}
		if minMember != "" {
			w.Annotation(api.AnnotationMinMember, minMember)
		}
		if models != "" {
			w.Annotation(api.AnnotationGPUModels, models)
		}
		if preemptible != "" {
			w.Annotation(api.AnnotationPreemptible, preemptible)
		}
		pod := w.Container("second").Obj()
		setQuantity(&pod.Spec.Containers[0], api.ResourceFraction, fraction, true)
		setQuantity(&pod.Spec.Containers[0], api.ResourceGPU, gpus, true)
		setQuantity(&pod.Spec.Containers[1], api.ResourceFraction, secondFraction, true)
		setQuantity(&pod.Spec.Containers[0], corev1.ResourceCPU, cpu, false)
		setQuantity(&pod.Spec.Containers[1], corev1.ResourceMemory, memory, false)
		setQuantity(&pod.Spec.Containers[1], "nvidia.com/mig-1g.10gb", mig, true)
		setQuantity(&pod.Spec.Containers[0], api.DefaultTimesliceResource, replicas, true)

		opts := podrequest.Options{
			JobLookup:   func(ns, name string) (*batchv1.Job, bool) { return job, ns == job.Namespace && name == job.Name },
			GPUModels:   []string{"NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-40GB"},
			ScalarMilli: map[string]int64{"nvidia.com/mig-1g.10gb": 125},
		}
		got, err := podrequest.Parse(pod, opts)
		if err != nil {
			var ire *podrequest.InvalidRequestError
			switch {
			case errors.As(err, &ire):
				if len(ire.Problems) == 0 {
					t.Fatalf("InvalidRequestError without problems")
				}
				for _, p := range ire.Problems {
					if p.Field == "" || p.Message == "" {
						t.Fatalf("problem without field or message: %+v", p)
					}
				}
			case errors.Is(err, podrequest.ErrJobNotFound):
			default:
				t.Fatalf("unexpected error %T: %v", err, err)
			}
			return
		}
		again, err := podrequest.Parse(pod, opts)
		if err != nil {
			t.Fatalf("second Parse failed: %v", err)
		}
		if diff := cmp.Diff(got, again); diff != "" {
			t.Fatalf("Parse is not deterministic (-first +second):\n%s", diff)
		}
		r := got.Request
		if err := r.Validate(); err != nil {
			t.Fatalf("accepted request fails placement validation: %v", err)
		}
		if r.GPUs > podrequest.DefaultMaxGPUs {
			t.Fatalf("GPUs = %d above the default maximum", r.GPUs)
		}
		if r.ShareMilli != 0 && (r.ShareMilli%10 != 0 || r.ShareMilli < 10 || r.ShareMilli > placement.MilliPerGPU) {
			t.Fatalf("ShareMilli = %d is not a whole percent of one GPU", r.ShareMilli)
		}
		if r.ShareMilli > 0 && r.GPUs > 0 {
			t.Fatalf("both a share and whole GPUs: %+v", r)
		}
		if r.CPUMilli < 0 || r.MemoryBytes < 0 {
			t.Fatalf("negative CPU or memory: %+v", r)
		}
		if got.Queue == "" || got.Queue != queueLabel {
			t.Fatalf("queue = %q, label %q", got.Queue, queueLabel)
		}
		if g := got.Gang; g != nil && (g.MinMember < 1 || g.Name == "" || g.Namespace != "ns") {
			t.Fatalf("bad gang %+v", g)
		}
		if group != "" && got.Gang == nil {
			t.Fatalf("pod-group %q accepted without a gang", group)
		}
		wantNP := priority >= podrequest.DefaultNonPreemptiblePriority || strings.EqualFold(strings.TrimSpace(preemptible), "false")
		if got.NonPreemptible != wantNP {
			t.Fatalf("NonPreemptible = %v, want %v", got.NonPreemptible, wantNP)
		}
		if (len(r.Models) > 0) != (models != "") || len(got.ModelPatterns) != 0 && len(r.Models) == 0 {
			t.Fatalf("models %q gave patterns %q and request models %q", models, got.ModelPatterns, r.Models)
		}
		var units int64
		for name, n := range r.Scalars {
			if n < 1 {
				t.Fatalf("%d units of %s accepted", n, name)
			}
			units += n
		}
		if len(r.Scalars) > 0 && (r.GPUs > 0 || r.ShareMilli > 0) {
			t.Fatalf("MIG devices or replicas together with whole GPUs or a share: %+v", r)
		}
		if len(r.Scalars) > 1 && r.Scalars[api.DefaultTimesliceResource] > 0 {
			t.Fatalf("MIG devices together with replicas: %v", r.Scalars)
		}
		if (units > 0) != (got.ScalarMilli > 0) || got.ScalarMilli > podrequest.DefaultMaxGPUs*placement.MilliPerGPU {
			t.Fatalf("%d scalar units worth %d milli-GPU", units, got.ScalarMilli)
		}
		if got.QueueResources().GPUMilli != r.GPUMilli()+got.ScalarMilli {
			t.Fatalf("queue charge %d milli-GPU, request %d + scalars %d", got.QueueResources().GPUMilli, r.GPUMilli(), got.ScalarMilli)
		}
		// A bound pod the coordinator does not parse is counted by Demand:
		// where Parse accepts a pod, the two say the same.
		d := podrequest.Demand(request.Parse(pod, request.Options{}).Demand())
		if d.GPUs != r.GPUs || d.ShareMilli != r.ShareMilli || d.CPUMilli != r.CPUMilli || d.MemoryBytes != r.MemoryBytes {
			t.Fatalf("Demand %+v, Parse %+v", d, r)
		}
	})
}

// setQuantity sets a resource on a container when the string parses: both
// request and limit for extended resources, the request otherwise.
func setQuantity(c *corev1.Container, name corev1.ResourceName, s string, extended bool) {
	q, err := resource.ParseQuantity(s)
	if s == "" || err != nil {
		return
	}
	if c.Resources.Requests == nil {
		c.Resources.Requests = corev1.ResourceList{}
	}
	c.Resources.Requests[name] = q
	if extended {
		if c.Resources.Limits == nil {
			c.Resources.Limits = corev1.ResourceList{}
		}
		c.Resources.Limits[name] = q
	}
}
