// Package binder writes the coordinator's decisions to the API server:
// the pods/binding subresource (carrying the pod's new annotations), and the PodScheduled
// condition plus an event for pods that stay pending. It never writes the
// reason "Unschedulable": Karpenter provisions capacity for exactly those
// pods, and gpufrac asks for capacity only through placeholder pods.
package binder

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpufrac/gpufrac/api"
)

// The PodScheduled reasons the coordinator writes.
const (
	ReasonOverQuota      = api.ReasonOverQuota
	ReasonOverLimit      = api.ReasonOverLimit
	ReasonGangIncomplete = api.ReasonGangIncomplete
	ReasonNoCapacity     = api.ReasonNoCapacity
	ReasonInvalidRequest = api.ReasonInvalidRequest
	// reasonForbidden is what the coordinator must never write (see package doc).
	reasonForbidden = corev1.PodReasonUnschedulable
)

// ErrForbiddenReason is returned for an attempt to write reason Unschedulable.
var ErrForbiddenReason = errors.New("the coordinator never writes reason Unschedulable")

// ErrBindingUnknown means a binding was answered with an error and reading
// the pod back failed too: the API server may have bound it. What was
// written for the binding (resource claims) must stay until the pod is
// read again: taken back, a bound pod would run without its claims' devices
// and another pod be given them.
var ErrBindingUnknown = errors.New("whether the pod is bound is unknown")

// DefaultConfirmBackoff is how Bind retries reading a pod back after a
// failed binding: four reads over about 1.5 s.
var DefaultConfirmBackoff = wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 4}

// MessageRefresh is how often MarkPending rewrites a pending pod's message
// while its reason stays the same. Messages carry figures that change from
// cycle to cycle (a gang's member count): rewritten on every cycle for every
// pending member, a 256-pod gang arriving over 5 s cost thousands of status
// patches and events, and the cycles, which wait for these writes, grew to 2 s.
const MessageRefresh = 10 * time.Second

// Binder writes bindings and pod conditions.
type Binder struct {
	client   kubernetes.Interface
	recorder record.EventRecorder
	fieldMgr string
	clock    clock.PassiveClock
	// confirm paces the reads of a pod back after a failed binding.
	confirm wait.Backoff
}

// Option configures a Binder.
type Option func(*Binder)

// WithConfirmBackoff sets how Bind retries reading a pod back after a
// failed binding (DefaultConfirmBackoff).
func WithConfirmBackoff(b wait.Backoff) Option { return func(bd *Binder) { bd.confirm = b } }

// New returns a Binder; recorder may be nil.
func New(client kubernetes.Interface, recorder record.EventRecorder, opts ...Option) *Binder {
	if recorder == nil {
		recorder = &record.FakeRecorder{}
	}
	b := &Binder{client: client, recorder: recorder, fieldMgr: "gpufrac-coordinator", clock: clock.RealClock{}, confirm: DefaultConfirmBackoff}
	for _, o := range opts {
		o(b)
	}
	return b
}

// Bind binds the pod to node through the pods/binding subresource, with
// annotations on the Binding: the API server copies them onto the pod in the
// same update that sets spec.nodeName. One request per pod, and no moment
// where the pod carries a GPU choice but no node, or a node but no GPU choice.
func (b *Binder) Bind(ctx context.Context, pod *corev1.Pod, node string, annotations map[string]string) error {
	binding := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, Annotations: annotations},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}
	if err := b.client.CoreV1().Pods(pod.Namespace).Bind(ctx, binding, metav1.CreateOptions{}); err != nil {
		bound, readErr := b.boundTo(ctx, pod, node)
		switch {
		case readErr != nil:
			// Neither applied nor refused for sure: the caller keeps what
			// it wrote for the binding, and the next cycle reads the pod.
			return fmt.Errorf("binding pod %s/%s to %s: %w; %w: %v", pod.Namespace, pod.Name, node, err, ErrBindingUnknown, readErr)
		case bound:
			// The API server applied the binding but its answer was lost (a
			// timeout, a connection reset, an apiserver restart), or an
			// earlier such attempt applied it (this one then meets "already
			// assigned"). Reported as failed, the pod would go back to
			// pending while it holds its GPUs on node, and the next cycle
			// could give them to another pod before the informer shows the
			// binding.
			klog.FromContext(ctx).V(2).Info("Binding answered with an error, but the pod is bound as asked", "pod", klog.KObj(pod), "node", node, "err", err)
			return nil
		}
		return fmt.Errorf("binding pod %s/%s to %s: %w", pod.Namespace, pod.Name, node, err)
	}
	klog.FromContext(ctx).V(4).Info("Bound pod", "pod", klog.KObj(pod), "node", node)
	return nil
}

// boundTo reads the pod from the API server (not a cache) and tells whether
// this very pod (same UID) is bound to node. A failed read is retried with
// the confirm back-off; an error means the answer is unknown (the last
// read's error, wrapped). A pod that is gone, or another pod under its
// name, is not bound.
func (b *Binder) boundTo(ctx context.Context, pod *corev1.Pod, node string) (bool, error) {
	var bound bool
	var lastErr error
	err := wait.ExponentialBackoffWithContext(ctx, b.confirm, func(ctx context.Context) (bool, error) {
		got, err := b.client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			bound, lastErr = false, nil
			return true, nil
		case err != nil:
			lastErr = err
			return false, nil
		}
		bound, lastErr = got.Spec.NodeName == node && (pod.UID == "" || got.UID == pod.UID), nil
		return true, nil
	})
	if lastErr != nil {
		return false, fmt.Errorf("reading pod %s/%s back: %w", pod.Namespace, pod.Name, lastErr)
	}
	if err != nil {
		return false, fmt.Errorf("reading pod %s/%s back: %w", pod.Namespace, pod.Name, err)
	}
	return bound, nil
}

// Pending tells whether the pod's PodScheduled condition already says reason and message.
func Pending(pod *corev1.Pod, reason, message string) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			return c.Status == corev1.ConditionFalse && c.Reason == reason && c.Message == message
		}
	}
	return false
}

// MarkPending sets PodScheduled=False with reason and message and records an
// event, unless the pod already says exactly that, or says the same reason
// in a message written less than MessageRefresh ago (lastTransitionTime).
func (b *Binder) MarkPending(ctx context.Context, pod *corev1.Pod, reason, message string) error {
	if reason == reasonForbidden {
		return ErrForbiddenReason
	}
	if Pending(pod, reason, message) || b.recentlySaid(pod, reason) {
		return nil
	}
	cond := map[string]any{
		"type": corev1.PodScheduled, "status": corev1.ConditionFalse,
		"reason": reason, "message": message, "lastTransitionTime": b.clock.Now().UTC().Format(time.RFC3339),
	}
	body, _ := json.Marshal(map[string]any{"status": map[string]any{"conditions": []any{cond}}})
	if _, err := b.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, body, metav1.PatchOptions{FieldManager: b.fieldMgr}, "status"); err != nil {
		return fmt.Errorf("setting PodScheduled=%s on %s/%s: %w", reason, pod.Namespace, pod.Name, err)
	}
	typ := corev1.EventTypeWarning
	if reason == ReasonGangIncomplete {
		typ = corev1.EventTypeNormal
	}
	b.recorder.Event(pod, typ, reason, message)
	return nil
}

// recentlySaid tells whether the pod's PodScheduled condition has said
// reason for less than MessageRefresh.
func (b *Binder) recentlySaid(pod *corev1.Pod, reason string) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			return c.Status == corev1.ConditionFalse && c.Reason == reason && b.clock.Since(c.LastTransitionTime.Time) < MessageRefresh
		}
	}
	return false
}

// Evict evicts the pod through the Eviction API (PodDisruptionBudgets
// apply) and records why on the pod.
func (b *Binder) Evict(ctx context.Context, pod *corev1.Pod, reason string) error {
	return b.evict(ctx, pod, corev1.EventTypeNormal, "Reclaimed", reason)
}

// Release evicts a bound pod to give its resources back (a gang that did
// not bind whole), with a Warning event of the given reason and message.
// It evicts rather than deletes: the pod ends gracefully, its
// PodDisruptionBudget applies, and the API server adds the DisruptionTarget
// condition; the coordinator needs no right to delete pods.
func (b *Binder) Release(ctx context.Context, pod *corev1.Pod, reason, message string) error {
	return b.evict(ctx, pod, corev1.EventTypeWarning, reason, message)
}

// evict evicts the pod, preconditioned on its UID (a pod of the same name
// made since is left alone), and records the event once it succeeded.
func (b *Binder) evict(ctx context.Context, pod *corev1.Pod, eventType, reason, message string) error {
	uid := pod.UID
	ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name}}
	if uid != "" {
		ev.DeleteOptions = &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}
	}
	if err := b.client.PolicyV1().Evictions(pod.Namespace).Evict(ctx, ev); err != nil {
		return fmt.Errorf("evicting %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	b.recorder.Event(pod, eventType, reason, message)
	return nil
}
