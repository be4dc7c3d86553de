package agent

import (
	"context"
	"encoding/json"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/config"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/mig"
)

// publishInventory writes the node's GPUs, their modes and health to the
// Node annotation api.AnnotationGPUInventory, for the coordinator: with a
// GPU in mode mig its MIG devices (profile, UUID, resource, memory), with a
// GPU in mode timeslice its replicas and their resource, so the coordinator
// can charge queues for them in GPU terms. A GPU is unhealthy there while
// the health checker says so, and while NVML cannot read its MIG mode or,
// with MIG on, its MIG devices (both paths then withdraw it:
// resource.Build, migEnabled, migInstances), so that the coordinator
// places nothing on a GPU the node does not serve. It is a
// no-op without API access; failures are logged and retried (resyncNode),
// never fatal.
func (a *Agent) publishInventory(ctx context.Context) {
	if a.client == nil || a.cfg.NodeName == "" {
		return
	}
	a.invMu.Lock()
	defer a.invMu.Unlock()
	modes := a.modes
	np := a.policy.Load()
	inv := make([]api.GPUInfo, len(a.gpus))
	for i, g := range a.gpus {
		healthy := (a.checker == nil || a.checker.Healthy(g.UUID)) && a.migReadable(ctx, g)
		inv[i] = api.GPUInfo{UUID: g.UUID, Index: g.Index, Model: g.Name, MemoryMiB: g.MemoryMiB(), Healthy: healthy}
		if i < len(modes) {
			inv[i].Mode = string(modes[i])
		}
		if a.dra != nil {
			inv[i].Driver = api.DRADriver
		}
		switch {
		case np == nil:
		case inv[i].Mode == string(config.ModeMIG):
			inv[i].MIGDevices = a.migDevices(ctx, g, np)
		case inv[i].Mode == string(config.ModeTimeslice):
			sh := np.Policy.Timeslice.Sharing()
			inv[i].Replicas, inv[i].ReplicaResource = sh.Replicas, sh.ResourceName
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
		klog.FromContext(ctx).Error(fmt.Errorf("patching node %s: %w", a.cfg.NodeName, err), "Publishing GPU inventory failed; will retry")
		return
	}
	a.lastInventory = val
	klog.FromContext(ctx).V(2).Info("Published GPU inventory", "node", a.cfg.NodeName, "gpus", len(inv))
}

// migReadable tells whether NVML can read the GPU's MIG mode and, while
// it is on, its MIG devices (true for a GPU without MIG, or without a
// MIG-capable backend).
func (a *Agent) migReadable(ctx context.Context, g nvidia.GPU) bool {
	lib, ok := a.lib.(nvidia.MIGLib)
	if !ok || !g.MIGCapable {
		return true
	}
	mode, err := lib.MIGMode(g.UUID)
	if err == nil && mode.Current {
		_, err = lib.MIGInstances(g.UUID)
	}
	if err != nil {
		klog.FromContext(ctx).V(2).Info("GPU published as unhealthy: its MIG state cannot be read", "gpu", g.UUID, "err", err)
		return false
	}
	return true
}

// migDevices lists a GPU's current MIG devices as NVML reports them, named
// by the resource the policy's MIG strategy serves them as. It is empty
// while MIG is off on the GPU, and when NVML cannot tell (logged): the
// coordinator then knows the GPU's mode but not what its devices are worth,
// and charges them by their profile name.
func (a *Agent) migDevices(ctx context.Context, g nvidia.GPU, np *config.NodePolicy) []api.MIGDeviceInfo {
	lib, ok := a.lib.(nvidia.MIGLib)
	if !ok || !g.MIGCapable {
		return nil
	}
	logger := klog.FromContext(ctx)
	mode, err := lib.MIGMode(g.UUID)
	if err != nil {
		logger.V(2).Info("MIG devices left out of the GPU inventory", "gpu", g.UUID, "err", err)
		return nil
	}
	if !mode.Current {
		return nil
	}
	instances, err := lib.MIGInstances(g.UUID)
	if err != nil {
		logger.V(2).Info("MIG devices left out of the GPU inventory", "gpu", g.UUID, "err", err)
		return nil
	}
	strategy := np.Policy.MIG.Strategy
	if strategy == "" {
		strategy = config.DefaultMIGStrategy
	}
	var out []api.MIGDeviceInfo
	for _, gi := range instances {
		for _, d := range gi.Devices {
			res := mig.ResourceName(d.Profile)
			if strategy == config.MIGStrategySingle {
				res = api.ResourceGPU
			}
			out = append(out, api.MIGDeviceInfo{UUID: d.UUID, Profile: d.Profile, Resource: res, MemoryMiB: d.MemoryBytes >> 20})
		}
	}
	return out
}
