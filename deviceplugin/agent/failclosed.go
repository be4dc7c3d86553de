package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/gpufrac/gpufrac/api"
)

// maxConfigErrorLen bounds the reason written to the Node annotation.
const maxConfigErrorLen = 1024

// An invalid config at start fails closed: gpufrac-node serves every GPU
// whole (mode exclusive: nvidia.com/gpu only) and nothing shared - no
// fraction, time-sliced replica or MIG resource - until a valid config is
// loaded, and never reshapes MIG meanwhile. It does not fall back to the
// built-in defaults, which share GPUs (mode fraction) on a node the admin
// may have meant to keep exclusive, or partitioned differently.
//
// Whole GPUs stay served because exclusive is the one mode that shares
// nothing, so a broken config cannot open a sharing the admin did not ask
// for, while refusing them too would take every GPU workload on the node
// down for a typo. GPUs still carrying fractions or replicas from before a
// restart are not given whole (resource.Whole), and GPUs in MIG mode are
// not served.
//
// The reason is logged, counted (gpufrac_config_fail_closed = 1, and
// gpufrac_config_reloads_total{result="rejected"}), written on the Node as
// a Warning event GPUConfigRejected and the annotation
// api.AnnotationConfigError, which the next valid config removes.

// reportFailClosed says on every channel that the node fails closed.
func (a *Agent) reportFailClosed(ctx context.Context, err error) {
	klog.FromContext(ctx).Error(err, "Config unusable at start; failing closed: whole GPUs only, nothing shared, until a valid config appears", "file", a.cfg.ConfigFile)
	a.metrics.FailClosed(true)
	action := actionFailClosed
	if errors.Is(err, ErrServingChanged) {
		action = actionServingPath
	}
	a.nodeEvent(corev1.EventTypeWarning, "GPUConfigRejected", action,
		"gpufrac-node fails closed: it serves whole GPUs only (no fractions, time-sliced replicas or MIG devices) until a valid config is loaded: %v", err)
	msg := err.Error()
	if len(msg) > maxConfigErrorLen {
		msg = msg[:maxConfigErrorLen] + "..."
	}
	a.patchConfigError(ctx, &msg)
}

// reportReopened says a valid config is in force again.
func (a *Agent) reportReopened(ctx context.Context) {
	klog.FromContext(ctx).Info("A valid config is in force again; no longer failing closed")
	a.metrics.FailClosed(false)
	a.nodeEvent(corev1.EventTypeNormal, "GPUConfigApplied", actionFailClosed, "gpufrac-node serves its config again after failing closed")
	a.patchConfigError(ctx, nil)
}

// patchConfigError sets (msg) or removes (nil) the Node annotation
// api.AnnotationConfigError. A failed write is logged (the event and the
// metric still tell) and tried again by resyncNode until one succeeds or a
// newer value replaces it.
func (a *Agent) patchConfigError(ctx context.Context, msg *string) {
	if a.client == nil || a.cfg.NodeName == "" {
		return
	}
	a.cfgErrMu.Lock()
	defer a.cfgErrMu.Unlock()
	a.configErr, a.configErrStale = msg, true
	a.writeConfigErrorLocked(ctx)
}

// writeConfigErrorLocked writes configErr to the Node. a.cfgErrMu is held.
func (a *Agent) writeConfigErrorLocked(ctx context.Context) {
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]*string{api.AnnotationConfigError: a.configErr}}})
	if err != nil {
		klog.FromContext(ctx).Error(err, "Encoding the config error annotation")
		return
	}
	if _, err := a.client.CoreV1().Nodes().Patch(ctx, a.cfg.NodeName, types.MergePatchType, body, metav1.PatchOptions{FieldManager: "gpufrac-node"}); err != nil {
		klog.FromContext(ctx).Error(fmt.Errorf("patching node %s: %w", a.cfg.NodeName, err), "Writing the config error on the Node failed; will retry")
		return
	}
	a.configErrStale = false
}

// resyncNode tries again, every NodeResyncInterval (up to 10 % longer at
// random) until ctx ends, the writes of the Node's annotations that failed:
// the config error, and the GPU inventory (which publishInventory writes only when it differs from
// what it last wrote). Without it a write refused once (the API server
// restarting, or throttling every agent of a rollout) stayed missing until
// the next change: no inventory meant no fractions placed on the node.
func (a *Agent) resyncNode(ctx context.Context) error {
	interval := a.cfg.NodeResyncInterval
	if interval <= 0 {
		interval = DefaultNodeResyncInterval
	}
	// Each wait up to 10 % longer at random: a rollout's agents, refused
	// together, do not all come back at once.
	delay := wait.Backoff{Duration: interval, Jitter: 0.1}.DelayFunc()
	_ = delay.Until(ctx, false, true, func(ctx context.Context) (bool, error) {
		a.cfgErrMu.Lock()
		if a.configErrStale {
			a.writeConfigErrorLocked(ctx)
		}
		a.cfgErrMu.Unlock()
		a.publishInventory(ctx)
		return false, nil
	})
	return nil
}
