package resource

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/NVIDIA/go-gpuallocator/gpuallocator"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/config"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/mig"
)

// ErrModeNotSupported is returned for a sharing mode this node agent cannot
// serve: mode mig without a MIG inventory (Deps.MIG).
var ErrModeNotSupported = errors.New("mode not supported by this gpufrac-node")

// MIGInventory reads the MIG state of GPUs (nvidia.MIGLib implements it).
type MIGInventory interface {
	MIGMode(uuid string) (nvidia.MIGMode, error)
	MIGProfiles(uuid string) ([]mig.Profile, error)
	MIGInstances(uuid string) ([]mig.GPUInstance, error)
}

// Deps are what resources need besides the per-GPU modes and the inventory.
type Deps struct {
	Topology []*gpuallocator.Device
	Health   HealthFunc
	Usage    UsageSource
	Hint     PodHint
	Strategy DeviceListStrategy
	// Policy is the node's resolved policy: time-slicing, MIG strategy and
	// per-GPU MIG layouts. Nil means the defaults and no declared layouts.
	Policy *config.NodePolicy
	// MIG reads MIG modes, profiles and devices. Nil means this node agent
	// cannot serve MIG: mode mig fails with ErrModeNotSupported, and every
	// GPU counts as having MIG off.
	MIG MIGInventory
	// MIGCapsFile is the nvidia-caps minors file (default DefaultMIGCapsFile).
	MIGCapsFile string
	// Unread, when set, is told of each GPU Build leaves out because NVML
	// could not read its MIG state: its MIG mode or devices, or the MIG
	// profiles its declared layout needs checking against when no other GPU
	// of its model lists them.
	Unread func(gpu nvidia.GPU, err error)
}

// unread tells d.Unread, if set, that g was left out for err.
func (d Deps) unread(g nvidia.GPU, err error) {
	if d.Unread != nil {
		d.Unread(g, err)
	}
}

// Build turns a node's per-GPU modes (by index) and its GPUs into the
// resources to serve. It is the one place that decides which resources
// exist:
//
//   - exclusive: the GPU as nvidia.com/gpu.
//   - fraction: the GPU as nvidia.com/gpu too (the coordinator's reservation
//     pods hold a shared GPU whole so the two never collide) and as
//     gpufrac.io/gpu-fraction units.
//   - timeslice: the GPU as replicas of the time-sliced resource only.
//   - mig: the GPU's current MIG devices, as nvidia.com/mig-<profile> (mixed
//     strategy) or nvidia.com/gpu (single strategy; without a declared
//     layout only when every GPU has the same devices). A GPU whose devices
//     are not yet its declared layout serves none: the layout manager waits
//     for it to drain, and new pods must not land on it meanwhile.
//
// A GPU whose MIG mode is on cannot run work as a whole GPU, so it is not
// served in the first three modes until the layout manager has turned MIG
// off. The declared layouts are checked against each GPU's model (unknown
// profiles, layouts that do not fit), and mode mig without a layout on a GPU
// whose MIG is off is refused (unless mig.owner is external: the GPU then
// serves nothing until its owner enables MIG): Build fails naming every
// problem, so a config asking for them is rejected and the last good one
// stays.
//
// A GPU whose MIG mode or MIG devices NVML cannot read (a GPU the driver
// lost, say) is left out and d.Unread told, in every mode: it may be in
// MIG mode with its MIG devices in use, and one such GPU must not keep
// the node's other GPUs on an old config. Its declared layout is still
// checked, against the profiles of another GPU of its model when its own
// cannot be read, so that a layout that cannot work is refused now rather
// than accepted until the GPU is read again; with no such GPU it is left
// out unchecked. The node agent serves it again once it can be read.
func Build(modes []config.Mode, gpus []nvidia.GPU, d Deps) ([]Resource, error) {
	if len(modes) != len(gpus) {
		return nil, fmt.Errorf("building resources: %d GPU modes for %d GPUs", len(modes), len(gpus))
	}
	np := config.NodePolicy{}
	if d.Policy != nil {
		np = *d.Policy
	}
	sharing := np.Policy.Timeslice.Sharing()
	strategy := np.Policy.MIG.Strategy
	if strategy == "" {
		strategy = config.DefaultMIGStrategy
	}
	layoutOf := func(i int) string {
		if i < len(np.GPUMIGLayouts) {
			return np.GPUMIGLayouts[i]
		}
		return ""
	}

	var whole, frac, sliced []nvidia.GPU
	var migGPUs []migGPU
	var problems []string
	for i, g := range gpus {
		migOn := false
		var modeErr error
		if d.MIG != nil && g.MIGCapable {
			var mode nvidia.MIGMode
			mode, modeErr = d.MIG.MIGMode(g.UUID)
			migOn = modeErr == nil && mode.Current
		}
		switch modes[i] {
		case config.ModeExclusive, config.ModeFraction, config.ModeTimeslice:
			if modeErr != nil {
				d.unread(g, modeErr)
				continue
			}
			if migOn {
				continue // until the layout manager turns MIG off
			}
			switch modes[i] {
			case config.ModeExclusive:
				whole = append(whole, g)
			case config.ModeFraction:
				whole = append(whole, g)
				frac = append(frac, g)
			default:
				sliced = append(sliced, g)
			}
		case config.ModeMIG:
			if d.MIG == nil {
				return nil, fmt.Errorf("GPU %d (%s): mode %s: %w", g.Index, g.UUID, modes[i], ErrModeNotSupported)
			}
			mg, problem, err := readMIGGPU(d.MIG, g, gpus, layoutOf(i), migOn, modeErr, np.Policy.MIG.Owner == config.MIGOwnerExternal)
			if problem != "" {
				problems = append(problems, problem)
				continue
			}
			if err != nil {
				d.unread(g, err)
				continue
			}
			migGPUs = append(migGPUs, mg)
		default:
			return nil, fmt.Errorf("GPU %d (%s): unknown mode %q", g.Index, g.UUID, modes[i])
		}
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("MIG: %s", strings.Join(problems, "; "))
	}

	var out []Resource
	if len(whole) > 0 {
		rh, _ := d.Hint.(ReservationHint)
		ar, _ := d.Hint.(AllocationRecorder)
		out = append(out, NewWhole(WholeOptions{GPUs: whole, Topology: d.Topology, Health: d.Health, Usage: d.Usage, Strategy: d.Strategy,
			Reservations: rh, Allocations: ar}))
	}
	if len(frac) > 0 {
		out = append(out, NewFraction(FractionOptions{GPUs: frac, Health: d.Health, Usage: d.Usage, Hint: d.Hint, Strategy: d.Strategy}))
	}
	if len(sliced) > 0 {
		out = append(out, NewTimeslice(TimesliceOptions{Sharing: sharing, GPUs: sliced, Health: d.Health, Strategy: d.Strategy, Usage: d.Usage}))
	}
	migRes, err := buildMIG(strategy, migGPUs, gpus, d)
	if err != nil {
		return nil, err
	}
	if len(migRes) > 0 && len(whole) > 0 && strategy == config.MIGStrategySingle {
		return nil, fmt.Errorf("mig.strategy single serves MIG devices as %s, which GPUs in modes exclusive or fraction also use", api.ResourceGPU)
	}
	return append(out, migRes...), nil
}

// migGPU is one GPU in mode mig as Build sees it.
type migGPU struct {
	gpu nvidia.GPU
	// declared is the layout's GPU instances; nil without a layout.
	declared []mig.Profile
	layout   string
	// instances are the GPU's current instances (none while MIG is off).
	instances []mig.GPUInstance
}

// readMIGGPU reads a GPU in mode mig (all: the node's GPUs; modeErr: the
// failed read of its MIG mode, if it failed). problem describes a config
// that cannot work on this GPU; err an NVML failure that leaves the GPU
// out. A declared layout is checked even while the GPU cannot be read,
// against its model's profiles, so that a config that cannot work is
// refused then too rather than accepted until the GPU is read again; when
// no GPU of the model lists them the GPU is left out unchecked (refusing
// would keep every GPU of the node on its last good config, or fail the
// node closed at start, for one lost GPU).
func readMIGGPU(inv MIGInventory, g nvidia.GPU, all []nvidia.GPU, layout string, migOn bool, modeErr error, external bool) (mg migGPU, problem string, err error) {
	mg = migGPU{gpu: g, layout: layout}
	if !g.MIGCapable {
		return mg, fmt.Sprintf("GPU %d (%s) does not support MIG", g.Index, g.Name), nil
	}
	if layout != "" {
		profiles, err := profilesOf(inv, g, all)
		switch {
		case errors.Is(err, nvidia.ErrNotSupported) && !migOn:
			// Some drivers list profiles only once MIG is on: the layout
			// manager checks the layout after enabling it.
		case err != nil:
			return mg, "", fmt.Errorf("GPU %d: layout %q not checked: NVML cannot read the MIG profiles of the GPU or of another GPU of its model: %w",
				g.Index, layout, err)
		default:
			if mg.declared, err = mig.Expand(layout, profiles); err != nil {
				return mg, fmt.Sprintf("GPU %d (%s): layout %q: %v", g.Index, g.Name, layout, err), nil
			}
		}
	}
	if modeErr != nil {
		// Without its MIG mode, "no layout while MIG is off" cannot be
		// told: the GPU is left out until it can be read.
		return mg, "", fmt.Errorf("GPU %d: %w", g.Index, modeErr)
	}
	if layout == "" && !migOn && !external {
		// (With an external MIG owner the GPU serves nothing until the
		// owner enables MIG; the layout manager reports it.)
		return mg, fmt.Sprintf("GPU %d is in mode mig without a layout, which keeps the GPU's MIG devices, but its MIG mode is disabled: set mig.layout (or migLayout for the GPU)", g.Index), nil
	}
	if migOn {
		if mg.instances, err = inv.MIGInstances(g.UUID); err != nil {
			return mg, "", fmt.Errorf("GPU %d: %w", g.Index, err)
		}
	}
	return mg, "", nil
}

// profilesOf reads the MIG profiles of g or, where NVML cannot read them
// (a GPU it has lost), those of another MIG-capable GPU of the node of the
// same model and memory: the profiles are the model's. A twin whose driver
// lists profiles only while MIG is on answers ErrNotSupported for g too.
func profilesOf(inv MIGInventory, g nvidia.GPU, all []nvidia.GPU) ([]mig.Profile, error) {
	profiles, err := inv.MIGProfiles(g.UUID)
	if err == nil || errors.Is(err, nvidia.ErrNotSupported) {
		return profiles, err
	}
	for _, o := range all {
		if o.UUID == g.UUID || !o.MIGCapable || o.Name != g.Name || o.MemoryBytes != g.MemoryBytes {
			continue
		}
		p, oerr := inv.MIGProfiles(o.UUID)
		switch {
		case oerr == nil:
			return p, nil
		case errors.Is(oerr, nvidia.ErrNotSupported):
			return nil, oerr
		}
	}
	return nil, err
}

// buildMIG makes the MIG resources of the strategy.
func buildMIG(strategy string, migGPUs []migGPU, all []nvidia.GPU, d Deps) ([]Resource, error) {
	if len(migGPUs) == 0 {
		return nil, nil
	}
	newMIG := func(name string, devs []mig.Device) (Resource, error) {
		o := MIGOptions{Name: name, Devices: devs, GPUs: all, Health: d.Health, Strategy: d.Strategy, CapsFile: d.MIGCapsFile}
		if name == api.ResourceGPU {
			// The single strategy: the write-back reports nvidia.com/gpu
			// devices, MIG ones included (mixed profiles it does not).
			o.Allocations, _ = d.Hint.(AllocationRecorder)
		}
		return NewMIG(o)
	}
	switch strategy {
	case config.MIGStrategySingle:
		var devs []mig.Device
		first := -1
		for i, mg := range migGPUs {
			switch {
			case mg.layout != "":
				// GPUs still waiting for the declared layout serve nothing.
				if !mig.Matches(mg.instances, mg.declared) {
					continue
				}
			case len(mg.instances) == 0:
				// No MIG device (an external MIG owner has not enabled MIG
				// yet): nothing to serve, nothing to compare.
				continue
			case first < 0:
				first = i
			case mig.Describe(mg.instances) != mig.Describe(migGPUs[first].instances):
				return nil, fmt.Errorf("mig.strategy single needs the same MIG layout on every GPU, but GPU %d has %q and GPU %d has %q",
					migGPUs[first].gpu.Index, mig.Describe(migGPUs[first].instances), mg.gpu.Index, mig.Describe(mg.instances))
			}
			for _, gi := range mg.instances {
				devs = append(devs, gi.Devices...)
			}
		}
		if len(devs) == 0 {
			return nil, nil
		}
		r, err := newMIG(api.ResourceGPU, devs)
		if err != nil {
			return nil, err
		}
		return []Resource{r}, nil
	case config.MIGStrategyMixed:
		byProfile := map[string][]mig.Device{}
		for _, mg := range migGPUs {
			if mg.layout != "" && !mig.Matches(mg.instances, mg.declared) {
				continue // draining for its declared layout
			}
			for _, gi := range mg.instances {
				for _, dev := range gi.Devices {
					byProfile[dev.Profile] = append(byProfile[dev.Profile], dev)
				}
			}
		}
		profiles := make([]string, 0, len(byProfile))
		for p := range byProfile {
			profiles = append(profiles, p)
		}
		sort.Strings(profiles)
		out := make([]Resource, 0, len(profiles))
		for _, p := range profiles {
			r, err := newMIG(mig.ResourceName(p), byProfile[p])
			if err != nil {
				return nil, err
			}
			out = append(out, r)
		}
		return out, nil
	default:
		// config.Resolve refuses mode mig with strategy none.
		return nil, fmt.Errorf("mig.strategy %s serves no MIG devices, but GPUs are in mode mig", strategy)
	}
}
