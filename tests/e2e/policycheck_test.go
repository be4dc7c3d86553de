package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/tests/cluster"
)

// TestAuditFirstPoliciesAndPolicyCheck: installed with the policies on
// tenants' workloads audit-first (tenantValidationActions [Warn, Audit]), a
// tenant's existing workloads that break them keep running (the vLLM chart
// that sets NVIDIA_VISIBLE_DEVICES, a Deployment with a hostPath volume), and
// `kubectl gpufrac policy-check` names exactly those, with the policy that
// would refuse each; gpufrac's own protocol is still denied meanwhile.
func TestAuditFirstPoliciesAndPolicyCheck(t *testing.T) {
	t.Parallel()
	c := startCluster(t, cluster.Options{Chart: cluster.ChartOptions{Set: []string{"admissionPolicies.tenantValidationActions={Warn,Audit}"}}})
	plugin := buildBinary(t, "kubectl-gpufrac")
	ctx := t.Context()
	const ns = "team-a"
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// team-a is a tenant: a Queue admits it.
	applyYAML(t, c, []byte("apiVersion: gpufrac.io/v1alpha1\nkind: Queue\nmetadata: {name: team-a}\nspec:\n  namespaces: [team-a]\n  resources:\n    gpu: {quota: \"4\"}\n"))

	deployment := func(name string, edit func(*corev1.PodSpec)) *appsv1.Deployment {
		labels := map[string]string{"app": name}
		spec := corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10"}}}
		edit(&spec)
		return &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: spec}},
		}
	}
	for _, d := range []*appsv1.Deployment{
		deployment("vllm", func(s *corev1.PodSpec) {
			s.Containers[0].Env = []corev1.EnvVar{{Name: api.EnvVisibleDevices, Value: "all"}}
		}),
		deployment("hostpath", func(s *corev1.PodSpec) {
			s.Volumes = []corev1.Volume{{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib"}}}}
			s.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "host", MountPath: "/host"}}
		}),
		deployment("fine", func(*corev1.PodSpec) {}),
	} {
		if _, err := c.Client.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating Deployment %s: %v", d.Name, err)
		}
	}
	// Audit-first: the controllers' pods are created (warned, not refused).
	waitFor(t, 60*time.Second, "the three Deployments' pods to exist", func(ctx context.Context) (bool, error) {
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		return err == nil && len(pods.Items) == 3, nil
	})
	// gpufrac's protocol is still denied: a tenant's pod may not write the
	// coordinator's GPU annotation.
	forged := pod("forged", "team-a").Obj()
	forged.Namespace = ns
	forged.Annotations = map[string]string{api.AnnotationGPU: "GPU-forged"}
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, forged, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); !cluster.RefusedBy(err, "gpufrac-protocol-annotations") {
		t.Errorf("a forged gpufrac.io/gpu annotation: %v, want refused by gpufrac-protocol-annotations", err)
	}

	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, plugin, "--kubeconfig="+c.KubeconfigPath, "policy-check", "-o", "json")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// Exit status 1: it found workloads the policies refuse or would refuse.
	var exit *exec.ExitError
	if err := cmd.Run(); !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("kubectl gpufrac policy-check: %v, want exit status 1 (findings)\n%s", err, stderr.String())
	}
	// The JSON shape of policy-check -o json (README, kubectl gpufrac).
	var r struct {
		Checked  int `json:"checked"`
		Findings []struct {
			Namespace, Workload, Policy, Message string
			Denied                               bool
		} `json:"findings"`
		Notes []string `json:"notes"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		t.Fatalf("policy-check -o json: %v\n%s", err, stdout.String())
	}
	var got []string
	for _, f := range r.Findings {
		if f.Denied {
			t.Errorf("%s/%s: %s denies, want it to warn only (audit-first)", f.Namespace, f.Workload, f.Policy)
		}
		got = append(got, f.Namespace+" "+f.Workload+" "+f.Policy)
		t.Logf("%s %s: %s: %s", f.Namespace, f.Workload, f.Policy, f.Message)
	}
	slices.Sort(got)
	want := []string{"team-a Deployment/hostpath gpufrac-tenant-gpu-access", "team-a Deployment/vllm gpufrac-visible-devices"}
	if !slices.Equal(got, want) {
		t.Errorf("policy-check findings %q, want %q (notes %q)", got, want, r.Notes)
	}
	t.Logf("policy-check: %d workloads checked, notes %q", r.Checked, r.Notes)
}
