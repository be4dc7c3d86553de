// Command gpufrac-sim replays the Alibaba openb GPU-sharing trace against
// gpufrac's placement policies (the coordinator's own code) and reports the
// GPU allocation ratio against arrived demand, FGD-paper style.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"

	"github.com/gpufrac/gpufrac/cmd/gpufrac-sim/internal/app"
	"k8s.io/klog/v2"
)

func main() {
	var cfg app.Config
	flag.StringVar(&cfg.NodesFile, "nodes", "", "node list CSV (default: openb_node_list_gpu_node.csv under ../shared/data/openb of the repo)")
	flag.StringVar(&cfg.PodsFile, "pods", "", "pod list CSV (default: openb_pod_list_default.csv next to the node list)")
	policies := flag.String("policies", "random,dotprod,gpuclustering,gpupacking,bestfit,fgd,gpufrac", "comma-separated placement policies")
	seeds := flag.String("seeds", "42-51", "seeds: a range 42-51 and/or a list 42,45")
	flag.Float64Var(&cfg.Inflation, "inflation", 1.3, "arrived GPU demand at the end, as a multiple of cluster GPU capacity")
	flag.Float64Var(&cfg.Coverage, "typical-coverage", 0.95, "share of pods the typical-pod mix (fgd, gpufrac) covers")
	variants := flag.String("variant", "", "resampled workloads, ';'-separated (e.g. default;share=0.6;multigpu=0.3;gpuspec=0.33,focus=T4,conc=0.5;cpuonly=0.3), reported as one family; empty: the trace as is unless --family is given")
	families := flag.String("family", "", "workload families with a whole-curve report and plot each, comma-separated, or all (default, share, multigpu, cpuonly, gpuspec, scarce, scarcemix, focus)")
	compare := flag.String("compare", "gpufrac,fgd", "candidate and baseline policy of the family reports")
	flag.StringVar(&cfg.OutDir, "out", "", "directory for curves, summary.md and the SVG plot (empty: stdout summary only)")
	flag.IntVar(&cfg.Workers, "workers", runtime.GOMAXPROCS(0), "runs in parallel")
	klog.InitFlags(nil)
	flag.Parse()

	var err error
	cfg.Policies = strings.Split(*policies, ",")
	if cfg.Seeds, err = app.ParseSeeds(*seeds); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if *variants != "" {
		cfg.Variants = strings.Split(*variants, ";")
	}
	if *families != "" {
		cfg.Families = strings.Split(*families, ",")
	}
	cand, base, ok := strings.Cut(*compare, ",")
	if !ok {
		fmt.Fprintln(os.Stderr, "--compare wants two policies: candidate,baseline")
		os.Exit(2)
	}
	cfg.Compare = [2]string{cand, base}
	ctx, stop := signal.NotifyContext(klog.NewContext(context.Background(), klog.Background()), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := app.Run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "gpufrac-sim:", err)
		stop()
		os.Exit(1)
	}
}
