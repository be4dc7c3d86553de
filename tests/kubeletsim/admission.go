package kubeletsim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

var (
	// ErrUnknownResource means no plugin registered the resource (or it was
	// removed after its grace period).
	ErrUnknownResource = errors.New("cannot allocate unregistered device")
	// ErrNoHealthyDevices means the resource has no healthy device at all.
	ErrNoHealthyDevices = errors.New("no healthy devices present")
	// ErrInsufficientDevices means fewer healthy, unallocated devices are
	// left than requested.
	ErrInsufficientDevices = errors.New("requested number of devices unavailable")
	// ErrEndpointStopped means the resource's plugin is not connected.
	ErrEndpointStopped = errors.New("device plugin endpoint has been stopped")
	// ErrRequestChanged means a container asked again with a different count.
	ErrRequestChanged = errors.New("container changed its request")
	// ErrPodIdentity means a pod UID is already known under another name.
	ErrPodIdentity = errors.New("pod UID already admitted under another name")
	// ErrBadPluginResponse means the plugin answered something the simulator
	// rejects (always for an empty Allocate response; in Strict mode also
	// for malformed preferred allocations and extra container responses).
	ErrBadPluginResponse = errors.New("bad device plugin response")
)

// PodRef identifies a pod on the node.
type PodRef struct {
	// Namespace is the pod's namespace.
	Namespace string
	// Name is the pod's name.
	Name string
	// UID is the pod's UID; allocations are keyed by it.
	UID types.UID
}

// String returns namespace/name.
func (p PodRef) String() string { return p.Namespace + "/" + p.Name }

// Allocation is what one container got for one resource at admission.
type Allocation struct {
	// Pod is the admitted pod.
	Pod PodRef
	// Container is the container's name.
	Container string
	// Resource is the resource name.
	Resource string
	// DeviceIDs are the devices passed to the plugin's Allocate, sorted.
	DeviceIDs []string
	// Preferred is what GetPreferredAllocation answered, in the plugin's
	// order; nil when the plugin does not offer it.
	Preferred []string
	// Response is the plugin's answer for the container: envs, mounts,
	// device specs, annotations, CDI devices.
	Response *v1beta1.ContainerAllocateResponse
	// Init marks a regular init container's allocation (AllocateInit): its
	// devices are reusable by the pod's later containers, and PodResources
	// does not list the container.
	Init bool
}

// PluginError is a failed call to a device plugin during admission.
type PluginError struct {
	// Resource is the resource being allocated.
	Resource string
	// Op is the RPC: "GetPreferredAllocation", "Allocate" or "PreStartContainer".
	Op string
	// Err is the error the gRPC call returned.
	Err error
}

// Error describes the failed RPC with the plugin's message.
func (e *PluginError) Error() string {
	return fmt.Sprintf("device plugin %s rpc for %s failed: %s", e.Op, e.Resource, e.Message())
}

// Unwrap returns the gRPC error.
func (e *PluginError) Unwrap() error { return e.Err }

// Message returns the plugin's own error message, without the gRPC framing.
func (e *PluginError) Message() string { return status.Convert(e.Err).Message() }

// KubeletCause is the failure as the kubelet's device manager words it, the
// cause in the pod's "Allocate failed due to <cause>, which is unexpected":
// Allocate's gRPC error as it is, the other RPCs' errors behind the
// device manager's own prefix.
func (e *PluginError) KubeletCause() string {
	switch e.Op {
	case "Allocate":
		return e.Err.Error()
	default:
		return fmt.Sprintf("device plugin %s rpc failed with err: %v", e.Op, e.Err)
	}
}

// allocKey identifies one container's allocation of one resource.
type allocKey struct {
	uid       types.UID
	container string
	resource  string
}

// allocRecord is a committed allocation plus the device topology at the
// time, which PodResources reports.
type allocRecord struct {
	alloc    Allocation
	topology map[string]*v1beta1.TopologyInfo // device ID -> topology, nil entries allowed
}

// Allocate admits container of pod for n devices of resource, as the
// kubelet's device manager does: it picks from the healthy devices no pod
// holds, lets the plugin choose through GetPreferredAllocation when it offers
// it, calls Allocate, and PreStartContainer when the plugin requires it. On
// success the devices are held by the pod until Release and PodResources
// reports them. Asking again for the same container and resource with the
// same n returns the existing allocation without calling the plugin.
// Plugin failures come back as *PluginError (errors.As), nothing is held.
//
// Allocate is for app containers and restartable (sidecar) init containers.
// Like the kubelet, it first takes the devices the pod's regular init
// containers hold and no later container took yet (see AllocateInit); those
// are then no longer reusable.
func (k *Kubelet) Allocate(ctx context.Context, pod PodRef, container, resource string, n int) (*Allocation, error) {
	a, err := k.allocate(ctx, pod, container, resource, n, false)
	if err != nil {
		return nil, fmt.Errorf("allocating %d %s to pod %s container %s: %w", n, resource, pod, container, err)
	}
	return a, nil
}

// AllocateInit admits a regular (not restartable) init container as
// Allocate does, but its devices stay reusable: the pod's later init
// containers and its app containers get them first, as the kubelet's device
// manager hands an init container's devices on (devicesToReuse), since init
// containers end before the next container starts. A pod whose init
// container asks one GPU and whose app container asks one therefore holds
// one GPU, not two. Call it for the pod's init containers before Allocate
// for its app containers, as the kubelet does.
func (k *Kubelet) AllocateInit(ctx context.Context, pod PodRef, container, resource string, n int) (*Allocation, error) {
	a, err := k.allocate(ctx, pod, container, resource, n, true)
	if err != nil {
		return nil, fmt.Errorf("allocating %d %s to pod %s init container %s: %w", n, resource, pod, container, err)
	}
	return a, nil
}

func (k *Kubelet) allocate(ctx context.Context, pod PodRef, container, resource string, n int, init bool) (*Allocation, error) {
	if pod.UID == "" || pod.Name == "" || pod.Namespace == "" || container == "" {
		return nil, errors.New("pod namespace, name, UID and container are required")
	}
	if n <= 0 {
		return nil, fmt.Errorf("device count must be positive, got %d", n)
	}
	k.admitMu.Lock()
	defer k.admitMu.Unlock()
	logger := klog.FromContext(ctx).WithValues("node", k.opts.NodeName, "pod", pod.String(), "podUID", pod.UID, "container", container, "resource", resource)

	// 1. Check the request against the current state and list what is free.
	key := allocKey{uid: pod.UID, container: container, resource: resource}
	k.mu.Lock()
	if known, ok := k.pods[pod.UID]; ok && known != pod {
		k.mu.Unlock()
		return nil, fmt.Errorf("%w: %s is %s", ErrPodIdentity, pod.UID, known)
	}
	if rec, ok := k.allocs[key]; ok {
		k.mu.Unlock()
		if len(rec.alloc.DeviceIDs) != n {
			return nil, fmt.Errorf("%w: resource %s from %d to %d", ErrRequestChanged, resource, len(rec.alloc.DeviceIDs), n)
		}
		return cloneAllocation(&rec.alloc), nil
	}
	e := k.resources[resource]
	if e == nil {
		k.mu.Unlock()
		return nil, fmt.Errorf("%w %s", ErrUnknownResource, resource)
	}
	var available []string
	healthy := 0
	for id, d := range e.devices {
		if d.GetHealth() != v1beta1.Healthy {
			continue
		}
		healthy++
		if _, held := k.inUse[resource][id]; !held {
			available = append(available, id)
		}
	}
	// The kubelet hands on the pod's init containers' devices unchecked
	// (they are the pod's already), before it looks at what is free.
	reused := slices.Sorted(maps.Keys(k.reuse[pod.UID][resource]))
	if len(reused) > n {
		reused = reused[:n]
	}
	needed := n - len(reused)
	ep := e.ep
	k.mu.Unlock()
	// The kubelet's checks, in its order.
	if healthy == 0 {
		return nil, fmt.Errorf("%w; cannot allocate unhealthy devices %s", ErrNoHealthyDevices, resource)
	}
	var preferred []string
	chosen := reused
	if needed > 0 {
		if len(available) < needed {
			return nil, fmt.Errorf("%w for %s. Requested: %d, Available: %d", ErrInsufficientDevices, resource, needed, len(available))
		}
		if ep == nil {
			return nil, fmt.Errorf("%w: %s", ErrEndpointStopped, resource)
		}
		slices.Sort(available)

		// 2. Choose the devices, with the plugin's preference when offered.
		if ep.opts.GetGetPreferredAllocationAvailable() {
			p, err := k.preferredAllocation(ctx, ep, available, reused, n)
			if err != nil {
				return nil, err
			}
			preferred = p
		}
		more, err := k.choose(available, preferred, needed, ep.opts.GetGetPreferredAllocationAvailable() && len(reused) == 0)
		if err != nil {
			return nil, err
		}
		chosen = append(slices.Clone(reused), more...)
	} else if ep == nil {
		return nil, fmt.Errorf("%w: %s", ErrEndpointStopped, resource)
	}
	logger.V(4).Info("Allocating devices", "devices", chosen, "preferred", preferred)

	// 3. Allocate, then PreStartContainer when the plugin asks for it.
	if k.opts.BeforeAllocate != nil {
		k.opts.BeforeAllocate(ctx, pod, resource, slices.Clone(chosen))
	}
	resp, err := k.callAllocate(ctx, ep, chosen)
	if err != nil {
		return nil, err
	}
	if ep.opts.GetPreStartRequired() {
		if err := k.callPreStart(ctx, ep, chosen); err != nil {
			return nil, err
		}
	}

	// 4. Commit: the devices are held and PodResources reports them.
	slices.Sort(chosen)
	rec := &allocRecord{
		alloc: Allocation{
			Pod:       pod,
			Container: container,
			Resource:  resource,
			DeviceIDs: chosen,
			Preferred: preferred,
			Response:  resp,
			Init:      init,
		},
		topology: make(map[string]*v1beta1.TopologyInfo, len(chosen)),
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if e := k.resources[resource]; e != nil {
		for _, id := range chosen {
			if d := e.devices[id]; d != nil && d.GetTopology() != nil {
				rec.topology[id] = proto.Clone(d.GetTopology()).(*v1beta1.TopologyInfo)
			}
		}
	}
	k.allocs[key] = rec
	k.pods[pod.UID] = pod
	if k.inUse[resource] == nil {
		k.inUse[resource] = map[string]types.UID{}
	}
	for _, id := range chosen {
		k.inUse[resource][id] = pod.UID
	}
	k.updateReuseLocked(pod.UID, resource, chosen, init)
	k.broadcastLocked()
	logger.V(2).Info("Admitted container", "devices", chosen)
	return cloneAllocation(&rec.alloc), nil
}

// updateReuseLocked records what the pod's later containers may reuse
// after a container got devices: an init container adds its devices, any
// other container removes the ones it took (the kubelet's
// addContainerAllocatedResources / removeContainerAllocatedResources on
// devicesToReuse). k.mu must be held.
func (k *Kubelet) updateReuseLocked(uid types.UID, resource string, devices []string, init bool) {
	if init {
		if k.reuse[uid] == nil {
			k.reuse[uid] = map[string]map[string]bool{}
		}
		if k.reuse[uid][resource] == nil {
			k.reuse[uid][resource] = map[string]bool{}
		}
		for _, id := range devices {
			k.reuse[uid][resource][id] = true
		}
		return
	}
	for _, id := range devices {
		delete(k.reuse[uid][resource], id)
	}
}

// preferredAllocation asks the plugin which n devices it prefers among
// available and mustInclude (the reused ones), as the kubelet asks.
func (k *Kubelet) preferredAllocation(ctx context.Context, ep *endpoint, available, mustInclude []string, n int) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, k.opts.RPCTimeout)
	defer cancel()
	resp, err := ep.client.GetPreferredAllocation(ctx, &v1beta1.PreferredAllocationRequest{
		ContainerRequests: []*v1beta1.ContainerPreferredAllocationRequest{{
			AvailableDeviceIDs:   slices.Sorted(slices.Values(append(slices.Clone(available), mustInclude...))),
			MustIncludeDeviceIDs: slices.Clone(mustInclude),
			AllocationSize:       int32(n),
		}},
	})
	if err != nil {
		return nil, &PluginError{Resource: ep.resource, Op: "GetPreferredAllocation", Err: err}
	}
	if k.opts.Strict && len(resp.GetContainerResponses()) != 1 {
		return nil, fmt.Errorf("%w: GetPreferredAllocation returned %d container responses, want 1", ErrBadPluginResponse, len(resp.GetContainerResponses()))
	}
	if len(resp.GetContainerResponses()) == 0 {
		return []string{}, nil
	}
	return slices.Clone(resp.GetContainerResponses()[0].GetDeviceIDs()), nil
}

// choose completes a pick of n devices from available (sorted). Like the
// kubelet it takes the preferred devices that are available first, then
// fills up from the rest. In Strict mode a preferred answer that is not
// exactly n distinct available devices is an error.
func (k *Kubelet) choose(available, preferred []string, n int, askedPreferred bool) ([]string, error) {
	isAvailable := make(map[string]bool, len(available))
	for _, id := range available {
		isAvailable[id] = true
	}
	if askedPreferred && k.opts.Strict {
		if err := checkPreferred(preferred, isAvailable, n); err != nil {
			return nil, err
		}
	}
	chosen := make([]string, 0, n)
	taken := make(map[string]bool, n)
	for _, id := range preferred {
		if len(chosen) == n {
			break
		}
		if isAvailable[id] && !taken[id] {
			chosen = append(chosen, id)
			taken[id] = true
		}
	}
	rest := make([]string, 0, len(available))
	for _, id := range available {
		if !taken[id] {
			rest = append(rest, id)
		}
	}
	if k.opts.Rand != nil {
		k.opts.Rand.Shuffle(len(rest), func(i, j int) { rest[i], rest[j] = rest[j], rest[i] })
	}
	for _, id := range rest {
		if len(chosen) == n {
			break
		}
		chosen = append(chosen, id)
	}
	if len(chosen) != n {
		return nil, fmt.Errorf("%w: picked %d devices, need %d", ErrInsufficientDevices, len(chosen), n)
	}
	return chosen, nil
}

// checkPreferred verifies a preferred allocation: n distinct devices, all
// available.
func checkPreferred(preferred []string, isAvailable map[string]bool, n int) error {
	if len(preferred) != n {
		return fmt.Errorf("%w: GetPreferredAllocation returned %d devices %v, want %d", ErrBadPluginResponse, len(preferred), preferred, n)
	}
	seen := make(map[string]bool, n)
	for _, id := range preferred {
		if seen[id] {
			return fmt.Errorf("%w: GetPreferredAllocation returned device %s twice", ErrBadPluginResponse, id)
		}
		seen[id] = true
		if !isAvailable[id] {
			return fmt.Errorf("%w: GetPreferredAllocation returned device %s, which is not available", ErrBadPluginResponse, id)
		}
	}
	return nil
}

// callAllocate calls the plugin's Allocate for one container.
func (k *Kubelet) callAllocate(ctx context.Context, ep *endpoint, devs []string) (*v1beta1.ContainerAllocateResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, k.opts.RPCTimeout)
	defer cancel()
	resp, err := ep.client.Allocate(ctx, &v1beta1.AllocateRequest{
		ContainerRequests: []*v1beta1.ContainerAllocateRequest{{DevicesIds: slices.Clone(devs)}},
	})
	if err != nil {
		return nil, &PluginError{Resource: ep.resource, Op: "Allocate", Err: err}
	}
	got := len(resp.GetContainerResponses())
	if got == 0 || (k.opts.Strict && got != 1) {
		return nil, fmt.Errorf("%w: Allocate returned %d container responses, want 1", ErrBadPluginResponse, got)
	}
	return resp.GetContainerResponses()[0], nil
}

// callPreStart calls the plugin's PreStartContainer with the container's devices.
func (k *Kubelet) callPreStart(ctx context.Context, ep *endpoint, devs []string) error {
	ctx, cancel := context.WithTimeout(ctx, k.opts.RPCTimeout)
	defer cancel()
	if _, err := ep.client.PreStartContainer(ctx, &v1beta1.PreStartContainerRequest{DevicesIds: slices.Clone(devs)}); err != nil {
		return &PluginError{Resource: ep.resource, Op: "PreStartContainer", Err: err}
	}
	return nil
}

// Release frees every device the pod holds (the pod ended) and reports how
// many container allocations it dropped. Releasing an unknown pod does
// nothing.
func (k *Kubelet) Release(uid types.UID) int {
	k.admitMu.Lock()
	defer k.admitMu.Unlock()
	k.mu.Lock()
	defer k.mu.Unlock()
	released := 0
	for key, rec := range k.allocs {
		if key.uid != uid {
			continue
		}
		for _, id := range rec.alloc.DeviceIDs {
			if k.inUse[key.resource][id] == uid {
				delete(k.inUse[key.resource], id)
			}
		}
		if len(k.inUse[key.resource]) == 0 {
			delete(k.inUse, key.resource)
		}
		delete(k.allocs, key)
		released++
	}
	delete(k.reuse, uid)
	if pod, ok := k.pods[uid]; ok {
		if k.dra.pods[uid] == nil {
			delete(k.pods, uid) // a pod with prepared claims stays listed
		}
		k.logger.V(2).Info("Released pod's devices", "pod", pod.String(), "podUID", uid, "allocations", released)
		k.broadcastLocked()
	}
	return released
}

// Allocations returns every current allocation, sorted by pod namespace,
// name, container and resource.
func (k *Kubelet) Allocations() []Allocation {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]Allocation, 0, len(k.allocs))
	for _, rec := range k.allocs {
		out = append(out, *cloneAllocation(&rec.alloc))
	}
	slices.SortFunc(out, compareAllocations)
	return out
}

func compareAllocations(a, b Allocation) int {
	return cmp.Or(
		cmp.Compare(a.Pod.Namespace, b.Pod.Namespace),
		cmp.Compare(a.Pod.Name, b.Pod.Name),
		cmp.Compare(a.Pod.UID, b.Pod.UID),
		cmp.Compare(a.Container, b.Container),
		cmp.Compare(a.Resource, b.Resource),
	)
}

func cloneAllocation(a *Allocation) *Allocation {
	c := *a
	c.DeviceIDs = slices.Clone(a.DeviceIDs)
	if a.Preferred != nil {
		c.Preferred = slices.Clone(a.Preferred)
	}
	if a.Response != nil {
		c.Response = proto.Clone(a.Response).(*v1beta1.ContainerAllocateResponse)
	}
	return &c
}
