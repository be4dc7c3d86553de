package crdapply_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/gpufrac/gpufrac/cmd/internal/crdapply"
)

const queueCRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: queues.gpufrac.io}
spec:
  group: gpufrac.io
  names: {plural: queues, kind: Queue}
`

func TestRead(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		files map[string]string
		want  []string // the CRDs' names, when err is empty
		err   string
	}{
		{name: "one CRD", files: map[string]string{"q.yaml": queueCRD}, want: []string{"queues.gpufrac.io"}},
		{name: "empty documents are skipped", files: map[string]string{"q.yaml": "---\n" + queueCRD + "---\n"}, want: []string{"queues.gpufrac.io"}},
		{name: "other files are not read", files: map[string]string{"q.yaml": queueCRD, "README.md": "not yaml: ["}, want: []string{"queues.gpufrac.io"}},
		{name: "no CRD", files: map[string]string{"README.md": "x"}, err: "no CustomResourceDefinition"},
		{name: "another kind", files: map[string]string{"q.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n"}, err: "is not an apiextensions.k8s.io/v1 CustomResourceDefinition"},
		{name: "another group", files: map[string]string{"q.yaml": strings.ReplaceAll(queueCRD, "gpufrac.io", "example.com")}, err: `not gpufrac's gpufrac.io`},
		{name: "a name that is not plural.group", files: map[string]string{"q.yaml": strings.Replace(queueCRD, "name: queues.gpufrac.io", "name: other.gpufrac.io", 1)}, err: "is not named <spec.names.plural>.<spec.group>"},
		{name: "the same CRD twice", files: map[string]string{"a.yaml": queueCRD, "b.yaml": queueCRD}, err: "given twice"},
		{name: "bad YAML", files: map[string]string{"q.yaml": "kind: [\n"}, err: "q.yaml"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, data := range tc.files {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			crds, err := crdapply.Read(dir)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, crdapply.Names(crds)); diff != "" {
				t.Errorf("CRDs (-want +got):\n%s", diff)
			}
		})
	}
	// The chart's own crds/ is what the hook reads.
	crds, err := crdapply.Read(filepath.Join(root, "deployments", "helm", "gpufrac", "crds"))
	if err != nil || len(crds) == 0 {
		t.Fatalf("the chart's crds/: %v", err)
	}
}

// TestApplyLeavesAMissingCRD: a CRD that does not exist is neither created
// nor anything else: the hook may only get and patch (Helm's crds/ or the
// admin creates it).
func TestApplyLeavesAMissingCRD(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "q.yaml"), []byte(queueCRD), 0o644); err != nil {
		t.Fatal(err)
	}
	crds, err := crdapply.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	client := dynamicfake.NewSimpleDynamicClient(runtime.NewScheme())
	got, err := crdapply.Apply(t.Context(), client, crds, crdapply.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if got["queues.gpufrac.io"] != crdapply.Absent {
		t.Errorf("result %v, want absent", got)
	}
	var verbs []string
	for _, a := range client.Actions() {
		verbs = append(verbs, a.GetVerb())
		if _, ok := a.(clienttesting.GetAction); !ok {
			t.Errorf("Apply did %s %s on a missing CRD", a.GetVerb(), a.GetResource().Resource)
		}
	}
	if len(verbs) != 1 {
		t.Errorf("actions %v, want one get", verbs)
	}
}

// installedCRD is queues.gpufrac.io as Helm's crds/ left it: every field
// Helm's (an Update entry), optionally Established.
func installedCRD(established bool) *unstructured.Unstructured {
	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": map[string]any{"name": "queues.gpufrac.io", "resourceVersion": "1"},
		"spec":     map[string]any{"group": "gpufrac.io", "names": map[string]any{"plural": "queues", "kind": "Queue"}, "scope": "Namespaced"},
	}}
	crd.SetManagedFields([]metav1.ManagedFieldsEntry{{
		Manager: "helm", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "apiextensions.k8s.io/v1",
		FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:spec":{"f:group":{},"f:scope":{},"f:names":{"f:plural":{},"f:kind":{}}}}`)},
	}})
	if established {
		crd.Object["status"] = map[string]any{"conditions": []any{map[string]any{"type": "Established", "status": "True"}}}
	}
	return crd
}

// applyReactor plays server-side apply on client's tracker, as far as the
// tests need: the applied spec replaces the stored one, and so does the
// applied VersionAnnotation when there is one; managedFields are left as
// they are.
func applyReactor(client *dynamicfake.FakeDynamicClient) clienttesting.ReactionFunc {
	return func(a clienttesting.Action) (bool, runtime.Object, error) {
		p := a.(clienttesting.PatchAction)
		if p.GetPatchType() != types.ApplyPatchType {
			return false, nil, nil
		}
		applied := &unstructured.Unstructured{}
		if err := applied.UnmarshalJSON(p.GetPatch()); err != nil {
			return true, nil, err
		}
		cur, err := client.Tracker().Get(crdapply.Resource, "", p.GetName())
		if err != nil {
			return true, nil, err
		}
		u := cur.(*unstructured.Unstructured).DeepCopy()
		u.Object["spec"] = applied.Object["spec"]
		if v, ok := applied.GetAnnotations()[crdapply.VersionAnnotation]; ok {
			u.SetAnnotations(map[string]string{crdapply.VersionAnnotation: v})
		}
		return true, u, client.Tracker().Update(crdapply.Resource, u, "")
	}
}

// TestApplyWhenTheAPIServerFails (issue 29): the API server refuses a
// read, conflicts on the field takeover, refuses the apply after the
// takeover, or never establishes the CRD. Each stops Apply with an error
// naming the CRD and the step; the CRD's spec is never half-changed (the
// takeover changes only managedFields); a rerun (the Job's next try)
// completes from where the failed one stopped.
func TestApplyWhenTheAPIServerFails(t *testing.T) {
	dir := t.TempDir()
	// The chart's CRD: scope Cluster where the installed one said Namespaced.
	if err := os.WriteFile(filepath.Join(dir, "q.yaml"), []byte(queueCRD+"  scope: Cluster\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	crds, err := crdapply.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	gvr := crdapply.Resource
	unavailable := apierrors.NewServiceUnavailable("etcd is down")
	type failure struct {
		verb      string          // get or patch
		patchType types.PatchType // of a patch
		times     int             // how many calls fail, -1: all
		err       error
	}
	cases := []struct {
		name        string
		established bool
		fail        []failure
		err         string // empty: Apply succeeds despite the failures
		patched     bool   // whether the takeover patch went through before the error
		applied     bool
		actions     []string // the calls up to the apply, when given
	}{
		{name: "reading the CRD fails", established: true, fail: []failure{{verb: "get", times: -1, err: unavailable}},
			err: "reading CustomResourceDefinition queues.gpufrac.io"},
		{name: "the takeover conflicts once and is retried on a fresh read", established: true,
			fail:    []failure{{verb: "patch", patchType: types.JSONPatchType, times: 1, err: apierrors.NewConflict(gvr.GroupResource(), "queues.gpufrac.io", errors.New("modified"))}},
			patched: true, applied: true,
			actions: []string{"get", "patch json-patch", "get", "patch json-patch", "patch apply"}},
		{name: "the takeover is refused", established: true, fail: []failure{{verb: "patch", patchType: types.JSONPatchType, times: -1, err: unavailable}},
			err: "taking over the fields of helm/Update"},
		{name: "the apply after the takeover is refused", established: true, fail: []failure{{verb: "patch", patchType: types.ApplyPatchType, times: -1, err: unavailable}},
			err: "applying CustomResourceDefinition queues.gpufrac.io", patched: true},
		{name: "the CRD is never established", established: false,
			err: "waiting for CustomResourceDefinition queues.gpufrac.io to be established", patched: true, applied: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			client := dynamicfake.NewSimpleDynamicClient(runtime.NewScheme(), installedCRD(tc.established))
			tracker := client.Tracker()
			client.PrependReactor("patch", "customresourcedefinitions", applyReactor(client))
			for _, f := range tc.fail {
				left := f.times
				client.PrependReactor(f.verb, "customresourcedefinitions", func(a clienttesting.Action) (bool, runtime.Object, error) {
					if p, ok := a.(clienttesting.PatchAction); ok && p.GetPatchType() != f.patchType {
						return false, nil, nil
					}
					if left == 0 {
						return false, nil, nil
					}
					left--
					return true, nil, f.err
				})
			}
			got, err := crdapply.Apply(t.Context(), client, crds, crdapply.Options{Timeout: 300 * time.Millisecond})
			if tc.actions != nil {
				var calls []string
				for _, a := range client.Actions() {
					c := a.GetVerb()
					if p, ok := a.(clienttesting.PatchAction); ok {
						c += " " + map[types.PatchType]string{types.JSONPatchType: "json-patch", types.ApplyPatchType: "apply"}[p.GetPatchType()]
					}
					calls = append(calls, c)
				}
				if len(calls) > len(tc.actions) {
					calls = calls[:len(tc.actions)]
				}
				if diff := cmp.Diff(tc.actions, calls); diff != "" {
					t.Errorf("calls (-want +got):\n%s", diff)
				}
			}
			if tc.err == "" && err != nil {
				t.Fatalf("Apply: %v", err)
			}
			if tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("Apply: error %v, want one saying %q", err, tc.err)
			}
			if want := map[bool]crdapply.Result{true: crdapply.Applied}[tc.err == ""]; got["queues.gpufrac.io"] != want {
				t.Errorf("result %q, want %q", got["queues.gpufrac.io"], want)
			}
			obj, err := tracker.Get(gvr, "", "queues.gpufrac.io")
			if err != nil {
				t.Fatal(err)
			}
			crd := obj.(*unstructured.Unstructured)
			scope, _, _ := unstructured.NestedString(crd.Object, "spec", "scope")
			if want := map[bool]string{true: "Cluster", false: "Namespaced"}[tc.applied]; scope != want {
				t.Errorf("spec.scope %q, want %q: the spec is changed only by the apply", scope, want)
			}
			managers := map[string]metav1.ManagedFieldsOperationType{}
			for _, m := range crd.GetManagedFields() {
				managers[m.Manager] = m.Operation
			}
			wantManagers := map[string]metav1.ManagedFieldsOperationType{"helm": metav1.ManagedFieldsOperationUpdate}
			if tc.patched {
				wantManagers = map[string]metav1.ManagedFieldsOperationType{crdapply.FieldManager: metav1.ManagedFieldsOperationApply}
			}
			if diff := cmp.Diff(wantManagers, managers); diff != "" {
				t.Errorf("field managers (-want +got):\n%s", diff)
			}
			if tc.err == "" {
				return
			}
			// The Job's next try, against a healthy API server.
			crd.Object["status"] = map[string]any{"conditions": []any{map[string]any{"type": "Established", "status": "True"}}}
			if err := tracker.Update(gvr, crd, ""); err != nil {
				t.Fatal(err)
			}
			retry := dynamicfake.NewSimpleDynamicClient(runtime.NewScheme(), crd)
			retry.PrependReactor("patch", "customresourcedefinitions", applyReactor(retry))
			if got, err := crdapply.Apply(t.Context(), retry, crds, crdapply.Options{Timeout: time.Second}); err != nil || got["queues.gpufrac.io"] != crdapply.Applied {
				t.Fatalf("the next try: %v, %v", got, err)
			}
			obj, _ = retry.Tracker().Get(gvr, "", "queues.gpufrac.io")
			if scope, _, _ := unstructured.NestedString(obj.(*unstructured.Unstructured).Object, "spec", "scope"); scope != "Cluster" {
				t.Errorf("after the next try spec.scope is %q", scope)
			}
			for _, m := range obj.(*unstructured.Unstructured).GetManagedFields() {
				if m.Manager == "helm" {
					t.Errorf("after the next try helm still owns fields")
				}
			}
		})
	}
}

// TestApplyRefusesADowngrade: a CRD a newer chart version applied is not
// replaced by an older chart's (its schema would drop the newer fields of
// every Queue) unless the admin allows it; every other case applies and
// records the version applied.
func TestApplyRefusesADowngrade(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "q.yaml"), []byte(queueCRD), 0o644); err != nil {
		t.Fatal(err)
	}
	crds, err := crdapply.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		live    string // the live CRD's version annotation ("" none)
		opts    crdapply.Options
		refused bool
		want    string // the annotation after
	}{
		{name: "downgrade refused", live: "0.3.0", opts: crdapply.Options{Version: "0.2.0"}, refused: true, want: "0.3.0"},
		{name: "downgrade allowed", live: "0.3.0", opts: crdapply.Options{Version: "0.2.0", AllowDowngrade: true}, want: "0.2.0"},
		{name: "upgrade", live: "0.2.0", opts: crdapply.Options{Version: "0.3.0"}, want: "0.3.0"},
		{name: "same version", live: "0.3.0", opts: crdapply.Options{Version: "0.3.0"}, want: "0.3.0"},
		{name: "pre-release below its release", live: "0.3.0", opts: crdapply.Options{Version: "0.3.0-rc.1"}, refused: true, want: "0.3.0"},
		{name: "installed by crds/, no version yet", opts: crdapply.Options{Version: "0.2.0"}, want: "0.2.0"},
		{name: "an admin's value", live: "custom", opts: crdapply.Options{Version: "0.2.0"}, want: "0.2.0"},
		{name: "no version given", live: "0.3.0", want: "0.3.0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			crd := installedCRD(true)
			if tc.live != "" {
				crd.SetAnnotations(map[string]string{crdapply.VersionAnnotation: tc.live})
			}
			client := dynamicfake.NewSimpleDynamicClient(runtime.NewScheme(), crd)
			client.PrependReactor("patch", "customresourcedefinitions", applyReactor(client))
			tc.opts.Timeout = time.Second
			got, err := crdapply.Apply(t.Context(), client, crds, tc.opts)
			if tc.refused != (err != nil) || tc.refused && !strings.Contains(err.Error(), "crds.allowDowngrade") {
				t.Fatalf("Apply = %v, %v; want refused %v, naming crds.allowDowngrade", got, err, tc.refused)
			}
			if tc.refused {
				for _, a := range client.Actions() {
					if a.GetVerb() != "get" {
						t.Errorf("a refused downgrade did %s", a.GetVerb())
					}
				}
			}
			after, err := client.Resource(crdapply.Resource).Get(t.Context(), "queues.gpufrac.io", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if v := after.GetAnnotations()[crdapply.VersionAnnotation]; v != tc.want {
				t.Errorf("%s=%q after, want %q", crdapply.VersionAnnotation, v, tc.want)
			}
		})
	}
}
