package api

import (
	"encoding/json"
	"fmt"
)

// AnnotationGPUInventory is the Node annotation where gpufrac-node publishes
// the node's GPUs (a JSON list of GPUInfo), so the coordinator knows each
// GPU's UUID, model, memory and sharing mode.
const AnnotationGPUInventory = Domain + "/gpus"

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
