package agent

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"

	"github.com/gpufrac/gpufrac/deviceplugin/enforcement"
)

// eventController is the reporting controller of gpufrac-node's events.
const eventController = "gpufrac-node"

// The actions of the agent's events on its Node (events.k8s.io/v1
// requires one). Repeats of an event with the same reason and action on the
// same object within minutes are counted on the first one (its series),
// keeping its note: tools/events does not compare notes. nodeEvent appends a
// hash of the note to the action (enforcement.NoteAction), so that only
// repeats of the same note fold: a second GPU's Xid, another bad config
// edit, another GPU's MIG layout each get their own event.
const (
	actionCheckHealth = "CheckGPUHealth"  // GPUXid
	actionCheckCDI    = "CheckCDISpecs"   // CDISpecResolved, CDISpecMissing
	actionLoadConfig  = "LoadConfig"      // GPUConfigRejected: a new config refused, the last good kept
	actionFailClosed  = "FailClosed"      // GPUConfigRejected at start, GPUConfigApplied after it
	actionServingPath = "KeepServingPath" // GPUConfigRejected: the config moves the node between device plugins and DRA
	actionReshapeMIG  = "ReshapeMIG"      // the MIG layout manager's events
	// CDISpecRegenerated, CDISpecRegenerationFailed: the admin's command
	// that writes the CDI spec anew after a MIG layout change.
	actionRegenerateCDI = "RegenerateCDISpecs"
)

// startEvents starts client-go's events.k8s.io/v1 broadcaster writing to
// client until ctx ends, and returns it (Shutdown it once nothing records
// any more) and a recorder logging to ctx's logger. tools/events queues
// events without blocking (1000 at most, then drops them), counts
// repeats on one event (its series) and retries a write only while the API
// server cannot be reached, 12 times about 10 s apart, jittered.
func startEvents(ctx context.Context, client kubernetes.Interface) (events.EventBroadcaster, events.EventRecorderLogger, error) {
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
	if err := b.StartRecordingToSinkWithContext(ctx); err != nil {
		b.Shutdown()
		return nil, nil, fmt.Errorf("starting the event recorder: %w", err)
	}
	return b, truncatingRecorder{b.NewRecorder(scheme.Scheme, eventController).WithLogger(klog.FromContext(ctx))}, nil
}

// truncatingRecorder cuts notes to the 1024 bytes the API server takes for
// events.k8s.io/v1 events (enforcement.TruncateNote): a longer note (a
// config with many problems, many CDI spec errors) would be refused, and the
// event lost.
type truncatingRecorder struct{ events.EventRecorderLogger }

func (r truncatingRecorder) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	r.EventRecorderLogger.Eventf(regarding, related, eventtype, reason, action, "%s", enforcement.TruncateNote(fmt.Sprintf(note, args...)))
}

func (r truncatingRecorder) WithLogger(logger klog.Logger) events.EventRecorderLogger {
	return truncatingRecorder{r.EventRecorderLogger.WithLogger(logger)}
}

// nodeRef names this node in its events as the kubelet does: the node
// name as UID.
func nodeRef(node string) *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "Node", Name: node, UID: types.UID(node)}
}

// nodeEvent records an event on this node (dropped without API access).
func (a *Agent) nodeEvent(typ, reason, action, format string, args ...any) {
	if a.recorder == nil || a.cfg.NodeName == "" {
		return
	}
	note := fmt.Sprintf(format, args...)
	a.recorder.Eventf(nodeRef(a.cfg.NodeName), nil, typ, reason, enforcement.NoteAction(action, note), "%s", note)
}
