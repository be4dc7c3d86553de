package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/tests/cluster"
)

const (
	// progressReady and progressFailed end the progress file.
	progressReady  = "READY"
	progressFailed = "FAILED "
	// staticNodePrefix names the static GPU nodes: gpu-node-1, gpu-node-2...
	staticNodePrefix = "gpu-node-"
	// draNode is the static node of the node group in mode dra: label
	// servingLabel=dra puts it in that group (node.config in
	// demo-values.yaml), and a taint of the same key keeps pods off it
	// unless they want it.
	draNode      = "gpu-node-dra"
	servingLabel = api.Domain + "/serving"
)

// queueGVR is gpufrac's Queue resource.
var queueGVR = schema.GroupVersionResource{Group: api.Domain, Version: "v1alpha1", Resource: "queues"}

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

// serve runs the demo cluster and gpufrac-coordinator until ctx ends (down
// sends SIGTERM), then stops the coordinator and the cluster.
func serve(ctx context.Context, cfg config) error {
	logger := klog.Background()
	ctx = klog.NewContext(ctx, logger)
	p := progress{path: cfg.progressFile()}
	c, co, err := startDemo(ctx, cfg, p)
	if err != nil {
		p.say("%s%v", progressFailed, err)
		return err
	}
	p.say(progressReady)
	select {
	case <-ctx.Done():
	case <-co.done:
		logger.Error(co.err, "gpufrac-coordinator exited; the demo keeps running without it", "log", co.log)
		<-ctx.Done()
	}
	logger.Info("Stopping the demo")
	// The coordinator first: it is a client of the API server the cluster stops.
	stopCtx, cancel := context.WithTimeout(klog.NewContext(context.Background(), logger), 2*coordinatorStopGrace)
	defer cancel()
	err = errors.Join(co.stop(stopCtx), c.Stop())
	_ = os.Remove(cfg.pidFile())
	return err
}

// startDemo starts the cluster (with Karpenter and node agents), installs
// gpufrac's CRD, priority classes and RBAC, starts gpufrac-coordinator and
// adds the static GPU nodes.
func startDemo(ctx context.Context, cfg config, p progress) (c *cluster.Cluster, co *coordinatorProcess, err error) {
	c, err = startCluster(ctx, cfg, p)
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		if err != nil {
			if co != nil {
				err = errors.Join(err, co.stop(ctx))
			}
			err = errors.Join(err, c.Stop())
		}
	}()
	if err := linkState(cfg, c); err != nil {
		return nil, nil, err
	}
	began := time.Now()
	// The cluster installed gpufrac's chart (Queue CRD, namespaces, priority
	// classes, RBAC, admission policies, node config); the coordinator runs
	// with the chart Deployment's arguments as its ServiceAccount, with
	// exactly the rights a deployment grants it.
	in := c.Installed()
	kubeconfig, err := c.ServiceAccountKubeconfig(ctx, in.Namespace, in.Coordinator.ServiceAccount, nil)
	if err != nil {
		return nil, nil, err
	}
	co, err = startCoordinator(ctx, cfg, c, in, kubeconfig)
	if err != nil {
		return nil, nil, err
	}
	p.say("installed the gpufrac chart (deployments/helm/gpufrac: Queue CRD, namespaces, priority classes, RBAC, admission policies, node config); gpufrac-coordinator runs with the chart's arguments and leads as ServiceAccount %s/%s (pid %d, metrics http://%s/metrics) in %s",
		in.Namespace, in.Coordinator.ServiceAccount, co.cmd.Process.Pid, co.metrics, time.Since(began).Round(100*time.Millisecond))
	if err := addNodes(ctx, cfg, c, p); err != nil {
		return nil, nil, err
	}
	if err := addRealNode(ctx, cfg, c, p); err != nil {
		return nil, nil, err
	}
	return c, co, nil
}

// gpuInstanceTypes are the cloud's GPU machines: 1× and 8× H100.
func gpuInstanceTypes() []cluster.InstanceType {
	return slices.DeleteFunc(cluster.DefaultInstanceTypes(), func(it cluster.InstanceType) bool {
		q, ok := it.Resources[api.ResourceGPU]
		return !ok || q.IsZero()
	})
}

// startCluster starts the control plane, Karpenter when asked, and node
// agents on every GPU node.
func startCluster(ctx context.Context, cfg config, p progress) (*cluster.Cluster, error) {
	opts := cluster.Options{
		BinDir:       cfg.binDir(),
		Dir:          cfg.clusterDir(),
		StartTimeout: cfg.timeout,
		// The chart, as the test bed installs it, with the demo's values.
		Chart: cluster.ChartOptions{ValuesFiles: []string{
			filepath.Join(cfg.root, "tests", "cluster", "testbed-values.yaml"),
			filepath.Join(cfg.root, "tests", "demo", "demo-values.yaml"),
		}},
		// The node agents mount the chart's ConfigMap gpufrac-node-config
		// (its config from demo-values.yaml) and follow its edits.
		NodeAgents: &cluster.NodeAgentOptions{
			// A node Karpenter removes takes its devices with it quickly.
			StopGracePeriod: 5 * time.Second,
		},
	}
	what := "etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kwok"
	if cfg.karpenter {
		types := gpuInstanceTypes()
		var names []string
		for _, it := range types {
			names = append(names, it.Name)
		}
		opts.Karpenter = &cluster.KarpenterOptions{InstanceTypes: types, NodePools: cluster.DefaultNodePools(types)}
		what += ", Karpenter (kwok provider; instance types " + strings.Join(names, ", ") + ")"
	}
	p.say("starting the control plane: %s", what)
	began := time.Now()
	c, err := cluster.Start(ctx, opts)
	if err != nil {
		return nil, err
	}
	p.say("control plane up in %s", time.Since(began).Round(100*time.Millisecond))
	return c, nil
}

// linkState puts the admin kubeconfig and the logs where the README and
// docs/install/test-bed.md say.
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

// addNodes creates the static GPU nodes (one pool: no node-pool label) and
// waits for each node's gpufrac-node and its resources in the node status.
func addNodes(ctx context.Context, cfg config, c *cluster.Cluster, p progress) error {
	began := time.Now()
	var names []string
	for i := 1; i <= cfg.nodes; i++ {
		name := staticNodePrefix + strconv.Itoa(i)
		names = append(names, name)
		spec := cluster.NodeSpec{
			Name:   name,
			Labels: map[string]string{api.LabelGPUNode: "true", api.LabelGPUProduct: cluster.H100Product},
			// The node's GPU count is what its gpufrac-node mocks (--mock-gpus).
			Capacity: cluster.ResourceList(map[corev1.ResourceName]string{
				corev1.ResourceCPU: "192", corev1.ResourceMemory: "2048Gi", corev1.ResourcePods: "110",
				api.ResourceGPU: strconv.Itoa(cfg.gpusPerNode),
			}),
		}
		if _, err := c.AddNode(ctx, spec); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	var lines []string
	for _, name := range names {
		agent, err := c.WaitForNodeAgent(ctx, name)
		if err != nil {
			return err
		}
		var gpus, units int64
		err = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			node, err := c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			g, u := node.Status.Allocatable[api.ResourceGPU], node.Status.Allocatable[api.ResourceFraction]
			gpus, units = g.Value(), u.Value()
			// The coordinator places fractions only on GPUs it knows by UUID.
			return gpus > 0 && units > 0 && node.Annotations[api.AnnotationGPUInventory] != "", nil
		})
		if err != nil {
			return fmt.Errorf("waiting for the GPU resources of %s: %w", name, err)
		}
		lines = append(lines, fmt.Sprintf("  %s: gpufrac-node (pid %d) serves %d mock %s GPUs: %s %d, %s %d",
			name, agent.PID, gpus, agent.Model, api.ResourceGPU, gpus, api.ResourceFraction, units))
	}
	line, err := addDRANode(ctx, c)
	if err != nil {
		return err
	}
	lines = append(lines, line)
	p.say("added %d static GPU nodes in %s, each with a real gpufrac-node on mock NVML and a kubelet simulator:",
		cfg.nodes+1, time.Since(began).Round(100*time.Millisecond))
	for _, l := range lines {
		p.say("%s", l)
	}
	return nil
}

// draGPUs is how many GPUs the node in mode dra has: the mock DGX H100's
// eight (its gpufrac-node runs without --mock-gpus).
const draGPUs = 8

// addDRANode adds the node group in mode dra (one node, 8 mock GPUs: the
// DGX's) and waits until its gpufrac-node, as DRA driver, has published its
// GPUs as devices.
func addDRANode(ctx context.Context, c *cluster.Cluster) (string, error) {
	spec := cluster.NodeSpec{
		Name:   draNode,
		Labels: map[string]string{api.LabelGPUNode: "true", api.LabelGPUProduct: cluster.H100Product, servingLabel: "dra"},
		Taints: []corev1.Taint{{Key: servingLabel, Value: "dra", Effect: corev1.TaintEffectNoSchedule}},
		Capacity: cluster.ResourceList(map[corev1.ResourceName]string{
			corev1.ResourceCPU: "192", corev1.ResourceMemory: "2048Gi", corev1.ResourcePods: "110",
		}),
	}
	if _, err := c.AddNode(ctx, spec); err != nil {
		return "", err
	}
	agent, err := c.WaitForNodeAgent(ctx, draNode)
	if err != nil {
		return "", err
	}
	var devices int
	err = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		slices, err := c.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + draNode})
		if err != nil {
			return false, err
		}
		devices = 0
		for _, s := range slices.Items {
			devices += len(s.Spec.Devices)
		}
		node, err := c.Client.CoreV1().Nodes().Get(ctx, draNode, metav1.GetOptions{})
		return devices > 0 && err == nil && node.Annotations[api.AnnotationGPUInventory] != "", nil
	})
	if err != nil {
		return "", fmt.Errorf("waiting for the DRA devices of %s: %w", draNode, err)
	}
	return fmt.Sprintf("  %s (mode dra, taint %s=dra): gpufrac-node (pid %d) is DRA driver %s for %d mock %s GPUs: %d devices (whole, shares, memory views)",
		draNode, servingLabel, agent.PID, api.DRADriver, draGPUs, agent.Model, devices), nil
}
