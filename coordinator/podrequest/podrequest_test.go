package podrequest_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/request"
	"github.com/gpufrac/gpufrac/coordinator/placement"
	"github.com/gpufrac/gpufrac/coordinator/podrequest"
	"github.com/gpufrac/gpufrac/coordinator/queue"
	"github.com/gpufrac/gpufrac/tests/builders"
)

// jobs returns a JobLookup over the given Jobs.
func jobs(js ...*batchv1.Job) func(ns, name string) (*batchv1.Job, bool) {
	return func(ns, name string) (*batchv1.Job, bool) {
		for _, j := range js {
			if j.Namespace == ns && j.Name == name {
				return j, true
			}
		}
		return nil, false
	}
}

func pod(name string) *builders.PodWrapper { return builders.MakePod(name, "ns").Queue("team-a") }

const gib = int64(1) << 30

const (
	mig1g = "nvidia.com/mig-1g.10gb"
	mig3g = "nvidia.com/mig-3g.40gb"
)

func TestParse(t *testing.T) {
	products := []string{"NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-40GB", "Tesla-T4", "NVIDIA-A100-SXM4-40GB"}
	trainer := builders.MakeJob("trainer", "ns").Parallelism(4).Obj()
	tests := []struct {
		name string
		pod  *corev1.Pod
		opts podrequest.Options
		want podrequest.Parsed
	}{
		{
			name: "a fraction with CPU and memory",
			pod:  pod("p").Fraction(30).CPU("500m").Memory("1Gi").Obj(),
			want: podrequest.Parsed{
				Request: placement.Request{CPUMilli: 500, MemoryBytes: gib, ShareMilli: 300},
				Queue:   "team-a",
			},
		},
		{
			name: "a fraction of 100 is a share of a whole GPU",
			pod:  pod("p").Fraction(100).Obj(),
			want: podrequest.Parsed{Request: placement.Request{ShareMilli: placement.MilliPerGPU}, Queue: "team-a"},
		},
		{
			name: "a fraction set only as a limit",
			pod:  pod("p").Limit(api.ResourceFraction, "25").Obj(),
			want: podrequest.Parsed{Request: placement.Request{ShareMilli: 250}, Queue: "team-a"},
		},
		{
			name: "whole GPUs add up over containers",
			pod:  pod("p").GPUs(1).Container("second").GPUs(2).Obj(),
			want: podrequest.Parsed{Request: placement.Request{GPUs: 3}, Queue: "team-a"},
		},
		{
			name: "an init container needing more GPUs than the app containers sets the total",
			pod:  pod("p").GPUs(1).InitContainer("setup").GPUs(4).Obj(),
			want: podrequest.Parsed{Request: placement.Request{GPUs: 4}, Queue: "team-a"},
		},
		{
			name: "sidecars add to the app containers and to later init containers",
			pod: pod("p").GPUs(2).
				SidecarContainer("proxy").GPUs(1).
				InitContainer("late-init").GPUs(3).Obj(),
			// late-init runs with the proxy sidecar: 1+3 beats main+proxy = 3.
			want: podrequest.Parsed{Request: placement.Request{GPUs: 4}, Queue: "team-a"},
		},
		{
			name: "nvidia.com/gpu: 0 is no GPU",
			pod:  pod("p").GPUs(0).CPU("1").Obj(),
			want: podrequest.Parsed{Request: placement.Request{CPUMilli: 1000}, Queue: "team-a"},
		},
		{
			name: "CPU and memory as kube-scheduler sums them: init maximum, overhead",
			pod: pod("p").CPU("1").Memory("1Gi").
				Container("b").CPU("1").Memory("1Gi").
				InitContainer("init").CPU("3").Memory("1Gi").
				Overhead(corev1.ResourceCPU, "250m").Overhead(corev1.ResourceMemory, "512Mi").Obj(),
			want: podrequest.Parsed{
				Request: placement.Request{CPUMilli: 3250, MemoryBytes: 2*gib + gib/2},
				Queue:   "team-a",
			},
		},
		{
			name: "GPU models resolved against the cluster's products",
			pod:  pod("p").GPUs(1).GPUModels(" h100| A100 ||a100").Obj(),
			opts: podrequest.Options{GPUModels: products},
			want: podrequest.Parsed{
				Request:       placement.Request{GPUs: 1, Models: []string{"NVIDIA-A100-SXM4-40GB", "NVIDIA-H100-80GB-HBM3"}},
				ModelPatterns: []string{"h100", "A100", "a100"},
				Queue:         "team-a",
			},
		},
		{
			name: "GPU models that match no product stay as patterns, which placement matches exactly",
			pod:  pod("p").GPUs(1).GPUModels("B200").Obj(),
			opts: podrequest.Options{GPUModels: products},
			want: podrequest.Parsed{
				Request:       placement.Request{GPUs: 1, Models: []string{"B200"}},
				ModelPatterns: []string{"B200"},
				Queue:         "team-a",
			},
		},
		{
			name: "node constraints",
			pod: pod("p").Fraction(50).
				NodeSelector("zone", "a").
				RequiredNodeAffinity("gpu", corev1.NodeSelectorOpIn, "big", "huge").
				Toleration("nvidia.com/gpu", "", "", corev1.TaintEffectNoSchedule).Obj(),
			want: podrequest.Parsed{
				Request: placement.Request{ShareMilli: 500, Constraints: &placement.Constraints{
					NodeSelector: map[string]string{"zone": "a"},
					Affinity: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
						MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "gpu", Operator: corev1.NodeSelectorOpIn, Values: []string{"big", "huge"}}},
					}}},
					Tolerations: []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
				}},
				Queue: "team-a",
			},
		},
		{
			name: "high priority is non-preemptible",
			pod:  pod("p").GPUs(1).Priority(1000000).Obj(),
			want: podrequest.Parsed{Request: placement.Request{GPUs: 1}, Queue: "team-a", Priority: 1000000, NonPreemptible: true},
		},
		{
			name: "below the threshold is preemptible",
			pod:  pod("p").GPUs(1).Priority(999999).Preemptible(true).Obj(),
			want: podrequest.Parsed{Request: placement.Request{GPUs: 1}, Queue: "team-a", Priority: 999999},
		},
		{
			name: "annotated non-preemptible",
			pod:  pod("p").GPUs(1).Annotation(api.AnnotationPreemptible, "False").Obj(),
			want: podrequest.Parsed{Request: placement.Request{GPUs: 1}, Queue: "team-a", NonPreemptible: true},
		},
		{
			name: "threshold from the options",
			pod:  pod("p").GPUs(1).Priority(10).Obj(),
			opts: podrequest.Options{NonPreemptiblePriority: ptr.To[int32](10)},
			want: podrequest.Parsed{Request: placement.Request{GPUs: 1}, Queue: "team-a", Priority: 10, NonPreemptible: true},
		},
		{
			name: "more GPUs allowed by the options",
			pod:  pod("p").GPUs(16).Obj(),
			opts: podrequest.Options{MaxGPUs: 16},
			want: podrequest.Parsed{Request: placement.Request{GPUs: 16}, Queue: "team-a"},
		},
		{
			name: "gang from label and annotation",
			pod:  pod("p").GPUs(8).PodGroup("llm").MinMember(4).Obj(),
			want: podrequest.Parsed{
				Request: placement.Request{GPUs: 8}, Queue: "team-a",
				Gang: &podrequest.Gang{Namespace: "ns", Name: "llm", MinMember: 4},
			},
		},
		{
			name: "gang of a PodGroup with the gang policy",
			pod:  pod("p").GPUs(1).SchedulingGroup("trainer-pg").OwnedByJob(trainer).Obj(),
			opts: podrequest.Options{PodGroupLookup: builders.PodGroupLookup(builders.MakePodGroup("trainer-pg", "ns").Gang(8).Obj()), JobLookup: jobs(trainer)},
			want: podrequest.Parsed{
				Request: placement.Request{GPUs: 1}, Queue: "team-a",
				Gang: &podrequest.Gang{Namespace: "ns", Name: "podgroup/trainer-pg", MinMember: 8, PodGroup: "trainer-pg"},
			},
		},
		{
			name: "a PodGroup not created yet: the pod waits for it",
			pod:  pod("p").GPUs(1).SchedulingGroup("later").Obj(),
			opts: podrequest.Options{PodGroupLookup: builders.PodGroupLookup()},
			want: podrequest.Parsed{
				Request: placement.Request{GPUs: 1}, Queue: "team-a",
				Gang: &podrequest.Gang{Namespace: "ns", Name: "podgroup/later", PodGroup: "later", Missing: true},
			},
		},
		{
			name: "a PodGroup with the basic policy: each pod alone",
			pod:  pod("p").GPUs(1).SchedulingGroup("basic").Obj(),
			opts: podrequest.Options{PodGroupLookup: builders.PodGroupLookup(builders.MakePodGroup("basic", "ns").Obj())},
			want: podrequest.Parsed{Request: placement.Request{GPUs: 1}, Queue: "team-a"},
		},
		{
			name: "a PodGroup of another namespace is not the pod's",
			pod:  pod("p").GPUs(1).SchedulingGroup("trainer-pg").Obj(),
			opts: podrequest.Options{PodGroupLookup: builders.PodGroupLookup(builders.MakePodGroup("trainer-pg", "other").Gang(8).Obj())},
			want: podrequest.Parsed{
				Request: placement.Request{GPUs: 1}, Queue: "team-a",
				Gang: &podrequest.Gang{Namespace: "ns", Name: "podgroup/trainer-pg", PodGroup: "trainer-pg", Missing: true},
			},
		},
		{
			name: "gang from the owning Job's parallelism",
			pod:  pod("p").GPUs(1).OwnedByJob(trainer).Obj(),
			opts: podrequest.Options{JobLookup: jobs(trainer)},
			want: podrequest.Parsed{
				Request: placement.Request{GPUs: 1}, Queue: "team-a",
				Gang: &podrequest.Gang{Namespace: "ns", Name: "trainer", MinMember: 4, FromJob: true},
			},
		},
		{
			name: "completions below parallelism bound the Job's gang",
			pod:  pod("p").GPUs(1).OwnedByJob(trainer).Obj(),
			opts: podrequest.Options{JobLookup: jobs(builders.MakeJob("trainer", "ns").Parallelism(4).Completions(2).Obj())},
			want: podrequest.Parsed{
				Request: placement.Request{GPUs: 1}, Queue: "team-a",
				Gang: &podrequest.Gang{Namespace: "ns", Name: "trainer", MinMember: 2, FromJob: true},
			},
		},
		{
			name: "pod-group label with the Job's parallelism",
			pod:  pod("p").GPUs(1).PodGroup("g").OwnedByJob(trainer).Obj(),
			opts: podrequest.Options{JobLookup: jobs(trainer)},
			want: podrequest.Parsed{
				Request: placement.Request{GPUs: 1}, Queue: "team-a",
				Gang: &podrequest.Gang{Namespace: "ns", Name: "g", MinMember: 4, FromJob: true},
			},
		},
		{
			name: "min-member annotation on a Job's pod names the gang after the Job",
			pod:  pod("p").GPUs(1).MinMember(3).OwnedByJob(trainer).Obj(),
			opts: podrequest.Options{JobLookup: jobs(trainer)},
			want: podrequest.Parsed{
				Request: placement.Request{GPUs: 1}, Queue: "team-a",
				Gang: &podrequest.Gang{Namespace: "ns", Name: "trainer", MinMember: 3, FromJob: true},
			},
		},
		{
			name: "a Job running one pod at a time is no gang",
			pod:  pod("p").GPUs(1).OwnedByJob(builders.MakeJob("one", "ns").Obj()).Obj(),
			opts: podrequest.Options{JobLookup: jobs(builders.MakeJob("one", "ns").Obj())},
			want: podrequest.Parsed{Request: placement.Request{GPUs: 1}, Queue: "team-a"},
		},
		{
			name: "without a JobLookup, Job pods are scheduled alone",
			pod:  pod("p").GPUs(1).OwnedByJob(trainer).Obj(),
			want: podrequest.Parsed{Request: placement.Request{GPUs: 1}, Queue: "team-a"},
		},
		{
			name: "MIG devices are scalars worth what the inventory says",
			pod:  pod("p").Resource(mig1g, "2").CPU("1").Obj(),
			opts: podrequest.Options{ScalarMilli: map[string]int64{mig1g: 125}},
			want: podrequest.Parsed{Request: placement.Request{CPUMilli: 1000, Scalars: map[string]int64{mig1g: 2}}, Queue: "team-a", ScalarMilli: 250},
		},
		{
			name: "MIG devices no inventory mentions are worth their compute slices over 7",
			pod:  pod("p").Resource(mig3g, "1").Obj(),
			want: podrequest.Parsed{Request: placement.Request{Scalars: map[string]int64{mig3g: 1}}, Queue: "team-a", ScalarMilli: 429},
		},
		{
			name: "MIG profiles may mix, and add up like whole GPUs",
			pod: pod("p").Resource(mig1g, "1").Container("b").Resource(mig1g, "1").Resource(mig3g, "1").
				InitContainer("setup").Resource(mig1g, "3").Obj(),
			opts: podrequest.Options{ScalarMilli: map[string]int64{mig1g: 125, mig3g: 500}},
			want: podrequest.Parsed{Request: placement.Request{Scalars: map[string]int64{mig1g: 3, mig3g: 1}}, Queue: "team-a", ScalarMilli: 875},
		},
		{
			name: "a MIG device set only as a limit; zero MIG devices are none",
			pod:  pod("p").Limit(mig1g, "1").Resource(mig3g, "0").Obj(),
			want: podrequest.Parsed{Request: placement.Request{Scalars: map[string]int64{mig1g: 1}}, Queue: "team-a", ScalarMilli: 143},
		},
		{
			name: "time-sliced replicas",
			pod:  pod("p").Resource(api.DefaultTimesliceResource, "1").Obj(),
			opts: podrequest.Options{ScalarMilli: map[string]int64{api.DefaultTimesliceResource: 125}},
			want: podrequest.Parsed{Request: placement.Request{Scalars: map[string]int64{api.DefaultTimesliceResource: 1}}, Queue: "team-a", ScalarMilli: 125},
		},
		{
			name: "a renamed replica resource; the default name is then none of gpufrac's",
			pod:  pod("p").Resource("example.com/slice", "2").Resource(api.DefaultTimesliceResource, "1").Obj(),
			opts: podrequest.Options{TimesliceResource: "example.com/slice"},
			want: podrequest.Parsed{Request: placement.Request{Scalars: map[string]int64{"example.com/slice": 2}}, Queue: "team-a", ScalarMilli: 500},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := podrequest.Parse(tc.pod, tc.opts)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("parsed (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseInvalid(t *testing.T) {
	const (
		fractionLimit = "spec.containers[main].resources.limits[gpufrac.io/gpu-fraction]"
		gpuLimit      = "spec.containers[main].resources.limits[nvidia.com/gpu]"
	)
	tests := []struct {
		name string
		pod  *corev1.Pod
		opts podrequest.Options
		want []podrequest.Problem
	}{
		{
			name: "a PodGroup and the pod-group label",
			pod:  builders.MakePod("p", "ns").Queue("q").GPUs(1).SchedulingGroup("pg").PodGroup("g").MinMember(2).Obj(),
			opts: podrequest.Options{PodGroupLookup: builders.PodGroupLookup(builders.MakePodGroup("pg", "ns").Gang(2).Obj())},
			want: []podrequest.Problem{{Field: "spec.schedulingGroup.podGroupName",
				Message: `the pod is in PodGroup "pg" and names a gang with label gpufrac.io/pod-group too: use one`}},
		},
		{
			name: "a PodGroup and the min-member annotation",
			pod:  builders.MakePod("p", "ns").Queue("q").GPUs(1).SchedulingGroup("pg").MinMember(2).Obj(),
			opts: podrequest.Options{PodGroupLookup: builders.PodGroupLookup(builders.MakePodGroup("pg", "ns").Gang(2).Obj())},
			want: []podrequest.Problem{{Field: "spec.schedulingGroup.podGroupName",
				Message: `the pod is in PodGroup "pg", whose policy says how many pods start together, and sets annotation gpufrac.io/min-member too: use one`}},
		},
		{
			name: "a PodGroup where the coordinator reads none",
			pod:  builders.MakePod("p", "ns").Queue("q").GPUs(1).SchedulingGroup("pg").Obj(),
			want: []podrequest.Problem{{Field: "spec.schedulingGroup.podGroupName",
				Message: `the pod is in PodGroup "pg" but the coordinator reads no PodGroups (the API server serves no scheduling.k8s.io/v1alpha2, or the coordinator may not read it)`}},
		},
		{
			name: "no queue label",
			pod:  builders.MakePod("p", "ns").Fraction(30).Obj(),
			want: []podrequest.Problem{{Field: "metadata.labels[gpufrac.io/queue]",
				Message: "label gpufrac.io/queue is missing: set it to the leaf Queue this pod is charged to (kubectl get queues.gpufrac.io)"}},
		},
		{
			name: "queue label that cannot name a queue",
			pod:  builders.MakePod("p", "ns").Queue("Team_A").Obj(),
			want: []podrequest.Problem{{Field: "metadata.labels[gpufrac.io/queue]",
				Message: `label gpufrac.io/queue "Team_A" is not a queue name: queue names are lower-case DNS names (kubectl get queues.gpufrac.io)`}},
		},
		{
			name: "fraction above 100",
			pod:  pod("p").Fraction(150).Obj(),
			want: []podrequest.Problem{{Field: fractionLimit,
				Message: `container "main" asks 150: gpufrac.io/gpu-fraction is percent of one GPU and must be 1..100; ask nvidia.com/gpu for whole GPUs`}},
		},
		{
			name: "fraction of zero",
			pod:  pod("p").Fraction(0).Obj(),
			want: []podrequest.Problem{{Field: fractionLimit,
				Message: `container "main" asks 0: gpufrac.io/gpu-fraction is percent of one GPU and must be 1..100; ask nvidia.com/gpu for whole GPUs`}},
		},
		{
			name: "fraction that is not a whole percent",
			pod:  pod("p").Resource(api.ResourceFraction, "500m").Obj(),
			want: []podrequest.Problem{{Field: fractionLimit,
				Message: `container "main" asks 500m: gpufrac.io/gpu-fraction must be a whole number of percent of one GPU, 1..100`}},
		},
		{
			name: "fraction in an init container (one rule with gpufrac-node: refused)",
			pod:  pod("p").InitContainer("setup").Fraction(20).Obj(),
			want: []podrequest.Problem{{Field: "spec.initContainers[setup].resources.limits[gpufrac.io/gpu-fraction]",
				Message: `container "setup" is an init container and asks 20 gpufrac.io/gpu-fraction: fractions are served to app containers (spec.containers) only, ` +
					`since the kubelet reports no init container's devices and gpufrac could neither record nor limit its share; move the fraction to an app container`}},
		},
		{
			name: "fraction together with whole GPUs",
			pod:  pod("p").Fraction(30).Container("other").GPUs(1).Obj(),
			want: []podrequest.Problem{{Field: "spec",
				Message: `container "main" asks gpufrac.io/gpu-fraction and container "other" asks nvidia.com/gpu: a pod gets either whole GPUs or a fraction of one GPU, not both`}},
		},
		{
			name: "fraction in two containers",
			pod:  pod("p").Fraction(30).Container("b").Fraction(20).Obj(),
			want: []podrequest.Problem{{Field: "spec",
				Message: `containers "main", "b" all ask gpufrac.io/gpu-fraction: only one container of a pod may hold a GPU fraction (split the pod, or give one container the sum)`}},
		},
		{
			name: "more whole GPUs than a pod may have",
			pod:  pod("p").GPUs(5).Container("b").GPUs(4).Obj(),
			want: []podrequest.Problem{{Field: "spec",
				Message: "the pod asks 9 nvidia.com/gpu in total; at most 8 fit one pod: split the work across pods (a gang)"}},
		},
		{
			name: "whole GPUs that are not whole",
			pod:  pod("p").Resource(api.ResourceGPU, "1.5").Obj(),
			want: []podrequest.Problem{{Field: gpuLimit,
				Message: `container "main" asks 1500m nvidia.com/gpu: whole GPUs must be a positive whole number; use gpufrac.io/gpu-fraction for part of a GPU`}},
		},
		{
			name: "MIG devices together with a fraction",
			pod:  pod("p").Fraction(30).Container("mig").Resource(mig1g, "1").Obj(),
			want: []podrequest.Problem{{Field: "spec",
				Message: `container "main" asks gpufrac.io/gpu-fraction and container "mig" asks MIG devices (nvidia.com/mig-*): a pod gets one kind of GPU: whole GPUs, a fraction of one GPU, MIG devices or time-sliced replicas`}},
		},
		{
			name: "replicas together with whole GPUs",
			pod:  pod("p").Resource(api.DefaultTimesliceResource, "1").GPUs(1).Obj(),
			want: []podrequest.Problem{{Field: "spec",
				Message: `container "main" asks nvidia.com/gpu and container "main" asks nvidia.com/gpu.shared: a pod gets one kind of GPU: whole GPUs, a fraction of one GPU, MIG devices or time-sliced replicas`}},
		},
		{
			name: "MIG devices together with replicas",
			pod:  pod("p").Resource(mig1g, "1").Container("b").Resource(api.DefaultTimesliceResource, "1").Obj(),
			want: []podrequest.Problem{{Field: "spec",
				Message: `container "main" asks MIG devices (nvidia.com/mig-*) and container "b" asks nvidia.com/gpu.shared: a pod gets one kind of GPU: whole GPUs, a fraction of one GPU, MIG devices or time-sliced replicas`}},
		},
		{
			name: "whole GPUs, a fraction and MIG devices: both mixes are reported",
			pod:  pod("p").GPUs(1).Container("f").Fraction(10).Container("m").Resource(mig1g, "1").Obj(),
			want: []podrequest.Problem{
				{Field: "spec", Message: `container "f" asks gpufrac.io/gpu-fraction and container "main" asks nvidia.com/gpu: a pod gets either whole GPUs or a fraction of one GPU, not both`},
				{Field: "spec", Message: `container "main" asks nvidia.com/gpu and container "m" asks MIG devices (nvidia.com/mig-*): a pod gets one kind of GPU: whole GPUs, a fraction of one GPU, MIG devices or time-sliced replicas`},
			},
		},
		{
			name: "MIG devices that are not whole",
			pod:  pod("p").Resource(mig1g, "500m").Obj(),
			want: []podrequest.Problem{{Field: "spec.containers[main].resources.limits[nvidia.com/mig-1g.10gb]",
				Message: `container "main" asks 500m nvidia.com/mig-1g.10gb: MIG devices and time-sliced replicas must be a positive whole number`}},
		},
		{
			name: "more MIG devices than eight GPUs' worth",
			pod:  pod("p").Resource(mig1g, "60").Container("b").Resource(mig3g, "2").Obj(),
			opts: podrequest.Options{ScalarMilli: map[string]int64{mig1g: 125, mig3g: 500}},
			want: []podrequest.Problem{{Field: "spec",
				Message: "the pod asks 60 nvidia.com/mig-1g.10gb, 2 nvidia.com/mig-3g.40gb, 8.5 GPUs' worth in total; at most 8 GPUs' worth fit one pod: split the work across pods (a gang)"}},
		},
		{
			name: "MIG request and limit differ",
			pod:  pod("p").Request(mig1g, "2").Limit(mig1g, "1").Obj(),
			want: []podrequest.Problem{{Field: "spec.containers[main].resources.requests[nvidia.com/mig-1g.10gb]",
				Message: `container "main" requests 2 nvidia.com/mig-1g.10gb but its limit is 1: extended resources need equal requests and limits (set only the limit)`}},
		},
		{
			name: "requests and limits differ",
			pod:  pod("p").Request(api.ResourceGPU, "2").Limit(api.ResourceGPU, "1").Obj(),
			want: []podrequest.Problem{{Field: "spec.containers[main].resources.requests[nvidia.com/gpu]",
				Message: `container "main" requests 2 nvidia.com/gpu but its limit is 1: extended resources need equal requests and limits (set only the limit)`}},
		},
		{
			name: "request without a limit",
			pod:  pod("p").Request(api.ResourceFraction, "20").Obj(),
			want: []podrequest.Problem{{Field: "spec.containers[main].resources.limits[gpufrac.io/gpu-fraction]",
				Message: `container "main" requests 20 gpufrac.io/gpu-fraction without a limit: extended resources need a limit equal to the request (set only the limit)`}},
		},
		{
			name: "container sets NVIDIA_VISIBLE_DEVICES",
			pod:  pod("p").Fraction(10).InitContainer("init").Env(api.EnvVisibleDevices, "all").Obj(),
			want: []podrequest.Problem{{Field: "spec.initContainers[init].env[NVIDIA_VISIBLE_DEVICES]",
				Message: `container "init" sets NVIDIA_VISIBLE_DEVICES itself: remove it; gpufrac gives GPU access through the device plugin, and the variable would bypass it`}},
		},
		{
			name: "min-member not a positive integer",
			pod:  pod("p").PodGroup("g").Annotation(api.AnnotationMinMember, "0").Obj(),
			want: []podrequest.Problem{{Field: "metadata.annotations[gpufrac.io/min-member]",
				Message: `annotation gpufrac.io/min-member "0" must be a positive whole number: how many pods of the gang must start together`}},
		},
		{
			name: "min-member that is not a number",
			pod:  pod("p").PodGroup("g").Annotation(api.AnnotationMinMember, "four").Obj(),
			want: []podrequest.Problem{{Field: "metadata.annotations[gpufrac.io/min-member]",
				Message: `annotation gpufrac.io/min-member "four" must be a positive whole number: how many pods of the gang must start together`}},
		},
		{
			name: "pod group without min-member",
			pod:  pod("p").PodGroup("g").Obj(),
			want: []podrequest.Problem{{Field: "metadata.annotations[gpufrac.io/min-member]",
				Message: `label gpufrac.io/pod-group "g" needs annotation gpufrac.io/min-member: the number of pods of the gang that must start together`}},
		},
		{
			name: "min-member without pod group",
			pod:  pod("p").MinMember(2).Obj(),
			want: []podrequest.Problem{{Field: "metadata.labels[gpufrac.io/pod-group]",
				Message: "annotation gpufrac.io/min-member is set but label gpufrac.io/pod-group is not: name the gang with the label"}},
		},
		{
			name: "preemptible annotation neither true nor false",
			pod:  pod("p").Annotation(api.AnnotationPreemptible, "maybe").Obj(),
			want: []podrequest.Problem{{Field: "metadata.annotations[gpufrac.io/preemptible]",
				Message: `annotation gpufrac.io/preemptible "maybe" must be "true" or "false"`}},
		},
		{
			name: "GPU models annotation without a model",
			pod:  pod("p").GPUModels(" | ").Obj(),
			want: []podrequest.Problem{{Field: "metadata.annotations[gpufrac.io/gpu-models]",
				Message: `annotation gpufrac.io/gpu-models " | " names no GPU model: list models separated by |, for example "H100|A100"`}},
		},
		{
			name: "too many GPU models",
			pod:  pod("p").GPUModels(strings.Repeat("h100|", 40)).Obj(),
			want: []podrequest.Problem{{Field: "metadata.annotations[gpufrac.io/gpu-models]",
				Message: `annotation gpufrac.io/gpu-models lists 41 models, more than 32: name the few models the pod can use, for example "H100|A100"`}},
		},
		{
			name: "a long value is quoted short",
			pod:  pod("p").Annotation(api.AnnotationPreemptible, strings.Repeat("x", 1000)).Obj(),
			want: []podrequest.Problem{{Field: "metadata.annotations[gpufrac.io/preemptible]",
				Message: `annotation gpufrac.io/preemptible "` + strings.Repeat("x", 64) + `..." (1000 bytes) must be "true" or "false"`}},
		},
		{
			name: "every problem is listed",
			pod: builders.MakePod("p", "ns").Fraction(101).Env(api.EnvVisibleDevices, "0").
				PodGroup("g").Annotation(api.AnnotationMinMember, "-1").Obj(),
			want: []podrequest.Problem{
				{Field: "metadata.labels[gpufrac.io/queue]",
					Message: "label gpufrac.io/queue is missing: set it to the leaf Queue this pod is charged to (kubectl get queues.gpufrac.io)"},
				{Field: fractionLimit,
					Message: `container "main" asks 101: gpufrac.io/gpu-fraction is percent of one GPU and must be 1..100; ask nvidia.com/gpu for whole GPUs`},
				{Field: "spec.containers[main].env[NVIDIA_VISIBLE_DEVICES]",
					Message: `container "main" sets NVIDIA_VISIBLE_DEVICES itself: remove it; gpufrac gives GPU access through the device plugin, and the variable would bypass it`},
				{Field: "metadata.annotations[gpufrac.io/min-member]",
					Message: `annotation gpufrac.io/min-member "-1" must be a positive whole number: how many pods of the gang must start together`},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := podrequest.Parse(tc.pod, tc.opts)
			if !errors.Is(err, podrequest.ErrInvalidRequest) {
				t.Fatalf("Parse error = %v, want one matching ErrInvalidRequest", err)
			}
			var ire *podrequest.InvalidRequestError
			if !errors.As(err, &ire) {
				t.Fatalf("Parse error %T is not an *InvalidRequestError", err)
			}
			if diff := cmp.Diff(tc.want, ire.Problems); diff != "" {
				t.Errorf("problems (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseErrorMessage(t *testing.T) {
	_, err := podrequest.Parse(builders.MakePod("p", "ns").Fraction(0).Obj(), podrequest.Options{})
	want := "invalid GPU request: label gpufrac.io/queue is missing: set it to the leaf Queue this pod is charged to " +
		"(kubectl get queues.gpufrac.io); container \"main\" asks 0: gpufrac.io/gpu-fraction is percent of one GPU " +
		"and must be 1..100; ask nvidia.com/gpu for whole GPUs"
	if err == nil || err.Error() != want {
		t.Errorf("error = %v\nwant   %s", err, want)
	}
}

func TestParseJobNotFound(t *testing.T) {
	trainer := builders.MakeJob("trainer", "ns").Parallelism(4).Obj()
	tests := []struct {
		name string
		jobs []*batchv1.Job
	}{
		{name: "no such Job"},
		{name: "a Job of that name with another UID", jobs: []*batchv1.Job{builders.MakeJob("trainer", "ns").UID("other").Obj()}},
		{name: "a Job of that name in another namespace", jobs: []*batchv1.Job{builders.MakeJob("trainer", "elsewhere").Obj()}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := podrequest.Parse(pod("p").GPUs(1).OwnedByJob(trainer).Obj(), podrequest.Options{JobLookup: jobs(tc.jobs...)})
			if !errors.Is(err, podrequest.ErrJobNotFound) || errors.Is(err, podrequest.ErrInvalidRequest) {
				t.Errorf("Parse error = %v, want one matching ErrJobNotFound only", err)
			}
		})
	}
	// An invalid pod is reported as invalid even when its Job is missing.
	_, err := podrequest.Parse(pod("p").Fraction(200).OwnedByJob(trainer).Obj(), podrequest.Options{JobLookup: jobs()})
	if !errors.Is(err, podrequest.ErrInvalidRequest) {
		t.Errorf("Parse error = %v, want ErrInvalidRequest", err)
	}
}

func TestMatchModels(t *testing.T) {
	products := []string{"NVIDIA-A100-SXM4-80GB", "NVIDIA-A10", "NVIDIA-H100-80GB-HBM3", "Tesla-T4"}
	tests := []struct {
		name     string
		patterns []string
		want     []string
	}{
		{name: "case-insensitive substring", patterns: []string{"h100"}, want: []string{"NVIDIA-H100-80GB-HBM3"}},
		{name: "a short pattern matches longer names", patterns: []string{"A10"}, want: []string{"NVIDIA-A10", "NVIDIA-A100-SXM4-80GB"}},
		{name: "several patterns", patterns: []string{"T4", "80GB"}, want: []string{"NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3", "Tesla-T4"}},
		{name: "no match", patterns: []string{"B200"}},
		{name: "empty pattern matches nothing", patterns: []string{""}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, podrequest.MatchModels(tc.patterns, products)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestQueueResources(t *testing.T) {
	tests := []struct {
		name string
		pod  *corev1.Pod
		opts podrequest.Options
		want queue.Resources
	}{
		{name: "fraction", pod: pod("p").Fraction(30).CPU("1").Memory("2Gi").Obj(),
			want: queue.Resources{GPUMilli: 300, CPUMilli: 1000, MemoryBytes: 2 * gib}},
		{name: "whole GPUs", pod: pod("p").GPUs(2).Obj(), want: queue.Resources{GPUMilli: 2000}},
		{name: "MIG devices in GPU terms", pod: pod("p").Resource(mig1g, "3").CPU("1").Obj(),
			opts: podrequest.Options{ScalarMilli: map[string]int64{mig1g: 125}},
			want: queue.Resources{GPUMilli: 375, CPUMilli: 1000}},
		{name: "replicas in GPU terms", pod: pod("p").Resource(api.DefaultTimesliceResource, "2").Obj(),
			opts: podrequest.Options{ScalarMilli: map[string]int64{api.DefaultTimesliceResource: 250}},
			want: queue.Resources{GPUMilli: 500}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			parsed, err := podrequest.Parse(tc.pod, tc.opts)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if diff := cmp.Diff(tc.want, parsed.QueueResources()); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestParseSharesThePodsConstraints: the request's node constraints are the
// pod's own selector, affinity and tolerations, not copies (the coordinator
// parses every bound pod twice, and the copies were 7 % of its heap at
// 50,000 pods); the pods it parses are informers' objects, which never
// change. They are sealed: their key is made once.
func TestParseSharesThePodsConstraints(t *testing.T) {
	p := pod("p").Fraction(10).NodeSelector("zone", "a").Toleration("k", "", "", corev1.TaintEffectNoSchedule).
		RequiredNodeAffinity("gpu", corev1.NodeSelectorOpExists).Obj()
	parsed, err := podrequest.Parse(p, podrequest.Options{})
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	c := parsed.Request.Constraints
	if c == nil {
		t.Fatal("no constraints parsed")
	}
	want := &placement.Constraints{NodeSelector: p.Spec.NodeSelector, Tolerations: p.Spec.Tolerations,
		Affinity: p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution}
	if diff := cmp.Diff(want, c); diff != "" {
		t.Errorf("constraints (-want +got):\n%s", diff)
	}
	if &c.Tolerations[0] != &p.Spec.Tolerations[0] || c.Affinity != p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
		t.Error("the constraints copy the pod's tolerations or affinity")
	}
	p.Spec.NodeSelector["zone"] = "b"
	if c.NodeSelector["zone"] != "b" {
		t.Error("the constraints copy the pod's node selector")
	}
}

func TestParseNilPod(t *testing.T) {
	if _, err := podrequest.Parse(nil, podrequest.Options{}); err == nil {
		t.Error("Parse(nil) succeeded")
	}
}

func TestFallbackScalarMilli(t *testing.T) {
	tests := []struct {
		name, resource, timeslice string
		want                      int64
	}{
		{name: "1g MIG device", resource: mig1g, want: 143},
		{name: "3g MIG device", resource: mig3g, want: 429},
		{name: "7g MIG device", resource: "nvidia.com/mig-7g.80gb", want: 1000},
		{name: "media-extension variant", resource: "nvidia.com/mig-1g.10gb.me", want: 143},
		{name: "compute-instance profile counts its compute slices", resource: "nvidia.com/mig-1c.3g.40gb", want: 143},
		{name: "default replica resource", resource: api.DefaultTimesliceResource, want: 250},
		{name: "renamed replica resource", resource: "example.com/slice", timeslice: "example.com/slice", want: 250},
		{name: "unreadable MIG profile is a whole GPU", resource: "nvidia.com/mig-big", want: 1000},
		{name: "more slices than a GPU has is a whole GPU", resource: "nvidia.com/mig-9g.90gb", want: 1000},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := podrequest.FallbackScalarMilli(tc.resource, tc.timeslice); got != tc.want {
				t.Errorf("FallbackScalarMilli(%q) = %d, want %d", tc.resource, got, tc.want)
			}
		})
	}
}

// TestParseCostIsBoundedByWhatTheTenantWrites: the coordinator parses every
// pending pod (and every bound gang member) in every cycle, so what a pod's
// author writes must not make a parse slow. The largest gpufrac.io/gpu-models
// the API server takes (an annotation of 250 kB listing 50,000 models) took
// 4.3 s here and stalled every cycle, for every queue.
func TestParseCostIsBoundedByWhatTheTenantWrites(t *testing.T) {
	var b strings.Builder
	for i := 0; b.Len() < 250_000; i++ {
		fmt.Fprintf(&b, "%x|", i)
	}
	p := pod("p").GPUs(1).GPUModels(b.String()).Obj()
	start := time.Now()
	_, err := podrequest.Parse(p, podrequest.Options{GPUModels: []string{"NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"}})
	if took := time.Since(start); took > time.Second {
		t.Errorf("parsing took %s", took)
	}
	var ire *podrequest.InvalidRequestError
	if !errors.As(err, &ire) || len(ire.Problems) != 1 || len(ire.Problems[0].Message) > 300 {
		t.Errorf("Parse error = %.300v, want one short problem", err)
	}
}

// TestDemand: how a bound pod that Parse refuses is counted where it runs.
func TestDemand(t *testing.T) {
	for _, tc := range []struct {
		name string
		d    request.Demand
		want placement.Request
	}{
		{name: "nothing", want: placement.Request{}},
		{name: "CPU and memory", d: request.Demand{CPUMilli: 500, MemoryBytes: 1 << 30}, want: placement.Request{CPUMilli: 500, MemoryBytes: 1 << 30}},
		{name: "whole GPUs", d: request.Demand{Whole: 2}, want: placement.Request{GPUs: 2}},
		{name: "a fraction", d: request.Demand{Fraction: 30}, want: placement.Request{ShareMilli: 300}},
		{name: "a whole GPU as a fraction", d: request.Demand{Fraction: 100}, want: placement.Request{ShareMilli: 1000}},
		{name: "fractions above one GPU count one GPU", d: request.Demand{Fraction: 150}, want: placement.Request{ShareMilli: 1000}},
		{name: "whole GPUs and a fraction count the GPUs", d: request.Demand{Whole: 1, Fraction: 30}, want: placement.Request{GPUs: 1}},
		{name: "MIG devices are not placed", d: request.Demand{Scalars: map[string]int64{"nvidia.com/mig-1g.10gb": 2}}, want: placement.Request{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, podrequest.Demand(tc.d)); diff != "" {
				t.Errorf("Demand (-want +got):\n%s", diff)
			}
		})
	}
}

// TestGangAccessors: the gang as the scheduler reads it.
func TestGangAccessors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		gang    *podrequest.Gang
		want    string
		min     int
		missing string
	}{
		{name: "on its own"},
		{name: "labelled", gang: &podrequest.Gang{Namespace: "ns", Name: "g", MinMember: 4}, want: "g", min: 4},
		{name: "a PodGroup", gang: &podrequest.Gang{Namespace: "ns", Name: "podgroup/pg", MinMember: 2, PodGroup: "pg"}, want: "podgroup/pg", min: 2},
		{name: "a PodGroup not made yet", gang: &podrequest.Gang{Namespace: "ns", Name: "podgroup/pg", PodGroup: "pg", Missing: true}, want: "podgroup/pg", missing: "pg"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := podrequest.Parsed{Gang: tc.gang}
			if p.GangName() != tc.want || p.GangMinMember() != tc.min || p.MissingPodGroup() != tc.missing {
				t.Errorf("GangName %q, GangMinMember %d, MissingPodGroup %q; want %q, %d, %q", p.GangName(), p.GangMinMember(), p.MissingPodGroup(), tc.want, tc.min, tc.missing)
			}
		})
	}
}
