package resource

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"

	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
)

// Fraction serves each shareable GPU as api.UnitsPerGPU units
// ("<uuid>::<k>"). One request is always served by units of ONE GPU.
type Fraction struct {
	gpuSet
	name  string
	units map[string]unitID // device ID -> GPU and unit index
	usage UsageSource
	hint  PodHint
}

type unitID struct {
	gpu string
	k   int
}

var _ Resource = (*Fraction)(nil)

// FractionOptions configures a Fraction resource.
type FractionOptions struct {
	// Name defaults to gpufrac.io/gpu-fraction.
	Name string
	// GPUs are the GPUs offered as fractions.
	GPUs   []nvidia.GPU
	Health HealthFunc
	// Usage keeps fractions off GPUs held whole by a pod other than a
	// gpufrac reservation. Without it (nil, or failing) no fraction is
	// given: ErrUsageUnknown.
	Usage UsageSource
	// Hint, when set, finds the GPU the coordinator chose for the pod, and
	// refuses fractions asked by init containers.
	Hint     PodHint
	Strategy DeviceListStrategy
}

// NewFraction builds the fraction resource.
func NewFraction(o FractionOptions) *Fraction {
	f := &Fraction{
		gpuSet: newGPUSet(o.GPUs, o.Health, o.Strategy),
		name:   o.Name,
		units:  make(map[string]unitID, len(o.GPUs)*api.UnitsPerGPU),
		usage:  o.Usage,
		hint:   o.Hint,
	}
	if f.name == "" {
		f.name = api.ResourceFraction
	}
	for _, g := range f.order {
		for k := 0; k < api.UnitsPerGPU; k++ {
			f.units[UnitID(g, k)] = unitID{gpu: g, k: k}
		}
	}
	return f
}

// Name implements Resource.
func (f *Fraction) Name() string { return f.name }

// Devices implements Resource: api.UnitsPerGPU devices per GPU, sharing the GPU's health.
func (f *Fraction) Devices() []*pluginapi.Device {
	devs := make([]*pluginapi.Device, 0, len(f.order)*api.UnitsPerGPU)
	for _, u := range f.order {
		h := healthString(f.health(u))
		for k := 0; k < api.UnitsPerGPU; k++ {
			devs = append(devs, &pluginapi.Device{ID: UnitID(u, k), Health: h})
		}
	}
	return devs
}

// ErrTooManyUnits is returned for a request above one GPU's worth of units.
var ErrTooManyUnits = fmt.Errorf("a fraction request may ask for at most %d units (one GPU)", api.UnitsPerGPU)

// Preferred implements Resource. The GPU is, in order:
//
//  1. the GPU the pod hint names (the coordinator's choice, recorded on a
//     pod waiting for admission), honoured only when a reservation pod holds
//     that GPU (so no other pod holds it whole) and it has room: the hint
//     comes from a pod annotation, which is untrusted input where the
//     admission policies are missing, and a reservation marks exactly the
//     GPUs the coordinator shares;
//  2. else the best-fitting GPU (fewest free units that still fit) that no
//     pod other than a reservation holds whole and that carries no
//     time-sliced replicas (left by an earlier mode).
//
// Without the kubelet's allocations (ErrUsageUnknown) it refuses.
func (f *Fraction) Preferred(ctx context.Context, available, mustInclude []string, size int) ([]string, error) {
	if size <= 0 {
		return nil, fmt.Errorf("preferred allocation of %d units: size must be positive", size)
	}
	if size > api.UnitsPerGPU {
		return nil, fmt.Errorf("preferred allocation of %d units: %w", size, ErrTooManyUnits)
	}
	free := make(map[string][]int, len(f.order)) // GPU UUID -> free unit indices
	for _, id := range available {
		u, ok := f.units[id]
		if !ok {
			return nil, fmt.Errorf("preferred allocation: unknown device %q", id)
		}
		free[u.gpu] = append(free[u.gpu], u.k)
	}
	var pinned string
	if len(mustInclude) > 0 {
		g, err := GPUOfUnits(mustInclude)
		if err != nil {
			return nil, fmt.Errorf("preferred allocation: must-include devices: %w", err)
		}
		pinned = g
	}
	usage, err := readUsage(ctx, f.usage)
	if err != nil {
		return nil, fmt.Errorf("preferred allocation of %d units: %w", size, err)
	}

	gpu := ""
	if f.hint != nil && pinned == "" {
		// GPUFor first: it waits for the pod informer when the kubelet
		// admits a pod the informer has not shown yet, which Refusal needs too.
		g, ok := f.hint.GPUFor(size)
		if err := f.hint.Refusal(size); err != nil {
			return nil, fmt.Errorf("preferred allocation of %d units: %w", size, err)
		}
		if ok && len(free[g]) >= size && f.health(g) && usage[g].WholeHolderIsReservation && usage[g].Replicas == 0 {
			gpu = g
		} else if ok {
			klog.FromContext(ctx).V(2).Info("Pod hint not honoured: its GPU is not held by a reservation, or has no room", "gpu", g, "units", size, "free", len(free[g]), "wholeHolder", usage[g].WholeHolder)
		}
	}
	if gpu == "" {
		gpu = f.bestFit(free, usage, pinned, size)
	}
	if gpu == "" {
		return nil, fmt.Errorf("no GPU on this node has %d free fraction units and is not held whole by another pod", size)
	}

	ks := free[gpu]
	sort.Ints(ks)
	ids := append(make([]string, 0, size), mustInclude...)
	for _, k := range ks {
		if len(ids) == size {
			break
		}
		id := UnitID(gpu, k)
		if !contains(mustInclude, id) {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// bestFit returns the GPU with the fewest free units that still holds size,
// skipping GPUs held whole by a pod that is not a reservation; "" if none.
func (f *Fraction) bestFit(free map[string][]int, usage map[string]GPUUsage, pinned string, size int) string {
	// Among GPUs with equally few free units, one held by a reservation
	// wins over one nothing holds: with the coordinator, fractions belong on
	// reserved GPUs, where no whole-GPU pod can be given the GPU later.
	best, bestFree, bestReserved := "", api.UnitsPerGPU+1, false
	for _, g := range f.order {
		n := len(free[g])
		if n < size || (pinned != "" && g != pinned) || !f.health(g) {
			continue
		}
		u := usage[g]
		if u.HeldWholeByOther() || u.Replicas > 0 {
			continue // held whole, or time-sliced since an earlier mode
		}
		if n < bestFree || (n == bestFree && u.WholeHolderIsReservation && !bestReserved) {
			best, bestFree, bestReserved = g, n, u.WholeHolderIsReservation
		}
	}
	return best
}

// ErrHeldWhole is returned for fraction units of a GPU that a pod other
// than a reservation holds whole.
var ErrHeldWhole = errors.New("the GPU is held whole by another pod")

// Allocate implements Resource: device access to the one GPU behind ids and
// the memory and compute limits of the fraction. It refuses units of a GPU
// another pod (not a reservation) holds whole, whatever chose them, units
// while the kubelet's allocations are unknown, and sizes the pods waiting
// here ask only in init containers (PodHint.Refusal).
func (f *Fraction) Allocate(ctx context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	n := len(ids)
	if n > api.UnitsPerGPU {
		return nil, fmt.Errorf("allocating %d units: %w", n, ErrTooManyUnits)
	}
	uuid, err := GPUOfUnits(ids)
	if err != nil {
		return nil, fmt.Errorf("allocating %d units: %w", n, err)
	}
	g, ok := f.gpus[uuid]
	if !ok {
		return nil, fmt.Errorf("allocating %d units: unknown GPU %s", n, uuid)
	}
	usage, err := readUsage(ctx, f.usage)
	if err != nil {
		return nil, fmt.Errorf("allocating %d units of %s: %w", n, uuid, err)
	}
	if u := usage[uuid]; u.HeldWholeByOther() {
		return nil, fmt.Errorf("allocating %d units of %s: %w (%s)", n, uuid, ErrHeldWhole, u.WholeHolder)
	} else if u.Replicas > 0 {
		return nil, fmt.Errorf("allocating %d units of %s: it carries %d time-sliced replicas: %w", n, uuid, u.Replicas, ErrHeldOrShared)
	}
	if f.hint != nil {
		if err := f.hint.Refusal(n); err != nil {
			return nil, fmt.Errorf("allocating %d units: %w", n, err)
		}
	}
	resp := SharedResponse(f.strategy, g, MemoryLimitMiB(g, n))
	if f.hint != nil {
		f.hint.Allocated(ctx, uuid, n)
	}
	return resp, nil
}

// SharedResponse is the answer for a container sharing GPU g: access to g,
// NVIDIA_VISIBLE_DEVICES=void and GPUFRAC_MEMORY_LIMIT_MIB, the limit the
// memory watchdog enforces (from its own record of the devices held, never
// from this variable; the container is told it to size itself). The
// fraction resource and the DRA driver's shared views both answer with it,
// so a claim's container sees exactly what a gpufrac.io/gpu-fraction
// container sees.
//
// No CUDA_MPS_* variable is set: no MPS control daemon runs for shared
// GPUs, and without one CUDA ignores them, so they would promise a compute
// share and a pinned memory limit that nothing applies (issue 25).
func SharedResponse(strategy DeviceListStrategy, g nvidia.GPU, limitMiB uint64) *pluginapi.ContainerAllocateResponse {
	resp := newResponse(map[string]string{api.EnvMemoryLimitMiB: strconv.FormatUint(limitMiB, 10)})
	containerDevices(strategy, []nvidia.GPU{g}, resp)
	return resp
}

// MemoryLimitMiB is the GPU memory a fraction of units may use: units percent
// of the GPU's total memory, rounded down to whole MiB.
func MemoryLimitMiB(g nvidia.GPU, units int) uint64 {
	return g.MemoryMiB() * uint64(units) / api.UnitsPerGPU
}
