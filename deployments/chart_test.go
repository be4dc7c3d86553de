package deployments_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/placement"
	"github.com/gpufrac/gpufrac/coordinator/podrequest"
	"github.com/gpufrac/gpufrac/coordinator/pricing"
	"github.com/gpufrac/gpufrac/deviceplugin/config"
	"github.com/gpufrac/gpufrac/tests/cluster"
)

// The chart must work with Helm 3 and Helm 4: every test that runs helm runs
// both binaries `make tools` builds.
var helms = []string{cluster.Helm3, cluster.Helm4}

// helmPath returns a helm binary; without it the test fails, except under
// -short (make unit), which runs without the tools.
func helmPath(t *testing.T, name string) string {
	t.Helper()
	p, err := cluster.HelmPath(name)
	if errors.Is(err, cluster.ErrHelmMissing) && testing.Short() {
		t.Skipf("%v (the chart tests need make tools)", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// ciValues lists the chart's ci/*.yaml values files: helm lint, the
// rendering checks and the test bed's dry run use each.
func ciValues(t *testing.T) []string {
	t.Helper()
	dir, err := cluster.ChartDir()
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(dir, "ci", "*.yaml"))
	if err != nil || len(files) < 3 {
		t.Fatalf("want several values files in %s/ci, got %v (%v)", dir, files, err)
	}
	return files
}

// monitoringAPI is the Prometheus Operator's API: the chart renders its
// ServiceMonitors, PodMonitors and PrometheusRule only where the cluster
// serves it (the test bed's dry run installs its CRDs).
const monitoringAPI = "monitoring.coreos.com/v1"

// render renders the chart with one helm binary and values files, for a
// cluster that serves the Prometheus Operator's API.
func render(t *testing.T, helm string, files ...string) cluster.Objects {
	t.Helper()
	objs, err := cluster.RenderChart(t.Context(), cluster.ChartOptions{Helm: helm, ValuesFiles: files, IncludeCRDs: true, APIVersions: []string{monitoringAPI}})
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func TestChartLint(t *testing.T) {
	dir, err := cluster.ChartDir()
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range helms {
		helm := helmPath(t, h)
		for _, f := range ciValues(t) {
			t.Run(h+"/"+filepath.Base(f), func(t *testing.T) {
				out, err := exec.Command(helm, "lint", "--strict", dir, "--namespace", cluster.ChartNamespace, "--values", f).CombinedOutput()
				if err != nil {
					t.Errorf("helm lint: %v\n%s", err, out)
				}
			})
		}
	}
}

// TestChartRefusesBadValues installs (renders) the chart with values files
// that are each wrong in one way: each must fail with the message its first
// line names ("# want: ..."), with both Helm versions.
func TestChartRefusesBadValues(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "bad-values", "*.yaml"))
	if err != nil || len(files) < 5 {
		t.Fatalf("bad values files: %v %v", files, err)
	}
	for _, h := range helms {
		helm := helmPath(t, h)
		for _, f := range files {
			t.Run(h+"/"+filepath.Base(f), func(t *testing.T) {
				data, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				first, _, _ := strings.Cut(string(data), "\n")
				want, ok := strings.CutPrefix(first, "# want: ")
				if !ok {
					t.Fatalf("%s: the first line must be '# want: <message>'", f)
				}
				_, err = cluster.HelmTemplate(t.Context(), cluster.ChartOptions{Helm: helm, ValuesFiles: []string{f}})
				if err == nil {
					t.Fatalf("the chart accepted %s", f)
				}
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error does not say %q:\n%v", want, err)
				}
			})
		}
	}
}

func TestChartImagesAreTheAppVersion(t *testing.T) {
	root := repoRoot(t)
	app := chartAppVersion(t, root)
	for _, h := range helms {
		objs := render(t, helmPath(t, h))
		for kind, name := range map[string]string{"DaemonSet": "gpufrac-node", "Deployment": "gpufrac-coordinator"} {
			c, err := objs.WorkloadContainer(kind, name)
			if err != nil {
				t.Fatal(err)
			}
			if want := "ghcr.io/gpufrac/" + name + ":" + app; c.Image != want {
				t.Errorf("%s: %s image %s, want %s", h, name, c.Image, want)
			}
		}
	}
}

// TestChartImageDigest: node.image.digest and coordinator.image.digest pin
// each image as repository@digest (the tag is then ignored, and
// global.imageRegistry still applies); without them the tag is used.
func TestChartImageDigest(t *testing.T) {
	nodeDigest := "sha256:" + strings.Repeat("a", 64)
	coordDigest := "sha256:" + strings.Repeat("b", 64)
	values := filepath.Join(t.TempDir(), "digests.yaml")
	if err := os.WriteFile(values, []byte("global: {imageRegistry: mirror.example.com}\n"+
		"node: {image: {tag: \"9.9.9\", digest: \""+nodeDigest+"\"}}\n"+
		"coordinator: {image: {digest: \""+coordDigest+"\"}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, h := range helms {
		objs := render(t, helmPath(t, h), values)
		for kind, want := range map[string]string{
			"DaemonSet/gpufrac-node":         "mirror.example.com/gpufrac/gpufrac-node@" + nodeDigest,
			"Deployment/gpufrac-coordinator": "mirror.example.com/gpufrac/gpufrac-coordinator@" + coordDigest,
		} {
			k, name, _ := strings.Cut(kind, "/")
			c, err := objs.WorkloadContainer(k, name)
			if err != nil {
				t.Fatal(err)
			}
			if c.Image != want {
				t.Errorf("%s: %s image %s, want %s", h, name, c.Image, want)
			}
		}
	}
}

// binaries builds gpufrac-node and gpufrac-coordinator once per test binary.
var binaries = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "gpufrac-chart-bin-")
	if err != nil {
		return "", err
	}
	root, err := cluster.RepoRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "build", "-o", dir+"/", "./cmd/gpufrac-node", "./cmd/gpufrac-coordinator")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the components: %v\n%s", err, out)
	}
	return dir, nil
})

// TestChartArgsAreTheBinariesFlags runs each component's binary with the
// arguments the chart gives it (the kubelet's $(VAR) expansion applied) and
// --version: an unknown flag, or a value the flag cannot parse, fails.
func TestChartArgsAreTheBinariesFlags(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the components")
	}
	dir, err := binaries()
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{"NODE_NAME": "node-1", "POD_NAME": "gpufrac-coordinator-abc", "POD_IP": "10.0.0.7"}
	for _, f := range ciValues(t) {
		objs := render(t, helmPath(t, cluster.Helm3), f)
		for kind, name := range map[string]string{"DaemonSet": "gpufrac-node", "Deployment": "gpufrac-coordinator"} {
			if objs.Find(kind, name) == nil {
				continue
			}
			t.Run(filepath.Base(f)+"/"+name, func(t *testing.T) {
				c, err := objs.WorkloadContainer(kind, name)
				if err != nil {
					t.Fatal(err)
				}
				args, err := cluster.ExpandArgs(c.Args, vars)
				if err != nil {
					t.Fatal(err)
				}
				out, err := exec.Command(filepath.Join(dir, name), append(args, "--version")...).CombinedOutput()
				if err != nil {
					t.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
				}
			})
		}
	}
}

// TestChartNodeConfigParses reads the ConfigMap each ci values file renders
// with gpufrac-node's own config parser.
func TestChartNodeConfigParses(t *testing.T) {
	for _, f := range ciValues(t) {
		objs := render(t, helmPath(t, cluster.Helm3), f)
		data, err := objs.ConfigMapData("gpufrac-node-config", "config.yaml")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := config.Parse([]byte(data)); err != nil {
			t.Errorf("%s: gpufrac-node refuses the chart's config: %v\n%s", filepath.Base(f), err, data)
		}
	}
}

// TestChartPricesParse reads the price table each ci values file renders
// (ConfigMap gpufrac-coordinator-prices, mounted where --price-table points)
// with the coordinator's own parser.
func TestChartPricesParse(t *testing.T) {
	seen := 0
	for _, f := range ciValues(t) {
		objs := render(t, helmPath(t, cluster.Helm3), f)
		c, err := objs.WorkloadContainer("Deployment", "gpufrac-coordinator")
		if err != nil {
			continue // a values file without the coordinator
		}
		path, ok := cluster.Flag(c.Args, "price-table")
		if objs.Find("ConfigMap", "gpufrac-coordinator-prices") == nil {
			if ok {
				t.Errorf("%s: --price-table=%s without the ConfigMap", filepath.Base(f), path)
			}
			continue
		}
		seen++
		data, err := objs.ConfigMapData("gpufrac-coordinator-prices", "prices.yaml")
		if err != nil {
			t.Fatal(err)
		}
		if path != "/etc/gpufrac/prices/prices.yaml" {
			t.Errorf("%s: --price-table=%q, not where the ConfigMap is mounted", filepath.Base(f), path)
		}
		if tab, err := pricing.Parse([]byte(data)); err != nil || len(tab.InstanceTypes) == 0 {
			t.Errorf("%s: the coordinator refuses the chart's price table, or it lists no type: %v\n%s", filepath.Base(f), err, data)
		}
	}
	if seen == 0 {
		t.Error("no ci values file renders a price table")
	}
}

// TestChartSchemaAgreesWithTheNodeConfigParser: the schema never refuses a
// config gpufrac-node accepts (it would block a valid install), and refuses
// the common mistakes before they reach the nodes. Mistakes only the node
// can judge (a profile a GPU model lacks, overlapping index ranges, poll
// intervals out of range) are the node's: it keeps its last good config.
func TestChartSchemaAgreesWithTheNodeConfigParser(t *testing.T) {
	helm := helmPath(t, cluster.Helm3)
	cases := []struct {
		name         string
		config       string
		schemaRefuse bool // the schema refuses it (the node always does when nodeRefuse)
		nodeRefuse   bool
	}{
		{name: "minimal", config: "version: v1\ndefault: {}"},
		{name: "readme example", config: `version: v1
default:
  mode: fraction
  fraction: {enforcement: report, pollInterval: 1s, tolerancePercent: 5, samples: 3}
  timeslice: {replicas: 4, resourceName: nvidia.com/gpu.shared, failRequestsGreaterThanOne: true}
  mig: {strategy: mixed, layout: all-1g.10gb}
  gpus:
    - {indices: "0-3", mode: mig}
    - {indices: "4", mode: mig, migLayout: "3g.40gb,2g.20gb,1g.10gb"}
    - {indices: "5-7", mode: fraction}
groups:
  - nodeSelector: {gpufrac.io/pool: training}
    mode: exclusive
  - nodeSelector: {gpufrac.io/pool: interactive}
    mode: timeslice`},
		{name: "mig profiles with media extensions", config: "version: v1\ndefault: {mode: mig, mig: {strategy: single, layout: all-1g.10gb+me}}"},
		{name: "balanced", config: "version: v1\ndefault: {mode: mig, mig: {layout: all-balanced}}"},
		{name: "a group in mode dra", config: "version: v1\ndefault: {}\ngroups: [{nodeSelector: {gpufrac.io/serving: dra}, mode: dra, dra: {gpuMode: mig}}]"},
		{name: "one node's GPU 3 in MIG", config: "version: v1\ndefault: {}\ngroups: [{nodeSelector: {kubernetes.io/hostname: gpu-node-2}, gpus: [{indices: '3', mode: mig, migLayout: all-1g.10gb}]}]"},
		{name: "a GPU in mode dra", config: "version: v1\ndefault: {gpus: [{indices: '0', mode: dra}]}", schemaRefuse: true, nodeRefuse: true},
		{name: "kill and evict", config: "version: v1\ndefault: {fraction: {enforcement: evict}}\ngroups: [{nodeSelector: {a: b}, fraction: {enforcement: kill}}]"},
		{name: "wrong version", config: "version: v2\ndefault: {}", schemaRefuse: true, nodeRefuse: true},
		{name: "unknown mode", config: "version: v1\ndefault: {mode: shared}", schemaRefuse: true, nodeRefuse: true},
		{name: "unknown enforcement", config: "version: v1\ndefault: {fraction: {enforcement: warn}}", schemaRefuse: true, nodeRefuse: true},
		{name: "unknown field", config: "version: v1\ndefault: {mode: fraction, replicas: 3}", schemaRefuse: true, nodeRefuse: true},
		{name: "one replica", config: "version: v1\ndefault: {timeslice: {replicas: 1}}", schemaRefuse: true, nodeRefuse: true},
		{name: "too many replicas", config: "version: v1\ndefault: {timeslice: {replicas: 5000}}", schemaRefuse: true, nodeRefuse: true},
		{name: "bad mig layout", config: "version: v1\ndefault: {mig: {layout: 7g}}", schemaRefuse: true, nodeRefuse: true},
		{name: "bad mig strategy", config: "version: v1\ndefault: {mig: {strategy: all}}", schemaRefuse: true, nodeRefuse: true},
		{name: "tolerance over 100", config: "version: v1\ndefault: {fraction: {tolerancePercent: 150}}", schemaRefuse: true, nodeRefuse: true},
		{name: "poll interval as a number", config: "version: v1\ndefault: {fraction: {pollInterval: 5}}", schemaRefuse: true, nodeRefuse: true},
		{name: "bad indices", config: "version: v1\ndefault: {gpus: [{indices: 'a-b', mode: mig}]}", schemaRefuse: true, nodeRefuse: true},
		{name: "group without selector", config: "version: v1\ndefault: {}\ngroups: [{mode: mig}]", schemaRefuse: true, nodeRefuse: true},
		{name: "resource name without domain", config: "version: v1\ndefault: {timeslice: {resourceName: shared-gpu}}", schemaRefuse: true, nodeRefuse: true},
		// Only the node can judge these; the schema lets them through.
		{name: "poll interval too short", config: "version: v1\ndefault: {fraction: {pollInterval: 10ms}}", nodeRefuse: true},
		{name: "overlapping indices", config: "version: v1\ndefault: {gpus: [{indices: '0-3', mode: mig}, {indices: '2', mode: fraction}]}", nodeRefuse: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, nodeErr := config.Parse([]byte(tc.config))
			if got := nodeErr != nil; got != tc.nodeRefuse {
				t.Fatalf("gpufrac-node refuses=%v (%v), want %v", got, nodeErr, tc.nodeRefuse)
			}
			j, err := yaml.YAMLToJSON([]byte(tc.config))
			if err != nil {
				t.Fatal(err)
			}
			// The config replaces the chart's default document as a whole.
			values := filepath.Join(t.TempDir(), "values.yaml")
			if err := os.WriteFile(values, []byte(`{"node": {"config": null}}`), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err = cluster.HelmTemplate(t.Context(), cluster.ChartOptions{Helm: helm, ValuesFiles: []string{values}, SetJSON: []string{"node.config=" + string(j)}})
			if got := err != nil; got != tc.schemaRefuse {
				t.Errorf("the chart refuses=%v (%v), want %v", got, err, tc.schemaRefuse)
			}
		})
	}
}

// TestChartEnforcementHasWhatItNeeds (issue 25): with default values
// gpufrac-node kills over-limit processes, and its container has CAP_KILL to
// do it; without KILL the chart renders only when no policy that shares a
// GPU kills (the refusals are in testdata/bad-values/*kill*.yaml).
func TestChartEnforcementHasWhatItNeeds(t *testing.T) {
	helm := helmPath(t, cluster.Helm3)
	objs := render(t, helm)
	data, err := objs.ConfigMapData("gpufrac-node-config", "config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	f, err := config.Parse([]byte(data))
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Default.Fraction.Enforcement; got != config.EnforcementKill {
		t.Errorf("the chart's default enforcement is %s, want kill", got)
	}
	ds := objs.Find("DaemonSet", "gpufrac-node")
	if ds == nil {
		t.Fatal("no DaemonSet gpufrac-node")
	}
	cs, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
	if len(cs) == 0 {
		t.Fatal("gpufrac-node has no containers")
	}
	add, _, _ := unstructured.NestedStringSlice(cs[0].(map[string]any), "securityContext", "capabilities", "add")
	if !slices.Contains(add, "KILL") {
		t.Errorf("gpufrac-node's capabilities add %v, want KILL for enforcement kill", add)
	}
	if pid, _, _ := unstructured.NestedBool(ds.Object, "spec", "template", "spec", "hostPID"); !pid {
		t.Error("gpufrac-node has no hostPID: a pidfd for a GPU process opens only in its PID namespace")
	}

	for _, cfg := range []string{
		`{"version": "v1", "default": {"fraction": {"enforcement": "report"}}, "groups": [{"nodeSelector": {"a": "b"}, "fraction": {"enforcement": "evict"}}]}`,
		`{"version": "v1", "default": {"mode": "exclusive"}, "groups": [{"nodeSelector": {"a": "b"}, "mode": "mig"}]}`,
		`{"version": "v1", "default": {"mode": "mig", "gpus": [{"indices": "0", "mode": "exclusive"}]}}`,
	} {
		if _, err := cluster.HelmTemplate(t.Context(), cluster.ChartOptions{Helm: helm,
			SetJSON: []string{"node.capabilities=[]", "node.config=" + cfg}}); err != nil {
			t.Errorf("without KILL the chart refuses %s: %v", cfg, err)
		}
	}
}

// TestChartNodeEventRBAC: gpufrac-node records events through client-go's
// tools/events, which creates events.k8s.io/v1 Events and patches their
// series; it writes no core/v1 Events, so its role grants none (least
// privilege).
func TestChartNodeEventRBAC(t *testing.T) {
	objs := render(t, helmPath(t, cluster.Helm3))
	role := objs.Find("ClusterRole", "gpufrac-node")
	if role == nil {
		t.Fatal("no ClusterRole gpufrac-node")
	}
	rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
	var granted []string // "group resource verb"
	for _, r := range rules {
		m := r.(map[string]any)
		groups, _, _ := unstructured.NestedStringSlice(m, "apiGroups")
		resources, _, _ := unstructured.NestedStringSlice(m, "resources")
		verbs, _, _ := unstructured.NestedStringSlice(m, "verbs")
		for _, g := range groups {
			for _, res := range resources {
				for _, v := range verbs {
					if res == "events" {
						granted = append(granted, g+" "+res+" "+v)
					}
				}
			}
		}
	}
	slices.Sort(granted)
	if diff := cmp.Diff([]string{"events.k8s.io events create", "events.k8s.io events patch"}, granted); diff != "" {
		t.Errorf("gpufrac-node's rights on events (-want +got):\n%s", diff)
	}
}

// TestChartAuditFirst: tenantValidationActions reaches the four policies on
// tenants' workloads and no other; empty, they follow validationActions.
func TestChartAuditFirst(t *testing.T) {
	tenant := map[string]bool{"gpufrac-visible-devices": true, "gpufrac-tenant-priority": true,
		"gpufrac-tenant-gpu-scheduler": true, "gpufrac-tenant-gpu-access": true}
	dir, err := cluster.ChartDir()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name         string
		files        []string
		tenant, rest []string
	}{
		{"default", nil, []string{"Deny"}, []string{"Deny"}},
		{"audit-first", []string{filepath.Join(dir, "ci", "audit-first-values.yaml")}, []string{"Warn", "Audit"}, []string{"Deny"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seen := map[string]bool{}
			for _, o := range render(t, helmPath(t, cluster.Helm3), tc.files...) {
				if o.GetKind() != "ValidatingAdmissionPolicyBinding" {
					continue
				}
				actions, _, _ := unstructured.NestedStringSlice(o.Object, "spec", "validationActions")
				want := tc.rest
				if tenant[o.GetName()] {
					want, seen[o.GetName()] = tc.tenant, true
				}
				if diff := cmp.Diff(want, actions); diff != "" {
					t.Errorf("binding %s validationActions (-want +got):\n%s", o.GetName(), diff)
				}
			}
			if len(seen) != len(tenant) {
				t.Errorf("tenant bindings rendered: %v, want all of %v", seen, tenant)
			}
		})
	}
}

// TestChartSchemaPolicies: the schema's placement policies are the
// coordinator's.
func TestChartSchemaPolicies(t *testing.T) {
	dir, err := cluster.ChartDir()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Properties struct {
			Coordinator struct {
				Properties struct {
					Policy struct {
						Enum []string `json:"enum"`
					} `json:"policy"`
				} `json:"properties"`
			} `json:"coordinator"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(data, &schema); err != nil {
		t.Fatal(err)
	}
	got := slices.Sorted(slices.Values(schema.Properties.Coordinator.Properties.Policy.Enum))
	if diff := cmp.Diff(placement.Policies(), got); diff != "" {
		t.Errorf("values.schema.json coordinator.policy enum (-coordinator +schema):\n%s", diff)
	}
}

// TestChartDryRunOnTestBed applies every ci values file's rendering, with
// both Helm versions, to a real API server with a server-side dry run: every
// object must pass the API server's validation and admission (the Prometheus
// Operator's CRDs are installed for the monitoring objects).
func TestChartDryRunOnTestBed(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the local cluster (make tools)")
	}
	t.Parallel()
	c := cluster.StartForTest(t, cluster.Options{})
	ctx := t.Context()
	applier := cluster.NewApplier(c.Client, c.Dynamic)
	root := repoRoot(t)
	crds, err := filepath.Glob(filepath.Join(root, "bin", "prometheus-operator-crds", "*.yaml"))
	if err != nil || len(crds) == 0 {
		t.Fatalf("no Prometheus Operator CRDs in bin/prometheus-operator-crds (make tools): %v", err)
	}
	for _, f := range crds {
		objs, err := cluster.ReadObjects(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := applier.ServerSideApply(ctx, f, objs, cluster.ApplyOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// helm install needs its release namespace; the chart's reservation
	// namespace must exist for the dry run of the objects in it.
	nsObjs, err := cluster.DecodeObjects("namespaces", []byte(fmt.Sprintf(
		"apiVersion: v1\nkind: Namespace\nmetadata: {name: %s}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: %s}\n", cluster.ChartNamespace, api.ReservationNamespace)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := applier.ServerSideApply(ctx, "namespaces", nsObjs, cluster.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, h := range helms {
		helm := helmPath(t, h)
		for _, f := range ciValues(t) {
			t.Run(h+"/"+filepath.Base(f), func(t *testing.T) {
				objs := render(t, helm, f)
				ctx, cancel := context.WithTimeout(ctx, time.Minute)
				defer cancel()
				names, err := applier.ServerSideApply(ctx, filepath.Base(f), objs, cluster.ApplyOptions{DryRun: true, FieldManager: "helm"})
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("%d objects pass a server-side dry run: %s", len(names), strings.Join(names, " "))
			})
		}
	}
}

// TestChartRendersOnlyAPIsTheClusterServes (issue 29): the DeviceClasses need
// resource.k8s.io/v1 (Kubernetes 1.34+), the ServiceMonitors, PodMonitors and
// PrometheusRule monitoring.coreos.com/v1; where the cluster lacks the API the
// chart leaves them out instead of failing the install, and the explicit
// switches still turn them off.
func TestChartRendersOnlyAPIsTheClusterServes(t *testing.T) {
	dir, err := cluster.ChartDir()
	if err != nil {
		t.Fatal(err)
	}
	obs := filepath.Join(dir, "ci", "observability-values.yaml")
	mixed := filepath.Join(dir, "ci", "mixed-cluster-values.yaml")
	monitoring := []string{"ServiceMonitor", "PodMonitor", "PrometheusRule"}
	cases := []struct {
		name        string
		kube        string
		apis        []string
		files, set  []string
		want, wantN []string // kinds rendered, kinds not rendered
	}{
		{name: "1.31 without DRA or monitoring", kube: "1.31.0", files: []string{obs},
			want: []string{"DaemonSet", "Deployment", "ValidatingAdmissionPolicy"}, wantN: append([]string{"DeviceClass"}, monitoring...)},
		{name: "1.33", kube: "1.33.0", apis: []string{monitoringAPI}, files: []string{obs},
			want: []string{"ServiceMonitor", "PrometheusRule"}, wantN: []string{"DeviceClass"}},
		{name: "1.35 with DRA, without monitoring", kube: "1.35.0", files: []string{mixed},
			want: []string{"DeviceClass"}, wantN: monitoring},
		{name: "1.35 with both", kube: "1.35.0", apis: []string{monitoringAPI}, files: []string{mixed},
			want: []string{"DeviceClass", "PodMonitor"}, wantN: []string{"ServiceMonitor"}},
		{name: "switches off though the APIs exist", kube: "1.36.0", apis: []string{monitoringAPI},
			set: []string{"dra.deviceClasses=false"}, wantN: append([]string{"DeviceClass"}, monitoring...)},
	}
	for _, h := range helms {
		helm := helmPath(t, h)
		for _, tc := range cases {
			t.Run(h+"/"+tc.name, func(t *testing.T) {
				objs, err := cluster.RenderChart(t.Context(), cluster.ChartOptions{Helm: helm, ValuesFiles: tc.files, Set: tc.set, APIVersions: tc.apis, KubeVersion: tc.kube})
				if err != nil {
					t.Fatal(err)
				}
				for _, k := range tc.want {
					if len(objs.OfKind(k)) == 0 {
						t.Errorf("no %s rendered", k)
					}
				}
				for _, k := range tc.wantN {
					if n := len(objs.OfKind(k)); n > 0 {
						t.Errorf("%d %s rendered, want none", n, k)
					}
				}
			})
		}
	}
	// Below the chart's kubeVersion the install is refused.
	if _, err := cluster.HelmTemplate(t.Context(), cluster.ChartOptions{Helm: helmPath(t, cluster.Helm3), KubeVersion: "1.30.0"}); err == nil || !strings.Contains(err.Error(), "kubeVersion") {
		t.Errorf("the chart renders for Kubernetes 1.30 (kubeVersion >=1.31): %v", err)
	}
}

// TestChartKubeVersionIsTheREADMEs: the README's supported versions name the
// chart's minimum Kubernetes version.
func TestChartKubeVersionIsTheREADMEs(t *testing.T) {
	root := repoRoot(t)
	raw, err := os.ReadFile(filepath.Join(root, "deployments", "helm", "gpufrac", "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var meta struct {
		KubeVersion string `json:"kubeVersion"`
	}
	if err := yaml.Unmarshal(raw, &meta); err != nil {
		t.Fatal(err)
	}
	minor, ok := strings.CutPrefix(meta.KubeVersion, ">=")
	if !ok {
		t.Fatalf("Chart.yaml kubeVersion %q is not >=X.Y.Z-0", meta.KubeVersion)
	}
	minor = strings.Join(strings.SplitN(minor, ".", 3)[:2], ".")
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(readme), "\n") {
		if strings.HasPrefix(line, "| Kubernetes (control plane and kubelet) |") {
			if !strings.Contains(line, "**"+minor+" or newer**") || !strings.Contains(line, meta.KubeVersion) {
				t.Errorf("README's supported Kubernetes versions do not say %s or newer (Chart.yaml kubeVersion %s):\n%s", minor, meta.KubeVersion, line)
			}
			return
		}
	}
	t.Error("README has no supported-versions row for Kubernetes")
}

// TestChartNonPreemptiblePriorityIsTheBinarysDefault: the chart's
// coordinator.nonPreemptiblePriority, the flag's default and the docs agree
// (issue 29: they were 1000000, 100 and 100): the flags in
// docs/how-it-works.md, the queues in docs/operations.md and the values
// reference, docs/values.md.
func TestChartNonPreemptiblePriorityIsTheBinarysDefault(t *testing.T) {
	want := fmt.Sprint(podrequest.DefaultNonPreemptiblePriority)
	for _, h := range helms {
		c, err := render(t, helmPath(t, h)).WorkloadContainer("Deployment", "gpufrac-coordinator")
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := cluster.Flag(c.Args, "non-preemptible-priority"); got != want {
			t.Errorf("%s: the chart passes --non-preemptible-priority=%s, the binary's default is %s", h, got, want)
		}
	}
	for _, d := range []struct{ file, says string }{
		{"docs/how-it-works.md", "[--non-preemptible-priority " + want + "]"},
		{"docs/operations.md", "`--non-preemptible-priority`, default " + want},
		{"docs/values.md", "| `coordinator.nonPreemptiblePriority` | `" + want + "` |"},
	} {
		doc, err := os.ReadFile(filepath.Join(repoRoot(t), filepath.FromSlash(d.file)))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(doc), d.says) {
			t.Errorf("%s does not say %q", d.file, d.says)
		}
	}
}

// TestChartConventions (issue 29): service accounts (name, create,
// annotations) followed by RBAC and the admission policies, pod labels,
// global.imageRegistry (the admission policy's pause images included), the
// coordinator's extra env and volumes and its default anti-affinity.
func TestChartConventions(t *testing.T) {
	for _, h := range helms {
		helm := helmPath(t, h)
		objs, err := cluster.RenderChart(t.Context(), cluster.ChartOptions{Helm: helm, SetJSON: []string{
			`coordinator.serviceAccount={"name":"sched","annotations":{"eks.amazonaws.com/role-arn":"arn:aws:iam::1:role/x"}}`,
			`node.serviceAccount={"create":false,"name":"agent"}`,
			`node.podLabels={"team":"gpu"}`, `coordinator.podLabels={"team":"sched"}`,
			`global.imageRegistry="mirror.example.com/hub"`,
			`coordinator.extraEnv=[{"name":"HTTPS_PROXY","value":"http://proxy:3128"}]`,
			`coordinator.extraVolumes=[{"name":"ca","configMap":{"name":"ca"}}]`,
			`coordinator.extraVolumeMounts=[{"name":"ca","mountPath":"/etc/ssl/extra"}]`,
		}})
		if err != nil {
			t.Fatal(err)
		}
		sa := objs.Find("ServiceAccount", "sched")
		if sa == nil || sa.GetAnnotations()["eks.amazonaws.com/role-arn"] == "" {
			t.Errorf("%s: no ServiceAccount sched with its annotation: %v", h, sa)
		}
		if objs.Find("ServiceAccount", "agent") != nil || objs.Find("ServiceAccount", "gpufrac-node") != nil {
			t.Errorf("%s: node.serviceAccount.create=false still renders one", h)
		}
		// Hooks bind accounts of their own (crds_test.go).
		for _, b := range objs.WithoutHooks().OfKind("ClusterRoleBinding", "RoleBinding") {
			subjects, _, _ := unstructured.NestedSlice(b.Object, "subjects")
			for _, s := range subjects {
				if n := s.(map[string]any)["name"]; n != "sched" && n != "agent" {
					t.Errorf("%s: %s %s binds %v, not the configured accounts", h, b.GetKind(), b.GetName(), n)
				}
			}
		}
		var policies strings.Builder
		for _, p := range objs.OfKind("ValidatingAdmissionPolicy") {
			y, _ := yaml.Marshal(p.Object)
			policies.Write(y)
		}
		for _, s := range []string{"system:serviceaccount:" + cluster.ChartNamespace + ":sched'", "system:serviceaccount:" + cluster.ChartNamespace + ":agent'", "'mirror.example.com/hub/pause:3.10'"} {
			if !strings.Contains(policies.String(), s) {
				t.Errorf("%s: the admission policies do not name %s", h, s)
			}
		}
		if strings.Contains(policies.String(), ":gpufrac-coordinator'") || strings.Contains(policies.String(), "registry.k8s.io/pause") {
			t.Errorf("%s: the admission policies still name the default account or image", h)
		}
		for kind, name := range map[string]string{"DaemonSet": "gpufrac-node", "Deployment": "gpufrac-coordinator"} {
			w := objs.Find(kind, name)
			spec, _, _ := unstructured.NestedMap(w.Object, "spec", "template", "spec")
			labels, _, _ := unstructured.NestedStringMap(w.Object, "spec", "template", "metadata", "labels")
			if labels["team"] == "" || labels["app.kubernetes.io/name"] != name {
				t.Errorf("%s: %s pod labels %v", h, name, labels)
			}
			if want := map[string]string{"DaemonSet": "agent", "Deployment": "sched"}[kind]; spec["serviceAccountName"] != want {
				t.Errorf("%s: %s serviceAccountName %v, want %s", h, name, spec["serviceAccountName"], want)
			}
			c, err := objs.WorkloadContainer(kind, name)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(c.Image, "mirror.example.com/hub/gpufrac/") {
				t.Errorf("%s: %s image %s not under global.imageRegistry", h, name, c.Image)
			}
		}
		c, _ := objs.WorkloadContainer("Deployment", "gpufrac-coordinator")
		if img, _ := cluster.Flag(c.Args, "reservation-image"); img != "mirror.example.com/hub/pause:3.10" {
			t.Errorf("%s: --reservation-image=%s", h, img)
		}
		dep := objs.Find("Deployment", "gpufrac-coordinator")
		cs, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
		env, _, _ := unstructured.NestedSlice(cs[0].(map[string]any), "env")
		mounts, _, _ := unstructured.NestedSlice(cs[0].(map[string]any), "volumeMounts")
		named := func(list []any, name string) bool {
			return slices.ContainsFunc(list, func(e any) bool { return e.(map[string]any)["name"] == name })
		}
		if !named(env, "HTTPS_PROXY") || !named(env, "GPUFRAC_MEMORY_LIMIT") || !named(mounts, "ca") {
			t.Errorf("%s: the coordinator lacks its extraEnv or extraVolumeMounts: %v %v", h, env, mounts)
		}
		vols, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "volumes")
		if len(vols) != 1 || vols[0].(map[string]any)["name"] != "ca" {
			t.Errorf("%s: the coordinator's volumes %v, want its extraVolumes", h, vols)
		}
		terms, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "affinity", "podAntiAffinity", "preferredDuringSchedulingIgnoredDuringExecution")
		if len(terms) != 1 {
			t.Fatalf("%s: the coordinator has no default preferred pod anti-affinity: %v", h, terms)
		}
		key, _, _ := unstructured.NestedString(terms[0].(map[string]any), "podAffinityTerm", "topologyKey")
		sel, _, _ := unstructured.NestedStringMap(terms[0].(map[string]any), "podAffinityTerm", "labelSelector", "matchLabels")
		if key != "kubernetes.io/hostname" || sel["app.kubernetes.io/name"] != "gpufrac-coordinator" {
			t.Errorf("%s: anti-affinity by %s over %v", h, key, sel)
		}
	}
	// An affinity of the admin's replaces the default.
	objs, err := cluster.RenderChart(t.Context(), cluster.ChartOptions{Helm: helmPath(t, cluster.Helm3), SetJSON: []string{
		`coordinator.affinity={"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"role","operator":"In","values":["infra"]}]}]}}}`}})
	if err != nil {
		t.Fatal(err)
	}
	aff, _, _ := unstructured.NestedMap(objs.Find("Deployment", "gpufrac-coordinator").Object, "spec", "template", "spec", "affinity")
	if _, ok := aff["podAntiAffinity"]; ok || aff["nodeAffinity"] == nil {
		t.Errorf("coordinator.affinity does not replace the default: %v", aff)
	}
}
