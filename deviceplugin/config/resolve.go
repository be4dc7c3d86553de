package config

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// SourceDefault is [NodePolicy.Source] when no group matched the node.
const SourceDefault = "default"

// NodePolicy is the partitioning of one node's GPUs, resolved from a [File]
// for the node's labels and GPU count.
type NodePolicy struct {
	// Policy is the effective policy: the matching group's fields over the
	// default policy, every default filled in. Policy.GPUs is the list of
	// per-GPU overrides that applied.
	Policy Policy
	// GPUModes holds the mode of each GPU, by index.
	GPUModes []Mode
	// GPUMIGLayouts holds, by index, the MIG layout of each GPU in mode mig
	// (its override's migLayout, else mig.layout) and "" for the others. An
	// empty layout on a mig GPU means "keep the GPU's current MIG layout".
	GPUMIGLayouts []string
	// Source is "default" or "groups[i]", the group that matched.
	Source string
	// DRA is set when the node is in mode dra: its GPUs are served through
	// Dynamic Resource Allocation and GPUModes say what each is published as
	// (exclusive, fraction or mig).
	DRA bool
}

// Resolve returns the policy of a node with the given labels and GPU count.
//
// The first group whose nodeSelector pairs all appear in nodeLabels overrides
// the default policy field by field: fields the group leaves unset inherit,
// and a group's gpus list replaces the default's list. The per-GPU overrides
// then set the mode of the GPUs they name. Resolve fails, naming every
// problem, if f is invalid, if an override names a GPU the node does not
// have, or if the MIG strategy cannot serve the GPUs in mode mig (none with
// any mig GPU; single unless every GPU is mig with one layout).
func (f *File) Resolve(nodeLabels map[string]string, gpuCount int) (NodePolicy, error) {
	if gpuCount < 0 {
		return NodePolicy{}, fmt.Errorf("resolving config: negative GPU count %d", gpuCount)
	}
	if err := f.Validate(); err != nil {
		return NodePolicy{}, fmt.Errorf("resolving config: %w", err)
	}

	// 1. The default policy, defaulted, then the first matching group over it.
	pol := f.Default
	pol.setDefaults()
	np := NodePolicy{Source: SourceDefault}
	gpusFrom := field.NewPath(SourceDefault)
	strategyFrom := field.NewPath(SourceDefault)
	ownerFrom := field.NewPath(SourceDefault)
	for i := range f.Groups {
		g := &f.Groups[i]
		if !selects(g.NodeSelector, nodeLabels) {
			continue
		}
		gp := field.NewPath("groups").Index(i)
		np.Source = gp.String()
		pol = merge(pol, g.Policy)
		if len(g.GPUs) > 0 {
			gpusFrom = gp
		}
		if g.MIG.Strategy != "" {
			strategyFrom = gp
		}
		if g.MIG.Owner != "" {
			ownerFrom = gp
		}
		break
	}
	pol.GPUs = slices.Clone(pol.GPUs)
	np.Policy = pol

	// 2. Per-GPU modes and MIG layouts.
	np.GPUModes = make([]Mode, gpuCount)
	np.GPUMIGLayouts = make([]string, gpuCount)
	gpuMode := pol.Mode
	if pol.Mode == ModeDRA {
		// dra.gpuMode is defaulted here, not by SetDefaults, so a file that
		// never mentions dra parses to what it always did.
		if pol.DRA.GPUMode == "" {
			pol.DRA.GPUMode = DefaultDRAGPUMode
			np.Policy.DRA.GPUMode = DefaultDRAGPUMode
		}
		np.DRA, gpuMode = true, pol.DRA.GPUMode
	}
	for i := range gpuCount {
		np.GPUModes[i] = gpuMode
	}
	var problems []Problem
	for i, o := range pol.GPUs {
		ranges, err := parseIndices(o.Indices)
		if err != nil {
			// Validate accepted it; a failure here is a bug.
			return NodePolicy{}, fmt.Errorf("resolving config: %s: %w", gpusFrom.Child("gpus").Index(i), err)
		}
		var beyond []int
		for _, r := range ranges {
			for idx := r.lo; idx <= r.hi; idx++ {
				if idx >= gpuCount {
					beyond = append(beyond, idx)
					continue
				}
				np.GPUModes[idx] = o.Mode
				np.GPUMIGLayouts[idx] = o.MIGLayout
			}
		}
		if len(beyond) > 0 {
			problems = append(problems, problem(gpusFrom.Child("gpus").Index(i).Child("indices"),
				"%q names %s, but the node has %s", o.Indices, describeGPUs(beyond), describeNodeGPUs(gpuCount)))
		}
	}
	if np.DRA {
		var timesliced []int
		for idx, m := range np.GPUModes {
			if m == ModeTimeslice {
				timesliced = append(timesliced, idx)
			}
		}
		if len(timesliced) > 0 {
			problems = append(problems, problem(gpusFrom.Child("gpus"),
				"%s in mode timeslice, which the node's mode dra does not serve (%s)", withVerb(timesliced, "is", "are"), wantDRAGPUModes))
		}
	}
	var migGPUs, otherGPUs []int
	layouts := map[string][]int{} // MIG layout -> GPUs in mode mig using it
	for idx, m := range np.GPUModes {
		if m != ModeMIG {
			otherGPUs = append(otherGPUs, idx)
			continue
		}
		if np.GPUMIGLayouts[idx] == "" {
			np.GPUMIGLayouts[idx] = pol.MIG.Layout
		}
		migGPUs = append(migGPUs, idx)
		layouts[np.GPUMIGLayouts[idx]] = append(layouts[np.GPUMIGLayouts[idx]], idx)
	}

	// 3. The MIG strategy must be able to serve the mig GPUs (through device
	// plugins; a DRA driver publishes every MIG device by its profile).
	if pol.MIG.Owner == MIGOwnerExternal {
		var declared []int
		for _, idx := range migGPUs {
			if np.GPUMIGLayouts[idx] != "" {
				declared = append(declared, idx)
			}
		}
		if len(declared) > 0 {
			problems = append(problems, problem(ownerFrom.Child("mig", "owner"),
				"external leaves MIG layouts to another MIG manager, but %s a declared layout (mig.layout or gpus[].migLayout): remove it",
				withVerb(declared, "has", "have")))
		}
	}
	if len(migGPUs) > 0 && !np.DRA {
		sp := strategyFrom.Child("mig", "strategy")
		switch pol.MIG.Strategy {
		case MIGStrategyNone:
			problems = append(problems, problem(sp, "none serves no MIG devices, but %s in mode mig", withVerb(migGPUs, "is", "are")))
		case MIGStrategySingle:
			if len(otherGPUs) > 0 {
				problems = append(problems, problem(sp, "single needs every GPU in mode mig, but %s not", withVerb(otherGPUs, "is", "are")))
			}
			if len(layouts) > 1 {
				var parts []string
				for _, l := range slices.Sorted(maps.Keys(layouts)) {
					parts = append(parts, fmt.Sprintf("%s %q", withVerb(layouts[l], "uses", "use"), l))
				}
				problems = append(problems, problem(sp, "single needs one MIG layout on every GPU, but %s", joinAnd(parts)))
			}
		}
	}
	if err := problemsError(problems); err != nil {
		return NodePolicy{}, fmt.Errorf("resolving config for a node with %d GPUs: %w", gpuCount, err)
	}
	return np, nil
}

// merge returns base with every field that over sets replaced.
func merge(base, over Policy) Policy {
	if over.Mode != "" {
		base.Mode = over.Mode
	}
	if over.Fraction.Enforcement != "" {
		base.Fraction.Enforcement = over.Fraction.Enforcement
	}
	if over.Fraction.PollInterval.Duration != 0 {
		base.Fraction.PollInterval = over.Fraction.PollInterval
	}
	if over.Fraction.TolerancePercent != 0 {
		base.Fraction.TolerancePercent = over.Fraction.TolerancePercent
	}
	if over.Fraction.Samples != 0 {
		base.Fraction.Samples = over.Fraction.Samples
	}
	if over.Timeslice.Replicas != 0 {
		base.Timeslice.Replicas = over.Timeslice.Replicas
	}
	if over.Timeslice.ResourceName != "" {
		base.Timeslice.ResourceName = over.Timeslice.ResourceName
	}
	if over.Timeslice.FailRequestsGreaterThanOne {
		base.Timeslice.FailRequestsGreaterThanOne = true
	}
	if over.MIG.Strategy != "" {
		base.MIG.Strategy = over.MIG.Strategy
	}
	if over.MIG.Layout != "" {
		base.MIG.Layout = over.MIG.Layout
	}
	if over.MIG.Owner != "" {
		base.MIG.Owner = over.MIG.Owner
	}
	if over.DRA.GPUMode != "" {
		base.DRA.GPUMode = over.DRA.GPUMode
	}
	if len(over.GPUs) > 0 {
		base.GPUs = over.GPUs
	}
	return base
}

// withVerb returns "GPU 3 is" or "GPUs 0-3 are" (one, many = "is", "are").
func withVerb(idxs []int, one, many string) string {
	if len(idxs) == 1 {
		return describeGPUs(idxs) + " " + one
	}
	return describeGPUs(idxs) + " " + many
}

func describeNodeGPUs(n int) string {
	switch n {
	case 0:
		return "no GPUs"
	case 1:
		return "1 GPU (0)"
	}
	return strconv.Itoa(n) + " GPUs (0-" + strconv.Itoa(n-1) + ")"
}

func joinAnd(parts []string) string {
	if len(parts) < 2 {
		return strings.Join(parts, "")
	}
	return strings.Join(parts[:len(parts)-1], ", ") + " and " + parts[len(parts)-1]
}
