package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"
	testclock "k8s.io/utils/clock/testing"

	"github.com/gpufrac/gpufrac/deviceplugin/pods/podstest"
)

var (
	eventT0   = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	eventNode = &corev1.ObjectReference{Kind: "Node", Name: nodeName, UID: typesUID(nodeName)}
	eventPod  = &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "hog", Namespace: "team-a", UID: "uid-hog", ResourceVersion: "42"}}
)

// eventCall is one Eventf call, made after the clock moved by after.
type eventCall struct {
	after  time.Duration
	obj    runtime.Object
	typ    string
	reason string
	msg    string
}

// storedEvent is what the API server holds of an event.
type storedEvent struct {
	Name, Namespace, Object, Type, Reason, Message string
	Count                                          int32
	First, Last                                    time.Duration // since eventT0
	Source                                         corev1.EventSource
	ReportingController, ReportingInstance         string
}

func stored(t *testing.T, c *fake.Clientset) []storedEvent {
	t.Helper()
	list, err := c.CoreV1().Events("").List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []storedEvent
	for _, e := range list.Items {
		o := e.InvolvedObject
		out = append(out, storedEvent{
			Name: e.Name, Namespace: e.Namespace, Object: fmt.Sprintf("%s %s/%s %s %s rv=%s", o.Kind, o.Namespace, o.Name, o.UID, o.APIVersion, o.ResourceVersion),
			Type: e.Type, Reason: e.Reason, Message: e.Message, Count: e.Count,
			First: e.FirstTimestamp.Sub(eventT0), Last: e.LastTimestamp.Sub(eventT0),
			Source: e.Source, ReportingController: e.ReportingController, ReportingInstance: e.ReportingInstance,
		})
	}
	slices.SortFunc(out, func(a, b storedEvent) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// verbs counts the API calls on events by verb.
func verbs(c *fake.Clientset) map[string]int {
	out := map[string]int{}
	for _, a := range c.Actions() {
		if a.GetResource().Resource == "events" && a.GetVerb() != "list" {
			out[a.GetVerb()]++
		}
	}
	return out
}

func eventName(obj string, after time.Duration) string {
	return fmt.Sprintf("%s.%x", obj, eventT0.Add(after).UnixNano())
}

var source = corev1.EventSource{Component: "gpufrac-node", Host: nodeName}

func TestEventRecorder(t *testing.T) {
	nodeRef := "Node /node-a node-a  rv="
	podRef := "Pod team-a/hog uid-hog v1 rv=42"
	tests := []struct {
		name  string
		calls []eventCall
		// deleted: events removed from the API server (expired) before
		// the call of that index.
		deleted map[int]string
		want    []storedEvent
		verbs   map[string]int
	}{
		{
			name:  "a node event",
			calls: []eventCall{{obj: eventNode, typ: corev1.EventTypeWarning, reason: "GPUXid", msg: "GPU 1 reported Xid 79"}},
			want: []storedEvent{{Name: eventName(nodeName, 0), Namespace: "default", Object: nodeRef, Type: "Warning", Reason: "GPUXid",
				Message: "GPU 1 reported Xid 79", Count: 1, Source: source, ReportingController: "gpufrac-node", ReportingInstance: nodeName}},
			verbs: map[string]int{"create": 1},
		},
		{
			name:  "a pod event lands in the pod's namespace and names its UID and version",
			calls: []eventCall{{obj: eventPod, typ: corev1.EventTypeWarning, reason: "GPUMemoryLimitExceeded", msg: "over"}},
			want: []storedEvent{{Name: eventName("hog", 0), Namespace: "team-a", Object: podRef, Type: "Warning", Reason: "GPUMemoryLimitExceeded",
				Message: "over", Count: 1, Source: source, ReportingController: "gpufrac-node", ReportingInstance: nodeName}},
			verbs: map[string]int{"create": 1},
		},
		{
			name: "a repeated event is counted on the first",
			calls: []eventCall{
				{obj: eventNode, typ: corev1.EventTypeWarning, reason: "GPUXid", msg: "m"},
				{after: time.Minute, obj: eventNode, typ: corev1.EventTypeWarning, reason: "GPUXid", msg: "m"},
				{after: 2 * time.Minute, obj: eventNode, typ: corev1.EventTypeWarning, reason: "GPUXid", msg: "m"},
			},
			want: []storedEvent{{Name: eventName(nodeName, 0), Namespace: "default", Object: nodeRef, Type: "Warning", Reason: "GPUXid",
				Message: "m", Count: 3, Last: 3 * time.Minute, Source: source, ReportingController: "gpufrac-node", ReportingInstance: nodeName}},
			verbs: map[string]int{"create": 1, "patch": 2},
		},
		{
			name: "another message, reason or type is another event",
			calls: []eventCall{
				{obj: eventNode, typ: corev1.EventTypeWarning, reason: "GPUXid", msg: "m"},
				{after: time.Second, obj: eventNode, typ: corev1.EventTypeWarning, reason: "GPUXid", msg: "n"},
				{after: time.Second, obj: eventNode, typ: corev1.EventTypeWarning, reason: "GPUConfigRejected", msg: "n"},
				{after: time.Second, obj: eventNode, typ: corev1.EventTypeNormal, reason: "GPUConfigRejected", msg: "n"},
			},
			want: []storedEvent{
				{Name: eventName(nodeName, 0), Namespace: "default", Object: nodeRef, Type: "Warning", Reason: "GPUXid", Message: "m", Count: 1, Source: source, ReportingController: "gpufrac-node", ReportingInstance: nodeName},
				{Name: eventName(nodeName, time.Second), Namespace: "default", Object: nodeRef, Type: "Warning", Reason: "GPUXid", Message: "n", Count: 1, First: time.Second, Last: time.Second, Source: source, ReportingController: "gpufrac-node", ReportingInstance: nodeName},
				{Name: eventName(nodeName, 2*time.Second), Namespace: "default", Object: nodeRef, Type: "Warning", Reason: "GPUConfigRejected", Message: "n", Count: 1, First: 2 * time.Second, Last: 2 * time.Second, Source: source, ReportingController: "gpufrac-node", ReportingInstance: nodeName},
				{Name: eventName(nodeName, 3*time.Second), Namespace: "default", Object: nodeRef, Type: "Normal", Reason: "GPUConfigRejected", Message: "n", Count: 1, First: 3 * time.Second, Last: 3 * time.Second, Source: source, ReportingController: "gpufrac-node", ReportingInstance: nodeName},
			},
			verbs: map[string]int{"create": 4},
		},
		{
			name: "a repeat of an expired event is created again with its count",
			calls: []eventCall{
				{obj: eventNode, typ: corev1.EventTypeWarning, reason: "GPUXid", msg: "m"},
				{after: time.Hour, obj: eventNode, typ: corev1.EventTypeWarning, reason: "GPUXid", msg: "m"},
			},
			deleted: map[int]string{1: eventName(nodeName, 0)},
			want: []storedEvent{{Name: eventName(nodeName, 0), Namespace: "default", Object: nodeRef, Type: "Warning", Reason: "GPUXid",
				Message: "m", Count: 2, Last: time.Hour, Source: source, ReportingController: "gpufrac-node", ReportingInstance: nodeName}},
			verbs: map[string]int{"create": 2, "patch": 1, "delete": 1},
		},
		{
			name:  "an unsupported type or object is not recorded",
			calls: []eventCall{{obj: eventNode, typ: "Error", reason: "GPUXid", msg: "m"}, {obj: &corev1.Service{}, typ: corev1.EventTypeNormal, reason: "R", msg: "m"}},
			verbs: map[string]int{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			c := fake.NewClientset()
			clk := testclock.NewFakeClock(eventT0)
			r := newEventRecorder(ctx, podstest.Clientset{Interface: c}, source, clk)
			var at time.Duration
			for i, call := range tt.calls {
				if name, ok := tt.deleted[i]; ok {
					if err := c.CoreV1().Events("default").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
						t.Fatal(err)
					}
				}
				at += call.after
				clk.SetTime(eventT0.Add(at))
				r.Eventf(call.obj, call.typ, call.reason, "%s", call.msg)
				drain(ctx, r)
			}
			if diff := cmp.Diff(tt.want, stored(t, c)); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.verbs, verbs(c)); diff != "" {
				t.Errorf("API calls on events (-want +got):\n%s", diff)
			}
		})
	}
}

// drain writes the queued events in the test's goroutine.
func drain(ctx context.Context, r *eventRecorder) {
	for {
		select {
		case ev := <-r.queue:
			r.record(ctx, ev)
		default:
			return
		}
	}
}

// An object's events of one type pass 25 at once, then one per 5 minutes.
func TestEventRecorderSpamFilter(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	c := fake.NewClientset()
	clk := testclock.NewFakeClock(eventT0)
	r := newEventRecorder(ctx, podstest.Clientset{Interface: c}, source, clk)
	send := func(n int, obj runtime.Object, typ string) {
		for range n {
			clk.Step(time.Millisecond) // distinct names
			r.Eventf(obj, typ, "R", "message %d", clk.Now().UnixNano())
			drain(ctx, r)
		}
	}
	send(30, eventNode, corev1.EventTypeWarning)
	send(2, eventNode, corev1.EventTypeNormal) // another type has its own bucket
	send(2, eventPod, corev1.EventTypeWarning) // another object too
	clk.Step(5 * time.Minute)
	send(2, eventNode, corev1.EventTypeWarning) // one token back
	if got, want := verbs(c)["create"], 25+2+2+1; got != want {
		t.Errorf("%d events created, want %d", got, want)
	}
}

// Eventf never blocks: beyond the queue's length events are dropped.
func TestEventRecorderDropsWhenFull(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	r := newEventRecorder(ctx, podstest.Clientset{Interface: fake.NewClientset()}, source, testclock.NewFakeClock(eventT0))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range eventQueueLength + 10 {
			r.Eventf(eventNode, corev1.EventTypeNormal, "R", "m")
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Eventf blocked on a full queue")
	}
	if got := len(r.queue); got != eventQueueLength {
		t.Errorf("%d events queued, want %d", got, eventQueueLength)
	}
}

// Run retries while the API server cannot be reached, every 10 s of its
// clock, and gives up at once on an answer that rejects the event.
func TestEventRecorderRetries(t *testing.T) {
	tests := []struct {
		name    string
		errs    []error // what the creates return, in order; then success
		creates int
		stored  int
	}{
		{name: "unreachable twice, then written", errs: []error{errors.New("connection refused"), errors.New("connection refused")}, creates: 3, stored: 1},
		{name: "rejected: no retry", errs: []error{apierrors.NewForbidden(schema.GroupResource{Resource: "events"}, "x", errors.New("rbac"))}, creates: 1, stored: 0},
		{name: "unreachable every time: 12 tries", errs: slices.Repeat([]error{errors.New("timeout")}, 20), creates: eventTries, stored: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			c := fake.NewClientset()
			var creates atomic.Int32
			c.PrependReactor("create", "events", func(clienttesting.Action) (bool, runtime.Object, error) {
				n := int(creates.Add(1))
				if n <= len(tt.errs) {
					return true, nil, tt.errs[n-1]
				}
				return false, nil, nil
			})
			clk := testclock.NewFakeClock(eventT0)
			r := newEventRecorder(ctx, podstest.Clientset{Interface: c}, source, clk)
			runCtx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- r.Run(runCtx) }()
			r.Eventf(eventNode, corev1.EventTypeWarning, "GPUXid", "m")
			// Step the clock whenever the recorder waits, until it has
			// made the creates expected and waits no more.
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			for int(creates.Load()) < tt.creates || clk.HasWaiters() || len(r.queue) > 0 {
				if clk.HasWaiters() {
					clk.Step(eventRetryWait)
				}
				select {
				case <-ctx.Done():
					t.Fatalf("%d creates, want %d", creates.Load(), tt.creates)
				case <-tick.C:
				}
			}
			stop()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
			if got := int(creates.Load()); got != tt.creates {
				t.Errorf("%d creates, want %d", got, tt.creates)
			}
			if got := len(stored(t, c)); got != tt.stored {
				t.Errorf("%d events stored, want %d", got, tt.stored)
			}
		})
	}
}
