package scheduler

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpufrac/gpufrac/api"
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

// TestPodWhoseBindingMayHaveLandedKeepsItsGPU (review of issue 25,
// finding 7): a binding answered with an error whose outcome is unknown
// (binder.ErrBindingUnknown) left the pod no longer assumed, so until the
// informer showed it bound its GPU share counted nowhere and the next cycle
// placed another pod into it. It stays assumed: the next cycle neither
// places another pod into its share nor binds it again; once the informer
// shows it bound it counts as bound, and if the informer still shows it
// unbound past bindUnknownHold it goes back to pending and is placed again.
func TestPodWhoseBindingMayHaveLandedKeepsItsGPU(t *testing.T) {
	unknown := fmt.Errorf("binding pod default/a to n1: timeout; %w: etcd leader changed", binder.ErrBindingUnknown)
	tests := []struct {
		name      string
		pod       func(name string) *corev1.Pod
		shownOnN1 bool // the informer shows a bound to n1 after the failure
	}{
		{name: "fraction, not bound", pod: func(n string) *corev1.Pod { return fracPod(n, "q", 60) }},
		{name: "whole GPU, not bound", pod: func(n string) *corev1.Pod { return gpuPod(n, "q", 1) }},
		{name: "fraction, bound after all", pod: func(n string) *corev1.Pod { return fracPod(n, "q", 60) }, shownOnN1: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			failed := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
			clk := clocktesting.NewFakeClock(failed)
			a := tt.pod("a")
			a.CreationTimestamp = metav1.NewTime(failed)
			c := newClockedCluster(t, clk, h100Node("n1", "a", 1), a)
			c.b.NextBindErr = unknown
			c.cycle()
			if c.b.BindCalls != 1 || c.boundTo("a") != "" {
				t.Fatalf("first cycle: %d bindings, a bound to %q; want one failed binding", c.b.BindCalls, c.boundTo("a"))
			}
			if tt.shownOnN1 {
				bound := admitted(tt.pod("a"), "n1")
				bound.Annotations[api.AnnotationGPU] = "GPU-n1-0"
				_ = c.pods.Update(bound)
				c.s.OnPod(bound)
			}

			// b asks what a may hold, and goes first (older): it must not be
			// placed there, and a is not bound again while its outcome is
			// unknown.
			b := tt.pod("b")
			b.CreationTimestamp = metav1.NewTime(clk.Now().Add(-time.Hour))
			_ = c.pods.Add(b)
			for _, step := range []time.Duration{time.Second, bindUnknownHold - 2*time.Second} {
				clk.Step(step)
				c.cycle()
				if c.boundTo("b") != "" || c.b.BindCalls != 1 {
					t.Fatalf("%v after the failure: b bound to %q, %d bindings; want b pending and a not bound again",
						clk.Since(failed), c.boundTo("b"), c.b.BindCalls)
				}
			}
			_ = c.pods.Delete(b)

			// Past the hold: a pod the informer still shows unbound is
			// placed again; a pod shown bound stays as it is.
			clk.Step(2 * time.Second)
			c.cycle()
			want, wantCalls := "n1", 2
			if tt.shownOnN1 {
				want, wantCalls = "", 1
			}
			if c.boundTo("a") != want || c.b.BindCalls != wantCalls {
				t.Errorf("past the hold: a bound to %q after %d bindings, want %q after %d", c.boundTo("a"), c.b.BindCalls, want, wantCalls)
			}
		})
	}
}

// newClockedCluster is newCluster with one queue q of 8 GPUs, node, pods and the scheduler on clk.
func newClockedCluster(t *testing.T, clk *clocktesting.FakeClock, node *corev1.Node, pods ...*corev1.Pod) *cluster {
	t.Helper()
	return newClusterWith(t, Options{Policy: "binpack", BindWorkers: 1},
		Deps{Queues: staticQueues{queueOf("q", "8")}, Clock: clk}, []*corev1.Node{node}, pods...)
}
