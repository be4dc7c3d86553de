package api

import (
	"fmt"
	"strconv"
	"strings"
)

// Names of gpufrac's Dynamic Resource Allocation driver, shared by the node
// agent (which publishes the devices), the coordinator (which allocates
// claims for its pods) and kubectl-gpufrac (which shows them).
//
// Per GPU of a node in mode dra the driver publishes, in one pool named
// after the node:
//
//   - gpu-<minor> (class DRAClassGPU): the whole GPU, one claim at a time;
//   - in GPU mode fraction also gpu-<minor>-shares and gpu-<minor>-memory
//     (class DRAClassFraction), shared by any number of claims
//     (allowMultipleAllocations): the first by DRACapacityShares (percent of
//     the GPU's memory), the second by DRACapacityMemory (bytes).
//     All three consume the GPU's whole counter set gpu-<minor>-counter-set,
//     so one GPU is used one way at a time: whole, by shares or by bytes.
//   - in GPU mode mig, its MIG devices gpu-<minor>-mig-<profile>-<GI profile
//     ID>-<placement start> (class DRAClassMIG) over the GPU's memory and
//     memory-slice counters, and no whole-GPU device.
//
// Names, attributes and counters follow NVIDIA's DRA driver
// (kubernetes-sigs/dra-driver-nvidia-gpu) so selectors carry over with a
// change of domain: device.attributes["gpu.gpufrac.io"].productName.
const (
	// DRADriver is the driver name and the attribute domain.
	DRADriver = "gpu." + Domain
	// DRAClassGPU is the DeviceClass of whole GPUs.
	DRAClassGPU = "gpu." + Domain
	// DRAClassFraction is the DeviceClass of the shared views of a GPU.
	DRAClassFraction = "fraction." + Domain
	// DRAClassMIG is the DeviceClass of MIG devices.
	DRAClassMIG = "mig." + Domain

	// DRACapacityShares is the capacity of a gpu-N-shares device: percent of
	// the GPU (100), a claim's share of its memory (compute is time-shared,
	// not divided), as gpufrac.io/gpu-fraction units.
	DRACapacityShares = "shares"
	// DRACapacityMemory is the capacity (bytes) of gpu-N and gpu-N-memory,
	// and of MIG devices.
	DRACapacityMemory = "memory"

	// DRAAttrType is the device type attribute: DRATypeGPU, DRATypeFraction
	// or DRATypeMIG.
	DRAAttrType = "type"
	// DRAAttrUUID is the GPU's UUID (a MIG device's own MIG UUID).
	DRAAttrUUID = "uuid"
	// DRAAttrParentUUID is a MIG device's GPU UUID.
	DRAAttrParentUUID = "parentUUID"
	// DRAAttrIndex is NVML's index of the GPU (of the parent GPU for MIG).
	DRAAttrIndex = "index"
	// DRAAttrProductName is the GPU's product name ("NVIDIA H100 80GB HBM3").
	DRAAttrProductName = "productName"
	// DRAAttrProfile is a MIG device's profile ("1g.10gb").
	DRAAttrProfile = "profile"
	// DRAAttrSharing is a shared view's sharing: DRACapacityShares or
	// DRACapacityMemory.
	DRAAttrSharing = "sharing"
	// DRAAttrMemoryBytes is the GPU's memory in bytes, an attribute of every
	// view (selectors cannot read a capacity).
	DRAAttrMemoryBytes = "memoryBytes"
	// DRAAttrPCIBusID is the standard PCI bus ID attribute.
	DRAAttrPCIBusID = "resource.kubernetes.io/pciBusID"

	// DRATypeGPU, DRATypeFraction and DRATypeMIG are the values of DRAAttrType.
	DRATypeGPU      = "gpu"
	DRATypeFraction = "fraction"
	DRATypeMIG      = "mig"

	// DRATaintUnhealthy is the device taint on every device of a GPU the node
	// agent withdraws (a critical Xid, failing NVML queries): NoSchedule, so
	// running pods keep their devices as with the device plugin.
	DRATaintUnhealthy = DRADriver + "/unhealthy"

	// DRACDIKind is the CDI vendor/class of the per-claim CDI devices the
	// driver writes: they carry the limit a container is told
	// (GPUFRAC_MEMORY_LIMIT_MIB) and, with the device-specs
	// strategy, the GPU's device nodes.
	DRACDIKind = "k8s." + DRADriver + "/claim"
)

// DRAView is what a published device of gpufrac's driver is.
type DRAView string

// The views of a GPU.
const (
	DRAViewWhole  DRAView = "whole"
	DRAViewShares DRAView = "shares"
	DRAViewMemory DRAView = "memory"
	DRAViewMIG    DRAView = "mig"
)

// DRADeviceName names the device of view v of the GPU with the given minor
// number (not for MIG devices: see DRAMIGDeviceName).
func DRADeviceName(minor int, v DRAView) string {
	base := "gpu-" + strconv.Itoa(minor)
	switch v {
	case DRAViewShares:
		return base + "-shares"
	case DRAViewMemory:
		return base + "-memory"
	}
	return base
}

// DRAMIGDeviceName names a MIG device as NVIDIA's driver does:
// gpu-<minor>-mig-<profile without dots and plus>-<GI profile ID>-<start>.
func DRAMIGDeviceName(minor int, profile string, giProfileID, start int) string {
	p := strings.NewReplacer(".", "", "+", "", "_", "").Replace(strings.ToLower(profile))
	return fmt.Sprintf("gpu-%d-mig-%s-%d-%d", minor, p, giProfileID, start)
}

// DRACounterSet names the counter set of the GPU with the given minor number.
func DRACounterSet(minor int) string { return "gpu-" + strconv.Itoa(minor) + "-counter-set" }

// DRAMemorySliceCounter names the counter of MIG memory slice k.
func DRAMemorySliceCounter(k int) string { return "memory-slice-" + strconv.Itoa(k) }

// ParseDRADeviceName reads a device name of gpufrac's driver: the GPU's minor
// number and the view. MIG device names give DRAViewMIG.
func ParseDRADeviceName(name string) (minor int, v DRAView, err error) {
	rest, ok := strings.CutPrefix(name, "gpu-")
	if !ok {
		return 0, "", fmt.Errorf("device %q is not a gpufrac GPU device", name)
	}
	num, suffix, _ := strings.Cut(rest, "-")
	minor, err = strconv.Atoi(num)
	if err != nil || minor < 0 {
		return 0, "", fmt.Errorf("device %q is not a gpufrac GPU device", name)
	}
	switch {
	case suffix == "":
		return minor, DRAViewWhole, nil
	case suffix == "shares":
		return minor, DRAViewShares, nil
	case suffix == "memory":
		return minor, DRAViewMemory, nil
	case strings.HasPrefix(suffix, "mig-"):
		return minor, DRAViewMIG, nil
	}
	return 0, "", fmt.Errorf("device %q is not a gpufrac GPU device", name)
}
