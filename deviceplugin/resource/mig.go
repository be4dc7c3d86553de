package resource

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/mig"
)

// DefaultMIGCapsFile lists the device minors of the nvidia-caps devices
// that grant access to MIG GPU and compute instances
// ("gpu0/gi1/access 21", "gpu0/gi1/ci0/access 22").
const DefaultMIGCapsFile = "/proc/driver/nvidia-caps/mig-minors"

// MIG serves MIG devices of one resource (one profile in the mixed
// strategy, all of them as nvidia.com/gpu in the single strategy). The
// device ID is the MIG UUID. A MIG device is as healthy as its parent GPU:
// an Xid on the GPU makes all its MIG devices unhealthy.
type MIG struct {
	name     string
	devs     []mig.Device   // by parent index, then GI and CI
	byID     map[string]int // MIG UUID -> index in devs
	parents  map[string]nvidia.GPU
	health   HealthFunc
	strategy DeviceListStrategy
	capsFile string
	allocs   AllocationRecorder
}

var _ Resource = (*MIG)(nil)

// MIGOptions configures a MIG resource.
type MIGOptions struct {
	// Name is the resource name.
	Name string
	// Devices are the MIG devices to serve.
	Devices []mig.Device
	// GPUs are the node's GPUs; every device's parent must be among them.
	GPUs   []nvidia.GPU
	Health HealthFunc
	// Strategy is how devices reach containers: device specs (the parent
	// GPU and the MIG capability devices, whose minors come from CapsFile)
	// or CDI names ("nvidia.com/gpu=MIG-...").
	Strategy DeviceListStrategy
	// CapsFile defaults to DefaultMIGCapsFile.
	CapsFile string
	// Allocations, when set, is told of every allocation (Build sets it in
	// the single strategy, whose devices the write-back reports).
	Allocations AllocationRecorder
}

// NewMIG builds a MIG resource. Devices whose parent is not among the GPUs
// are an error.
func NewMIG(o MIGOptions) (*MIG, error) {
	r := &MIG{
		name:     o.Name,
		byID:     map[string]int{},
		parents:  map[string]nvidia.GPU{},
		health:   o.Health,
		strategy: o.Strategy,
		capsFile: o.CapsFile,
		allocs:   o.Allocations,
	}
	if r.health == nil {
		r.health = AllHealthy
	}
	if r.strategy == "" {
		r.strategy = StrategyDeviceSpecs
	}
	if r.capsFile == "" {
		r.capsFile = DefaultMIGCapsFile
	}
	for _, g := range o.GPUs {
		r.parents[g.UUID] = g
	}
	for _, d := range o.Devices {
		if _, ok := r.parents[d.GPU]; !ok {
			return nil, fmt.Errorf("building %s: MIG device %s is on unknown GPU %s", o.Name, d.UUID, d.GPU)
		}
		if _, dup := r.byID[d.UUID]; dup {
			return nil, fmt.Errorf("building %s: MIG device %s listed twice", o.Name, d.UUID)
		}
		r.byID[d.UUID] = -1
		r.devs = append(r.devs, d)
	}
	sort.SliceStable(r.devs, func(i, j int) bool {
		a, b := r.devs[i], r.devs[j]
		if pa, pb := r.parents[a.GPU].Index, r.parents[b.GPU].Index; pa != pb {
			return pa < pb
		}
		if a.GI != b.GI {
			return a.GI < b.GI
		}
		return a.CI < b.CI
	})
	for i, d := range r.devs {
		r.byID[d.UUID] = i
	}
	return r, nil
}

// Name implements Resource.
func (r *MIG) Name() string { return r.name }

// Devices implements Resource: one device per MIG device, with its parent
// GPU's health.
func (r *MIG) Devices() []*pluginapi.Device {
	devs := make([]*pluginapi.Device, len(r.devs))
	for i, d := range r.devs {
		devs[i] = &pluginapi.Device{ID: d.UUID, Health: healthString(r.health(d.GPU))}
	}
	return devs
}

// Preferred implements Resource. It packs: devices on the GPU with the
// fewest free devices of this resource come first (then lower GPU index,
// GPU and compute instance), so partly used GPUs fill up and idle GPUs stay
// idle, free for a layout change.
func (r *MIG) Preferred(_ context.Context, available, mustInclude []string, size int) ([]string, error) {
	if size <= 0 {
		return nil, fmt.Errorf("preferred allocation of %d MIG devices: size must be positive", size)
	}
	freePerGPU := map[string]int{}
	for _, id := range append(append([]string(nil), available...), mustInclude...) {
		if _, ok := r.byID[id]; !ok {
			return nil, fmt.Errorf("preferred allocation: unknown MIG device %q", id)
		}
	}
	for _, id := range available {
		freePerGPU[r.devs[r.byID[id]].GPU]++
	}
	if len(available) < size {
		return nil, fmt.Errorf("preferred allocation of %d %s devices: only %d available", size, r.name, len(available))
	}
	cands := append([]string(nil), available...)
	sort.SliceStable(cands, func(i, j int) bool {
		a, b := r.devs[r.byID[cands[i]]], r.devs[r.byID[cands[j]]]
		if freePerGPU[a.GPU] != freePerGPU[b.GPU] {
			return freePerGPU[a.GPU] < freePerGPU[b.GPU]
		}
		return r.byID[cands[i]] < r.byID[cands[j]]
	})
	ids := append(make([]string, 0, size), mustInclude...)
	for _, id := range cands {
		if len(ids) == size {
			break
		}
		if !contains(ids, id) {
			ids = append(ids, id)
		}
	}
	if len(ids) != size {
		return nil, fmt.Errorf("preferred allocation of %d %s devices: cannot satisfy must-include %v", size, r.name, mustInclude)
	}
	return ids, nil
}

// Allocate implements Resource: access to the MIG devices, no memory limit
// (the hardware isolates MIG memory). An allocation given is told to the
// AllocationRecorder.
func (r *MIG) Allocate(ctx context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	devs := make([]mig.Device, 0, len(ids))
	for _, id := range ids {
		i, ok := r.byID[id]
		if !ok {
			return nil, fmt.Errorf("allocating MIG device %q: unknown device", id)
		}
		devs = append(devs, r.devs[i])
	}
	resp, err := MIGResponse(r.strategy, devs, r.parents, r.capsFile)
	if err != nil {
		return nil, err
	}
	if r.allocs != nil {
		r.allocs.DevicesAllocated(ctx, ids)
	}
	return resp, nil
}

// MIGResponse is the answer for a container holding MIG devices: access to
// them (CDI names, or the GPU's device node and the instances' nvidia-caps
// nodes read from capsFile) and NVIDIA_VISIBLE_DEVICES=void, no memory limit
// (the hardware isolates MIG memory). parents maps GPU UUID to GPU.
func MIGResponse(strategy DeviceListStrategy, devs []mig.Device, parents map[string]nvidia.GPU, capsFile string) (*pluginapi.ContainerAllocateResponse, error) {
	resp := newResponse(nil)
	if strategy == StrategyCDI {
		for _, d := range devs {
			resp.CdiDevices = append(resp.CdiDevices, &pluginapi.CDIDevice{Name: CDIKind + "=" + d.UUID})
		}
		return resp, nil
	}
	caps, err := readMIGCaps(capsFile)
	if err != nil {
		return nil, fmt.Errorf("allocating %d MIG devices: %w", len(devs), err)
	}
	seen := map[string]bool{}
	add := func(p string) {
		if !seen[p] {
			seen[p] = true
			resp.Devices = append(resp.Devices, &pluginapi.DeviceSpec{ContainerPath: p, HostPath: p, Permissions: "rw"})
		}
	}
	for _, d := range devs {
		minor := parents[d.GPU].Minor
		gi := fmt.Sprintf("gpu%d/gi%d/access", minor, d.GI)
		ci := fmt.Sprintf("gpu%d/gi%d/ci%d/access", minor, d.GI, d.CI)
		giCap, ok1 := caps[gi]
		ciCap, ok2 := caps[ci]
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("allocating MIG device %s: %s has no minor for %s or %s", d.UUID, capsFile, gi, ci)
		}
		add(fmt.Sprintf("/dev/nvidia%d", minor))
		add(fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", giCap))
		add(fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", ciCap))
	}
	for _, p := range controlDevices {
		add(p)
	}
	return resp, nil
}

// readMIGCaps reads the nvidia-caps minors file: "<name> <minor>" per line.
func readMIGCaps(path string) (map[string]int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading MIG capability minors: %w", err)
	}
	defer f.Close()
	out := map[string]int{}
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 2 {
			return nil, fmt.Errorf("reading MIG capability minors: %s:%d: want \"<name> <minor>\"", path, line)
		}
		minor, err := strconv.Atoi(fields[1])
		if err != nil || minor < 0 {
			return nil, fmt.Errorf("reading MIG capability minors: %s:%d: %q is not a minor number", path, line, fields[1])
		}
		out[fields[0]] = minor
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading MIG capability minors: %w", err)
	}
	return out, nil
}
