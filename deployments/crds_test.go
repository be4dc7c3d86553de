package deployments_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

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
