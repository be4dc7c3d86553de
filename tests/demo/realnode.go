package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/tests/cluster"
	"github.com/gpufrac/gpufrac/tests/images"
)

const (
	// realNode is the demo's real node: a kubelet and containerd on this
	// machine. A taint keeps the examples (whose images it does not have)
	// off it; realPod tolerates it.
	realNode  = "gpu-node-real"
	realTaint = api.Domain + "/real-node"
	realPod   = "real-inference"
	// realNamespace is the real pod's namespace and queue.
	realNamespace = "real-node"
	realGPUs      = 2
	realFraction  = 25
)

// addRealNode adds one real node where the machine allows it (root, runc and
// the CNI plugins, the kubelet and containerd built by make tools), runs
// gpufrac-node there as the chart's DaemonSet pod, and runs one 25 %
// fraction in a container of the workload image, whose report of what it
// sees the progress shows. Where the machine does not allow it, it says why
// and the demo goes on with kwok nodes only.
func addRealNode(ctx context.Context, cfg config, c *cluster.Cluster, p progress) error {
	if !cfg.realNode {
		return nil
	}
	if err := errors.Join(cluster.RealNodeRequirements(cfg.binDir()), cluster.MockDriverRequirements()); err != nil {
		p.say("no real node on this machine (%v): going on with kwok nodes only", err)
		return nil
	}
	began := time.Now()
	g, err := c.StartGPUNode(ctx, cluster.GPUNodeOptions{
		Name: realNode, GPUs: realGPUs,
		Taints: []corev1.Taint{{Key: realTaint, Value: "true", Effect: corev1.TaintEffectNoSchedule}},
	})
	if err != nil {
		return err
	}
	p.say("added real node %s in %s: kubelet v1.36.3 and containerd 2.4.2 with runc on this machine; gpufrac-node runs there as the chart's DaemonSet pod from its image, on %d mock GPUs (NVML and the device nodes are mock)",
		realNode, time.Since(began).Round(100*time.Millisecond), realGPUs)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: realPod, Namespace: realNamespace, Labels: map[string]string{api.LabelQueue: realNamespace}},
		Spec: corev1.PodSpec{
			SchedulerName: api.SchedulerName,
			NodeSelector:  map[string]string{corev1.LabelHostname: realNode},
			Tolerations:   []corev1.Toleration{{Key: realTaint, Operator: corev1.TolerationOpExists}},
			Containers: []corev1.Container{{
				Name: "server", Image: images.WorkloadRef, ImagePullPolicy: corev1.PullNever,
				Args: []string{"-name=server"},
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{api.ResourceFraction: *resource.NewQuantity(realFraction, resource.DecimalSI)},
					Limits:   corev1.ResourceList{api.ResourceFraction: *resource.NewQuantity(realFraction, resource.DecimalSI)},
				},
			}},
		},
	}
	if err := realQueue(ctx, c); err != nil {
		return err
	}
	ns := realNamespace
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("the real node's pod: %w", err)
	}
	var running *corev1.Pod
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err := c.Client.CoreV1().Pods(ns).Get(ctx, realPod, metav1.GetOptions{})
		if err != nil || got.Status.Phase != corev1.PodRunning {
			return false, nil
		}
		running = got
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("%s/%s did not run on %s: %w", ns, realPod, realNode, err)
	}
	rep, err := g.Report(ctx, running, "server")
	if err != nil {
		return err
	}
	p.say("  %s/%s (%d %%) runs in a container on %s and sees %s, %s=%s MiB",
		ns, realPod, realFraction, realNode, gpuList(rep.GPUs()), api.EnvMemoryLimitMiB, rep.Env[api.EnvMemoryLimitMiB])
	return nil
}

// realQueue makes the real node's namespace and its queue (one GPU), apart
// from the examples' so their figures stay theirs.
func realQueue(ctx context.Context, c *cluster.Cluster) error {
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: realNamespace}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("namespace %s: %w", realNamespace, err)
	}
	q := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": api.Domain + "/v1alpha1", "kind": "Queue",
		"metadata": map[string]any{"name": realNamespace},
		"spec": map[string]any{
			"namespaces": []any{realNamespace},
			"resources":  map[string]any{"gpu": map[string]any{"quota": "1"}},
		},
	}}
	if _, err := c.Dynamic.Resource(queueGVR).Create(ctx, q, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("queue %s: %w", realNamespace, err)
	}
	return nil
}

// gpuList names the GPU device nodes a container sees.
func gpuList(gpus []string) string {
	if len(gpus) == 0 {
		return "no GPU"
	}
	return strings.Join(gpus, ", ")
}
