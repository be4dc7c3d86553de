package kubeletsim

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"
	"k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// ResourceState is a snapshot of one device-plugin resource as the kubelet
// would report it in the node status.
type ResourceState struct {
	// Name is the resource name, e.g. "nvidia.com/gpu".
	Name string
	// Capacity counts all devices, healthy or not.
	Capacity int
	// Allocatable counts the healthy devices (the kubelet does not subtract
	// allocated ones).
	Allocatable int
	// Allocated counts devices held by admitted containers, including devices
	// the plugin no longer reports.
	Allocated int
	// Devices is the latest device list, sorted by ID. The copies are the
	// caller's.
	Devices []*v1beta1.Device
	// Connected is true while a registered plugin endpoint is active.
	Connected bool
	// Endpoint is the socket file name of the current or last endpoint.
	Endpoint string
	// Options are the options the current or last endpoint answered.
	Options *v1beta1.DevicePluginOptions
	// Registrations counts successful registrations for the resource since
	// the simulator was created (restarts included).
	Registrations int
	// StoppedAt is when the endpoint stopped; zero while Connected. The
	// resource is removed StopGracePeriod later unless the plugin registers
	// again.
	StoppedAt time.Time
}

// Counts returns the capacity (all devices) and allocatable (healthy
// devices) a kubelet reports for a device list, such as the one OnChange
// passes; a node controller patches the node status with them.
func Counts(devs []*v1beta1.Device) (capacity, allocatable int) {
	for _, d := range devs {
		if d.GetHealth() == v1beta1.Healthy {
			allocatable++
		}
	}
	return len(devs), allocatable
}

// Resources returns every known resource by name.
func (k *Kubelet) Resources() map[string]ResourceState {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.resourcesLocked()
}

// Resource returns one resource and whether it is known.
func (k *Kubelet) Resource(name string) (ResourceState, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	e := k.resources[name]
	if e == nil {
		return ResourceState{}, false
	}
	return k.stateLocked(e), true
}

// Registrations returns how many times a plugin registered the resource
// successfully; zero for unknown resources.
func (k *Kubelet) Registrations(resource string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	if e := k.resources[resource]; e != nil {
		return e.registrations
	}
	return 0
}

// Wait blocks until cond holds for the current resources (called once now
// and again after every change) or ctx ends. cond runs without locks held
// and must not block.
func (k *Kubelet) Wait(ctx context.Context, cond func(map[string]ResourceState) bool) error {
	for {
		k.mu.Lock()
		res := k.resourcesLocked()
		changed := k.changed
		k.mu.Unlock()
		if cond(res) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for device-plugin resources (last seen %s): %w", summarize(res), ctx.Err())
		case <-changed:
		}
	}
}

// WaitForResource blocks until the named resource exists and cond holds for
// it, or ctx ends. To wait for a resource to go away use Wait.
func (k *Kubelet) WaitForResource(ctx context.Context, name string, cond func(ResourceState) bool) error {
	err := k.Wait(ctx, func(res map[string]ResourceState) bool {
		s, ok := res[name]
		return ok && cond(s)
	})
	if err != nil {
		return fmt.Errorf("waiting for resource %s: %w", name, err)
	}
	return nil
}

// OnChange registers f to be called with a resource's full device list
// (health included, sorted by ID) whenever the list changes: a ListAndWatch
// response, the plugin going away (all unhealthy), a restart (empty list) or
// the resource's removal (nil). f is also called soon after registration for
// every known resource. Calls come from one goroutine, in order; f always
// sees the latest list, and intermediate lists may be skipped. f must not
// call Stop or Restart.
func (k *Kubelet) OnChange(f func(resource string, devs []*v1beta1.Device)) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.callbacks = append(k.callbacks, f)
	for name := range k.resources {
		k.markDirtyLocked(name)
	}
}

// markDirtyLocked queues OnChange calls for a resource and wakes waiters.
// k.mu must be held.
func (k *Kubelet) markDirtyLocked(name string) {
	k.dirty[name] = struct{}{}
	select {
	case k.dirtySignal <- struct{}{}:
	default:
	}
	k.broadcastLocked()
}

// broadcastLocked wakes everything blocked in Wait. k.mu must be held.
func (k *Kubelet) broadcastLocked() {
	close(k.changed)
	k.changed = make(chan struct{})
}

// notify delivers OnChange calls until ctx ends. Taking the device list at
// delivery time, in a single goroutine, makes the last call for a resource
// carry its latest list, whatever the order of the changes.
func (k *Kubelet) notify(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-k.dirtySignal:
		}
		k.mu.Lock()
		names := slices.Sorted(maps.Keys(k.dirty))
		clear(k.dirty)
		callbacks := slices.Clone(k.callbacks)
		lists := make([][]*v1beta1.Device, len(names))
		for i, name := range names {
			if e := k.resources[name]; e != nil {
				lists[i] = sortedDevices(e.devices)
				if lists[i] == nil {
					lists[i] = []*v1beta1.Device{}
				}
			}
		}
		k.mu.Unlock()
		for i, name := range names {
			for _, f := range callbacks {
				if ctx.Err() != nil {
					return
				}
				f(name, cloneDevices(lists[i]))
			}
		}
	}
}

func (k *Kubelet) resourcesLocked() map[string]ResourceState {
	out := make(map[string]ResourceState, len(k.resources))
	for name, e := range k.resources {
		out[name] = k.stateLocked(e)
	}
	return out
}

func (k *Kubelet) stateLocked(e *resourceEntry) ResourceState {
	s := ResourceState{
		Name:          e.name,
		Capacity:      len(e.devices),
		Allocated:     len(k.inUse[e.name]),
		Devices:       sortedDevices(e.devices),
		Connected:     e.ep != nil,
		Endpoint:      e.endpointName,
		Registrations: e.registrations,
		StoppedAt:     e.stoppedAt,
	}
	if e.opts != nil {
		s.Options = proto.Clone(e.opts).(*v1beta1.DevicePluginOptions)
	}
	_, s.Allocatable = Counts(s.Devices)
	return s
}

// sortedDevices copies devs sorted by ID; nil when devs is empty.
func sortedDevices(devs map[string]*v1beta1.Device) []*v1beta1.Device {
	if len(devs) == 0 {
		return nil
	}
	out := make([]*v1beta1.Device, 0, len(devs))
	for _, d := range devs {
		out = append(out, proto.Clone(d).(*v1beta1.Device))
	}
	slices.SortFunc(out, func(a, b *v1beta1.Device) int { return cmp.Compare(a.GetID(), b.GetID()) })
	return out
}

func cloneDevices(devs []*v1beta1.Device) []*v1beta1.Device {
	if devs == nil {
		return nil
	}
	out := make([]*v1beta1.Device, len(devs))
	for i, d := range devs {
		out[i] = proto.Clone(d).(*v1beta1.Device)
	}
	return out
}

// summarize renders resources for error messages: name allocatable/capacity.
func summarize(res map[string]ResourceState) string {
	if len(res) == 0 {
		return "no resources"
	}
	var b []byte
	for _, name := range slices.Sorted(maps.Keys(res)) {
		s := res[name]
		if len(b) > 0 {
			b = append(b, ", "...)
		}
		b = fmt.Appendf(b, "%s %d/%d connected=%t", name, s.Allocatable, s.Capacity, s.Connected)
	}
	return string(b)
}
