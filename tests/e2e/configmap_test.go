package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/tests/cluster"
)

// editNodeConfig replaces config.yaml of the chart's ConfigMap
// gpufrac-node-config, as `kubectl -n gpufrac-system edit cm
// gpufrac-node-config` does, and returns when the API server has it.
func editNodeConfig(t *testing.T, c *cluster.Cluster, content string) {
	t.Helper()
	cms := c.Client.CoreV1().ConfigMaps(c.Installed().Namespace)
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := cms.Get(t.Context(), cluster.NodeConfigMap, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cm.Data["config.yaml"] = content
		_, err = cms.Update(t.Context(), cm, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatalf("editing ConfigMap %s: %v", cluster.NodeConfigMap, err)
	}
}

// gpuView runs `kubectl gpufrac` against the cluster.
func gpuView(t *testing.T, c *cluster.Cluster, bin string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--kubeconfig="+c.KubeconfigPath).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl gpufrac: %v\n%s", err, out)
	}
	return string(out)
}

// TestAdminRepartitionsANodeThroughTheConfigMap: the node agents read the
// chart's ConfigMap as the DaemonSet mounts it, and an admin's edit of it
// repartitions the nodes it selects while the cluster runs: one GPU of one
// node to MIG (the other node unchanged), back to fractions while fractions
// run on the node's other GPUs (they keep running), and a bad edit that
// every node refuses, with an event, keeping its last good config.
func TestAdminRepartitionsANodeThroughTheConfigMap(t *testing.T) {
	t.Parallel()
	c := startCluster(t, cluster.Options{})
	buildBinary(t, "gpufrac-coordinator")
	view := buildBinary(t, "kubectl-gpufrac")
	addGPUNodes(t, c, "gpu", "", 2)
	applyYAML(t, c, queuesYAML(map[string]string{"q": "8"}))
	startCoordinator(t, c, "c1", "--leader-elect=false")
	waitShape(t, c, "gpu-0", 30*time.Second, fractionShape())

	// 1. What the ConfigMap says is what every agent reads, through the
	// kubelet's ..data link.
	cm, err := c.Client.CoreV1().ConfigMaps(c.Installed().Namespace).Get(t.Context(), cluster.NodeConfigMap, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	base := cm.Data["config.yaml"]
	for _, a := range c.NodeAgents() {
		b, err := os.ReadFile(a.ConfigPath)
		if err != nil || string(b) != base {
			t.Fatalf("%s reads %q (%v), the ConfigMap says %q", a.Node, b, err, base)
		}
		if link, err := os.Readlink(a.ConfigPath); err != nil || link != "..data/config.yaml" {
			t.Errorf("%s's config is %q (%v), want the mount's link ..data/config.yaml", a.Node, link, err)
		}
	}

	// 2. GPU 3 of gpu-0 in MIG: seven 1g.10gb devices, 700 fraction units.
	migOnGPU3 := base + `groups:
  - nodeSelector: {kubernetes.io/hostname: gpu-0}
    gpus: [{indices: "3", mode: mig, migLayout: all-1g.10gb}]
`
	edited := time.Now()
	editNodeConfig(t, c, migOnGPU3)
	waitShape(t, c, "gpu-0", 30*time.Second, nodeShape{
		Allocatable: map[string]int64{api.ResourceGPU: 7, api.ResourceFraction: 700, mig1g: 7},
		Modes:       map[string]int{"fraction": 7, "mig": 1}, MIGDevices: map[string]int{"1g.10gb": 7}, Replicas: map[int]int{},
	})
	t.Logf("gpu-0 serves GPU 3 as MIG devices %s after the edit", time.Since(edited).Round(100*time.Millisecond))
	// The edit reached every agent (a new config in force), and changed
	// nothing on the node its group does not select.
	for _, a := range c.NodeAgents() {
		waitFor(t, 15*time.Second, a.Node+" to take the edit", func(ctx context.Context) (bool, error) {
			body, err := a.Metrics(ctx)
			return err == nil && containsLine(body, `gpufrac_config_reloads_total{result="success"} 2`), nil
		})
	}
	waitShape(t, c, "gpu-1", 5*time.Second, fractionShape())
	out := gpuView(t, c, view)
	t.Logf("kubectl gpufrac after the edit:\n%s", out)
	for _, want := range []string{"nvidia.com/gpu 7, gpufrac.io/gpu-fraction 700, nvidia.com/mig-1g.10gb 7", "mig 7× 1g.10gb"} {
		if !strings.Contains(out, want) {
			t.Errorf("kubectl gpufrac lacks %q:\n%s", want, out)
		}
	}

	// 3. Fractions on gpu-0's other GPUs, then back to fractions everywhere:
	// they keep running on the GPUs they had.
	var names []string
	for i := range 4 {
		n := fmt.Sprintf("frac-%d", i)
		names = append(names, n)
		create(t, c, pod(n, "q").Fraction(50).NodeSelector(corev1.LabelHostname, "gpu-0").Obj())
	}
	before := running(t, c, 90*time.Second, names...)
	gpu3 := ""
	n0, err := c.Client.CoreV1().Nodes().Get(t.Context(), "gpu-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	inv, _ := api.DecodeInventory(n0.Annotations[api.AnnotationGPUInventory])
	for _, g := range inv {
		if g.Index == 3 {
			gpu3 = g.UUID
		}
	}
	held := map[string]string{}
	waitFor(t, 30*time.Second, "the fractions' GPUs written back", func(ctx context.Context) (bool, error) {
		for _, n := range names {
			p, err := c.Client.CoreV1().Pods("default").Get(ctx, n, metav1.GetOptions{})
			if err != nil || p.Annotations[api.AnnotationAllocatedGPU] == "" {
				return false, nil
			}
			held[n] = p.Annotations[api.AnnotationAllocatedGPU]
		}
		return true, nil
	})
	for n, g := range held {
		if g == gpu3 {
			t.Errorf("%s got GPU 3 (%s), which serves MIG devices", n, g)
		}
	}
	editNodeConfig(t, c, base)
	waitShape(t, c, "gpu-0", 30*time.Second, fractionShape())
	after := running(t, c, 5*time.Second, names...)
	for _, n := range names {
		if before[n].UID != after[n].UID || after[n].Annotations[api.AnnotationAllocatedGPU] != held[n] {
			t.Errorf("%s changed across the repartitioning: uid %s -> %s, GPU %s -> %s", n,
				before[n].UID, after[n].UID, held[n], after[n].Annotations[api.AnnotationAllocatedGPU])
		}
	}
	if out := gpuView(t, c, view); strings.Contains(out, "nvidia.com/mig-") {
		t.Errorf("kubectl gpufrac still shows MIG devices after the edit back:\n%s", out)
	}

	// 4. A bad edit: every node refuses it with a GPUConfigRejected event
	// naming the mistake, and keeps the config in force.
	editNodeConfig(t, c, migOnGPU3+"    mode: halves\n")
	for _, node := range []string{"gpu-0", "gpu-1"} {
		waitFor(t, 30*time.Second, node+"'s GPUConfigRejected event", func(ctx context.Context) (bool, error) {
			evs, err := c.Client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{
				FieldSelector: "involvedObject.kind=Node,involvedObject.name=" + node + ",reason=GPUConfigRejected"})
			if err != nil {
				return false, nil
			}
			for _, ev := range evs.Items {
				if ev.Type == corev1.EventTypeWarning && strings.Contains(ev.Message, "halves") && strings.Contains(ev.Message, "kept its last good config") {
					return true, nil
				}
			}
			return false, nil
		})
	}
	for _, a := range c.NodeAgents() {
		body, err := a.Metrics(t.Context())
		if err != nil || !containsLine(body, `gpufrac_config_reloads_total{result="rejected"} 1`) {
			t.Errorf("%s does not count the rejection (%v)", a.Node, err)
		}
	}
	for _, node := range []string{"gpu-0", "gpu-1"} {
		n, err := c.Client.CoreV1().Nodes().Get(t.Context(), node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(fractionShape(), shapeOf(n)); diff != "" {
			t.Errorf("%s after the bad edit (-last good +got):\n%s", node, diff)
		}
	}
	running(t, c, 5*time.Second, names...)
}
