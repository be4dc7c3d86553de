package scheduler

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
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

// writeQueueStatus publishes each queue's usage, pending work and
// condition Valid when they changed since the last write, and records a
// Warning event InvalidQueue on a Queue when it becomes invalid (or its
// problem changes). Queues that are gone are forgotten.
func (s *Scheduler) writeQueueStatus(ctx context.Context, b *books, ws []*workload, queues []*v1alpha1.Queue, invalid []InvalidQueue) {
	if s.deps.Status == nil {
		return
	}
	requested := map[string]queue.Resources{}
	pending := map[string]int32{}
	for _, w := range ws {
		requested[w.queue] = requested[w.queue].Add(w.resources())
		pending[w.queue]++
	}
	problems := b.problems()
	type target struct {
		name  string
		obj   func() runtime.Object // for the event; nil result: none
		conds []metav1.Condition
	}
	targets := make([]target, 0, len(queues)+len(invalid))
	for _, q := range queues {
		obj := func() runtime.Object {
			if u, err := v1alpha1.ToUnstructured(q); err == nil {
				return u
			}
			return nil
		}
		targets = append(targets, target{q.Name, obj, q.Status.Conditions})
	}
	for _, iq := range invalid {
		targets = append(targets, target{iq.Name, func() runtime.Object { return iq.Object }, iq.Conditions})
	}
	now := metav1.NewTime(s.clock.Now())
	seen := make(map[string]bool, len(targets))
	for _, tg := range targets {
		seen[tg.name] = true
		var st v1alpha1.QueueStatus
		if used, np, ok := b.tree.Usage(tg.name); ok {
			st = v1alpha1.QueueStatus{
				Allocated:               resourceList(used),
				AllocatedNonPreemptible: resourceList(np),
				Requested:               resourceList(requested[tg.name]),
				PendingGangs:            pending[tg.name],
			}
		}
		cond := metav1.Condition{Type: v1alpha1.ConditionValid, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonQueueValid,
			Message: "the coordinator schedules this queue's pods", LastTransitionTime: now}
		why, bad := problems[tg.name]
		if bad {
			cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, v1alpha1.ReasonInvalidQueue, why
		}
		st.Conditions = append([]metav1.Condition(nil), tg.conds...)
		meta.SetStatusCondition(&st.Conditions, cond)
		if bad && s.invalidSaid.say(tg.name, why) && s.deps.Recorder != nil {
			if obj := tg.obj(); obj != nil {
				s.deps.Recorder.Event(obj, corev1.EventTypeWarning, v1alpha1.ReasonInvalidQueue, "the coordinator cannot use this queue: "+why)
			}
		}
		if !bad {
			s.invalidSaid.forget(tg.name)
		}
		key := statusKey(st)
		if !s.statusSaid.say(tg.name, key) { // written, or queued: not queued again
			continue
		}
		name := tg.name
		s.writes.do(ctx, queueStatusKey+name, func(ctx context.Context) {
			if err := s.deps.Status.WriteQueueStatus(ctx, name, st); err != nil {
				klog.FromContext(ctx).V(2).Info("Queue status not written", "queue", name, "err", err)
				s.statusSaid.failed(name, key) // the next cycle tries again
			}
		})
	}
	live := func(name string) bool { return seen[name] }
	s.statusSaid.keep(live)
	s.invalidSaid.keep(live)
}

// statusKey is what a status write is compared by: its JSON without the
// conditions' transition times, which differ until the informer shows the
// last write.
func statusKey(st v1alpha1.QueueStatus) string {
	st.Conditions = append([]metav1.Condition(nil), st.Conditions...)
	for i := range st.Conditions {
		st.Conditions[i].LastTransitionTime = metav1.Time{}
	}
	key, _ := json.Marshal(st)
	return string(key)
}
