package dra

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/gpufrac/gpufrac/api"
)

// Features are the allocator features kube-scheduler v1.36 uses by default
// (DRAAdminAccess, DRAPrioritizedList, DRAPartitionableDevices,
// DRADeviceTaints, DRAConsumableCapacity on; binding conditions and list
// attributes off): the same allocation kube-scheduler would make.
var Features = structured.Features{
	AdminAccess:          true,
	ConsumableCapacity:   true,
	DeviceTaints:         true,
	PartitionableDevices: true,
	PrioritizedList:      true,
}

// ErrNoFit means the claims do not fit the node (as pinned).
var ErrNoFit = errors.New("claims do not fit")

// ErrUncounted means an allocation gives gpufrac's devices to a request the
// coordinator does not count (a class other than gpufrac's three whose
// selectors still match gpufrac's devices): the pod's queue would not be
// charged for them.
var ErrUncounted = errors.New("gpufrac's devices allocated through a request the queues do not count")

// Allocator allocates claims with k8s.io/dynamic-resource-allocation's
// structured allocator. It keeps a CEL cache across cycles; it is safe for
// concurrent use.
type Allocator struct {
	cache *cel.Cache
}

// NewAllocator returns an allocator.
func NewAllocator() *Allocator {
	return &Allocator{cache: cel.NewCache(64, cel.Features{EnableConsumableCapacity: true})}
}

// World is what the allocator reads: every published slice, the device
// classes and every allocation, those written and those in flight.
type World struct {
	Slices    []*resourceapi.ResourceSlice
	Classes   structured.DeviceClassLister
	Allocated []Allocated
}

// AllocatedState is the structured allocator's view of what allocations
// hold, built as kube-scheduler builds it: shares of devices that allow
// several allocations with their consumed capacity, the other devices whole.
// Admin-access results hold nothing.
func AllocatedState(allocs []Allocated) structured.AllocatedState {
	st := structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	for _, a := range allocs {
		for _, r := range a.Allocation.Devices.Results {
			if r.AdminAccess != nil && *r.AdminAccess {
				continue
			}
			id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
			if r.ShareID != nil {
				st.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
				st.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
				continue
			}
			st.AllocatedDevices.Insert(id)
		}
	}
	return st
}

// Allocate allocates claims (unallocated ones) on node, the requests of
// gpufrac's classes narrowed to the GPUs pin names when pin is not empty
// (the placement policy's choice; narrowing only adds conditions, so the
// result also satisfies the stored claims). It returns one result per claim,
// in order, or an error matching ErrNoFit when they do not fit. Nothing is
// written.
func (a *Allocator) Allocate(ctx context.Context, w World, node *corev1.Node, claims []*resourceapi.ResourceClaim, pin []string) ([]resourceapi.AllocationResult, error) {
	alloc, err := structured.NewAllocator(ctx, Features, AllocatedState(w.Allocated), w.Classes, w.Slices, a.cache)
	if err != nil {
		return nil, fmt.Errorf("building the structured allocator: %w", err)
	}
	in := claims
	if len(pin) > 0 {
		in = make([]*resourceapi.ResourceClaim, len(claims))
		for i, c := range claims {
			in[i] = Pinned(c, pin)
		}
	}
	res, err := alloc.Allocate(ctx, node, in)
	switch {
	case errors.Is(err, structured.ErrFailedAllocationOnNode):
		return nil, fmt.Errorf("%w on node %s: %w", ErrNoFit, node.Name, err)
	case err != nil:
		return nil, fmt.Errorf("allocating claims on node %s: %w", node.Name, err)
	case res == nil:
		return nil, fmt.Errorf("%w on node %s%s", ErrNoFit, node.Name, pinned(pin))
	}
	for i := range res {
		if err := counted(claims[i], res[i]); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// counted checks that every device of gpufrac's driver in alloc went to a
// request of gpufrac's classes, the requests AskOf counts and the queues
// are charged for.
func counted(c *resourceapi.ResourceClaim, alloc resourceapi.AllocationResult) error {
	for _, r := range alloc.Devices.Results {
		if r.Driver != api.DRADriver {
			continue
		}
		name, _, _ := strings.Cut(r.Request, "/")
		class := ""
		for _, req := range c.Spec.Devices.Requests {
			if req.Name != name {
				continue
			}
			if req.Exactly != nil {
				class = req.Exactly.DeviceClassName
			}
			for _, sub := range req.FirstAvailable {
				if req.Name+"/"+sub.Name == r.Request {
					class = sub.DeviceClassName
				}
			}
		}
		if !isGpufracClass(class) {
			return fmt.Errorf("%w: claim %s/%s: request %s (class %q) would get device %s of %s; ask gpufrac's GPUs through the classes %s, %s or %s",
				ErrUncounted, c.Namespace, c.Name, r.Request, class, r.Device, api.DRADriver, api.DRAClassGPU, api.DRAClassFraction, api.DRAClassMIG)
		}
	}
	return nil
}

func pinned(pin []string) string {
	if len(pin) == 0 {
		return ""
	}
	return " (GPU " + strings.Join(pin, ", ") + ")"
}

// Pinned returns a copy of c whose requests of gpufrac's classes also
// select the GPUs named in gpus (by UUID, or a MIG device's parent).
func Pinned(c *resourceapi.ResourceClaim, gpus []string) *resourceapi.ResourceClaim {
	quoted := make([]string, len(gpus))
	for i, g := range gpus {
		quoted[i] = strconv.Quote(g)
	}
	attrs := `device.attributes["` + api.DRADriver + `"]`
	expr := fmt.Sprintf(`("%s" in %s ? %s.%s : %s.%s) in [%s]`,
		api.DRAAttrParentUUID, attrs, attrs, api.DRAAttrParentUUID, attrs, api.DRAAttrUUID, strings.Join(quoted, ", "))
	out := c.DeepCopy()
	for i := range out.Spec.Devices.Requests {
		e := out.Spec.Devices.Requests[i].Exactly
		if e == nil || !isGpufracClass(e.DeviceClassName) {
			continue
		}
		e.Selectors = append(e.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: expr}})
	}
	return out
}

// ClassGetter is the DeviceClass lister of client-go's informers.
type ClassGetter interface {
	List(selector labels.Selector) ([]*resourceapi.DeviceClass, error)
	Get(name string) (*resourceapi.DeviceClass, error)
}

// Classes adapts a client-go DeviceClass lister to the allocator's.
type Classes struct{ Lister ClassGetter }

// List implements structured.DeviceClassLister.
func (c Classes) List() ([]*resourceapi.DeviceClass, error) {
	return c.Lister.List(labels.Everything())
}

// Get implements structured.DeviceClassLister.
func (c Classes) Get(name string) (*resourceapi.DeviceClass, error) { return c.Lister.Get(name) }

// StaticClasses is a fixed set of DeviceClasses (tests, the simulator).
type StaticClasses []*resourceapi.DeviceClass

// List implements structured.DeviceClassLister.
func (s StaticClasses) List() ([]*resourceapi.DeviceClass, error) { return s, nil }

// Get implements structured.DeviceClassLister.
func (s StaticClasses) Get(name string) (*resourceapi.DeviceClass, error) {
	for _, c := range s {
		if c.Name == name {
			return c, nil
		}
	}
	return nil, apierrors.NewNotFound(resourceapi.Resource("deviceclasses"), name)
}

// GpufracClasses are the DeviceClasses of the chart (deployments/helm/gpufrac/templates/dra-deviceclasses.yaml).
func GpufracClasses() StaticClasses {
	mk := func(name, typ string) *resourceapi.DeviceClass {
		return &resourceapi.DeviceClass{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
				Expression: `device.driver == "` + api.DRADriver + `" && device.attributes["` + api.DRADriver + `"].type == "` + typ + `"`,
			}}}},
		}
	}
	return StaticClasses{mk(api.DRAClassGPU, api.DRATypeGPU), mk(api.DRAClassFraction, api.DRATypeFraction), mk(api.DRAClassMIG, api.DRATypeMIG)}
}
