package e2e

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpufrac/gpufrac/tests/cluster"
)

// Issue 29: a node whose NodeClaim Karpenter marked Drifted takes no new
// fraction (--avoid-drifted-nodes, on by default): the second fraction goes
// to a node Karpenter makes for it, not to the drifted node's shared GPU;
// the fraction already there keeps running. Once it ends, its reservation
// goes and nothing keeps Karpenter from replacing the node.
func TestDriftedNodeTakesNoNewFractions(t *testing.T) {
	t.Parallel()
	c := karpenterCluster(t)
	applyYAML(t, c, queuesYAML(map[string]string{"team-a": "8"}))
	startCoordinator(t, c, "c1", "--leader-elect=false")

	create(t, c, pod("first", "team-a").Fraction(30).Obj())
	nodeA := running(t, c, 3*time.Minute, "first")["first"].Spec.NodeName

	// Drift the pool: change its template. The reservation on node A
	// (do-not-disrupt) keeps Karpenter from replacing it.
	patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"template": map[string]any{"metadata": map[string]any{"labels": map[string]string{"e2e-drift": "1"}}}}})
	if _, err := c.Dynamic.Resource(cluster.NodePoolResource()).Patch(t.Context(), "gpu", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, "node A's NodeClaim to be Drifted", func(ctx context.Context) (bool, error) {
		return nodeClaimDrifted(ctx, c, nodeA)
	})

	create(t, c, pod("second", "team-a").Fraction(30).Obj())
	second := running(t, c, 4*time.Minute, "second")["second"]
	if second.Spec.NodeName == nodeA {
		t.Fatalf("the second fraction was placed on the drifted node %s", nodeA)
	}
	p, err := c.Client.CoreV1().Pods("default").Get(t.Context(), "first", metav1.GetOptions{})
	if err != nil || p.Spec.NodeName != nodeA || p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
		t.Fatalf("the fraction on the drifted node was disturbed: %v", err)
	}

	deletePods(t, c, "first")
	waitFor(t, 4*time.Minute, "the drifted node to be replaced", func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().Nodes().Get(ctx, nodeA, metav1.GetOptions{})
		return err != nil, nil
	})
	p, err = c.Client.CoreV1().Pods("default").Get(t.Context(), "second", metav1.GetOptions{})
	if err != nil || p.Status.Phase != corev1.PodRunning {
		t.Fatalf("the second fraction did not keep running: %v", err)
	}
}

// nodeClaimDrifted tells whether a NodeClaim of node has Drifted=True.
func nodeClaimDrifted(ctx context.Context, c *cluster.Cluster, node string) (bool, error) {
	l, err := c.Dynamic.Resource(cluster.NodeClaimResource()).List(ctx, metav1.ListOptions{})
	if err != nil {
		return false, nil
	}
	for _, nc := range l.Items {
		if n, _, _ := unstructured.NestedString(nc.Object, "status", "nodeName"); n != node {
			continue
		}
		conds, _, _ := unstructured.NestedSlice(nc.Object, "status", "conditions")
		for _, cd := range conds {
			if m, ok := cd.(map[string]any); ok && m["type"] == "Drifted" && m["status"] == "True" {
				return true, nil
			}
		}
	}
	return false, nil
}
