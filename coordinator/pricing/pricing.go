// Package pricing is the admin's price table of GPU capacity: for each
// instance type Karpenter may launch, how many GPUs it has and what it costs
// per hour, and optionally a price per GPU-hour per NodePool. Two parts of the
// coordinator read it: consolidation, to drain the node whose removal saves
// the most, and placeholders, to ask Karpenter for the cheapest instance
// types that hold the admitted work (five 40% fractions need three GPUs'
// worth of 1-GPU nodes, not one 8-GPU node).
//
// The table is the admin's word, given as a file (a mounted ConfigMap):
//
//	instanceTypes:
//	  - {name: gpu-1x-h100, gpus: 1, price: 14.19}
//	  - {name: gpu-8x-h100, gpus: 8, price: 98.32}
//	nodePools: {spot-gpu: 2.10}   # per GPU-hour, for nodes whose type is not listed
//
// Karpenter's own instance types are not Kubernetes objects (a cloud
// provider computes them), so the coordinator cannot read them from the API.
// Without a table every GPU costs 1: savings are counted in GPUs, and each
// placeholder prefers the smallest nodes that hold it, priced by Karpenter
// itself (coordinator/placeholder).
package pricing

import (
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpufrac/gpufrac/api"
)

// InstanceType is one machine type of the price table.
type InstanceType struct {
	// Name is the node label node.kubernetes.io/instance-type (or
	// Table.InstanceTypeLabel) of nodes of this type.
	Name string `json:"name"`
	// GPUs is how many nvidia.com/gpu the type has (at least 1).
	GPUs int `json:"gpus"`
	// Price is the price of one node of this type per hour (more than 0).
	Price float64 `json:"price"`
	// NodePools, when set, are the only NodePools that offer the type.
	NodePools []string `json:"nodePools,omitempty"`
	// GPUProduct, when set, is the type's GPU model as the node label
	// nvidia.com/gpu.product gives it; pods asking other models never get it.
	GPUProduct string `json:"gpuProduct,omitempty"`
}

// PerGPU is the type's price per GPU-hour.
func (t InstanceType) PerGPU() float64 { return t.Price / float64(t.GPUs) }

// Table is the admin's price table. The zero value (and nil) is no table.
type Table struct {
	// InstanceTypes are the GPU instance types, by name.
	InstanceTypes []InstanceType `json:"instanceTypes,omitempty"`
	// NodePools is the price per GPU-hour of a NodePool's nodes whose
	// instance type is not listed (NodePool name -> price).
	NodePools map[string]float64 `json:"nodePools,omitempty"`
	// DefaultGPUPrice is the price per GPU-hour of nodes the table says
	// nothing of. Zero means the lowest per-GPU price of InstanceTypes (a
	// saving is never overstated), or 1 when the table lists no type.
	DefaultGPUPrice float64 `json:"defaultGPUPrice,omitempty"`
	// InstanceTypeLabel is the node label holding the instance type; empty
	// means node.kubernetes.io/instance-type.
	InstanceTypeLabel string `json:"instanceTypeLabel,omitempty"`
	// NodePoolLabel is the node label holding the NodePool; empty means
	// karpenter.sh/nodepool.
	NodePoolLabel string `json:"nodePoolLabel,omitempty"`
}

// ErrInvalid is matched (errors.Is) by every error of Parse and Load.
var ErrInvalid = errors.New("invalid price table")

// Load reads a price table file; an empty path is no table (nil).
func Load(path string) (*Table, error) {
	if path == "" {
		return nil, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading price table %s: %w", path, err)
	}
	t, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("price table %s: %w", path, err)
	}
	return t, nil
}

// Parse parses and checks a price table (YAML or JSON; unknown fields are
// errors, so a typo is never silently a table without prices).
func Parse(data []byte) (*Table, error) {
	var t Table
	if err := yaml.UnmarshalStrict(data, &t); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return &t, nil
}

// Validate checks the table's numbers and names.
func (t *Table) Validate() error {
	seen := map[string]bool{}
	for i, it := range t.InstanceTypes {
		switch {
		case it.Name == "":
			return fmt.Errorf("%w: instanceTypes[%d] has no name", ErrInvalid, i)
		case seen[it.Name]:
			return fmt.Errorf("%w: instance type %q is listed twice", ErrInvalid, it.Name)
		case it.GPUs < 1:
			return fmt.Errorf("%w: instance type %q has %d GPUs, want at least 1", ErrInvalid, it.Name, it.GPUs)
		case !(it.Price > 0) || math.IsInf(it.Price, 0):
			return fmt.Errorf("%w: instance type %q costs %v per hour, want a positive number", ErrInvalid, it.Name, it.Price)
		}
		seen[it.Name] = true
	}
	for pool, p := range t.NodePools {
		if !(p > 0) || math.IsInf(p, 0) {
			return fmt.Errorf("%w: NodePool %q costs %v per GPU-hour, want a positive number", ErrInvalid, pool, p)
		}
	}
	if t.DefaultGPUPrice < 0 || math.IsNaN(t.DefaultGPUPrice) || math.IsInf(t.DefaultGPUPrice, 0) {
		return fmt.Errorf("%w: defaultGPUPrice %v, want a positive number or 0", ErrInvalid, t.DefaultGPUPrice)
	}
	return nil
}

// Empty tells whether the table gives no price at all (nil included).
func (t *Table) Empty() bool {
	return t == nil || (len(t.InstanceTypes) == 0 && len(t.NodePools) == 0 && t.DefaultGPUPrice == 0)
}

// Type returns the instance type named name.
func (t *Table) Type(name string) (InstanceType, bool) {
	if t == nil {
		return InstanceType{}, false
	}
	for _, it := range t.InstanceTypes {
		if it.Name == name {
			return it, true
		}
	}
	return InstanceType{}, false
}

// TypeLabel is the node label holding the instance type.
func (t *Table) TypeLabel() string {
	if t == nil || t.InstanceTypeLabel == "" {
		return corev1.LabelInstanceTypeStable
	}
	return t.InstanceTypeLabel
}

// PoolLabel is the node label holding the NodePool.
func (t *Table) PoolLabel() string {
	if t == nil || t.NodePoolLabel == "" {
		return api.LabelNodePool
	}
	return t.NodePoolLabel
}

// defaultGPUPrice is the per-GPU-hour price of a node the table knows nothing of.
func (t *Table) defaultGPUPrice() float64 {
	if t == nil {
		return 1
	}
	if t.DefaultGPUPrice > 0 {
		return t.DefaultGPUPrice
	}
	lowest := 0.0
	for _, it := range t.InstanceTypes {
		if lowest == 0 || it.PerGPU() < lowest {
			lowest = it.PerGPU()
		}
	}
	for _, p := range t.NodePools {
		if lowest == 0 || p < lowest {
			lowest = p
		}
	}
	if lowest == 0 {
		return 1
	}
	return lowest
}

// Source says where a node's price came from.
type Source string

// The sources of a node's price.
const (
	SourceInstanceType Source = "instanceType"
	SourceNodePool     Source = "nodePool"
	SourceDefault      Source = "default"
)

// NodePrice is what a node with gpus GPUs costs per hour: its instance
// type's price, else its NodePool's per-GPU price times gpus, else gpus
// times the default per-GPU price (1 without a table). The labels it reads
// are written by Karpenter or the admin, never by tenants.
func (t *Table) NodePrice(n *corev1.Node, gpus int) (float64, Source) {
	if t != nil && n != nil {
		if it, ok := t.Type(n.Labels[t.TypeLabel()]); ok {
			return it.Price, SourceInstanceType
		}
		if p, ok := t.NodePools[n.Labels[t.PoolLabel()]]; ok {
			return p * float64(gpus), SourceNodePool
		}
	}
	return t.defaultGPUPrice() * float64(gpus), SourceDefault
}

// Mix is a multiset of instance types: how many nodes of each.
type Mix struct {
	// Types are the instance types chosen, largest GPU count first, one
	// entry per node.
	Types []InstanceType
	// Price is their total price per hour.
	Price float64
}

// GPUs is the mix's GPU count.
func (m Mix) GPUs() int {
	n := 0
	for _, t := range m.Types {
		n += t.GPUs
	}
	return n
}

// CheapestMix is the cheapest set of nodes of the given types holding at
// least gpus GPUs (fewer nodes on a price tie, then more GPUs of the larger
// types, which the order of types decides: give them sorted). It returns
// false when types is empty or gpus < 1.
func CheapestMix(gpus int, types []InstanceType) (Mix, bool) {
	if gpus < 1 || len(types) == 0 {
		return Mix{}, false
	}
	type best struct {
		price float64
		nodes int
		last  int // index into types of the last node added, -1 for none
		prev  int // GPUs covered before it
	}
	const eps = 1e-9
	dp := make([]best, gpus+1) // GPUs covered (at least) -> cheapest way
	dp[0] = best{last: -1}
	for g := 1; g <= gpus; g++ {
		dp[g] = best{price: math.Inf(1), last: -1}
		for i, it := range types {
			prev := max(0, g-it.GPUs)
			c := best{price: dp[prev].price + it.Price, nodes: dp[prev].nodes + 1, last: i, prev: prev}
			if c.price < dp[g].price-eps || (math.Abs(c.price-dp[g].price) <= eps && c.nodes < dp[g].nodes) {
				dp[g] = c
			}
		}
	}
	var m Mix
	for g := gpus; g > 0; g = dp[g].prev {
		it := types[dp[g].last]
		m.Types = append(m.Types, it)
		m.Price += it.Price
	}
	sort.SliceStable(m.Types, func(i, j int) bool { return m.Types[i].GPUs > m.Types[j].GPUs })
	return m, true
}

// Sorted returns the table's instance types sorted by GPU count, then name:
// a deterministic order for CheapestMix.
func (t *Table) Sorted() []InstanceType {
	if t == nil {
		return nil
	}
	out := slices.Clone(t.InstanceTypes)
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].GPUs != out[j].GPUs {
			return out[i].GPUs < out[j].GPUs
		}
		return out[i].Name < out[j].Name
	})
	return out
}
