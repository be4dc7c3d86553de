// Package resource turns the GPU inventory and the admin's partitioning into
// kubelet device-plugin resources: the devices each resource advertises, the
// preferred allocation for a request, and the container response for an
// allocation. The gRPC servers in package plugin see only the Resource
// interface; whole GPUs and fractions live here, time-sliced replicas and MIG
// devices plug in beside them.
package resource

import (
	"context"
	"fmt"
	"sort"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
)

// Resource is one kubelet resource served by one device-plugin endpoint.
type Resource interface {
	// Name is the extended resource name ("nvidia.com/gpu").
	Name() string
	// Devices lists the devices to advertise, health applied.
	Devices() []*pluginapi.Device
	// Preferred picks size device IDs from available, including mustInclude.
	Preferred(ctx context.Context, available, mustInclude []string, size int) ([]string, error)
	// Allocate builds the container response for the device IDs the kubelet chose.
	Allocate(ctx context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error)
}

// HealthFunc tells whether a GPU (by UUID) is healthy.
type HealthFunc func(uuid string) bool

// AllHealthy is the HealthFunc of a node without a health checker.
func AllHealthy(string) bool { return true }

// gpuSet is what every resource indexed by GPU holds: its GPUs by UUID and in
// index order, their health, and how devices reach containers.
type gpuSet struct {
	gpus     map[string]nvidia.GPU
	order    []string // GPU UUIDs in index order
	health   HealthFunc
	strategy DeviceListStrategy
}

// newGPUSet indexes gpus; a nil health is AllHealthy and an empty strategy is
// device specs.
func newGPUSet(gpus []nvidia.GPU, health HealthFunc, strategy DeviceListStrategy) gpuSet {
	s := gpuSet{gpus: make(map[string]nvidia.GPU, len(gpus)), health: health, strategy: strategy}
	if s.health == nil {
		s.health = AllHealthy
	}
	if s.strategy == "" {
		s.strategy = StrategyDeviceSpecs
	}
	gs := append([]nvidia.GPU(nil), gpus...)
	sort.Slice(gs, func(i, j int) bool { return gs[i].Index < gs[j].Index })
	for _, g := range gs {
		s.gpus[g.UUID] = g
		s.order = append(s.order, g.UUID)
	}
	return s
}

// GPUUsage is what the kubelet has allocated on one GPU, as PodResources reports it.
type GPUUsage struct {
	// WholeHolder is "namespace/name" of the pod holding the GPU as a whole
	// device, or empty.
	WholeHolder string
	// WholeHolderIsReservation tells whether that pod is a gpufrac reservation pod.
	WholeHolderIsReservation bool
	// Units is the number of fraction units allocated on the GPU.
	Units int
}

// UsageSource reports per-GPU allocations from the kubelet's PodResources.
// Implementations answer from a cache; an error means "unknown", and callers
// then decide from the kubelet's available list alone.
type UsageSource interface {
	Usage(ctx context.Context) (map[string]GPUUsage, error)
}

// PodHint finds the GPU the coordinator chose for the next container asking
// for units fraction units on this node. ok is false when no such pod is known
// (standalone mode or a pod scheduled by another scheduler).
type PodHint interface {
	GPUFor(units int) (uuid string, ok bool)
	// Allocated records that units fraction units were given on GPU uuid,
	// so the matching pod stops being a candidate and gets the GPU written back.
	Allocated(ctx context.Context, uuid string, units int)
}

// DeviceListStrategy is how Allocate passes GPUs to the container runtime.
type DeviceListStrategy string

// The device list strategies. Neither passes GPUs through an environment
// variable a user could also set in the pod spec.
const (
	// StrategyDeviceSpecs mounts /dev/nvidiaN and the control devices.
	StrategyDeviceSpecs DeviceListStrategy = "device-specs"
	// StrategyCDI names fully qualified CDI devices ("nvidia.com/gpu=<uuid>").
	StrategyCDI DeviceListStrategy = "cdi"
)

// ParseDeviceListStrategy validates a --device-list-strategy value.
func ParseDeviceListStrategy(s string) (DeviceListStrategy, error) {
	switch DeviceListStrategy(s) {
	case StrategyDeviceSpecs, StrategyCDI:
		return DeviceListStrategy(s), nil
	}
	return "", fmt.Errorf("unknown device list strategy %q (want device-specs or cdi)", s)
}

// controlDevices are the device nodes every GPU container needs besides /dev/nvidiaN.
var controlDevices = [...]string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}

// CDIKind is the CDI vendor/class of gpufrac's GPU devices, as
// `nvidia-ctk cdi generate --device-name-strategy=uuid` names them.
const CDIKind = "nvidia.com/gpu"

// containerDevices fills resp with access to gpus according to strategy.
func containerDevices(strategy DeviceListStrategy, gpus []nvidia.GPU, resp *pluginapi.ContainerAllocateResponse) {
	if strategy == StrategyCDI {
		for _, g := range gpus {
			resp.CdiDevices = append(resp.CdiDevices, &pluginapi.CDIDevice{Name: CDIKind + "=" + g.UUID})
		}
		return
	}
	for _, g := range gpus {
		p := fmt.Sprintf("/dev/nvidia%d", g.Minor)
		resp.Devices = append(resp.Devices, &pluginapi.DeviceSpec{ContainerPath: p, HostPath: p, Permissions: "rw"})
	}
	for _, p := range controlDevices {
		resp.Devices = append(resp.Devices, &pluginapi.DeviceSpec{ContainerPath: p, HostPath: p, Permissions: "rw"})
	}
}

func healthString(ok bool) string {
	if ok {
		return pluginapi.Healthy
	}
	return pluginapi.Unhealthy
}
