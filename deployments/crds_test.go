package deployments_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/yaml"

	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/tests/cluster"
)

// crdUpgrade is the name of every object of the chart's CRD upgrade hook.
const crdUpgrade = "gpufrac-crd-upgrade"

// chartCRDs reads the chart's crds/: file name -> contents, and the CRDs' names.
func chartCRDs(t *testing.T) (map[string]string, []string) {
	t.Helper()
	dir, err := cluster.ChartDir()
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(dir, "crds", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs in %s/crds: %v", dir, err)
	}
	data := map[string]string{}
	var names []string
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		data[filepath.Base(f)] = string(raw)
		objs, err := cluster.DecodeObjects(f, raw)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			names = append(names, o.GetName())
		}
	}
	return data, names
}

// TestChartUpgradesCRDsWithAHook (issue 29): Helm never upgrades crds/, so
// the chart renders a pre-install/pre-upgrade hook that applies them: a Job
// running the coordinator's image with --apply-crds on a ConfigMap holding
// crds/ byte for byte (no second copy to keep), under a ServiceAccount that
// may only get and patch gpufrac's CRDs by name. Its objects are deleted
// once it succeeded; the CRD itself is never a template (Helm would delete
// it, and every Queue, on uninstall). crds.upgrade=false renders no hook.
func TestChartUpgradesCRDsWithAHook(t *testing.T) {
	files, names := chartCRDs(t)
	for _, h := range helms {
		helm := helmPath(t, h)
		t.Run(h, func(t *testing.T) {
			objs := render(t, helm)
			hooks := objs.Hooks()
			var got []string
			for _, o := range hooks {
				got = append(got, o.GetKind()+"/"+o.GetName())
				a := o.GetAnnotations()
				if a["helm.sh/hook"] != "pre-install,pre-upgrade" {
					t.Errorf("%s %s: helm.sh/hook %q", o.GetKind(), o.GetName(), a["helm.sh/hook"])
				}
				policy := strings.Split(a["helm.sh/hook-delete-policy"], ",")
				if !slices.Contains(policy, "hook-succeeded") || !slices.Contains(policy, "before-hook-creation") {
					t.Errorf("%s %s: hook-delete-policy %v, want before-hook-creation,hook-succeeded", o.GetKind(), o.GetName(), policy)
				}
				// A failed Job stays for its logs (and Helm prints them);
				// its ServiceAccount, RBAC and ConfigMap go with the failure
				// (Argo CD deletes only hook-failed ones), so that the patch
				// right on the CRD does not outlive the hook.
				if job := o.GetKind() == "Job"; job == slices.Contains(policy, "hook-failed") {
					t.Errorf("%s %s: hook-delete-policy %v: want hook-failed on all but the Job", o.GetKind(), o.GetName(), policy)
				}
				if got, want := a["helm.sh/hook-output-log-policy"], map[bool]string{true: "hook-failed"}[o.GetKind() == "Job"]; got != want {
					t.Errorf("%s %s: hook-output-log-policy %q, want %q", o.GetKind(), o.GetName(), got, want)
				}
				// Helm creates hooks by weight: the Job last.
				if w := a["helm.sh/hook-weight"]; (o.GetKind() == "Job") != (w == "-5") || w == "" {
					t.Errorf("%s %s: hook weight %q", o.GetKind(), o.GetName(), w)
				}
			}
			want := []string{"ServiceAccount/" + crdUpgrade, "ConfigMap/" + crdUpgrade, "ClusterRole/" + crdUpgrade, "ClusterRoleBinding/" + crdUpgrade, "Job/" + crdUpgrade}
			if diff := cmp.Diff(slices.Sorted(slices.Values(want)), slices.Sorted(slices.Values(got))); diff != "" {
				t.Errorf("hooks (-want +got):\n%s", diff)
			}

			// The CRD is in crds/ only, never a template.
			plain, err := cluster.RenderChart(t.Context(), cluster.ChartOptions{Helm: helm})
			if err != nil {
				t.Fatal(err)
			}
			if n := len(plain.OfKind("CustomResourceDefinition")); n != 0 {
				t.Errorf("%d CRDs rendered from templates/: helm uninstall would delete them", n)
			}

			// Least privilege: get and patch of gpufrac's CRDs by name.
			role := objs.Find("ClusterRole", crdUpgrade)
			if role == nil {
				t.Fatal("no ClusterRole " + crdUpgrade)
			}
			rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
			wantRules := []any{map[string]any{
				"apiGroups":     []any{"apiextensions.k8s.io"},
				"resources":     []any{"customresourcedefinitions"},
				"resourceNames": toAny(names),
				"verbs":         []any{"get", "patch"},
			}}
			if diff := cmp.Diff(wantRules, rules); diff != "" {
				t.Errorf("ClusterRole %s rules (-want +got):\n%s", crdUpgrade, diff)
			}
			binding := objs.Find("ClusterRoleBinding", crdUpgrade)
			ref, _, _ := unstructured.NestedString(binding.Object, "roleRef", "name")
			subjects, _, _ := unstructured.NestedSlice(binding.Object, "subjects")
			wantSubjects := []any{map[string]any{"kind": "ServiceAccount", "name": crdUpgrade, "namespace": cluster.ChartNamespace}}
			if diff := cmp.Diff(wantSubjects, subjects); ref != crdUpgrade || diff != "" {
				t.Errorf("ClusterRoleBinding %s binds %s to (-want +got):\n%s", crdUpgrade, ref, diff)
			}

			// The ConfigMap is crds/ as it is.
			cm := objs.Find("ConfigMap", crdUpgrade)
			data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
			if diff := cmp.Diff(files, data); diff != "" {
				t.Errorf("ConfigMap %s is not the chart's crds/ (-crds +configmap):\n%s", crdUpgrade, diff)
			}

			// The Job: the coordinator's image, --apply-crds on the ConfigMap.
			job := objs.Find("Job", crdUpgrade)
			spec, _, _ := unstructured.NestedMap(job.Object, "spec", "template", "spec")
			if spec["serviceAccountName"] != crdUpgrade {
				t.Errorf("Job runs as %v", spec["serviceAccountName"])
			}
			// Never: with OnFailure the Job controller kills the pod, and
			// its logs, once backoffLimit is reached.
			if spec["restartPolicy"] != "Never" {
				t.Errorf("Job restartPolicy %v, want Never (a failed try keeps its pod and logs)", spec["restartPolicy"])
			}
			coord, err := objs.WorkloadContainer("Deployment", "gpufrac-coordinator")
			if err != nil {
				t.Fatal(err)
			}
			cs, _, _ := unstructured.NestedSlice(job.Object, "spec", "template", "spec", "containers")
			if len(cs) != 1 {
				t.Fatalf("Job has %d containers", len(cs))
			}
			c := cs[0].(map[string]any)
			args, _, _ := unstructured.NestedStringSlice(c, "args")
			dir, ok := cluster.Flag(args, "apply-crds")
			if c["image"] != coord.Image || !ok {
				t.Errorf("Job container: image %v (the coordinator's: %s), args %v", c["image"], coord.Image, args)
			}
			mounts, _, _ := unstructured.NestedSlice(c, "volumeMounts")
			vols, _, _ := unstructured.NestedSlice(job.Object, "spec", "template", "spec", "volumes")
			wantMounts := []any{map[string]any{"name": "crds", "mountPath": dir, "readOnly": true}}
			wantVols := []any{map[string]any{"name": "crds", "configMap": map[string]any{"name": crdUpgrade}}}
			if diff := cmp.Diff(wantMounts, mounts) + cmp.Diff(wantVols, vols); diff != "" {
				t.Errorf("Job mounts the ConfigMap at --apply-crds=%s (-want +got):\n%s", dir, diff)
			}
			sc, _, _ := unstructured.NestedMap(c, "securityContext")
			if sc["readOnlyRootFilesystem"] != true || sc["allowPrivilegeEscalation"] != false || sc["runAsNonRoot"] != true {
				t.Errorf("Job container securityContext %v", sc)
			}

			// The admin's image, registry, pull secrets, placement and
			// security contexts reach the hook's pod as the coordinator's.
			custom, err := cluster.RenderChart(t.Context(), cluster.ChartOptions{Helm: helm, Set: []string{
				"global.imageRegistry=registry.example.com",
				"coordinator.image.digest=sha256:" + strings.Repeat("a", 64),
				"imagePullSecrets[0].name=pull",
				"coordinator.nodeSelector.pool=system",
				"coordinator.tolerations[0].key=system",
				"coordinator.tolerations[0].operator=Exists",
				"coordinator.podSecurityContext.fsGroup=65532",
				"coordinator.podSecurityContext.runAsUser=1000",
				"coordinator.securityContext.capabilities.drop[0]=ALL",
				"coordinator.securityContext.runAsUser=1001",
			}})
			if err != nil {
				t.Fatal(err)
			}
			podSpec := func(kind, name string) map[string]any {
				o := custom.Find(kind, name)
				if o == nil {
					t.Fatalf("no %s %s", kind, name)
				}
				spec, _, _ := unstructured.NestedMap(o.Object, "spec", "template", "spec")
				c := spec["containers"].([]any)[0].(map[string]any)
				return map[string]any{
					"image": c["image"], "imagePullPolicy": c["imagePullPolicy"], "securityContext": c["securityContext"],
					"podSecurityContext": spec["securityContext"], "imagePullSecrets": spec["imagePullSecrets"],
					"nodeSelector": spec["nodeSelector"], "tolerations": spec["tolerations"],
				}
			}
			coordPod, hookPod := podSpec("Deployment", "gpufrac-coordinator"), podSpec("Job", crdUpgrade)
			if !strings.HasPrefix(fmt.Sprint(hookPod["image"]), "registry.example.com/") || !strings.Contains(fmt.Sprint(hookPod["image"]), "@sha256:") {
				t.Errorf("hook image %v: want global.imageRegistry and the digest", hookPod["image"])
			}
			if diff := cmp.Diff(coordPod, hookPod); diff != "" {
				t.Errorf("the hook's pod differs from the coordinator's (-coordinator +hook):\n%s", diff)
			}

			// Off: no hook at all.
			off, err := cluster.RenderChart(t.Context(), cluster.ChartOptions{Helm: helm, Set: []string{"crds.upgrade=false"}})
			if err != nil {
				t.Fatal(err)
			}
			if h := off.Hooks(); len(h) != 0 {
				t.Errorf("crds.upgrade=false still renders %d hooks", len(h))
			}
			for _, o := range off {
				if o.GetName() == crdUpgrade {
					t.Errorf("crds.upgrade=false still renders %s %s", o.GetKind(), o.GetName())
				}
			}
		})
	}
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// oldQueueCRD is the chart's Queue CRD as an earlier release would have left
// it: without spec.priority, with a spec.legacyWeight and an annotation
// gpufrac.io/dropped that this release dropped.
func oldQueueCRD(t *testing.T, current []byte) []byte {
	t.Helper()
	var crd map[string]any
	if err := yaml.Unmarshal(current, &crd); err != nil {
		t.Fatal(err)
	}
	versions, _, _ := unstructured.NestedSlice(crd, "spec", "versions")
	props := []string{"schema", "openAPIV3Schema", "properties", "spec", "properties"}
	spec, ok, _ := unstructured.NestedMap(versions[0].(map[string]any), props...)
	if !ok || spec["priority"] == nil {
		t.Fatal("the Queue CRD has no spec.priority to take out")
	}
	delete(spec, "priority")
	spec["legacyWeight"] = map[string]any{"type": "integer"}
	if err := unstructured.SetNestedMap(versions[0].(map[string]any), spec, props...); err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedSlice(crd, versions, "spec", "versions"); err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedField(crd, "an earlier release's", "metadata", "annotations", "gpufrac.io/dropped"); err != nil {
		t.Fatal(err)
	}
	out, err := yaml.Marshal(crd)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// helmOn runs a helm binary against the test bed.
func helmOn(ctx context.Context, c *cluster.Cluster, helm string, args ...string) (string, error) {
	home, err := os.MkdirTemp("", "gpufrac-helm-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(home)
	cmd := exec.CommandContext(ctx, helm, append(args, "--kubeconfig", c.KubeconfigPath)...)
	cmd.Env = append(os.Environ(), "HOME="+home, "XDG_CONFIG_HOME="+home, "XDG_CACHE_HOME="+home, "XDG_DATA_HOME="+home)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w\n%s", filepath.Base(helm), strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// runCRDUpgradeHook plays the kubelet for the hook's pod: once the Job's pod
// exists it runs gpufrac-coordinator with the pod's arguments, as the pod's
// ServiceAccount (checking first what that account may not do), on the
// pod's ConfigMap written to a directory, and ends the pod Succeeded with
// the process's exit code 0. It fails when helm returns (helmDone) without
// having created the pod.
func runCRDUpgradeHook(ctx context.Context, t *testing.T, c *cluster.Cluster, coordinator string, helmDone <-chan struct{}) error {
	ns := cluster.ChartNamespace
	var pod *corev1.Pod
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		select {
		case <-helmDone:
			return false, errors.New("helm returned without running a CRD upgrade hook")
		default:
		}
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + crdUpgrade})
		if err != nil || len(pods.Items) == 0 {
			return false, nil
		}
		pod = &pods.Items[0]
		return true, nil
	}); err != nil {
		return fmt.Errorf("waiting for the hook's pod: %w", err)
	}
	// The ConfigMap volume mounted where --apply-crds reads.
	if len(pod.Spec.Containers) != 1 {
		return fmt.Errorf("the hook's pod has %d containers", len(pod.Spec.Containers))
	}
	ctr := pod.Spec.Containers[0]
	path, _ := cluster.Flag(ctr.Args, "apply-crds")
	var configMap string
	for _, m := range ctr.VolumeMounts {
		for _, v := range pod.Spec.Volumes {
			if m.MountPath == path && v.Name == m.Name && v.ConfigMap != nil {
				configMap = v.ConfigMap.Name
			}
		}
	}
	if configMap == "" {
		return fmt.Errorf("the hook's container mounts no ConfigMap at --apply-crds=%q", path)
	}
	cm, err := c.Client.CoreV1().ConfigMaps(ns).Get(ctx, configMap, metav1.GetOptions{})
	if err != nil {
		return err
	}
	dir := t.TempDir()
	for k, v := range cm.Data {
		if err := os.WriteFile(filepath.Join(dir, k), []byte(v), 0o644); err != nil {
			return err
		}
	}
	if err := checkCRDUpgradeRBAC(ctx, c, pod); err != nil {
		return err
	}
	kubeconfig, err := c.ServiceAccountKubeconfig(ctx, ns, pod.Spec.ServiceAccountName, pod)
	if err != nil {
		return err
	}
	args := cluster.ReplaceFlag(ctr.Args, "apply-crds", dir)
	args = append(args, "--kubeconfig="+kubeconfig)
	out, err := exec.CommandContext(ctx, coordinator, args...).CombinedOutput()
	t.Logf("gpufrac-coordinator %s:\n%s", strings.Join(args, " "), out)
	if err != nil {
		return fmt.Errorf("the hook's container failed: %w", err)
	}
	now := metav1.Now()
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		p.Status.Phase = corev1.PodSucceeded
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{
			Name: p.Spec.Containers[0].Name, Image: p.Spec.Containers[0].Image,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", StartedAt: now, FinishedAt: now}},
		}}
		_, err = c.Client.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{})
		return err
	})
}

// checkCRDUpgradeRBAC: the hook's ServiceAccount reads gpufrac's CRD and
// may not create, delete or list CRDs nor read another (dry runs: a
// mistake in the ClusterRole must not delete the CRD).
func checkCRDUpgradeRBAC(ctx context.Context, c *cluster.Cluster, pod *corev1.Pod) error {
	cfg, err := c.ServiceAccountConfig(ctx, pod.Namespace, pod.Spec.ServiceAccountName, pod)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	crds := dyn.Resource(cluster.CRDResource())
	queues := v1alpha1.QueueResource + "." + v1alpha1.Group
	own, err := crds.Get(ctx, queues, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("the hook's account cannot read CRD %s: %w", queues, err)
	}
	other := own.DeepCopy()
	other.SetName("widgets." + v1alpha1.Group)
	other.SetResourceVersion("")
	_ = unstructured.SetNestedField(other.Object, "widgets", "spec", "names", "plural")
	dry := []string{metav1.DryRunAll}
	for what, err := range map[string]error{
		"delete " + queues:        crds.Delete(ctx, queues, metav1.DeleteOptions{DryRun: dry}),
		"create a CRD":            ignoreObj(crds.Create(ctx, other, metav1.CreateOptions{DryRun: dry})),
		"list CRDs":               ignoreObj(crds.List(ctx, metav1.ListOptions{})),
		"get widgets.gpufrac.io":  ignoreObj(crds.Get(ctx, other.GetName(), metav1.GetOptions{})),
		"get another group's CRD": ignoreObj(crds.Get(ctx, "prometheuses.monitoring.coreos.com", metav1.GetOptions{})),
		"update " + queues:        ignoreObj(crds.Update(ctx, own, metav1.UpdateOptions{DryRun: dry})),
	} {
		if !apierrors.IsForbidden(err) {
			return fmt.Errorf("the hook's account may %s (want forbidden): %v", what, err)
		}
	}
	return nil
}

func ignoreObj[T any](_ T, err error) error { return err }

// hookResources are the kinds of the CRD upgrade hook's objects.
var hookResources = []struct {
	res        schema.GroupVersionResource
	namespaced bool
}{
	{batchv1.SchemeGroupVersion.WithResource("jobs"), true},
	{corev1.SchemeGroupVersion.WithResource("configmaps"), true},
	{corev1.SchemeGroupVersion.WithResource("serviceaccounts"), true},
	{rbacv1.SchemeGroupVersion.WithResource("clusterroles"), false},
	{rbacv1.SchemeGroupVersion.WithResource("clusterrolebindings"), false},
}

// failCRDUpgradeHook plays a kubelet whose hook pods all fail (exit code 1)
// until helm returns (helmDone); it returns how many pods it failed.
func failCRDUpgradeHook(ctx context.Context, c *cluster.Cluster, helmDone <-chan struct{}) (int, error) {
	ns := cluster.ChartNamespace
	failed := map[string]bool{}
	for {
		select {
		case <-helmDone:
			return len(failed), nil
		case <-ctx.Done():
			return len(failed), ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + crdUpgrade})
		if err != nil {
			continue
		}
		for _, p := range pods.Items {
			if failed[p.Name] || p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
				continue
			}
			now := metav1.Now()
			p.Status.Phase = corev1.PodFailed
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{
				Name: p.Spec.Containers[0].Name, Image: p.Spec.Containers[0].Image,
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", StartedAt: now, FinishedAt: now}},
			}}
			if _, err := c.Client.CoreV1().Pods(ns).UpdateStatus(ctx, &p, metav1.UpdateOptions{}); err == nil {
				failed[p.Name] = true
			}
		}
	}
}

// TestChartUpgradesCRDsOnTestBed (issue 29) runs the CRD upgrade with real
// Helm on the test bed, Helm 3 and Helm 4 in turn: an earlier release (the
// chart with a Queue CRD without spec.priority, no hook) is installed and a
// Queue made; `helm upgrade` to this chart runs the hook (the test runs its
// container, gpufrac-coordinator --apply-crds, as the hook's
// ServiceAccount); the CRD then serves spec.priority, the Queue is the same
// object, Helm's create is no longer an owner of the CRD's fields, and the
// hook's objects are gone. A second `helm upgrade` whose hook pods all fail
// fails, naming the hook; its ServiceAccount, RBAC and ConfigMap are deleted
// and its Job and failed pods stay for their logs. `helm uninstall` leaves
// the CRD and the Queue.
func TestChartUpgradesCRDsOnTestBed(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the local cluster (make tools)")
	}
	bins, err := binaries()
	if err != nil {
		t.Fatal(err)
	}
	coordinator := filepath.Join(bins, "gpufrac-coordinator")
	chart, err := cluster.ChartDir()
	if err != nil {
		t.Fatal(err)
	}
	current, err := os.ReadFile(filepath.Join(chart, "crds", "gpufrac.io_queues.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	old := filepath.Join(t.TempDir(), "gpufrac")
	if err := os.CopyFS(old, os.DirFS(chart)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(old, "crds", "gpufrac.io_queues.yaml"), oldQueueCRD(t, current), 0o644); err != nil {
		t.Fatal(err)
	}
	// Earlier releases had no hook.
	if err := os.Remove(filepath.Join(old, "templates", "crd-upgrade.yaml")); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	c := cluster.StartForTest(t, cluster.Options{Bare: true})
	crds := c.Dynamic.Resource(cluster.CRDResource())
	queues := c.Dynamic.Resource(v1alpha1.QueueGVR())
	crdName := v1alpha1.QueueResource + "." + v1alpha1.Group
	ns := cluster.ChartNamespace
	for _, h := range helms {
		helm := helmPath(t, h)
		t.Run(h, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
			defer cancel()
			// A clean slate: the CRD outlives every release.
			if err := crds.Delete(ctx, crdName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Fatal(err)
			}
			if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
				_, err := crds.Get(ctx, crdName, metav1.GetOptions{})
				return apierrors.IsNotFound(err), nil
			}); err != nil {
				t.Fatalf("the CRD of the last run is not gone: %v", err)
			}

			// The earlier release: its CRD from crds/, no hook.
			if _, err := helmOn(ctx, c, helm, "install", cluster.ChartRelease, old, "--namespace", ns, "--create-namespace"); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				// The next Helm's run needs the release name (done when the test passed).
				_, _ = helmOn(context.WithoutCancel(ctx), c, helm, "uninstall", cluster.ChartRelease, "--namespace", ns, "--ignore-not-found")
			})
			queue := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": v1alpha1.APIVersion, "kind": v1alpha1.QueueKind,
				"metadata": map[string]any{"name": "team-a"},
				"spec":     map[string]any{"namespaces": []any{"default"}, "priority": int64(5), "resources": map[string]any{"gpu": map[string]any{"quota": "1"}}},
			}}
			var before *unstructured.Unstructured
			if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
				before, err = queues.Create(ctx, queue, metav1.CreateOptions{})
				return err == nil, nil // until the old CRD is served
			}); err != nil {
				t.Fatalf("creating a Queue under the old CRD: %v", err)
			}
			if _, ok, _ := unstructured.NestedInt64(before.Object, "spec", "priority"); ok {
				t.Fatal("the old CRD kept spec.priority: it is not the old one")
			}
			// An admin's annotation on the CRD, which the upgrade must keep.
			if _, err := crds.Patch(ctx, crdName, types.MergePatchType, []byte(`{"metadata":{"annotations":{"example.com/owner":"platform"}}}`), metav1.PatchOptions{FieldManager: "kubectl-annotate"}); err != nil {
				t.Fatal(err)
			}

			// The upgrade, its hook run by the test as a kubelet would.
			helmDone := make(chan struct{})
			var upgradeErr error
			go func() {
				defer close(helmDone)
				var out string
				out, upgradeErr = helmOn(ctx, c, helm, "upgrade", cluster.ChartRelease, chart, "--namespace", ns, "--timeout", "2m")
				t.Logf("%s upgrade:\n%s", h, out)
			}()
			hookErr := runCRDUpgradeHook(ctx, t, c, coordinator, helmDone)
			<-helmDone
			if hookErr != nil || upgradeErr != nil {
				if job, err := c.Client.BatchV1().Jobs(ns).Get(ctx, crdUpgrade, metav1.GetOptions{}); err == nil {
					t.Logf("the hook's Job: %+v", job.Status)
				}
				if evs, err := c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{}); err == nil {
					for _, e := range evs.Items {
						if !strings.HasPrefix(e.InvolvedObject.Name, crdUpgrade) {
							continue
						}
						t.Logf("event %s %s: %s %s", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
					}
				}
				t.Fatalf("the hook: %v; helm upgrade: %v", hookErr, upgradeErr)
			}

			crd, err := crds.Get(ctx, crdName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
			specProps, _, _ := unstructured.NestedMap(versions[0].(map[string]any), "schema", "openAPIV3Schema", "properties", "spec", "properties")
			if specProps["priority"] == nil {
				t.Fatal("after helm upgrade the Queue CRD still has no spec.priority: it was not upgraded")
			}
			if specProps["legacyWeight"] != nil {
				t.Error("after helm upgrade the Queue CRD still has spec.legacyWeight, which this release dropped")
			}
			// Helm's fields were handed to gpufrac: what this release
			// dropped is gone; the admin's annotation stays.
			var managers []string
			for _, m := range crd.GetManagedFields() {
				managers = append(managers, m.Manager+"/"+string(m.Operation)+"/"+m.Subresource)
				if m.Manager == "helm" {
					t.Errorf("the CRD's fields are still owned by helm (%s): fields a release drops stay", m.Operation)
				}
			}
			t.Logf("the CRD's field managers: %v", managers)
			if a := crd.GetAnnotations(); a["gpufrac.io/dropped"] != "" || a["example.com/owner"] != "platform" {
				t.Errorf("the CRD's annotations %v: want example.com/owner (the admin's) and no gpufrac.io/dropped (the earlier release's)", a)
			}
			// The same Queue, which now keeps spec.priority.
			got, err := queues.Get(ctx, "team-a", metav1.GetOptions{})
			if err != nil || got.GetUID() != before.GetUID() {
				t.Fatalf("the Queue did not survive the upgrade: %v", err)
			}
			patch := []byte(`{"spec":{"priority":7}}`)
			if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
				got, err = queues.Patch(ctx, "team-a", types.MergePatchType, patch, metav1.PatchOptions{})
				if err != nil {
					return false, err
				}
				p, _, _ := unstructured.NestedInt64(got.Object, "spec", "priority")
				return p == 7, nil // the API server serves the new schema a moment after the update
			}); err != nil {
				t.Errorf("spec.priority is not kept after the upgrade: %v", err)
			}
			// The hook's objects are gone (hook-succeeded).
			for _, r := range hookResources {
				var ri dynamic.ResourceInterface = c.Dynamic.Resource(r.res)
				if r.namespaced {
					ri = c.Dynamic.Resource(r.res).Namespace(ns)
				}
				if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
					_, err := ri.Get(ctx, crdUpgrade, metav1.GetOptions{})
					return apierrors.IsNotFound(err), nil
				}); err != nil {
					t.Errorf("the hook's %s %s is still there", r.res.Resource, crdUpgrade)
				}
			}

			// A failing hook: every try's pod fails. helm upgrade fails; the
			// hook's ServiceAccount, RBAC and ConfigMap are deleted (no patch
			// right on the CRD outlives it); the Job and its failed pods stay.
			// With Helm 3 only: the Job controller's back-off between tries
			// makes it a minute of make test per Helm, and it shows Helm's
			// handling of the hook's delete policies, which Helm 4 shares
			// (its rendering is checked by TestChartUpgradesCRDsWithAHook).
			if h == cluster.Helm3 {
				helmDone = make(chan struct{})
				var failedOut string
				go func() {
					defer close(helmDone)
					failedOut, upgradeErr = helmOn(ctx, c, helm, "upgrade", cluster.ChartRelease, chart, "--namespace", ns, "--timeout", "3m")
				}()
				failed, hookErr := failCRDUpgradeHook(ctx, c, helmDone)
				<-helmDone
				if hookErr != nil || failed == 0 {
					t.Fatalf("failing the hook's pods: %d failed, %v", failed, hookErr)
				}
				t.Logf("%s upgrade with a failing hook (%d pods failed): %v\n%s", h, failed, upgradeErr, failedOut)
				if upgradeErr == nil || !strings.Contains(upgradeErr.Error(), crdUpgrade) {
					t.Errorf("helm upgrade with a failing hook: %v, want an error naming %s", upgradeErr, crdUpgrade)
				}
				for _, r := range hookResources {
					var ri dynamic.ResourceInterface = c.Dynamic.Resource(r.res)
					if r.namespaced {
						ri = c.Dynamic.Resource(r.res).Namespace(ns)
					}
					err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
						_, err := ri.Get(ctx, crdUpgrade, metav1.GetOptions{})
						return apierrors.IsNotFound(err) != (r.res.Resource == "jobs"), nil
					})
					if r.res.Resource == "jobs" && err != nil {
						t.Errorf("the failed hook's Job is gone: its pods' logs with it")
					} else if err != nil {
						t.Errorf("the failed hook's %s %s is still there", r.res.Resource, crdUpgrade)
					}
				}
				pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + crdUpgrade})
				if err != nil || len(pods.Items) != failed {
					t.Errorf("%d of the failed hook's %d pods stay (%v): want all, for their logs", len(pods.Items), failed, err)
				}
				// The next test's hook pod must be the only one.
				bg := metav1.DeletePropagationBackground
				if err := c.Client.BatchV1().Jobs(ns).Delete(ctx, crdUpgrade, metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil {
					t.Fatal(err)
				}
				if err := c.Client.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + crdUpgrade}); err != nil {
					t.Fatal(err)
				}
			}

			// Uninstall keeps the CRD and the Queue.
			if _, err := helmOn(ctx, c, helm, "uninstall", cluster.ChartRelease, "--namespace", ns, "--wait", "--timeout", "2m"); err != nil {
				t.Fatal(err)
			}
			crd, err = crds.Get(ctx, crdName, metav1.GetOptions{})
			if err != nil || crd.GetDeletionTimestamp() != nil {
				t.Fatalf("helm uninstall deleted the Queue CRD: %v", err)
			}
			if got, err := queues.Get(ctx, "team-a", metav1.GetOptions{}); err != nil || got.GetUID() != before.GetUID() {
				t.Fatalf("helm uninstall deleted the Queue: %v", err)
			}
		})
	}
}
