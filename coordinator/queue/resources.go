package queue

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Unlimited is the value of a limit that is not set, and of the quota of a
// resource the queue does not manage. Arithmetic in this package treats it as
// infinity: Add saturates at it and no amount exceeds it.
const Unlimited int64 = math.MaxInt64

// Resources is an amount of the three resources queues account for.
type Resources struct {
	// GPUMilli is GPUs in milli-GPU (placement.MilliPerGPU per GPU; a 30%
	// fraction is 300).
	GPUMilli int64
	// CPUMilli is CPU in milli-cores.
	CPUMilli int64
	// MemoryBytes is memory in bytes.
	MemoryBytes int64
}

// dim indexes one resource of Resources and Weights.
type dim int

const (
	dimGPU dim = iota
	dimCPU
	dimMemory
	numDims
)

// name is the resource's key in the Queue API (spec.resources and status lists).
func (d dim) name() string {
	switch d {
	case dimGPU:
		return "gpu"
	case dimCPU:
		return "cpu"
	}
	return "memory"
}

// label names the resource in messages.
func (d dim) label() string {
	switch d {
	case dimGPU:
		return "GPUs"
	case dimCPU:
		return "CPUs"
	}
	return "memory"
}

// format renders an amount of the resource for people: GPUs and CPUs as
// decimal counts ("3.5"), memory as a binary quantity ("512Gi").
func (d dim) format(v int64) string {
	if v == Unlimited {
		return "unlimited"
	}
	if d == dimMemory {
		return resource.NewQuantity(v, resource.BinarySI).String()
	}
	u := uint64(v)
	if v < 0 {
		u = -u // two's complement: also right for math.MinInt64
	}
	s := strconv.FormatUint(u/1000, 10)
	if frac := u % 1000; frac != 0 {
		s += "." + strings.TrimRight(fmt.Sprintf("%03d", frac), "0")
	}
	if v < 0 {
		s = "-" + s
	}
	return s
}

func (r Resources) get(d dim) int64 {
	switch d {
	case dimGPU:
		return r.GPUMilli
	case dimCPU:
		return r.CPUMilli
	}
	return r.MemoryBytes
}

func (r *Resources) set(d dim, v int64) {
	switch d {
	case dimGPU:
		r.GPUMilli = v
	case dimCPU:
		r.CPUMilli = v
	default:
		r.MemoryBytes = v
	}
}

// satAdd adds without overflowing: sums beyond the int64 range stick at
// Unlimited (or its negative).
func satAdd(a, b int64) int64 {
	s := a + b
	switch {
	case a > 0 && b > 0 && s < 0:
		return Unlimited
	case a < 0 && b < 0 && s >= 0:
		return math.MinInt64
	}
	return s
}

// Add returns r + o, component by component. A sum beyond the int64 range
// saturates at Unlimited.
func (r Resources) Add(o Resources) Resources {
	return Resources{
		GPUMilli:    satAdd(r.GPUMilli, o.GPUMilli),
		CPUMilli:    satAdd(r.CPUMilli, o.CPUMilli),
		MemoryBytes: satAdd(r.MemoryBytes, o.MemoryBytes),
	}
}

// Sub returns r - o, component by component.
func (r Resources) Sub(o Resources) Resources {
	return Resources{
		GPUMilli:    r.GPUMilli - o.GPUMilli,
		CPUMilli:    r.CPUMilli - o.CPUMilli,
		MemoryBytes: r.MemoryBytes - o.MemoryBytes,
	}
}

// LessOrEqual reports whether every component of r is at most o's.
func (r Resources) LessOrEqual(o Resources) bool {
	return r.GPUMilli <= o.GPUMilli && r.CPUMilli <= o.CPUMilli && r.MemoryBytes <= o.MemoryBytes
}

// IsZero reports whether every component is zero.
func (r Resources) IsZero() bool { return r == Resources{} }

// String renders the non-zero components ("gpu=1.5 cpu=2 memory=4Gi"), or "none".
func (r Resources) String() string {
	var parts []string
	for d := range numDims {
		if v := r.get(d); v != 0 {
			parts = append(parts, d.name()+"="+d.format(v))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " ")
}

// UnlimitedResources is Unlimited in every component: the limit of a queue
// without limits.
func UnlimitedResources() Resources {
	return Resources{GPUMilli: Unlimited, CPUMilli: Unlimited, MemoryBytes: Unlimited}
}

// Weights are a queue's over-quota weights per resource: its share of the
// surplus beyond deserved quotas is proportional to them. Zero means no surplus.
type Weights struct {
	GPU, CPU, Memory int64
}

func (w Weights) get(d dim) int64 {
	switch d {
	case dimGPU:
		return w.GPU
	case dimCPU:
		return w.CPU
	}
	return w.Memory
}

// DefaultWeights are the weights of a queue that sets none: 1 for every resource.
func DefaultWeights() Weights { return Weights{GPU: 1, CPU: 1, Memory: 1} }
