// Package placement chooses a node and GPUs for one GPU request on a snapshot
// of the cluster. It is pure and deterministic: no API client, no wall clock,
// and the only randomness comes from a seed the caller passes in. The live
// coordinator and the openb simulator (cmd/gpufrac-sim) run the same code.
//
// Units: one GPU is MilliPerGPU (1000) milli-GPU. The coordinator's fractions
// are percent of one GPU and are passed as percent×10. CPU is in milli-cores,
// memory in bytes. MIG devices and time-sliced replicas are scalars: counts
// of named resources per node (Node.Scalars, Request.Scalars), checked and
// charged like CPU, never scored.
//
// A Snapshot holds the nodes and what is free on them; Assume and Forget
// change it, and Checkpoint / Rollback undo a batch of Assumes (a gang placed
// virtually that did not fit as a whole). A Placer runs one named policy
// (Policies lists them) and answers Place(snapshot, request) with a Decision
// or an *UnschedulableError saying which resource blocked.
package placement

import (
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"unique"

	corev1 "k8s.io/api/core/v1"
)

// MilliPerGPU is the size of one GPU in milli-GPU, the internal unit.
const MilliPerGPU = 1000

// MaxKindGPUs is the largest whole-GPU count tracked separately in KindCounts;
// larger requests share the last slot.
const MaxKindGPUs = 16

// GPU is one physical GPU of a node.
type GPU struct {
	// ID names the GPU: its UUID in the coordinator, its index in the simulator.
	ID string
	// FreeMilli is how much of the GPU is free, 0..MilliPerGPU.
	FreeMilli int
	// Reserved says the GPU is held whole by a reservation pod (the
	// coordinator's shared GPUs): shares may use its free milli, whole-GPU
	// requests never take it, even when it is all free.
	Reserved bool
}

// KindCounts counts the pods already running on a node by kind: index 0 holds
// GPU-share pods, index k (1..MaxKindGPUs) pods holding k whole GPUs. Only the
// gpuclustering policy reads it.
type KindCounts [MaxKindGPUs + 1]int32

// Node describes one node as the caller sees it. The snapshot copies the
// numbers and keeps a pointer to the rest, which must not change afterwards.
type Node struct {
	// Name is the node name; it must be unique in a snapshot.
	Name string
	// Labels are the node labels, used by node selectors and required affinity.
	Labels map[string]string
	// Taints are the node taints; NoSchedule and NoExecute ones must be tolerated.
	Taints []corev1.Taint
	// Pool is the node-pool key (the karpenter.sh/nodepool label in the coordinator).
	Pool string
	// Model is the GPU model. When empty, the label nvidia.com/gpu.product is used.
	Model string
	// CPUMilli and MemoryBytes are the node's allocatable CPU and memory.
	CPUMilli    int64
	MemoryBytes int64
	// UsedCPUMilli and UsedMemoryBytes are already requested by running pods.
	UsedCPUMilli    int64
	UsedMemoryBytes int64
	// GPUs are the node's GPUs, in device-index order.
	GPUs []GPU
	// Kinds counts running pods by kind (optional, for gpuclustering).
	Kinds KindCounts
	// Scalars are the node's free units of countable resources that are not
	// GPUs of their own, by resource name: MIG devices
	// ("nvidia.com/mig-1g.10gb") and time-sliced replicas
	// ("nvidia.com/gpu.shared"). A node without a name has none of it.
	Scalars map[string]int64
}

// Constraints restrict which nodes a request may use beyond its resources.
// Their maps, slices and selector may be shared with the pod they came from
// and with other requests: placement never changes them, and code that
// narrows a request copies first (WithNodes, InPool).
type Constraints struct {
	// NodeSelector must match the node labels exactly.
	NodeSelector map[string]string
	// Affinity is the pod's requiredDuringSchedulingIgnoredDuringExecution node selector.
	Affinity *corev1.NodeSelector
	// Tolerations must tolerate every NoSchedule and NoExecute taint of the node.
	Tolerations []corev1.Toleration
	// Pool, when set, allows only nodes of that pool.
	Pool string
	// Unpooled allows only nodes of no pool (InPool with the pool "").
	Unpooled bool
	// sealed is key's text, made once (Sealed); zero when not.
	sealed unique.Handle[string]
}

// Sealed computes c's key once and returns c, which must not change after:
// for constraints kept and placed in many cycles (a parsed pod's). Every
// placement of a request asks for its key, and the text of a pod's
// tolerations (the API server gives every pod two) was a tenth of a
// cycle's allocations at 5,000 nodes. Equal keys are one string
// (unique.Make), so a kept key costs a pointer.
func (c *Constraints) Sealed() *Constraints {
	if c != nil {
		c.sealed = unique.Make(c.text())
	}
	return c
}

// Equal tells whether c and o constrain alike: their fields, the key
// Sealed keeps aside (go-cmp uses it, so tests compare constraints sealed
// or not by what they say).
func (c *Constraints) Equal(o *Constraints) bool {
	if c == nil || o == nil {
		return c == o
	}
	a, b := *c, *o
	a.sealed, b.sealed = unique.Handle[string]{}, unique.Handle[string]{}
	return reflect.DeepEqual(a, b)
}

// key is a deterministic text form of the constraints, used to cache the
// per-node eligibility of requests that share constraints.
func (c *Constraints) key() string {
	if c == nil {
		return ""
	}
	if c.sealed != (unique.Handle[string]{}) {
		return c.sealed.Value()
	}
	return c.text()
}

// text is key, made afresh.
func (c *Constraints) text() string {
	var b strings.Builder
	b.WriteString("pool=")
	b.WriteString(c.Pool)
	if c.Unpooled {
		b.WriteString(";unpooled")
	}
	keys := make([]string, 0, len(c.NodeSelector))
	for k := range c.NodeSelector {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, ";sel:%q=%q", k, c.NodeSelector[k])
	}
	if c.Affinity != nil {
		b.WriteString(";aff:")
		b.WriteString(c.Affinity.String())
	}
	for i := range c.Tolerations {
		b.WriteString(";tol:")
		b.WriteString(c.Tolerations[i].String())
	}
	return b.String()
}

// Request is what one pod asks for.
type Request struct {
	// CPUMilli and MemoryBytes are the pod's CPU and memory requests.
	CPUMilli    int64
	MemoryBytes int64
	// GPUs asks for that many whole GPUs on one node, each fully free.
	GPUs int
	// ShareMilli asks for a share of ONE GPU (1..MilliPerGPU). It excludes GPUs.
	ShareMilli int
	// Scalars asks for units of countable resources by name (see
	// Node.Scalars); the chosen node must have every one of them free.
	// Zero entries ask for nothing.
	Scalars map[string]int64
	// Models are the allowed GPU models; empty allows any.
	Models []string
	// Constraints restrict the nodes further (nil: none).
	Constraints *Constraints
	// Filter, when set, is the caller's further check of single nodes (the
	// coordinator runs kube-scheduler's filter plugins through it: volumes,
	// topology spread, inter-pod affinity, host ports). Place asks it only
	// about nodes that pass every other check and would be chosen, best
	// first, so a filter that allows the best node costs one call. It must
	// answer the same for a node every time within one Place.
	Filter NodeFilter
}

// NodeFilter is a further check of single nodes (Request.Filter).
type NodeFilter interface {
	// Allows tells whether the named node may take the request; when not,
	// reasons say why, in words that count by node as kube-scheduler's
	// ("node(s) didn't match pod topology spread constraints").
	Allows(node string) (ok bool, reasons []string)
}

// GPUMilli is the request's total GPU demand in milli-GPU.
func (r *Request) GPUMilli() int64 {
	if r.ShareMilli > 0 {
		return int64(r.ShareMilli)
	}
	return int64(r.GPUs) * MilliPerGPU
}

// ErrInvalidRequest reports a request that can never be placed as written.
var ErrInvalidRequest = errors.New("invalid placement request")

// Validate checks the request's numbers.
func (r *Request) Validate() error {
	switch {
	case r.CPUMilli < 0 || r.MemoryBytes < 0:
		return fmt.Errorf("%w: negative CPU or memory", ErrInvalidRequest)
	case r.GPUs < 0:
		return fmt.Errorf("%w: negative GPU count %d", ErrInvalidRequest, r.GPUs)
	case r.ShareMilli < 0 || r.ShareMilli > MilliPerGPU:
		return fmt.Errorf("%w: GPU share %d milli outside 1..%d", ErrInvalidRequest, r.ShareMilli, MilliPerGPU)
	case r.ShareMilli > 0 && r.GPUs > 0:
		return fmt.Errorf("%w: both a GPU share and whole GPUs", ErrInvalidRequest)
	}
	for name, n := range r.Scalars {
		if name == "" || n < 0 {
			return fmt.Errorf("%w: %d units of resource %q", ErrInvalidRequest, n, name)
		}
	}
	return nil
}

// kind is the KindCounts slot of the request, or -1 for CPU-only requests.
func (r *Request) kind() int {
	switch {
	case r.ShareMilli > 0:
		return 0
	case r.GPUs > MaxKindGPUs:
		return MaxKindGPUs
	case r.GPUs > 0:
		return r.GPUs
	}
	return -1
}

// Decision is where a request goes.
type Decision struct {
	// Node is the chosen node's name and NodeIndex its index in the snapshot.
	Node      string
	NodeIndex int
	// GPUs are the chosen GPU IDs (k for whole GPUs, one for a share, none for
	// CPU-only requests) and GPUIndices their device indices on the node.
	GPUs       []string
	GPUIndices []int
	// MilliPerGPU is what the request takes from each chosen GPU.
	MilliPerGPU int
	// Score is the policy's score of the chosen node (higher is better).
	Score float64
}

// Reason names the resource or rule that kept a node from hosting a request.
type Reason string

// The reasons a node can be rejected, in the order they are checked.
const (
	ReasonConstraints Reason = "Constraints"
	ReasonModel       Reason = "GPUModel"
	ReasonGPU         Reason = "GPU"
	ReasonScalar      Reason = "Scalar"
	ReasonCPU         Reason = "CPU"
	ReasonMemory      Reason = "Memory"
	// ReasonFilter: the request's Filter rejected the node
	// (UnschedulableError.Filtered says why).
	ReasonFilter Reason = "Filter"
)

// reasonOrder is the check order, also the order of Error's message parts.
func reasonOrder() [7]Reason {
	return [7]Reason{ReasonConstraints, ReasonModel, ReasonGPU, ReasonScalar, ReasonCPU, ReasonMemory, ReasonFilter}
}

func (r Reason) describe() string {
	switch r {
	case ReasonConstraints:
		return "did not match the pod's node constraints"
	case ReasonModel:
		return "had no allowed GPU model"
	case ReasonGPU:
		return "had insufficient GPU"
	case ReasonScalar:
		return "had insufficient MIG devices or GPU replicas"
	case ReasonCPU:
		return "had insufficient CPU"
	case ReasonMemory:
		return "had insufficient memory"
	case ReasonFilter:
		return "were rejected by the request's filter"
	}
	return string(r)
}

// ErrUnschedulable is matched (errors.Is) by every *UnschedulableError.
var ErrUnschedulable = errors.New("no node fits the request")

// UnschedulableError says why no node could host a request.
type UnschedulableError struct {
	// Reason is the reason that rejected the most nodes (on a tie, the one
	// checked last: GPU, CPU and memory come after constraints and model).
	Reason Reason
	// Nodes is the number of nodes considered.
	Nodes int
	// Counts is how many nodes each reason rejected; each node counts once,
	// under the first failing check (constraints, model, GPU, scalar
	// resources, CPU, memory).
	Counts map[Reason]int
	// Resource names the scalar resource (Request.Scalars) that rejected the
	// most nodes under ReasonScalar, the first by name on a tie; "" when no
	// node was rejected for one.
	Resource string
	// Filtered counts the nodes under ReasonFilter by the reasons the
	// filter gave (a node with two reasons counts under both, as in
	// kube-scheduler's message).
	Filtered map[string]int
}

// Error reads like the kube-scheduler's message, for pod conditions.
func (e *UnschedulableError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "0/%d nodes are available", e.Nodes)
	sep := ": "
	for _, r := range reasonOrder() {
		if n := e.Counts[r]; n > 0 && r == ReasonFilter && len(e.Filtered) > 0 {
			for _, part := range histogram(e.Filtered) {
				fmt.Fprintf(&b, "%s%s", sep, part)
				sep = ", "
			}
			continue
		}
		if n := e.Counts[r]; n > 0 {
			what := r.describe()
			if r == ReasonScalar && e.Resource != "" {
				what = "had insufficient " + e.Resource
			}
			fmt.Fprintf(&b, "%s%d %s", sep, n, what)
			sep = ", "
		}
	}
	return b.String()
}

// Is makes errors.Is(err, ErrUnschedulable) true.
func (e *UnschedulableError) Is(target error) bool { return target == ErrUnschedulable }

// histogram renders reasons counted by node, sorted, as kube-scheduler's
// FitError does ("2 node(s) didn't match pod topology spread constraints").
func histogram(counts map[string]int) []string {
	parts := make([]string, 0, len(counts))
	for r, n := range counts {
		parts = append(parts, fmt.Sprintf("%d %s", n, r))
	}
	sort.Strings(parts)
	return parts
}
