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

// render renders the chart with one helm binary and values files.
func render(t *testing.T, helm string, files ...string) cluster.Objects {
	t.Helper()
	objs, err := cluster.RenderChart(t.Context(), cluster.ChartOptions{Helm: helm, ValuesFiles: files, IncludeCRDs: true})
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
