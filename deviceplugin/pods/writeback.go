package pods

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// writeBackResync is the write-back's period when nothing kicks it.
const writeBackResync = 2 * time.Second

// writeBackRetries are the waits between the write-back passes that follow
// a kick (an Allocate answer) while the kubelet has not listed every
// allocation the hint was told of: the kubelet records an allocation only
// after the Allocate RPC returns, so the pass the kick runs at once often
// finds nothing yet. The next pass, 50 ms later, usually does. The burst
// ends at the first pass that finds nothing missing, or after the last
// wait, and the loop goes back to writeBackResync: it never spins while
// nothing is pending.
func writeBackRetries() []time.Duration {
	return []time.Duration{50 * time.Millisecond, 150 * time.Millisecond, 400 * time.Millisecond, time.Second}
}

// writeBackLoop runs the write-back until ctx ends: every resync period,
// at once when an allocation kicks it, and after a kick again after each
// of h.retries while the kubelet has not listed every allocation it was
// told of (or the pass failed).
func (h *Hint) writeBackLoop(ctx context.Context) {
	logger := klog.FromContext(ctx)
	t := h.clock.NewTicker(h.resync)
	defer t.Stop()
	next := len(h.retries) // the burst's next wait; len(h.retries): no burst
	for {
		pending, err := h.writeBack(ctx)
		if err != nil {
			logger.V(2).Info("Writing back allocated GPUs failed; will retry", "err", err)
		}
		var retry clock.Timer
		var retryC <-chan time.Time
		if next < len(h.retries) && (pending || err != nil) {
			retry = h.clock.NewTimer(h.retries[next])
			retryC = retry.C()
			next++
		} else {
			next = len(h.retries)
		}
		select {
		case <-ctx.Done():
		case <-t.C():
		case <-retryC:
		case <-h.kick:
			next = 0
		}
		if retry != nil {
			retry.Stop()
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// kickWriteBack drops the PodResources cache and asks the write-back loop
// to run now (a kick already waiting covers this one).
func (h *Hint) kickWriteBack() {
	if h.podRes != nil {
		h.podRes.Invalidate()
	}
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// retrySpan is the length of a whole burst of retries: devices awaited
// longer than this stop keeping the burst going.
func (h *Hint) retrySpan() time.Duration {
	var span time.Duration
	for _, d := range h.retries {
		span += d
	}
	return span
}

// writeBack reads the kubelet's PodResources into the ledger and patches
// each pod with the annotations the ledger says it lacks (ledger.writes).
// pending tells whether the listing still lacks an allocation the hint was
// told of (ledger.pending); it is true when the listing fails.
func (h *Hint) writeBack(ctx context.Context) (pending bool, err error) {
	h.podRes.Invalidate()
	as, err := h.podRes.List(ctx)
	if err != nil {
		return true, err
	}
	li := newListing(as)
	h.mu.Lock()
	h.ledger.setListing(li)
	h.mu.Unlock()
	pods, err := h.pods.list()
	if err != nil {
		return true, fmt.Errorf("listing pods from the informer: %w", err)
	}
	h.mu.Lock()
	now := h.clock.Now()
	h.ledger.reconcile(pods, now)
	pending = h.ledger.pending(now, h.retrySpan())
	writes := h.ledger.writes()
	h.mu.Unlock()

	var firstErr error
	for _, w := range writes {
		body, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": w.anns}})
		if err != nil {
			return true, fmt.Errorf("encoding annotations of pod %s: %w", klog.KObj(w.pod), err)
		}
		opts := metav1.PatchOptions{FieldManager: "gpufrac-node"}
		if _, err := h.client.CoreV1().Pods(w.pod.Namespace).Patch(ctx, w.pod.Name, types.MergePatchType, body, opts); err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("annotating pod %s: %w", klog.KObj(w.pod), err)
			}
			continue
		}
		h.mu.Lock()
		h.ledger.markSent(w)
		h.mu.Unlock()
		klog.FromContext(ctx).V(2).Info("Wrote back GPU", "pod", klog.KObj(w.pod), "annotations", w.anns)
	}
	return pending || firstErr != nil, firstErr
}
