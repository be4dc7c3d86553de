package agent

import (
	"context"
	"encoding/json"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/gpufrac/gpufrac/api"
)

// publishInventory writes the node's GPUs, their modes and health to the
// Node annotation api.AnnotationGPUInventory, for the coordinator. It is a
// no-op without API access; failures are logged and retried on the next
// change, never fatal.
func (a *Agent) publishInventory(ctx context.Context) {
	if a.client == nil || a.cfg.NodeName == "" {
		return
	}
	a.invMu.Lock()
	defer a.invMu.Unlock()
	modes := a.modes
	inv := make([]api.GPUInfo, len(a.gpus))
	for i, g := range a.gpus {
		inv[i] = api.GPUInfo{UUID: g.UUID, Index: g.Index, Model: g.Name, MemoryMiB: g.MemoryMiB(), Healthy: a.checker == nil || a.checker.Healthy(g.UUID)}
		if i < len(modes) {
			inv[i].Mode = string(modes[i])
		}
	}
	val, err := api.EncodeInventory(inv)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Encoding GPU inventory")
		return
	}
	if val == a.lastInventory {
		return
	}
	body, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{api.AnnotationGPUInventory: val}}})
	if _, err := a.client.CoreV1().Nodes().Patch(ctx, a.cfg.NodeName, types.MergePatchType, body, metav1.PatchOptions{FieldManager: "gpufrac-node"}); err != nil {
		klog.FromContext(ctx).Error(fmt.Errorf("patching node %s: %w", a.cfg.NodeName, err), "Publishing GPU inventory failed")
		return
	}
	a.lastInventory = val
	klog.FromContext(ctx).V(2).Info("Published GPU inventory", "node", a.cfg.NodeName, "gpus", len(inv))
}
