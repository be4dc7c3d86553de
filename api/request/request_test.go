package request_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/request"
	"github.com/gpufrac/gpufrac/tests/builders"
)

const (
	mig1g = "nvidia.com/mig-1g.10gb"
	mig3g = "nvidia.com/mig-3g.40gb"
	gib   = int64(1) << 30
)

func pod() *builders.PodWrapper { return builders.MakePod("p", "ns") }

// totals is what TestParseTotals compares of a parsed pod.
type totals struct {
	Total            map[corev1.ResourceName]int64
	Whole, Fraction  int
	Scalars          map[string]int64
	CPUMilli, Memory int64
}

func totalsOf(p *request.Pod) totals {
	return totals{Total: p.Total, Whole: p.Whole(), Fraction: p.Fraction(), Scalars: p.Scalars(), CPUMilli: p.CPUMilli, Memory: p.MemoryBytes}
}

func TestParseTotals(t *testing.T) {
	tests := []struct {
		name string
		pod  *corev1.Pod
		opts request.Options
		want totals
	}{
		{
			name: "a fraction with CPU and memory",
			pod:  pod().Fraction(30).CPU("500m").Memory("1Gi").Obj(),
			want: totals{Total: map[corev1.ResourceName]int64{api.ResourceFraction: 30}, Fraction: 30, CPUMilli: 500, Memory: gib},
		},
		{
			name: "a limit alone is the amount (the API server defaults the request to it)",
			pod:  pod().Limit(api.ResourceFraction, "25").Obj(),
			want: totals{Total: map[corev1.ResourceName]int64{api.ResourceFraction: 25}, Fraction: 25},
		},
		{
			name: "app containers add up",
			pod:  pod().GPUs(2).Container("b").GPUs(3).Obj(),
			want: totals{Total: map[corev1.ResourceName]int64{api.ResourceGPU: 5}, Whole: 5},
		},
		{
			name: "the largest init container wins over the app containers' sum",
			pod:  pod().GPUs(1).Container("b").GPUs(1).InitContainer("setup").GPUs(4).Obj(),
			want: totals{Total: map[corev1.ResourceName]int64{api.ResourceGPU: 4}, Whole: 4},
		},
		{
			name: "the app containers' sum wins over a smaller init container",
			pod:  pod().GPUs(2).Container("b").GPUs(2).InitContainer("setup").GPUs(3).Obj(),
			want: totals{Total: map[corev1.ResourceName]int64{api.ResourceGPU: 4}, Whole: 4},
		},
		{
			name: "sidecars add to the app containers and to later init containers",
			pod: pod().GPUs(1).
				SidecarContainer("proxy").GPUs(1).
				InitContainer("late-init").GPUs(3).Obj(),
			want: totals{Total: map[corev1.ResourceName]int64{api.ResourceGPU: 4}, Whole: 4},
		},
		{
			name: "zero whole GPUs and zero MIG devices are none",
			pod:  pod().GPUs(0).Resource(mig1g, "0").Obj(),
			want: totals{Total: map[corev1.ResourceName]int64{}},
		},
		{
			name: "MIG profiles mix and add up; init containers take the maximum",
			pod:  pod().Resource(mig1g, "2").Container("b").Resource(mig3g, "1").InitContainer("setup").Resource(mig1g, "3").Obj(),
			want: totals{Total: map[corev1.ResourceName]int64{mig1g: 3, mig3g: 1}, Scalars: map[string]int64{mig1g: 3, mig3g: 1}},
		},
		{
			name: "replicas under the default name",
			pod:  pod().Resource(api.DefaultTimesliceResource, "2").Obj(),
			want: totals{Total: map[corev1.ResourceName]int64{api.DefaultTimesliceResource: 2}, Scalars: map[string]int64{api.DefaultTimesliceResource: 2}},
		},
		{
			name: "a renamed replica resource; the default name is then none of gpufrac's",
			pod:  pod().Resource("example.com/slice", "1").Container("b").Resource(api.DefaultTimesliceResource, "1").Obj(),
			opts: request.Options{TimesliceResource: "example.com/slice"},
			want: totals{Total: map[corev1.ResourceName]int64{"example.com/slice": 1}, Scalars: map[string]int64{"example.com/slice": 1}},
		},
		{
			name: "CPU and memory as kube-scheduler sums them: init maximum, overhead",
			pod: pod().CPU("1").Memory("1Gi").Container("b").CPU("1").
				InitContainer("init").CPU("3").Memory("512Mi").
				Overhead(corev1.ResourceCPU, "250m").Obj(),
			want: totals{Total: map[corev1.ResourceName]int64{}, CPUMilli: 3250, Memory: gib},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := request.Parse(tc.pod, tc.opts)
			if err := got.Err(); err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if diff := cmp.Diff(tc.want, totalsOf(got), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("totals (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseContainers(t *testing.T) {
	p := request.Parse(pod().Fraction(30).Container("side").CPU("1").
		InitContainer("setup").GPUs(0).SidecarContainer("proxy").Obj(), request.Options{})
	want := []request.Container{
		{Name: "setup", Role: request.Init, Field: "spec.initContainers[setup]", GPU: map[corev1.ResourceName]int64{}},
		{Name: "proxy", Role: request.Sidecar, Field: "spec.initContainers[proxy]", GPU: map[corev1.ResourceName]int64{}},
		{Name: "main", Role: request.App, Field: "spec.containers[main]", GPU: map[corev1.ResourceName]int64{api.ResourceFraction: 30}},
		{Name: "side", Role: request.App, Field: "spec.containers[side]", GPU: map[corev1.ResourceName]int64{}},
	}
	if diff := cmp.Diff(want, p.Containers); diff != "" {
		t.Errorf("containers (-want +got):\n%s", diff)
	}
	if got := p.FractionContainers(); len(got) != 1 || got[0].Name != "main" || got[0].Units() != 30 {
		t.Errorf("FractionContainers() = %+v, want main with 30 units", got)
	}
	if got := p.InitFractions(); len(got) != 0 {
		t.Errorf("InitFractions() = %+v, want none", got)
	}
}

func TestParseProblems(t *testing.T) {
	const (
		fractionLimit = "spec.containers[main].resources.limits[gpufrac.io/gpu-fraction]"
		gpuLimit      = "spec.containers[main].resources.limits[nvidia.com/gpu]"
	)
	tests := []struct {
		name string
		pod  *corev1.Pod
		want []request.Problem
		// wantInit is the init containers' fraction units the node must refuse.
		wantInit []int
	}{
		{
			name: "fraction above 100",
			pod:  pod().Fraction(150).Obj(),
			want: []request.Problem{{Field: fractionLimit,
				Message: `container "main" asks 150: gpufrac.io/gpu-fraction is percent of one GPU and must be 1..100; ask nvidia.com/gpu for whole GPUs`}},
		},
		{
			name: "fraction of zero",
			pod:  pod().Fraction(0).Obj(),
			want: []request.Problem{{Field: fractionLimit,
				Message: `container "main" asks 0: gpufrac.io/gpu-fraction is percent of one GPU and must be 1..100; ask nvidia.com/gpu for whole GPUs`}},
		},
		{
			name: "fraction that is not a whole percent",
			pod:  pod().Resource(api.ResourceFraction, "500m").Obj(),
			want: []request.Problem{{Field: fractionLimit,
				Message: `container "main" asks 500m: gpufrac.io/gpu-fraction must be a whole number of percent of one GPU, 1..100`}},
		},
		{
			name: "fraction in an init container",
			pod:  pod().InitContainer("setup").Fraction(20).Obj(),
			want: []request.Problem{{Field: "spec.initContainers[setup].resources.limits[gpufrac.io/gpu-fraction]",
				Message: `container "setup" is an init container and asks 20 gpufrac.io/gpu-fraction: fractions are served to app containers (spec.containers) only, ` +
					`since the kubelet reports no init container's devices and gpufrac could neither record nor limit its share; move the fraction to an app container`}},
			wantInit: []int{20},
		},
		{
			name: "fraction in a sidecar, beside one in an app container",
			pod:  pod().Fraction(30).SidecarContainer("proxy").Fraction(10).Obj(),
			want: []request.Problem{{Field: "spec.initContainers[proxy].resources.limits[gpufrac.io/gpu-fraction]",
				Message: `container "proxy" is an init container and asks 10 gpufrac.io/gpu-fraction: fractions are served to app containers (spec.containers) only, ` +
					`since the kubelet reports no init container's devices and gpufrac could neither record nor limit its share; move the fraction to an app container`}},
			wantInit: []int{10},
		},
		{
			name: "fraction together with whole GPUs",
			pod:  pod().Fraction(30).Container("other").GPUs(1).Obj(),
			want: []request.Problem{{Field: "spec",
				Message: `container "main" asks gpufrac.io/gpu-fraction and container "other" asks nvidia.com/gpu: a pod gets either whole GPUs or a fraction of one GPU, not both`}},
		},
		{
			name: "fraction in two containers",
			pod:  pod().Fraction(30).Container("b").Fraction(20).Obj(),
			want: []request.Problem{{Field: "spec",
				Message: `containers "main", "b" all ask gpufrac.io/gpu-fraction: only one container of a pod may hold a GPU fraction (split the pod, or give one container the sum)`}},
		},
		{
			name: "whole GPUs that are not whole",
			pod:  pod().Resource(api.ResourceGPU, "1.5").Obj(),
			want: []request.Problem{{Field: gpuLimit,
				Message: `container "main" asks 1500m nvidia.com/gpu: whole GPUs must be a positive whole number; use gpufrac.io/gpu-fraction for part of a GPU`}},
		},
		{
			name: "MIG devices together with a fraction",
			pod:  pod().Fraction(30).Container("mig").Resource(mig1g, "1").Obj(),
			want: []request.Problem{{Field: "spec",
				Message: `container "main" asks gpufrac.io/gpu-fraction and container "mig" asks MIG devices (nvidia.com/mig-*): a pod gets one kind of GPU: whole GPUs, a fraction of one GPU, MIG devices or time-sliced replicas`}},
		},
		{
			name: "replicas together with whole GPUs in one container",
			pod:  pod().Resource(api.DefaultTimesliceResource, "1").GPUs(1).Obj(),
			want: []request.Problem{{Field: "spec",
				Message: `container "main" asks nvidia.com/gpu and container "main" asks nvidia.com/gpu.shared: a pod gets one kind of GPU: whole GPUs, a fraction of one GPU, MIG devices or time-sliced replicas`}},
		},
		{
			name: "whole GPUs, a fraction and MIG devices: both mixes are reported",
			pod:  pod().GPUs(1).Container("f").Fraction(10).Container("m").Resource(mig1g, "1").Obj(),
			want: []request.Problem{
				{Field: "spec", Message: `container "f" asks gpufrac.io/gpu-fraction and container "main" asks nvidia.com/gpu: a pod gets either whole GPUs or a fraction of one GPU, not both`},
				{Field: "spec", Message: `container "main" asks nvidia.com/gpu and container "m" asks MIG devices (nvidia.com/mig-*): a pod gets one kind of GPU: whole GPUs, a fraction of one GPU, MIG devices or time-sliced replicas`},
			},
		},
		{
			name: "MIG devices that are not whole",
			pod:  pod().Resource(mig1g, "500m").Obj(),
			want: []request.Problem{{Field: "spec.containers[main].resources.limits[nvidia.com/mig-1g.10gb]",
				Message: `container "main" asks 500m nvidia.com/mig-1g.10gb: MIG devices and time-sliced replicas must be a positive whole number`}},
		},
		{
			name: "request and limit differ: InvalidRequest, the limit is read",
			pod:  pod().Request(api.ResourceGPU, "2").Limit(api.ResourceGPU, "1").Obj(),
			want: []request.Problem{{Field: "spec.containers[main].resources.requests[nvidia.com/gpu]",
				Message: `container "main" requests 2 nvidia.com/gpu but its limit is 1: extended resources need equal requests and limits (set only the limit)`}},
		},
		{
			name: "request without a limit",
			pod:  pod().Request(api.ResourceFraction, "20").Obj(),
			want: []request.Problem{{Field: "spec.containers[main].resources.limits[gpufrac.io/gpu-fraction]",
				Message: `container "main" requests 20 gpufrac.io/gpu-fraction without a limit: extended resources need a limit equal to the request (set only the limit)`}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := request.Parse(tc.pod, request.Options{})
			if diff := cmp.Diff(tc.want, p.Problems); diff != "" {
				t.Errorf("problems (-want +got):\n%s", diff)
			}
			err := p.Err()
			var ie *request.InvalidError
			if !errors.Is(err, request.ErrInvalid) || !errors.As(err, &ie) {
				t.Fatalf("Err() = %v, want an *InvalidError matching ErrInvalid", err)
			}
			var init []int
			for _, c := range p.InitFractions() {
				init = append(init, c.Units())
			}
			if diff := cmp.Diff(tc.wantInit, init); diff != "" {
				t.Errorf("init containers' fractions (-want +got):\n%s", diff)
			}
		})
	}
}

// TestParseMismatchReadsTheLimit: a container whose request and limit
// differ is invalid, and its amount is the limit, which is what the kubelet
// would allocate.
func TestParseMismatchReadsTheLimit(t *testing.T) {
	p := request.Parse(pod().Request(api.ResourceGPU, "2").Limit(api.ResourceGPU, "1").Obj(), request.Options{})
	if p.Whole() != 1 {
		t.Errorf("Whole() = %d, want the limit 1", p.Whole())
	}
}

func TestKindOf(t *testing.T) {
	o := request.Options{TimesliceResource: "example.com/slice"}
	for name, want := range map[corev1.ResourceName]request.Kind{
		api.ResourceGPU:              request.Whole,
		api.ResourceFraction:         request.Fraction,
		mig1g:                        request.MIG,
		"example.com/slice":          request.Replica,
		api.DefaultTimesliceResource: request.None,
		corev1.ResourceCPU:           request.None,
	} {
		if got := o.KindOf(name); got != want {
			t.Errorf("KindOf(%s) = %v, want %v", name, got, want)
		}
	}
	if got := (request.Options{}).KindOf(api.DefaultTimesliceResource); got != request.Replica {
		t.Errorf("KindOf(default replica resource) with default options = %v", got)
	}
}

func TestParseNil(t *testing.T) {
	p := request.Parse(nil, request.Options{})
	if p.Err() != nil || p.Whole() != 0 || len(p.Containers) != 0 {
		t.Errorf("Parse(nil) = %+v", p)
	}
}

// TestParseKeepsWhatIsAsked: a whole number out of range is still what the
// pod asks (tools show it, the node agent refuses it by size); amounts that
// are not whole numbers are not read at all.
func TestParseKeepsWhatIsAsked(t *testing.T) {
	if got := request.Parse(pod().Fraction(150).Obj(), request.Options{}).Fraction(); got != 150 {
		t.Errorf("Fraction() of a 150%% request = %d, want 150", got)
	}
	if got := request.Parse(pod().Resource(api.ResourceFraction, "500m").Obj(), request.Options{}).Fraction(); got != 0 {
		t.Errorf("Fraction() of a 500m request = %d, want 0", got)
	}
}

// TestParseBoundsCPUAndMemory: quantities beyond any node overflow int64
// milli-units (cpu 1e18 reads as 0 millicores, 1Ei as the most negative
// int64), and a pod read as asking nothing, or less than nothing, would fit
// every node and shrink its queue's usage. They are read as the bound and
// reported.
func TestParseBoundsCPUAndMemory(t *testing.T) {
	for _, tc := range []struct {
		name, cpu, mem string
	}{
		{"cpu 1e18", "1e18", "1Gi"},
		{"cpu 1Ei", "1Ei", "1Gi"},
		{"memory 16Ei", "1", "16Ei"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := builders.MakePod("p", "ns").CPU(tc.cpu).Memory(tc.mem).Obj()
			r := request.Parse(p, request.Options{})
			if r.CPUMilli <= 0 || r.MemoryBytes <= 0 {
				t.Errorf("read %d millicores and %d bytes, want positive", r.CPUMilli, r.MemoryBytes)
			}
			if len(r.Problems) != 1 || !strings.Contains(r.Problems[0].Message, "more than any node has") {
				t.Errorf("problems %v, want one saying the request is beyond any node", r.Problems)
			}
		})
	}
	if r := request.Parse(builders.MakePod("p", "ns").CPU("128").Memory("2Ti").Obj(), request.Options{}); len(r.Problems) != 0 || r.CPUMilli != 128_000 {
		t.Errorf("a large real request: %d millicores, problems %v", r.CPUMilli, r.Problems)
	}
}

// TestDemand: a pod's Demand is its totals, and UsesGPU says whether it
// holds a GPU of any kind.
func TestDemand(t *testing.T) {
	for _, tc := range []struct {
		name    string
		pod     *corev1.Pod
		want    request.Demand
		usesGPU bool
	}{
		{name: "CPU only", pod: pod().CPU("1").Obj(), want: request.Demand{CPUMilli: 1000}},
		{name: "whole GPUs", pod: pod().GPUs(2).Obj(), want: request.Demand{Whole: 2}, usesGPU: true},
		{name: "a fraction", pod: pod().Fraction(30).Obj(), want: request.Demand{Fraction: 30}, usesGPU: true},
		{name: "replicas", pod: pod().Resource(api.DefaultTimesliceResource, "1").Obj(),
			want: request.Demand{Scalars: map[string]int64{api.DefaultTimesliceResource: 1}}, usesGPU: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := request.Parse(tc.pod, request.Options{}).Demand()
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Demand (-want +got):\n%s", diff)
			}
			if got.UsesGPU() != tc.usesGPU {
				t.Errorf("UsesGPU = %v, want %v", got.UsesGPU(), tc.usesGPU)
			}
		})
	}
}
