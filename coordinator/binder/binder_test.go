package binder

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/tests/apitest"
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

// TestMarkPendingRefreshesAMessageAtMostEveryMessageRefresh: a pod keeping
// its reason gets a new message (a status patch) only once the last one is
// MessageRefresh old; a new reason is written at once.
func TestMarkPendingRefreshesAMessageAtMostEveryMessageRefresh(t *testing.T) {
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	said := func(reason, message string, ago time.Duration) []corev1.PodCondition {
		return []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: reason, Message: message,
			LastTransitionTime: metav1.NewTime(now.Add(-ago))}}
	}
	tests := []struct {
		name       string
		conditions []corev1.PodCondition
		wantWrites int
	}{
		{name: "nothing said yet", wantWrites: 1},
		{name: "same reason and message", conditions: said(ReasonGangIncomplete, "has 5 of 8", time.Hour)},
		{name: "same reason, new message, said 5s ago", conditions: said(ReasonGangIncomplete, "has 4 of 8", 5*time.Second)},
		{name: "same reason, new message, said 20s ago", conditions: said(ReasonGangIncomplete, "has 4 of 8", 20*time.Second), wantWrites: 1},
		{name: "new reason, said 1s ago", conditions: said(ReasonNoCapacity, "no room", time.Second), wantWrites: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}, Status: corev1.PodStatus{Conditions: tt.conditions}}
			client := fake.NewSimpleClientset(pod)
			client.ClearActions()
			b := New(client, nil)
			b.clock = testingclock.NewFakePassiveClock(now)
			if err := b.MarkPending(t.Context(), pod, ReasonGangIncomplete, "has 5 of 8"); err != nil {
				t.Fatal(err)
			}
			writes := 0
			for _, a := range client.Actions() {
				if a.GetVerb() == "patch" && a.GetSubresource() == "status" {
					writes++
				}
			}
			if writes != tt.wantWrites {
				t.Errorf("status patches = %d, want %d", writes, tt.wantWrites)
			}
		})
	}
}

// TestFailuresSurfaceAndRecordNothing: when the API refuses a binding, an
// eviction (a PodDisruptionBudget: 429) or a status patch, the caller gets
// the error (wrapped, still matchable) and no event claims it happened; the
// next call goes through.
func TestFailuresSurfaceAndRecordNothing(t *testing.T) {
	pdb := apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
	tests := []struct {
		name        string
		verb, res   string
		sub         string
		err         error
		call        func(ctx context.Context, b *Binder, p *corev1.Pod) error
		match       func(error) bool
		wantEventOK string // the event after the second, successful call ("" for none)
	}{
		{name: "bind", verb: "create", res: "pods", sub: "binding", err: apierrors.NewConflict(corev1.Resource("pods"), "p", errors.New("pod is being deleted")),
			call:  func(ctx context.Context, b *Binder, p *corev1.Pod) error { return b.Bind(ctx, p, "n1", nil) },
			match: apierrors.IsConflict},
		{name: "evict for reclaim", verb: "create", res: "pods", sub: "eviction", err: pdb,
			call: func(ctx context.Context, b *Binder, p *corev1.Pod) error {
				return b.Evict(ctx, p, "reclaimed by queue a")
			},
			match:       apierrors.IsTooManyRequests,
			wantEventOK: "Normal Reclaimed reclaimed by queue a"},
		{name: "release a gang member", verb: "create", res: "pods", sub: "eviction", err: pdb,
			call: func(ctx context.Context, b *Binder, p *corev1.Pod) error {
				return b.Release(ctx, p, "GangRollback", "gang g rolled back")
			},
			match:       apierrors.IsTooManyRequests,
			wantEventOK: "Warning GangRollback gang g rolled back"},
		{name: "mark pending", verb: "patch", res: "pods", sub: "status", err: apierrors.NewServiceUnavailable("etcd"),
			call: func(ctx context.Context, b *Binder, p *corev1.Pod) error {
				return b.MarkPending(ctx, p, ReasonNoCapacity, "no room")
			},
			match:       apierrors.IsServiceUnavailable,
			wantEventOK: "Warning NoCapacity no room"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "uid-1"}}
			client := fake.NewSimpleClientset(pod)
			inj := apitest.FailOnce(&client.Fake, tt.verb, tt.res, tt.sub, tt.err)
			rec := record.NewFakeRecorder(4)
			b := New(client, rec)
			err := tt.call(t.Context(), b, pod)
			if err == nil || !tt.match(err) || inj.Fired() != 1 {
				t.Fatalf("first call: err = %v (fired %d), want the injected error, wrapped", err, inj.Fired())
			}
			if len(rec.Events) != 0 {
				t.Fatalf("an event was recorded for a call that failed: %q", <-rec.Events)
			}
			if err := tt.call(t.Context(), b, pod); err != nil {
				t.Fatalf("second call: %v", err)
			}
			var got string
			if len(rec.Events) > 0 {
				got = <-rec.Events
			}
			if got != tt.wantEventOK {
				t.Errorf("event after success = %q, want %q", got, tt.wantEventOK)
			}
		})
	}
}

// TestEvictionIsPreconditionedOnTheUID: a pod deleted and made again under
// the same name is not evicted in place of the one meant.
func TestEvictionIsPreconditionedOnTheUID(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "uid-1"}}
	client := fake.NewSimpleClientset(pod)
	client.ClearActions()
	if err := New(client, nil).Release(t.Context(), pod, "GangRollback", "why"); err != nil {
		t.Fatal(err)
	}
	var uid string
	for _, a := range client.Actions() {
		if ca, ok := a.(clienttesting.CreateAction); ok {
			if ev, ok := ca.GetObject().(*policyv1.Eviction); ok && ev.DeleteOptions != nil && ev.DeleteOptions.Preconditions != nil && ev.DeleteOptions.Preconditions.UID != nil {
				uid = string(*ev.DeleteOptions.Preconditions.UID)
			}
		}
	}
	if uid != "uid-1" {
		t.Errorf("eviction precondition UID = %q, want uid-1", uid)
	}
}

// TestBindWhoseAnswerWasLost: the API server applied a binding but the
// coordinator got an error (a timeout, a reset connection), or a retry of
// such a binding meets "already assigned". Reported as failed, the pod
// would go back to pending while it holds its GPU, and the next cycle could
// give that GPU to another pod before the informer shows the binding. Bind
// asks the API server what happened: bound as asked is success; not bound,
// or bound elsewhere, or another pod of that name, is the error.
func TestBindWhoseAnswerWasLost(t *testing.T) {
	timeout := apierrors.NewTimeoutError("request did not complete within the allowed duration", 0)
	tests := []struct {
		name    string
		applied string // the node the lost binding went to ("" when it was not applied)
		uid     string // the UID of the pod of that name now
		want    bool   // Bind succeeds
	}{
		{name: "applied, answer lost", applied: "node-1", uid: "uid-1", want: true},
		{name: "not applied", uid: "uid-1"},
		{name: "bound elsewhere meanwhile", applied: "node-2", uid: "uid-1"},
		{name: "another pod of that name", applied: "node-1", uid: "uid-2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "uid-1"}}
			now := pod.DeepCopy()
			now.UID = types.UID(tt.uid)
			client := fake.NewSimpleClientset(now)
			client.PrependReactor("create", "pods", func(a clienttesting.Action) (bool, runtime.Object, error) {
				if a.GetSubresource() != "binding" {
					return false, nil, nil
				}
				if tt.applied != "" {
					p := now.DeepCopy()
					p.Spec.NodeName = tt.applied
					if err := client.Tracker().Update(corev1.SchemeGroupVersion.WithResource("pods"), p, p.Namespace); err != nil {
						t.Fatal(err)
					}
				}
				return true, nil, timeout
			})
			err := New(client, nil).Bind(t.Context(), pod, "node-1", nil)
			if got := err == nil; got != tt.want {
				t.Errorf("Bind = %v, want success %v", err, tt.want)
			}
			if err != nil && !apierrors.IsTimeout(err) {
				t.Errorf("Bind = %v, want the binding's own error wrapped", err)
			}
		})
	}
}

// TestBindWhoseOutcomeIsUnknown (issue 25, item 6): a binding answered
// with an error whose pod cannot be read back either may have been
// applied. Reported as a plain failure, the caller took back the claims of
// a pod the API server may have bound. Reads are retried with the confirm
// back-off; while none succeeds the outcome is ErrBindingUnknown, distinct
// from "not bound".
func TestBindWhoseOutcomeIsUnknown(t *testing.T) {
	timeout := apierrors.NewTimeoutError("request did not complete within the allowed duration", 0)
	unavailable := apierrors.NewServiceUnavailable("etcd leader changed")
	tests := []struct {
		name        string
		applied     bool // the lost binding was applied
		failedReads int  // reads of the pod that fail before one succeeds
		gone        bool // the pod is deleted meanwhile
		wantOK      bool // Bind succeeds
		wantUnknown bool // Bind fails with ErrBindingUnknown
	}{
		{name: "every read fails", applied: true, failedReads: 100, wantUnknown: true},
		{name: "every read fails, not applied", failedReads: 100, wantUnknown: true},
		{name: "reads fail, then show it bound", applied: true, failedReads: 2, wantOK: true},
		{name: "reads fail, then show it not bound", failedReads: 3},
		{name: "the pod is gone", gone: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "uid-1"}}
			client := fake.NewSimpleClientset(pod)
			if tt.gone {
				client = fake.NewSimpleClientset()
			}
			client.PrependReactor("create", "pods", func(a clienttesting.Action) (bool, runtime.Object, error) {
				if a.GetSubresource() != "binding" {
					return false, nil, nil
				}
				if tt.applied {
					p := pod.DeepCopy()
					p.Spec.NodeName = "node-1"
					if err := client.Tracker().Update(corev1.SchemeGroupVersion.WithResource("pods"), p, p.Namespace); err != nil {
						t.Error(err)
					}
				}
				return true, nil, timeout
			})
			reads := 0
			client.PrependReactor("get", "pods", func(clienttesting.Action) (bool, runtime.Object, error) {
				reads++
				if reads <= tt.failedReads {
					return true, nil, unavailable
				}
				return false, nil, nil
			})
			b := New(client, nil, WithConfirmBackoff(wait.Backoff{Duration: time.Millisecond, Factor: 2, Steps: 4}))
			err := b.Bind(t.Context(), pod, "node-1", nil)
			if got := err == nil; got != tt.wantOK {
				t.Fatalf("Bind = %v, want success %v", err, tt.wantOK)
			}
			if got := errors.Is(err, ErrBindingUnknown); got != tt.wantUnknown {
				t.Errorf("Bind = %v: ErrBindingUnknown %v, want %v", err, got, tt.wantUnknown)
			}
			if err != nil && !apierrors.IsTimeout(err) {
				t.Errorf("Bind = %v, want the binding's own error wrapped", err)
			}
			if tt.wantUnknown && reads != 4 {
				t.Errorf("read the pod back %d times, want the back-off's 4", reads)
			}
		})
	}
}
