package queue_test

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/coordinator/queue"
	"github.com/gpufrac/gpufrac/tests/builders"
)

func TestResources(t *testing.T) {
	a := queue.Resources{GPUMilli: 1500, CPUMilli: 2000, MemoryBytes: 4 << 30}
	b := queue.Resources{GPUMilli: 500, CPUMilli: 250}
	tests := []struct {
		name string
		got  any
		want any
	}{
		{name: "add", got: a.Add(b), want: queue.Resources{GPUMilli: 2000, CPUMilli: 2250, MemoryBytes: 4 << 30}},
		{name: "sub", got: a.Sub(b), want: queue.Resources{GPUMilli: 1000, CPUMilli: 1750, MemoryBytes: 4 << 30}},
		{name: "add saturates", got: queue.Resources{GPUMilli: queue.Unlimited}.Add(b).GPUMilli, want: queue.Unlimited},
		{name: "b <= a", got: b.LessOrEqual(a), want: true},
		{name: "a <= b", got: a.LessOrEqual(b), want: false},
		{name: "one component larger", got: queue.Resources{MemoryBytes: 1}.LessOrEqual(b), want: false},
		{name: "equal", got: a.LessOrEqual(a), want: true},
		{name: "string", got: a.String(), want: "gpu=1.5 cpu=2 memory=4Gi"},
		{name: "string of milli", got: queue.Resources{GPUMilli: 30, CPUMilli: -250}.String(), want: "gpu=0.03 cpu=-0.25"},
		{name: "string of nothing", got: queue.Resources{}.String(), want: "none"},
		{name: "string of unlimited", got: queue.UnlimitedResources().String(), want: "gpu=unlimited cpu=unlimited memory=unlimited"},
		{name: "zero", got: queue.Resources{}.IsZero(), want: true},
		{name: "not zero", got: b.IsZero(), want: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, tc.got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestSpecFromAPI(t *testing.T) {
	unlimited := queue.Unlimited
	tests := []struct {
		name    string
		queue   v1alpha1.QueueSpec
		want    queue.Spec
		wantErr string
	}{
		{
			name:  "no resources: nothing managed",
			queue: v1alpha1.QueueSpec{Parent: "org", Priority: 3},
			want: queue.Spec{Name: "q", Parent: "org", Priority: 3,
				Quota: queue.UnlimitedResources(), Limit: queue.UnlimitedResources(), Weights: queue.DefaultWeights()},
		},
		{
			name: "fractional GPUs, CPU milli, memory bytes",
			queue: v1alpha1.QueueSpec{Resources: v1alpha1.QueueResources{
				GPU:    &v1alpha1.ResourceQuota{Quota: qty("2.5"), Limit: qty("4"), OverQuotaWeight: ptr.To[int32](3)},
				CPU:    &v1alpha1.ResourceQuota{Quota: qty("500m")},
				Memory: &v1alpha1.ResourceQuota{Quota: qty("1.5Gi"), OverQuotaWeight: ptr.To[int32](0)},
			}},
			want: queue.Spec{Name: "q",
				Quota:   queue.Resources{GPUMilli: 2500, CPUMilli: 500, MemoryBytes: 3 << 29},
				Limit:   queue.Resources{GPUMilli: 4000, CPUMilli: unlimited, MemoryBytes: unlimited},
				Weights: queue.Weights{GPU: 3, CPU: 1, Memory: 0}},
		},
		{
			name:  "block without quota deserves nothing",
			queue: v1alpha1.QueueSpec{Resources: v1alpha1.QueueResources{GPU: &v1alpha1.ResourceQuota{Limit: qty("2")}}},
			want: queue.Spec{Name: "q",
				Quota:   queue.Resources{GPUMilli: 0, CPUMilli: unlimited, MemoryBytes: unlimited},
				Limit:   queue.Resources{GPUMilli: 2000, CPUMilli: unlimited, MemoryBytes: unlimited},
				Weights: queue.DefaultWeights()},
		},
		{
			name:    "negative quota",
			queue:   v1alpha1.QueueSpec{Resources: v1alpha1.QueueResources{GPU: &v1alpha1.ResourceQuota{Quota: qty("-1")}}},
			wantErr: `converting queue "q": gpu quota: -1 is negative`,
		},
		{
			name:  "quota kept by Kueue: nothing managed",
			queue: v1alpha1.QueueSpec{Admission: v1alpha1.AdmissionKueue, Namespaces: []string{"ml"}},
			want: queue.Spec{Name: "q",
				Quota: queue.UnlimitedResources(), Limit: queue.UnlimitedResources(), Weights: queue.DefaultWeights()},
		},
		{
			name:    "Kueue and a quota of its own",
			queue:   v1alpha1.QueueSpec{Admission: v1alpha1.AdmissionKueue, Resources: v1alpha1.QueueResources{GPU: &v1alpha1.ResourceQuota{Quota: qty("1")}}},
			wantErr: `converting queue "q": admission Kueue: the queue has resources or a parent, and Kueue keeps its quota`,
		},
		{
			name:    "Kueue under a parent",
			queue:   v1alpha1.QueueSpec{Admission: v1alpha1.AdmissionKueue, Parent: "org"},
			wantErr: `converting queue "q": admission Kueue: the queue has resources or a parent, and Kueue keeps its quota`,
		},
		{
			name:    "unknown admission",
			queue:   v1alpha1.QueueSpec{Admission: "kueue"},
			wantErr: `converting queue "q": admission "kueue": want "Kueue" or none`,
		},
		{
			name:    "too large",
			queue:   v1alpha1.QueueSpec{Resources: v1alpha1.QueueResources{Memory: &v1alpha1.ResourceQuota{Limit: qty("2Ei")}}},
			wantErr: `converting queue "q": memory limit: 2Ei is too large`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := queue.SpecFromAPI(&v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: "q"}, Spec: tc.queue})
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Errorf("error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("SpecFromAPI: %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("spec (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNewTree(t *testing.T) {
	tests := []struct {
		name         string
		specs        []queue.Spec
		wantNames    []string
		wantLeaves   []string
		wantProblems map[string]string
		wantOversub  []string
	}{
		{
			name:       "valid hierarchy",
			specs:      orgTree(),
			wantNames:  []string{"org", "other", "team-a", "team-b"},
			wantLeaves: []string{"other", "team-a", "team-b"},
		},
		{
			name: "unknown parent, and its child",
			specs: []queue.Spec{
				spec(builders.MakeQueue("a").Parent("ghost")),
				spec(builders.MakeQueue("b").Parent("a")),
				spec(builders.MakeQueue("c")),
			},
			wantNames:  []string{"c"},
			wantLeaves: []string{"c"},
			wantProblems: map[string]string{
				"a": `parent "ghost" does not exist`,
				"b": `parent "a" is invalid`,
			},
		},
		{
			name: "cycle, and a queue hanging off it",
			specs: []queue.Spec{
				spec(builders.MakeQueue("a").Parent("b")),
				spec(builders.MakeQueue("b").Parent("a")),
				spec(builders.MakeQueue("x").Parent("a")),
			},
			wantProblems: map[string]string{
				"a": "its parents form a cycle: a -> b -> a",
				"b": "its parents form a cycle: b -> a -> b",
				"x": `parent "a" is invalid`,
			},
		},
		{
			name: "bad numbers, self parent, duplicates, no name",
			specs: []queue.Spec{
				spec(builders.MakeQueue("dup")),
				spec(builders.MakeQueue("dup")),
				spec(builders.MakeQueue("self").Parent("self")),
				{Name: "neg", Quota: queue.Resources{GPUMilli: -1}, Limit: queue.UnlimitedResources(), Weights: queue.Weights{CPU: -1}},
				spec(builders.MakeQueue("above").GPUQuota("4").GPULimit("2")),
				{Parent: "x"},
				spec(builders.MakeQueue("fine")),
			},
			wantNames:  []string{"fine"},
			wantLeaves: []string{"fine"},
			wantProblems: map[string]string{
				"dup":       "defined more than once",
				"self":      "it is its own parent",
				"neg":       "gpu quota is negative, cpu overQuotaWeight is negative",
				"above":     "gpu quota 4 is above its limit 2",
				"(unnamed)": "a queue has no name",
			},
		},
		{
			name: "children deserve more than the parent: allowed, reported",
			specs: []queue.Spec{
				spec(builders.MakeQueue("org").GPUQuota("4").MemoryQuota("1Gi")),
				spec(builders.MakeQueue("a").Parent("org").GPUQuota("3").MemoryQuota("1Gi")),
				spec(builders.MakeQueue("b").Parent("org").GPUQuota("2.5")), // memory unmanaged: unlimited
			},
			wantNames:  []string{"a", "b", "org"},
			wantLeaves: []string{"a", "b"},
			wantOversub: []string{
				"queue org: children deserve 5.5 GPUs in total, more than its quota of 4",
				"queue org: children deserve unlimited memory in total, more than its quota of 1Gi",
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tree, err := queue.NewTree(tc.specs)
			var gotProblems map[string]string
			if err != nil {
				var te *queue.TreeError
				if !errors.As(err, &te) || !errors.Is(err, queue.ErrInvalidQueue) {
					t.Fatalf("error %v is not a *TreeError matching ErrInvalidQueue", err)
				}
				gotProblems = te.Problems
			}
			if diff := cmp.Diff(tc.wantProblems, gotProblems); diff != "" {
				t.Errorf("problems (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantNames, tree.Names(), emptyIsNil()); diff != "" {
				t.Errorf("names (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantLeaves, tree.Leaves(), emptyIsNil()); diff != "" {
				t.Errorf("leaves (-want +got):\n%s", diff)
			}
			var oversub []string
			for _, o := range tree.Oversubscribed() {
				oversub = append(oversub, o.String())
			}
			if diff := cmp.Diff(tc.wantOversub, oversub); diff != "" {
				t.Errorf("oversubscribed (-want +got):\n%s", diff)
			}
		})
	}
}

func emptyIsNil() cmp.Option {
	return cmp.FilterValues(func(a, b []string) bool { return len(a) == 0 && len(b) == 0 }, cmp.Ignore())
}

func TestTreeErrorMessage(t *testing.T) {
	_, err := queue.NewTree([]queue.Spec{spec(builders.MakeQueue("b").Parent("x")), spec(builders.MakeQueue("a").Parent("b"))})
	want := `invalid queues: queue a: parent "b" is invalid; queue b: parent "x" does not exist`
	if err == nil || err.Error() != want {
		t.Errorf("error = %v, want %q", err, want)
	}
}

func TestAssumeForget(t *testing.T) {
	type usageOf struct{ Used, NonPreemptible queue.Resources }
	tests := []struct {
		name      string
		calls     func(tree *queue.Tree) error
		wantErr   string
		wantUsage map[string]usageOf
	}{
		{
			name: "charged to the leaf and every ancestor",
			calls: func(tree *queue.Tree) error {
				return errors.Join(
					tree.Assume("team-a", res("1.5", "2", "1Gi"), false),
					tree.Assume("team-a", gpus("1"), true),
					tree.Assume("team-b", gpus("0.3"), false),
				)
			},
			wantUsage: map[string]usageOf{
				"org":    {Used: res("2.8", "2", "1Gi"), NonPreemptible: gpus("1")},
				"team-a": {Used: res("2.5", "2", "1Gi"), NonPreemptible: gpus("1")},
				"team-b": {Used: gpus("0.3")},
				"other":  {},
			},
		},
		{
			name: "forget undoes assume",
			calls: func(tree *queue.Tree) error {
				return errors.Join(
					tree.Assume("team-a", gpus("2"), true),
					tree.Assume("team-a", gpus("1"), false),
					tree.Forget("team-a", gpus("2"), true),
				)
			},
			wantUsage: map[string]usageOf{
				"org": {Used: gpus("1")}, "team-a": {Used: gpus("1")}, "team-b": {}, "other": {},
			},
		},
		{
			name:    "unknown queue",
			calls:   func(tree *queue.Tree) error { return tree.Assume("team-z", gpus("1"), false) },
			wantErr: `assuming gpu=1: queue "team-z": unknown queue: create a Queue of that name or use an existing leaf queue`,
			wantUsage: map[string]usageOf{
				"org": {}, "team-a": {}, "team-b": {}, "other": {},
			},
		},
		{
			name:    "parent queue takes no pods",
			calls:   func(tree *queue.Tree) error { return tree.Assume("org", gpus("1"), false) },
			wantErr: `assuming gpu=1: queue "org": queue has child queues (team-a, team-b); pods must use a leaf queue`,
			wantUsage: map[string]usageOf{
				"org": {}, "team-a": {}, "team-b": {}, "other": {},
			},
		},
		{
			name: "forget more than assumed changes nothing",
			calls: func(tree *queue.Tree) error {
				if err := tree.Assume("team-b", gpus("1"), false); err != nil {
					return err
				}
				return tree.Forget("team-b", gpus("1"), true) // never assumed as non-preemptible
			},
			wantErr: `forgetting gpu=1 in queue "team-b": more than the gpu=1 charged to it`,
			wantUsage: map[string]usageOf{
				"org": {Used: gpus("1")}, "team-a": {}, "team-b": {Used: gpus("1")}, "other": {},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tree := newTree(t, orgTree())
			err := tc.calls(tree)
			if gotErr := errString(err); gotErr != tc.wantErr {
				t.Errorf("error = %q, want %q", gotErr, tc.wantErr)
			}
			got := map[string]usageOf{}
			for _, name := range tree.Names() {
				used, np, ok := tree.Usage(name)
				if !ok {
					t.Fatalf("Usage(%s) not found", name)
				}
				got[name] = usageOf{Used: used, NonPreemptible: np}
			}
			if diff := cmp.Diff(tc.wantUsage, got); diff != "" {
				t.Errorf("usage (-want +got):\n%s", diff)
			}
		})
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func TestValidateLeaf(t *testing.T) {
	tree := newTree(t, orgTree())
	tests := []struct {
		name  string
		queue string
		want  error
	}{
		{name: "leaf", queue: "team-a"},
		{name: "parent", queue: "org", want: queue.ErrNotLeaf},
		{name: "unknown", queue: "nope", want: queue.ErrUnknownQueue},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tree.ValidateLeaf(tc.queue)
			if (tc.want == nil) != (err == nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Errorf("ValidateLeaf(%s) = %v, want %v", tc.queue, err, tc.want)
			}
		})
	}
}

func TestCloneIsIndependent(t *testing.T) {
	tree := newTree(t, orgTree(), usage{queue: "team-a", res: gpus("1")})
	tree.FairShare(gpus("10"), map[string]queue.Resources{"team-a": gpus("3")})
	clone := tree.Clone()
	if err := clone.Assume("team-b", gpus("2"), false); err != nil {
		t.Fatalf("Assume on clone: %v", err)
	}
	clone.FairShare(gpus("1"), nil)
	used, _, _ := tree.Usage("org")
	if diff := cmp.Diff(gpus("1"), used); diff != "" {
		t.Errorf("original org usage after changing the clone (-want +got):\n%s", diff)
	}
	cused, _, _ := clone.Usage("org")
	if diff := cmp.Diff(gpus("3"), cused); diff != "" {
		t.Errorf("clone org usage (-want +got):\n%s", diff)
	}
	// The original keeps its own fair share: team-a at 1 of its fair 3 is a third.
	if share, _ := tree.DominantShare("team-a"); math.Abs(share-1.0/3) > 1e-9 {
		t.Errorf("original team-a share = %v, want 1/3", share)
	}
	if got := strings.Join(clone.Leaves(), ","); got != "other,team-a,team-b" {
		t.Errorf("clone leaves = %s", got)
	}
}
