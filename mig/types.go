package mig

// The MIG vocabulary both paths share: the GPU-instance profiles a GPU model
// offers, where instances sit, and the instances and devices a GPU holds.
// deviceplugin/nvidia fills these from NVML; the layout code in this package,
// the device-plugin resources and the DRA driver read them.

// Placement is where a GPU instance sits on its GPU, in NVML's placement
// units (memory slices: 8 on an A100, 7 on an H100).
type Placement struct {
	Start, Size int
}

// End is the first unit after the placement.
func (p Placement) End() int { return p.Start + p.Size }

// Overlaps tells whether two placements share a unit.
func (p Placement) Overlaps(q Placement) bool { return p.Start < q.End() && q.Start < p.End() }

// Profile is a GPU-instance profile a GPU supports.
type Profile struct {
	// ID is NVML's GPU-instance profile ID (nvml.GPU_INSTANCE_PROFILE_*).
	ID int
	// Name is the profile as nvidia-smi and the NVIDIA device plugin name
	// it: "<slices>g.<GB>gb" plus attributes ("1g.10gb", "1g.10gb+me",
	// "1g.20gb-me", "1g.24gb+gfx").
	Name string
	// Slices is the number of compute slices (the "g").
	Slices int
	// MemoryMB is the instance's memory in MiB, as NVML reports it.
	MemoryMB uint64
	// MaxInstances is how many instances of the profile fit on an empty GPU.
	MaxInstances int
	// Placements are the positions an instance may take, in NVML's order.
	Placements []Placement
}

// GPUInstance is one MIG GPU instance and the MIG devices (compute
// instances) inside it.
type GPUInstance struct {
	// GPU is the parent GPU's UUID.
	GPU string
	// ID is the GPU instance ID on its GPU.
	ID int
	// ProfileID is the GPU-instance profile ID.
	ProfileID int
	// Profile is the profile name ("3g.40gb").
	Profile string
	// Placement is where the instance sits.
	Placement Placement
	// MemoryBytes is the instance's memory.
	MemoryBytes uint64
	// Devices are its compute instances, by ID; empty for a GPU instance
	// without compute instances (which serves no MIG device).
	Devices []Device
}

// Device is one MIG device: a compute instance inside a GPU instance.
type Device struct {
	// UUID is the MIG device UUID ("MIG-...").
	UUID string
	// GPU is the parent GPU's UUID.
	GPU string
	// GI and CI are the GPU and compute instance IDs.
	GI, CI int
	// CIProfileID is the compute-instance profile ID.
	CIProfileID int
	// Profile names the device: the GPU instance's profile ("3g.40gb") when
	// the compute instance spans the whole GPU instance, else prefixed with
	// its compute slices ("1c.3g.40gb").
	Profile string
	// Full tells whether the compute instance spans its whole GPU instance.
	Full bool
	// MemoryBytes is the memory of its GPU instance, shared by its compute
	// instances.
	MemoryBytes uint64
}
