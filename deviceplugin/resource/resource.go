// Package resource turns the GPU inventory and the admin's partitioning into
// kubelet device-plugin resources: the devices each resource advertises, the
// preferred allocation for a request, and the container response for an
// allocation. The gRPC servers in package plugin see only the Resource
// interface; whole GPUs and fractions live here, time-sliced replicas and MIG
// devices plug in beside them.
package resource

import (
	"context"
	"errors"
	"fmt"
	"sort"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpufrac/gpufrac/api"
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
	// Replicas is the number of time-sliced replicas allocated on the GPU
	// (of any resource whose device IDs are "<uuid>::<k>" other than the
	// fractions: a renamed replica resource, or one left from an earlier
	// config).
	Replicas int
}

// Shared tells whether other pods hold a share of the GPU (fraction units
// or replicas), so it cannot be given whole.
func (u GPUUsage) Shared() bool { return u.Units > 0 || u.Replicas > 0 }

// HeldWholeByOther tells whether a pod other than a reservation holds the
// GPU whole, so no share of it may be given.
func (u GPUUsage) HeldWholeByOther() bool { return u.WholeHolder != "" && !u.WholeHolderIsReservation }

// BlocksReplicas tells whether no time-sliced replica may be given on the
// GPU: a pod holds it whole (a reservation too: fractions run there) or it
// carries fraction units. A GPU serves replicas only in mode timeslice, so
// such pods were left by an earlier mode, and run until they end.
func (u GPUUsage) BlocksReplicas() bool { return u.WholeHolder != "" || u.Units > 0 }

// ErrHeldOrShared is returned for a share of a GPU that pods left by an
// earlier mode hold otherwise: replicas of a GPU held whole or carrying
// fraction units, fraction units of a GPU carrying replicas.
var ErrHeldOrShared = errors.New("pods left from the GPU's earlier mode hold it whole or share it otherwise; it takes new shares once they end")

// UsageSource reports per-GPU allocations from the kubelet's PodResources.
// Implementations answer from a cache; an error means "unknown".
type UsageSource interface {
	Usage(ctx context.Context) (map[string]GPUUsage, error)
}

// ErrUsageUnknown is returned when whole GPUs or fractions are asked for
// while the kubelet's allocations cannot be read (no PodResources, or it
// fails): without them gpufrac-node cannot keep fractions off GPUs held
// whole nor whole-GPU pods off shared GPUs, so it refuses (fails closed).
var ErrUsageUnknown = errors.New("the kubelet's PodResources cannot be read, so gpufrac-node cannot tell which GPUs are held whole or shared")

// readUsage reads src; a nil src (PodResources disabled) is ErrUsageUnknown.
func readUsage(ctx context.Context, src UsageSource) (map[string]GPUUsage, error) {
	if src == nil {
		return nil, ErrUsageUnknown
	}
	u, err := src.Usage(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUsageUnknown, err)
	}
	return u, nil
}

// PodHint finds the GPU the coordinator chose for the next container asking
// for units fraction units on this node. ok is false when no such pod is known
// (standalone mode or a pod scheduled by another scheduler). The GPU is a
// hint from a pod annotation: the fraction resource honours it only on a GPU
// a reservation pod holds (see Fraction.Preferred).
type PodHint interface {
	GPUFor(units int) (uuid string, ok bool)
	// Refusal returns why a request for units fraction units must be
	// refused (every pod waiting for admission here that asks that many
	// units asks them in an init container), or nil.
	Refusal(units int) error
	// Allocated records that units fraction units were given on GPU uuid,
	// so the matching pod stops being a candidate and gets the GPU written back.
	Allocated(ctx context.Context, uuid string, units int)
}

// AllocationRecorder is told of each allocation of devices whose holder
// gpufrac-node writes on the pod (gpufrac.io/reserved-gpu on reservation
// pods, gpufrac.io/allocated-gpu on others): whole GPUs, and MIG devices
// served as nvidia.com/gpu in the single strategy. The write-back then runs
// at once and again shortly after, instead of on its next period: the
// coordinator binds fractions to a new GPU only once its reservation's
// reserved-gpu is written.
type AllocationRecorder interface {
	// DevicesAllocated records that device IDs ids were given to a container.
	DevicesAllocated(ctx context.Context, ids []string)
}

// DeviceListStrategy is how Allocate passes GPUs to the container runtime.
type DeviceListStrategy string

// The device list strategies. Neither passes GPUs through an environment
// variable a user could also set in the pod spec; every response sets
// NVIDIA_VISIBLE_DEVICES=void (VisibleDevicesVoid).
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

// VisibleDevicesVoid is the value every Allocate response gives
// NVIDIA_VISIBLE_DEVICES. The NVIDIA container toolkit reads the variable from
// the container's final environment to choose which GPUs to inject, and treats
// "void" as no GPUs and no driver injection at all, like runc
// (NVIDIA/nvidia-container-toolkit, internal/config/image/cuda_image.go:
// DevicesFromEnvvars returns no devices for "void", as for an unset or empty
// variable; the runtime's modifiers skip "void" too). The kubelet puts a device
// plugin's envs in the container config, which the runtime applies over the
// image's ENV, so "void" overrides what CUDA images set
// (NVIDIA_VISIBLE_DEVICES=all): under the toolkit's default settings an image
// can no longer select GPUs. The kubelet lists the pod's own env and envFrom
// after the plugin's envs (GenerateRunContainerOptions), so those would win
// again; the admission policies
// refuse the variable in containers, and the toolkit setting
// accept-nvidia-visible-devices-envvar-when-unprivileged = false makes the
// toolkit ignore it in unprivileged containers altogether. Only device specs
// and CDI devices grant GPUs. (Driver libraries then come with CDI devices,
// whose specs carry them; with device specs the runtime injects none.)
const VisibleDevicesVoid = "void"

// newResponse starts a container response: NVIDIA_VISIBLE_DEVICES=void plus envs.
func newResponse(envs map[string]string) *pluginapi.ContainerAllocateResponse {
	all := map[string]string{api.EnvVisibleDevices: VisibleDevicesVoid}
	for k, v := range envs {
		all[k] = v
	}
	return &pluginapi.ContainerAllocateResponse{Envs: all}
}

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
