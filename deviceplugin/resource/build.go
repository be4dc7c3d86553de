package resource

import (
	"errors"
	"fmt"

	"github.com/NVIDIA/go-gpuallocator/gpuallocator"

	"github.com/gpufrac/gpufrac/deviceplugin/config"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
)

// ErrModeNotSupported is returned for a sharing mode this node agent cannot serve yet.
var ErrModeNotSupported = errors.New("mode not yet supported by this gpufrac-node")

// Deps are what resources need besides the policy and the inventory.
type Deps struct {
	Topology []*gpuallocator.Device
	Health   HealthFunc
	Usage    UsageSource
	Hint     PodHint
	Strategy DeviceListStrategy
}

// Build turns a node's resolved policy (one mode per GPU, by index) and its
// GPUs into the resources to serve. Whole GPUs are offered for every GPU in
// exclusive or fraction mode - the coordinator's reservation pods hold a
// shared GPU whole so the two never collide; fraction-mode GPUs are also
// offered as units. Modes without an implementation yet return
// ErrModeNotSupported naming the GPUs, so a config asking for them is refused
// and the last good one stays.
func Build(modes []config.Mode, gpus []nvidia.GPU, d Deps) ([]Resource, error) {
	if len(modes) != len(gpus) {
		return nil, fmt.Errorf("building resources: %d GPU modes for %d GPUs", len(modes), len(gpus))
	}
	var whole, frac []nvidia.GPU
	for i, g := range gpus {
		switch modes[i] {
		case config.ModeExclusive:
			whole = append(whole, g)
		case config.ModeFraction:
			whole = append(whole, g)
			frac = append(frac, g)
		case config.ModeTimeslice, config.ModeMIG:
			return nil, fmt.Errorf("GPU %d (%s): mode %s: %w", g.Index, g.UUID, modes[i], ErrModeNotSupported)
		default:
			return nil, fmt.Errorf("GPU %d (%s): unknown mode %q", g.Index, g.UUID, modes[i])
		}
	}
	var out []Resource
	if len(whole) > 0 {
		out = append(out, NewWhole(WholeOptions{GPUs: whole, Topology: d.Topology, Health: d.Health, Usage: d.Usage, Strategy: d.Strategy}))
	}
	if len(frac) > 0 {
		out = append(out, NewFraction(FractionOptions{GPUs: frac, Health: d.Health, Usage: d.Usage, Hint: d.Hint, Strategy: d.Strategy}))
	}
	return out, nil
}
