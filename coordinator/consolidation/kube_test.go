package consolidation

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpufrac/gpufrac/api"
)

// apiNode is a node as the API server has it, with a foreign taint that
// the drain taint's writes must keep.
func apiNode() *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "big", UID: "uid-big", ResourceVersion: "7"},
		Spec:       corev1.NodeSpec{Taints: []corev1.Taint{{Key: "karpenter.sh/unregistered", Effect: corev1.TaintEffectNoExecute}}},
	}
}

// failing makes the clientset's verb on resource fail with the errors
// given, one per call, then succeed; it records the actions.
func failing(cs *fake.Clientset, verb, resource string, errs ...error) {
	cs.PrependReactor(verb, resource, func(k8stesting.Action) (bool, runtime.Object, error) {
		if len(errs) == 0 {
			return false, nil, nil
		}
		err := errs[0]
		errs = errs[1:]
		return true, nil, err
	})
}

func conflict() error {
	return apierrors.NewConflict(schema.GroupResource{Resource: "nodes"}, "big", errors.New("the object has been modified"))
}

// The drain taint is written with a patch (the chart grants patch on nodes,
// not update) that carries the node's resourceVersion, so a concurrent
// write makes it fail with Conflict and it is retried on a fresh read;
// other taints are kept.
func TestAPIWriterTaintPatchesUnderResourceVersion(t *testing.T) {
	tests := []struct {
		name    string
		errs    []error // the patches' answers, in order
		wantErr bool
		patches int
	}{
		{name: "first try", patches: 1},
		{name: "two conflicts, then through", errs: []error{conflict(), conflict()}, patches: 3},
		{name: "forbidden: no retry", errs: []error{apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, "big", errors.New("admission policy"))}, wantErr: true, patches: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cs := fake.NewClientset(apiNode())
			failing(cs, "patch", "nodes", tt.errs...)
			w := APIWriter{Client: cs}
			err := w.Taint(t.Context(), "big", 4102444800)
			if (err != nil) != tt.wantErr {
				t.Fatalf("Taint: %v, want error %v", err, tt.wantErr)
			}
			var patches []k8stesting.PatchAction
			for _, a := range cs.Actions() {
				if a.Matches("update", "nodes") {
					t.Errorf("an update of the node: %v (the chart grants patch only)", a)
				}
				if p, ok := a.(k8stesting.PatchAction); ok {
					patches = append(patches, p)
				}
			}
			if len(patches) != tt.patches {
				t.Fatalf("%d patches, want %d", len(patches), tt.patches)
			}
			var got taintPatch
			if err := json.Unmarshal(patches[0].GetPatch(), &got); err != nil || patches[0].GetPatchType() != types.MergePatchType {
				t.Fatalf("patch %s (%s): %v", patches[0].GetPatch(), patches[0].GetPatchType(), err)
			}
			want := taintPatch{Metadata: taintPatchMeta{ResourceVersion: "7"}, Spec: taintPatchSpec{Taints: []corev1.Taint{
				{Key: "karpenter.sh/unregistered", Effect: corev1.TaintEffectNoExecute},
				{Key: api.TaintDraining, Value: "4102444800", Effect: corev1.TaintEffectNoSchedule},
			}}}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("patch (-want +got):\n%s", diff)
			}
			if tt.wantErr {
				return
			}
			n, err := cs.CoreV1().Nodes().Get(t.Context(), "big", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want.Spec.Taints, n.Spec.Taints); diff != "" {
				t.Errorf("taints (-want +got):\n%s", diff)
			}
		})
	}
}

// Untaint removes the drain taint alone, retrying on conflict.
func TestAPIWriterUntaint(t *testing.T) {
	n := apiNode()
	n.Spec.Taints = []corev1.Taint{{Key: api.TaintDraining, Value: "1", Effect: corev1.TaintEffectNoSchedule}}
	cs := fake.NewClientset(n)
	failing(cs, "patch", "nodes", conflict())
	if err := (APIWriter{Client: cs}).Untaint(t.Context(), "big"); err != nil {
		t.Fatal(err)
	}
	got, err := cs.CoreV1().Nodes().Get(t.Context(), "big", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Spec.Taints) != 0 {
		t.Errorf("taints %v, want none", got.Spec.Taints)
	}
	// A node that is gone: NotFound, which abandon takes as done.
	err = (APIWriter{Client: fake.NewClientset()}).Untaint(t.Context(), "big")
	if !apierrors.IsNotFound(err) {
		t.Errorf("Untaint of a missing node: %v, want NotFound", err)
	}
}

// DeleteNode sends the node's UID and resourceVersion as preconditions:
// a node replaced or changed since it was read is not deleted.
func TestAPIWriterDeleteNodePreconditions(t *testing.T) {
	cs := fake.NewClientset(apiNode())
	if err := (APIWriter{Client: cs}).DeleteNode(t.Context(), apiNode()); err != nil {
		t.Fatal(err)
	}
	var pre *metav1.Preconditions
	for _, a := range cs.Actions() {
		if d, ok := a.(k8stesting.DeleteAction); ok {
			pre = d.GetDeleteOptions().Preconditions
		}
	}
	uid, rv := types.UID("uid-big"), "7"
	if diff := cmp.Diff(&metav1.Preconditions{UID: &uid, ResourceVersion: &rv}, pre); diff != "" {
		t.Errorf("preconditions (-want +got):\n%s", diff)
	}
	cs = fake.NewClientset(apiNode())
	failing(cs, "delete", "nodes", conflict())
	if err := (APIWriter{Client: cs}).DeleteNode(t.Context(), apiNode()); !apierrors.IsConflict(err) {
		t.Errorf("DeleteNode on a conflict: %v, want the Conflict wrapped", err)
	}
}

// Reads that fail say so, wrapped (the controller tells NotFound apart).
func TestAPIWriterReadsFail(t *testing.T) {
	cs := fake.NewClientset()
	failing(cs, "list", "pods", apierrors.NewTimeoutError("etcdserver: request timed out", 1))
	w := APIWriter{Client: cs}
	if _, err := w.PodsOnNode(t.Context(), "big"); !apierrors.IsTimeout(err) {
		t.Errorf("PodsOnNode: %v, want the timeout wrapped", err)
	}
	if _, err := w.Node(t.Context(), "big"); !apierrors.IsNotFound(err) {
		t.Errorf("Node of a missing node: %v, want NotFound", err)
	}
	res := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "r", Namespace: "default"}}
	if err := w.DeleteReservation(t.Context(), res); err == nil {
		t.Error("DeleteReservation deleted a pod outside the reservation namespace")
	}
}
