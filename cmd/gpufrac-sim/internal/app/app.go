// Package app wires gpufrac-sim: it reads the trace, builds the workloads
// (default or resampled variants), runs every policy on every seed in
// parallel and writes the curves, the summary and the plot.
package app

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/gpufrac/gpufrac/cmd/gpufrac-sim/internal/openb"
	"github.com/gpufrac/gpufrac/cmd/gpufrac-sim/internal/sim"
	"github.com/gpufrac/gpufrac/coordinator/placement"
	"k8s.io/klog/v2"
)

// Config is the simulator's command line.
type Config struct {
	NodesFile, PodsFile string
	Policies            []string
	Seeds               []uint64
	Inflation           float64
	Coverage            float64
	// Variants are resampling specs ("share=0.6"); empty runs the trace as is.
	Variants []string
	// Families are workload families (openb.Families) to run, with a
	// whole-curve report and plot each; "all" runs every family. They run
	// after Variants, and only they when Variants is empty.
	Families []string
	// Compare is the candidate and the baseline policy of the family
	// reports ("gpufrac", "fgd").
	Compare [2]string
	OutDir  string
	Workers int
}

// CurveFrom is the first arrived-demand column of the whole-curve reports;
// they end at the last column (100 × inflation).
const CurveFrom = 10

// ReportCols are the columns the summary reports.
func ReportCols() []int { return []int{100, 130} }

// ParseSeeds reads "42-51", "42,45" or a mix ("1,5-7").
func ParseSeeds(s string) ([]uint64, error) {
	var out []uint64
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.ParseUint(lo, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("parsing seeds %q: %w", s, err)
		}
		b := a
		if isRange {
			if b, err = strconv.ParseUint(hi, 10, 64); err != nil {
				return nil, fmt.Errorf("parsing seeds %q: %w", s, err)
			}
		}
		if b < a || b-a > 10000 {
			return nil, fmt.Errorf("parsing seeds %q: bad range %s", s, part)
		}
		for x := a; x <= b; x++ {
			out = append(out, x)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("parsing seeds %q: no seed", s)
	}
	return out, nil
}

func readFile[T any](path string, read func(io.Reader) ([]T, error)) ([]T, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return read(f)
}

// Run executes the configured experiments and writes the reports.
func Run(ctx context.Context, cfg Config, stdout io.Writer) error {
	if cfg.NodesFile == "" || cfg.PodsFile == "" {
		wd, err := os.Getwd()
		if err != nil {
			return fmt.Errorf("finding the openb data: %w", err)
		}
		dir, err := openb.FindData(wd)
		if err != nil {
			return err
		}
		if cfg.NodesFile == "" {
			cfg.NodesFile = filepath.Join(dir, "openb_node_list_gpu_node.csv")
		}
		if cfg.PodsFile == "" {
			cfg.PodsFile = filepath.Join(dir, "openb_pod_list_default.csv")
		}
	}
	for _, p := range cfg.Policies {
		if _, err := placement.New(p, placement.Options{}); err != nil {
			return err
		}
	}
	nodes, err := readFile(cfg.NodesFile, openb.ReadNodes)
	if err != nil {
		return fmt.Errorf("reading %s: %w", cfg.NodesFile, err)
	}
	pods, err := readFile(cfg.PodsFile, openb.ReadPods)
	if err != nil {
		return fmt.Errorf("reading %s: %w", cfg.PodsFile, err)
	}
	variants := cfg.Variants
	if len(variants) == 0 && len(cfg.Families) == 0 {
		variants = []string{""}
	}
	fams, err := selectFamilies(cfg.Families, nodes)
	if err != nil {
		return err
	}
	if len(variants) > 0 {
		// The variants asked for one by one make a family of their own,
		// reported in OutDir itself.
		own := openb.Family{Name: "variants", About: "the --variant list", Variants: variants}
		if len(cfg.Variants) == 0 {
			own.Name, own.About = "default", "the trace as is"
		}
		fams = append([]openb.Family{own}, fams...)
	}
	for k, fam := range fams {
		out := ""
		if cfg.OutDir != "" {
			out = filepath.Join(cfg.OutDir, fam.Name)
			if k == 0 && len(variants) > 0 {
				out = cfg.OutDir
			}
		}
		var wls []sim.Workload
		for _, v := range fam.Variants {
			wl, err := runWorkload(ctx, cfg, nodes, pods, v, out, stdout)
			if err != nil {
				return err
			}
			wls = append(wls, wl)
		}
		if err := reportFamily(cfg, fam, wls, out, stdout); err != nil {
			return err
		}
	}
	return nil
}

// selectFamilies resolves family names ("all": every family).
func selectFamilies(names []string, nodes []openb.NodeSpec) ([]openb.Family, error) {
	all := openb.Families(nodes)
	var out []openb.Family
	for _, n := range names {
		if n == "all" {
			return all, nil
		}
		k := slices.IndexFunc(all, func(f openb.Family) bool { return f.Name == n })
		if k < 0 {
			known := make([]string, len(all))
			for i, f := range all {
				known[i] = f.Name
			}
			return nil, fmt.Errorf("unknown workload family %q (known: %s, all)", n, strings.Join(known, ", "))
		}
		out = append(out, all[k])
	}
	return out, nil
}

// runWorkload builds one workload (v: a variant spec, "" the trace as is),
// runs every policy on every seed and writes its reports under
// outDir/<workload> (no files when outDir is "").
func runWorkload(ctx context.Context, cfg Config, nodes []openb.NodeSpec, pods []openb.Pod, v, outDir string, stdout io.Writer) (sim.Workload, error) {
	base := pods
	name := "default"
	if v != "" && v != "default" {
		spec, err := openb.ParseVariant(v)
		if err != nil {
			return sim.Workload{}, err
		}
		if base, err = openb.Resample(pods, nodes, spec, 1); err != nil {
			return sim.Workload{}, err
		}
		name = spec.String()
	}
	spec := &sim.Spec{Nodes: nodes, Pods: base, Inflation: cfg.Inflation, Coverage: cfg.Coverage}
	var jobs []sim.Job
	for _, p := range cfg.Policies {
		for _, s := range cfg.Seeds {
			jobs = append(jobs, sim.Job{Policy: p, Seed: s})
		}
	}
	klog.FromContext(ctx).V(2).Info("Running workload", "workload", name, "pods", len(base), "jobs", len(jobs))
	results, err := sim.RunAll(ctx, spec, jobs, cfg.Workers)
	if err != nil {
		return sim.Workload{}, err
	}
	wl := sim.Workload{Name: name, Mix: openb.Describe(base).String(), Curves: sim.Curves(results, CurveFrom, int(math.Round(100*cfg.Inflation)))}
	return wl, report(cfg, name, results, wl, outDir, stdout)
}

// writeFile creates dir/name and fills it with fn.
func writeFile(dir, name string, fn func(io.Writer) error) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("writing reports: %w", err)
	}
	f, err := os.Create(filepath.Join(dir, name))
	if err != nil {
		return fmt.Errorf("writing %s: %w", name, err)
	}
	if err := fn(f); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", name, err)
	}
	return f.Close()
}

// reportFamily prints a family's table and, with an output directory,
// writes it (family.md), every workload's curves (curves.csv) and the plot
// (family.svg) under outDir.
func reportFamily(cfg Config, fam openb.Family, wls []sim.Workload, outDir string, stdout io.Writer) error {
	fmt.Fprintf(stdout, "\n## family %s: %s (seeds %d)\n\n", fam.Name, fam.About, len(cfg.Seeds))
	table := func(w io.Writer) error { return sim.WriteFamilyMarkdown(w, wls, cfg.Compare[0], cfg.Compare[1]) }
	if err := table(stdout); err != nil {
		return fmt.Errorf("writing family %s: %w", fam.Name, err)
	}
	if outDir == "" {
		return nil
	}
	if err := writeFile(outDir, "family.md", func(w io.Writer) error {
		fmt.Fprintf(w, "# family %s: %s\n\nnodes %s, pods %s, inflation %.2f, seeds %v\n\n", fam.Name, fam.About,
			filepath.Base(cfg.NodesFile), filepath.Base(cfg.PodsFile), cfg.Inflation, cfg.Seeds)
		return table(w)
	}); err != nil {
		return err
	}
	if err := writeFile(outDir, "curves.csv", func(w io.Writer) error {
		for k, wl := range wls {
			if k > 0 {
				if _, err := io.WriteString(w, "\n"); err != nil {
					return err
				}
			}
			if _, err := fmt.Fprintf(w, "# workload %s\n", wl.Name); err != nil {
				return err
			}
			if err := sim.WriteCurveTable(w, wl.Curves); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return err
	}
	return writeFile(outDir, "family.svg", func(w io.Writer) error {
		return sim.WriteFamilySVG(w, fam.Name, wls, cfg.Compare[0], cfg.Compare[1])
	})
}

// report prints the summary and, with an output directory, writes the
// per-policy curve CSVs, summary.md, the whole-curve report (curve.md and
// curve.csv) and the SVG plot under outDir/<workload>.
func report(cfg Config, workload string, results []*sim.Result, wl sim.Workload, outDir string, stdout io.Writer) error {
	cols := ReportCols()
	sums := sim.Summarize(results, cols)
	fmt.Fprintf(stdout, "\n## workload %s (nodes %s, pods %s, inflation %.2f, seeds %d)\n\n", workload,
		filepath.Base(cfg.NodesFile), filepath.Base(cfg.PodsFile), cfg.Inflation, len(cfg.Seeds))
	if err := sim.WriteMarkdown(stdout, sums, cols); err != nil {
		return fmt.Errorf("writing summary: %w", err)
	}
	if outDir == "" {
		return nil
	}
	dir := filepath.Join(outDir, workload)
	for _, s := range sums {
		for _, frag := range []bool{false, true} {
			name := s.Policy + "_alloc.csv"
			if frag {
				name = s.Policy + "_frag.csv"
			}
			if err := writeFile(dir, name, func(w io.Writer) error { return sim.WriteCurves(w, results, s.Policy, frag) }); err != nil {
				return err
			}
		}
	}
	if err := writeFile(dir, "summary.md", func(w io.Writer) error {
		fmt.Fprintf(w, "# workload %s\n\nnodes %s, pods %s, inflation %.2f, seeds %v\n\n%s\n\n", workload, cfg.NodesFile, cfg.PodsFile, cfg.Inflation, cfg.Seeds, wl.Mix)
		return sim.WriteMarkdown(w, sums, cols)
	}); err != nil {
		return err
	}
	if err := writeFile(dir, "curve.md", func(w io.Writer) error {
		fmt.Fprintf(w, "# workload %s: the whole curve\n\nseeds %v; %s\n\n", workload, cfg.Seeds, wl.Mix)
		return sim.WriteCurveMarkdown(w, wl.Curves, 5)
	}); err != nil {
		return err
	}
	if err := writeFile(dir, "curve.csv", func(w io.Writer) error { return sim.WriteCurveTable(w, wl.Curves) }); err != nil {
		return err
	}
	return writeFile(dir, "alloc.svg", func(w io.Writer) error { return sim.WriteSVG(w, sums, cfg.Inflation) })
}
