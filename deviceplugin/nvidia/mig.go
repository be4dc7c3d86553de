package nvidia

import (
	"errors"
	"fmt"
	"math"
	"sort"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpufrac/gpufrac/mig"
)

// MIGLib is the part of NVML the MIG layout manager and the MIG resources
// use: MIG mode, the GPU-instance profiles a GPU offers, and the lifecycle
// of GPU and compute instances. Both backends implement it (a Lib from
// NewReal or NewMock also satisfies MIGLib); the mock synthesizes MIG device
// UUIDs because go-nvml's mock servers panic on MIG device handles.
//
// GPUs are named by UUID. Calls on a GPU without MIG support return an error
// matching ErrNotSupported. Implementations are safe for concurrent use, but
// callers must serialize changes to one GPU's layout: NVML does not.
type MIGLib interface {
	// MIGMode reports the GPU's current and pending MIG mode.
	MIGMode(uuid string) (MIGMode, error)
	// SetMIGMode asks for MIG mode on or off. It returns nil when the mode
	// is in effect on return. When the driver could not activate it (the
	// GPU needs a reset, or is in use) the error matches ErrResetRequired or
	// ErrInUse and the requested mode stays PENDING: the caller decides
	// whether to restore the previous one. A successful change may reset
	// the GPU; cached handles for it are dropped.
	SetMIGMode(uuid string, enabled bool) error
	// MIGProfiles lists the GPU-instance profiles the GPU supports, by
	// profile ID.
	MIGProfiles(uuid string) ([]mig.Profile, error)
	// MIGInstances lists the GPU's GPU instances (by ID) with their
	// compute instances, each of which is a MIG device.
	MIGInstances(uuid string) ([]mig.GPUInstance, error)
	// CreateMIGInstance creates a GPU instance of the profile at the
	// placement, plus one compute instance spanning all of it, and returns
	// it. If the compute instance cannot be created the GPU instance is
	// destroyed again.
	CreateMIGInstance(uuid string, profileID int, at mig.Placement) (mig.GPUInstance, error)
	// DestroyMIGInstance destroys a GPU instance and its compute instances.
	// An unknown ID matches ErrNotFound.
	DestroyMIGInstance(uuid string, gi int) error
}

var (
	_ MIGLib = (*nvmlLib)(nil)
	_ MIGLib = (*Mock)(nil)
)

// ErrResetRequired means a MIG mode change was accepted but only takes
// effect after a GPU reset (NVML activation status NVML_ERROR_RESET_REQUIRED,
// or a platform that cannot reset the GPU itself).
var ErrResetRequired = errors.New("mig mode change needs a gpu reset")

// ErrInUse means the GPU or instance is in use by a process
// (NVML_ERROR_IN_USE): a MIG mode change cannot be activated, or an
// instance cannot be destroyed, until the processes end.
var ErrInUse = errors.New("in use by a process")

// MIGMode is a GPU's MIG mode: Current is in effect, Pending takes effect
// at the next GPU reset (they differ only while a change waits for one).
type MIGMode struct {
	Current, Pending bool
}

// migUUIDFunc returns the MIG device UUIDs of a GPU keyed by (GI, CI).
type migUUIDFunc func(d nvml.Device, parent string) (map[[2]int]string, error)

// MIGMode implements MIGLib.
func (n *nvmlLib) MIGMode(uuid string) (MIGMode, error) {
	d, err := n.device(uuid)
	if err != nil {
		return MIGMode{}, fmt.Errorf("getting MIG mode of %s: %w", uuid, err)
	}
	cur, pend, ret := d.GetMigMode()
	if ret != nvml.SUCCESS {
		return MIGMode{}, fmt.Errorf("getting MIG mode of %s: %w", uuid, nvmlError(ret))
	}
	return MIGMode{Current: cur == nvml.DEVICE_MIG_ENABLE, Pending: pend == nvml.DEVICE_MIG_ENABLE}, nil
}

// SetMIGMode implements MIGLib.
func (n *nvmlLib) SetMIGMode(uuid string, enabled bool) error {
	d, err := n.device(uuid)
	if err != nil {
		return fmt.Errorf("setting MIG mode of %s: %w", uuid, err)
	}
	mode := nvml.DEVICE_MIG_DISABLE
	if enabled {
		mode = nvml.DEVICE_MIG_ENABLE
	}
	ret, activation := d.SetMigMode(mode)
	if ret != nvml.SUCCESS {
		return fmt.Errorf("setting MIG mode of %s to %v: %w", uuid, enabled, nvmlError(ret))
	}
	// The driver may have reset the GPU to activate the mode; NVML asks
	// callers to look its attributes up again.
	n.mu.Lock()
	delete(n.handles, uuid)
	n.mu.Unlock()
	if err := activationError(activation); err != nil {
		return fmt.Errorf("activating MIG mode %v on %s: %w", enabled, uuid, err)
	}
	return nil
}

// activationError converts SetMigMode's activation status to an error.
func activationError(ret nvml.Return) error {
	switch ret {
	case nvml.SUCCESS:
		return nil
	case nvml.ERROR_RESET_REQUIRED:
		return fmt.Errorf("%w: %w", ErrResetRequired, nvmlError(ret))
	case nvml.ERROR_IN_USE:
		return fmt.Errorf("%w: %w", ErrInUse, nvmlError(ret))
	default:
		return nvmlError(ret)
	}
}

// MIGProfiles implements MIGLib.
func (n *nvmlLib) MIGProfiles(uuid string) ([]mig.Profile, error) {
	d, err := n.device(uuid)
	if err != nil {
		return nil, fmt.Errorf("listing MIG profiles of %s: %w", uuid, err)
	}
	total, err := totalMemory(d, uuid)
	if err != nil {
		return nil, fmt.Errorf("listing MIG profiles of %s: %w", uuid, err)
	}
	var out []mig.Profile
	for id := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		info, ret := d.GetGpuInstanceProfileInfo(id)
		switch ret {
		case nvml.SUCCESS:
		case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_INVALID_ARGUMENT, nvml.ERROR_NOT_FOUND:
			continue
		default:
			return nil, fmt.Errorf("getting MIG profile %d of %s: %w", id, uuid, nvmlError(ret))
		}
		if info.InstanceCount == 0 {
			continue
		}
		placements, ret := d.GetGpuInstancePossiblePlacements(&info)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("getting placements of MIG profile %d of %s: %w", id, uuid, nvmlError(ret))
		}
		p := mig.Profile{
			ID:           id,
			Name:         ProfileName(id, int(info.SliceCount), info.MemorySizeMB, total),
			Slices:       int(info.SliceCount),
			MemoryMB:     info.MemorySizeMB,
			MaxInstances: int(info.InstanceCount),
		}
		for _, pl := range placements {
			p.Placements = append(p.Placements, mig.Placement{Start: int(pl.Start), Size: int(pl.Size)})
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("listing MIG profiles of %s: %w", uuid, ErrNotSupported)
	}
	return out, nil
}

// totalMemory is the GPU's framebuffer size, which profile names are relative to.
func totalMemory(d nvml.Device, uuid string) (uint64, error) {
	mem, ret := d.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return 0, fmt.Errorf("getting memory of %s: %w", uuid, nvmlError(ret))
	}
	return mem.Total, nil
}

// ProfileName names a GPU-instance profile the way nvidia-smi and the NVIDIA
// device plugin do: "<slices>g.<GB>gb" with GB the instance's share of the
// GPU's memory rounded up to eighths, times the GPU's size in whole GB; then
// the attribute the profile ID carries: "+me" (media extensions), "-me"
// (none), "+me.all" (all of the GPU's) or "+gfx" (graphics).
func ProfileName(profileID, slices int, memoryMB, totalBytes uint64) string {
	return fmt.Sprintf("%dg.%dgb%s", slices, profileGB(memoryMB, totalBytes), profileAttribute(profileID))
}

// profileGB is the "<GB>" of a profile name (go-nvlib's getMigMemorySizeGB).
func profileGB(memoryMB, totalBytes uint64) uint64 {
	if totalBytes == 0 {
		return (memoryMB + 1023) / 1024
	}
	const eighths = 8
	share := float64(memoryMB<<20) / float64(totalBytes)
	share = math.Ceil(share*eighths) / eighths
	totalGB := float64((totalBytes + 1<<30 - 1) >> 30)
	return uint64(math.Round(share * totalGB))
}

// profileAttribute is the name suffix of a GPU-instance profile ID.
func profileAttribute(id int) string {
	switch id {
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1:
		return "+me"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME, nvml.GPU_INSTANCE_PROFILE_2_SLICE_NO_ME:
		return "-me"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME, nvml.GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME:
		return "+me.all"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_GFX, nvml.GPU_INSTANCE_PROFILE_2_SLICE_GFX,
		nvml.GPU_INSTANCE_PROFILE_3_SLICE_GFX, nvml.GPU_INSTANCE_PROFILE_4_SLICE_GFX:
		return "+gfx"
	}
	return ""
}

// MIGInstances implements MIGLib, reading MIG device UUIDs from NVML.
func (n *nvmlLib) MIGInstances(uuid string) ([]mig.GPUInstance, error) {
	return n.migInstances(uuid, readMIGUUIDs)
}

// migInstances lists uuid's GPU instances; uuids names their MIG devices.
func (n *nvmlLib) migInstances(uuid string, uuids migUUIDFunc) ([]mig.GPUInstance, error) {
	d, err := n.device(uuid)
	if err != nil {
		return nil, fmt.Errorf("listing MIG instances of %s: %w", uuid, err)
	}
	gis, err := listGPUInstances(d, uuid)
	if err != nil {
		return nil, fmt.Errorf("listing MIG instances of %s: %w", uuid, err)
	}
	total, err := totalMemory(d, uuid)
	if err != nil {
		return nil, fmt.Errorf("listing MIG instances of %s: %w", uuid, err)
	}
	var ids map[[2]int]string
	out := make([]mig.GPUInstance, 0, len(gis))
	for _, gi := range gis {
		inst, err := describeGPUInstance(gi, uuid, total)
		if err != nil {
			return nil, fmt.Errorf("listing MIG instances of %s: %w", uuid, err)
		}
		if len(inst.Devices) > 0 && ids == nil {
			if ids, err = uuids(d, uuid); err != nil {
				return nil, fmt.Errorf("listing MIG devices of %s: %w", uuid, err)
			}
		}
		for i := range inst.Devices {
			dev := &inst.Devices[i]
			u, ok := ids[[2]int{dev.GI, dev.CI}]
			if !ok {
				return nil, fmt.Errorf("listing MIG devices of %s: no MIG device handle for GPU instance %d, compute instance %d: %w", uuid, dev.GI, dev.CI, ErrNotFound)
			}
			dev.UUID = u
		}
		out = append(out, inst)
	}
	return out, nil
}

// gpuInstanceHandle is an NVML GPU instance with its info.
type gpuInstanceHandle struct {
	gi      nvml.GpuInstance
	info    nvml.GpuInstanceInfo
	profile nvml.GpuInstanceProfileInfo
}

// listGPUInstances returns d's GPU instances sorted by ID. NVML lists them
// per profile, so every supported profile is asked.
func listGPUInstances(d nvml.Device, uuid string) ([]gpuInstanceHandle, error) {
	var out []gpuInstanceHandle
	for id := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		prof, ret := d.GetGpuInstanceProfileInfo(id)
		switch ret {
		case nvml.SUCCESS:
		case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_INVALID_ARGUMENT, nvml.ERROR_NOT_FOUND:
			continue
		default:
			return nil, fmt.Errorf("getting MIG profile %d: %w", id, nvmlError(ret))
		}
		gis, ret := d.GetGpuInstances(&prof)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("listing GPU instances of profile %d: %w", id, nvmlError(ret))
		}
		for _, gi := range gis {
			info, ret := gi.GetInfo()
			if ret != nvml.SUCCESS {
				return nil, fmt.Errorf("getting GPU instance info: %w", nvmlError(ret))
			}
			out = append(out, gpuInstanceHandle{gi: gi, info: info, profile: prof})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].info.Id < out[j].info.Id })
	return out, nil
}

// describeGPUInstance reads a GPU instance and its compute instances
// (without their MIG device UUIDs).
func describeGPUInstance(h gpuInstanceHandle, parent string, total uint64) (mig.GPUInstance, error) {
	name := ProfileName(int(h.profile.Id), int(h.profile.SliceCount), h.profile.MemorySizeMB, total)
	inst := mig.GPUInstance{
		GPU:         parent,
		ID:          int(h.info.Id),
		ProfileID:   int(h.profile.Id),
		Profile:     name,
		Placement:   mig.Placement{Start: int(h.info.Placement.Start), Size: int(h.info.Placement.Size)},
		MemoryBytes: h.profile.MemorySizeMB << 20,
	}
	cis, err := listComputeInstances(h.gi)
	if err != nil {
		return inst, fmt.Errorf("GPU instance %d: %w", inst.ID, err)
	}
	for _, c := range cis {
		dev := mig.Device{
			GPU:         parent,
			GI:          inst.ID,
			CI:          int(c.info.Id),
			CIProfileID: int(c.profile.Id),
			Profile:     name,
			Full:        c.profile.SliceCount == h.profile.SliceCount,
			MemoryBytes: inst.MemoryBytes,
		}
		if !dev.Full {
			dev.Profile = fmt.Sprintf("%dc.%s", c.profile.SliceCount, name)
		}
		inst.Devices = append(inst.Devices, dev)
	}
	return inst, nil
}

// computeInstanceHandle is an NVML compute instance with its info.
type computeInstanceHandle struct {
	ci      nvml.ComputeInstance
	info    nvml.ComputeInstanceInfo
	profile nvml.ComputeInstanceProfileInfo
}

// listComputeInstances returns gi's compute instances sorted by ID.
func listComputeInstances(gi nvml.GpuInstance) ([]computeInstanceHandle, error) {
	var out []computeInstanceHandle
	for id := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		prof, ret := gi.GetComputeInstanceProfileInfo(id, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		switch ret {
		case nvml.SUCCESS:
		case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_INVALID_ARGUMENT, nvml.ERROR_NOT_FOUND:
			continue
		default:
			return nil, fmt.Errorf("getting compute instance profile %d: %w", id, nvmlError(ret))
		}
		cis, ret := gi.GetComputeInstances(&prof)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("listing compute instances of profile %d: %w", id, nvmlError(ret))
		}
		for _, ci := range cis {
			info, ret := ci.GetInfo()
			if ret != nvml.SUCCESS {
				return nil, fmt.Errorf("getting compute instance info: %w", nvmlError(ret))
			}
			out = append(out, computeInstanceHandle{ci: ci, info: info, profile: prof})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].info.Id < out[j].info.Id })
	return out, nil
}

// readMIGUUIDs reads the UUIDs of d's MIG devices through their NVML
// handles (real driver only: the mock servers panic on these calls).
func readMIGUUIDs(d nvml.Device, parent string) (map[[2]int]string, error) {
	count, ret := d.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("getting MIG device count of %s: %w", parent, nvmlError(ret))
	}
	out := map[[2]int]string{}
	for i := range count {
		md, ret := d.GetMigDeviceHandleByIndex(i)
		switch ret {
		case nvml.SUCCESS:
		case nvml.ERROR_NOT_FOUND, nvml.ERROR_INVALID_ARGUMENT:
			continue // an empty MIG device slot
		default:
			return nil, fmt.Errorf("getting MIG device %d of %s: %w", i, parent, nvmlError(ret))
		}
		gi, ret := md.GetGpuInstanceId()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("getting GPU instance of MIG device %d of %s: %w", i, parent, nvmlError(ret))
		}
		ci, ret := md.GetComputeInstanceId()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("getting compute instance of MIG device %d of %s: %w", i, parent, nvmlError(ret))
		}
		u, ret := md.GetUUID()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("getting UUID of MIG device %d of %s: %w", i, parent, nvmlError(ret))
		}
		out[[2]int{gi, ci}] = u
	}
	return out, nil
}

// CreateMIGInstance implements MIGLib.
func (n *nvmlLib) CreateMIGInstance(uuid string, profileID int, at mig.Placement) (mig.GPUInstance, error) {
	return n.createMIGInstance(uuid, profileID, at, readMIGUUIDs)
}

func (n *nvmlLib) createMIGInstance(uuid string, profileID int, at mig.Placement, uuids migUUIDFunc) (mig.GPUInstance, error) {
	fail := func(err error) (mig.GPUInstance, error) {
		return mig.GPUInstance{}, fmt.Errorf("creating MIG instance of profile %d at %d+%d on %s: %w", profileID, at.Start, at.Size, uuid, err)
	}
	d, err := n.device(uuid)
	if err != nil {
		return fail(err)
	}
	prof, ret := d.GetGpuInstanceProfileInfo(profileID)
	if ret != nvml.SUCCESS {
		return fail(fmt.Errorf("getting profile: %w", nvmlError(ret)))
	}
	placement := nvml.GpuInstancePlacement{Start: uint32(at.Start), Size: uint32(at.Size)}
	gi, ret := d.CreateGpuInstanceWithPlacement(&prof, &placement)
	if ret != nvml.SUCCESS {
		return fail(fmt.Errorf("creating GPU instance: %w", nvmlError(ret)))
	}
	ciProf, err := fullComputeProfile(gi, int(prof.SliceCount))
	if err == nil {
		if _, ret := gi.CreateComputeInstance(&ciProf); ret != nvml.SUCCESS {
			err = fmt.Errorf("creating compute instance: %w", nvmlError(ret))
		}
	}
	if err != nil {
		// Leave no GPU instance without a compute instance behind.
		if ret := gi.Destroy(); ret != nvml.SUCCESS {
			err = fmt.Errorf("%w (and destroying the GPU instance again: %w)", err, nvmlError(ret))
		}
		return fail(err)
	}
	info, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return fail(fmt.Errorf("getting GPU instance info: %w", nvmlError(ret)))
	}
	total, err := totalMemory(d, uuid)
	if err != nil {
		return fail(err)
	}
	inst, err := describeGPUInstance(gpuInstanceHandle{gi: gi, info: info, profile: prof}, uuid, total)
	if err != nil {
		return fail(err)
	}
	ids, err := uuids(d, uuid)
	if err != nil {
		return fail(err)
	}
	for i := range inst.Devices {
		inst.Devices[i].UUID = ids[[2]int{inst.ID, inst.Devices[i].CI}]
	}
	return inst, nil
}

// fullComputeProfile returns the compute-instance profile of gi that spans
// all its slices (the lowest such profile ID).
func fullComputeProfile(gi nvml.GpuInstance, slices int) (nvml.ComputeInstanceProfileInfo, error) {
	for id := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		prof, ret := gi.GetComputeInstanceProfileInfo(id, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret == nvml.SUCCESS && int(prof.SliceCount) == slices {
			return prof, nil
		}
	}
	return nvml.ComputeInstanceProfileInfo{}, fmt.Errorf("no compute instance profile spans %d slices: %w", slices, ErrNotSupported)
}

// DestroyMIGInstance implements MIGLib.
func (n *nvmlLib) DestroyMIGInstance(uuid string, id int) error {
	d, err := n.device(uuid)
	if err != nil {
		return fmt.Errorf("destroying MIG instance %d on %s: %w", id, uuid, err)
	}
	gis, err := listGPUInstances(d, uuid)
	if err != nil {
		return fmt.Errorf("destroying MIG instance %d on %s: %w", id, uuid, err)
	}
	for _, h := range gis {
		if int(h.info.Id) != id {
			continue
		}
		cis, err := listComputeInstances(h.gi)
		if err != nil {
			return fmt.Errorf("destroying MIG instance %d on %s: %w", id, uuid, err)
		}
		for _, c := range cis {
			if ret := c.ci.Destroy(); ret != nvml.SUCCESS {
				return fmt.Errorf("destroying compute instance %d of MIG instance %d on %s: %w", c.info.Id, id, uuid, destroyError(ret))
			}
		}
		if ret := h.gi.Destroy(); ret != nvml.SUCCESS {
			return fmt.Errorf("destroying MIG instance %d on %s: %w", id, uuid, destroyError(ret))
		}
		return nil
	}
	return fmt.Errorf("destroying MIG instance %d on %s: no such GPU instance: %w", id, uuid, ErrNotFound)
}

// destroyError adds ErrInUse to NVML's IN_USE answer.
func destroyError(ret nvml.Return) error {
	if ret == nvml.ERROR_IN_USE {
		return fmt.Errorf("%w: %w", ErrInUse, nvmlError(ret))
	}
	return nvmlError(ret)
}
