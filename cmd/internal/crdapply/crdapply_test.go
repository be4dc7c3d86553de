package crdapply_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/runtime"
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
	got, err := crdapply.Apply(t.Context(), client, crds, time.Second)
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
