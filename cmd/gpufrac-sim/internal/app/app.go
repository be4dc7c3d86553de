// Package app wires gpufrac-sim: it reads the trace, builds the workloads
// (default or resampled variants), runs every policy on every seed in
// parallel and writes the curves, the summary and the plot.
package app

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
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
	OutDir   string
	Workers  int
}

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
	log := klog.FromContext(ctx)
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
	if len(variants) == 0 {
		variants = []string{""}
	}
	for _, v := range variants {
		base := pods
		name := "default"
		if v != "" {
			spec, err := openb.ParseVariant(v)
			if err != nil {
				return err
			}
			if base, err = openb.Resample(pods, nodes, spec, 1); err != nil {
				return err
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
		log.V(2).Info("Running workload", "workload", name, "pods", len(base), "jobs", len(jobs))
		results, err := sim.RunAll(ctx, spec, jobs, cfg.Workers)
		if err != nil {
			return err
		}
		if err := report(cfg, name, results, stdout); err != nil {
			return err
		}
	}
	return nil
}

// report prints the summary and, with an output directory, writes the
// per-policy curve CSVs, summary.md and the SVG plot under OutDir/<workload>.
func report(cfg Config, workload string, results []*sim.Result, stdout io.Writer) error {
	cols := ReportCols()
	sums := sim.Summarize(results, cols)
	fmt.Fprintf(stdout, "\n## workload %s (nodes %s, pods %s, inflation %.2f, seeds %d)\n\n", workload,
		filepath.Base(cfg.NodesFile), filepath.Base(cfg.PodsFile), cfg.Inflation, len(cfg.Seeds))
	if err := sim.WriteMarkdown(stdout, sums, cols); err != nil {
		return fmt.Errorf("writing summary: %w", err)
	}
	if cfg.OutDir == "" {
		return nil
	}
	dir := filepath.Join(cfg.OutDir, workload)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("writing reports: %w", err)
	}
	write := func(name string, fn func(io.Writer) error) error {
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
	for _, s := range sums {
		for _, frag := range []bool{false, true} {
			name := s.Policy + "_alloc.csv"
			if frag {
				name = s.Policy + "_frag.csv"
			}
			if err := write(name, func(w io.Writer) error { return sim.WriteCurves(w, results, s.Policy, frag) }); err != nil {
				return err
			}
		}
	}
	if err := write("summary.md", func(w io.Writer) error {
		fmt.Fprintf(w, "# workload %s\n\nnodes %s, pods %s, inflation %.2f, seeds %v\n\n", workload, cfg.NodesFile, cfg.PodsFile, cfg.Inflation, cfg.Seeds)
		return sim.WriteMarkdown(w, sums, cols)
	}); err != nil {
		return err
	}
	return write("alloc.svg", func(w io.Writer) error { return sim.WriteSVG(w, sums, cfg.Inflation) })
}
