// Package dra is gpufrac-node's Dynamic Resource Allocation driver for
// nodes in mode dra: it publishes the node's GPUs as devices in
// ResourceSlices (whole GPUs, shared views by capacity, MIG devices over
// counters; see api.DRADriver for the device model) and prepares the claims
// the kubelet asks for, answering with CDI device IDs whose CDI specs carry
// the same limits a gpufrac.io/gpu-fraction container is told.
//
// The kubelet side (registration, the DRA gRPC service) is
// k8s.io/dynamic-resource-allocation's kubeletplugin helper and slice
// publishing its resourceslice controller (wired in package agent); this
// package is the kubeletplugin.DRAPlugin behind them, the pure device
// builder (Build) and the record of prepared claims that survives restarts.
package dra

import (
	"fmt"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	k8sresource "k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/config"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/mig"
)

// Limits of resource.k8s.io/v1 the builder splits slices by.
const (
	// maxDevicesPerSlice is the device limit of a slice whose devices use
	// counters or taints (128 otherwise; all of ours may).
	maxDevicesPerSlice = 64
	// maxCounterSetsPerSlice is the counter-set limit of one slice.
	maxCounterSetsPerSlice = 8
)

// GPU is one GPU as the builder needs it.
type GPU struct {
	nvidia.GPU
	// Mode is what the GPU is published as: exclusive, fraction or mig.
	Mode config.Mode
	// Healthy is false while the node agent withdraws the GPU: every device
	// of it gets the taint api.DRATaintUnhealthy.
	Healthy bool
	// MIG lists the GPU's GPU instances in mode mig (others are ignored).
	MIG []mig.GPUInstance
	// MIGEnabled tells that the GPU's MIG mode is on. A GPU in MIG mode runs
	// no work as a whole GPU, so in modes exclusive and fraction it
	// publishes nothing until its MIG mode is off (as the device plugin
	// path serves it).
	MIGEnabled bool
}

// Target is what a published device stands for.
type Target struct {
	View api.DRAView
	// GPU is the physical GPU (the parent of a MIG device).
	GPU nvidia.GPU
	// MIG is the MIG device when View is api.DRAViewMIG.
	MIG mig.Device
	// MemoryBytes is the memory the device offers: the GPU's (rounded down
	// to whole MiB), or the MIG instance's.
	MemoryBytes uint64
}

// Published is what Build made: the pool to publish and what each device
// name stands for.
type Published struct {
	Resources resourceslice.DriverResources
	// Targets: device name -> what it stands for.
	Targets map[string]Target
}

// WithoutUnhealthy returns gpus without the unhealthy ones: what to publish
// when the cluster cannot carry device taints (a GPU that cannot be tainted
// is withdrawn by leaving it out, as the device plugin withdraws it).
func WithoutUnhealthy(gpus []GPU) []GPU {
	return slices.DeleteFunc(slices.Clone(gpus), func(g GPU) bool { return !g.Healthy })
}

// Build turns the node's GPUs into the driver's pool for node: one pool
// named after the node, counter sets in slices of their own (at most 8 per
// slice), then the devices (at most 64 per slice) GPU by GPU in index order,
// so first-fit allocators fill GPU 0 first. It fails on a mode the driver
// cannot publish (timeslice). A GPU in mode mig with no clean GPU instance
// publishes nothing, nor does a GPU in mode exclusive or fraction whose MIG
// mode is on.
func Build(node string, gpus []GPU) (Published, error) {
	out := Published{Targets: map[string]Target{}}
	var sets []resourceapi.CounterSet
	var devs []resourceapi.Device
	ordered := slices.Clone(gpus)
	slices.SortStableFunc(ordered, func(a, b GPU) int { return a.Index - b.Index })
	for _, g := range ordered {
		mem := roundDownMiB(g.MemoryBytes)
		if g.MIGEnabled && (g.Mode == config.ModeExclusive || g.Mode == config.ModeFraction) {
			continue
		}
		switch g.Mode {
		case config.ModeExclusive:
			d := gpuDevice(g, api.DRAViewWhole, mem)
			devs = append(devs, d)
			out.Targets[d.Name] = Target{View: api.DRAViewWhole, GPU: g.GPU, MemoryBytes: mem}
		case config.ModeFraction:
			set := api.DRACounterSet(g.Minor)
			sets = append(sets, resourceapi.CounterSet{Name: set, Counters: map[string]resourceapi.Counter{
				api.DRACapacityMemory: {Value: bytesQuantity(mem)},
			}})
			for _, v := range []api.DRAView{api.DRAViewWhole, api.DRAViewShares, api.DRAViewMemory} {
				d := gpuDevice(g, v, mem)
				d.ConsumesCounters = []resourceapi.DeviceCounterConsumption{{CounterSet: set,
					Counters: map[string]resourceapi.Counter{api.DRACapacityMemory: {Value: bytesQuantity(mem)}}}}
				devs = append(devs, d)
				out.Targets[d.Name] = Target{View: v, GPU: g.GPU, MemoryBytes: mem}
			}
		case config.ModeMIG:
			set, migDevs, targets := migDevices(g, mem)
			if len(migDevs) == 0 {
				continue
			}
			sets = append(sets, set)
			devs = append(devs, migDevs...)
			for name, t := range targets {
				out.Targets[name] = t
			}
		default:
			return Published{}, fmt.Errorf("publishing GPU %d: mode %q is not served through DRA (want exclusive, fraction or mig)", g.Index, g.Mode)
		}
	}
	pool := resourceslice.Pool{}
	for chunk := range slices.Chunk(sets, maxCounterSetsPerSlice) {
		pool.Slices = append(pool.Slices, resourceslice.Slice{SharedCounters: chunk})
	}
	for chunk := range slices.Chunk(devs, maxDevicesPerSlice) {
		pool.Slices = append(pool.Slices, resourceslice.Slice{Devices: chunk})
	}
	out.Resources = resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{node: pool}}
	return out, nil
}

// gpuDevice is view v of g (whole, shares or memory).
func gpuDevice(g GPU, v api.DRAView, mem uint64) resourceapi.Device {
	typ := api.DRATypeGPU
	if v != api.DRAViewWhole {
		typ = api.DRATypeFraction
	}
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		api.DRAAttrType:        {StringValue: ptr.To(typ)},
		api.DRAAttrUUID:        {StringValue: ptr.To(g.UUID)},
		api.DRAAttrIndex:       {IntValue: ptr.To(int64(g.Index))},
		api.DRAAttrProductName: {StringValue: ptr.To(g.Name)},
		api.DRAAttrMemoryBytes: {IntValue: ptr.To(int64(mem))},
	}
	if g.PCIBusID != "" {
		attrs[api.DRAAttrPCIBusID] = resourceapi.DeviceAttribute{StringValue: ptr.To(g.PCIBusID)}
	}
	d := resourceapi.Device{Name: api.DRADeviceName(g.Minor, v), Attributes: attrs}
	switch v {
	case api.DRAViewWhole:
		d.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			api.DRACapacityMemory: {Value: bytesQuantity(mem)},
		}
	case api.DRAViewShares:
		// A claim names its percent; one that names none takes the GPU.
		attrs[api.DRAAttrSharing] = resourceapi.DeviceAttribute{StringValue: ptr.To(api.DRACapacityShares)}
		d.AllowMultipleAllocations = ptr.To(true)
		d.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			api.DRACapacityShares: {
				Value: *k8sresource.NewQuantity(api.UnitsPerGPU, k8sresource.DecimalSI),
				RequestPolicy: &resourceapi.CapacityRequestPolicy{
					Default: k8sresource.NewQuantity(api.UnitsPerGPU, k8sresource.DecimalSI),
					ValidRange: &resourceapi.CapacityRequestPolicyRange{
						Min:  k8sresource.NewQuantity(1, k8sresource.DecimalSI),
						Max:  k8sresource.NewQuantity(api.UnitsPerGPU, k8sresource.DecimalSI),
						Step: k8sresource.NewQuantity(1, k8sresource.DecimalSI),
					},
				},
			},
		}
	case api.DRAViewMemory:
		// Bytes, rounded up to whole MiB (the limit containers are told is
		// in MiB); one that names none takes the GPU.
		attrs[api.DRAAttrSharing] = resourceapi.DeviceAttribute{StringValue: ptr.To(api.DRACapacityMemory)}
		d.AllowMultipleAllocations = ptr.To(true)
		d.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			api.DRACapacityMemory: {
				Value: bytesQuantity(mem),
				RequestPolicy: &resourceapi.CapacityRequestPolicy{
					Default: ptr.To(bytesQuantity(mem)),
					ValidRange: &resourceapi.CapacityRequestPolicyRange{
						Min:  ptr.To(bytesQuantity(1 << 20)),
						Max:  ptr.To(bytesQuantity(mem)),
						Step: ptr.To(bytesQuantity(1 << 20)),
					},
				},
			},
		}
	}
	if !g.Healthy {
		d.Taints = []resourceapi.DeviceTaint{unhealthyTaint()}
	}
	return d
}

// migDevices publishes the clean GPU instances of g (one compute instance
// spanning the instance, the shape the layout manager makes) over a counter
// set with the GPU's memory and one counter per memory slice an instance
// covers. Instances with several compute instances are not published.
func migDevices(g GPU, mem uint64) (resourceapi.CounterSet, []resourceapi.Device, map[string]Target) {
	setName := api.DRACounterSet(g.Minor)
	set := resourceapi.CounterSet{Name: setName, Counters: map[string]resourceapi.Counter{
		api.DRACapacityMemory: {Value: bytesQuantity(mem)},
	}}
	instances := slices.Clone(g.MIG)
	slices.SortFunc(instances, func(a, b mig.GPUInstance) int { return a.Placement.Start - b.Placement.Start })
	var devs []resourceapi.Device
	targets := map[string]Target{}
	for _, gi := range instances {
		if !gi.Clean() {
			continue
		}
		md := gi.Devices[0]
		imem := min(roundDownMiB(gi.MemoryBytes), mem)
		consumed := map[string]resourceapi.Counter{api.DRACapacityMemory: {Value: bytesQuantity(imem)}}
		for k := gi.Placement.Start; k < gi.Placement.End(); k++ {
			name := api.DRAMemorySliceCounter(k)
			set.Counters[name] = resourceapi.Counter{Value: *k8sresource.NewQuantity(1, k8sresource.DecimalSI)}
			consumed[name] = resourceapi.Counter{Value: *k8sresource.NewQuantity(1, k8sresource.DecimalSI)}
		}
		d := resourceapi.Device{
			Name: api.DRAMIGDeviceName(g.Minor, gi.Profile, gi.ProfileID, gi.Placement.Start),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				api.DRAAttrType:        {StringValue: ptr.To(api.DRATypeMIG)},
				api.DRAAttrUUID:        {StringValue: ptr.To(md.UUID)},
				api.DRAAttrParentUUID:  {StringValue: ptr.To(g.UUID)},
				api.DRAAttrIndex:       {IntValue: ptr.To(int64(g.Index))},
				api.DRAAttrProductName: {StringValue: ptr.To(g.Name)},
				api.DRAAttrProfile:     {StringValue: ptr.To(gi.Profile)},
				api.DRAAttrMemoryBytes: {IntValue: ptr.To(int64(imem))},
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				api.DRACapacityMemory: {Value: bytesQuantity(imem)},
			},
			ConsumesCounters: []resourceapi.DeviceCounterConsumption{{CounterSet: setName, Counters: consumed}},
		}
		if !g.Healthy {
			d.Taints = []resourceapi.DeviceTaint{unhealthyTaint()}
		}
		devs = append(devs, d)
		targets[d.Name] = Target{View: api.DRAViewMIG, GPU: g.GPU, MIG: md, MemoryBytes: imem}
	}
	return set, devs, targets
}

func unhealthyTaint() resourceapi.DeviceTaint {
	return resourceapi.DeviceTaint{Key: api.DRATaintUnhealthy, Effect: resourceapi.DeviceTaintEffectNoSchedule}
}

func roundDownMiB(b uint64) uint64 { return b &^ (1<<20 - 1) }

func bytesQuantity(b uint64) k8sresource.Quantity {
	return *k8sresource.NewQuantity(int64(b), k8sresource.BinarySI)
}
