package cluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/tests/kubeletsim"
)

const podReadyYAML = `apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-ready
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.status.phase'
      operator: 'In'
      values: ['Pending']
  next:
    statusTemplate: 'phase: Running'
`

const podDeleteYAML = `apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-delete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
  next:
    delete: true
`

func TestGateStage(t *testing.T) {
	tests := []struct {
		name      string
		in        string
		wantGated bool
		wantExprs []any // the pod-ready selector after gating
		wantErr   bool
	}{
		{
			name:      "pod-ready gets the admission condition",
			in:        podReadyYAML,
			wantGated: true,
			wantExprs: []any{
				map[string]any{"key": ".status.phase", "operator": "In", "values": []any{"Pending"}},
				map[string]any{"key": `.metadata.annotations["kubeletsim.gpufrac.test/admitted"]`, "operator": "In", "values": []any{"true"}},
			},
		},
		{name: "another pod stage is unchanged", in: podDeleteYAML},
		{name: "a node stage named pod-ready is unchanged", in: strings.Replace(podReadyYAML, "kind: Pod", "kind: Node", 1)},
		{name: "pod-ready without selector", in: "kind: Stage\nmetadata: {name: pod-ready}\nspec: {resourceRef: {kind: Pod}}\n", wantErr: true},
		{name: "not YAML", in: "kind: [Stage", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, gated, err := gateStage([]byte(tt.in))
			if (err != nil) != tt.wantErr {
				t.Fatalf("gateStage() error = %v, wantErr %v", err, tt.wantErr)
			}
			if tt.wantErr {
				return
			}
			if gated != tt.wantGated {
				t.Errorf("gateStage() gated = %v, want %v", gated, tt.wantGated)
			}
			if !gated {
				if diff := cmp.Diff(tt.in, string(out)); diff != "" {
					t.Errorf("ungated stage changed (-want +got):\n%s", diff)
				}
				return
			}
			var stage struct {
				Spec struct {
					Selector struct {
						MatchExpressions []any `json:"matchExpressions"`
					} `json:"selector"`
					Next map[string]any `json:"next"`
				} `json:"spec"`
			}
			if err := yaml.Unmarshal(out, &stage); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.wantExprs, stage.Spec.Selector.MatchExpressions); diff != "" {
				t.Errorf("selector (-want +got):\n%s", diff)
			}
			if stage.Spec.Next["statusTemplate"] != "phase: Running" {
				t.Errorf("next lost its statusTemplate: %v", stage.Spec.Next)
			}
		})
	}
}

func TestGatedStagesNeedsPodReady(t *testing.T) {
	dir := t.TempDir()
	del := filepath.Join(dir, "pod-delete.yaml")
	if err := os.WriteFile(del, []byte(podDeleteYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := gatedStages([]string{del}, filepath.Join(dir, "out")); err == nil || !strings.Contains(err.Error(), "no stage named pod-ready") {
		t.Errorf("gatedStages without pod-ready: error = %v, want one naming pod-ready", err)
	}
	ready := filepath.Join(dir, "pod-ready.yaml")
	if err := os.WriteFile(ready, []byte(podReadyYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	files, err := gatedStages([]string{del, ready}, filepath.Join(dir, "out"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2 {
		t.Fatalf("gatedStages wrote %v, want 2 files", files)
	}
	data, err := os.ReadFile(files[1])
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), AnnotationAdmitted) {
		t.Errorf("gated pod-ready stage lacks %s:\n%s", AnnotationAdmitted, data)
	}
}

func TestStatusPatch(t *testing.T) {
	counts := func(c, a int) *deviceCounts { return &deviceCounts{capacity: c, allocatable: a} }
	tests := []struct {
		name        string
		want        map[string]*deviceCounts
		written     map[string]deviceCounts
		wantPatch   string
		wantPending []string
	}{
		{
			name:        "first lists",
			want:        map[string]*deviceCounts{api.ResourceGPU: counts(8, 8), api.ResourceFraction: counts(800, 700)},
			wantPatch:   `{"status":{"allocatable":{"gpufrac.io/gpu-fraction":"700","nvidia.com/gpu":"8"},"capacity":{"gpufrac.io/gpu-fraction":"800","nvidia.com/gpu":"8"}}}`,
			wantPending: []string{api.ResourceFraction, api.ResourceGPU},
		},
		{
			name:    "nothing changed",
			want:    map[string]*deviceCounts{api.ResourceGPU: counts(8, 8)},
			written: map[string]deviceCounts{api.ResourceGPU: *counts(8, 8)},
		},
		{
			name:        "one GPU turned unhealthy",
			want:        map[string]*deviceCounts{api.ResourceGPU: counts(8, 7), api.ResourceFraction: counts(800, 800)},
			written:     map[string]deviceCounts{api.ResourceGPU: *counts(8, 8), api.ResourceFraction: *counts(800, 800)},
			wantPatch:   `{"status":{"allocatable":{"nvidia.com/gpu":"7"},"capacity":{"nvidia.com/gpu":"8"}}}`,
			wantPending: []string{api.ResourceGPU},
		},
		{
			name:        "withdrawn resource is removed",
			want:        map[string]*deviceCounts{api.ResourceFraction: nil},
			written:     map[string]deviceCounts{api.ResourceFraction: *counts(800, 0)},
			wantPatch:   `{"status":{"allocatable":{"gpufrac.io/gpu-fraction":null},"capacity":{"gpufrac.io/gpu-fraction":null}}}`,
			wantPending: []string{api.ResourceFraction},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			patch, pending, err := statusPatch(tt.want, tt.written)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.wantPatch, string(patch)); diff != "" {
				t.Errorf("patch (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantPending, pending); diff != "" {
				t.Errorf("pending (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDeviceRequests(t *testing.T) {
	q := resource.MustParse
	pod := &corev1.Pod{Spec: corev1.PodSpec{
		InitContainers: []corev1.Container{
			{Name: "init", Resources: corev1.ResourceRequirements{
				Limits: corev1.ResourceList{api.ResourceGPU: q("1")},
			}},
			{Name: "sidecar-init", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways), Resources: corev1.ResourceRequirements{
				Limits: corev1.ResourceList{api.ResourceGPU: q("1")},
			}},
		},
		Containers: []corev1.Container{
			{Name: "main", Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: q("2"), api.ResourceFraction: q("30")},
				Limits:   corev1.ResourceList{corev1.ResourceMemory: q("1Gi"), api.ResourceFraction: q("30"), "example.com/nic": q("2")},
			}},
			{Name: "sidecar", Resources: corev1.ResourceRequirements{
				Limits: corev1.ResourceList{"hugepages-2Mi": q("2Mi"), "kubernetes.io/batch-cpu": q("1"), api.ResourceGPU: q("0")},
			}},
			{Name: "requests-only", Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{api.ResourceGPU: q("2")},
			}},
		},
	}}
	want := []deviceRequest{
		{container: "init", resource: api.ResourceGPU, count: 1, init: true},
		{container: "sidecar-init", resource: api.ResourceGPU, count: 1},
		{container: "main", resource: "example.com/nic", count: 2},
		{container: "main", resource: api.ResourceFraction, count: 30},
		{container: "requests-only", resource: api.ResourceGPU, count: 2},
	}
	if diff := cmp.Diff(want, deviceRequests(pod), cmp.AllowUnexported(deviceRequest{})); diff != "" {
		t.Errorf("deviceRequests() (-want +got):\n%s", diff)
	}
}

func TestAllocateFailedMessage(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want string
	}{
		{
			name: "plugin error carries the plugin's gRPC error",
			err: fmt.Errorf("allocating 150 gpufrac.io/gpu-fraction to pod default/p container main: %w", &kubeletsim.PluginError{
				Resource: api.ResourceFraction, Op: "Allocate", Err: status.Error(codes.Unknown, "at most 100 units"),
			}),
			want: "Allocate failed due to rpc error: code = Unknown desc = at most 100 units, which is unexpected",
		},
		{
			name: "a GetPreferredAllocation error behind the device manager's prefix",
			err: fmt.Errorf("allocating 150 gpufrac.io/gpu-fraction to pod default/p container main: %w", &kubeletsim.PluginError{
				Resource: api.ResourceFraction, Op: "GetPreferredAllocation", Err: status.Error(codes.InvalidArgument, "at most 100 units"),
			}),
			want: "Allocate failed due to device plugin GetPreferredAllocation rpc failed with err: rpc error: code = InvalidArgument desc = at most 100 units, which is unexpected",
		},
		{
			name: "device manager error without the simulator's prefix",
			err: fmt.Errorf("allocating 1 nvidia.com/gpu to pod default/p container main: %w",
				fmt.Errorf("%w for nvidia.com/gpu. Requested: 1, Available: 0", kubeletsim.ErrInsufficientDevices)),
			want: "Allocate failed due to requested number of devices unavailable for nvidia.com/gpu. Requested: 1, Available: 0, which is unexpected",
		},
		{
			name: "bare error",
			err:  errors.New("boom"),
			want: "Allocate failed due to boom, which is unexpected",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, allocateFailedMessage(tt.err)); diff != "" {
				t.Errorf("allocateFailedMessage() (-want +got):\n%s", diff)
			}
		})
	}
}

// TestDefaultGPUModelsMatchTheMocks keeps the product labels in step with the
// go-nvml mock servers: the label is the GPU name with dashes for spaces, as GPU
// feature discovery writes it (some mocks prefix the name with "Mock ").
func TestDefaultGPUModelsMatchTheMocks(t *testing.T) {
	for product, model := range DefaultGPUModels() {
		t.Run(model, func(t *testing.T) {
			m, err := nvidia.NewMock(model)
			if err != nil {
				t.Fatal(err)
			}
			if err := m.Init(); err != nil {
				t.Fatal(err)
			}
			defer m.Shutdown()
			gpus, err := m.GPUs()
			if err != nil || len(gpus) == 0 {
				t.Fatalf("listing %s GPUs: %d, %v", model, len(gpus), err)
			}
			if got := strings.ReplaceAll(strings.TrimPrefix(gpus[0].Name, "Mock "), " ", "-"); got != product {
				t.Errorf("%s GPU product label = %q, DefaultGPUModels has %q", model, got, product)
			}
		})
	}
}
