package scheduler

import (
	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpufrac/gpufrac/coordinator/dra"
)

// draCycle is one cycle's DRA view: read by readDRA at the start of the
// cycle, kept on the cycle value and handed to what the cycle calls; no
// scheduler field holds it. Nil without DRA; its methods take a nil view
// for one without.
type draCycle struct {
	world dra.World
	devs  dra.Devices
	// claims are every ResourceClaim, as listed this cycle.
	claims []*resourceapi.ResourceClaim
	// minGPUMemory is the smallest GPU memory of gpufrac's devices (0: none).
	minGPUMemory int64
	// busy names a pod of another scheduler still being placed with claims
	// ("" when none; kubeSchedulerPlacingClaims): nodes in mode dra are off
	// limits this cycle.
	busy string
}

// busyPod is the pod of another scheduler still being placed with claims
// ("" when none, or without DRA).
func (v *draCycle) busyPod() string {
	if v == nil {
		return ""
	}
	return v.busy
}
