package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/tests/cluster"
)

func TestReadLines(t *testing.T) {
	tests := []struct {
		name      string
		content   *string // nil: no file
		offset    int64
		want      []string
		wantAfter int64
	}{
		{name: "no file yet", content: nil, want: nil},
		{name: "partial line waits", content: ptr("starting"), want: nil},
		{name: "two lines and a partial one", content: ptr("a\nbb\nc"), want: []string{"a", "bb"}, wantAfter: 5},
		{name: "from an offset", content: ptr("a\nbb\nREADY\n"), offset: 5, want: []string{"READY"}, wantAfter: 11},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "progress")
			if tt.content != nil {
				if err := os.WriteFile(path, []byte(*tt.content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, after, err := readLines(path, tt.offset)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("lines (-want +got):\n%s", diff)
			}
			if want := max(tt.wantAfter, tt.offset); after != want {
				t.Errorf("offset after = %d, want %d", after, want)
			}
		})
	}
}

func ptr(s string) *string { return &s }

func TestPodsOf(t *testing.T) {
	tests := []struct {
		name string
		obj  map[string]any
		want int
	}{
		{name: "pod", obj: map[string]any{"kind": "Pod"}, want: 1},
		{name: "deployment with replicas", obj: map[string]any{"kind": "Deployment", "spec": map[string]any{"replicas": int64(3)}}, want: 3},
		{name: "deployment default replicas", obj: map[string]any{"kind": "Deployment"}, want: 1},
		{name: "configmap", obj: map[string]any{"kind": "ConfigMap"}, want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := podsOf(&unstructured.Unstructured{Object: tt.obj}); got != tt.want {
				t.Errorf("podsOf() = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestUnsettled(t *testing.T) {
	frac := corev1.Container{Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{api.ResourceFraction: resource.MustParse("30")}}}
	tests := []struct {
		name string
		pod  corev1.Pod
		want string
	}{
		{name: "running whole-GPU pod", pod: corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodRunning}}},
		{name: "failed pod", pod: corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed}}},
		{
			name: "running fraction pod without its GPU",
			pod:  corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{frac}}, Status: corev1.PodStatus{Phase: corev1.PodRunning}},
			want: "GPU not written back yet",
		},
		{
			name: "running fraction pod with its GPU",
			pod: corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{api.AnnotationAllocatedGPU: "GPU-1"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{frac}}, Status: corev1.PodStatus{Phase: corev1.PodRunning},
			},
		},
		{name: "bound, not admitted", pod: corev1.Pod{Spec: corev1.PodSpec{NodeName: "n"}, Status: corev1.PodStatus{Phase: corev1.PodPending}}, want: "admitting on n"},
		{
			name: "unschedulable",
			pod: corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{
				Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable,
			}}}},
			want: "unschedulable; Karpenter is adding a node",
		},
		{name: "new", pod: corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending}}, want: "scheduling"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := unsettled(&tt.pod); got != tt.want {
				t.Errorf("unsettled() = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestUpStatusDown runs the demo as make demo does (without Karpenter, to stay
// short): up returns with the cluster running in the background and the GPU view
// printed, status prints it again, down leaves no process and no state behind.
func TestUpStatusDown(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a local cluster; skipped with -short")
	}
	root, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	tmp, err := os.MkdirTemp("", "gpufrac-demo-test-")
	if err != nil {
		t.Fatal(err)
	}
	bin, state := filepath.Join(tmp, "bin"), filepath.Join(tmp, "state")
	// Fresh builds of the gpufrac binaries; the cluster tools come from bin/ (make tools).
	for _, pkg := range []string{"./tests/demo", "./cmd/gpufrac-node", "./cmd/kubectl-gpufrac"} {
		build := exec.Command("go", "build", "-o", bin+"/", pkg)
		build.Dir = root
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("building %s: %v\n%s", pkg, err, out)
		}
	}
	if err := os.Rename(filepath.Join(bin, "demo"), filepath.Join(bin, "gpufrac-demo")); err != nil {
		t.Fatal(err)
	}
	for _, tool := range []string{"etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kwok", "kwok-stages"} {
		if err := os.Symlink(filepath.Join(root, "bin", tool), filepath.Join(bin, tool)); err != nil {
			t.Fatal(err)
		}
	}
	demo := func(ctx context.Context, args ...string) (string, error) {
		args = append(args, "--dir="+state, "--bin-dir="+bin)
		cmd := exec.CommandContext(ctx, filepath.Join(bin, "gpufrac-demo"), args...)
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if out, err := demo(ctx, "down"); err != nil {
			t.Errorf("down in cleanup: %v\n%s", err, out)
		}
		if !t.Failed() {
			os.RemoveAll(tmp)
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()

	began := time.Now()
	out, err := demo(ctx, "up", "--karpenter=false", "--timeout=3m")
	t.Logf("up took %s:\n%s", time.Since(began).Round(time.Millisecond), out)
	if err != nil {
		logs, _ := os.ReadFile(filepath.Join(state, "demo.log"))
		t.Fatalf("up: %v\ndemo.log:\n%s", err, logs)
	}
	for _, want := range []string{
		"NODE gpu-node-1 (Ready)", "NODE gpu-node-2 (Ready)", "default/embeddings 50%", "default/train-llm ×4",
		"Rejected at device admission", "default/too-big", "at most 100 units", "export KUBECONFIG=",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("up's output lacks %q", want)
		}
	}
	pid, ok := running(config{dir: state})
	if !ok {
		t.Fatal("no demo process running after up returned")
	}

	out, err = demo(ctx, "status")
	if err != nil || !strings.Contains(out, "NODE gpu-node-2 (Ready)") {
		t.Errorf("status: %v\n%s", err, out)
	}
	again, err := demo(ctx, "up", "--karpenter=false")
	if err != nil || !strings.Contains(again, "already running (pid "+strconv.Itoa(pid)+")") {
		t.Errorf("a second up: %v\n%s", err, again)
	}

	out, err = demo(ctx, "down")
	if err != nil {
		t.Fatalf("down: %v\n%s", err, out)
	}
	if _, err := os.Stat(state); !os.IsNotExist(err) {
		t.Errorf("state dir after down: %v", err)
	}
	if left := processesMentioning(t, state); len(left) > 0 {
		t.Errorf("processes left after down: %v", left)
	}
}

// processesMentioning lists live processes whose command line contains s.
func processesMentioning(t *testing.T, s string) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmdline), s) {
			out = append(out, e.Name()+": "+strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
	}
	return out
}
