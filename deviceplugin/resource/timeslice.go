package resource

import (
	"context"
	"fmt"
	"strconv"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/timeslice"
)

// Timeslice serves each GPU as time-sliced replicas ("<uuid>::<k>", k <
// replicas) of one resource. A container gets the GPUs behind its replicas
// and GPUFRAC_MEMORY_LIMIT_MIB, the GPU's memory divided by the replicas
// (times the replicas it holds on the GPU).
type Timeslice struct {
	gpuSet
	sharing timeslice.Sharing
	usage   UsageSource
}

var _ Resource = (*Timeslice)(nil)

// TimesliceOptions configures a Timeslice resource.
type TimesliceOptions struct {
	// Sharing is the replicas per GPU, the resource name and the request
	// rule (see config.TimesliceConfig.Sharing for defaults).
	Sharing timeslice.Sharing
	// GPUs are the GPUs to time-slice.
	GPUs     []nvidia.GPU
	Health   HealthFunc
	Strategy DeviceListStrategy
	// Usage keeps replicas off GPUs that pods left by an earlier mode hold
	// whole or share as fractions (GPUUsage.BlocksReplicas). Without it
	// (nil, or failing) no replica is given: ErrUsageUnknown.
	Usage UsageSource
}

// NewTimeslice builds the time-sliced replica resource.
func NewTimeslice(o TimesliceOptions) *Timeslice {
	t := &Timeslice{gpuSet: newGPUSet(o.GPUs, o.Health, o.Strategy), sharing: o.Sharing, usage: o.Usage}
	if t.sharing.ResourceName == "" {
		t.sharing.ResourceName = api.DefaultTimesliceResource
	}
	return t
}

// Name implements Resource.
func (t *Timeslice) Name() string { return t.sharing.ResourceName }

// Devices implements Resource: the replicas of every GPU, sharing its health.
func (t *Timeslice) Devices() []*pluginapi.Device {
	devs := make([]*pluginapi.Device, 0, len(t.order)*t.sharing.Replicas)
	for _, u := range t.order {
		h := healthString(t.health(u))
		for k := range t.sharing.Replicas {
			devs = append(devs, &pluginapi.Device{ID: UnitID(u, k), Health: h})
		}
	}
	return devs
}

// replicas parses replica IDs of this resource's GPUs.
func (t *Timeslice) replicas(ids []string) ([]timeslice.Replica, error) {
	out := make([]timeslice.Replica, 0, len(ids))
	for _, id := range ids {
		uuid, k, err := ParseUnitID(id)
		if err != nil {
			return nil, err
		}
		if _, ok := t.gpus[uuid]; !ok || k >= t.sharing.Replicas {
			return nil, fmt.Errorf("unknown device %q", id)
		}
		out = append(out, timeslice.Replica{GPU: uuid, K: k})
	}
	return out, nil
}

// Preferred implements Resource (see timeslice.Pick): the least loaded
// GPU with room for the whole request, among the healthy GPUs no pod left
// by an earlier mode holds whole or shares as fractions.
func (t *Timeslice) Preferred(ctx context.Context, available, mustInclude []string, size int) ([]string, error) {
	if err := t.sharing.CheckRequest(size); err != nil {
		return nil, err
	}
	avail, err := t.replicas(available)
	if err != nil {
		return nil, fmt.Errorf("preferred allocation: %w", err)
	}
	must, err := t.replicas(mustInclude)
	if err != nil {
		return nil, fmt.Errorf("preferred allocation: must-include devices: %w", err)
	}
	usage, err := readUsage(ctx, t.usage)
	if err != nil {
		return nil, fmt.Errorf("preferred allocation of %d %s: %w", size, t.Name(), err)
	}
	for _, r := range must {
		if u := usage[r.GPU]; u.BlocksReplicas() {
			return nil, fmt.Errorf("preferred allocation: must-include replica of %s: %w", r.GPU, heldOrShared(u))
		}
	}
	free := map[string][]int{}
	for _, r := range avail {
		free[r.GPU] = append(free[r.GPU], r.K)
	}
	order := make([]string, 0, len(t.order))
	for _, u := range t.order {
		if t.health(u) && !usage[u].BlocksReplicas() {
			order = append(order, u)
		}
	}
	picked, err := timeslice.Pick(free, order, must, size)
	if err != nil {
		return nil, fmt.Errorf("preferred allocation of %s: %w", t.Name(), err)
	}
	ids := make([]string, len(picked))
	for i, r := range picked {
		ids[i] = UnitID(r.GPU, r.K)
	}
	return ids, nil
}

// Allocate implements Resource: the GPUs behind the replicas and their
// memory share. When replicas span GPUs with different counts the limit is
// the smallest per-GPU share, which holds on every GPU. It refuses replicas
// of a GPU that a pod left by an earlier mode holds whole or shares as
// fractions (whatever chose them), and any while the kubelet's allocations
// are unknown.
func (t *Timeslice) Allocate(ctx context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	if err := t.sharing.CheckRequest(len(ids)); err != nil {
		return nil, fmt.Errorf("allocating: %w", err)
	}
	rs, err := t.replicas(ids)
	if err != nil {
		return nil, fmt.Errorf("allocating %d replicas: %w", len(ids), err)
	}
	usage, err := readUsage(ctx, t.usage)
	if err != nil {
		return nil, fmt.Errorf("allocating %d replicas: %w", len(ids), err)
	}
	perGPU := timeslice.PerGPU(rs)
	for gpu := range perGPU {
		if u := usage[gpu]; u.BlocksReplicas() {
			return nil, fmt.Errorf("allocating replicas of %s: %w", gpu, heldOrShared(u))
		}
	}
	var gs []nvidia.GPU
	var limit uint64
	for _, u := range t.order {
		n, ok := perGPU[u]
		if !ok {
			continue
		}
		g := t.gpus[u]
		gs = append(gs, g)
		if l := t.sharing.MemoryLimitMiB(g.MemoryMiB(), n); len(gs) == 1 || l < limit {
			limit = l
		}
	}
	resp := newResponse(map[string]string{api.EnvMemoryLimitMiB: strconv.FormatUint(limit, 10)})
	containerDevices(t.strategy, gs, resp)
	return resp, nil
}

// heldOrShared says why a GPU takes no replicas now.
func heldOrShared(u GPUUsage) error {
	if u.WholeHolder != "" {
		return fmt.Errorf("%s holds it whole (%d fraction units on it): %w", u.WholeHolder, u.Units, ErrHeldOrShared)
	}
	return fmt.Errorf("it carries %d fraction units: %w", u.Units, ErrHeldOrShared)
}
