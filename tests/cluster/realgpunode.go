package cluster

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/tests/images"
	"github.com/gpufrac/gpufrac/tests/images/report"
)

// GPUNodeOptions say what a real GPU node is.
type GPUNodeOptions struct {
	// Name is the node's name; empty lets StartRealNode choose.
	Name string
	// GPUs is the number of mock H100s; zero means 2.
	GPUs int
	// Config is gpufrac-node's config (the chart's node.config, the
	// gpufrac-node-config ConfigMap); empty keeps the chart's.
	Config string
	// Labels are more node labels (e.g. one a config group selects).
	Labels map[string]string
	// Taints are registered with the node (the kubelet's
	// --register-with-taints); gpufrac-node's DaemonSet tolerates them,
	// and so do the coordinator's reservations (they tolerate every taint).
	Taints []corev1.Taint
	// ImageDir is where the images are built; empty is a directory of the node's.
	ImageDir string
}

// GPUNode is a real node (kubelet, containerd, runc, CNI) with mock GPUs,
// running gpufrac-node as the chart's DaemonSet pod from its image.
//
// What is real: the kubelet's device manager, DRA manager, PodResources,
// checkpoints and admission; containerd's CRI, CDI injection and image
// store; runc, cgroups and namespaces; the chart's DaemonSet with its
// identity, mounts and capabilities; gpufrac-node's binary in its image.
// What is mock: NVML (--nvml=mock:dgxh100, its state in MockState), the
// driver's device nodes and libraries (Driver), the GPUs themselves.
type GPUNode struct {
	*RealNode
	Driver *MockDriver
	// MockState is mock NVML's state directory on the host (processes,
	// memory, Xids), mounted into the gpufrac-node pod.
	MockState string
	// Images are the images the node was given.
	Images []images.Built
}

// realNodeAgentLabel marks the pods of the real nodes' gpufrac-node DaemonSet.
const realNodeAgentLabel = "tests.gpufrac.io/real-node-agent"

// mockStateMount is where the gpufrac-node pod sees MockState.
const mockStateMount = "/var/lib/gpufrac-mock"

// StartGPUNode starts a real node with mock GPUs on the cluster: it builds
// the images (the chart's gpufrac-node and gpufrac-coordinator at its
// appVersion from bin/, the pause and workload images), imports them, lays
// out the mock driver and the toolkit's CDI spec, applies the chart's
// DaemonSet (with the test bed's values plus mock NVML) and waits until
// gpufrac-node's pod is Ready and the node publishes its GPUs.
//
// One GPU node per cluster: the DaemonSet it applies carries the node's mock
// state directory, GPU count and taints' tolerations, so a second would roll
// the first node's gpufrac-node onto the second's mock NVML state.
func (c *Cluster) StartGPUNode(ctx context.Context, o GPUNodeOptions) (*GPUNode, error) {
	logger := klog.FromContext(ctx)
	c.mu.Lock()
	first := c.gpuNode
	if first == "" {
		c.gpuNode = "(starting)"
		if o.Name != "" {
			c.gpuNode = o.Name
		}
	}
	c.mu.Unlock()
	if first != "" {
		return nil, fmt.Errorf("starting a GPU node: the cluster has one (%s), and its gpufrac-node DaemonSet is that node's (mock state, GPU count, tolerations)", first)
	}
	if o.GPUs == 0 {
		o.GPUs = 2
	}
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	version, err := ChartAppVersion()
	if err != nil {
		return nil, err
	}
	labels := map[string]string{
		api.LabelGPUProduct:      H100Product,
		"nvidia.com/gpu.present": "true",
	}
	maps.Copy(labels, o.Labels)
	var kubeletArgs []string
	if len(o.Taints) > 0 {
		var ts []string
		for _, t := range o.Taints {
			ts = append(ts, t.Key+"="+t.Value+":"+string(t.Effect))
		}
		kubeletArgs = append(kubeletArgs, "--register-with-taints="+strings.Join(ts, ","))
	}
	n, err := c.StartRealNode(ctx, RealNodeOptions{Name: o.Name, SandboxImage: images.PauseRef, Labels: labels, KubeletArgs: kubeletArgs})
	if err != nil {
		return nil, err
	}
	g := &GPUNode{RealNode: n, MockState: filepath.Join(n.Dir(), "mock-nvml")}
	fail := func(err error) (*GPUNode, error) {
		return nil, fmt.Errorf("real GPU node %s (logs in %s): %w", n.Name(), c.LogDir(), err)
	}
	imageDir := o.ImageDir
	if imageDir == "" {
		imageDir = filepath.Join(n.Dir(), "images")
	}
	start := time.Now()
	if g.Images, err = images.Testbed(ctx, root, imageDir, version); err != nil {
		return fail(err)
	}
	for _, b := range g.Images {
		if err := n.ImportImage(ctx, b.Tar); err != nil {
			return fail(err)
		}
	}
	logger.V(2).Info("Images loaded", "node", n.Name(), "count", len(g.Images), "duration", time.Since(start).Round(time.Millisecond))
	if g.Driver, err = NewMockDriver(filepath.Join(n.Dir(), "driver"), n.Name(), "dgxh100", o.GPUs); err != nil {
		return fail(err)
	}
	etcCDI, _ := n.CDIDirs()
	if _, err := g.Driver.WriteSpec(etcCDI); err != nil {
		return fail(err)
	}
	// Read-write: the mock renames a malformed Xid file to <name>.bad.
	if err := os.MkdirAll(filepath.Join(g.MockState, "xid"), 0o755); err != nil {
		return fail(err)
	}
	if err := c.applyNodeDaemonSet(ctx, g, o); err != nil {
		return fail(err)
	}
	return g, nil
}

// applyNodeDaemonSet renders the chart with the test bed's values and the
// node's (mock NVML through a flag, its state through extraVolumes, the
// config) and applies its gpufrac-node DaemonSet and config ConfigMap, then
// waits for the pod and the GPUs.
func (c *Cluster) applyNodeDaemonSet(ctx context.Context, g *GPUNode, o GPUNodeOptions) error {
	node := map[string]any{
		"extraArgs": []string{
			"--nvml=mock:dgxh100", "--mock-gpus=" + strconv.Itoa(o.GPUs), "--mock-state-dir=" + mockStateMount,
		},
		"extraVolumes": []any{map[string]any{"name": "mock-nvml", "hostPath": map[string]any{
			"path": g.MockState, "type": "Directory"}}},
		"extraVolumeMounts": []any{map[string]any{"name": "mock-nvml", "mountPath": mockStateMount}},
	}
	if len(o.Taints) > 0 {
		// The chart's own toleration (lists replace, not merge) and the node's taints.
		tols := []any{map[string]any{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}}
		for _, t := range o.Taints {
			tols = append(tols, map[string]any{"key": t.Key, "operator": "Exists", "effect": string(t.Effect)})
		}
		node["tolerations"] = tols
	}
	if o.Config != "" {
		var cfg map[string]any
		if err := yaml.Unmarshal([]byte(o.Config), &cfg); err != nil {
			return fmt.Errorf("node config: %w", err)
		}
		node["config"] = cfg
	}
	raw, err := yaml.Marshal(map[string]any{"node": node})
	if err != nil {
		return err
	}
	vf := filepath.Join(g.Dir(), "values.yaml")
	if err := os.WriteFile(vf, raw, 0o644); err != nil {
		return err
	}
	// The values the cluster installed the chart with, then the node's.
	chart := c.opts.Chart
	if len(chart.ValuesFiles) == 0 {
		testbed, err := TestbedValues()
		if err != nil {
			return err
		}
		chart.ValuesFiles = []string{testbed}
	}
	chart.ValuesFiles = append(slices.Clone(chart.ValuesFiles), vf)
	objs, err := RenderChart(ctx, chart)
	if err != nil {
		return err
	}
	ds, cm := objs.Find("DaemonSet", "gpufrac-node"), objs.Find("ConfigMap", "gpufrac-node-config")
	if ds == nil || cm == nil {
		return fmt.Errorf("the chart rendered no gpufrac-node DaemonSet or config ConfigMap")
	}
	// The kwok nodes' agent identities are pods made from the same template
	// (identity.go) with no controller: a DaemonSet with the chart's selector
	// would adopt them and delete those on nodes it does not select, which
	// invalidates their tokens. One more label in the selector keeps it to
	// its own pods.
	for _, path := range [][]string{{"spec", "selector", "matchLabels"}, {"spec", "template", "metadata", "labels"}} {
		if err := unstructured.SetNestedField(ds.Object, "true", append(path, realNodeAgentLabel)...); err != nil {
			return err
		}
	}
	objs = Objects{ds}
	if o.Config != "" {
		// A config of the node's own replaces the installed one.
		objs = Objects{cm, ds}
	}
	if _, err := NewApplier(c.Client, c.Dynamic).ServerSideApply(ctx, "gpufrac-node on real nodes", objs, ApplyOptions{}); err != nil {
		return err
	}
	name := g.Name()
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := c.Client.CoreV1().Pods(ChartNamespace).List(ctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("spec.nodeName", name).String()})
		if err != nil {
			return false, nil
		}
		for _, p := range pods.Items {
			for _, cond := range p.Status.Conditions {
				if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("gpufrac-node's DaemonSet pod on %s not Ready: %w", name, err)
	}
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		return err == nil && n.Annotations[api.AnnotationGPUInventory] != "", nil
	})
	if err != nil {
		return fmt.Errorf("%s published no GPU inventory: %w", name, err)
	}
	return nil
}

// NodeAgentPod is the gpufrac-node DaemonSet pod on the node.
func (g *GPUNode) NodeAgentPod(ctx context.Context) (*corev1.Pod, error) {
	pods, err := g.c.Client.CoreV1().Pods(ChartNamespace).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", g.Name()).String()})
	if err != nil {
		return nil, err
	}
	for i := range pods.Items {
		if pods.Items[i].DeletionTimestamp == nil {
			return &pods.Items[i], nil
		}
	}
	return nil, fmt.Errorf("no gpufrac-node pod on %s", g.Name())
}

// Report reads the report a container of the workload image (tests/images)
// printed, from its log on the node, waiting up to 30 s for it.
func (g *GPUNode) Report(ctx context.Context, pod *corev1.Pod, container string) (report.Report, error) {
	var rep report.Report
	dir := filepath.Join(g.PodLogDir(), fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, pod.UID), container)
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
		for _, l := range logs {
			raw, err := os.ReadFile(l)
			if err != nil {
				continue
			}
			for line := range strings.Lines(string(raw)) {
				if r, ok := report.FromCRILog(strings.TrimRight(line, "\n"), container); ok {
					rep = r
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err != nil {
		return rep, fmt.Errorf("the report of %s/%s container %s: %w", pod.Namespace, pod.Name, container, err)
	}
	return rep, nil
}
