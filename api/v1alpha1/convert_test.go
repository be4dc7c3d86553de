package v1alpha1_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/api/v1alpha1"
)

// quantityEqual compares quantities by value, not by their cached string form.
var quantityEqual = cmp.Comparer(func(a, b resource.Quantity) bool { return a.Cmp(b) == 0 })

func qty(s string) *resource.Quantity {
	q := resource.MustParse(s)
	return &q
}

func fullQueue() *v1alpha1.Queue {
	return &v1alpha1.Queue{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.QueueKind},
		ObjectMeta: metav1.ObjectMeta{Name: "team-a", Labels: map[string]string{"team": "a"}},
		Spec: v1alpha1.QueueSpec{
			Parent:     "org",
			Priority:   10,
			Namespaces: []string{"team-a", "team-a-batch"},
			Resources: v1alpha1.QueueResources{
				GPU:    &v1alpha1.ResourceQuota{Quota: qty("2.5"), Limit: qty("4"), OverQuotaWeight: ptr.To[int32](2)},
				CPU:    &v1alpha1.ResourceQuota{Quota: qty("500m")},
				Memory: &v1alpha1.ResourceQuota{Limit: qty("64Gi"), OverQuotaWeight: ptr.To[int32](0)},
			},
		},
		Status: v1alpha1.QueueStatus{
			Allocated:               corev1.ResourceList{v1alpha1.ResourceGPU: resource.MustParse("1.5")},
			AllocatedNonPreemptible: corev1.ResourceList{v1alpha1.ResourceGPU: resource.MustParse("1")},
			Requested:               corev1.ResourceList{v1alpha1.ResourceCPU: resource.MustParse("3")},
			PendingGangs:            2,
			Conditions: []metav1.Condition{{
				Type: "Valid", Status: metav1.ConditionTrue, Reason: "Valid", Message: "ok",
				LastTransitionTime: metav1.Unix(1700000000, 0),
			}},
		},
	}
}

func TestUnstructuredRoundTrip(t *testing.T) {
	tests := []struct {
		name  string
		queue *v1alpha1.Queue
	}{
		{name: "every field set", queue: fullQueue()},
		{name: "empty spec", queue: &v1alpha1.Queue{
			TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.QueueKind},
			ObjectMeta: metav1.ObjectMeta{Name: "root"},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			u, err := v1alpha1.ToUnstructured(tc.queue)
			if err != nil {
				t.Fatalf("ToUnstructured: %v", err)
			}
			got, err := v1alpha1.FromUnstructured(u)
			if err != nil {
				t.Fatalf("FromUnstructured: %v", err)
			}
			if diff := cmp.Diff(tc.queue, got, quantityEqual); diff != "" {
				t.Errorf("round trip (-want +got):\n%s", diff)
			}
		})
	}
}

func TestToUnstructuredSetsTypeMeta(t *testing.T) {
	q := &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: "q"}}
	u, err := v1alpha1.ToUnstructured(q)
	if err != nil {
		t.Fatalf("ToUnstructured: %v", err)
	}
	if diff := cmp.Diff(v1alpha1.QueueGVK(), u.GroupVersionKind()); diff != "" {
		t.Errorf("GVK (-want +got):\n%s", diff)
	}
	if q.APIVersion != "" || q.Kind != "" {
		t.Errorf("ToUnstructured changed its argument: %+v", q.TypeMeta)
	}
}

func TestFromUnstructuredErrors(t *testing.T) {
	tests := []struct {
		name    string
		obj     *unstructured.Unstructured
		wantErr string
	}{
		{name: "nil", obj: nil, wantErr: "nil object"},
		{
			name: "wrong kind",
			obj: &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "v1", "kind": "Pod", "metadata": map[string]any{"name": "p"},
			}},
			wantErr: `converting queue "p": object is /v1, Kind=Pod`,
		},
		{
			name: "quantity that does not parse",
			obj: &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": v1alpha1.APIVersion, "kind": v1alpha1.QueueKind,
				"metadata": map[string]any{"name": "q"},
				"spec": map[string]any{"resources": map[string]any{
					"gpu": map[string]any{"quota": "four"},
				}},
			}},
			wantErr: `converting queue "q"`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := v1alpha1.FromUnstructured(tc.obj)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("FromUnstructured error = %v, want it to contain %q", err, tc.wantErr)
			}
		})
	}
}

func TestDeepCopyIsIndependent(t *testing.T) {
	orig := fullQueue()
	cp := orig.DeepCopy()
	if diff := cmp.Diff(orig, cp, quantityEqual); diff != "" {
		t.Fatalf("DeepCopy differs (-orig +copy):\n%s", diff)
	}
	// Change every reference-typed field of the copy; the original must not move.
	cp.Labels["team"] = "b"
	cp.Spec.Namespaces[0] = "team-b"
	cp.Spec.Resources.GPU.Quota.Add(resource.MustParse("1"))
	*cp.Spec.Resources.GPU.OverQuotaWeight = 7
	cp.Spec.Resources.CPU.Quota = nil
	cp.Status.Allocated[v1alpha1.ResourceGPU] = resource.MustParse("9")
	cp.Status.AllocatedNonPreemptible[v1alpha1.ResourceCPU] = resource.MustParse("9")
	cp.Status.Requested[v1alpha1.ResourceCPU] = resource.MustParse("9")
	cp.Status.Conditions[0].Reason = "Changed"
	if diff := cmp.Diff(fullQueue(), orig, quantityEqual); diff != "" {
		t.Errorf("changing the copy changed the original (-want +got):\n%s", diff)
	}
	if got := (*v1alpha1.Queue)(nil).DeepCopy(); got != nil {
		t.Errorf("nil DeepCopy = %v, want nil", got)
	}
}

func TestExampleQueuesConvert(t *testing.T) {
	objs := readObjects(t, filepath.Join("..", "..", "deployments", "examples", "queues.yaml"))
	got := map[string]v1alpha1.QueueSpec{}
	for _, u := range objs {
		q, err := v1alpha1.FromUnstructured(u)
		if err != nil {
			t.Fatalf("FromUnstructured: %v", err)
		}
		got[q.Name] = q.Spec
	}
	team := func(quota, limit string, weight int32) v1alpha1.QueueSpec {
		return v1alpha1.QueueSpec{Parent: "org", Namespaces: []string{"default"}, Resources: v1alpha1.QueueResources{
			GPU:    &v1alpha1.ResourceQuota{Quota: qty(quota), Limit: qty(limit), OverQuotaWeight: ptr.To(weight)},
			CPU:    &v1alpha1.ResourceQuota{Quota: qty("128")},
			Memory: &v1alpha1.ResourceQuota{Quota: qty("1Ti")},
		}}
	}
	teamA := team("8", "10", 2)
	teamA.Priority = 10
	want := map[string]v1alpha1.QueueSpec{
		"org": {Resources: v1alpha1.QueueResources{
			GPU:    &v1alpha1.ResourceQuota{Quota: qty("12"), Limit: qty("16")},
			CPU:    &v1alpha1.ResourceQuota{Quota: qty("256")},
			Memory: &v1alpha1.ResourceQuota{Quota: qty("2Ti")},
		}},
		"team-a": teamA,
		"team-b": team("4", "8", 1),
	}
	if diff := cmp.Diff(want, got, quantityEqual); diff != "" {
		t.Errorf("example queues (-want +got):\n%s", diff)
	}
}

func TestAllowsNamespace(t *testing.T) {
	tests := []struct {
		name       string
		namespaces []string
		ns         string
		want       bool
	}{
		{name: "absent: nobody", ns: "default", want: false},
		{name: "empty: nobody", namespaces: []string{}, ns: "default", want: false},
		{name: "listed", namespaces: []string{"a", "b"}, ns: "b", want: true},
		{name: "not listed", namespaces: []string{"a", "b"}, ns: "c", want: false},
		{name: "no prefix match", namespaces: []string{"team"}, ns: "team-a", want: false},
		{name: "every namespace", namespaces: []string{v1alpha1.AllNamespaces}, ns: "anything", want: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := v1alpha1.QueueSpec{Namespaces: tc.namespaces}
			if got := s.AllowsNamespace(tc.ns); got != tc.want {
				t.Errorf("AllowsNamespace(%q) with %q = %v, want %v", tc.ns, tc.namespaces, got, tc.want)
			}
		})
	}
}

func TestGVR(t *testing.T) {
	gvr := v1alpha1.QueueGVR()
	if got, want := gvr.String(), "gpufrac.io/v1alpha1, Resource=queues"; got != want {
		t.Errorf("QueueGVR = %q, want %q", got, want)
	}
	if _, err := os.Stat(filepath.Join("..", "..", "deployments", "helm", "gpufrac", "crds", "gpufrac.io_"+gvr.Resource+".yaml")); err != nil {
		t.Errorf("CRD file for %s: %v", gvr, err)
	}
}
