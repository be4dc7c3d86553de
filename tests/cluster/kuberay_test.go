package cluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/tests/cluster"
)

// TestKubeRay: a RayCluster with a head group and one worker group (replicas
// 2, min 2, max 4), its pods placed by the default scheduler on a kwok node.
// The operator creates 1 head and 2 worker pods, and the RayCluster reaches
// state ready (kwok runs them and marks them Ready). Raising the group's
// replicas to 3, as Ray's autoscaler does, adds a third worker; lowering it
// to 2 with that worker named in scaleStrategy.workersToDelete deletes
// exactly that pod, without the autoscaler. A second RayCluster whose group
// templates name gpufrac's scheduler and carry a gang label and annotation
// gets pods that keep all three (they stay Pending: no coordinator runs).
func TestKubeRay(t *testing.T) {
	clusterTest(t)
	c := cluster.StartForTest(t, cluster.Options{
		KubeRay: &cluster.KubeRayOptions{},
		// KubeRay's CRDs and its operator's start come on top of the control plane's.
		StartTimeout: 3 * time.Minute,
	})
	ctx := t.Context()
	if !c.KubeRayRunning() {
		t.Fatal("KubeRayRunning() = false after Start")
	}
	checkLoopbackOnly(t, c, "kuberay-operator")

	const node = "kuberay-node"
	if _, err := c.AddNode(ctx, cluster.NodeSpec{Name: node}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "node ready", nodeReady(c, node))
	const ns = "kuberay-test"
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// Both RayClusters at once: the second only checks what the pods keep.
	const name, group = "ray", "workers"
	rcs := c.Dynamic.Resource(cluster.RayClusterResource()).Namespace(ns)
	if _, err := rcs.Create(ctx, rayClusterObject(t, ns, name, group, 2, rayTemplate{}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	gang := rayTemplate{
		schedulerName: api.SchedulerName,
		labels:        map[string]string{api.LabelPodGroup: "gang"},
		annotations:   map[string]string{api.AnnotationMinMember: "2"},
	}
	if _, err := rcs.Create(ctx, rayClusterObject(t, ns, "gang", group, 1, gang), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// 1 head and 2 workers, Running on the node; the RayCluster ready.
	var workers []string
	waitFor(t, 60*time.Second, "1 head and 2 worker pods running", func(ctx context.Context) (bool, error) {
		head, w, err := rayPods(ctx, c, ns, name, group)
		if err != nil {
			return false, err
		}
		if len(head) > 1 || len(w) > 2 {
			return false, fmt.Errorf("%d head and %d worker pods, want 1 and 2", len(head), len(w))
		}
		workers = podNames(w)
		return len(head) == 1 && len(w) == 2 && allRunning(append(head, w...)), nil
	})
	waitFor(t, 30*time.Second, "the RayCluster ready", rayClusterReady(c, ns, name, 2))

	// Scale up, as the autoscaler does: replicas 3.
	patchRayCluster(t, c, ns, name, group, map[string]any{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 3})
	var third string
	waitFor(t, 60*time.Second, "a 3rd worker pod running", func(ctx context.Context) (bool, error) {
		_, w, err := rayPods(ctx, c, ns, name, group)
		if err != nil {
			return false, err
		}
		if len(w) > 3 {
			return false, fmt.Errorf("%d worker pods, want 3: %v", len(w), podNames(w))
		}
		for _, p := range podNames(w) {
			if !slices.Contains(workers, p) {
				third = p
			}
		}
		return len(w) == 3 && allRunning(w), nil
	})
	waitFor(t, 30*time.Second, "the RayCluster ready with 3 workers", rayClusterReady(c, ns, name, 3))
	for _, w := range workers {
		if _, err := c.Client.CoreV1().Pods(ns).Get(ctx, w, metav1.GetOptions{}); err != nil {
			t.Fatalf("worker %s after the scale-up: %v", w, err)
		}
	}

	// Scale down, as the autoscaler does: replicas 2 and the pod to go named.
	// Without in-tree autoscaling KubeRay would otherwise delete any surplus
	// pod; here it must be this one.
	victim := workers[0]
	keep := []string{workers[1], third}
	slices.Sort(keep)
	patchRayCluster(t, c, ns, name, group,
		map[string]any{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 2},
		map[string]any{"op": "add", "path": "/spec/workerGroupSpecs/0/scaleStrategy", "value": map[string]any{"workersToDelete": []string{victim}}})
	waitFor(t, 60*time.Second, "worker "+victim+" deleted", func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().Pods(ns).Get(ctx, victim, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
	// The other two stay, and no replacement comes (KubeRay reconciles within
	// a second or two of a change).
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		_, w, err := rayPods(ctx, c, ns, name, group)
		if err != nil {
			t.Fatal(err)
		}
		if got := podNames(w); !slices.Equal(got, keep) {
			t.Fatalf("worker pods after deleting %s: %v, want %v", victim, got, keep)
		}
	}
	waitFor(t, 30*time.Second, "the RayCluster ready with 2 workers", rayClusterReady(c, ns, name, 2))
	// KubeRay deletes the pods named but leaves the list: Ray's autoscaler,
	// which wrote it, clears it.
	if rc, err := rcs.Get(ctx, name, metav1.GetOptions{}); err == nil {
		groups, _, _ := unstructured.NestedSlice(rc.Object, "spec", "workerGroupSpecs")
		if len(groups) > 0 {
			left, _, _ := unstructured.NestedStringSlice(groups[0].(map[string]any), "scaleStrategy", "workersToDelete")
			t.Logf("scaleStrategy.workersToDelete after the scale-down: %v", left)
		}
	}

	// The second RayCluster's pods keep their template's scheduler, label and annotation.
	waitFor(t, 30*time.Second, "the gang RayCluster's head and worker pods", func(ctx context.Context) (bool, error) {
		head, w, err := rayPods(ctx, c, ns, "gang", group)
		if err != nil {
			return false, err
		}
		if len(head) != 1 || len(w) != 1 {
			return false, nil
		}
		for _, p := range append(head, w...) {
			if p.Spec.SchedulerName != api.SchedulerName || p.Labels[api.LabelPodGroup] != "gang" || p.Annotations[api.AnnotationMinMember] != "2" {
				return false, fmt.Errorf("pod %s: schedulerName %q, label %s %q, annotation %s %q: the template's are %q, %q, %q",
					p.Name, p.Spec.SchedulerName, api.LabelPodGroup, p.Labels[api.LabelPodGroup], api.AnnotationMinMember, p.Annotations[api.AnnotationMinMember],
					api.SchedulerName, "gang", "2")
			}
			if p.Spec.NodeName != "" {
				return false, fmt.Errorf("pod %s of %s bound to %s: no such scheduler runs here", p.Name, api.SchedulerName, p.Spec.NodeName)
			}
		}
		for _, ic := range w[0].Spec.InitContainers {
			t.Logf("worker pod %s: init container %s added by KubeRay, requests %v", w[0].Name, ic.Name, ic.Resources.Requests)
		}
		return true, nil
	})
}

// rayTemplate is what the test puts in a RayCluster's group templates.
type rayTemplate struct {
	schedulerName string
	labels        map[string]string
	annotations   map[string]string
}

// rayClusterObject renders a RayCluster with a head group and one worker group
// of the given replicas (minReplicas the same, maxReplicas 4), each pod one
// small Ray container; nothing is pulled on kwok.
func rayClusterObject(t *testing.T, ns, name, group string, replicas int, tmpl rayTemplate) *unstructured.Unstructured {
	t.Helper()
	podTemplate := func(container string) map[string]any {
		spec := map[string]any{
			"containers": []any{map[string]any{
				"name":  container,
				"image": "rayproject/ray:2.41.0",
				"resources": map[string]any{
					"requests": map[string]any{"cpu": "100m", "memory": "256Mi"},
				},
			}},
			"terminationGracePeriodSeconds": 0,
		}
		if tmpl.schedulerName != "" {
			spec["schedulerName"] = tmpl.schedulerName
		}
		meta := map[string]any{}
		if len(tmpl.labels) > 0 {
			meta["labels"] = tmpl.labels
		}
		if len(tmpl.annotations) > 0 {
			meta["annotations"] = tmpl.annotations
		}
		return map[string]any{"metadata": meta, "spec": spec}
	}
	raw, err := json.Marshal(map[string]any{
		"apiVersion": cluster.KubeRayAPIVersion,
		"kind":       "RayCluster",
		"metadata":   map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{
			"headGroupSpec": map[string]any{
				"rayStartParams": map[string]any{},
				"template":       podTemplate("ray-head"),
			},
			"workerGroupSpecs": []any{map[string]any{
				"groupName":      group,
				"replicas":       replicas,
				"minReplicas":    replicas,
				"maxReplicas":    4,
				"rayStartParams": map[string]any{},
				"template":       podTemplate("ray-worker"),
			}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	obj := &unstructured.Unstructured{}
	if err := obj.UnmarshalJSON(raw); err != nil {
		t.Fatal(err)
	}
	return obj
}

// rayPods lists a RayCluster's pods that are not being deleted, by the labels
// KubeRay gives them: its head pods and the pods of the worker group, each
// checked to be controlled by the RayCluster.
func rayPods(ctx context.Context, c *cluster.Cluster, ns, name, group string) (head, workers []corev1.Pod, err error) {
	rc, err := c.Dynamic.Resource(cluster.RayClusterResource()).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, nil, err
	}
	pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: cluster.RayClusterLabel + "=" + name})
	if err != nil {
		return nil, nil, err
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		if ref := metav1.GetControllerOf(&p); ref == nil || ref.UID != types.UID(rc.GetUID()) {
			return nil, nil, fmt.Errorf("pod %s is not controlled by RayCluster %s: %v", p.Name, name, p.OwnerReferences)
		}
		switch typ := p.Labels[cluster.RayNodeTypeLabel]; {
		case typ == "head":
			head = append(head, p)
		case typ == "worker" && p.Labels[cluster.RayNodeGroupLabel] == group:
			workers = append(workers, p)
		default:
			return nil, nil, fmt.Errorf("pod %s: %s %q, %s %q", p.Name, cluster.RayNodeTypeLabel, typ, cluster.RayNodeGroupLabel, p.Labels[cluster.RayNodeGroupLabel])
		}
	}
	return head, workers, nil
}

// allRunning reports whether every pod is Running.
func allRunning(pods []corev1.Pod) bool {
	for _, p := range pods {
		if p.Status.Phase != corev1.PodRunning {
			return false
		}
	}
	return true
}

// podNames returns the pods' names, sorted.
func podNames(pods []corev1.Pod) []string {
	var names []string
	for _, p := range pods {
		names = append(names, p.Name)
	}
	slices.Sort(names)
	return names
}

// rayClusterReady holds once KubeRay reports a RayCluster ready with workers
// worker pods: status.state ready and the conditions RayClusterProvisioned
// and HeadPodReady true (all three stay so once set), and workers desired
// and ready (status.desiredWorkerReplicas, readyWorkerReplicas: worker pods
// Running and Ready, as kwok marks them).
func rayClusterReady(c *cluster.Cluster, ns, name string, workers int64) func(ctx context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		rc, err := c.Dynamic.Resource(cluster.RayClusterResource()).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		state, _, _ := unstructured.NestedString(rc.Object, "status", "state")
		desired, _, _ := unstructured.NestedInt64(rc.Object, "status", "desiredWorkerReplicas")
		ready, _, _ := unstructured.NestedInt64(rc.Object, "status", "readyWorkerReplicas")
		return state == "ready" && cluster.ConditionTrue(rc, "RayClusterProvisioned") && cluster.ConditionTrue(rc, "HeadPodReady") &&
			desired == workers && ready == workers, nil
	}
}

// patchRayCluster applies a JSON patch to a RayCluster, first testing that
// its first worker group is group.
func patchRayCluster(t *testing.T, c *cluster.Cluster, ns, name, group string, ops ...map[string]any) {
	t.Helper()
	patch, err := json.Marshal(append([]map[string]any{{"op": "test", "path": "/spec/workerGroupSpecs/0/groupName", "value": group}}, ops...))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Dynamic.Resource(cluster.RayClusterResource()).Namespace(ns).Patch(t.Context(), name, types.JSONPatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("patching RayCluster %s with %s: %v", name, patch, err)
	}
	t.Logf("patched RayCluster %s: %s", name, patch)
}
