package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpufrac/gpufrac/deviceplugin/enforcement"
)

var eventPod = &corev1.Pod{TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
	ObjectMeta: metav1.ObjectMeta{Name: "hog", Namespace: "team-a", UID: "uid-hog", ResourceVersion: "42"}}

// storedEvent is what the API server holds of an events.k8s.io/v1 event.
type storedEvent struct {
	Namespace, Regarding, Type, Reason, Action, Note string
	Count                                            int32 // 1 without a series
	ReportingController, ReportingInstance           string
}

func storedEvents(ctx context.Context, c *fake.Clientset) ([]storedEvent, error) {
	list, err := c.EventsV1().Events("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []storedEvent
	for _, e := range list.Items {
		out = append(out, toStored(e))
	}
	slices.SortFunc(out, func(a, b storedEvent) int { return strings.Compare(a.Reason+a.Note, b.Reason+b.Note) })
	return out, nil
}

func toStored(e eventsv1.Event) storedEvent {
	o := e.Regarding
	s := storedEvent{
		Namespace: e.Namespace, Regarding: fmt.Sprintf("%s %s/%s %s %s rv=%s", o.Kind, o.Namespace, o.Name, o.UID, o.APIVersion, o.ResourceVersion),
		Type: e.Type, Reason: e.Reason, Action: e.Action, Note: e.Note, Count: 1,
		ReportingController: e.ReportingController, ReportingInstance: e.ReportingInstance,
	}
	if e.Series != nil {
		s.Count = e.Series.Count
	}
	return s
}

// recordingAgent is an agent with only its event recorder started, on a
// fake clientset prep may add reactors to.
func recordingAgent(t *testing.T, prep func(*fake.Clientset)) (*Agent, *fake.Clientset, context.Context) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	c := fake.NewClientset()
	if prep != nil {
		prep(c)
	}
	a := New(Config{NodeName: nodeName}, nil, c)
	var err error
	if a.events, a.recorder, err = startEvents(ctx, a.client); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); a.events.Shutdown() })
	return a, c, ctx
}

// waitEvents polls the stored events until cond holds for them.
func waitEvents(t *testing.T, ctx context.Context, c *fake.Clientset, what string, cond func([]storedEvent) bool) []storedEvent {
	t.Helper()
	for {
		got, err := storedEvents(ctx, c)
		if err == nil && cond(got) {
			return got
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v; events: %+v", what, ctx.Err(), got)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// The agent's events go through client-go's tools/events to
// events.k8s.io/v1: a Node's name the node (in default, the node name as
// UID, as the kubelet's), a pod's name the pod in its namespace. A node
// event's action carries a hash of its note: a repeat of the same note is
// counted on the first event's series, another note is another event (a
// second GPU's Xid is not folded into the first's); notes longer than the
// API server takes are cut.
func TestEvents(t *testing.T) {
	a, c, ctx := recordingAgent(t, nil)
	xid1 := enforcement.NoteAction(actionCheckHealth, "GPU GPU-1 reported critical Xid 79")
	a.nodeEvent(corev1.EventTypeWarning, "GPUXid", actionCheckHealth, "GPU %s reported critical Xid %d", "GPU-1", 79)
	a.recorder.Eventf(eventPod, nil, corev1.EventTypeWarning, "GPUMemoryPodEvicted", "EvictPod", "Evicted: container %s", "main")
	got := waitEvents(t, ctx, c, "two events", func(e []storedEvent) bool { return len(e) == 2 })
	host, _ := os.Hostname()
	want := []storedEvent{
		{Namespace: "team-a", Regarding: "Pod team-a/hog uid-hog v1 rv=42", Type: "Warning", Reason: "GPUMemoryPodEvicted", Action: "EvictPod",
			Note: "Evicted: container main", Count: 1, ReportingController: "gpufrac-node", ReportingInstance: "gpufrac-node-" + host},
		{Namespace: "default", Regarding: "Node /node-a node-a  rv=", Type: "Warning", Reason: "GPUXid", Action: xid1,
			Note: "GPU GPU-1 reported critical Xid 79", Count: 1, ReportingController: "gpufrac-node", ReportingInstance: "gpufrac-node-" + host},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}

	// The same note again counts on the first event; another GPU's Xid is
	// its own event.
	a.nodeEvent(corev1.EventTypeWarning, "GPUXid", actionCheckHealth, "GPU %s reported critical Xid %d", "GPU-1", 79)
	a.nodeEvent(corev1.EventTypeWarning, "GPUXid", actionCheckHealth, "GPU %s reported critical Xid %d", "GPU-2", 48)
	waitEvents(t, ctx, c, "the repeat counted on the first GPUXid event, GPU-2's its own", func(e []storedEvent) bool {
		var first, second bool
		for _, ev := range e {
			first = first || ev.Action == xid1 && ev.Count == 2
			second = second || ev.Note == "GPU GPU-2 reported critical Xid 48" && ev.Count == 1
		}
		return len(e) == 3 && first && second
	})
	// A note longer than the API server takes is cut, not lost.
	a.nodeEvent(corev1.EventTypeWarning, "GPUConfigRejected", actionLoadConfig, "kept its last good config: %s", strings.Repeat("problem; ", 200))
	waitEvents(t, ctx, c, "the long note cut to 1024 bytes", func(e []storedEvent) bool {
		for _, ev := range e {
			if ev.Reason == "GPUConfigRejected" {
				return len(ev.Note) <= 1024 && strings.HasSuffix(ev.Note, " ...")
			}
		}
		return false
	})

	// An unsupported type is not recorded; nor is anything standalone.
	a.nodeEvent("Critical", "GPUXid", actionCheckHealth, "no")
	(&Agent{cfg: Config{NodeName: nodeName}}).nodeEvent(corev1.EventTypeWarning, "GPUXid", actionCheckHealth, "standalone")
	time.Sleep(100 * time.Millisecond)
	if got, _ := storedEvents(ctx, c); len(got) != 4 {
		t.Errorf("events after an unsupported type: %+v, want the 4 before", got)
	}
}

// Writes the API server rejects (it answered: the event is at fault) are
// not retried, and the recorder goes on with the next event; writes that
// do not reach it are retried (tools/events: after about 10 s, 12 times at
// most).
func TestEventsWriteFailures(t *testing.T) {
	var mu sync.Mutex
	var errs []error // the errors of the next creates, in order
	creates := map[string]int{}
	prep := func(c *fake.Clientset) {
		c.PrependReactor("create", "events", func(a clienttesting.Action) (bool, runtime.Object, error) {
			ev := a.(clienttesting.CreateAction).GetObject().(*eventsv1.Event)
			mu.Lock()
			defer mu.Unlock()
			creates[ev.Reason]++
			if len(errs) == 0 {
				return false, nil, nil
			}
			err := errs[0]
			errs = errs[1:]
			return true, nil, err
		})
	}
	t.Run("rejected: not retried", func(t *testing.T) {
		errs = []error{apierrors.NewForbidden(schema.GroupResource{Group: "events.k8s.io", Resource: "events"}, "x", errors.New("rbac"))}
		a, c, ctx := recordingAgent(t, prep)
		a.nodeEvent(corev1.EventTypeWarning, "GPUXid", actionCheckHealth, "refused")
		waitEvents(t, ctx, c, "the refused create", func([]storedEvent) bool { mu.Lock(); defer mu.Unlock(); return creates["GPUXid"] == 1 })
		a.nodeEvent(corev1.EventTypeWarning, "CDISpecMissing", actionCheckCDI, "written")
		got := waitEvents(t, ctx, c, "the next event", func(e []storedEvent) bool { return len(e) == 1 })
		if got[0].Reason != "CDISpecMissing" {
			t.Errorf("events %+v, want only CDISpecMissing", got)
		}
		time.Sleep(100 * time.Millisecond)
		mu.Lock()
		defer mu.Unlock()
		if creates["GPUXid"] != 1 {
			t.Errorf("rejected event created %d times, want once", creates["GPUXid"])
		}
	})
	t.Run("unreachable: retried", func(t *testing.T) {
		if testing.Short() {
			t.Skip("tools/events retries after about 10 s")
		}
		mu.Lock()
		errs, creates = []error{errors.New("connection refused")}, map[string]int{}
		mu.Unlock()
		a, c, ctx := recordingAgent(t, prep)
		a.nodeEvent(corev1.EventTypeWarning, "GPUXid", actionCheckHealth, "retried")
		waitEvents(t, ctx, c, "the event written on its second try", func(e []storedEvent) bool { return len(e) == 1 })
		mu.Lock()
		defer mu.Unlock()
		if creates["GPUXid"] != 2 {
			t.Errorf("event created %d times, want twice", creates["GPUXid"])
		}
	})
}
