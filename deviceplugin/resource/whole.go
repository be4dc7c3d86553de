package resource

import (
	"context"
	"errors"
	"fmt"

	"github.com/NVIDIA/go-gpuallocator/gpuallocator"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
)

// Whole serves GPUs as exclusive devices; the device ID is the GPU UUID.
type Whole struct {
	gpuSet
	name    string
	alloc   map[string]*gpuallocator.Device
	policy  gpuallocator.Policy
	usage   UsageSource
	reserve ReservationHint
	allocs  AllocationRecorder
}

var _ Resource = (*Whole)(nil)

// WholeOptions configures a Whole resource.
type WholeOptions struct {
	// Name defaults to nvidia.com/gpu.
	Name string
	// GPUs are the GPUs to serve whole.
	GPUs []nvidia.GPU
	// Topology holds go-gpuallocator devices (with NVLink information) for
	// the same GPUs; GPUs missing from it are still served, without topology.
	Topology []*gpuallocator.Device
	Health   HealthFunc
	// Usage tells which GPUs carry fractions or replicas, which are never
	// given whole. Without it (nil, or failing) no whole GPU is given:
	// ErrUsageUnknown.
	Usage    UsageSource
	Strategy DeviceListStrategy
	// Reservations, when set, names the GPU the coordinator wants for the
	// next reservation pod, so a one-GPU request gets that GPU.
	Reservations ReservationHint
	// Allocations, when set, is told of every allocation, so the pod gets
	// the GPUs it holds written back at once.
	Allocations AllocationRecorder
}

// ReservationHint finds the GPU the coordinator asked for in a reservation
// pod waiting for admission on this node.
type ReservationHint interface {
	ReservationGPU() (uuid string, ok bool)
	// ReservationTaken records that the GPU was handed to a reservation, so
	// the next reservation waiting on this node is asked about instead.
	ReservationTaken(uuid string)
	// ReservationOnly tells whether a one-GPU request now can only be a
	// reservation's for uuid: a reservation pod waiting for admission asks
	// for uuid, and no other pod waiting for admission here asks for whole
	// GPUs. Only then may a GPU that carries fractions be given whole - to
	// the reservation that protects them.
	ReservationOnly(ctx context.Context, uuid string) bool
}

// NewWhole builds the whole-GPU resource.
func NewWhole(o WholeOptions) *Whole {
	w := &Whole{
		gpuSet:  newGPUSet(o.GPUs, o.Health, o.Strategy),
		name:    o.Name,
		alloc:   make(map[string]*gpuallocator.Device, len(o.Topology)),
		policy:  gpuallocator.NewBestEffortPolicy(),
		usage:   o.Usage,
		reserve: o.Reservations,
		allocs:  o.Allocations,
	}
	if w.name == "" {
		w.name = api.ResourceGPU
	}
	for _, d := range o.Topology {
		if _, ok := w.gpus[d.UUID]; ok {
			w.alloc[d.UUID] = d
		}
	}
	return w
}

// Name implements Resource.
func (w *Whole) Name() string { return w.name }

// Devices implements Resource: one device per GPU.
func (w *Whole) Devices() []*pluginapi.Device {
	devs := make([]*pluginapi.Device, 0, len(w.order))
	for _, u := range w.order {
		devs = append(devs, &pluginapi.Device{ID: u, Health: healthString(w.health(u))})
	}
	return devs
}

// Preferred implements Resource. A reservation pod waiting here gets the
// GPU the coordinator chose for it. Otherwise only GPUs that carry no
// fraction units or replicas are candidates (go-gpuallocator's best-effort,
// NVLink-aware policy picks among them): a whole GPU is exclusive, and when
// too few clean GPUs are free the request fails instead of sharing one.
func (w *Whole) Preferred(ctx context.Context, available, mustInclude []string, size int) ([]string, error) {
	if size <= 0 {
		return nil, fmt.Errorf("preferred allocation of %d whole GPUs: size must be positive", size)
	}
	for _, id := range append(append([]string(nil), available...), mustInclude...) {
		if _, ok := w.gpus[id]; !ok {
			return nil, fmt.Errorf("preferred allocation: unknown GPU %q", id)
		}
	}
	usage, err := readUsage(ctx, w.usage)
	if err != nil {
		return nil, fmt.Errorf("preferred allocation of %d whole GPUs: %w", size, err)
	}
	// A reservation pod gets the GPU the coordinator chose for its fractions.
	// If another one-GPU pod is admitted first and takes it, the reservation
	// gets another GPU and the coordinator follows gpufrac.io/reserved-gpu.
	// A GPU that already carries fractions goes only to the reservation
	// (ReservationOnly).
	if w.reserve != nil && size == 1 && len(mustInclude) == 0 {
		if g, ok := w.reserve.ReservationGPU(); ok && contains(available, g) && (!usage[g].Shared() || w.reserve.ReservationOnly(ctx, g)) {
			w.reserve.ReservationTaken(g)
			return []string{g}, nil
		}
	}
	clean := make([]string, 0, len(available))
	for _, id := range available {
		if !usage[id].Shared() {
			clean = append(clean, id)
		}
	}
	for _, id := range mustInclude {
		if u := usage[id]; u.Shared() {
			return nil, fmt.Errorf("preferred allocation of %d whole GPUs: must-include GPU %s: %w", size, id, sharedError(u))
		}
	}
	if len(clean) < size {
		return nil, fmt.Errorf("preferred allocation of %d whole GPUs: only %d of the %d GPUs free for it carry no fractions or time-sliced replicas: %w",
			size, len(clean), len(available), ErrShared)
	}
	return w.pick(clean, mustInclude, size)
}

// ErrShared is returned for a whole GPU that carries fraction units or
// time-sliced replicas of other pods.
var ErrShared = errors.New("whole GPUs are exclusive, and a GPU that carries fractions or time-sliced replicas is never given whole")

func sharedError(u GPUUsage) error {
	return fmt.Errorf("it carries %d fraction units and %d time-sliced replicas: %w", u.Units, u.Replicas, ErrShared)
}

func (w *Whole) pick(available, mustInclude []string, size int) ([]string, error) {
	if len(available) < size {
		return nil, fmt.Errorf("preferred allocation of %d whole GPUs: only %d available", size, len(available))
	}
	// go-gpuallocator needs topology for every candidate; without it fall
	// back to index order, which is what the kubelet would do.
	var avail, req []*gpuallocator.Device
	topo := true
	for _, id := range available {
		d, ok := w.alloc[id]
		topo = topo && ok
		avail = append(avail, d)
	}
	for _, id := range mustInclude {
		d, ok := w.alloc[id]
		topo = topo && ok
		req = append(req, d)
	}
	if topo {
		if got := w.policy.Allocate(avail, req, size); len(got) == size {
			ids := make([]string, len(got))
			for i, d := range got {
				ids[i] = d.UUID
			}
			return ids, nil
		}
	}
	ids := append([]string(nil), mustInclude...)
	for _, u := range w.order {
		if len(ids) == size {
			break
		}
		if contains(available, u) && !contains(ids, u) {
			ids = append(ids, u)
		}
	}
	if len(ids) != size {
		return nil, fmt.Errorf("preferred allocation of %d whole GPUs: cannot satisfy must-include %v", size, mustInclude)
	}
	return ids, nil
}

// Allocate implements Resource. It refuses a GPU that carries fraction
// units or replicas of other pods (whatever chose it), except to a
// reservation pod asking for exactly that GPU (ReservationOnly), and any GPU
// while the kubelet's allocations are unknown. An allocation given is told
// to the AllocationRecorder.
func (w *Whole) Allocate(ctx context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	gs := make([]nvidia.GPU, 0, len(ids))
	for _, id := range ids {
		g, ok := w.gpus[id]
		if !ok {
			return nil, fmt.Errorf("allocating whole GPU %q: unknown device", id)
		}
		gs = append(gs, g)
	}
	usage, err := readUsage(ctx, w.usage)
	if err != nil {
		return nil, fmt.Errorf("allocating %d whole GPUs: %w", len(ids), err)
	}
	for _, id := range ids {
		u := usage[id]
		if !u.Shared() {
			continue
		}
		if len(ids) == 1 && w.reserve != nil && w.reserve.ReservationOnly(ctx, id) {
			klog.FromContext(ctx).V(2).Info("Shared GPU given to its reservation pod", "gpu", id, "units", u.Units)
			continue
		}
		return nil, fmt.Errorf("allocating whole GPU %s: %w", id, sharedError(u))
	}
	resp := WholeResponse(w.strategy, gs)
	if w.allocs != nil {
		w.allocs.DevicesAllocated(ctx, ids)
	}
	return resp, nil
}

// WholeResponse is the answer for a container holding gpus whole: access to
// them and NVIDIA_VISIBLE_DEVICES=void, no memory limit.
func WholeResponse(strategy DeviceListStrategy, gpus []nvidia.GPU) *pluginapi.ContainerAllocateResponse {
	resp := newResponse(nil)
	containerDevices(strategy, gpus, resp)
	return resp
}

func contains(s []string, x string) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}

func containsAll(s, xs []string) bool {
	for _, x := range xs {
		if !contains(s, x) {
			return false
		}
	}
	return true
}
