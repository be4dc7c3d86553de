package queueview

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/tests/builders"
)

// TestLoadReadsNamespaceDefaultQueues: a pending pod without a queue label
// counts under its namespace's default queue when the namespace can be
// read (all namespaces, or only -n's); when reading it fails, the pod is
// not counted and a note says why.
func TestLoadReadsNamespaceDefaultQueues(t *testing.T) {
	for _, tc := range []struct {
		name      string
		ns        string
		forbid    bool
		wantCount int
	}{
		{name: "every namespace", wantCount: 1},
		{name: "-n team-a", ns: "team-a", wantCount: 1},
		{name: "namespaces forbidden", forbid: true},
		{name: "-n team-a, its namespace forbidden", ns: "team-a", forbid: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a", Labels: map[string]string{api.LabelDefaultQueue: "team"}}}
			pod := builders.MakePod("plain", "team-a").Fraction(10).PendingFor(api.ReasonOverQuota, "quota").Obj()
			kube := fake.NewClientset(ns, pod)
			if tc.forbid {
				kube.PrependReactor("*", "namespaces", func(a k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "namespaces"}, "", nil)
				})
			}
			q, err := v1alpha1.ToUnstructured(builders.MakeQueue("team").Obj())
			if err != nil {
				t.Fatal(err)
			}
			dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
				map[schema.GroupVersionResource]string{v1alpha1.QueueGVR(): v1alpha1.QueueListKind}, q)
			v, err := Load(t.Context(), kube, dyn, tc.ns)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			got := 0
			for _, r := range v.Queues {
				if r.Name == "team" {
					got = r.Pending[api.ReasonOverQuota]
				}
			}
			if got != tc.wantCount {
				t.Errorf("pending OverQuota under team: %d, want %d", got, tc.wantCount)
			}
			noted := strings.Contains(strings.Join(v.Notes, "\n"), "not counted under their namespace's default queue")
			if noted != tc.forbid {
				t.Errorf("notes %q: note about default queues %v, want %v", v.Notes, noted, tc.forbid)
			}
		})
	}
}
