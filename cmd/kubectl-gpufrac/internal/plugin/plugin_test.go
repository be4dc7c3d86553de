package plugin

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/cmd/kubectl-gpufrac/internal/queueview"
	"github.com/gpufrac/gpufrac/cmd/kubectl-gpufrac/internal/tenantview"
	"github.com/gpufrac/gpufrac/cmd/kubectl-gpufrac/internal/view"
	"github.com/gpufrac/gpufrac/tests/builders"
)

// cluster is one GPU node n1 (2 GPUs in mode fraction), a reservation on its
// GPU 0 shared by team-a's 30 % and team-b's 20 %, team-a's whole GPU 1, and
// pending pods of both teams with the coordinator's reasons; queues root ->
// a, b.
func cluster() ([]runtime.Object, []*v1alpha1.Queue) {
	gpu0, gpu1 := builders.GPUUUID("n1", 0), builders.GPUUUID("n1", 1)
	running := func(name, ns, q, gpu string) *builders.PodWrapper {
		return builders.MakePod(name, ns).Queue(q).Node("n1").Phase(corev1.PodRunning).
			Annotation(api.AnnotationAdmittedQueue, q).Annotation(api.AnnotationGPU, gpu).Annotation(api.AnnotationAllocatedGPU, gpu)
	}
	objs := []runtime.Object{
		builders.MakeNode("n1").Inventory("fraction", 2).Obj(),
		builders.MakeNode("cpu-only").Obj(),
		builders.MakePod("gpufrac-reservation-n1-0", api.ReservationNamespace).GPUs(1).Node("n1").Phase(corev1.PodRunning).
			Label(api.LabelRole, api.RoleReservation).Annotation(api.AnnotationReservedGPU, gpu0).Obj(),
		running("frac30", "team-a", "a", gpu0).Fraction(30).Obj(),
		running("whole", "team-a", "a", gpu1).GPUs(1).Obj(),
		running("other", "team-b", "b", gpu0).Fraction(20).Obj(),
		builders.MakePod("waiting", "team-a").Fraction(50).Queue("a").PendingFor(api.ReasonOverQuota, "queue a is at its quota").Obj(),
		builders.MakePod("gang-0", "team-a").GPUs(2).Queue("a").PodGroup("g").PendingFor(api.ReasonGangIncomplete, "1 of 2 members").Obj(),
		builders.MakePod("nocap", "team-b").GPUs(4).Queue("b").PendingFor(api.ReasonNoCapacity, "no node has 4 free GPUs").Obj(),
		builders.MakePod("done", "team-a").Fraction(10).Queue("a").Node("n1").Phase(corev1.PodSucceeded).
			Annotation(api.AnnotationAdmittedQueue, "a").Obj(),
		builders.MakePod("web", "team-a").SchedulerName("default-scheduler").CPU("1").Node("n1").Phase(corev1.PodRunning).Obj(),
	}
	a := builders.MakeQueue("a").Parent("root").GPUQuota("2").GPULimit("3").Namespaces("team-a").Obj()
	a.Status.Allocated = corev1.ResourceList{v1alpha1.ResourceGPU: resource.MustParse("1.3")}
	queues := []*v1alpha1.Queue{
		builders.MakeQueue("root").GPUQuota("4").Obj(),
		a,
		builders.MakeQueue("b").Parent("root").GPUQuota("1").Namespaces("team-b").Obj(),
	}
	return objs, queues
}

// rbac says what the fake API server lets the user do.
type rbac int

const (
	// clusterReader may read everything.
	clusterReader rbac = iota
	// tenantWithQueues may get and list pods in team-a, and list queues.
	tenantWithQueues
	// tenant may get and list pods in team-a only.
	tenant
)

// clients builds fake clients over cluster() that answer Forbidden to what
// r does not allow, and record every call.
func clients(t *testing.T, r rbac) (Clients, *fake.Clientset, *dynamicfake.FakeDynamicClient) {
	t.Helper()
	objs, queues := cluster()
	kube := fake.NewClientset(objs...)
	var dynObjs []runtime.Object
	for _, q := range queues {
		u, err := v1alpha1.ToUnstructured(q)
		if err != nil {
			t.Fatal(err)
		}
		dynObjs = append(dynObjs, u)
	}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{v1alpha1.QueueGVR(): v1alpha1.QueueListKind}, dynObjs...)
	forbid := func(a k8stesting.Action) (bool, runtime.Object, error) {
		gr := a.GetResource().GroupResource()
		return true, nil, apierrors.NewForbidden(gr, "", errors.New("RBAC: not allowed"))
	}
	if r != clusterReader {
		kube.PrependReactor("*", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
			if a.GetResource().Resource == "pods" && a.GetNamespace() == "team-a" && (a.GetVerb() == "list" || a.GetVerb() == "get") {
				return false, nil, nil
			}
			return forbid(a)
		})
	}
	if r == tenant {
		dyn.PrependReactor("*", "*", forbid)
	}
	return Clients{Kube: kube, Dynamic: dyn}, kube, dyn
}

func run(t *testing.T, c Clients, cfg Config) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err = Run(t.Context(), c, cfg, &out, &errOut)
	return out.String(), errOut.String(), err
}

// queueRow is what the tests compare of a queue.
type queueRow struct {
	Name, Quota, Limit, Used, Allocated string
	Known                               bool
	Running                             int
	Pending                             map[string]int
}

func rows(qs []queueview.Queue) []queueRow {
	out := []queueRow{}
	for _, q := range qs {
		out = append(out, queueRow{Name: q.Name, Quota: q.GPUQuota, Limit: q.GPULimit, Used: q.UsedGPUs, Allocated: q.AllocatedGPUs,
			Known: q.Known, Running: q.Running, Pending: q.Pending})
	}
	return out
}

func TestQueues(t *testing.T) {
	a := queueRow{Name: "a", Quota: "2", Limit: "3", Used: "1.3", Allocated: "1.3", Known: true, Running: 2,
		Pending: map[string]int{api.ReasonOverQuota: 1, api.ReasonGangIncomplete: 1}}
	tests := []struct {
		name     string
		rbac     rbac
		cfg      Config
		want     []queueRow
		wantHint bool
		wantNote string
	}{
		{
			name: "a cluster reader sees every queue, usage summed up the tree",
			rbac: clusterReader,
			cfg:  Config{Command: CommandQueues, Output: OutputJSON},
			want: []queueRow{
				a,
				{Name: "b", Quota: "1", Used: "0.2", Known: true, Running: 1, Pending: map[string]int{api.ReasonNoCapacity: 1}},
				{Name: "root", Quota: "4", Used: "1.5", Known: true, Pending: map[string]int{}},
			},
		},
		{
			name:     "a tenant falls back to its namespace: used counts its pods only",
			rbac:     tenantWithQueues,
			cfg:      Config{Command: CommandQueues, Output: OutputJSON, DefaultNamespace: "team-a"},
			wantHint: true,
			want: []queueRow{
				a,
				{Name: "b", Quota: "1", Used: "0", Known: true, Pending: map[string]int{}},
				{Name: "root", Quota: "4", Used: "1.3", Known: true, Pending: map[string]int{}},
			},
			wantNote: "namespace team-a's pods only",
		},
		{
			name: "a tenant that may not read queues still sees its own use and pending pods",
			rbac: tenant,
			cfg:  Config{Command: CommandQueues, Output: OutputJSON, Namespace: "team-a"},
			want: []queueRow{{Name: "a", Used: "1.3", Running: 2,
				Pending: map[string]int{api.ReasonOverQuota: 1, api.ReasonGangIncomplete: 1}}},
			wantNote: "queues are not readable",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _, _ := clients(t, tt.rbac)
			out, errOut, err := run(t, c, tt.cfg)
			if err != nil {
				t.Fatalf("Run: %v (stderr %q)", err, errOut)
			}
			var got queueview.View
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatalf("decoding %q: %v", out, err)
			}
			if diff := cmp.Diff(tt.want, rows(got.Queues)); diff != "" {
				t.Errorf("queues (-want +got):\n%s", diff)
			}
			if hint := strings.Contains(errOut, "no cluster-wide read"); hint != tt.wantHint {
				t.Errorf("stderr %q: hint %v, want %v", errOut, hint, tt.wantHint)
			}
			if tt.wantNote != "" && !strings.Contains(strings.Join(got.Notes, "\n"), tt.wantNote) {
				t.Errorf("notes %q do not say %q", got.Notes, tt.wantNote)
			}
		})
	}
}

func TestNamespaceView(t *testing.T) {
	gpu0, gpu1 := builders.GPUUUID("n1", 0), builders.GPUUUID("n1", 1)
	teamA := []tenantview.Pod{
		{Namespace: "team-a", Name: "frac30", Node: "n1", GPU: gpu0, Share: "30%", Percent: 30, Phase: "Running", Queue: "a"},
		{Namespace: "team-a", Name: "gang-0", Share: "2 GPUs", Whole: 2, Phase: "Pending", Queue: "a",
			Reason: api.ReasonGangIncomplete, Message: "1 of 2 members"},
		{Namespace: "team-a", Name: "waiting", Share: "50%", Percent: 50, Phase: "Pending", Queue: "a",
			Reason: api.ReasonOverQuota, Message: "queue a is at its quota"},
		{Namespace: "team-a", Name: "whole", Node: "n1", GPU: gpu1, Share: "1 GPU", Whole: 1, Phase: "Running", Queue: "a"},
	}
	tests := []struct {
		name       string
		rbac       rbac
		cfg        Config
		wantPods   []tenantview.Pod
		wantQueues []string
		wantHint   bool
		wantNote   string
	}{
		{
			name:       "-n by a cluster reader",
			rbac:       clusterReader,
			cfg:        Config{Namespace: "team-a", Output: OutputJSON},
			wantPods:   teamA,
			wantQueues: []string{"a"},
		},
		{
			name:       "a tenant without -n falls back to the kubeconfig's namespace, reading only its pods",
			rbac:       tenantWithQueues,
			cfg:        Config{DefaultNamespace: "team-a", Output: OutputJSON},
			wantPods:   teamA,
			wantQueues: []string{"a"},
			wantHint:   true,
		},
		{
			name:       "queues forbidden: a note, the pods still shown",
			rbac:       tenant,
			cfg:        Config{DefaultNamespace: "team-a", Output: OutputJSON},
			wantPods:   teamA,
			wantQueues: []string{"a"},
			wantHint:   true,
			wantNote:   "queues are not readable",
		},
		{
			name:       "--node keeps the pods bound to it",
			rbac:       tenant,
			cfg:        Config{Namespace: "team-a", Node: "n1", Output: OutputJSON},
			wantPods:   []tenantview.Pod{teamA[0], teamA[3]},
			wantQueues: []string{"a"},
			wantNote:   "queues are not readable",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, kube, _ := clients(t, tt.rbac)
			out, errOut, err := run(t, c, tt.cfg)
			if err != nil {
				t.Fatalf("Run: %v (stderr %q)", err, errOut)
			}
			var got NamespaceDoc
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatalf("decoding %q: %v", out, err)
			}
			if got.View == nil || got.Namespace != "team-a" {
				t.Fatalf("namespace view of %+v, want team-a", got.View)
			}
			if diff := cmp.Diff(tt.wantPods, got.Pods); diff != "" {
				t.Errorf("pods (-want +got):\n%s", diff)
			}
			var names []string
			for _, q := range got.Queues {
				names = append(names, q.Name)
			}
			if diff := cmp.Diff(tt.wantQueues, names, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("queues (-want +got):\n%s", diff)
			}
			if hint := strings.Contains(errOut, "no cluster-wide read") && strings.Contains(errOut, "team-a"); hint != tt.wantHint {
				t.Errorf("stderr %q: hint %v, want %v", errOut, hint, tt.wantHint)
			}
			if tt.wantNote != "" && !strings.Contains(strings.Join(got.Notes, "\n"), tt.wantNote) {
				t.Errorf("notes %q do not say %q", got.Notes, tt.wantNote)
			}
			// -n reads team-a only: its pods, its claims when allowed (the
			// tenant cases forbid them and everything else) and the
			// namespace itself (its default queue).
			for _, a := range kube.Actions() {
				if r := a.GetResource().Resource; (r == "pods" || r == "resourceclaims") && a.GetNamespace() == "team-a" {
					continue
				}
				if g, ok := a.(k8stesting.GetAction); ok && a.GetResource().Resource == "namespaces" && g.GetName() == "team-a" {
					continue
				}
				if tt.rbac == clusterReader {
					t.Errorf("-n read %s %s in %q, want only team-a's pods and claims", a.GetVerb(), a.GetResource().Resource, a.GetNamespace())
				}
			}
		})
	}
}

func TestNodes(t *testing.T) {
	gpu0, gpu1 := builders.GPUUUID("n1", 0), builders.GPUUUID("n1", 1)
	wantGPUs := []view.GPUDoc{
		{Index: 0, UUID: gpu0, Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559, Mode: "fraction", Healthy: true, UsedPercent: 50, Reserved: true,
			Holders: []view.HolderDoc{
				{Namespace: api.ReservationNamespace, Name: "gpufrac-reservation-n1-0", Role: "reservation", Whole: 1, Reservation: true, Phase: "Running"},
				{Namespace: "team-a", Name: "frac30", Role: "fraction", Percent: 30, Phase: "Running"},
				{Namespace: "team-b", Name: "other", Role: "fraction", Percent: 20, Phase: "Running"},
			}},
		{Index: 1, UUID: gpu1, Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559, Mode: "fraction", Healthy: true, UsedPercent: 100,
			Holders: []view.HolderDoc{{Namespace: "team-a", Name: "whole", Role: "whole", Whole: 1, Phase: "Running"}}},
	}
	tests := []struct {
		name        string
		cfg         Config
		wantNodes   []string
		wantPending []string
	}{
		{
			name:        "every node, pending pods too",
			cfg:         Config{Output: OutputJSON},
			wantNodes:   []string{"n1"},
			wantPending: []string{"team-a/gang-0", "team-a/waiting", "team-b/nocap"},
		},
		{
			name:      "--node n1: the node alone",
			cfg:       Config{Command: CommandNodes, Node: "n1", Output: OutputJSON},
			wantNodes: []string{"n1"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _, _ := clients(t, clusterReader)
			out, errOut, err := run(t, c, tt.cfg)
			if err != nil {
				t.Fatalf("Run: %v (stderr %q)", err, errOut)
			}
			var got view.Document
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatalf("decoding %q: %v", out, err)
			}
			var nodes, pending []string
			for _, n := range got.Nodes {
				nodes = append(nodes, n.Name)
			}
			for _, p := range got.Pending {
				pending = append(pending, p.Namespace+"/"+p.Name)
			}
			if diff := cmp.Diff(tt.wantNodes, nodes); diff != "" {
				t.Errorf("nodes (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantPending, pending, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("pending (-want +got):\n%s", diff)
			}
			if len(got.Nodes) == 1 {
				if diff := cmp.Diff(wantGPUs, got.Nodes[0].GPUs); diff != "" {
					t.Errorf("GPUs of n1 (-want +got):\n%s", diff)
				}
			}
		})
	}
}

func TestErrors(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr error
		wantMsg string
	}{
		{name: "unknown output", cfg: Config{Output: "yaml"}, wantErr: ErrUsage},
		{name: "unknown command", cfg: Config{Command: "gpus"}, wantErr: ErrUsage},
		{name: "node without GPUs", cfg: Config{Node: "cpu-only"}, wantErr: view.ErrNoGPUs},
		{name: "missing node", cfg: Config{Node: "n9"}, wantMsg: "reading node n9"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _, _ := clients(t, clusterReader)
			_, _, err := run(t, c, tt.cfg)
			if err == nil {
				t.Fatal("Run succeeded, want an error")
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("error %v, want %v", err, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error %q does not say %q", err, tt.wantMsg)
			}
		})
	}
}

// TestText checks the text tables name what the JSON holds.
func TestText(t *testing.T) {
	tests := []struct {
		name string
		rbac rbac
		cfg  Config
		want []string
	}{
		{
			name: "queues",
			cfg:  Config{Command: CommandQueues},
			want: []string{"QUEUE", "GPU QUOTA", "a  ", "OverQuota 1", "NoCapacity 1", "1.3"},
		},
		{
			name: "namespace view",
			rbac: tenant,
			cfg:  Config{DefaultNamespace: "team-a"},
			want: []string{"POD", "frac30", "30%", "GangIncomplete: 1 of 2 members", "a (not read)", "Note: queues are not readable"},
		},
		{
			name: "node view",
			cfg:  Config{Node: "n1"},
			want: []string{"NODE n1", "team-a/frac30 30%", "team-a/whole (whole)"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _, _ := clients(t, tt.rbac)
			out, errOut, err := run(t, c, tt.cfg)
			if err != nil {
				t.Fatalf("Run: %v (stderr %q)", err, errOut)
			}
			t.Logf("stderr:\n%sstdout:\n%s", errOut, out)
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("output does not say %q:\n%s", w, out)
				}
			}
		})
	}
}
