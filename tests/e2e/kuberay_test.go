package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/tests/cluster"
)

// rayClusters is KubeRay's RayCluster resource.
var rayClusters = schema.GroupVersionResource{Group: "ray.io", Version: "v1", Resource: "rayclusters"}

// rayClusterYAML is a RayCluster whose head and workers are one gpufrac
// gang of 1 + minWorkers (the label and annotation on both groups'
// templates), each worker asking for half a GPU through gpufrac-scheduler
// (Ray sees one GPU in each: rayStartParams num-gpus). Ray's autoscaler
// changes the worker group's replicas between minReplicas and maxReplicas.
func rayClusterYAML(name, queue string, minWorkers int) string {
	return fmt.Sprintf(`
apiVersion: ray.io/v1
kind: RayCluster
metadata: {name: %[1]s, namespace: default}
spec:`+rayClusterSpec(name, queue, minWorkers, "  "), name)
}

// rayClusterSpec is the spec of rayClusterYAML, each line after the first
// indented by indent.
func rayClusterSpec(name, queue string, minWorkers int, indent string) string {
	meta := fmt.Sprintf(`
    metadata:
      labels: {%s: %s, %s: %s}
      annotations: {%s: "%d"}`, api.LabelQueue, queue, api.LabelPodGroup, name, api.AnnotationMinMember, 1+minWorkers)
	spec := fmt.Sprintf(`
rayVersion: "2.41.0"
headGroupSpec:
  rayStartParams: {}
  template:%[2]s
    spec:
      schedulerName: %[3]s
      containers:
      - name: ray-head
        image: rayproject/ray:2.41.0
        resources:
          requests: {cpu: 500m, memory: 1Gi}
          limits: {cpu: 500m, memory: 1Gi}
workerGroupSpecs:
- groupName: gpu
  replicas: %[4]d
  minReplicas: %[4]d
  maxReplicas: 8
  rayStartParams: {num-gpus: "1"}
  template:%[2]s
    spec:
      schedulerName: %[3]s
      containers:
      - name: ray-worker
        image: rayproject/ray:2.41.0
        resources:
          requests: {cpu: 500m, memory: 1Gi}
          limits: {cpu: 500m, memory: 1Gi, %[5]s: "50"}`, name, meta, api.SchedulerName, minWorkers, api.ResourceFraction)
	return strings.ReplaceAll(spec, "\n", "\n"+indent) + "\n"
}

// rayPods lists a RayCluster's pods of one node type (head or worker).
func rayPods(ctx context.Context, c *cluster.Cluster, name, nodeType string) ([]corev1.Pod, error) {
	l, err := c.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "ray.io/cluster=" + name + ",ray.io/node-type=" + nodeType})
	if err != nil {
		return nil, err
	}
	var live []corev1.Pod
	for _, p := range l.Items {
		if p.DeletionTimestamp == nil {
			live = append(live, p)
		}
	}
	sort.Slice(live, func(i, j int) bool { return live[i].Name < live[j].Name })
	return live, nil
}

// scaleRayWorkers sets the worker group's replicas, and the workers to
// delete, as Ray's autoscaler does.
func scaleRayWorkers(t *testing.T, c *cluster.Cluster, name string, replicas int, remove []string) {
	t.Helper()
	group := map[string]any{"groupName": "gpu", "replicas": replicas, "minReplicas": 2, "maxReplicas": 8,
		"rayStartParams": map[string]any{"num-gpus": "1"}}
	if remove != nil {
		group["scaleStrategy"] = map[string]any{"workersToDelete": remove}
	}
	// The whole group, as the autoscaler writes it (a merge patch replaces lists).
	obj, err := c.Dynamic.Resource(rayClusters).Namespace("default").Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	groups, _, _ := unstructuredSlice(obj.Object, "spec", "workerGroupSpecs")
	if len(groups) != 1 {
		t.Fatalf("RayCluster %s has %d worker groups, want 1", name, len(groups))
	}
	g := groups[0].(map[string]any)
	for k, v := range group {
		g[k] = v
	}
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"workerGroupSpecs": groups}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Dynamic.Resource(rayClusters).Namespace("default").Patch(t.Context(), name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("scaling RayCluster %s to %d workers: %v", name, replicas, err)
	}
}

// unstructuredSlice reads a list field.
func unstructuredSlice(obj map[string]any, fields ...string) ([]any, bool, error) {
	var cur any = obj
	for _, f := range fields {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false, nil
		}
		cur = m[f]
	}
	s, ok := cur.([]any)
	return s, ok, nil
}

// waitRay waits until the RayCluster has its head and want workers, all
// Running, and returns the workers.
func waitRay(t *testing.T, c *cluster.Cluster, name string, want int, limit time.Duration) []corev1.Pod {
	t.Helper()
	var workers []corev1.Pod
	waitFor(t, limit, fmt.Sprintf("RayCluster %s: the head and %d workers running", name, want), func(ctx context.Context) (bool, error) {
		head, err := rayPods(ctx, c, name, "head")
		if err != nil || len(head) != 1 || head[0].Status.Phase != corev1.PodRunning {
			return false, nil
		}
		workers, err = rayPods(ctx, c, name, "worker")
		if err != nil || len(workers) != want {
			return false, nil
		}
		for _, w := range workers {
			if w.Status.Phase != corev1.PodRunning {
				return false, nil
			}
		}
		return true, nil
	})
	return workers
}

// TestRayClusterWithFractionalWorkers (issue 30): KubeRay's operator makes
// a RayCluster's pods; gpufrac places the head and the minimum workers as
// one gang, each worker on half a GPU. Scaled up as Ray's autoscaler does,
// the new workers are placed as fractions, and Karpenter buys a node when
// they do not fit; scaled down, the removed workers give their share back
// (the queue's allocation falls by theirs) and new ones are placed again.
func TestRayClusterWithFractionalWorkers(t *testing.T) {
	t.Parallel()
	types := cluster.DefaultInstanceTypes()
	c := startCluster(t, cluster.Options{
		Karpenter:  &cluster.KarpenterOptions{InstanceTypes: types, NodePools: cluster.DefaultNodePools(types)},
		NodeAgents: &cluster.NodeAgentOptions{StopGracePeriod: 5 * time.Second},
		KubeRay:    &cluster.KubeRayOptions{},
	})
	buildBinary(t, "gpufrac-coordinator")
	applyYAML(t, c, queuesYAML(map[string]string{"ray": "8"}))
	startCoordinator(t, c, "c1", "--leader-elect=false")

	applyYAML(t, c, []byte(rayClusterYAML("rc", "ray", 2)))
	workers := waitRay(t, c, "rc", 2, 4*time.Minute)
	head, err := rayPods(t.Context(), c, "rc", "head")
	if err != nil {
		t.Fatal(err)
	}
	// One gang, one pool; each worker on half a GPU.
	pools := map[string]bool{}
	for _, p := range append(workers, head...) {
		if g := p.Annotations[api.AnnotationAdmittedGang]; g != "rc" {
			t.Errorf("%s admitted in gang %q, want rc", p.Name, g)
		}
		n, err := c.Client.CoreV1().Nodes().Get(t.Context(), p.Spec.NodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pools[n.Labels["karpenter.sh/nodepool"]] = true
	}
	if len(pools) != 1 {
		t.Errorf("the gang's pods are in node pools %v, want one", pools)
	}
	for _, w := range workers {
		if w.Annotations[api.AnnotationGPU] == "" {
			t.Errorf("worker %s bound without a GPU of its own choice (%s): want a fraction", w.Name, api.AnnotationGPU)
		}
	}
	claims := nodeClaims(t, c)
	t.Logf("RayCluster rc: head and 2 workers running on %d NodeClaims", claims)

	// The autoscaler adds four workers: 3 GPUs of fractions in all. On the
	// nodes bought for the first two there is no room for all (the smallest
	// node that holds a gang of half GPUs has one GPU): Karpenter buys more.
	scaleRayWorkers(t, c, "rc", 6, nil)
	workers = waitRay(t, c, "rc", 6, 4*time.Minute)
	grown := nodeClaims(t, c)
	if grown <= claims {
		t.Errorf("%d NodeClaims after the scale-up, %d before: want Karpenter to have bought room", grown, claims)
	}
	gpus := map[string]int{}
	for _, w := range workers {
		gpus[w.Annotations[api.AnnotationGPU]]++
	}
	for gpu, n := range gpus {
		if gpu == "" || n > 2 {
			t.Errorf("%d workers of half a GPU on GPU %q", n, gpu)
		}
	}

	// The autoscaler removes two workers of one GPU: their share comes back.
	var freed []string
	freedGPU := ""
	for gpu, n := range gpus {
		if n == 2 {
			freedGPU = gpu
			break
		}
	}
	for _, w := range workers {
		if w.Annotations[api.AnnotationGPU] == freedGPU {
			freed = append(freed, w.Name)
		}
	}
	scaleRayWorkers(t, c, "rc", 4, freed)
	waitFor(t, 2*time.Minute, fmt.Sprintf("workers %v gone", freed), func(ctx context.Context) (bool, error) {
		for _, n := range freed {
			if _, err := c.Client.CoreV1().Pods("default").Get(ctx, n, metav1.GetOptions{}); err == nil {
				return false, nil
			}
		}
		return true, nil
	})
	// The queue's books: 4 workers of half a GPU (the head asks none).
	waitFor(t, time.Minute, "queue ray charged 2 GPUs for 4 workers", func(ctx context.Context) (bool, error) {
		return queueGPU(ctx, c, "ray") == 2000, nil
	})
	scaleRayWorkers(t, c, "rc", 6, []string{})
	waitRay(t, c, "rc", 6, 3*time.Minute)
	waitFor(t, time.Minute, "queue ray charged 3 GPUs for 6 workers", func(ctx context.Context) (bool, error) {
		return queueGPU(ctx, c, "ray") == 3000, nil
	})
	t.Logf("RayCluster rc: scaled 2 -> 6 -> 4 -> 6 workers; NodeClaims %d -> %d -> %d", claims, grown, nodeClaims(t, c))

	// A RayJob: KubeRay makes its RayCluster from rayClusterSpec, and
	// gpufrac places that cluster's head and workers as one gang of
	// fractions. (Its submitter Job and the Ray dashboard are not
	// exercised: kwok runs no Ray.)
	applyYAML(t, c, []byte(`
apiVersion: ray.io/v1
kind: RayJob
metadata: {name: rj, namespace: default}
spec:
  entrypoint: python -c "import ray; ray.init()"
  rayClusterSpec:`+rayClusterSpec("rj", "ray", 2, "    ")))
	var rjCluster string
	waitFor(t, time.Minute, "RayJob rj's RayCluster", func(ctx context.Context) (bool, error) {
		u, err := c.Dynamic.Resource(schema.GroupVersionResource{Group: "ray.io", Version: "v1", Resource: "rayjobs"}).Namespace("default").Get(ctx, "rj", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		name, _, _ := unstructuredString(u.Object, "status", "rayClusterName")
		rjCluster = name
		return name != "", nil
	})
	rjWorkers := waitRay(t, c, rjCluster, 2, 4*time.Minute)
	rjHead, err := rayPods(t.Context(), c, rjCluster, "head")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range append(rjWorkers, rjHead...) {
		if g := p.Annotations[api.AnnotationAdmittedGang]; g != "rj" {
			t.Errorf("RayJob pod %s admitted in gang %q, want rj", p.Name, g)
		}
	}
	for _, w := range rjWorkers {
		if w.Annotations[api.AnnotationGPU] == "" {
			t.Errorf("RayJob worker %s bound without a GPU of its own (%s): want a fraction", w.Name, api.AnnotationGPU)
		}
	}
	checkInvariants(t, c)
}

// unstructuredString reads a string field.
func unstructuredString(obj map[string]any, fields ...string) (string, bool, error) {
	var cur any = obj
	for _, f := range fields {
		m, ok := cur.(map[string]any)
		if !ok {
			return "", false, nil
		}
		cur = m[f]
	}
	s, ok := cur.(string)
	return s, ok, nil
}
