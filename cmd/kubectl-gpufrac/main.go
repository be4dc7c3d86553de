// Command kubectl-gpufrac is a kubectl plugin ("kubectl gpufrac") that prints the
// cluster's GPUs per node and per GPU, and which pods hold them: whole GPUs,
// fractions, reservations and placeholders; which nodes Karpenter made and which
// pods keep Karpenter from disrupting them (karpenter.sh/do-not-disrupt); GPU pods
// still pending with the scheduler's reason, placeholders asking Karpenter for
// capacity, and pods rejected at device admission.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpufrac/gpufrac/cmd/internal/version"
	"github.com/gpufrac/gpufrac/cmd/kubectl-gpufrac/internal/view"
)

func main() {
	var (
		kubeconfig  string
		kubecontext string
		wide        bool
		timeout     time.Duration
	)
	flag.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
	flag.StringVar(&kubecontext, "context", "", "kubeconfig context to use")
	flag.BoolVar(&wide, "wide", false, "print full GPU UUIDs and reservation pod names")
	flag.DurationVar(&timeout, "request-timeout", 30*time.Second, "bound on the API calls")
	printVersion := flag.Bool("version", false, "print the version and exit")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "Usage: kubectl gpufrac [flags]\n\nPrints every GPU node, its GPUs and the pods holding them.")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *printVersion {
		fmt.Println("kubectl-gpufrac", version.Get())
		return
	}
	if err := run(kubeconfig, kubecontext, wide, timeout); err != nil {
		fmt.Fprintln(os.Stderr, "kubectl-gpufrac:", err)
		os.Exit(1)
	}
}

func run(kubeconfig, kubecontext string, wide bool, timeout time.Duration) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules,
		&clientcmd.ConfigOverrides{CurrentContext: kubecontext}).ClientConfig()
	if err != nil {
		return fmt.Errorf("loading kubeconfig: %w", err)
	}
	rc.UserAgent = "kubectl-gpufrac"
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("creating API client: %w", err)
	}
	v, err := view.Load(ctx, client)
	if err != nil {
		return err
	}
	return v.Render(os.Stdout, view.Options{Wide: wide})
}
