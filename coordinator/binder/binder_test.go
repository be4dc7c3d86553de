package binder

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	testingclock "k8s.io/utils/clock/testing"

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
