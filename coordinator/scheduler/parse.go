package scheduler

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/podrequest"
)

// parse turns a pod into what the cycle needs, through podrequest.
func (s *Scheduler) parse(p *corev1.Pod) (podInfo, error) {
	np := s.opts.NonPreemptiblePriority
	opts := podrequest.Options{MaxGPUs: s.opts.MaxGPUsPerPod, JobLookup: s.deps.Jobs, GPUModels: s.models,
		TimesliceResource: s.opts.TimesliceResource, ScalarMilli: s.scalarMilli}
	if np != 0 {
		opts.NonPreemptiblePriority = &np
	}
	r, err := podrequest.Parse(p, opts)
	if err != nil {
		return podInfo{}, err
	}
	pi := podInfo{
		pod:            p,
		req:            r.Request,
		queue:          r.Queue,
		nonPreemptible: r.NonPreemptible,
		priority:       r.Priority,
		res:            r.QueueResources(),
	}
	if r.Gang != nil {
		pi.group, pi.minMember = r.Gang.Name, int(r.Gang.MinMember)
	}
	return pi, nil
}

// productsOf lists the GPU products of the nodes (label nvidia.com/gpu.product), sorted and unique.
func productsOf(nodes []*corev1.Node) []string {
	seen := map[string]bool{}
	var out []string
	for _, n := range nodes {
		if m := n.Labels[api.LabelGPUProduct]; m != "" && !seen[m] {
			seen[m] = true
			out = append(out, m)
		}
	}
	return out
}
