package openb

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
)

// Setting is one knob of a resampled workload.
type Setting struct {
	// Kind is share, multigpu, gpuspec or cpuonly.
	Kind string
	// Value is the target share (0..1), see Resample.
	Value float64
}

// Variant is a list of settings applied in order.
type Variant []Setting

// String is the variant's canonical name, e.g. "share=0.60,cpuonly=0.30".
func (v Variant) String() string {
	parts := make([]string, len(v))
	for i, s := range v {
		parts[i] = fmt.Sprintf("%s=%.2f", s.Kind, s.Value)
	}
	return strings.Join(parts, ",")
}

// ParseVariant reads "share=0.6" or several settings joined by commas.
func ParseVariant(s string) (Variant, error) {
	var v Variant
	for _, part := range strings.Split(s, ",") {
		k, val, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return nil, fmt.Errorf("parsing variant %q: want kind=value", s)
		}
		x, err := strconv.ParseFloat(val, 64)
		if err != nil {
			return nil, fmt.Errorf("parsing variant %q: %w", s, err)
		}
		switch k {
		case "share", "multigpu", "gpuspec":
			if x < 0 || x > 1 {
				return nil, fmt.Errorf("parsing variant %q: %s must be in 0..1", s, k)
			}
		case "cpuonly":
			if x < 0 || x >= 1 {
				return nil, fmt.Errorf("parsing variant %q: cpuonly must be in 0..1 (exclusive)", s)
			}
		default:
			return nil, fmt.Errorf("parsing variant %q: unknown kind %q (share, multigpu, gpuspec, cpuonly)", s, k)
		}
		v = append(v, Setting{Kind: k, Value: x})
	}
	return v, nil
}

// Resample builds a variant of the trace by sampling pods from it by class,
// the way the FGD paper derives its workload variants from the default trace
// (classes: CPU-only, GPU-share, one whole GPU, multi-GPU). A class that must
// grow keeps all its pods and adds copies drawn uniformly with replacement
// from the class; one that must shrink keeps a uniform random subset. The
// result is the "original trace" of the variant: runs then shuffle and
// inflate it as usual, and the typical-pod mix comes from it.
//
//   - share=F: GPU-share pods become F of the GPU pods (by count); the whole-GPU
//     pods (one and multi together) make up the rest. Default trace: 0.44.
//   - multigpu=F: multi-GPU pods carry F of the GPU demand (milli); one-GPU
//     pods are resized so the total GPU demand stays the same. Default: 0.073.
//   - gpuspec=F: F of the GPU pods (by count) get a GPU model constraint: one
//     model drawn with probability proportional to its GPU count among the
//     models with a node that could host the pod alone. Default: 0.
//   - cpuonly=F: CPU-only pods become F of all pods (by count), GPU pods kept.
//     Default: 0.13.
func Resample(pods []Pod, nodes []NodeSpec, v Variant, seed uint64) ([]Pod, error) {
	rng := newRand(seed, streamVariant)
	out := slices.Clone(pods)
	for _, s := range v {
		var err error
		switch s.Kind {
		case "share":
			out, err = resampleShare(rng, out, s.Value)
		case "multigpu":
			out, err = resampleMulti(rng, out, s.Value)
		case "gpuspec":
			out, err = constrainModels(rng, out, nodes, s.Value)
		case "cpuonly":
			out, err = resampleCPU(rng, out, s.Value)
		default:
			err = fmt.Errorf("unknown kind %q", s.Kind)
		}
		if err != nil {
			return nil, fmt.Errorf("resampling %s: %w", v, err)
		}
	}
	return out, nil
}

func byClass(pods []Pod) map[string][]Pod {
	m := map[string][]Pod{}
	for _, p := range pods {
		m[p.Class()] = append(m[p.Class()], p)
	}
	return m
}

// resize returns n pods of class: all of them plus copies drawn with
// replacement, or a random subset.
func resize(rng *rand.Rand, class []Pod, n int, tag string) ([]Pod, error) {
	if n > 0 && len(class) == 0 {
		return nil, fmt.Errorf("no %s pods to sample from", tag)
	}
	if n <= len(class) {
		out := slices.Clone(class)
		rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
		return out[:n], nil
	}
	out := slices.Clone(class)
	for k := 0; len(out) < n; k++ {
		p := class[rng.IntN(len(class))]
		p.Name = fmt.Sprintf("%s-%s%d", p.Name, tag, k)
		out = append(out, p)
	}
	return out, nil
}

func concat(parts ...[]Pod) []Pod {
	var out []Pod
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func resampleShare(rng *rand.Rand, pods []Pod, f float64) ([]Pod, error) {
	c := byClass(pods)
	nGPU := len(c["share"]) + len(c["one"]) + len(c["multi"])
	nShare := int(math.Round(f * float64(nGPU)))
	share, err := resize(rng, c["share"], nShare, "s")
	if err != nil {
		return nil, err
	}
	whole, err := resize(rng, concat(c["one"], c["multi"]), nGPU-nShare, "w")
	if err != nil {
		return nil, err
	}
	return concat(c["cpu"], share, whole), nil
}

func demand(pods []Pod) int64 {
	var d int64
	for i := range pods {
		d += pods[i].TotalMilli()
	}
	return d
}

func resampleMulti(rng *rand.Rand, pods []Pod, f float64) ([]Pod, error) {
	c := byClass(pods)
	total := demand(pods)
	target := int64(f * float64(total))
	multi := c["multi"]
	if len(multi) == 0 && target > 0 {
		return nil, fmt.Errorf("no multi-GPU pods to sample from")
	}
	// Grow by sampling or shrink by dropping random pods, until the multi
	// demand is as close to the target as one more pod allows.
	multi = slices.Clone(multi)
	rng.Shuffle(len(multi), func(i, j int) { multi[i], multi[j] = multi[j], multi[i] })
	orig := len(multi)
	for k := 0; demand(multi) < target; k++ {
		p := c["multi"][rng.IntN(orig)]
		p.Name = fmt.Sprintf("%s-m%d", p.Name, k)
		multi = append(multi, p)
	}
	for len(multi) > 0 && demand(multi)-multi[len(multi)-1].TotalMilli() >= target {
		multi = multi[:len(multi)-1]
	}
	oneMilli := total - demand(c["share"]) - demand(multi)
	if oneMilli < 0 {
		return nil, fmt.Errorf("multi-GPU share %.2f leaves no room for one-GPU pods", f)
	}
	one, err := resize(rng, c["one"], int(oneMilli/1000), "o")
	if err != nil {
		return nil, err
	}
	return concat(c["cpu"], c["share"], one, multi), nil
}

func resampleCPU(rng *rand.Rand, pods []Pod, f float64) ([]Pod, error) {
	c := byClass(pods)
	nGPU := len(pods) - len(c["cpu"])
	nCPU := int(math.Round(f / (1 - f) * float64(nGPU)))
	cpu, err := resize(rng, c["cpu"], nCPU, "c")
	if err != nil {
		return nil, err
	}
	return concat(cpu, c["share"], c["one"], c["multi"]), nil
}

func constrainModels(rng *rand.Rand, pods []Pod, nodes []NodeSpec, f float64) ([]Pod, error) {
	out := slices.Clone(pods)
	var free []int // GPU pods without a constraint
	nGPU, constrained := 0, 0
	for i := range out {
		if out[i].NumGPU == 0 {
			continue
		}
		nGPU++
		if len(out[i].Models) > 0 {
			constrained++
		} else {
			free = append(free, i)
		}
	}
	want := int(math.Round(f*float64(nGPU))) - constrained
	if want <= 0 {
		return out, nil
	}
	rng.Shuffle(len(free), func(i, j int) { free[i], free[j] = free[j], free[i] })
	gpusOf := map[string]int{}
	var models []string
	for _, n := range nodes {
		if n.GPUs > 0 && n.Model != "" {
			if _, ok := gpusOf[n.Model]; !ok {
				models = append(models, n.Model)
			}
			gpusOf[n.Model] += n.GPUs
		}
	}
	slices.Sort(models)
	for _, i := range free[:min(want, len(free))] {
		p := &out[i]
		var cands []string
		weight := 0
		for _, m := range models {
			if slices.ContainsFunc(nodes, func(n NodeSpec) bool {
				return n.Model == m && n.GPUs >= p.NumGPU && n.CPUMilli >= p.CPUMilli && n.MemoryMiB >= p.MemoryMiB
			}) {
				cands = append(cands, m)
				weight += gpusOf[m]
			}
		}
		if len(cands) == 0 {
			continue // fits no node alone; leave it unconstrained
		}
		x := rng.IntN(weight)
		for _, m := range cands {
			if x -= gpusOf[m]; x < 0 {
				p.Models = []string{m}
				break
			}
		}
	}
	return out, nil
}
