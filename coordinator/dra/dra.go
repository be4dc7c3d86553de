// Package dra is the coordinator's side of Dynamic Resource Allocation on
// nodes whose gpufrac-node serves GPUs as the DRA driver gpu.gpufrac.io
// (mode dra): what claims hold of each GPU (for the placement snapshot and
// the queues' books), what a pod's claims ask for, and allocating them with
// k8s.io/dynamic-resource-allocation's structured allocator, the one
// kube-scheduler and Karpenter use, on the node and GPU placement chose.
//
// The coordinator allocates claims of its own pods itself, so queues, gangs,
// placement policy and reservations-by-counters apply to them as to
// extended resources. It writes what kube-scheduler writes (Writer): the
// finalizer resource.kubernetes.io/delete-protection, status.allocation and
// status.reservedFor (RBAC resourceclaims/binding), and for a pod asking
// gpufrac.io/gpu-fraction or nvidia.com/gpu placed on such a node, the
// pod's extended-resource claim and pod.status.extendedResourceClaimStatus.
// kube-controller-manager's resourceclaim controller deallocates and deletes
// them when the pod ends.
package dra

import (
	"fmt"
	"maps"
	"math"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	k8sresource "k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpufrac/gpufrac/api"
)

// MilliPerGPU is one GPU in milli-GPU, the coordinator's unit.
const MilliPerGPU = 1000

// DeviceInfo is one published device of gpufrac's driver.
type DeviceInfo struct {
	Node string // the pool (named after the node)
	Name string
	View api.DRAView
	// GPU is the physical GPU's UUID (a MIG device's parent).
	GPU string
	// MemoryBytes is the GPU's memory (the memoryBytes attribute).
	MemoryBytes int64
}

// DeviceKey names a device: pool and device name.
type DeviceKey struct{ Pool, Device string }

// Devices indexes the published devices of gpufrac's driver.
type Devices map[DeviceKey]DeviceInfo

// IndexDevices reads the devices of gpufrac's driver from slices (other
// drivers' slices are skipped).
func IndexDevices(slices []*resourceapi.ResourceSlice) Devices {
	out := Devices{}
	for _, s := range slices {
		if s.Spec.Driver != api.DRADriver {
			continue
		}
		for _, d := range s.Spec.Devices {
			_, view, err := api.ParseDRADeviceName(d.Name)
			if err != nil {
				continue
			}
			info := DeviceInfo{Node: s.Spec.Pool.Name, Name: d.Name, View: view}
			if a, ok := d.Attributes[api.DRAAttrUUID]; ok && a.StringValue != nil {
				info.GPU = *a.StringValue
			}
			if a, ok := d.Attributes[api.DRAAttrParentUUID]; ok && a.StringValue != nil {
				info.GPU = *a.StringValue
			}
			if a, ok := d.Attributes[api.DRAAttrMemoryBytes]; ok && a.IntValue != nil {
				info.MemoryBytes = *a.IntValue
			}
			out[DeviceKey{s.Spec.Pool.Name, d.Name}] = info
		}
	}
	return out
}

// GPUUse is what allocated claims hold of one GPU.
type GPUUse struct {
	// UsedMilli is the part held, 0..MilliPerGPU: a share's percent x 10,
	// bytes over the GPU's memory (rounded up), a whole GPU or any MIG
	// device all of it (MIG GPUs are not placed on).
	UsedMilli int
	// View is how the GPU is used ("" free): one way at a time.
	View api.DRAView
	// Holders are the claims holding it (namespace/name), sorted.
	Holders []string
}

// Usage is what claims hold per node and GPU UUID.
type Usage map[string]map[string]GPUUse

// Equal tells whether u and o say the same of every node and GPU.
func (u Usage) Equal(o Usage) bool {
	return maps.EqualFunc(u, o, func(a, b map[string]GPUUse) bool {
		return maps.EqualFunc(a, b, func(x, y GPUUse) bool {
			return x.UsedMilli == y.UsedMilli && x.View == y.View && slices.Equal(x.Holders, y.Holders)
		})
	})
}

// Allocated is one allocation of a claim: the claim and its result (the
// claim's status, or an allocation in flight the informer does not show
// yet).
type Allocated struct {
	Namespace, Name string
	Allocation      *resourceapi.AllocationResult
}

// AllocatedOf lists the allocations of the claims that have one.
func AllocatedOf(claims []*resourceapi.ResourceClaim) []Allocated {
	out := make([]Allocated, 0, len(claims))
	for _, c := range claims {
		if c.Status.Allocation != nil {
			out = append(out, Allocated{Namespace: c.Namespace, Name: c.Name, Allocation: c.Status.Allocation})
		}
	}
	return out
}

// UsageOf charges every allocation of gpufrac's devices to its GPU.
func UsageOf(devs Devices, allocs []Allocated) Usage {
	out := Usage{}
	for _, a := range allocs {
		for _, r := range a.Allocation.Devices.Results {
			if r.Driver != api.DRADriver || r.AdminAccess != nil && *r.AdminAccess {
				continue
			}
			info, ok := devs[DeviceKey{r.Pool, r.Device}]
			if !ok || info.GPU == "" {
				continue
			}
			if out[info.Node] == nil {
				out[info.Node] = map[string]GPUUse{}
			}
			u := out[info.Node][info.GPU]
			u.UsedMilli = min(u.UsedMilli+ResultMilli(r, info), MilliPerGPU)
			u.View = info.View
			holder := a.Namespace + "/" + a.Name
			if !slices.Contains(u.Holders, holder) {
				u.Holders = append(u.Holders, holder)
				slices.Sort(u.Holders)
			}
			out[info.Node][info.GPU] = u
		}
	}
	return out
}

// ResultMilli is what one allocation result holds of its GPU in milli-GPU.
func ResultMilli(r resourceapi.DeviceRequestAllocationResult, info DeviceInfo) int {
	switch info.View {
	case api.DRAViewShares:
		if q, ok := r.ConsumedCapacity[api.DRACapacityShares]; ok {
			return int(min(max(q.Value(), 0), api.UnitsPerGPU)) * (MilliPerGPU / api.UnitsPerGPU)
		}
	case api.DRAViewMemory:
		if q, ok := r.ConsumedCapacity[api.DRACapacityMemory]; ok && info.MemoryBytes > 0 {
			return MemoryMilli(q.Value(), info.MemoryBytes)
		}
	}
	return MilliPerGPU
}

// MemoryMilli is bytes of a GPU of gpuBytes in milli-GPU, rounded up.
func MemoryMilli(bytes, gpuBytes int64) int {
	if gpuBytes <= 0 {
		return MilliPerGPU
	}
	m := int(math.Ceil(float64(bytes) * MilliPerGPU / float64(gpuBytes)))
	return min(max(m, 1), MilliPerGPU)
}

// Ask is what a claim asks of gpufrac's GPUs.
type Ask struct {
	// GPUs is a count of whole GPUs (class gpu.gpufrac.io).
	GPUs int
	// Shares is percent of one GPU (class fraction.gpufrac.io, capacity shares).
	Shares int
	// MemoryBytes is bytes of one GPU (class fraction.gpufrac.io, capacity memory).
	MemoryBytes int64
	// MIG counts MIG devices (class mig.gpufrac.io).
	MIG int
}

// IsZero tells whether the claim asks nothing of gpufrac's GPUs.
func (a Ask) IsZero() bool { return a == Ask{} }

// AskOf reads what a claim's requests ask of gpufrac's device classes.
// Requests of other classes ask nothing of gpufrac (the allocator still
// allocates them on the chosen node). It fails on what the coordinator
// cannot place as one request of one GPU kind: firstAvailable lists, the
// All allocation mode, several GPU requests, a fraction request for more
// than one device or with both shares and memory.
func AskOf(c *resourceapi.ResourceClaim) (Ask, error) {
	var ask Ask
	kinds := 0
	for _, r := range c.Spec.Devices.Requests {
		if r.Exactly == nil {
			for _, sub := range r.FirstAvailable {
				if isGpufracClass(sub.DeviceClassName) {
					return Ask{}, fmt.Errorf("claim %s/%s: request %s lists first-available alternatives of gpufrac's classes; gpufrac-scheduler places one exact request", c.Namespace, c.Name, r.Name)
				}
			}
			continue
		}
		e := r.Exactly
		if !isGpufracClass(e.DeviceClassName) {
			continue
		}
		if e.AllocationMode == resourceapi.DeviceAllocationModeAll {
			return Ask{}, fmt.Errorf("claim %s/%s: request %s asks all devices of class %s; ask a count", c.Namespace, c.Name, r.Name, e.DeviceClassName)
		}
		count := int(e.Count)
		if count == 0 {
			count = 1
		}
		kinds++
		switch e.DeviceClassName {
		case api.DRAClassGPU:
			ask.GPUs += count
		case api.DRAClassMIG:
			ask.MIG += count
		case api.DRAClassFraction:
			if count != 1 {
				return Ask{}, fmt.Errorf("claim %s/%s: request %s asks %d devices of class %s; a fraction is one share of one GPU", c.Namespace, c.Name, r.Name, count, e.DeviceClassName)
			}
			var shares, mem *k8sresource.Quantity
			if e.Capacity != nil {
				if q, ok := e.Capacity.Requests[api.DRACapacityShares]; ok {
					shares = &q
				}
				if q, ok := e.Capacity.Requests[api.DRACapacityMemory]; ok {
					mem = &q
				}
			}
			switch {
			case shares != nil && mem != nil:
				return Ask{}, fmt.Errorf("claim %s/%s: request %s asks both shares and memory; ask one (a GPU is shared one way at a time)", c.Namespace, c.Name, r.Name)
			case shares != nil:
				ask.Shares = int(min(max(shares.Value(), 1), api.UnitsPerGPU))
			case mem != nil:
				ask.MemoryBytes = mem.Value()
			default:
				ask.Shares = api.UnitsPerGPU // the view's default: the whole GPU
			}
		}
	}
	if kinds > 1 {
		return Ask{}, fmt.Errorf("claim %s/%s asks for gpufrac's GPUs in %d requests; gpufrac-scheduler places one GPU request per pod", c.Namespace, c.Name, kinds)
	}
	return ask, nil
}

func isGpufracClass(name string) bool {
	return name == api.DRAClassGPU || name == api.DRAClassFraction || name == api.DRAClassMIG
}
