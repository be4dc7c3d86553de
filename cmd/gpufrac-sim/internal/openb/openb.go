// Package openb reads the Alibaba openb GPU-sharing trace (the node and pod
// CSV files published with the FGD paper, or any file of that format) and
// builds the simulation workload exactly as the paper's artifact does: see
// ../shared/data/openb/METHOD.md.
package openb

import (
	"cmp"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/gpufrac/gpufrac/coordinator/placement"
)

// MiB is one mebibyte in bytes; the trace gives memory in MiB.
const MiB = 1 << 20

// NodeSpec is one row of a node list.
type NodeSpec struct {
	Name      string
	CPUMilli  int64
	MemoryMiB int64
	GPUs      int
	Model     string
}

// Pod is one row of a pod list.
type Pod struct {
	Name      string
	CPUMilli  int64
	MemoryMiB int64
	// NumGPU is the GPU count; GPUMilli is per GPU, clamped to 1..1000 when
	// NumGPU > 0 (0 otherwise). NumGPU 1 with GPUMilli < 1000 is a share.
	NumGPU   int
	GPUMilli int
	// Models restricts the GPU model (the gpu_spec column "A|B"); empty: any.
	Models []string
}

// TotalMilli is the pod's GPU demand.
func (p *Pod) TotalMilli() int64 { return int64(p.NumGPU) * int64(p.GPUMilli) }

// Class is the pod's workload class: "cpu", "share", "one" or "multi".
func (p *Pod) Class() string {
	switch {
	case p.NumGPU == 0:
		return "cpu"
	case p.NumGPU == 1 && p.GPUMilli < placement.MilliPerGPU:
		return "share"
	case p.NumGPU == 1:
		return "one"
	}
	return "multi"
}

// Request is the pod as a placement request.
func (p *Pod) Request() placement.Request {
	r := placement.Request{CPUMilli: p.CPUMilli, MemoryBytes: p.MemoryMiB * MiB, Models: p.Models}
	if p.Class() == "share" {
		r.ShareMilli = p.GPUMilli
	} else {
		r.GPUs = p.NumGPU
	}
	return r
}

// Nodes turns node specs into placement nodes (GPU IDs are device indices,
// the model is the trace's model string), in the given order.
func Nodes(specs []NodeSpec, order []int) []placement.Node {
	nodes := make([]placement.Node, len(order))
	for k, i := range order {
		sp := specs[i]
		n := placement.Node{
			Name:        sp.Name,
			Model:       sp.Model,
			Labels:      map[string]string{"openb/model": sp.Model},
			CPUMilli:    sp.CPUMilli,
			MemoryBytes: sp.MemoryMiB * MiB,
			GPUs:        make([]placement.GPU, sp.GPUs),
		}
		for g := range n.GPUs {
			n.GPUs[g] = placement.GPU{ID: strconv.Itoa(g), FreeMilli: placement.MilliPerGPU}
		}
		nodes[k] = n
	}
	return nodes
}

// CapacityMilli is the GPU capacity of the nodes in milli-GPU.
func CapacityMilli(specs []NodeSpec) int64 {
	var c int64
	for _, n := range specs {
		c += int64(n.GPUs) * placement.MilliPerGPU
	}
	return c
}

// table reads a CSV with a header into rows addressed by column name.
type table struct {
	cols map[string]int
	rows [][]string
}

func readTable(r io.Reader, required ...string) (*table, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	recs, err := cr.ReadAll()
	if err != nil {
		return nil, fmt.Errorf("reading CSV: %w", err)
	}
	if len(recs) == 0 {
		return nil, errors.New("reading CSV: empty file")
	}
	t := &table{cols: map[string]int{}, rows: recs[1:]}
	for i, h := range recs[0] {
		t.cols[strings.TrimSpace(h)] = i
	}
	for _, c := range required {
		if _, ok := t.cols[c]; !ok {
			return nil, fmt.Errorf("reading CSV: missing column %q", c)
		}
	}
	return t, nil
}

func (t *table) str(row []string, col string) string {
	i, ok := t.cols[col]
	if !ok || i >= len(row) {
		return ""
	}
	return strings.TrimSpace(row[i])
}

func (t *table) int(row []string, col string) (int64, error) {
	s := t.str(row, col)
	if s == "" {
		return 0, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		f, ferr := strconv.ParseFloat(s, 64)
		if ferr != nil {
			return 0, fmt.Errorf("column %s: %w", col, err)
		}
		v = int64(f)
	}
	return v, nil
}

// ReadNodes reads a node list (sn,cpu_milli,memory_mib,gpu,model). Nodes
// without GPUs are kept; the caller decides whether to simulate them.
func ReadNodes(r io.Reader) ([]NodeSpec, error) {
	t, err := readTable(r, "sn", "cpu_milli", "memory_mib", "gpu")
	if err != nil {
		return nil, fmt.Errorf("reading node list: %w", err)
	}
	out := make([]NodeSpec, 0, len(t.rows))
	for k, row := range t.rows {
		n := NodeSpec{Name: t.str(row, "sn"), Model: t.str(row, "model")}
		var gpus int64
		var errs [3]error
		n.CPUMilli, errs[0] = t.int(row, "cpu_milli")
		n.MemoryMiB, errs[1] = t.int(row, "memory_mib")
		gpus, errs[2] = t.int(row, "gpu")
		if err := errors.Join(errs[:]...); err != nil {
			return nil, fmt.Errorf("reading node list line %d: %w", k+2, err)
		}
		if n.Model == "nan" {
			n.Model = ""
		}
		n.GPUs = int(gpus)
		out = append(out, n)
	}
	return out, nil
}

// ReadPods reads a pod list (name,cpu_milli,memory_mib,num_gpu,gpu_milli,
// gpu_spec,...). qos, phase and time columns are ignored.
func ReadPods(r io.Reader) ([]Pod, error) {
	t, err := readTable(r, "name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
	if err != nil {
		return nil, fmt.Errorf("reading pod list: %w", err)
	}
	out := make([]Pod, 0, len(t.rows))
	for k, row := range t.rows {
		p := Pod{Name: t.str(row, "name")}
		var num, milli int64
		var errs [4]error
		p.CPUMilli, errs[0] = t.int(row, "cpu_milli")
		p.MemoryMiB, errs[1] = t.int(row, "memory_mib")
		num, errs[2] = t.int(row, "num_gpu")
		milli, errs[3] = t.int(row, "gpu_milli")
		if err := errors.Join(errs[:]...); err != nil {
			return nil, fmt.Errorf("reading pod list line %d: %w", k+2, err)
		}
		p.NumGPU = int(num)
		if p.NumGPU > 0 {
			p.GPUMilli = int(min(max(milli, 1), placement.MilliPerGPU))
		}
		if p.NumGPU > 1 && p.GPUMilli != placement.MilliPerGPU {
			return nil, fmt.Errorf("reading pod list line %d: pod %s shares %d GPUs (%d milli each); only one GPU can be shared", k+2, p.Name, p.NumGPU, p.GPUMilli)
		}
		if spec := t.str(row, "gpu_spec"); spec != "" && spec != "nan" {
			for _, m := range strings.Split(spec, "|") {
				if m = strings.TrimSpace(m); m != "" {
					p.Models = append(p.Models, m)
				}
			}
		}
		out = append(out, p)
	}
	return out, nil
}

// newRand is the seeded generator of one purpose (stream) of one seed.
func newRand(seed uint64, stream uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, stream))
}

// Random streams, so that the workload, the node order and the variants of
// one seed do not depend on each other.
const (
	streamWorkload = 1
	streamNodes    = 2
	streamVariant  = 3
)

// Workload builds one run's arrival sequence (METHOD.md, "Workload for one
// run"): pods sorted by name and shuffled with the seed; then, if their GPU
// demand is below inflation × capacity, pods sampled uniformly with
// replacement from the sorted list are appended until the next one would
// pass the target (that one is dropped); if above, random pods are removed,
// keeping order, until the demand is at most the target.
func Workload(pods []Pod, capacityMilli int64, inflation float64, seed uint64) []Pod {
	rng := newRand(seed, streamWorkload)
	sorted := slices.Clone(pods)
	slices.SortStableFunc(sorted, func(a, b Pod) int { return cmp.Compare(a.Name, b.Name) })
	out := slices.Clone(sorted)
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })

	var total int64
	anyGPU := false
	for i := range out {
		total += out[i].TotalMilli()
		anyGPU = anyGPU || out[i].TotalMilli() > 0
	}
	target := int64(inflation * float64(capacityMilli))
	if !anyGPU || len(sorted) == 0 {
		return out
	}
	switch {
	case total < target:
		for n := 0; ; n++ {
			p := sorted[rng.IntN(len(sorted))]
			if total+p.TotalMilli() > target {
				break
			}
			total += p.TotalMilli()
			p.Name = fmt.Sprintf("%s-x%d", p.Name, n)
			out = append(out, p)
		}
	case total > target:
		for total > target {
			i := rng.IntN(len(out))
			total -= out[i].TotalMilli()
			out = slices.Delete(out, i, i+1)
		}
	}
	return out
}

// NodeOrder is the seeded order in which nodes are visited; it breaks score
// ties (the CSV order groups nodes by model and would bias packing).
func NodeOrder(n int, seed uint64) []int {
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	rng := newRand(seed, streamNodes)
	rng.Shuffle(n, func(i, j int) { order[i], order[j] = order[j], order[i] })
	return order
}

// Requests turns pods into placement requests.
func Requests(pods []Pod) []placement.Request {
	out := make([]placement.Request, len(pods))
	for i := range pods {
		out[i] = pods[i].Request()
	}
	return out
}

// FindData looks for the trace directory shared/data/openb in dir and its
// parents, and next to them (the repository sits beside ../shared).
func FindData(dir string) (string, error) {
	for {
		for _, cand := range []string{filepath.Join(dir, "shared", "data", "openb"), filepath.Join(dir, "..", "shared", "data", "openb")} {
			if st, err := os.Stat(cand); err == nil && st.IsDir() {
				return filepath.Clean(cand), nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("finding the openb data: no shared/data/openb at or above the working directory; pass --nodes and --pods")
		}
		dir = parent
	}
}
