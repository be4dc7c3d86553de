// Command kubectl-gpufrac is a kubectl plugin ("kubectl gpufrac") that prints
// gpufrac's GPUs and queues:
//
//	kubectl gpufrac [nodes] [--node NAME] [-o json]   every GPU node, its GPUs and the pods holding them
//	kubectl gpufrac -n NS [--node NAME] [-o json]     one namespace's GPU pods and their queues
//	kubectl gpufrac queues [-n NS] [-o json]          each Queue: quota, limit, used, pending by reason
//	kubectl gpufrac policy-check [-n NS] [-o json]    the workloads gpufrac's admission policies refuse or would refuse
//
// The node view needs cluster-wide reads; when they are forbidden it falls
// back to the namespace view of the kubeconfig's namespace, which needs only
// list pods there (and list queues.gpufrac.io, when allowed). See
// internal/plugin.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpufrac/gpufrac/cmd/internal/version"
	"github.com/gpufrac/gpufrac/cmd/kubectl-gpufrac/internal/plugin"
	"github.com/gpufrac/gpufrac/cmd/kubectl-gpufrac/internal/policycheck"
)

func main() {
	var cfg plugin.Config
	var kubeconfig, kubecontext string
	var timeout time.Duration
	fs := flag.NewFlagSet("kubectl-gpufrac", flag.ExitOnError)
	fs.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
	fs.StringVar(&kubecontext, "context", "", "kubeconfig context to use")
	fs.StringVar(&cfg.Namespace, "namespace", "", "show one namespace's GPU pods and their queues (needs only list pods there)")
	fs.StringVar(&cfg.Namespace, "n", "", "short for --namespace")
	fs.StringVar(&cfg.Node, "node", "", "show one node")
	fs.StringVar(&cfg.Output, "output", "", "output format: json (default: text)")
	fs.StringVar(&cfg.Output, "o", "", "short for --output")
	fs.BoolVar(&cfg.Wide, "wide", false, "print full GPU UUIDs and reservation pod names")
	fs.DurationVar(&timeout, "request-timeout", 30*time.Second, "bound on the API calls (policy-check: on each)")
	printVersion := fs.Bool("version", false, "print the version and exit")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: kubectl gpufrac [nodes|queues|policy-check] [flags]\n\n"+
			"nodes (default): every GPU node, its GPUs and the pods holding them; with -n, one namespace's GPU pods.\n"+
			"queues: each Queue with its GPU quota, limit, use and pending pods by reason.\n"+
			"policy-check: the workloads gpufrac's admission policies refuse, or would refuse once they deny: a copy of\n"+
			"one pod per workload is created with a server-side dry run (needs create pods where it looks; stores nothing).")
		fs.PrintDefaults()
	}
	// The command may come before or after the flags.
	_ = fs.Parse(os.Args[1:])
	if fs.NArg() > 0 {
		cfg.Command = fs.Arg(0)
		_ = fs.Parse(fs.Args()[1:])
	}
	if *printVersion {
		fmt.Println("kubectl-gpufrac", version.Get())
		return
	}
	if err := run(cfg, kubeconfig, kubecontext, timeout); err != nil {
		fmt.Fprintln(os.Stderr, "kubectl-gpufrac:", err)
		if errors.Is(err, plugin.ErrUsage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

func run(cfg plugin.Config, kubeconfig, kubecontext string, timeout time.Duration) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if cfg.Command != plugin.CommandPolicyCheck {
		// policy-check makes a request per pod shape: each is bounded instead.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: kubecontext})
	rc, err := cc.ClientConfig()
	if err != nil {
		return fmt.Errorf("loading kubeconfig: %w", err)
	}
	if cfg.DefaultNamespace, _, err = cc.Namespace(); err != nil {
		return fmt.Errorf("reading the kubeconfig's namespace: %w", err)
	}
	rc.UserAgent = "kubectl-gpufrac"
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("creating API client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("creating dynamic API client: %w", err)
	}
	dry, err := policycheck.NewDryRun(rc, timeout)
	if err != nil {
		return err
	}
	return plugin.Run(ctx, plugin.Clients{Kube: kube, Dynamic: dyn, DryRun: dry}, cfg, os.Stdout, os.Stderr)
}
