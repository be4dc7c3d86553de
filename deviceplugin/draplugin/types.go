// Package draplugin is the kubelet side of a DRA driver and its
// ResourceSlice publishing, written for gpufrac-node on its own REST client:
//
//   - Server answers the kubelet's plugin registration
//     (k8s.io/kubelet/pkg/apis/pluginregistration/v1) and the DRA gRPC
//     service (k8s.io/kubelet/pkg/apis/dra/v1 and v1beta1:
//     NodePrepareResources, NodeUnprepareResources), calling a Plugin with
//     the claims read from the API server, one call at a time;
//   - Publisher keeps the node's ResourceSlices equal to what the driver
//     publishes: one pool, slices named by index, the pool generation bumped
//     when more than one write is needed, stale slices removed, owned by the
//     Node, re-created when someone else deletes them;
//   - RESTClient reads claims and writes slices with only resource.k8s.io/v1
//     in its scheme.
//
// It replaces k8s.io/dynamic-resource-allocation's kubeletplugin and
// resourceslice helpers, whose API takes a kubernetes.Interface: linking
// them links client-go's whole typed clientset and registers every API group
// at init, which made gpufrac-node's idle RSS grow by 12-14 MiB in every
// mode (docs/benchmarks.md, "Idle node agent"). What it keeps of them is
// named where it is done; what gpufrac does not use (rolling updates with
// two instances, device metadata files, the health service, pools without a
// node) is left out.
package draplugin

import (
	"context"
	"errors"
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
)

const (
	// KubeletPluginsDir is the kubelet's default directory of plugin data;
	// a driver's DRA socket lives in <KubeletPluginsDir>/<driver>.
	KubeletPluginsDir = "/var/lib/kubelet/plugins"
	// KubeletRegistryDir is where the kubelet looks for plugin registration
	// sockets.
	KubeletRegistryDir = "/var/lib/kubelet/plugins_registry"
	// DRASocket is the DRA service socket's name in the plugin directory
	// (as the kubeletplugin helper names it).
	DRASocket = "dra.sock"
)

// RegistrationSocket is the registration socket's name for driver (as the
// kubeletplugin helper names it, so an upgraded node agent replaces the
// socket of the one before).
func RegistrationSocket(driver string) string { return driver + "-reg.sock" }

// Plugin is the driver behind Server.
type Plugin interface {
	// PrepareResourceClaims prepares the claims the kubelet asks for; the
	// server has read them and checked that each is allocated and is the
	// claim the kubelet named (UID). It must return one result per claim
	// (or an error for the whole call) and be idempotent: the kubelet asks
	// again after restarts.
	PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]PrepareResult, error)
	// UnprepareResourceClaims undoes PrepareResourceClaims, possibly of an
	// earlier process; a claim not prepared is already unprepared.
	UnprepareResourceClaims(ctx context.Context, claims []NamespacedObject) (map[types.UID]error, error)
	// HandleError sees background errors: of publishing slices (wrapped so
	// that errors.Is(err, ErrRecoverable); a DroppedFieldsError when the API
	// server stored less than was published) and of the gRPC servers (fatal:
	// the kubelet cannot reach the driver any more).
	HandleError(ctx context.Context, err error, msg string)
}

// PrepareResult is the outcome of preparing one claim: Err, or the devices.
type PrepareResult struct {
	// Err, when set, fails the claim's preparation; the kubelet retries.
	Err error
	// Devices are the claim's devices with their CDI device IDs.
	Devices []Device
}

// Device is one prepared device of a claim.
type Device struct {
	// Requests are the claim's requests the device serves (a subrequest's
	// name is reduced to its request's).
	Requests   []string
	PoolName   string
	DeviceName string
	// CDIDeviceIDs are passed to the container runtime.
	CDIDeviceIDs []string
	// ShareID is the allocation's share of a device that allows several.
	ShareID *types.UID
}

// NamespacedObject names a claim to unprepare.
type NamespacedObject struct {
	types.NamespacedName
	UID types.UID
}

// ErrRecoverable marks background errors that are retried (publishing
// slices); others, from the gRPC servers, are fatal.
var ErrRecoverable = errors.New("recoverable error")

// recoverable wraps err so that errors.Is(err, ErrRecoverable).
type recoverable struct{ error }

func (recoverable) Is(target error) bool { return target == ErrRecoverable }
func (e recoverable) Unwrap() error      { return e.error }

// DriverResources is everything a driver publishes: its pools by name.
// gpufrac-node publishes one pool, named after its node.
type DriverResources struct {
	Pools map[string]Pool
}

// Pool is one pool's slices, in order: a slice's index is the start of its
// name, and allocators try slices in name order (first fit).
type Pool struct {
	Slices []Slice
}

// Slice becomes one ResourceSlice.
type Slice struct {
	Devices        []resourceapi.Device
	SharedCounters []resourceapi.CounterSet
}

// DroppedFieldsError is reported (recoverable) when the API server stored a
// slice with less than was published: fields of a feature the cluster has
// off are dropped. The publisher then keeps what was stored, so it does not
// write the same slice again and again.
type DroppedFieldsError struct {
	PoolName                  string
	SliceIndex                int
	DesiredSlice, ActualSlice *resourceapi.ResourceSlice
}

func (e *DroppedFieldsError) Error() string {
	disabled := e.DisabledFeatures()
	if len(disabled) == 0 {
		disabled = []string{"unknown"}
	}
	return fmt.Sprintf("pool %q, slice #%d: some fields were dropped by the API server, probably because these features are disabled: %s",
		e.PoolName, e.SliceIndex, strings.Join(disabled, " "))
}

// DisabledFeatures guesses from the differences which feature gates of the
// API server are off (the names kube-apiserver uses).
func (e *DroppedFieldsError) DisabledFeatures() []string {
	want, got := e.DesiredSlice.Spec, e.ActualSlice.Spec
	n := min(len(want.Devices), len(got.Devices))
	anyDevice := func(dropped func(w, g resourceapi.Device) bool) bool {
		for i := range n {
			if dropped(want.Devices[i], got.Devices[i]) {
				return true
			}
		}
		return false
	}
	var out []string
	if anyDevice(func(w, g resourceapi.Device) bool { return len(w.Taints) > len(g.Taints) }) {
		out = append(out, "DRADeviceTaints")
	}
	if len(want.SharedCounters) > len(got.SharedCounters) ||
		anyDevice(func(w, g resourceapi.Device) bool { return len(w.ConsumesCounters) != len(g.ConsumesCounters) }) {
		out = append(out, "DRAPartitionableDevices")
	}
	if anyDevice(func(w, g resourceapi.Device) bool {
		return len(w.BindingConditions) != len(g.BindingConditions) || len(w.BindingFailureConditions) != len(g.BindingFailureConditions)
	}) {
		out = append(out, "DRADeviceBindingConditions")
	}
	if anyDevice(func(w, g resourceapi.Device) bool {
		return w.AllowMultipleAllocations != nil && g.AllowMultipleAllocations == nil
	}) {
		out = append(out, "DRAConsumableCapacity")
	}
	return out
}
