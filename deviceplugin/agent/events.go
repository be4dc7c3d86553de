package agent

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/gpufrac/gpufrac/deviceplugin/pods"
)

// typesUID is the UID events use for a Node: the kubelet, too, records node
// events with the node name as UID.
func typesUID(node string) types.UID { return types.UID(node) }

// eventSink writes the recorder's events through the agent's client. The
// recorder's sink has no context; ctx is the agent's, so writes stop with it.
type eventSink struct {
	ctx    context.Context
	client pods.Client
}

var _ record.EventSink = eventSink{}

func (s eventSink) Create(e *corev1.Event) (*corev1.Event, error) {
	return s.client.CreateEvent(s.ctx, e)
}

func (s eventSink) Update(e *corev1.Event) (*corev1.Event, error) {
	return s.client.UpdateEvent(s.ctx, e)
}

func (s eventSink) Patch(e *corev1.Event, data []byte) (*corev1.Event, error) {
	return s.client.PatchEvent(s.ctx, e, data)
}
