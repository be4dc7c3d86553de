package scheduler

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/coordinator/binder"
	"github.com/gpufrac/gpufrac/coordinator/dra"
	"github.com/gpufrac/gpufrac/tests/builders"
)

// undoRecorder is a ClaimWriter that records what is undone.
type undoRecorder struct{ undone []string }

func (w *undoRecorder) Write(context.Context, *corev1.Pod, []dra.Planned) error { return nil }
func (w *undoRecorder) Undo(_ context.Context, pod *corev1.Pod, _ []dra.Planned) {
	w.undone = append(w.undone, pod.Name)
}

// TestClaimsOfAPodThatMayBeBoundAreKept (issue 25, item 6): the binding
// fails with a timeout and reading the pod back fails too. The API server
// may have bound the pod; its claims were taken back all the same, so a
// bound pod could run without its devices while they went to another pod.
// They are kept while the outcome is unknown, and taken back only once a
// read shows the pod not bound.
func TestClaimsOfAPodThatMayBeBoundAreKept(t *testing.T) {
	timeout := apierrors.NewTimeoutError("request did not complete within the allowed duration", 0)
	tests := []struct {
		name      string
		readFails bool // every read of the pod back fails
		wantUndo  bool
	}{
		{name: "outcome unknown", readFails: true},
		{name: "known not bound", wantUndo: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := fracPod("p", "q", 30)
			client := fake.NewClientset(pod)
			client.PrependReactor("create", "pods", func(a clienttesting.Action) (bool, runtime.Object, error) {
				if a.GetSubresource() == "binding" {
					return true, nil, timeout
				}
				return false, nil, nil
			})
			if tt.readFails {
				client.PrependReactor("get", "pods", func(clienttesting.Action) (bool, runtime.Object, error) {
					return true, nil, apierrors.NewServiceUnavailable("etcd leader changed")
				})
			}
			c := newCluster(t, "binpack", []*corev1.Node{h100Node("n1", "a", 1)}, []*v1alpha1.Queue{queueOf("q", "8")}, pod)
			w := &undoRecorder{}
			c.s.deps.Binder = binder.New(client, nil)
			c.s.deps.DRA = &DRADeps{Writer: w}
			claim := builders.MakeClaim("p-gpu", "default").Shares(30).Obj()
			plans := []dra.Planned{{Claim: claim, Allocation: &resourceapi.AllocationResult{}}}

			if err := c.s.runBind(t.Context(), bindTask{pod: pod, node: "n1", claims: plans}); err == nil {
				t.Fatal("runBind succeeded, want the binding's error")
			}
			if got := len(w.undone) > 0; got != tt.wantUndo {
				t.Errorf("claims undone %v, want %v", got, tt.wantUndo)
			}
		})
	}
}
