package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpufrac/gpufrac/deviceplugin/enforcement"
	"github.com/gpufrac/gpufrac/deviceplugin/pods"
)

// typesUID is the UID events use for a Node: the kubelet, too, records node
// events with the node name as UID.
func typesUID(node string) types.UID { return types.UID(node) }

// Limits of the event recorder, client-go's tools/record defaults.
const (
	eventQueueLength = 1000             // events waiting to be written; more are dropped
	eventCacheSize   = 4096             // events and objects remembered for counting and spam filtering
	eventSpamBurst   = 25               // events per object and type at once
	eventSpamQPS     = 1. / 300.        // then one per 5 minutes
	eventTries       = 12               // writes of one event while the API server is unreachable
	eventRetryWait   = 10 * time.Second // between them
)

// eventRecorder writes the agent's and the watchdog's events (core/v1) in
// the background, in the manner of client-go's tools/record, which
// gpufrac-node does not link: its correlator's strategic merge patches pull
// in kube-openapi and gnostic, 3 MB of the executable (docs/benchmarks.md).
// Kept from record: the event's shape and name, the queue that drops rather
// than blocks, a repeated event (same object, type, reason and message)
// counted on the event already written, a per-object and type token bucket
// against spam, and retries only while the API server cannot be reached.
// Left out: folding similar events with different messages into one, which
// gpufrac-node's few, object-specific events do not need.
type eventRecorder struct {
	client pods.Client
	source corev1.EventSource
	clock  clock.Clock
	logger klog.Logger // for Eventf, which has no context
	queue  chan *corev1.Event

	// The fields below belong to Run's goroutine.

	// written: eventKey -> the event written for it (name, count, first time).
	written map[string]*corev1.Event
	// limits: spamKey -> the object's and type's token bucket.
	limits map[string]flowcontrol.PassiveRateLimiter
	// order: the keys of written and limits, oldest first, to bound both.
	order []string
}

var _ enforcement.EventRecorder = (*eventRecorder)(nil)

func newEventRecorder(ctx context.Context, client pods.Client, source corev1.EventSource, c clock.Clock) *eventRecorder {
	return &eventRecorder{
		client:  client,
		source:  source,
		clock:   c,
		logger:  klog.FromContext(ctx),
		queue:   make(chan *corev1.Event, eventQueueLength),
		written: map[string]*corev1.Event{},
		limits:  map[string]flowcontrol.PassiveRateLimiter{},
	}
}

// Eventf implements enforcement.EventRecorder. It never blocks: the event
// is queued for Run, or dropped when the queue is full. obj is a Pod, a
// Node or an ObjectReference.
func (r *eventRecorder) Eventf(obj runtime.Object, eventType, reason, format string, args ...any) {
	logger := r.logger
	ref, err := reference(obj)
	if err != nil {
		logger.Error(err, "Event not recorded", "reason", reason)
		return
	}
	if eventType != corev1.EventTypeNormal && eventType != corev1.EventTypeWarning {
		logger.Error(nil, "Event not recorded: unsupported event type", "eventType", eventType, "reason", reason)
		return
	}
	t := metav1.NewTime(r.clock.Now())
	ns := ref.Namespace
	if ns == "" {
		ns = metav1.NamespaceDefault
	}
	name := fmt.Sprintf("%s.%x", ref.Name, t.UnixNano())
	if len(validation.IsDNS1123Subdomain(name)) > 0 {
		// record then uses a random UUID; the time alone is unique enough
		// for one agent's events.
		name = fmt.Sprintf("gpufrac-node.%x", t.UnixNano())
	}
	ev := &corev1.Event{
		ObjectMeta:          metav1.ObjectMeta{Name: name, Namespace: ns},
		InvolvedObject:      *ref,
		Reason:              reason,
		Message:             fmt.Sprintf(format, args...),
		Source:              r.source,
		FirstTimestamp:      t,
		LastTimestamp:       t,
		Count:               1,
		Type:                eventType,
		ReportingController: r.source.Component,
		ReportingInstance:   r.source.Host,
	}
	select {
	case r.queue <- ev:
	default:
		logger.Error(nil, "Event dropped: too many queued events", "reason", reason, "object", klog.KRef(ref.Namespace, ref.Name))
	}
}

// reference names the object an event is about. Without a scheme only the
// kinds gpufrac-node records events on are known.
func reference(obj runtime.Object) (*corev1.ObjectReference, error) {
	switch o := obj.(type) {
	case *corev1.ObjectReference:
		return o, nil
	case *corev1.Pod:
		return &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: o.Namespace, Name: o.Name, UID: o.UID, ResourceVersion: o.ResourceVersion}, nil
	case *corev1.Node:
		return &corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: o.Name, UID: o.UID, ResourceVersion: o.ResourceVersion}, nil
	}
	return nil, fmt.Errorf("referencing a %T in an event: not a Pod, Node or ObjectReference", obj)
}

// Run writes queued events until ctx ends; events still queued then are
// dropped.
func (r *eventRecorder) Run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev := <-r.queue:
			r.record(ctx, ev)
		}
	}
}

// record writes ev, or counts it on the event written for its key, unless
// its object and type have used up their tokens.
func (r *eventRecorder) record(ctx context.Context, ev *corev1.Event) {
	logger := klog.FromContext(ctx).WithValues("object", klog.KRef(ev.InvolvedObject.Namespace, ev.InvolvedObject.Name), "reason", ev.Reason)
	if !r.allow(spamKey(ev)) {
		logger.V(4).Info("Event dropped by the spam filter")
		return
	}
	key := eventKey(ev)
	last := r.written[key]
	var patch []byte
	if last != nil {
		ev.Name, ev.FirstTimestamp, ev.Count = last.Name, last.FirstTimestamp, last.Count+1
		var err error
		patch, err = json.Marshal(map[string]any{"count": ev.Count, "lastTimestamp": ev.LastTimestamp, "message": ev.Message})
		if err != nil {
			logger.Error(err, "Event not recorded: encoding its patch")
			return
		}
	}
	for try := 1; ; try++ {
		got, err := r.write(ctx, ev, patch)
		if err == nil {
			r.remember(key, got)
			return
		}
		if st := apierrors.APIStatus(nil); errors.As(err, &st) {
			// The API server answered: the event itself is at fault.
			logger.Error(err, "Event rejected by the API server; not retried")
			return
		}
		if try == eventTries {
			logger.Error(err, "Event not recorded: retry limit reached")
			return
		}
		logger.V(2).Info("Writing event failed; will retry", "err", err, "try", try)
		select {
		case <-ctx.Done():
			return
		case <-r.clock.After(eventRetryWait):
		}
	}
}

// write patches the event already written for ev's key (patch != nil) or,
// without one or when it has expired, creates ev.
func (r *eventRecorder) write(ctx context.Context, ev *corev1.Event, patch []byte) (*corev1.Event, error) {
	if patch != nil {
		got, err := r.client.PatchEvent(ctx, ev, patch)
		if !apierrors.IsNotFound(err) {
			return got, err
		}
	}
	ev = ev.DeepCopy()
	ev.ResourceVersion = ""
	return r.client.CreateEvent(ctx, ev)
}

// allow takes a token of key's bucket, creating a full one for a new key.
func (r *eventRecorder) allow(key string) bool {
	l, ok := r.limits[key]
	if !ok {
		l = flowcontrol.NewTokenBucketPassiveRateLimiterWithClock(eventSpamQPS, eventSpamBurst, r.clock)
		r.limits[key] = l
		r.addKey("limit\x00" + key)
	}
	return l.TryAccept()
}

// remember stores the event the API server holds for key.
func (r *eventRecorder) remember(key string, ev *corev1.Event) {
	if _, ok := r.written[key]; !ok {
		r.addKey("event\x00" + key)
	}
	r.written[key] = &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: ev.Name}, FirstTimestamp: ev.FirstTimestamp, Count: ev.Count}
}

// addKey records a new cache key, forgetting the oldest beyond
// eventCacheSize.
func (r *eventRecorder) addKey(k string) {
	r.order = append(r.order, k)
	if len(r.order) <= eventCacheSize {
		return
	}
	kind, old, _ := strings.Cut(r.order[0], "\x00")
	r.order = r.order[1:]
	if kind == "limit" {
		delete(r.limits, old)
	} else {
		delete(r.written, old)
	}
}

// eventKey identifies repeats of one event, as record's does.
func eventKey(ev *corev1.Event) string {
	o := ev.InvolvedObject
	return strings.Join([]string{ev.Source.Component, ev.Source.Host, o.Kind, o.Namespace, o.Name, o.FieldPath, string(o.UID), o.APIVersion, ev.Type, ev.Reason, ev.Message}, "\x00")
}

// spamKey identifies an object's events of one type, as record's does.
func spamKey(ev *corev1.Event) string {
	o := ev.InvolvedObject
	return strings.Join([]string{ev.Source.Component, ev.Source.Host, o.Kind, o.Namespace, o.Name, string(o.UID), o.APIVersion, ev.Type}, "\x00")
}
