// Command gpufrac-demo runs gpufrac's demo: a local Kubernetes control plane with
// kwok fake nodes (mock H100 GPUs), a real gpufrac-node per GPU node acting with a
// kubelet simulator, Karpenter's kwok provider and the real gpufrac-coordinator. It
// submits the sample workloads from deployments/examples (queues, whole GPUs, a
// gang, fractions, an over-quota pod, a bad request and a burst of fractions
// Karpenter adds nodes for) and prints who holds which GPU. The cluster keeps
// running in the background after `up` returns, until `down`.
//
//	gpufrac-demo up      start (or show) the demo; what `make demo` runs
//	gpufrac-demo status  print the GPU view of the running demo
//	gpufrac-demo down    stop everything and remove bin/demo
//
// State lives in bin/demo: demo.pid, kubeconfig (admin), coordinator.kubeconfig
// (the coordinator's ServiceAccount), logs/ (one file per component, per
// gpufrac-node and for gpufrac-coordinator), demo.log (the background process's
// own log).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/gpufrac/gpufrac/tests/cluster"
)

const usage = `Usage: gpufrac-demo up|status|down [flags]

  up      start the demo cluster in the background, submit the examples, print the GPU view
  status  print the GPU view of the running demo
  down    stop the demo and remove its state
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	cmd, args := os.Args[1], os.Args[2:]
	fs := flag.NewFlagSet(cmd, flag.ExitOnError)
	var cfg config
	fs.StringVar(&cfg.dir, "dir", "", "demo state directory (default <repository>/bin/demo)")
	fs.StringVar(&cfg.bin, "bin-dir", "", "where the tools, gpufrac-node and kubectl-gpufrac are (default <repository>/bin)")
	fs.IntVar(&cfg.nodes, "gpu-nodes", 2, "static mock-H100 GPU nodes")
	fs.IntVar(&cfg.gpusPerNode, "gpus-per-node", 4, "mock H100s per static GPU node (1-8)")
	fs.BoolVar(&cfg.karpenter, "karpenter", true, "run Karpenter's kwok provider (1× and 8× H100 instance types) and submit the burst it adds nodes for")
	fs.BoolVar(&cfg.realNode, "real-node", true, "add one real node (the kubelet and containerd on this machine, gpufrac-node as the chart's DaemonSet pod) where the machine allows it: root, runc and the CNI plugins")
	fs.DurationVar(&cfg.timeout, "timeout", 5*time.Minute, "bound on bringing the cluster up and the workloads to settle")
	fs.Usage = func() { fmt.Fprint(os.Stderr, usage); fs.PrintDefaults() }
	if err := fs.Parse(args); err != nil {
		os.Exit(2)
	}
	if err := cfg.resolve(); err != nil {
		fmt.Fprintln(os.Stderr, "gpufrac-demo:", err)
		os.Exit(1)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	var err error
	switch cmd {
	case "up":
		err = up(ctx, cfg)
	case "status":
		err = status(ctx, cfg)
	case "down":
		err = down(ctx, cfg)
	case "serve": // the background process started by up
		err = serve(ctx, cfg)
	default:
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpufrac-demo:", err)
		os.Exit(1)
	}
}

// config is the demo's configuration, from flags.
type config struct {
	root        string // the repository root
	dir         string // state directory
	bin         string // binaries
	nodes       int
	gpusPerNode int
	karpenter   bool
	realNode    bool
	timeout     time.Duration
}

func (c *config) resolve() error {
	root, err := cluster.RepoRoot()
	if err != nil {
		return fmt.Errorf("run gpufrac-demo from the gpufrac repository: %w", err)
	}
	c.root = root
	if c.dir == "" {
		c.dir = filepath.Join(root, "bin", "demo")
	}
	if c.dir, err = filepath.Abs(c.dir); err != nil {
		return fmt.Errorf("resolving --dir: %w", err)
	}
	if c.bin == "" {
		c.bin = filepath.Join(root, "bin")
	}
	if c.bin, err = filepath.Abs(c.bin); err != nil {
		return fmt.Errorf("resolving --bin-dir: %w", err)
	}
	if c.nodes < 1 {
		return fmt.Errorf("--gpu-nodes must be at least 1, got %d", c.nodes)
	}
	if c.gpusPerNode < 1 || c.gpusPerNode > 8 {
		return fmt.Errorf("--gpus-per-node must be 1 to 8 (the mock DGX H100 has 8), got %d", c.gpusPerNode)
	}
	return nil
}

// Paths inside the state directory.
func (c config) pidFile() string      { return filepath.Join(c.dir, "demo.pid") }
func (c config) progressFile() string { return filepath.Join(c.dir, "progress") }
func (c config) kubeconfig() string   { return filepath.Join(c.dir, "kubeconfig") }
func (c config) clusterDir() string   { return filepath.Join(c.dir, "cluster") }
func (c config) logFile() string      { return filepath.Join(c.dir, "demo.log") }
func (c config) binDir() string       { return c.bin }
