package cluster

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/klog/v2"
)

// The KubeRay operator (github.com/ray-project/kuberay/ray-operator,
// bin/kuberay-operator and bin/kuberay-crds from `make tools`) runs beside the
// control plane when Options.KubeRay is set: its CRDs (RayCluster, RayJob,
// RayService) are installed and the operator runs as a process, as released,
// with its health probes on 127.0.0.1 and nothing else listening: metrics off,
// leader election off, no webhook (KubeRay's is optional and its main
// registers it only with ENABLE_WEBHOOKS=true), and no batch scheduler
// integration (--batch-scheduler unset: the no-op one), so the pods it
// creates keep the schedulerName of their group's template.

const (
	// KubeRayAPIVersion is the version of KubeRay's kinds the helpers speak.
	KubeRayAPIVersion = "ray.io/v1"
	// RayClusterLabel is the label with its RayCluster's name that KubeRay
	// puts on every pod of a RayCluster (it cannot be overridden from a
	// group's template).
	RayClusterLabel = "ray.io/cluster"
	// RayNodeTypeLabel is the label that says whether a RayCluster's pod is
	// its head ("head") or a worker ("worker").
	RayNodeTypeLabel = "ray.io/node-type"
	// RayNodeGroupLabel is the label with the pod's group: the worker
	// group's name, "headgroup" for the head.
	RayNodeGroupLabel = "ray.io/group"

	// kuberayOperator is the operator's component (and binary) name.
	kuberayOperator = "kuberay-operator"
)

// KubeRayOptions configures the KubeRay operator.
type KubeRayOptions struct {
	// Env adds environment variables (NAME=value) to the operator's: KubeRay
	// takes several switches from its environment, e.g.
	// ENABLE_INIT_CONTAINER_INJECTION=false (no wait-gcs-ready init container
	// in worker pods) or RAYCLUSTER_DEFAULT_REQUEUE_SECONDS. ENABLE_WEBHOOKS
	// is refused: the webhook server would listen on all interfaces and the
	// harness registers no webhook for it.
	Env []string
}

// RayClusterResource is KubeRay's ray.io/v1 RayClusters (namespaced).
func RayClusterResource() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: "ray.io", Version: "v1", Resource: "rayclusters"}
}

// RayJobResource is KubeRay's ray.io/v1 RayJobs (namespaced).
func RayJobResource() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: "ray.io", Version: "v1", Resource: "rayjobs"}
}

// KubeRayRunning reports whether the cluster started the KubeRay operator and
// it is still running. Its log is the Process named "kuberay-operator"
// (Processes).
func (c *Cluster) KubeRayRunning() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.kuberay != nil && !c.kuberay.proc.exited()
}

// startKubeRay installs KubeRay's CRDs, starts the operator and waits for its
// /readyz.
func (c *Cluster) startKubeRay(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	began := time.Now()
	env, err := kubeRayEnv(*c.opts.KubeRay)
	if err != nil {
		return err
	}
	if err := c.applyCRDs(ctx, filepath.Join(c.binDir, "kuberay-crds")); err != nil {
		return err
	}
	comp := component{
		name:  kuberayOperator,
		ports: 1, // health probes
		env:   env,
		args: func(ports []int) ([]string, error) {
			return []string{
				// controller-runtime's flag (sigs.k8s.io/controller-runtime/pkg/client/config).
				"--kubeconfig=" + c.componentKubeconfig(kuberayOperator),
				"--health-probe-bind-address=127.0.0.1:" + strconv.Itoa(ports[0]),
				// "0" turns controller-runtime's metrics server off (KubeRay's default is :8080).
				"--metrics-addr=0",
				// On by default.
				"--enable-leader-election=false",
				"--log-stdout-encoder=console",
			}, nil
		},
		// KubeRay's /readyz is a ping: it answers once the manager serves its
		// probes, a moment before its controllers' caches have synced. What is
		// created meanwhile is reconciled once they have (their first list).
		ready: func(ctx context.Context, ports []int) error {
			return probeHTTP(ctx, http.DefaultClient, fmt.Sprintf("http://127.0.0.1:%d/readyz", ports[0]), nil)
		},
	}
	ports, proc, err := c.startComponent(ctx, comp)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.kuberay = &running{comp: comp, ports: ports, proc: proc}
	c.mu.Unlock()
	logger.V(2).Info("KubeRay ready", "duration", time.Since(began).Round(time.Millisecond))
	return nil
}

// kubeRayEnv checks and returns KubeRayOptions.Env.
func kubeRayEnv(opts KubeRayOptions) ([]string, error) {
	for _, kv := range opts.Env {
		name, _, ok := strings.Cut(kv, "=")
		switch {
		case !ok || name == "":
			return nil, fmt.Errorf("KubeRayOptions.Env: %q is not NAME=value", kv)
		case name == "ENABLE_WEBHOOKS":
			return nil, fmt.Errorf("KubeRayOptions.Env: %s is not supported (the webhook server would listen on all interfaces, unregistered)", name)
		case name == "HOME":
			return nil, fmt.Errorf("KubeRayOptions.Env: HOME is the cluster's")
		}
	}
	return opts.Env, nil
}
