package resource

import (
	"context"
	"fmt"

	"github.com/NVIDIA/go-gpuallocator/gpuallocator"
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
	// Usage, when set, lets Preferred keep GPUs that carry fractions out of
	// whole-GPU allocations while clean GPUs remain.
	Usage    UsageSource
	Strategy DeviceListStrategy
	// Reservations, when set, names the GPU the coordinator wants for the
	// next reservation pod, so a one-GPU request gets that GPU.
	Reservations ReservationHint
}

// ReservationHint finds the GPU the coordinator asked for in a reservation
// pod waiting for admission on this node.
type ReservationHint interface {
	ReservationGPU() (uuid string, ok bool)
	// ReservationTaken records that the GPU was handed to a reservation, so
	// the next reservation waiting on this node is asked about instead.
	ReservationTaken(uuid string)
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

// Preferred implements Resource. It prefers GPUs that carry no fractions,
// then applies go-gpuallocator's best-effort policy (NVLink-aware) to them.
func (w *Whole) Preferred(ctx context.Context, available, mustInclude []string, size int) ([]string, error) {
	if size <= 0 {
		return nil, fmt.Errorf("preferred allocation of %d whole GPUs: size must be positive", size)
	}
	for _, id := range append(append([]string(nil), available...), mustInclude...) {
		if _, ok := w.gpus[id]; !ok {
			return nil, fmt.Errorf("preferred allocation: unknown GPU %q", id)
		}
	}
	// A reservation pod gets the GPU the coordinator chose for its fractions.
	// If another one-GPU pod is admitted first and takes it, the reservation
	// gets another GPU and the coordinator follows gpufrac.io/reserved-gpu.
	if w.reserve != nil && size == 1 && len(mustInclude) == 0 {
		if g, ok := w.reserve.ReservationGPU(); ok && contains(available, g) {
			w.reserve.ReservationTaken(g)
			return []string{g}, nil
		}
	}
	candidates := available
	if w.usage != nil {
		if usage, err := w.usage.Usage(ctx); err == nil {
			clean := make([]string, 0, len(available))
			for _, id := range available {
				if usage[id].Units == 0 {
					clean = append(clean, id)
				}
			}
			if len(clean) >= size && containsAll(clean, mustInclude) {
				candidates = clean
			}
		}
	}
	return w.pick(candidates, mustInclude, size)
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

// Allocate implements Resource.
func (w *Whole) Allocate(_ context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	gs := make([]nvidia.GPU, 0, len(ids))
	for _, id := range ids {
		g, ok := w.gpus[id]
		if !ok {
			return nil, fmt.Errorf("allocating whole GPU %q: unknown device", id)
		}
		gs = append(gs, g)
	}
	resp := &pluginapi.ContainerAllocateResponse{}
	containerDevices(w.strategy, gs, resp)
	return resp, nil
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
