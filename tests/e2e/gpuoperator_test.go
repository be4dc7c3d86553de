package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/tests/cluster"
)

// The labels NVIDIA's GPU operator puts on GPU nodes (gpu-feature-discovery's
// gpu.present, and one nvidia.com/gpu.deploy.<operand> per operand, whose
// DaemonSet selects it), and the names of its objects, as
// docs/install/gpu-operator.md describes them.
const (
	opLabelPresent      = "nvidia.com/gpu.present"
	opLabelDevicePlugin = "nvidia.com/gpu.deploy.device-plugin"
	opLabelMIGManager   = "nvidia.com/gpu.deploy.mig-manager"
	opLabelValidator    = "nvidia.com/gpu.deploy.operator-validator"
	opNamespace         = "gpu-operator"
	opRuntimeClass      = "nvidia"
)

// policyCheckReport is the JSON shape of `kubectl gpufrac policy-check -o
// json` (docs/kubectl-gpufrac.md).
type policyCheckReport struct {
	Checked  int `json:"checked"`
	Findings []struct {
		Namespace, Workload, Policy, Message string
		Denied                               bool
	} `json:"findings"`
	Notes []string `json:"notes"`
}

// runPolicyCheck runs `kubectl gpufrac policy-check -o json` and returns its
// exit status (0: nothing found, 1: findings) and report.
func runPolicyCheck(t *testing.T, c *cluster.Cluster, plugin string) (int, policyCheckReport) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(t.Context(), plugin, "--kubeconfig="+c.KubeconfigPath, "policy-check", "-o", "json")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	code := 0
	if err := cmd.Run(); err != nil {
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			t.Fatalf("kubectl gpufrac policy-check: %v\n%s", err, stderr.String())
		}
		code = exit.ExitCode()
	}
	var r policyCheckReport
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		t.Fatalf("policy-check -o json (exit %d): %v\n%s\n%s", code, err, stdout.String(), stderr.String())
	}
	return code, r
}

// findingsIn lists a report's findings in one namespace as "workload policy".
func (r policyCheckReport) findingsIn(ns string) []string {
	var out []string
	for _, f := range r.Findings {
		if f.Namespace == ns {
			out = append(out, f.Workload+" "+f.Policy)
		}
	}
	slices.Sort(out)
	return out
}

// operatorDaemonSet is a DaemonSet of the GPU operator's shape: in its
// namespace, at system-node-critical, on the NVIDIA runtime, tolerating the
// GPU nodes' taint, on the nodes whose nvidia.com/gpu.deploy.<operand> label is
// "true"; gpus > 0 makes its pods ask nvidia.com/gpu, as the operator's
// validator's workload pods do.
func operatorDaemonSet(ns, name, deployLabel string, gpus int) *appsv1.DaemonSet {
	labels := map[string]string{"app": name}
	ctr := corev1.Container{Name: name, Image: "nvcr.io/nvidia/" + name + ":test"}
	if gpus > 0 {
		ctr.Resources.Limits = cluster.ResourceList(map[corev1.ResourceName]string{"nvidia.com/gpu": fmt.Sprint(gpus)})
	}
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector:      map[string]string{deployLabel: "true"},
					PriorityClassName: "system-node-critical",
					RuntimeClassName:  ptr.To(opRuntimeClass),
					Tolerations:       []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
					Containers:        []corev1.Container{ctr},
				},
			},
		},
	}
}

// podNodes lists the nodes the pods matching selector in ns are bound to
// (by the DaemonSet controller's node affinity when not yet bound), sorted.
func podNodes(ctx context.Context, c *cluster.Cluster, ns, selector string) ([]string, error) {
	pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, err
	}
	var nodes []string
	for _, p := range pods.Items {
		n := p.Spec.NodeName
		if a := p.Spec.Affinity; n == "" && a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
			for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
				for _, f := range term.MatchFields {
					if f.Key == "metadata.name" && len(f.Values) == 1 {
						n = f.Values[0]
					}
				}
			}
		}
		nodes = append(nodes, n)
	}
	slices.Sort(nodes)
	return nodes, nil
}

// TestChartNextToTheGPUOperator installs the chart as docs/install/gpu-operator.md
// says, on a cluster where NVIDIA's GPU operator is present: two GPU nodes with
// the operator's labels, one where its device plugin is declared
// (nvidia.com/gpu.deploy.device-plugin=true) and one turned over to gpufrac
// (device-plugin and mig-manager false), and a CPU node; the operator's
// RuntimeClass and two DaemonSets of its shape (the device plugin, and a
// validator whose pods ask nvidia.com/gpu at system-node-critical). Shown:
//   - the chart's gpufrac-node DaemonSet, with the guide's nodeSelector and
//     RuntimeClass, gets a pod on the gpufrac node only, and the operator's
//     device plugin on its own node only: no node gets two device plugins;
//   - installed audit-first (tenantValidationActions [Warn, Audit]), the
//     operator's validator keeps running, and `kubectl gpufrac policy-check`
//     names it (a GPU pod of another scheduler at a system-* class) until the
//     guide's label gpufrac.io/admin-namespace=true is on the operator's
//     namespace, then exits 0;
//   - upgraded to enforce (tenantValidationActions []), the validator's pods are
//     still created in the labelled namespace, while the same DaemonSet in an
//     unlabelled namespace has its pods refused.
func TestChartNextToTheGPUOperator(t *testing.T) {
	t.Parallel()
	values := filepath.Join(t.TempDir(), "gpu-operator-values.yaml")
	// The guide's values for nodes shared with the operator.
	if err := os.WriteFile(values, []byte(`node:
  nodeSelector:
    nvidia.com/gpu.present: "true"
    nvidia.com/gpu.deploy.device-plugin: "false"
  runtimeClassName: nvidia
admissionPolicies:
  tenantValidationActions: [Warn, Audit]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	testbed, err := cluster.TestbedValues()
	if err != nil {
		t.Fatal(err)
	}
	chart := cluster.ChartOptions{ValuesFiles: []string{testbed, values}}
	c := startCluster(t, cluster.Options{Chart: chart})
	plugin := buildBinary(t, "kubectl-gpufrac")
	ctx := t.Context()

	// What the operator has made before gpufrac is installed: its namespace,
	// its RuntimeClass, labelled GPU nodes.
	for _, ns := range []string{opNamespace, "team-a", "other-operator"} {
		if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Client.NodeV1().RuntimeClasses().Create(ctx, &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: opRuntimeClass}, Handler: "nvidia"}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	gpuTaint := []corev1.Taint{{Key: "nvidia.com/gpu", Value: "true", Effect: corev1.TaintEffectNoSchedule}}
	for _, n := range []cluster.NodeSpec{
		{Name: "op-gpu", Taints: gpuTaint, Labels: map[string]string{opLabelPresent: "true", opLabelDevicePlugin: "true",
			opLabelMIGManager: "true", opLabelValidator: "true"}},
		{Name: "gpufrac-gpu", Taints: gpuTaint, Labels: map[string]string{opLabelPresent: "true", opLabelDevicePlugin: "false",
			opLabelMIGManager: "false", opLabelValidator: "true"}},
		{Name: "cpu"},
	} {
		if _, err := c.AddNode(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	// A Queue makes tenants: from now on gpufrac's tenant policies apply
	// outside the system and admin namespaces.
	applyYAML(t, c, []byte("apiVersion: gpufrac.io/v1alpha1\nkind: Queue\nmetadata: {name: team-a}\nspec:\n  namespaces: [team-a]\n  resources:\n    gpu: {quota: \"4\"}\n"))
	for _, d := range []*appsv1.DaemonSet{
		operatorDaemonSet(opNamespace, "nvidia-device-plugin-daemonset", opLabelDevicePlugin, 0),
		operatorDaemonSet(opNamespace, "nvidia-operator-validator", opLabelValidator, 1),
	} {
		if _, err := c.Client.AppsV1().DaemonSets(d.Namespace).Create(ctx, d, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// gpufrac-node as the chart's DaemonSet (the test bed runs node agents as
	// processes and leaves the workloads out: apply it for real here).
	ds := c.Installed().Objects.Find("DaemonSet", "gpufrac-node")
	if ds == nil {
		t.Fatal("the chart rendered no gpufrac-node DaemonSet")
	}
	if _, err := cluster.NewApplier(c.Client, c.Dynamic).ServerSideApply(ctx, "gpufrac-node DaemonSet",
		[]*unstructured.Unstructured{ds}, cluster.ApplyOptions{FieldManager: "helm"}); err != nil {
		t.Fatal(err)
	}
	ns := c.Installed().Namespace
	expect := func(what, ns, selector string, want ...string) {
		t.Helper()
		var got []string
		waitFor(t, 60*time.Second, what, func(ctx context.Context) (bool, error) {
			var err error
			got, err = podNodes(ctx, c, ns, selector)
			return err == nil && slices.Equal(got, want), nil
		})
		// The DaemonSet controller has settled: no more pods come.
		time.Sleep(2 * time.Second)
		if got, err := podNodes(ctx, c, ns, selector); err != nil || !slices.Equal(got, want) {
			t.Errorf("%s: pods on %q (%v), want %q", what, got, err, want)
		}
	}
	expect("gpufrac-node on the node the operator's device plugin left", ns, "app.kubernetes.io/name=gpufrac-node", "gpufrac-gpu")
	expect("NVIDIA's device plugin on its node only", opNamespace, "app=nvidia-device-plugin-daemonset", "op-gpu")
	// Audit-first: the operator's validator runs on both GPU nodes.
	expect("the operator's validator (audit-first)", opNamespace, "app=nvidia-operator-validator", "gpufrac-gpu", "op-gpu")

	code, r := runPolicyCheck(t, c, plugin)
	// gpufrac-tenant-priority (system-node-critical outranks gpufrac's
	// reservations, and preempts): once, though it breaks two of its rules.
	// The operator's namespace is no queue's, so the scheduler rule
	// (gpufrac-tenant-gpu-scheduler) is not one of them.
	want := []string{"DaemonSet/nvidia-operator-validator gpufrac-tenant-priority"}
	if got := r.findingsIn(opNamespace); code != 1 || !slices.Equal(got, want) {
		t.Errorf("policy-check before the operator's namespace is an admin's: exit %d, findings %q, want exit 1 and %q (notes %q)", code, got, want, r.Notes)
	}
	for _, f := range r.Findings {
		if f.Denied {
			t.Errorf("%s/%s: %s denies, want it to warn only (audit-first)", f.Namespace, f.Workload, f.Policy)
		}
	}

	// The guide's label; then nothing is left to fix.
	if _, err := c.Client.CoreV1().Namespaces().Patch(ctx, opNamespace, "application/merge-patch+json",
		[]byte(`{"metadata":{"labels":{"gpufrac.io/admin-namespace":"true"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "policy-check to find nothing once the operator's namespace is labelled", func(context.Context) (bool, error) {
		code, r = runPolicyCheck(t, c, plugin)
		return code == 0 && len(r.Findings) == 0, nil
	})

	// Enforce: an upgrade with the tenant policies denying.
	if _, err := c.InstallChart(ctx, cluster.ChartOptions{ValuesFiles: chart.ValuesFiles, SetJSON: []string{"admissionPolicies.tenantValidationActions=[]"}}); err != nil {
		t.Fatal(err)
	}
	// The API server applies a binding's change within a few seconds: wait
	// until a pod as the DaemonSet controller would create it is refused.
	other := operatorDaemonSet("other-operator", "nvidia-operator-validator", opLabelValidator, 1)
	probe := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-", Namespace: other.Namespace,
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: other.Name, UID: "probe", Controller: ptr.To(true)}}},
		Spec: other.Spec.Template.Spec}
	waitFor(t, 30*time.Second, "the tenant policies to deny", func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().Pods(other.Namespace).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return cluster.RefusedBy(err, "gpufrac-tenant-priority"), nil
	})
	// The same validator in a namespace nobody labelled: its pods are refused.
	if _, err := c.Client.AppsV1().DaemonSets(other.Namespace).Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "the unlabelled namespace's validator pods to be refused", func(ctx context.Context) (bool, error) {
		evs, err := c.Client.CoreV1().Events(other.Namespace).List(ctx, metav1.ListOptions{FieldSelector: "reason=FailedCreate"})
		if err != nil {
			return false, nil
		}
		return slices.ContainsFunc(evs.Items, func(e corev1.Event) bool { return strings.Contains(e.Message, "gpufrac-tenant-priority") }), nil
	})
	if got, err := podNodes(ctx, c, other.Namespace, "app=nvidia-operator-validator"); err != nil || len(got) != 0 {
		t.Errorf("validator pods in the unlabelled namespace: %q (%v), want none", got, err)
	}
	// In the labelled namespace the controller still creates them: delete
	// the running ones and they come back.
	if err := c.Client.CoreV1().Pods(opNamespace).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)},
		metav1.ListOptions{LabelSelector: "app=nvidia-operator-validator"}); err != nil {
		t.Fatal(err)
	}
	expect("the operator's validator, enforced, in its labelled namespace", opNamespace, "app=nvidia-operator-validator", "gpufrac-gpu", "op-gpu")
}
