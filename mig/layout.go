// Package mig is the MIG vocabulary both serving paths share (the device
// plugin and the DRA driver): it names MIG profiles and their resources,
// expands a declared layout ("all-1g.10gb", "all-balanced",
// "3g.40gb,2g.20gb,1g.10gb") into GPU instances for one GPU model, places
// them on the GPU and says which steps turn one layout into another.
//
// Everything here is a pure function of the layout and the GPU's profile
// table (Profile), which NVML reports per GPU model. It imports nothing of
// the node agent: deviceplugin/nvidia fills these types from NVML, and the
// layout manager that applies layouts through NVML lives with the node agent
// (deviceplugin/miglayout).
package mig

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/gpufrac/gpufrac/api"
)

// Layout names: "all-<profile>" fills the GPU with one profile,
// "all-balanced" is one 3g, one 2g and two 1g instances (the layout of
// NVIDIA's mig-parted of the same name), anything else is a comma-separated
// list of GPU-instance profiles, one instance each.
const (
	layoutAllPrefix = "all-"
	layoutBalanced  = "all-balanced"
)

// ResourceName is the mixed-strategy resource of a MIG device profile:
// "nvidia.com/mig-1g.10gb". Resource names cannot hold "+", so attributes
// follow a dot, as with NVIDIA's device plugin: "1g.10gb+me" is served as
// "nvidia.com/mig-1g.10gb.me".
func ResourceName(profile string) string {
	return api.MIGResourcePrefix + strings.ReplaceAll(profile, "+", ".")
}

// Expand returns the GPU instances layout asks for on a GPU with the given
// profiles, as profiles sorted by size (largest first). It fails with a
// message naming the problem: an unknown profile for this GPU model (listing
// the known ones), a compute-instance profile, more instances of a profile
// than the model allows, or instances that do not fit on the GPU together.
// An empty layout expands to nothing.
func Expand(layout string, profiles []Profile) ([]Profile, error) {
	layout = strings.TrimSpace(layout)
	if layout == "" {
		return nil, nil
	}
	var want []Profile
	switch rest, all := strings.CutPrefix(layout, layoutAllPrefix); {
	case layout == layoutBalanced:
		for _, slices := range []int{3, 2, 1, 1} {
			p, ok := baseProfile(profiles, slices)
			if !ok {
				return nil, fmt.Errorf("layout %s: the GPU has no %dg profile", layoutBalanced, slices)
			}
			want = append(want, p)
		}
	case all:
		p, err := lookup(rest, profiles)
		if err != nil {
			return nil, err
		}
		// As many as fit: NVML's instance count is the upper bound.
		for n := p.MaxInstances; n > 0; n-- {
			try := slices.Repeat([]Profile{p}, n)
			if _, ok := Place(try, nil); ok {
				return try, nil
			}
		}
		return nil, fmt.Errorf("profile %s fits nowhere on the GPU", p.Name)
	default:
		for item := range strings.SplitSeq(layout, ",") {
			p, err := lookup(strings.TrimSpace(item), profiles)
			if err != nil {
				return nil, err
			}
			want = append(want, p)
		}
	}
	sortLargestFirst(want)
	if err := fits(want, profiles); err != nil {
		return nil, err
	}
	return want, nil
}

// lookup finds a GPU-instance profile by name.
func lookup(name string, profiles []Profile) (Profile, error) {
	for _, p := range profiles {
		if p.Name == name {
			return p, nil
		}
	}
	if c, gi, ok := strings.Cut(name, "c."); ok && c != "" && strings.Trim(c, "0123456789") == "" {
		return Profile{}, fmt.Errorf("%s is a compute-instance profile; layouts list GPU-instance profiles such as %s", name, gi)
	}
	return Profile{}, fmt.Errorf("unknown profile %s for this GPU model (it offers %s)", name, strings.Join(Names(profiles), ", "))
}

// Names lists profile names, smallest first.
func Names(profiles []Profile) []string {
	ps := slices.Clone(profiles)
	sort.SliceStable(ps, func(i, j int) bool {
		if ps[i].Slices != ps[j].Slices {
			return ps[i].Slices < ps[j].Slices
		}
		if ps[i].MemoryMB != ps[j].MemoryMB {
			return ps[i].MemoryMB < ps[j].MemoryMB
		}
		return ps[i].Name < ps[j].Name
	})
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.Name
	}
	return names
}

// baseProfile is the plain profile with the given compute slices: no
// attribute, lowest profile ID (1g.10gb rather than 1g.20gb on an H100).
func baseProfile(profiles []Profile, slices int) (Profile, bool) {
	var best Profile
	found := false
	for _, p := range profiles {
		if p.Slices != slices || strings.ContainsAny(p.Name, "+-") {
			continue
		}
		if !found || p.ID < best.ID {
			best, found = p, true
		}
	}
	return best, found
}

// fits checks instance counts, compute slices and placements of want.
func fits(want []Profile, profiles []Profile) error {
	count := map[int]int{} // profile ID -> instances wanted
	slicesUsed, slicesMax := 0, 0
	for _, p := range profiles {
		slicesMax = max(slicesMax, p.Slices)
	}
	for _, p := range want {
		count[p.ID]++
		slicesUsed += p.Slices
	}
	for _, p := range want {
		if count[p.ID] > p.MaxInstances {
			return fmt.Errorf("%d instances of %s, but the GPU allows at most %d", count[p.ID], p.Name, p.MaxInstances)
		}
	}
	if slicesUsed > slicesMax {
		return fmt.Errorf("does not fit the GPU: it needs %d compute slices, the GPU has %d", slicesUsed, slicesMax)
	}
	if _, ok := Place(want, nil); !ok {
		return fmt.Errorf("does not fit the GPU: no placement holds %s together", strings.Join(profileNames(want), ","))
	}
	return nil
}

// Place finds a placement for every profile in want, none overlapping
// another or the occupied placements, trying each profile's placements in
// NVML's order (largest profiles first, as NVML's own placement does, which
// keeps small instances from fragmenting the GPU). It returns the placements
// in want's order, or false when none exists.
func Place(want []Profile, occupied []Placement) ([]Placement, bool) {
	order := make([]int, len(want))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return size(want[order[a]]) > size(want[order[b]]) })
	out := make([]Placement, len(want))
	used := slices.Clone(occupied)
	var place func(k int) bool
	place = func(k int) bool {
		if k == len(order) {
			return true
		}
		p := want[order[k]]
		for _, at := range p.Placements {
			if overlapsAny(at, used) {
				continue
			}
			used = append(used, at)
			out[order[k]] = at
			if place(k + 1) {
				return true
			}
			used = used[:len(used)-1]
		}
		return false
	}
	if !place(0) {
		return nil, false
	}
	return out, true
}

// size is how many placement units an instance of p takes.
func size(p Profile) int {
	if len(p.Placements) == 0 {
		return p.Slices
	}
	return p.Placements[0].Size
}

func overlapsAny(at Placement, used []Placement) bool {
	for _, u := range used {
		if at.Overlaps(u) {
			return true
		}
	}
	return false
}

func sortLargestFirst(ps []Profile) {
	sort.SliceStable(ps, func(i, j int) bool {
		if ps[i].Slices != ps[j].Slices {
			return ps[i].Slices > ps[j].Slices
		}
		if ps[i].MemoryMB != ps[j].MemoryMB {
			return ps[i].MemoryMB > ps[j].MemoryMB
		}
		return ps[i].ID < ps[j].ID
	})
}

func profileNames(ps []Profile) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.Name
	}
	return out
}

// Describe writes the MIG devices of instances as a canonical layout:
// device profiles sorted largest first and joined by commas ("3g.40gb,
// 1g.10gb,1g.10gb" without spaces). Two GPUs serve the same MIG devices
// exactly when their descriptions are equal. GPU instances without a
// compute instance serve nothing and are left out.
func Describe(instances []GPUInstance) string {
	type dev struct {
		name string
		mem  uint64
	}
	var devs []dev
	for _, gi := range instances {
		for _, d := range gi.Devices {
			devs = append(devs, dev{d.Profile, d.MemoryBytes})
		}
	}
	sort.SliceStable(devs, func(i, j int) bool {
		if devs[i].mem != devs[j].mem {
			return devs[i].mem > devs[j].mem
		}
		return devs[i].name < devs[j].name
	})
	names := make([]string, len(devs))
	for i, d := range devs {
		names[i] = d.name
	}
	return strings.Join(names, ",")
}

// Matches tells whether instances are exactly want: one GPU instance per
// wanted profile (any placement), each holding one compute instance that
// spans it. An empty want matches only a GPU without instances.
func Matches(instances []GPUInstance, want []Profile) bool {
	if len(instances) != len(want) {
		return false
	}
	left := map[int]int{} // profile ID -> instances still expected
	for _, p := range want {
		left[p.ID]++
	}
	for _, gi := range instances {
		if !gi.Clean() || left[gi.ProfileID] == 0 {
			return false
		}
		left[gi.ProfileID]--
	}
	return true
}

// Clean tells whether a GPU instance holds exactly one compute instance
// spanning all of it, the shape the layout manager creates.
func (gi GPUInstance) Clean() bool {
	return len(gi.Devices) == 1 && gi.Devices[0].Full
}

// Step is one change the layout manager makes on a GPU.
type Step struct {
	// Destroy is the ID of a GPU instance to destroy, or -1.
	Destroy int
	// Create is the profile to create at At when Destroy is -1.
	Create Profile
	At     Placement
}

// Diff returns the steps that turn instances into want: destroy the
// instances that are not part of it, then create the missing ones. It keeps
// every clean instance of a wanted profile where it is when the rest still
// fits around it, else it starts from an empty GPU. Destroy steps come
// first, creations largest first. No steps means instances already match.
func Diff(instances []GPUInstance, want []Profile) []Step {
	if Matches(instances, want) {
		return nil
	}
	if steps, ok := diffKeeping(instances, want); ok {
		return steps
	}
	steps := make([]Step, 0, len(instances)+len(want))
	for _, gi := range instances {
		steps = append(steps, Step{Destroy: gi.ID})
	}
	at, ok := Place(want, nil)
	if !ok {
		// Expand only returns layouts that fit an empty GPU.
		return steps
	}
	for i, p := range want {
		steps = append(steps, Step{Destroy: -1, Create: p, At: at[i]})
	}
	return steps
}

// diffKeeping keeps the clean instances of wanted profiles and places the
// rest around them.
func diffKeeping(instances []GPUInstance, want []Profile) ([]Step, bool) {
	left := map[int]int{} // profile ID -> instances still to provide
	for _, p := range want {
		left[p.ID]++
	}
	var steps []Step
	var kept []Placement
	for _, gi := range instances {
		if gi.Clean() && left[gi.ProfileID] > 0 {
			left[gi.ProfileID]--
			kept = append(kept, gi.Placement)
			continue
		}
		steps = append(steps, Step{Destroy: gi.ID})
	}
	var missing []Profile
	for _, p := range want {
		if left[p.ID] > 0 {
			left[p.ID]--
			missing = append(missing, p)
		}
	}
	at, ok := Place(missing, kept)
	if !ok {
		return nil, false
	}
	for i, p := range missing {
		steps = append(steps, Step{Destroy: -1, Create: p, At: at[i]})
	}
	return steps, true
}
