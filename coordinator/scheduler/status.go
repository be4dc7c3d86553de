package scheduler

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/klog/v2"

	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/coordinator/queue"
)

// StatusWriter writes a Queue's status.
type StatusWriter interface {
	WriteQueueStatus(ctx context.Context, name string, st v1alpha1.QueueStatus) error
}

// DynamicStatusWriter patches queues.gpufrac.io/status through the dynamic client.
type DynamicStatusWriter struct{ Client dynamic.Interface }

// WriteQueueStatus implements StatusWriter with a merge patch of the status subresource.
func (w DynamicStatusWriter) WriteQueueStatus(ctx context.Context, name string, st v1alpha1.QueueStatus) error {
	body, err := statusPatch(st)
	if err != nil {
		return err
	}
	_, err = w.Client.Resource(v1alpha1.QueueGVR()).Patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{FieldManager: "gpufrac-coordinator"}, "status")
	if err != nil {
		return fmt.Errorf("writing status of queue %s: %w", name, err)
	}
	return nil
}

// statusPatch is the merge patch that sets st. A merge patch leaves out what
// st omits (omitempty), which would keep a stale pendingGangs once a queue's
// last workload was placed: it is written even when 0.
func statusPatch(st v1alpha1.QueueStatus) ([]byte, error) {
	raw, err := json.Marshal(st)
	if err != nil {
		return nil, err
	}
	var fields map[string]any
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, err
	}
	fields["pendingGangs"] = st.PendingGangs
	return json.Marshal(map[string]any{"status": fields})
}

// resourceList renders Resources with the CRD's keys (gpu in GPUs, fractions allowed).
func resourceList(r queue.Resources) corev1.ResourceList {
	return corev1.ResourceList{
		"gpu":    *resource.NewMilliQuantity(r.GPUMilli, resource.DecimalSI),
		"cpu":    *resource.NewMilliQuantity(r.CPUMilli, resource.DecimalSI),
		"memory": *resource.NewQuantity(r.MemoryBytes, resource.BinarySI),
	}
}

// writeQueueStatus publishes each queue's usage and pending work when it
// changed since the last write.
func (s *Scheduler) writeQueueStatus(ctx context.Context, b *books, ws []*workload, names []string) {
	if s.deps.Status == nil {
		return
	}
	requested := map[string]queue.Resources{}
	pending := map[string]int32{}
	for _, w := range ws {
		requested[w.queue] = requested[w.queue].Add(w.resources())
		pending[w.queue]++
	}
	for _, name := range names {
		used, np, ok := b.tree.Usage(name)
		if !ok {
			continue
		}
		st := v1alpha1.QueueStatus{
			Allocated:               resourceList(used),
			AllocatedNonPreemptible: resourceList(np),
			Requested:               resourceList(requested[name]),
			PendingGangs:            pending[name],
		}
		key, _ := json.Marshal(st)
		if s.lastStatus[name] == string(key) {
			continue
		}
		if err := s.deps.Status.WriteQueueStatus(ctx, name, st); err != nil {
			klog.FromContext(ctx).V(2).Info("Queue status not written", "queue", name, "err", err)
			continue
		}
		s.lastStatus[name] = string(key)
	}
}
