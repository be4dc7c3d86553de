package enforcement

import (
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpufrac/gpufrac/api"
	gpurequest "github.com/gpufrac/gpufrac/api/request"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/deviceplugin/pods"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
)

// ContainerKey names a container on the node, as the kubelet's PodResources
// reports it.
type ContainerKey struct {
	Namespace, Pod, Container string
}

// Allowance is the GPU memory one container may hold on one GPU.
type Allowance struct {
	// Unlimited is set when the container holds the GPU whole, or a MIG
	// device (whose memory the hardware isolates).
	Unlimited bool
	// LimitBytes is the limit when not Unlimited: fraction units x GPU
	// memory / 100, plus GPU memory / replicas per time-sliced replica, in
	// whole MiB as the container was told in GPUFRAC_MEMORY_LIMIT_MIB.
	LimitBytes uint64
}

// add combines two grants on the same GPU: unlimited wins, limits add up.
func (a Allowance) add(b Allowance) Allowance {
	return Allowance{Unlimited: a.Unlimited || b.Unlimited, LimitBytes: a.LimitBytes + b.LimitBytes}
}

// anyGPU keys the allowance of a MIG holder: MIG UUIDs do not name their
// parent GPU, so the holder is unlimited on every GPU it holds nothing else
// on (see allowanceOn).
const anyGPU = "*"

// Allowances maps each container's devices (from PodResources) to its GPU
// memory allowance per GPU UUID:
//
//   - whole GPU (api.ResourceGPU, ID = GPU UUID): unlimited;
//   - fraction (api.ResourceFraction, IDs "<uuid>::<k>"): k units give
//     resource.MemoryLimitMiB(gpu, k), the limit Allocate announced;
//   - time-sliced replica (pol.TimesliceResource, IDs "<uuid>::<k>"): GPU
//     memory / pol.TimesliceReplicas per replica held;
//   - MIG device (api.MIGResourcePrefix*, or api.ResourceGPU with a "MIG-"
//     ID in the single strategy): unlimited, the hardware isolates it.
//
// Devices on GPUs not in gpus (by UUID) and other resources are ignored.
// Devices held through DRA claims have no allowance here: see
// AllowancesWithClaims.
func Allowances(as []pods.Assignment, gpus map[string]nvidia.GPU, pol Policy) map[ContainerKey]map[string]Allowance {
	return AllowancesWithClaims(as, gpus, pol, nil)
}

// AllowancesWithClaims is Allowances plus the devices containers hold
// through gpufrac's DRA claims (Resource api.DRADriver): each gets the
// allowance claims reports for it (the limit its CDI spec announced; a
// whole GPU or MIG device is unlimited). Unknown claim devices, or all of
// them when claims is nil, grant nothing.
func AllowancesWithClaims(as []pods.Assignment, gpus map[string]nvidia.GPU, pol Policy, claims ClaimSource) map[ContainerKey]map[string]Allowance {
	out := map[ContainerKey]map[string]Allowance{}
	grant := func(k ContainerKey, gpu string, a Allowance) {
		if out[k] == nil {
			out[k] = map[string]Allowance{}
		}
		out[k][gpu] = out[k][gpu].add(a)
	}
	kinds := gpurequest.Options{TimesliceResource: pol.TimesliceResource}
	for _, a := range as {
		k := ContainerKey{Namespace: a.Namespace, Pod: a.Pod, Container: a.Container}
		if a.Resource == api.DRADriver {
			if claims == nil {
				continue
			}
			for _, d := range a.Claims {
				gpu, al, ok := claims.ClaimAllowance(d)
				switch {
				case !ok:
				case gpu == "":
					grant(k, anyGPU, al)
				default:
					if _, known := gpus[gpu]; known {
						grant(k, gpu, al)
					}
				}
			}
			continue
		}
		switch kinds.KindOf(corev1.ResourceName(a.Resource)) {
		case gpurequest.Whole:
			for _, id := range a.DeviceIDs {
				if strings.HasPrefix(id, "MIG-") {
					grant(k, anyGPU, Allowance{Unlimited: true})
				} else if _, ok := gpus[id]; ok {
					grant(k, id, Allowance{Unlimited: true})
				}
			}
		case gpurequest.MIG:
			grant(k, anyGPU, Allowance{Unlimited: true})
		case gpurequest.Fraction:
			for uuid, n := range countShares(a.DeviceIDs, gpus) {
				grant(k, uuid, Allowance{LimitBytes: resource.MemoryLimitMiB(gpus[uuid], n) << 20})
			}
		case gpurequest.Replica:
			if pol.TimesliceReplicas <= 0 {
				continue
			}
			for uuid, n := range countShares(a.DeviceIDs, gpus) {
				grant(k, uuid, Allowance{LimitBytes: (gpus[uuid].MemoryMiB() * uint64(n) / uint64(pol.TimesliceReplicas)) << 20})
			}
		}
	}
	return out
}

// countShares counts "<uuid>::<k>" device IDs per known GPU.
func countShares(ids []string, gpus map[string]nvidia.GPU) map[string]int {
	n := map[string]int{}
	for _, id := range ids {
		uuid, _, err := resource.ParseUnitID(id)
		if err != nil {
			continue
		}
		if _, ok := gpus[uuid]; ok {
			n[uuid]++
		}
	}
	return n
}

// allowanceOn returns a container's allowance on one GPU, if it has one.
// A MIG device's unlimited allowance (anyGPU) covers only GPUs the container
// holds nothing else on: holding a MIG device never lifts the limit of a
// fraction or replica the container holds on another GPU (MIG GPUs serve
// no fractions or replicas, so that GPU is never the MIG device's parent).
func allowanceOn(byGPU map[string]Allowance, gpu string) (Allowance, bool) {
	if a, ok := byGPU[gpu]; ok {
		return a, true
	}
	wild, held := byGPU[anyGPU]
	return wild, held
}

// ContainerGPU is one container on one GPU (a UUID).
type ContainerGPU struct {
	Container ContainerKey
	GPU       string
}

// Grants are the limited devices containers hold through DRA claims, with
// the limit of each (ClaimGrants).
type Grants map[ContainerGPU]DeviceLimits // container on a GPU -> its claim devices there

// DeviceLimits are claim devices on one GPU with their limits.
type DeviceLimits map[pods.ClaimDevice]uint64 // claim device -> its limit in bytes

// On returns the claim devices container c holds on gpu (nil: none).
func (g Grants) On(c ContainerKey, gpu string) DeviceLimits {
	return g[ContainerGPU{Container: c, GPU: gpu}]
}

// add records that container c holds device d on gpu, limited to limit.
func (g Grants) add(c ContainerKey, gpu string, d pods.ClaimDevice, limit uint64) {
	k := ContainerGPU{Container: c, GPU: gpu}
	if g[k] == nil {
		g[k] = DeviceLimits{}
	}
	g[k][d] = limit
}

// Total is the sum of the devices' limits.
func (l DeviceLimits) Total() uint64 {
	var n uint64
	for _, limit := range l {
		n += limit
	}
	return n
}

// ClaimGrants lists, per container and GPU, the limited devices it holds
// through DRA claims and the limit of each (unlimited devices, MIG devices
// and devices on GPUs not in gpus are left out). A claim's device may be
// held by several containers, of one pod or of several (a ResourceClaim is
// shared by reference): its limit is theirs together (see pooled).
func ClaimGrants(as []pods.Assignment, gpus map[string]nvidia.GPU, claims ClaimSource) Grants {
	out := Grants{}
	if claims == nil {
		return out
	}
	for _, a := range as {
		if a.Resource != api.DRADriver {
			continue
		}
		k := ContainerKey{Namespace: a.Namespace, Pod: a.Pod, Container: a.Container}
		for _, d := range a.Claims {
			gpu, al, ok := claims.ClaimAllowance(d)
			if !ok || gpu == "" || al.Unlimited {
				continue
			}
			if _, known := gpus[gpu]; !known {
				continue
			}
			out.add(k, gpu, d, al.LimitBytes)
		}
	}
	return out
}
