package podrequest

import (
	"errors"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/dra"
	"github.com/gpufrac/gpufrac/coordinator/placement"
)

// ErrClaimsPending means a pod's claims do not exist yet: those made from
// templates are created by kube-controller-manager a moment after the pod.
// Retry later; the request is not known to be invalid.
var ErrClaimsPending = errors.New("resource claims not created yet")

// ClaimOptions tell Parse about resource claims.
type ClaimOptions struct {
	// Get reads a claim by namespace and name (the claim informer).
	Get func(namespace, name string) (*resourceapi.ResourceClaim, bool)
	// GPUMemoryBytes is the memory of the GPU a claim for bytes is charged
	// against: the GPU it is allocated on once it is, else the smallest GPU
	// of gpufrac's driver (an upper bound of its share). 0: charged whole.
	GPUMemoryBytes func(c *resourceapi.ResourceClaim) int64
}

// PodClaims lists the ResourceClaims a pod uses, as the kubelet names them:
// spec.resourceClaims (claims from templates by the name in
// status.resourceClaimStatuses). It fails with ErrClaimsPending while a
// template's claim is not created.
func PodClaims(pod *corev1.Pod) ([]string, error) {
	var out []string
	for _, rc := range pod.Spec.ResourceClaims {
		switch {
		case rc.ResourceClaimName != nil:
			out = append(out, *rc.ResourceClaimName)
		case rc.ResourceClaimTemplateName != nil:
			i := slices.IndexFunc(pod.Status.ResourceClaimStatuses, func(s corev1.PodResourceClaimStatus) bool { return s.Name == rc.Name })
			if i < 0 || pod.Status.ResourceClaimStatuses[i].ResourceClaimName == nil {
				return nil, fmt.Errorf("pod %s/%s: the claim for %s from template %s: %w", pod.Namespace, pod.Name, rc.Name, *rc.ResourceClaimTemplateName, ErrClaimsPending)
			}
			out = append(out, *pod.Status.ResourceClaimStatuses[i].ResourceClaimName)
		}
	}
	return out, nil
}

// claims reads the pod's claims and what they ask of gpufrac's GPUs: at
// most one GPU ask per pod, never together with GPU extended resources,
// and no MIG devices (kube-scheduler places those). It returns the claims,
// the whole GPUs and share they add, or an error wrapping ErrClaimsPending.
func (p *parser) claims(hasGPUResources bool) ([]*resourceapi.ResourceClaim, int, int, error) {
	if len(p.pod.Spec.ResourceClaims) == 0 {
		return nil, 0, 0, nil
	}
	const field = "spec.resourceClaims"
	if p.opts.Claims.Get == nil {
		p.add(field, "gpufrac-scheduler cannot read resource claims here (no claim informer): schedule this pod with the default scheduler")
		return nil, 0, 0, nil
	}
	names, err := PodClaims(p.pod)
	if err != nil {
		return nil, 0, 0, err
	}
	var out []*resourceapi.ResourceClaim
	var ask dra.Ask
	asks := 0
	for _, name := range names {
		c, ok := p.opts.Claims.Get(p.pod.Namespace, name)
		if !ok {
			return nil, 0, 0, fmt.Errorf("pod %s/%s: claim %s: %w", p.pod.Namespace, p.pod.Name, name, ErrClaimsPending)
		}
		a, err := dra.AskOf(c)
		if err != nil {
			p.add(field, "%v", err)
			continue
		}
		if !a.IsZero() {
			asks++
			ask = a
		}
		out = append(out, c)
	}
	switch {
	case asks > 1:
		p.add(field, "the pod's claims ask gpufrac's GPUs %d times; gpufrac-scheduler places one GPU claim per pod", asks)
		return out, 0, 0, nil
	case asks == 1 && hasGPUResources:
		p.add(field, "the pod asks GPUs both as extended resources (%s, %s) and through a claim: ask one way", api.ResourceGPU, api.ResourceFraction)
		return out, 0, 0, nil
	case ask.MIG > 0:
		p.add(field, "the pod's claim asks MIG devices (class %s): gpufrac-scheduler places whole GPUs and shares; schedule it with the default scheduler", api.DRAClassMIG)
		return out, 0, 0, nil
	case ask.GPUs > p.opts.MaxGPUs:
		p.add(field, "the pod's claim asks %d whole GPUs; at most %d fit one pod: split the work across pods (a gang)", ask.GPUs, p.opts.MaxGPUs)
		return out, 0, 0, nil
	}
	share := ask.Shares * placement.MilliPerGPU / api.UnitsPerGPU
	if ask.MemoryBytes > 0 {
		var gpuMem int64
		if p.opts.Claims.GPUMemoryBytes != nil {
			for _, c := range out {
				if a, _ := dra.AskOf(c); a.MemoryBytes > 0 {
					gpuMem = p.opts.Claims.GPUMemoryBytes(c)
				}
			}
		}
		share = dra.MemoryMilli(ask.MemoryBytes, gpuMem)
		if gpuMem > 0 && ask.MemoryBytes > gpuMem {
			p.add(field, "the pod's claim asks %d MiB of one GPU, more than gpufrac's GPUs have (%d MiB)", ask.MemoryBytes>>20, gpuMem>>20)
		}
	}
	return out, ask.GPUs, share, nil
}
