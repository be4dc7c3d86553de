package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/tests/cluster"
)

const (
	// progressReady and progressFailed end the progress file.
	progressReady  = "READY"
	progressFailed = "FAILED "
	// poolLabel keeps whole-GPU and fraction workloads on separate demo nodes.
	poolLabel = "pool"
)

// progress appends human-readable lines to the progress file that up prints.
type progress struct{ path string }

func (p progress) say(format string, args ...any) {
	f, err := os.OpenFile(p.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		klog.Background().Error(err, "Writing progress failed")
		return
	}
	defer f.Close()
	fmt.Fprintf(f, format+"\n", args...)
}

// serve runs the demo cluster until ctx ends (down sends SIGTERM), then stops it.
func serve(ctx context.Context, cfg config) error {
	logger := klog.Background()
	ctx = klog.NewContext(ctx, logger)
	p := progress{path: cfg.progressFile()}
	c, err := startDemoCluster(ctx, cfg, p)
	if err != nil {
		p.say("%s%v", progressFailed, err)
		return err
	}
	p.say(progressReady)
	<-ctx.Done()
	logger.Info("Stopping the demo cluster")
	err = c.Stop()
	_ = os.Remove(cfg.pidFile())
	return err
}

// startDemoCluster starts the cluster with node agents, adds the static nodes and
// waits until every GPU node's gpufrac-node has published its resources.
func startDemoCluster(ctx context.Context, cfg config, p progress) (*cluster.Cluster, error) {
	opts := cluster.Options{
		BinDir:       cfg.binDir(),
		Dir:          cfg.clusterDir(),
		StartTimeout: cfg.timeout,
		NodeAgents:   &cluster.NodeAgentOptions{ManifestsDir: filepath.Join(cfg.root, "deployments", "manifests")},
	}
	what := "etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kwok"
	if cfg.karpenter {
		// Only the 8-GPU machine: a mock node always has the mock's 8 GPUs.
		types := slices.DeleteFunc(cluster.DefaultInstanceTypes(), func(it cluster.InstanceType) bool {
			q := it.Resources[api.ResourceGPU]
			return !q.IsZero() && q.Value() != 8
		})
		pools := cluster.DefaultNodePools(types)
		for i := range pools {
			if pools[i].Name == "gpu" {
				pools[i].Labels[poolLabel] = "training"
			}
		}
		opts.Karpenter = &cluster.KarpenterOptions{InstanceTypes: types, NodePools: pools}
		what += ", Karpenter"
	}
	p.say("starting the control plane: %s", what)
	began := time.Now()
	c, err := cluster.Start(ctx, opts)
	if err != nil {
		return nil, err
	}
	p.say("control plane up in %s", time.Since(began).Round(100*time.Millisecond))
	if err := linkState(cfg, c); err != nil {
		return nil, errors.Join(err, c.Stop())
	}
	if err := addNodes(ctx, cfg, c, p); err != nil {
		return nil, errors.Join(err, c.Stop())
	}
	return c, nil
}

// linkState puts the admin kubeconfig and the logs where the README says.
func linkState(cfg config, c *cluster.Cluster) error {
	data, err := os.ReadFile(c.KubeconfigPath)
	if err != nil {
		return fmt.Errorf("reading the admin kubeconfig: %w", err)
	}
	if err := os.WriteFile(cfg.kubeconfig(), data, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", cfg.kubeconfig(), err)
	}
	logs := filepath.Join(cfg.dir, "logs")
	_ = os.Remove(logs)
	if err := os.Symlink(c.LogDir(), logs); err != nil {
		return fmt.Errorf("linking the logs: %w", err)
	}
	return nil
}

// addNodes creates a CPU node and the static GPU nodes, and waits for each GPU
// node's gpufrac-node and its resources in the node status.
func addNodes(ctx context.Context, cfg config, c *cluster.Cluster, p progress) error {
	specs := []cluster.NodeSpec{{Name: "cpu-node-1"}}
	for i := 1; i <= cfg.nodes; i++ {
		pool := "inference"
		if i == 1 {
			pool = "training"
		}
		specs = append(specs, cluster.NodeSpec{
			Name: "gpu-node-" + strconv.Itoa(i),
			Labels: map[string]string{
				api.LabelGPUNode: "true", api.LabelGPUProduct: cluster.H100Product, poolLabel: pool,
			},
			Capacity: cluster.ResourceList(map[corev1.ResourceName]string{
				corev1.ResourceCPU: "192", corev1.ResourceMemory: "2048Gi", corev1.ResourcePods: "110",
			}),
		})
	}
	for _, spec := range specs {
		if _, err := c.AddNode(ctx, spec); err != nil {
			return err
		}
	}
	p.say("added %d mock-H100 GPU nodes and a CPU node; starting a gpufrac-node for each GPU node", cfg.nodes)
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	for _, spec := range specs[1:] {
		agent, err := c.WaitForNodeAgent(ctx, spec.Name)
		if err != nil {
			return err
		}
		var gpus, units int64
		err = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			node, err := c.Client.CoreV1().Nodes().Get(ctx, spec.Name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			g, u := node.Status.Allocatable[api.ResourceGPU], node.Status.Allocatable[api.ResourceFraction]
			gpus, units = g.Value(), u.Value()
			return gpus > 0 && units > 0, nil
		})
		if err != nil {
			return fmt.Errorf("waiting for the GPU resources of %s: %w", spec.Name, err)
		}
		p.say("  %s (pool=%s): gpufrac-node up on mock %s, pid %d: %s %d, %s %d",
			spec.Name, spec.Labels[poolLabel], agent.Model, agent.PID, api.ResourceGPU, gpus, api.ResourceFraction, units)
	}
	return nil
}
