// Package schedulertest holds fakes of the scheduler's seams for tests: a
// Binder that records bindings, pending reasons, evictions and releases, and
// can be told to fail - once (NextBindErr, as Karpenter's fake cloud provider
// takes NextCreateErr) or for chosen pods every time (BindErr) - so the
// scheduler's failure paths have tests.
package schedulertest

import (
	"context"
	"errors"
	"sync"

	corev1 "k8s.io/api/core/v1"
)

// ErrInjected is the error the fakes return when told to fail without a
// particular error.
var ErrInjected = errors.New("injected failure")

// Binder fakes the scheduler's Binder, Evictor and Releaser. It is safe for
// concurrent use; read its fields directly only while no cycle or
// binding runs, else through its methods.
type Binder struct {
	mu sync.Mutex

	// Bound: pod name -> node, for successful bindings.
	Bound map[string]string
	// Annotations: pod name -> annotations written with its binding.
	Annotations map[string]map[string]string
	// Reasons and Messages: pod name -> last pending reason and message.
	Reasons, Messages map[string]string
	// Evicted lists the pods evicted, in order.
	Evicted []string
	// Released: pod name -> reason given when it was released (deleted).
	Released map[string]string
	// BindCalls, EvictCalls and ReleaseCalls count calls, failed ones included.
	BindCalls, EvictCalls, ReleaseCalls int

	// NextBindErr, NextEvictErr, NextMarkPendingErr and NextReleaseErr are
	// returned by the next call of that method, once, and then cleared.
	NextBindErr, NextEvictErr, NextMarkPendingErr, NextReleaseErr error
	// BindErr, when set, is asked before every Bind: a non-nil answer fails
	// that binding (every time it answers so).
	BindErr func(pod *corev1.Pod, node string) error
	// EvictErr, when set, is asked before every Evict likewise.
	EvictErr func(pod *corev1.Pod) error
}

// NewBinder returns an empty Binder that never fails.
func NewBinder() *Binder {
	b := &Binder{}
	b.Reset()
	return b
}

// Reset forgets everything recorded and every failure to inject.
func (b *Binder) Reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.Bound = map[string]string{}
	b.Annotations = map[string]map[string]string{}
	b.Reasons = map[string]string{}
	b.Messages = map[string]string{}
	b.Released = map[string]string{}
	b.Evicted = nil
	b.BindCalls, b.EvictCalls, b.ReleaseCalls = 0, 0, 0
	b.NextBindErr, b.NextEvictErr, b.NextMarkPendingErr, b.NextReleaseErr = nil, nil, nil, nil
	b.BindErr, b.EvictErr = nil, nil
}

func take(err *error) error {
	e := *err
	*err = nil
	return e
}

// Bind records the binding unless a failure was injected.
func (b *Binder) Bind(_ context.Context, p *corev1.Pod, node string, ann map[string]string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.BindCalls++
	if err := take(&b.NextBindErr); err != nil {
		return err
	}
	if b.BindErr != nil {
		if err := b.BindErr(p, node); err != nil {
			return err
		}
	}
	b.Bound[p.Name] = node
	b.Annotations[p.Name] = ann
	return nil
}

// MarkPending records the reason unless a failure was injected. Like the
// real binder it refuses reason Unschedulable.
func (b *Binder) MarkPending(_ context.Context, p *corev1.Pod, reason, msg string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := take(&b.NextMarkPendingErr); err != nil {
		return err
	}
	if reason == corev1.PodReasonUnschedulable {
		return errors.New("the coordinator never writes reason Unschedulable")
	}
	b.Reasons[p.Name] = reason
	b.Messages[p.Name] = msg
	return nil
}

// Evict records the eviction unless a failure was injected (as the Eviction
// API refuses with 429 when a PodDisruptionBudget forbids it).
func (b *Binder) Evict(_ context.Context, p *corev1.Pod, _ string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.EvictCalls++
	if err := take(&b.NextEvictErr); err != nil {
		return err
	}
	if b.EvictErr != nil {
		if err := b.EvictErr(p); err != nil {
			return err
		}
	}
	b.Evicted = append(b.Evicted, p.Name)
	return nil
}

// Release records that the pod was deleted to give its resources back,
// unless a failure was injected.
func (b *Binder) Release(_ context.Context, p *corev1.Pod, reason, _ string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ReleaseCalls++
	if err := take(&b.NextReleaseErr); err != nil {
		return err
	}
	b.Released[p.Name] = reason
	return nil
}

// BoundTo is the node the pod was bound to ("" if none).
func (b *Binder) BoundTo(pod string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.Bound[pod]
}

// Reason is the pod's last pending reason and message.
func (b *Binder) Reason(pod string) (reason, message string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.Reasons[pod], b.Messages[pod]
}

// EvictedPods returns a copy of the evicted pods' names.
func (b *Binder) EvictedPods() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.Evicted...)
}

// ReleasedPods returns a copy of the released pods and their reasons.
func (b *Binder) ReleasedPods() map[string]string {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[string]string, len(b.Released))
	for k, v := range b.Released {
		out[k] = v
	}
	return out
}
