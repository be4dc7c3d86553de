package placeholder

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpufrac/gpufrac/api"
)

// A placeholder no scheduler serves is created and then marked
// Unschedulable, what Karpenter provisions for; a failed mark is an error
// (the pod stays, not asking) and marking again later succeeds.
func TestManagerCreatesPlaceholdersAskingKarpenter(t *testing.T) {
	for _, tc := range []struct {
		name      string
		markFails int
		wantErr   bool
	}{
		{name: "created and marked"},
		{name: "the mark fails once", markFails: 1, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			fails := tc.markFails
			client.PrependReactor("patch", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
				if a.GetSubresource() == "status" && fails > 0 {
					fails--
					return true, nil, errors.New("injected: status patch refused")
				}
				return false, nil, nil
			})
			m := NewManager(client, nil)
			m.clock = clocktesting.NewFakeClock(time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC))
			p := Plan([]Item{fraction("f", 40)}, DefaultOptions())[0]
			ctx := context.Background()
			err := m.Create(ctx, p)
			if (err != nil) != tc.wantErr {
				t.Fatalf("Create: %v, want error %v", err, tc.wantErr)
			}
			got, gerr := client.CoreV1().Pods(api.ReservationNamespace).Get(ctx, p.Name, metav1.GetOptions{})
			if gerr != nil {
				t.Fatalf("the placeholder was not created: %v", gerr)
			}
			if AsksKarpenter(got) == tc.wantErr {
				t.Fatalf("asks Karpenter = %v after Create (err %v); conditions %v", AsksKarpenter(got), err, got.Status.Conditions)
			}
			if tc.wantErr {
				if err := m.MarkUnschedulable(ctx, got); err != nil {
					t.Fatalf("marking again: %v", err)
				}
				got, _ = client.CoreV1().Pods(api.ReservationNamespace).Get(ctx, p.Name, metav1.GetOptions{})
				if !AsksKarpenter(got) {
					t.Fatalf("not asking Karpenter after the second mark: %v", got.Status.Conditions)
				}
			}
			// Creating it again (a restarted coordinator) is no error.
			if err := m.Create(ctx, p); err != nil {
				t.Errorf("Create of an existing placeholder: %v", err)
			}
		})
	}
}

// Only placeholders are marked: on any other pod the reason Unschedulable
// would make Karpenter buy a node for work quota never admitted.
func TestManagerMarksOnlyPlaceholders(t *testing.T) {
	client := fake.NewClientset()
	m := NewManager(client, nil)
	tenant := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "w", Namespace: "default"}}
	if err := m.MarkUnschedulable(context.Background(), tenant); err == nil {
		t.Fatal("a tenant pod was marked Unschedulable")
	}
	for _, a := range client.Actions() {
		if a.GetVerb() == "patch" {
			t.Errorf("wrote %v", a)
		}
	}
}

func TestAsksKarpenter(t *testing.T) {
	for _, tc := range []struct {
		name string
		cond []corev1.PodCondition
		want bool
	}{
		{name: "no condition"},
		{name: "Unschedulable", cond: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable}}, want: true},
		{name: "another reason", cond: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: api.ReasonNoCapacity}}},
		{name: "scheduled", cond: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}}},
	} {
		p := &corev1.Pod{Status: corev1.PodStatus{Conditions: tc.cond}}
		if got := AsksKarpenter(p); got != tc.want {
			t.Errorf("%s: AsksKarpenter = %v, want %v", tc.name, got, tc.want)
		}
	}
}
