package binder

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/gpufrac/gpufrac/api"
)

// TestBindIsOneRequest checks that a binding is one pods/binding create that
// carries the annotations (the API server copies them onto the pod), never
// a separate patch before it.
func TestBindIsOneRequest(t *testing.T) {
	tests := []struct {
		name        string
		annotations map[string]string
	}{
		{name: "whole GPU, no annotations"},
		{name: "fraction with its GPU", annotations: map[string]string{api.AnnotationGPU: "GPU-1"}},
		{name: "non-preemptible fraction", annotations: map[string]string{api.AnnotationGPU: "GPU-2", api.AnnotationDoNotDisrupt: "true"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "uid-1"}}
			client := fake.NewSimpleClientset(pod)
			client.ClearActions()
			if err := New(client, nil).Bind(t.Context(), pod, "node-1", tt.annotations); err != nil {
				t.Fatal(err)
			}
			type call struct {
				Verb, Subresource, Node string
				UID                     string
				Annotations             map[string]string
			}
			var got []call
			for _, a := range client.Actions() {
				c := call{Verb: a.GetVerb(), Subresource: a.GetSubresource()}
				if ca, ok := a.(clienttesting.CreateAction); ok {
					if b, ok := ca.GetObject().(*corev1.Binding); ok {
						c.Node, c.UID, c.Annotations = b.Target.Name, string(b.UID), b.Annotations
					}
				}
				got = append(got, c)
			}
			want := []call{{Verb: "create", Subresource: "binding", Node: "node-1", UID: "uid-1", Annotations: tt.annotations}}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("API calls (-want +got):\n%s", diff)
			}
		})
	}
}
