package dra

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"google.golang.org/grpc"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/enforcement"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/deviceplugin/pods"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
	"github.com/gpufrac/gpufrac/mig"
)

// RecordFile is the prepared-claims file's name in Options.StateDir.
const RecordFile = "prepared-claims.json"

// ErrOverCapacity means a claim's allocation would give a device more than
// it has: a whole GPU someone else holds, more shares or bytes than remain,
// or a GPU already used another way. Two allocators that do not see each
// other's work in flight (kube-scheduler and the coordinator) can both hand
// out the last share of a GPU; the driver is the last line that refuses,
// and the kubelet keeps the pod pending and retries.
var ErrOverCapacity = errors.New("allocation exceeds what the device has left")

// ErrUnresolvedCDI means a device's CDI name (the cdi strategy) resolves in
// no CDI spec on the node.
var ErrUnresolvedCDI = errors.New("CDI device not resolvable")

// ErrUnknownDevice means an allocation names a device this node does not
// publish (any more).
var ErrUnknownDevice = errors.New("device not published by this node")

// Options configures a Driver.
type Options struct {
	// NodeName is the node, and the name of the driver's pool.
	NodeName string
	// StateDir holds the prepared-claims record (RecordFile). Required.
	StateDir string
	// CDIDir is where the per-claim CDI specs go ("" is DefaultCDIDir).
	CDIDir string
	// Strategy is how GPUs reach containers: CDI names of the NVIDIA
	// container toolkit (resource.StrategyCDI) or device nodes in gpufrac's
	// own per-claim spec (resource.StrategyDeviceSpecs, the default).
	Strategy resource.DeviceListStrategy
	// MIGCapsFile is the nvidia-caps minors file MIG device nodes are read
	// from with device specs ("" is /proc/driver/nvidia-caps/mig-minors).
	MIGCapsFile string
	// Unresolved, when set (the cdi strategy), returns the CDI device names
	// among its argument that no spec on the node resolves: a claim whose
	// GPU would be such a name is refused at prepare, as Allocate refuses
	// it on the device-plugin path.
	Unresolved func(names []string) []string
}

// Driver is the kubeletplugin.DRAPlugin behind the kubeletplugin helper: it
// prepares and unprepares claims against the devices last published and the
// record of claims prepared before. Methods are safe for concurrent use.
type Driver struct {
	o Options

	mu sync.Mutex
	// targets: published device name -> what it stands for (the last Set).
	targets map[string]Target
	// claims: claim UID -> the claim as prepared; mirrored in the record file.
	claims map[types.UID]PreparedClaim
	// errorHook, when set, sees every background error (tests).
	errorHook func(err error, msg string)
	// onTaintsDropped is called (once, in its own goroutine) when the API
	// server dropped the device taints of a published slice: the cluster
	// runs without DRADeviceTaints, so unhealthy GPUs must be left out
	// instead of tainted.
	onTaintsDropped func()
	// taintsDropped is set once that happened.
	taintsDropped bool
	// onFatal is called (once, in its own goroutine) with the first fatal
	// background error: its DRA or registration gRPC server failed.
	onFatal func(err error)
	// fatal is set once onFatal was called.
	fatal bool
}

var (
	_ kubeletplugin.DRAPlugin = (*Driver)(nil)
	_ enforcement.ClaimSource = (*Driver)(nil)
)

// NewDriver loads the prepared-claims record from o.StateDir. It fails if
// the record cannot be read (ErrCorruptRecord): a driver that forgot what
// it prepared could give a GPU twice.
func NewDriver(o Options) (*Driver, error) {
	if o.StateDir == "" {
		return nil, errors.New("dra driver: StateDir is required")
	}
	if o.CDIDir == "" {
		o.CDIDir = DefaultCDIDir
	}
	if o.Strategy == "" {
		o.Strategy = resource.StrategyDeviceSpecs
	}
	if o.MIGCapsFile == "" {
		o.MIGCapsFile = resource.DefaultMIGCapsFile
	}
	claims, err := loadRecord(filepath.Join(o.StateDir, RecordFile))
	if err != nil {
		return nil, err
	}
	return &Driver{o: o, targets: map[string]Target{}, claims: claims}, nil
}

// SetTargets replaces what the published device names stand for (after
// each Build that is published).
func (d *Driver) SetTargets(t map[string]Target) {
	d.mu.Lock()
	d.targets = t
	d.mu.Unlock()
}

// Prepared returns the prepared claims, sorted by namespace and name.
func (d *Driver) Prepared() []PreparedClaim {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]PreparedClaim, 0, len(d.claims))
	for _, c := range d.claims {
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b PreparedClaim) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	return out
}

// PrepareResourceClaims implements kubeletplugin.DRAPlugin. Each claim is
// prepared on its own: checked against the claims prepared before it (and
// earlier in the same call), answered with CDI device IDs, its CDI spec
// written and the record saved before the answer. A claim prepared before
// gets the same answer again.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	logger := klog.FromContext(ctx)
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		pc, err := d.prepareLocked(claim)
		if err != nil {
			logger.Error(err, "Refusing to prepare claim", "claim", klog.KObj(claim), "claimUID", claim.UID)
			out[claim.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		logger.V(2).Info("Prepared claim", "claim", klog.KObj(claim), "claimUID", claim.UID, "devices", len(pc.Devices))
		out[claim.UID] = kubeletplugin.PrepareResult{Devices: resultDevices(pc)}
	}
	return out, nil
}

// prepareLocked prepares one claim. d.mu must be held.
func (d *Driver) prepareLocked(claim *resourceapi.ResourceClaim) (PreparedClaim, error) {
	if pc, ok := d.claims[claim.UID]; ok {
		return pc, nil
	}
	what := "claim " + claim.Namespace + "/" + claim.Name
	if claim.Status.Allocation == nil {
		return PreparedClaim{}, fmt.Errorf("preparing %s: not allocated", what)
	}
	pc := PreparedClaim{UID: claim.UID, Namespace: claim.Namespace, Name: claim.Name}
	edits := map[string]cdispec.ContainerEdits{}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != api.DRADriver || r.Pool != d.o.NodeName {
			continue
		}
		if r.AdminAccess != nil && *r.AdminAccess {
			return PreparedClaim{}, fmt.Errorf("preparing %s: admin access to %s is not supported by %s", what, r.Device, api.DRADriver)
		}
		pd, resp, err := d.deviceLocked(what, r, pc.Devices)
		if err != nil {
			return PreparedClaim{}, err
		}
		e, ids := cdiEdits(resp)
		name := cdiDeviceName(claim.UID, r.Device, pd.ShareID)
		edits[name] = e
		pd.CDIDeviceIDs = append(ids, api.DRACDIKind+"="+name)
		pc.Devices = append(pc.Devices, pd)
	}
	if len(pc.Devices) == 0 {
		return PreparedClaim{}, fmt.Errorf("preparing %s: no device of driver %s in pool %s is allocated to it", what, api.DRADriver, d.o.NodeName)
	}
	if err := writeCDISpec(d.o.CDIDir, claim.UID, edits); err != nil {
		return PreparedClaim{}, fmt.Errorf("preparing %s: %w", what, err)
	}
	d.claims[claim.UID] = pc
	if err := saveRecord(filepath.Join(d.o.StateDir, RecordFile), d.claims); err != nil {
		delete(d.claims, claim.UID)
		_ = removeCDISpec(d.o.CDIDir, claim.UID)
		return PreparedClaim{}, fmt.Errorf("preparing %s: %w", what, err)
	}
	return pc, nil
}

// deviceLocked checks one allocation result against the claims prepared
// before (and siblings, the devices of this claim already checked) and
// builds its answer.
func (d *Driver) deviceLocked(what string, r resourceapi.DeviceRequestAllocationResult, siblings []PreparedDevice) (PreparedDevice, *pluginapi.ContainerAllocateResponse, error) {
	t, ok := d.targets[r.Device]
	if !ok {
		return PreparedDevice{}, nil, fmt.Errorf("preparing %s: %w: %s", what, ErrUnknownDevice, r.Device)
	}
	pd := PreparedDevice{Requests: []string{r.Request}, Pool: r.Pool, Device: r.Device, View: t.View, GPU: t.GPU.UUID}
	if r.ShareID != nil {
		pd.ShareID = string(*r.ShareID)
	}
	held := d.heldLocked(t.GPU.UUID, siblings)
	gpuMiB := t.MemoryBytes >> 20
	var resp *pluginapi.ContainerAllocateResponse
	switch t.View {
	case api.DRAViewWhole:
		if len(held) > 0 {
			return pd, nil, fmt.Errorf("preparing %s: %w: whole GPU %s (%s) is in use by %s", what, ErrOverCapacity, t.GPU.UUID, r.Device, describeHolders(held))
		}
		pd.Unlimited = true
		resp = resource.WholeResponse(d.o.Strategy, []nvidia.GPU{t.GPU})
	case api.DRAViewShares:
		n := consumed(r, api.DRACapacityShares, api.UnitsPerGPU)
		if n < 1 || n > api.UnitsPerGPU {
			return pd, nil, fmt.Errorf("preparing %s: %d shares of %s: must be 1..%d", what, n, r.Device, api.UnitsPerGPU)
		}
		if other := otherViews(held, api.DRAViewShares); len(other) > 0 {
			return pd, nil, fmt.Errorf("preparing %s: %w: GPU %s cannot be shared by percent (%s) while %s", what, ErrOverCapacity, t.GPU.UUID, r.Device, describeHolders(other))
		}
		if used := sumShares(held); used+n > api.UnitsPerGPU {
			return pd, nil, fmt.Errorf("preparing %s: %w: %d shares of GPU %s (%s) asked, %d of %d are held by %s",
				what, ErrOverCapacity, n, t.GPU.UUID, r.Device, used, api.UnitsPerGPU, describeHolders(held))
		}
		pd.Shares = n
		pd.LimitMiB = gpuMiB * uint64(n) / api.UnitsPerGPU
		resp = resource.SharedResponse(d.o.Strategy, t.GPU, pd.LimitMiB)
	case api.DRAViewMemory:
		b := consumed(r, api.DRACapacityMemory, int64(t.MemoryBytes))
		if b < 1 || uint64(b) > t.MemoryBytes {
			return pd, nil, fmt.Errorf("preparing %s: %d bytes of %s: must be 1..%d", what, b, r.Device, t.MemoryBytes)
		}
		if other := otherViews(held, api.DRAViewMemory); len(other) > 0 {
			return pd, nil, fmt.Errorf("preparing %s: %w: GPU %s cannot be shared by memory (%s) while %s", what, ErrOverCapacity, t.GPU.UUID, r.Device, describeHolders(other))
		}
		if used := sumMemory(held); uint64(used+b) > t.MemoryBytes {
			return pd, nil, fmt.Errorf("preparing %s: %w: %d MiB of GPU %s (%s) asked, %d of %d MiB are held by %s",
				what, ErrOverCapacity, b>>20, t.GPU.UUID, r.Device, used>>20, gpuMiB, describeHolders(held))
		}
		pd.MemoryBytes = b
		pd.LimitMiB = uint64(b) >> 20
		resp = resource.SharedResponse(d.o.Strategy, t.GPU, pd.LimitMiB)
	case api.DRAViewMIG:
		if other := otherViews(held, api.DRAViewMIG); len(other) > 0 {
			return pd, nil, fmt.Errorf("preparing %s: %w: GPU %s cannot serve MIG device %s (%s) while %s", what, ErrOverCapacity, t.GPU.UUID, t.MIG.UUID, r.Device, describeHolders(other))
		}
		for _, h := range held {
			if h.device.MIG == t.MIG.UUID {
				return pd, nil, fmt.Errorf("preparing %s: %w: MIG device %s (%s) is in use by %s", what, ErrOverCapacity, t.MIG.UUID, r.Device, describeHolders([]holder{h}))
			}
		}
		pd.MIG, pd.Unlimited = t.MIG.UUID, true
		var err error
		resp, err = resource.MIGResponse(d.o.Strategy, []mig.Device{t.MIG}, map[string]nvidia.GPU{t.GPU.UUID: t.GPU}, d.o.MIGCapsFile)
		if err != nil {
			return pd, nil, fmt.Errorf("preparing %s: %w", what, err)
		}
	default:
		return pd, nil, fmt.Errorf("preparing %s: device %s has unknown view %q", what, r.Device, t.View)
	}
	if d.o.Unresolved != nil && len(resp.GetCdiDevices()) > 0 {
		names := make([]string, len(resp.CdiDevices))
		for i, c := range resp.CdiDevices {
			names[i] = c.Name
		}
		if missing := d.o.Unresolved(names); len(missing) > 0 {
			return pd, nil, fmt.Errorf("preparing %s: %w: %s is in no CDI spec on the node; the container runtime could not start the container (generate the NVIDIA CDI spec: nvidia-ctk cdi generate --device-name-strategy=uuid)",
				what, ErrUnresolvedCDI, strings.Join(missing, ", "))
		}
	}
	return pd, resp, nil
}

// holder is a prepared device of some claim on the GPU being checked.
type holder struct {
	claim  string // namespace/name, or "this claim"
	device PreparedDevice
}

// heldLocked lists the prepared devices on GPU uuid: of other claims, and
// siblings (devices of the claim being prepared).
func (d *Driver) heldLocked(uuid string, siblings []PreparedDevice) []holder {
	var out []holder
	for _, c := range d.claims {
		for _, pd := range c.Devices {
			if pd.GPU == uuid {
				out = append(out, holder{claim: c.Namespace + "/" + c.Name, device: pd})
			}
		}
	}
	for _, pd := range siblings {
		if pd.GPU == uuid {
			out = append(out, holder{claim: "this claim", device: pd})
		}
	}
	slices.SortFunc(out, func(a, b holder) int { return strings.Compare(a.claim, b.claim) })
	return out
}

// otherViews lists the holders of the GPU that do not share it by view v:
// one GPU is used one way at a time (the counters say the same).
func otherViews(held []holder, v api.DRAView) []holder {
	var out []holder
	for _, h := range held {
		if h.device.View != v {
			out = append(out, h)
		}
	}
	return out
}

func sumShares(held []holder) int64 {
	var n int64
	for _, h := range held {
		n += h.device.Shares
	}
	return n
}

func sumMemory(held []holder) int64 {
	var n int64
	for _, h := range held {
		n += h.device.MemoryBytes
	}
	return n
}

// describeHolders says who holds what: "team/a (30 shares), team/b (gpu-0)".
func describeHolders(hs []holder) string {
	parts := make([]string, 0, len(hs))
	for _, h := range hs {
		switch h.device.View {
		case api.DRAViewShares:
			parts = append(parts, fmt.Sprintf("%s (%d shares)", h.claim, h.device.Shares))
		case api.DRAViewMemory:
			parts = append(parts, fmt.Sprintf("%s (%d MiB)", h.claim, h.device.MemoryBytes>>20))
		default:
			parts = append(parts, fmt.Sprintf("%s (%s)", h.claim, h.device.Device))
		}
	}
	return strings.Join(parts, ", ")
}

// consumed is the amount of capacity name the allocation consumed, or def
// when the result does not say (an allocator without consumable capacity
// gives the whole device).
func consumed(r resourceapi.DeviceRequestAllocationResult, name string, def int64) int64 {
	q, ok := r.ConsumedCapacity[resourceapi.QualifiedName(name)]
	if !ok {
		return def
	}
	return q.Value()
}

// resultDevices is the kubelet's answer for a prepared claim.
func resultDevices(pc PreparedClaim) []kubeletplugin.Device {
	out := make([]kubeletplugin.Device, 0, len(pc.Devices))
	for _, pd := range pc.Devices {
		dev := kubeletplugin.Device{
			Requests: slices.Clone(pd.Requests), PoolName: pd.Pool, DeviceName: pd.Device,
			CDIDeviceIDs: slices.Clone(pd.CDIDeviceIDs),
		}
		if pd.ShareID != "" {
			id := types.UID(pd.ShareID)
			dev.ShareID = &id
		}
		out = append(out, dev)
	}
	return out
}

// UnprepareResourceClaims implements kubeletplugin.DRAPlugin: it forgets the
// claims and removes their CDI specs. Unknown claims are already
// unprepared.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	logger := klog.FromContext(ctx)
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[types.UID]error, len(claims))
	changed := map[types.UID]PreparedClaim{}
	for _, c := range claims {
		pc, ok := d.claims[c.UID]
		if !ok {
			out[c.UID] = nil
			continue
		}
		if err := removeCDISpec(d.o.CDIDir, c.UID); err != nil {
			out[c.UID] = err
			continue
		}
		delete(d.claims, c.UID)
		changed[c.UID] = pc
		out[c.UID] = nil
		logger.V(2).Info("Unprepared claim", "claim", c.NamespacedName, "claimUID", c.UID)
	}
	if len(changed) == 0 {
		return out, nil
	}
	if err := saveRecord(filepath.Join(d.o.StateDir, RecordFile), d.claims); err != nil {
		// Keep them prepared: the kubelet retries, and nothing is given twice.
		for uid, pc := range changed {
			d.claims[uid] = pc
			out[uid] = fmt.Errorf("unpreparing claim %s/%s: %w", pc.Namespace, pc.Name, err)
		}
	}
	return out, nil
}

// HandleError implements kubeletplugin.DRAPlugin: background errors are
// logged. Recoverable ones (publishing slices, reported by the resourceslice
// controller wrapped so that errors.Is(err, kubeletplugin.ErrRecoverable))
// are retried by the controller; a slice whose device taints the API server dropped (DRADeviceTaints off)
// switches the driver to leaving unhealthy GPUs out (see OnTaintsDropped).
// A fatal one (the DRA or registration gRPC server failed: the
// kubelet can prepare no claim on this node any more) goes to OnFatal, so
// gpufrac-node stops and is restarted instead of running on deaf.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	if errors.Is(err, grpc.ErrServerStopped) {
		return // the helper stopped its server before it served: shutting down
	}
	recoverable := errors.Is(err, kubeletplugin.ErrRecoverable)
	klog.FromContext(ctx).Error(err, msg, "recoverable", recoverable)
	var dropped *resourceslice.DroppedFieldsError
	taints := errors.As(err, &dropped) && slices.Contains(dropped.DisabledFeatures(), "DRADeviceTaints")
	d.mu.Lock()
	hook := d.errorHook
	var notify func()
	if taints && !d.taintsDropped {
		d.taintsDropped, notify = true, d.onTaintsDropped
	}
	var fatal func(error)
	if !recoverable && !d.fatal && d.onFatal != nil {
		d.fatal, fatal = true, d.onFatal
	}
	d.mu.Unlock()
	if fatal != nil {
		go fatal(fmt.Errorf("%s: %w", msg, err))
	}
	if hook != nil {
		hook(err, msg)
	}
	if notify != nil {
		klog.FromContext(ctx).Info("The API server drops device taints (DRADeviceTaints is off): unhealthy GPUs are left out of the published devices instead")
		go notify()
	}
}

// OnTaintsDropped sets what to call when the API server turns out to drop
// device taints (the caller republishes with TaintsDropped set).
func (d *Driver) OnTaintsDropped(f func()) {
	d.mu.Lock()
	d.onTaintsDropped = f
	d.mu.Unlock()
}

// OnFatal sets what to call with the first fatal background error (the
// caller stops the node agent).
func (d *Driver) OnFatal(f func(err error)) {
	d.mu.Lock()
	d.onFatal = f
	d.mu.Unlock()
}

// TaintsDropped tells whether the API server dropped device taints.
func (d *Driver) TaintsDropped() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.taintsDropped
}

// ClaimAllowance implements enforcement.ClaimSource from the prepared
// claims: the limit a shared device's container was told, unlimited for a
// whole GPU or a MIG device ("" GPU: a MIG UUID names no parent for the
// watchdog).
func (d *Driver) ClaimAllowance(cd pods.ClaimDevice) (string, enforcement.Allowance, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.claims {
		if c.Namespace != cd.ClaimNamespace || c.Name != cd.ClaimName {
			continue
		}
		for _, pd := range c.Devices {
			if pd.Device != cd.Device || pd.Pool != cd.Pool || pd.ShareID != cd.ShareID {
				continue
			}
			switch {
			case pd.View == api.DRAViewMIG:
				return "", enforcement.Allowance{Unlimited: true}, true
			case pd.Unlimited:
				return pd.GPU, enforcement.Allowance{Unlimited: true}, true
			}
			return pd.GPU, enforcement.Allowance{LimitBytes: pd.LimitMiB << 20}, true
		}
	}
	return "", enforcement.Allowance{}, false
}
