package config

import (
	"time"

	"github.com/gpufrac/gpufrac/api"
)

// Defaults filled into the default policy by [File.SetDefaults], and the
// bounds [File.Validate] enforces.
const (
	// DefaultMode is the mode of GPUs when nothing is configured.
	DefaultMode = ModeFraction
	// DefaultEnforcement kills the over-limit processes of a container, and
	// only those, as soon as samples polls agree: on a shared GPU the memory a
	// container takes over its limit is its neighbours', who run out of
	// memory while it stays. report protects nobody; evict is slow (PDBs may
	// refuse it, the grace period keeps the memory) and needs a ClusterRole
	// that can evict any pod in the cluster.
	DefaultEnforcement = EnforcementKill
	// DefaultPollInterval is how often the memory watchdog samples NVML.
	DefaultPollInterval = time.Second
	// DefaultTolerancePercent lets no container go over its memory limit.
	DefaultTolerancePercent = 0
	// DefaultSamples is how many consecutive over-limit samples trigger the
	// enforcement action.
	DefaultSamples = 3
	// DefaultDRAGPUMode is what a GPU of a node in mode dra is published as.
	DefaultDRAGPUMode = ModeFraction
	// DefaultReplicas is how many time-sliced replicas one GPU offers.
	DefaultReplicas = 4
	// DefaultTimesliceResource is the resource time-sliced replicas are served as.
	DefaultTimesliceResource = api.DefaultTimesliceResource
	// DefaultMIGStrategy serves each MIG profile as its own resource.
	DefaultMIGStrategy = MIGStrategyMixed
	// DefaultMIGOwner lets gpufrac-node set MIG modes and layouts.
	DefaultMIGOwner = MIGOwnerGpufrac

	// MinPollInterval and MaxPollInterval bound fraction.pollInterval: faster
	// polling costs NVML time on every GPU, slower lets a runaway process
	// starve its neighbours for too long.
	MinPollInterval = 100 * time.Millisecond
	// MaxPollInterval is the slowest allowed fraction.pollInterval.
	MaxPollInterval = time.Minute
	// MinReplicas is the fewest time-sliced replicas that still share a GPU.
	MinReplicas = 2
	// MaxReplicas caps timeslice.replicas so a typo cannot make the plugin
	// advertise millions of devices to the kubelet.
	MaxReplicas = 1024
	// MaxGPUIndex is the highest GPU index gpus[].indices may name; far above
	// any node's GPU count, it guards against typos such as "0-10000".
	MaxGPUIndex = 255
)

// SetDefaults fills the unset (zero) fields of the default policy with the
// defaults listed in the package documentation. Groups are left alone: their
// unset fields inherit from the default policy in [File.Resolve]. SetDefaults
// is idempotent.
func (f *File) SetDefaults() {
	f.Default.setDefaults()
}

func (p *Policy) setDefaults() {
	if p.Mode == "" {
		p.Mode = DefaultMode
	}
	if p.Fraction.Enforcement == "" {
		p.Fraction.Enforcement = DefaultEnforcement
	}
	if p.Fraction.PollInterval.Duration == 0 {
		p.Fraction.PollInterval.Duration = DefaultPollInterval
	}
	if p.Fraction.TolerancePercent == 0 {
		p.Fraction.TolerancePercent = DefaultTolerancePercent
	}
	if p.Fraction.Samples == 0 {
		p.Fraction.Samples = DefaultSamples
	}
	if p.Timeslice.Replicas == 0 {
		p.Timeslice.Replicas = DefaultReplicas
	}
	if p.Timeslice.ResourceName == "" {
		p.Timeslice.ResourceName = DefaultTimesliceResource
	}
	if p.MIG.Strategy == "" {
		p.MIG.Strategy = DefaultMIGStrategy
	}
	if p.MIG.Owner == "" {
		p.MIG.Owner = DefaultMIGOwner
	}
}
