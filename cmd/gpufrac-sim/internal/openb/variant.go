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
	// Kind is share, multigpu, gpuspec, cpuonly, or one of gpuspec's
	// modifiers focus, conc and specshare.
	Kind string
	// Value is the target share (0..1), see Resample; unused by focus.
	Value float64
	// Model is focus's GPU model.
	Model string
}

// Variant is a list of settings applied in order.
type Variant []Setting

// String is the variant's canonical name, e.g. "share=0.60,cpuonly=0.30".
func (v Variant) String() string {
	parts := make([]string, len(v))
	for i, s := range v {
		if s.Kind == "focus" {
			parts[i] = "focus=" + s.Model
			continue
		}
		parts[i] = fmt.Sprintf("%s=%.2f", s.Kind, s.Value)
	}
	return strings.Join(parts, ",")
}

// ParseVariant reads "share=0.6" or several settings joined by commas, e.g.
// "gpuspec=0.33,focus=T4,conc=0.5".
func ParseVariant(s string) (Variant, error) {
	var v Variant
	seen := map[string]bool{}
	for _, part := range strings.Split(s, ",") {
		k, val, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return nil, fmt.Errorf("parsing variant %q: want kind=value", s)
		}
		if k == "focus" {
			if val == "" {
				return nil, fmt.Errorf("parsing variant %q: focus needs a GPU model", s)
			}
			v = append(v, Setting{Kind: k, Model: val})
			seen[k] = true
			continue
		}
		x, err := strconv.ParseFloat(val, 64)
		if err != nil {
			return nil, fmt.Errorf("parsing variant %q: %w", s, err)
		}
		switch k {
		case "share", "multigpu", "gpuspec", "conc", "specshare":
			if x < 0 || x > 1 {
				return nil, fmt.Errorf("parsing variant %q: %s must be in 0..1", s, k)
			}
		case "cpuonly":
			if x < 0 || x >= 1 {
				return nil, fmt.Errorf("parsing variant %q: cpuonly must be in 0..1 (exclusive)", s)
			}
		default:
			return nil, fmt.Errorf("parsing variant %q: unknown kind %q (share, multigpu, gpuspec, focus, conc, specshare, cpuonly)", s, k)
		}
		v = append(v, Setting{Kind: k, Value: x})
		seen[k] = true
	}
	for _, mod := range []string{"focus", "conc", "specshare"} {
		if seen[mod] && !seen["gpuspec"] {
			return nil, fmt.Errorf("parsing variant %q: %s shapes gpuspec's constraints and needs gpuspec", s, mod)
		}
	}
	if seen["conc"] && !seen["focus"] {
		return nil, fmt.Errorf("parsing variant %q: conc needs focus (the model the constraints concentrate on)", s)
	}
	return v, nil
}

// specShape is how gpuspec draws its constraints (its modifiers).
type specShape struct {
	// focus is the model that gets conc of the constraints; "" draws every
	// constraint in proportion to capacity.
	focus string
	conc  float64
	// shareOf is the share of the constrained pods that are GPU shares
	// (the rest whole-GPU pods); negative picks pods regardless of class.
	shareOf float64
}

func (v Variant) specShape() specShape {
	sh := specShape{conc: 1, shareOf: -1}
	for _, s := range v {
		switch s.Kind {
		case "focus":
			sh.focus = s.Model
		case "conc":
			sh.conc = s.Value
		case "specshare":
			sh.shareOf = s.Value
		}
	}
	return sh
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
//     Modifiers (anywhere in the variant, they shape every gpuspec):
//   - focus=M, conc=C: a constrained pod asks for model M with probability C
//     (conc defaults to 1); otherwise its model is drawn as above among the
//     other models. A pod that no M node could host alone draws among the
//     others. conc equal to M's share of the GPUs is gpuspec's own draw.
//   - specshare=S: S of the constrained pods (by count) are GPU-share pods and
//     the rest whole-GPU pods; without it the constrained pods are drawn from
//     all GPU pods alike.
//   - cpuonly=F: CPU-only pods become F of all pods (by count), GPU pods kept.
//     Default: 0.13.
func Resample(pods []Pod, nodes []NodeSpec, v Variant, seed uint64) ([]Pod, error) {
	rng := newRand(seed, streamVariant)
	out := slices.Clone(pods)
	shape := v.specShape()
	if shape.focus != "" && !slices.ContainsFunc(nodes, func(n NodeSpec) bool { return n.Model == shape.focus && n.GPUs > 0 }) {
		return nil, fmt.Errorf("resampling %s: no GPU node of model %q", v, shape.focus)
	}
	for _, s := range v {
		var err error
		switch s.Kind {
		case "share":
			out, err = resampleShare(rng, out, s.Value)
		case "multigpu":
			out, err = resampleMulti(rng, out, s.Value)
		case "gpuspec":
			out, err = constrainModels(rng, out, nodes, s.Value, shape)
		case "cpuonly":
			out, err = resampleCPU(rng, out, s.Value)
		case "focus", "conc", "specshare": // gpuspec reads them
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

func constrainModels(rng *rand.Rand, pods []Pod, nodes []NodeSpec, f float64, shape specShape) ([]Pod, error) {
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
	pick := free[:min(want, len(free))]
	if shape.shareOf >= 0 {
		var shares, whole []int
		for _, i := range free {
			if out[i].Class() == "share" {
				shares = append(shares, i)
			} else {
				whole = append(whole, i)
			}
		}
		nShare := min(int(math.Round(shape.shareOf*float64(want))), len(shares))
		pick = append(shares[:nShare:nShare], whole[:min(want-nShare, len(whole))]...)
	}
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
	for _, i := range pick {
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
		if shape.focus != "" && slices.Contains(cands, shape.focus) {
			if len(cands) == 1 || rng.Float64() < shape.conc {
				p.Models = []string{shape.focus}
				continue
			}
			cands = slices.DeleteFunc(cands, func(m string) bool { return m == shape.focus })
			weight -= gpusOf[shape.focus]
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

// Family is a set of variants that vary one aspect of the workload, reported
// and plotted together.
type Family struct {
	// Name is what --family selects.
	Name string
	// About says what the family varies.
	About string
	// Variants are ParseVariant specs; "" is the trace as is.
	Variants []string
}

// ScarceModel is the GPU model that the scarce-model families concentrate
// constraints on: the one with the fewest GPUs among the models holding at
// least a tenth of the cluster's GPUs (T4 in openb: 842 of 6,212 GPUs),
// scarce enough that constrained demand can exceed it and large enough that
// flexible pods are drawn to it. "" when no node has a model.
func ScarceModel(nodes []NodeSpec) string {
	models, gpus, total := modelsBySize(nodes)
	for _, m := range models {
		if 10*gpus[m] >= total {
			return m
		}
	}
	if len(models) > 0 {
		return models[0]
	}
	return ""
}

// modelsBySize lists the GPU models of nodes, fewest GPUs first (name on
// ties), with their GPU counts and the cluster's.
func modelsBySize(nodes []NodeSpec) ([]string, map[string]int, int) {
	gpus := map[string]int{}
	total := 0
	for _, n := range nodes {
		total += n.GPUs
		if n.GPUs > 0 && n.Model != "" {
			gpus[n.Model] += n.GPUs
		}
	}
	models := make([]string, 0, len(gpus))
	for m := range gpus {
		models = append(models, m)
	}
	slices.SortFunc(models, func(a, b string) int {
		if gpus[a] != gpus[b] {
			return gpus[a] - gpus[b]
		}
		return strings.Compare(a, b)
	})
	return models, gpus, total
}

// Families are the workload families of the whole-curve report, for the
// models of nodes.
func Families(nodes []NodeSpec) []Family {
	fams := []Family{
		{Name: "default", About: "the trace as is", Variants: []string{""}},
		{Name: "share", About: "more GPU-share pods", Variants: []string{"share=0.6", "share=0.8"}},
		{Name: "multigpu", About: "more multi-GPU demand", Variants: []string{"multigpu=0.2", "multigpu=0.4"}},
		{Name: "cpuonly", About: "more CPU-only pods", Variants: []string{"cpuonly=0.3", "cpuonly=0.5"}},
		{Name: "gpuspec", About: "model constraints drawn in proportion to capacity", Variants: []string{"gpuspec=0.2", "gpuspec=0.33"}},
	}
	scarce := ScarceModel(nodes)
	if scarce == "" {
		return fams
	}
	var conc, mix, focus []string
	for _, f := range []string{"0.1", "0.2", "0.33"} {
		for _, c := range []string{"0.25", "0.5", "0.75", "1"} {
			conc = append(conc, fmt.Sprintf("gpuspec=%s,focus=%s,conc=%s", f, scarce, c))
		}
	}
	for _, f := range []string{"0.2", "0.33"} {
		for _, sh := range []string{"0", "0.5", "1"} {
			mix = append(mix, fmt.Sprintf("gpuspec=%s,focus=%s,conc=0.5,specshare=%s", f, scarce, sh))
		}
	}
	models, _, _ := modelsBySize(nodes)
	for _, m := range models {
		focus = append(focus, fmt.Sprintf("gpuspec=0.2,focus=%s,conc=0.5", m))
	}
	return append(fams,
		Family{Name: "scarce", About: "model constraints concentrated on the scarce model " + scarce + " (share of GPU pods constrained × share of them on " + scarce + ")", Variants: conc},
		Family{Name: "scarcemix", About: "constraints half on " + scarce + ", only whole-GPU pods, half and half, or only shares constrained", Variants: mix},
		Family{Name: "focus", About: "a fifth of the GPU pods constrained, half of them on one model, each model in turn (fewest GPUs first)", Variants: focus},
	)
}

// Mix is what a workload is made of, as measured (how a variant came out).
type Mix struct {
	Pods int
	// CPUOnly is the CPU-only share of all pods; Shares the GPU-share pods'
	// share of the GPU pods; MultiDemand the multi-GPU pods' share of GPU
	// demand.
	CPUOnly, Shares, MultiDemand float64
	// Constrained is the share of GPU pods with a model constraint and
	// ConstrainedAll their share of all pods; ByModel is each model's share
	// of the constrained pods; ConstrainedShares the GPU-share pods' share of
	// the constrained pods.
	Constrained, ConstrainedAll, ConstrainedShares float64
	ByModel                                        map[string]float64
}

// Describe measures pods' mix.
func Describe(pods []Pod) Mix {
	mix := Mix{Pods: len(pods), ByModel: map[string]float64{}}
	var cpu, gpu, shares, constrained, cShares int
	var demand, multi int64
	for i := range pods {
		p := &pods[i]
		switch p.Class() {
		case "cpu":
			cpu++
			continue
		case "share":
			shares++
		case "multi":
			multi += p.TotalMilli()
		}
		gpu++
		demand += p.TotalMilli()
		if len(p.Models) > 0 {
			constrained++
			if p.Class() == "share" {
				cShares++
			}
			for _, m := range p.Models {
				mix.ByModel[m] += 1 / float64(len(p.Models))
			}
		}
	}
	ratio := func(a, b float64) float64 {
		if b == 0 {
			return 0
		}
		return a / b
	}
	mix.CPUOnly = ratio(float64(cpu), float64(len(pods)))
	mix.Shares = ratio(float64(shares), float64(gpu))
	mix.MultiDemand = ratio(float64(multi), float64(demand))
	mix.Constrained = ratio(float64(constrained), float64(gpu))
	mix.ConstrainedAll = ratio(float64(constrained), float64(len(pods)))
	mix.ConstrainedShares = ratio(float64(cShares), float64(constrained))
	for m := range mix.ByModel {
		mix.ByModel[m] = ratio(mix.ByModel[m], float64(constrained))
	}
	return mix
}

// String is the mix in one line.
func (m Mix) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d pods, CPU-only %.3f, shares %.3f of GPU pods, multi-GPU %.3f of GPU demand", m.Pods, m.CPUOnly, m.Shares, m.MultiDemand)
	if m.Constrained > 0 {
		fmt.Fprintf(&b, "; constrained %.3f of GPU pods (%.3f of all pods, %.2f of them shares):", m.Constrained, m.ConstrainedAll, m.ConstrainedShares)
		models := make([]string, 0, len(m.ByModel))
		for k := range m.ByModel {
			models = append(models, k)
		}
		slices.SortFunc(models, func(a, b string) int {
			if m.ByModel[a] != m.ByModel[b] {
				if m.ByModel[a] > m.ByModel[b] {
					return -1
				}
				return 1
			}
			return strings.Compare(a, b)
		})
		for _, k := range models {
			fmt.Fprintf(&b, " %s %.2f", k, m.ByModel[k])
		}
	}
	return b.String()
}
