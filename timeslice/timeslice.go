// Package timeslice turns the admin's time-slicing configuration into
// replicas: N replicas per GPU, each a device "<gpu-uuid>::<k>" of a
// configurable resource (nvidia.com/gpu.shared by default). It decides how
// a request is checked, which replicas serve it, and the GPU memory a
// container holding replicas is told it may use (the GPU's memory divided
// by the replicas, per replica held), which the memory watchdog enforces.
//
// Everything here is a pure function of the sharing rule and the GPUs'
// memory: the vocabulary both serving paths share. The node config turns
// into a Sharing in deviceplugin/config (TimesliceConfig.Sharing); the
// replica metrics live with the node agent (deviceplugin/metrics).
package timeslice

import (
	"errors"
	"fmt"
	"sort"
)

// Sharing is how a node time-slices its GPUs.
type Sharing struct {
	// Replicas is the number of replicas per GPU (at least 2).
	Replicas int
	// ResourceName is the resource the replicas are served as.
	ResourceName string
	// FailRequestsGreaterThanOne refuses requests for several replicas: a
	// time-sliced replica gives no guaranteed share, so asking for two
	// does not buy twice the compute, only twice the memory limit.
	FailRequestsGreaterThanOne bool
}

// ErrMultipleReplicas is returned for a request of several replicas when
// FailRequestsGreaterThanOne is set.
var ErrMultipleReplicas = errors.New("requests for more than one time-sliced replica are refused on this node (timeslice.failRequestsGreaterThanOne)")

// CheckRequest checks a request for n replicas.
func (s Sharing) CheckRequest(n int) error {
	switch {
	case n <= 0:
		return fmt.Errorf("request for %d replicas of %s: must be positive", n, s.ResourceName)
	case n > 1 && s.FailRequestsGreaterThanOne:
		return fmt.Errorf("request for %d replicas of %s: %w", n, s.ResourceName, ErrMultipleReplicas)
	}
	return nil
}

// MemoryLimitMiB is the GPU memory a container holding n replicas of a GPU
// with gpuMemoryMiB may use: the GPU's memory divided by the replicas, times
// n, in whole MiB (rounded down, as the watchdog computes it).
func (s Sharing) MemoryLimitMiB(gpuMemoryMiB uint64, n int) uint64 {
	if s.Replicas <= 0 {
		return 0
	}
	return gpuMemoryMiB * uint64(n) / uint64(s.Replicas)
}

// Replica is replica K of a GPU.
type Replica struct {
	GPU string
	K   int
}

// Pick chooses size replicas from free (GPU UUID -> indices of its free
// replicas), keeping mustInclude. GPUs are considered in order (GPU UUIDs,
// by index); unknown ones in free are ignored.
//
// Without mustInclude, a request lands on ONE GPU when one has room: the
// least loaded one (most free replicas; the lower index on a tie), so that
// time-sliced pods spread over the GPUs instead of queueing on the first.
// A request no single GPU can hold takes the most free GPUs first. With
// mustInclude, the rest comes from those replicas' GPUs first. Within a
// GPU, lower replica indices go first.
func Pick(free map[string][]int, order []string, mustInclude []Replica, size int) ([]Replica, error) {
	if size <= 0 {
		return nil, fmt.Errorf("picking %d replicas: size must be positive", size)
	}
	if len(mustInclude) > size {
		return nil, fmt.Errorf("picking %d replicas: %d must be included", size, len(mustInclude))
	}
	taken := map[Replica]bool{}
	out := make([]Replica, 0, size)
	for _, r := range mustInclude {
		if !taken[r] {
			taken[r] = true
			out = append(out, r)
		}
	}
	avail := map[string][]int{} // GPU -> free indices not yet taken, sorted
	total := 0
	for _, g := range order {
		ks := append([]int(nil), free[g]...)
		sort.Ints(ks)
		for _, k := range ks {
			if !taken[Replica{GPU: g, K: k}] {
				avail[g] = append(avail[g], k)
				total++
			}
		}
	}
	need := size - len(out)
	if need > total {
		return nil, fmt.Errorf("picking %d replicas: only %d free", size, total+len(out))
	}
	// GPU preference: mustInclude's GPUs, then the least loaded, then index.
	pinned := map[string]bool{}
	for _, r := range mustInclude {
		pinned[r.GPU] = true
	}
	gpus := append([]string(nil), order...)
	sort.SliceStable(gpus, func(i, j int) bool {
		a, b := gpus[i], gpus[j]
		if pinned[a] != pinned[b] {
			return pinned[a]
		}
		return len(avail[a]) > len(avail[b])
	})
	if len(mustInclude) == 0 {
		// One GPU with room is better than several with more.
		for _, g := range gpus {
			if len(avail[g]) >= need {
				gpus = append([]string{g}, gpus...)
				break
			}
		}
	}
	seen := map[string]bool{}
	for _, g := range gpus {
		if need == 0 {
			break
		}
		if seen[g] {
			continue
		}
		seen[g] = true
		for _, k := range avail[g] {
			if need == 0 {
				break
			}
			out = append(out, Replica{GPU: g, K: k})
			need--
		}
	}
	return out, nil
}

// PerGPU counts replicas per GPU.
func PerGPU(rs []Replica) map[string]int {
	out := map[string]int{}
	for _, r := range rs {
		out[r.GPU]++
	}
	return out
}
