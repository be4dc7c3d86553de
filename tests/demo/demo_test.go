package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

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
		{name: "partial line waits", content: strPtr("starting"), want: nil},
		{name: "two lines and a partial one", content: strPtr("a\nbb\nc"), want: []string{"a", "bb"}, wantAfter: 5},
		{name: "from an offset", content: strPtr("a\nbb\nREADY\n"), offset: 5, want: []string{"READY"}, wantAfter: 11},
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

func strPtr(s string) *string { return &s }

func TestTelling(t *testing.T) {
	many := strings.Repeat("E1124 10:23:55.0 failed\n", maxTelling+5)
	tests := []struct {
		name string
		log  string
		want []string
	}{
		{name: "nothing wrong", log: "I1124 10:23:55.0 started\nI1124 10:23:56.0 Scheduling cycle\n"},
		{
			name: "errors and the GPUs' story, in order",
			log: "I1124 started\nE1124 boom\nI1124 \"Reserved GPU for fractions\" gpu=\"GPU-1\"\n" +
				"I1124 \"Wrote back GPU\" pod=\"ns/r\"\nI1124 Scheduling cycle\nrejected: Allocate failed due to x",
			want: []string{"E1124 boom", `I1124 "Reserved GPU for fractions" gpu="GPU-1"`, `I1124 "Wrote back GPU" pod="ns/r"`, "rejected: Allocate failed due to x"},
		},
		{name: "the last maxTelling lines", log: many + "E1124 last\n", want: append(slices.Repeat([]string{"E1124 10:23:55.0 failed"}, maxTelling-1), "E1124 last")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, telling(tt.log)); diff != "" {
				t.Errorf("telling (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPodsOf(t *testing.T) {
	tests := []struct {
		name string
		obj  map[string]any
		want int
	}{
		{name: "pod", obj: map[string]any{"kind": "Pod"}, want: 1},
		{name: "deployment with replicas", obj: map[string]any{"kind": "Deployment", "spec": map[string]any{"replicas": int64(3)}}, want: 3},
		{name: "deployment default replicas", obj: map[string]any{"kind": "Deployment"}, want: 1},
		{name: "deployment read from YAML (float replicas)", obj: map[string]any{"kind": "Deployment", "spec": map[string]any{"replicas": float64(6)}}, want: 6},
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
	whole := corev1.Container{Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{api.ResourceGPU: resource.MustParse("2")}}}
	pending := func(reason string) corev1.Pod {
		return corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{
			Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: reason,
		}}}}
	}
	tests := []struct {
		name string
		pod  corev1.Pod
		want string
	}{
		{name: "running CPU pod", pod: corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodRunning}}},
		{name: "failed pod", pod: corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed}}},
		{
			name: "running fraction pod without its GPU",
			pod:  corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{frac}}, Status: corev1.PodStatus{Phase: corev1.PodRunning}},
			want: "GPU not written back yet",
		},
		{
			name: "running whole-GPU pod without its GPUs",
			pod:  corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{whole}}, Status: corev1.PodStatus{Phase: corev1.PodRunning}},
			want: "GPU not written back yet",
		},
		{
			name: "running fraction pod with its GPU",
			pod: corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{api.AnnotationAllocatedGPU: "GPU-1"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{frac}}, Status: corev1.PodStatus{Phase: corev1.PodRunning},
			},
		},
		{
			name: "terminating",
			pod:  corev1.Pod{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &metav1.Time{}}, Status: corev1.PodStatus{Phase: corev1.PodRunning}},
			want: "terminating",
		},
		{name: "bound, not admitted", pod: corev1.Pod{Spec: corev1.PodSpec{NodeName: "n"}, Status: corev1.PodStatus{Phase: corev1.PodPending}}, want: "admitting on n"},
		{name: "over quota: settled, waits by design", pod: pending(api.ReasonOverQuota)},
		{name: "over limit: settled", pod: pending(api.ReasonOverLimit)},
		{name: "invalid request: settled", pod: pending(api.ReasonInvalidRequest)},
		{name: "no capacity: Karpenter is asked", pod: pending(api.ReasonNoCapacity), want: "NoCapacity: placeholders ask Karpenter for capacity"},
		{name: "incomplete gang", pod: pending(api.ReasonGangIncomplete), want: api.ReasonGangIncomplete},
		{name: "unschedulable", pod: pending(corev1.PodReasonUnschedulable), want: "Unschedulable"},
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

func TestPhasesSubmitEveryExample(t *testing.T) {
	root, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		karpenter bool
		skipped   []string // example files deliberately left out
	}{
		{name: "with Karpenter", karpenter: true},
		{name: "without Karpenter the burst stays out", karpenter: false, skipped: []string{"burst.yaml"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, ph := range phases(tt.karpenter) {
				for _, f := range ph.files {
					if _, err := cluster.ReadObjects(filepath.Join(root, "deployments", "examples", f)); err != nil {
						t.Errorf("phase %q: %v", ph.what, err)
					}
					got = append(got, f)
				}
			}
			all, err := filepath.Glob(filepath.Join(root, "deployments", "examples", "*.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			var want []string
			for _, f := range all {
				if !slices.Contains(tt.skipped, filepath.Base(f)) {
					want = append(want, filepath.Base(f))
				}
			}
			slices.Sort(got)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("example files submitted (-want +got):\n%s", diff)
			}
		})
	}
}

func TestWrap(t *testing.T) {
	tests := []struct {
		name  string
		in    string
		width int
		want  string
	}{
		{name: "short", in: "a b c", width: 20, want: "  - a b c"},
		{name: "wrapped under the prefix", in: "one two three four", width: 13, want: "  - one two\n    three\n    four"},
		{name: "a word longer than the line stays whole", in: "x verylongword y", width: 8, want: "  - x\n    verylongword\n    y"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := wrap("  - ", tt.in, tt.width); got != tt.want {
				t.Errorf("wrap() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestWriteLegend(t *testing.T) {
	tests := []struct {
		name    string
		facts   facts
		want    []string
		notWant []string
	}{
		{
			name: "everything",
			facts: facts{
				static: []string{"gpu-node-1", "gpu-node-2"}, karpenter: []string{"kwok-gpu-x (gpu-1x-h100)"},
				dra: []string{"gpu-node-dra"}, claimPods: []string{"dra-embed", "dra-inference-1"}, claimGPUs: 2,
				fractions: 11, sharedGPUs: 5, reservations: 5, whole: []string{"train-llm"}, gangs: []string{"gang ddp (ddp-0, ddp-1)"},
				refused: []string{"eval-nightly (OverQuota)", "too-big (InvalidRequest)"},
			},
			want: []string{
				"gpu-node-1, gpu-node-2: the static nodes, 4 mock H100s", "kwok-gpu-x (gpu-1x-h100): made by Karpenter", "asked for it",
				"11 fractions share 5 GPUs", "(5 in all)", "train-llm; gang ddp (ddp-0, ddp-1), placed all or nothing",
				"Pending eval-nightly (OverQuota), too-big (InvalidRequest)", "Never Unschedulable",
				"gpu-node-dra: a static node group in mode dra", "8 mock H100s a node", "DRA driver gpu.gpufrac.io",
				"\"(claim)\"", "dra-embed, dra-inference-1, on 2 GPUs",
			},
		},
		{
			name:  "a burst on five 1-GPU nodes: why, and what one node would have cost",
			facts: facts{karpenter: []string{"a", "b", "c", "d", "e"}, bought: map[string]int{"gpu-1x-h100": 5}, boughtGPUs: 5, boughtPrice: 5 * 14.19},
			want: []string{"Karpenter bought 5 × gpu-1x-h100, $70.95/h", "each placeholder prefers nodes with no more GPUs than it asks",
				"packed together they would have bought one gpu-8x-h100, $98.32/h with 3 of its GPUs idle"},
		},
		{
			name:    "one node: no comparison",
			facts:   facts{karpenter: []string{"a"}, bought: map[string]int{"gpu-1x-h100": 1}, boughtGPUs: 1, boughtPrice: 14.19},
			want:    []string{"Karpenter bought 1 × gpu-1x-h100, $14.19/h"},
			notWant: []string{"packed together"},
		},
		{
			name:    "without Karpenter nodes or refused pods",
			facts:   facts{static: []string{"gpu-node-1"}},
			want:    []string{"gpu-node-1: the static nodes"},
			notWant: []string{"made by Karpenter", "Karpenter bought", "Pending", "fractions share", "mode dra", "(claim)", "a real node"},
		},
		{
			name:    "a real node is not a static one",
			facts:   facts{static: []string{"gpu-node-1"}, real: []string{realNode}},
			want:    []string{"gpu-node-1: the static nodes", realNode + ": a real node, the kubelet v1.36.3 and containerd", "real-node/real-inference runs in a container"},
			notWant: []string{"gpu-node-1, " + realNode},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b strings.Builder
			writeLegend(&b, config{gpusPerNode: 4}, tt.facts)
			// Compare without the wrapping.
			got := strings.Join(strings.Fields(b.String()), " ")
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("legend lacks %q:\n%s", w, b.String())
				}
			}
			for _, w := range tt.notWant {
				if strings.Contains(got, w) {
					t.Errorf("legend has %q:\n%s", w, b.String())
				}
			}
		})
	}
}

// TestUpStatusDown runs the demo as make demo does, Karpenter included: up
// returns with the cluster running in the background and the GPU view printed
// (fractions sharing a GPU under a reservation, the gang, the OverQuota pod, a
// node Karpenter made for the burst), status prints it again, a second up
// finds the running demo, and down leaves no process and no state behind.
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
	for _, pkg := range []string{"./tests/demo", "./cmd/gpufrac-node", "./cmd/gpufrac-coordinator", "./cmd/kubectl-gpufrac"} {
		build := exec.Command("go", "build", "-o", bin+"/", pkg)
		build.Dir = root
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("building %s: %v\n%s", pkg, err, out)
		}
	}
	if err := os.Rename(filepath.Join(bin, "demo"), filepath.Join(bin, "gpufrac-demo")); err != nil {
		t.Fatal(err)
	}
	for _, tool := range []string{"etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kwok", "kwok-stages", "karpenter-kwok", "karpenter-crds",
		"kubelet", "containerd", "containerd-shim-runc-v2", "ctr"} {
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
	// down removes the state directory, logs and all: keep them first when
	// the test failed (once: the test downs the demo, and so does the cleanup).
	kept := false
	keepOnFailure := func() {
		if t.Failed() && !kept {
			kept = true
			keepLogs(t, state, filepath.Join(tmp, "kept"))
		}
	}
	t.Cleanup(func() {
		keepOnFailure()
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
	out, err := demo(ctx, "up", "--timeout=3m")
	t.Logf("up took %s:\n%s", time.Since(began).Round(time.Millisecond), out)
	if err != nil {
		logs, _ := os.ReadFile(filepath.Join(state, "demo.log"))
		t.Fatalf("up: %v\ndemo.log:\n%s", err, logs)
	}
	for _, want := range []string{
		"NODE gpu-node-1 (Ready)", "NODE gpu-node-2 (Ready)",
		"installed the gpufrac chart", "gpufrac-coordinator runs with the chart's arguments and leads as ServiceAccount gpufrac-system/gpufrac-coordinator",
		"default/ddp-0 (whole, gang ddp)", "default/ddp-1 (whole, gang ddp)", "default/train-llm (whole)",
		"made by Karpenter (NodePool gpu, gpu-", "Karpenter launched node", "export KUBECONFIG=",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("up's output lacks %q", want)
		}
	}
	for _, re := range []string{
		// Fractions share a GPU held by a reservation.
		`\[reservation\], default/\S+ \d+%, default/\S+ \d+%`,
		// The gang's pods are both on GPUs, the over-quota and the bad pod wait with their reasons.
		`default/eval-nightly +3 GPUs +team-b +OverQuota: queue team-b: non-preemptible`,
		`default/too-big +150% of a GPU +team-a +InvalidRequest:`,
		// The non-preemptible pod protects its node from disruption.
		`do-not-disrupt: .*default/train-llm`,
		// A node Karpenter made carries the burst's fractions and is protected.
		`made by Karpenter \(NodePool gpu, gpu-\S+\).*\n  do-not-disrupt: \d+ reservations?`,
		`default/batch-embed-\S+ 40%`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("up's output does not match %s", re)
		}
	}
	// The real node, where this machine allows one; else the reason.
	if err := cluster.RealNodeRequirements(bin); err == nil {
		if !regexp.MustCompile(`added real node gpu-node-real .*\n.*real-node/real-inference \(25 %\) runs in a container on gpu-node-real and sees /dev/nvidia[0-9]+, GPUFRAC_MEMORY_LIMIT_MIB=\d+ MiB`).MatchString(out) {
			t.Errorf("up's output lacks the real node and what its container sees")
		}
		if !strings.Contains(out, "NODE gpu-node-real (Ready)") {
			t.Errorf("the GPU view lacks the real node")
		}
	} else if !strings.Contains(out, "no real node on this machine") {
		t.Errorf("up's output does not say why there is no real node (%v)", err)
	}
	// A fraction bound where its GPU was full fails admission; the coordinator
	// must never do that.
	if strings.Contains(out, "Rejected at device admission") {
		t.Errorf("a pod failed device admission (a GPU overbooked by the coordinator)")
	}
	pid, ok := running(config{dir: state})
	if !ok {
		t.Fatal("no demo process running after up returned")
	}

	out, err = demo(ctx, "status")
	if err != nil || !strings.Contains(out, "NODE gpu-node-2 (Ready)") || !strings.Contains(out, "What you are looking at") {
		t.Errorf("status: %v\n%s", err, out)
	}

	// The issue 31 burst: fourteen 40% fractions need five GPUs beyond the
	// static nodes. With the chart's defaults (no price table) Karpenter buys
	// 1-GPU nodes, never the 8-GPU one, and the legend says why.
	cs := demoClient(t, config{dir: state})
	if _, err := cs.AppsV1().Deployments("default").Patch(ctx, burstDeployment, types.MergePatchType,
		[]byte(`{"spec":{"replicas":14}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	burstRow := regexp.MustCompile(`default/` + burstDeployment + `-\S+ 40%`)
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		out, err = demo(ctx, "status")
		return err == nil && len(burstRow.FindAllString(out, -1)) == 14, nil
	}); err != nil {
		t.Errorf("the burst scaled to 14 does not run: %v\n%s", err, out)
	} else {
		legend := strings.Join(strings.Fields(out), " ") // unwrapped
		bought := regexp.MustCompile(`Karpenter bought [^:]*:`).FindString(legend)
		t.Logf("scaled to 14: %s", bought)
		if bought == "" || strings.Contains(bought, "gpu-8x-h100") || !strings.Contains(legend, "each placeholder prefers nodes with no more GPUs than it asks") {
			t.Errorf("the burst scaled to 14 bought %q, want 1-GPU nodes only and the legend's reason:\n%s", bought, out)
		}
	}

	// The README's repartitioning step: once the burst is scaled down (its
	// reservations go after the grace period), the admin edits the
	// ConfigMap, a free GPU of a static node becomes seven MIG devices, and
	// the view shows them.
	if _, err := cs.AppsV1().Deployments("default").Patch(ctx, burstDeployment, types.MergePatchType,
		[]byte(`{"spec":{"replicas":0}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	var node, gpu string
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		out, err = demo(ctx, "status")
		node, gpu, ok = freeStaticGPU(out)
		return err == nil && ok, nil
	}); err != nil {
		t.Errorf("no free GPU on a static node to repartition after scaling %s to 0: %v\n%s", burstDeployment, err, out)
	} else {
		repartition(t, ctx, cs, node, gpu)
		var status string
		if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			status, err = demo(ctx, "status")
			return err == nil && regexp.MustCompile(`(?m)^  `+gpu+` +GPU-\S+ +mig 7× 1g\.10gb `).MatchString(status) &&
				regexp.MustCompile(`NODE `+node+` .*nvidia\.com/mig-1g\.10gb 7`).MatchString(status), nil
		}); err != nil {
			t.Errorf("the view does not show GPU %s of %s as seven MIG devices after the ConfigMap edit: %v\n%s", gpu, node, err, status)
		} else {
			t.Logf("GPU %s of %s serves seven MIG devices after the ConfigMap edit", gpu, node)
		}
	}
	again, err := demo(ctx, "up")
	if err != nil || !strings.Contains(again, "already running (pid "+strconv.Itoa(pid)+")") {
		t.Errorf("a second up: %v\n%s", err, again)
	}

	keepOnFailure()
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

// freeStaticGPU finds a free GPU of a static node in the view.
func freeStaticGPU(view string) (node, gpu string, ok bool) {
	row := regexp.MustCompile(`^  (\d+) +GPU-\S+ +fraction +ok +- +free`)
	node = ""
	for l := range strings.Lines(view) {
		if strings.HasPrefix(l, "NODE ") {
			node = ""
			if f := strings.Fields(l); len(f) > 1 && strings.HasPrefix(f[1], staticNodePrefix) && f[1] != draNode {
				node = f[1]
			}
			continue
		}
		if m := row.FindStringSubmatch(l); m != nil && node != "" {
			return node, m[1], true
		}
	}
	return "", "", false
}

// demoClient is a client of the demo cluster as its admin.
func demoClient(t *testing.T, cfg config) kubernetes.Interface {
	t.Helper()
	rc, err := clientcmd.BuildConfigFromFlags("", cfg.kubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// repartition adds a group to the demo's node config, as `kubectl edit cm`
// does: GPU gpu of node in MIG mode, seven 1g.10gb devices.
func repartition(t *testing.T, ctx context.Context, cs kubernetes.Interface, node, gpu string) {
	t.Helper()
	cms := cs.CoreV1().ConfigMaps(cluster.ChartNamespace)
	cm, err := cms.Get(ctx, cluster.NodeConfigMap, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal([]byte(cm.Data["config.yaml"]), &doc); err != nil {
		t.Fatal(err)
	}
	groups, _ := doc["groups"].([]any)
	doc["groups"] = append(groups, map[string]any{
		"nodeSelector": map[string]any{corev1.LabelHostname: node},
		"gpus":         []any{map[string]any{"indices": gpu, "mode": "mig", "migLayout": "all-1g.10gb"}},
	})
	edited, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	cm.Data["config.yaml"] = string(edited)
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// keepLogs copies the demo's logs (demo.log and every component's log under
// logs/, a link into the cluster directory) from the state directory to dst,
// which down leaves alone, and prints in the test log where they are and the
// lines that say what went wrong: errors and device-admission failures.
func keepLogs(t *testing.T, state, dst string) {
	t.Helper()
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Errorf("keeping the logs: %v", err)
		return
	}
	srcs := []string{filepath.Join(state, "demo.log")}
	logs, _ := filepath.Glob(filepath.Join(state, "logs", "*.log"))
	srcs = append(srcs, logs...)
	for _, src := range srcs {
		data, err := os.ReadFile(src)
		if err != nil {
			t.Logf("keeping %s: %v", src, err)
			continue
		}
		if err := os.WriteFile(filepath.Join(dst, filepath.Base(src)), data, 0o644); err != nil {
			t.Errorf("keeping %s: %v", src, err)
			continue
		}
		if lines := telling(string(data)); len(lines) > 0 {
			t.Logf("%s, the lines that tell (%d):\n%s", filepath.Base(src), len(lines), strings.Join(lines, "\n"))
		}
	}
	t.Logf("logs kept in %s", dst)
}

// maxTelling bounds the lines telling returns from one log.
const maxTelling = 60

// tellingMarks are what makes a log line worth printing when the test
// fails: a device admission the kubelet simulator failed, and the story of
// GPUs told in gpufrac's logs at their default verbosity (reservations
// created and removed by gpufrac-coordinator, the GPUs gpufrac-node wrote
// back).
var tellingMarks = []string{"Allocate failed", "UnexpectedAdmissionError", "Reserved GPU", "Removed reservation", "Wrote back GPU"}

// telling returns a log's klog error lines and lines with a tellingMark,
// the last maxTelling of them.
func telling(log string) []string {
	var out []string
	for l := range strings.Lines(log) {
		l = strings.TrimSuffix(l, "\n")
		if strings.HasPrefix(l, "E") || slices.ContainsFunc(tellingMarks, func(m string) bool { return strings.Contains(l, m) }) {
			out = append(out, l)
		}
	}
	return out[max(0, len(out)-maxTelling):]
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
