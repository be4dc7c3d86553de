package v1alpha1_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/tests/cluster"
)

var crdPath = filepath.Join("..", "..", "deployments", "helm", "gpufrac", "crds", "gpufrac.io_queues.yaml")

// readObjects decodes every YAML document of a file.
func readObjects(t *testing.T, path string) []*unstructured.Unstructured {
	t.Helper()
	objs, err := cluster.ReadObjects(path)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func decodeObjects(t *testing.T, data []byte) []*unstructured.Unstructured {
	t.Helper()
	objs, err := cluster.DecodeObjects("test YAML", data)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// crdSchema returns the openAPIV3Schema of the CRD's only version.
func crdSchema(t *testing.T) map[string]any {
	t.Helper()
	data, err := os.ReadFile(crdPath)
	if err != nil {
		t.Fatalf("reading CRD: %v", err)
	}
	var crd map[string]any
	// sigs.k8s.io/yaml resolves the file's anchors and aliases like kubectl does.
	if err := yaml.Unmarshal(data, &crd); err != nil {
		t.Fatalf("parsing CRD: %v", err)
	}
	versions, _, _ := unstructured.NestedSlice(crd, "spec", "versions")
	if len(versions) != 1 {
		t.Fatalf("CRD has %d versions, want 1", len(versions))
	}
	schema, ok, _ := unstructured.NestedMap(versions[0].(map[string]any), "schema", "openAPIV3Schema")
	if !ok {
		t.Fatal("CRD has no openAPIV3Schema")
	}
	return schema
}

var (
	quantityType  = reflect.TypeFor[resource.Quantity]()
	timeType      = reflect.TypeFor[metav1.Time]()
	resourceList  = reflect.TypeFor[corev1.ResourceList]()
	typeMetaType  = reflect.TypeFor[metav1.TypeMeta]()
	objectMetaTyp = reflect.TypeFor[metav1.ObjectMeta]()
)

// schemaMismatches walks a Go type and its schema side by side and lists
// every difference: fields present on one side only, and types that differ.
func schemaMismatches(path string, typ reflect.Type, schema map[string]any) []string {
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	var out []string
	want := func(key string, value any) {
		if got := schema[key]; got != value {
			out = append(out, fmt.Sprintf("%s: %s is %v, want %v", path, key, got, value))
		}
	}
	switch {
	case typ == quantityType:
		want("x-kubernetes-int-or-string", true)
		if _, ok := schema["pattern"]; !ok {
			out = append(out, path+": quantity without a pattern")
		}
	case typ == timeType:
		want("type", "string")
		want("format", "date-time")
	case typ == resourceList:
		want("type", "object")
		items, _ := schema["additionalProperties"].(map[string]any)
		out = append(out, schemaMismatches(path+"[*]", quantityType, items)...)
	case typ.Kind() == reflect.Struct:
		want("type", "object")
		props, _ := schema["properties"].(map[string]any)
		fields := map[string]reflect.Type{}
		for i := range typ.NumField() {
			f := typ.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if f.Type == typeMetaType {
				fields["apiVersion"], fields["kind"] = reflect.TypeFor[string](), reflect.TypeFor[string]()
				continue
			}
			fields[name] = f.Type
		}
		var names []string
		for name := range fields {
			names = append(names, name)
		}
		for name := range props {
			if _, ok := fields[name]; !ok {
				names = append(names, name)
			}
		}
		sort.Strings(names)
		for _, name := range names {
			ft, inType := fields[name]
			sub, inSchema := props[name].(map[string]any)
			switch {
			case !inType:
				out = append(out, fmt.Sprintf("%s.%s: in the schema, not in the Go type", path, name))
			case !inSchema:
				out = append(out, fmt.Sprintf("%s.%s: in the Go type, not in the schema", path, name))
			case ft == objectMetaTyp:
				// The API server owns metadata's schema.
			default:
				out = append(out, schemaMismatches(path+"."+name, ft, sub)...)
			}
		}
	case typ.Kind() == reflect.Slice:
		want("type", "array")
		items, _ := schema["items"].(map[string]any)
		out = append(out, schemaMismatches(path+"[]", typ.Elem(), items)...)
	case typ.Kind() == reflect.String:
		want("type", "string")
	case typ.Kind() == reflect.Int32:
		want("type", "integer")
		want("format", "int32")
	case typ.Kind() == reflect.Int64:
		want("type", "integer")
		want("format", "int64")
	default:
		out = append(out, fmt.Sprintf("%s: no rule for Go kind %s", path, typ.Kind()))
	}
	return out
}

func TestCRDSchemaMatchesTypes(t *testing.T) {
	got := schemaMismatches("queue", reflect.TypeFor[v1alpha1.Queue](), crdSchema(t))
	if diff := cmp.Diff([]string(nil), got); diff != "" {
		t.Errorf("schema vs Go types (-want +got):\n%s", diff)
	}
}

// TestCRDAgainstAPIServer installs the CRD on a real kube-apiserver (the local
// test bed from tests/cluster) and checks its validation, defaults, status
// subresource and the example queues.
func TestCRDAgainstAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a local control plane")
	}
	// Bare: the harness would install the CRD itself.
	c := cluster.StartForTest(t, cluster.Options{Bare: true})
	ctx := t.Context()
	crds := c.Dynamic.Resource(cluster.CRDResource())
	for _, obj := range readObjects(t, crdPath) {
		if _, err := crds.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating CRD: %v", err)
		}
	}
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		crd, err := crds.Get(ctx, "queues.gpufrac.io", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return cluster.ConditionTrue(crd, "Established"), nil
	})
	if err != nil {
		t.Fatalf("waiting for the CRD to be established: %v", err)
	}
	queues := c.Dynamic.Resource(v1alpha1.QueueGVR())

	t.Run("examples", func(t *testing.T) {
		for _, obj := range readObjects(t, filepath.Join("..", "..", "deployments", "examples", "queues.yaml")) {
			created, err := queues.Create(ctx, obj, metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("creating example queue %s: %v", obj.GetName(), err)
			}
			q, err := v1alpha1.FromUnstructured(created)
			if err != nil {
				t.Fatalf("converting %s: %v", obj.GetName(), err)
			}
			// The API server defaults an absent overQuotaWeight to 1.
			if q.Name == "org" {
				if w := q.Spec.Resources.CPU.OverQuotaWeight; w == nil || *w != 1 {
					t.Errorf("org cpu overQuotaWeight = %v, want the default 1", w)
				}
			}
		}
	})

	validation := []struct {
		name    string
		yaml    string
		wantErr string // empty: accepted
	}{
		{name: "fractional GPUs", yaml: `{metadata: {name: frac}, spec: {resources: {gpu: {quota: "2.5", limit: 3}}}}`},
		{name: "integer quantities", yaml: `{metadata: {name: ints}, spec: {resources: {cpu: {quota: 16, limit: 32}}}}`},
		{name: "negative quota string", yaml: `{metadata: {name: neg}, spec: {resources: {gpu: {quota: "-1"}}}}`, wantErr: "spec.resources.gpu.quota"},
		{name: "negative quota integer", yaml: `{metadata: {name: negint}, spec: {resources: {gpu: {quota: -1}}}}`, wantErr: "spec.resources.gpu.quota"},
		{name: "not a quantity", yaml: `{metadata: {name: nq}, spec: {resources: {memory: {quota: "lots"}}}}`, wantErr: "spec.resources.memory.quota"},
		{name: "negative weight", yaml: `{metadata: {name: negw}, spec: {resources: {gpu: {quota: "1", overQuotaWeight: -1}}}}`, wantErr: "spec.resources.gpu.overQuotaWeight"},
		{name: "limit below quota", yaml: `{metadata: {name: lbq}, spec: {resources: {gpu: {quota: "4", limit: "2500m"}}}}`, wantErr: "limit must not be below quota"},
		{name: "own parent", yaml: `{metadata: {name: selfish}, spec: {parent: selfish}}`, wantErr: "a queue cannot be its own parent"},
		{name: "bad parent name", yaml: `{metadata: {name: badp}, spec: {parent: "Team_A"}}`, wantErr: "spec.parent"},
		{name: "unknown resource dropped", yaml: `{metadata: {name: unk}, spec: {resources: {tpu: {quota: "1"}}}}`},
		{name: "namespaces and every namespace", yaml: `{metadata: {name: nss}, spec: {namespaces: [team-a, "*"]}}`},
		{name: "namespace that is no name", yaml: `{metadata: {name: nsbad}, spec: {namespaces: [Team_A]}}`, wantErr: `must be a namespace name or "*"`},
		{name: "namespace listed twice", yaml: `{metadata: {name: nsdup}, spec: {namespaces: [a, a]}}`, wantErr: "spec.namespaces[1]"},
	}
	for _, tc := range validation {
		t.Run(tc.name, func(t *testing.T) {
			objs := decodeObjects(t, []byte(tc.yaml))
			obj := objs[0]
			obj.SetAPIVersion(v1alpha1.APIVersion)
			obj.SetKind(v1alpha1.QueueKind)
			_, err := queues.Create(ctx, obj, metav1.CreateOptions{})
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("create rejected: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("create error = %v, want one containing %q", err, tc.wantErr)
			case err != nil:
				t.Logf("rejected as expected: %v", err)
			}
		})
	}

	t.Run("status subresource", func(t *testing.T) {
		u, err := queues.Get(ctx, "team-a", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("getting team-a: %v", err)
		}
		q, err := v1alpha1.FromUnstructured(u)
		if err != nil {
			t.Fatalf("converting: %v", err)
		}
		q.Status = v1alpha1.QueueStatus{
			Allocated:    corev1.ResourceList{v1alpha1.ResourceGPU: resource.MustParse("3.5")},
			PendingGangs: 2,
			Conditions: []metav1.Condition{{
				Type: "Valid", Status: metav1.ConditionTrue, Reason: "Valid", Message: "leaf queue",
				LastTransitionTime: metav1.Unix(1700000000, 0),
			}},
		}
		q.Spec.Priority = 99 // ignored by the status subresource
		u, err = v1alpha1.ToUnstructured(q)
		if err != nil {
			t.Fatalf("ToUnstructured: %v", err)
		}
		updated, err := queues.UpdateStatus(ctx, u, metav1.UpdateOptions{})
		if err != nil {
			t.Fatalf("UpdateStatus: %v", err)
		}
		got, err := v1alpha1.FromUnstructured(updated)
		if err != nil {
			t.Fatalf("converting: %v", err)
		}
		if diff := cmp.Diff(q.Status, got.Status, quantityEqual); diff != "" {
			t.Errorf("status (-want +got):\n%s", diff)
		}
		if got.Spec.Priority != 10 {
			t.Errorf("spec.priority = %d after a status update, want it unchanged (10)", got.Spec.Priority)
		}
	})

	t.Run("printer columns", func(t *testing.T) {
		raw, err := c.Client.CoreV1().RESTClient().Get().
			AbsPath("/apis", v1alpha1.Group, v1alpha1.Version, v1alpha1.QueueResource, "team-a").
			SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").
			DoRaw(ctx)
		if err != nil {
			t.Fatalf("getting team-a as a table: %v", err)
		}
		var table metav1.Table
		if err := json.Unmarshal(raw, &table); err != nil {
			t.Fatalf("decoding table: %v", err)
		}
		var cols []string
		for _, c := range table.ColumnDefinitions {
			cols = append(cols, c.Name)
		}
		wantCols := []string{"Name", "Parent", "GPU Quota", "GPU Limit", "GPU Allocated", "Pending", "Priority", "Namespaces", "Age"}
		if diff := cmp.Diff(wantCols, cols); diff != "" {
			t.Errorf("columns (-want +got):\n%s", diff)
		}
		if len(table.Rows) != 1 {
			t.Fatalf("table has %d rows, want 1", len(table.Rows))
		}
		// JSON numbers decode as float64; Age is relative, so leave it out.
		// Spec quantities print as the user wrote them; status quantities in
		// the canonical form resource.Quantity marshals to (3.5 -> "3500m").
		got := table.Rows[0].Cells[:len(wantCols)-1]
		want := []any{"team-a", "org", "8", "10", "3500m", float64(2), float64(10), `["default"]`}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("team-a row (-want +got):\n%s", diff)
		}
	})
}
