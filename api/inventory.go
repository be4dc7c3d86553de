package api

import (
	"encoding/json"
	"fmt"
)

// AnnotationGPUInventory is the Node annotation where gpufrac-node publishes
// the node's GPUs (a JSON list of GPUInfo), so the coordinator knows each
// GPU's UUID, model, memory and sharing mode, and what a MIG device or a
// time-sliced replica of it is worth in GPU terms.
const AnnotationGPUInventory = Domain + "/gpus"

// milliPerGPU is one GPU in milli-GPU, the coordinator's unit of GPU quota.
const milliPerGPU = 1000

// GPUInfo is one GPU in the node inventory.
type GPUInfo struct {
	UUID      string `json:"uuid"`
	Index     int    `json:"index"`
	Model     string `json:"model"`
	MemoryMiB uint64 `json:"memoryMiB"`
	// Mode is the GPU's sharing mode: exclusive, fraction, timeslice or mig.
	Mode string `json:"mode"`
	// Healthy is false while the node agent withdraws the GPU.
	Healthy bool `json:"healthy"`
	// MIGDevices are the GPU's MIG devices in mode mig, as NVML lists them.
	// While the GPU drains for a new layout they are its old devices, which
	// the node no longer serves: the node's allocatable says what is served.
	MIGDevices []MIGDeviceInfo `json:"migDevices,omitempty"`
	// Replicas is how many time-sliced replicas the GPU is served as in mode
	// timeslice, 0 otherwise.
	Replicas int `json:"replicas,omitempty"`
	// ReplicaResource is the resource the replicas are served as
	// (DefaultTimesliceResource unless the node's config renames it).
	ReplicaResource string `json:"replicaResource,omitempty"`
	// Driver is DRADriver when the node serves its GPUs through Dynamic
	// Resource Allocation (mode dra; Mode then says what the GPU is
	// published as), "" when through device plugins.
	Driver string `json:"driver,omitempty"`
}

// MIGDeviceInfo is one MIG device of a GPU.
type MIGDeviceInfo struct {
	// UUID is the MIG device UUID ("MIG-..."), its device ID in the kubelet.
	UUID string `json:"uuid"`
	// Profile is the MIG profile ("1g.10gb", "1g.10gb+me").
	Profile string `json:"profile"`
	// Resource is the resource the device is served as:
	// nvidia.com/mig-<profile> in the mixed strategy, nvidia.com/gpu in the
	// single strategy.
	Resource string `json:"resource"`
	// MemoryMiB is the memory of the device's GPU instance.
	MemoryMiB uint64 `json:"memoryMiB"`
}

// MIGShareMilli is the part of the GPU a MIG device of it takes, in
// milli-GPU: the device's memory over the GPU's, rounded to the nearest
// milli, at least 1 (a 1g.10gb device of an 80 GB H100 is 125).
func (g GPUInfo) MIGShareMilli(d MIGDeviceInfo) int64 {
	if g.MemoryMiB == 0 {
		return 1
	}
	m := int64((d.MemoryMiB*milliPerGPU + g.MemoryMiB/2) / g.MemoryMiB)
	return min(max(m, 1), milliPerGPU)
}

// ReplicaShareMilli is the part of the GPU one time-sliced replica takes,
// in milli-GPU: 1000 / Replicas rounded to the nearest milli, at least 1;
// 0 when the GPU is not time-sliced.
func (g GPUInfo) ReplicaShareMilli() int64 {
	if g.Replicas <= 0 {
		return 0
	}
	return max(int64((milliPerGPU+g.Replicas/2)/g.Replicas), 1)
}

// EncodeInventory renders an inventory for the annotation.
func EncodeInventory(gpus []GPUInfo) (string, error) {
	b, err := json.Marshal(gpus)
	if err != nil {
		return "", fmt.Errorf("encoding GPU inventory: %w", err)
	}
	return string(b), nil
}

// DecodeInventory parses the annotation's value.
func DecodeInventory(s string) ([]GPUInfo, error) {
	var gpus []GPUInfo
	if err := json.Unmarshal([]byte(s), &gpus); err != nil {
		return nil, fmt.Errorf("decoding GPU inventory %q: %w", s, err)
	}
	return gpus, nil
}
