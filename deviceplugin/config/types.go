// Package config holds the admin's partitioning configuration for
// gpufrac-node: its types, parsing with precise validation errors, per-node
// resolution by node labels, and a hot-reloading file watcher that keeps the
// last good config when a new one is invalid.
//
// # Reading a file
//
// [Parse] reads YAML strictly: unknown fields, duplicate keys and values of
// the wrong type are errors, and every problem is reported with its path
// ("groups[1].mode: ..."), all at once, as a [*ValidationError].
//
// # Defaults
//
// After a file parses and validates, unset fields of the default policy are
// filled in ([File.SetDefaults]):
//
//	mode                                fraction
//	fraction.enforcement                kill (protects the neighbours on a shared GPU; see DefaultEnforcement)
//	fraction.pollInterval               1s
//	fraction.tolerancePercent           0
//	fraction.samples                    3
//	timeslice.replicas                  4
//	timeslice.resourceName              nvidia.com/gpu.shared
//	timeslice.failRequestsGreaterThanOne false
//	mig.strategy                        mixed
//	mig.layout                          "" (leave the GPU's MIG layout as it is)
//	mig.owner                           gpufrac (gpufrac-node sets MIG modes and layouts)
//	dra.gpuMode                         fraction (filled in by Resolve, for a node in mode dra)
//
// Groups are not defaulted: a field a group leaves unset (zero) inherits the
// default policy's value when the group is applied by [File.Resolve]. A zero
// value therefore always means "unset": a group cannot set tolerancePercent
// back to 0 or failRequestsGreaterThanOne back to false when the default
// policy sets them; set those in the default policy instead. A group's gpus
// list, when present, replaces the default policy's list as a whole.
package config

import (
	"time"

	"github.com/gpufrac/gpufrac/timeslice"
)

// Version is the only config version this code reads.
const Version = "v1"

// Mode is how a GPU is offered to pods.
type Mode string

// The sharing modes.
const (
	ModeExclusive Mode = "exclusive"
	ModeFraction  Mode = "fraction"
	ModeTimeslice Mode = "timeslice"
	ModeMIG       Mode = "mig"
	// ModeDRA serves the node's GPUs through Dynamic Resource Allocation
	// (gpufrac-node is then the DRA driver gpu.gpufrac.io and registers no
	// device plugin). It is a node's serving path, so only a policy's mode
	// may be dra; what each GPU is published as comes from dra.gpuMode and
	// the gpus overrides (exclusive, fraction or mig; not timeslice).
	ModeDRA Mode = "dra"
)

// Enforcement is what the memory watchdog does with an over-limit process.
type Enforcement string

// The enforcement actions.
const (
	EnforcementKill   Enforcement = "kill"
	EnforcementEvict  Enforcement = "evict"
	EnforcementReport Enforcement = "report"
)

// File is the whole ConfigMap document.
type File struct {
	Version string  `json:"version"`
	Default Policy  `json:"default"`
	Groups  []Group `json:"groups,omitempty"`
}

// Group overrides the default policy on nodes whose labels match NodeSelector.
// The first matching group wins. Fields left empty inherit from Default.
type Group struct {
	NodeSelector map[string]string `json:"nodeSelector"`
	Policy       `json:",inline"`
}

// Policy is the partitioning of one node's GPUs.
type Policy struct {
	Mode      Mode            `json:"mode,omitempty"`
	Fraction  FractionConfig  `json:"fraction,omitzero"`
	Timeslice TimesliceConfig `json:"timeslice,omitzero"`
	MIG       MIGConfig       `json:"mig,omitzero"`
	DRA       DRAConfig       `json:"dra,omitzero"`
	// GPUs overrides the mode for some GPUs of the node, by index range.
	GPUs []GPUOverride `json:"gpus,omitempty"`
}

// GPUOverride sets the mode of GPUs selected by index ("0-3", "4,6", "7").
type GPUOverride struct {
	Indices string `json:"indices"`
	Mode    Mode   `json:"mode"`
	// MIGLayout overrides mig.layout for these GPUs when Mode is mig.
	MIGLayout string `json:"migLayout,omitempty"`
}

// FractionConfig configures fraction mode and the memory watchdog.
type FractionConfig struct {
	Enforcement Enforcement `json:"enforcement,omitempty"`
	// PollInterval is how often the watchdog samples NVML (default 1s).
	PollInterval Duration `json:"pollInterval,omitzero"`
	// TolerancePercent is how far over its limit a container may go before it
	// counts as a violation.
	TolerancePercent int `json:"tolerancePercent,omitempty"`
	// Samples is how many consecutive over-limit samples trigger the action.
	Samples int `json:"samples,omitempty"`
}

// TimesliceConfig configures time-sliced replicas.
type TimesliceConfig struct {
	Replicas     int    `json:"replicas,omitempty"`
	ResourceName string `json:"resourceName,omitempty"`
	// FailRequestsGreaterThanOne refuses requests for more than one replica.
	FailRequestsGreaterThanOne bool `json:"failRequestsGreaterThanOne,omitempty"`
}

// Sharing returns the timeslice.Sharing of c, defaults filled in for unset
// fields (DefaultReplicas, DefaultTimesliceResource).
func (c TimesliceConfig) Sharing() timeslice.Sharing {
	s := timeslice.Sharing{Replicas: c.Replicas, ResourceName: c.ResourceName, FailRequestsGreaterThanOne: c.FailRequestsGreaterThanOne}
	if s.Replicas == 0 {
		s.Replicas = DefaultReplicas
	}
	if s.ResourceName == "" {
		s.ResourceName = DefaultTimesliceResource
	}
	return s
}

// DRAConfig configures a node in mode dra.
type DRAConfig struct {
	// GPUMode is what each GPU is published as, unless a gpus override says
	// otherwise: exclusive (device gpu-N only), fraction (gpu-N, and the
	// shared views gpu-N-shares and gpu-N-memory over one counter set) or mig
	// (the GPU's MIG devices over its counters).
	GPUMode Mode `json:"gpuMode,omitempty"`
}

// MIGConfig configures MIG partitioning.
type MIGConfig struct {
	// Strategy is none, single or mixed.
	Strategy string `json:"strategy,omitempty"`
	// Layout is a named layout ("all-1g.10gb") or a comma-separated list of
	// profiles applied to every MIG GPU ("3g.40gb,2g.20gb,1g.10gb").
	Layout string `json:"layout,omitempty"`
	// Owner says who sets the GPUs' MIG modes and layouts: gpufrac (the node
	// agent's layout manager) or external (another MIG manager, such as the
	// GPU operator's or Bottlerocket's: gpufrac-node then changes nothing,
	// serves the MIG devices it finds on GPUs in mode mig, and reports the
	// GPUs whose MIG mode does not match their gpufrac mode). With external,
	// no layout may be declared.
	Owner string `json:"owner,omitempty"`
}

// The MIG owners.
const (
	// MIGOwnerGpufrac: gpufrac-node's layout manager sets MIG modes and
	// layouts (it needs CAP_SYS_ADMIN for NVML's MIG calls).
	MIGOwnerGpufrac = "gpufrac"
	// MIGOwnerExternal: another MIG manager owns MIG on the node; gpufrac-node
	// only reads it.
	MIGOwnerExternal = "external"
)

// The MIG strategies, as in NVIDIA's device plugin.
const (
	// MIGStrategyNone exposes no MIG devices.
	MIGStrategyNone = "none"
	// MIGStrategySingle serves MIG devices as nvidia.com/gpu; every GPU of
	// the node must then be in mode mig with the same layout.
	MIGStrategySingle = "single"
	// MIGStrategyMixed serves each MIG profile as its own resource
	// (nvidia.com/mig-1g.10gb).
	MIGStrategyMixed = "mixed"
)

// Duration is a time.Duration written as a Go duration string ("1s").
type Duration struct{ time.Duration }
