package cluster

// This file renders gpufrac's Helm chart (deployments/helm/gpufrac) with
// the helm binaries `make tools` builds into bin/ (bin/helm is Helm 3,
// bin/helm4 Helm 4), and reads what the test bed needs from the result: the
// objects to apply, and the components' ServiceAccounts, arguments and config,
// so the processes the tests start run exactly as the chart deploys them.
//
// The chart is rendered by the helm binary rather than Helm's Go library: the
// binary is what users run, it keeps Helm's dependencies (another Kubernetes
// minor, OCI and plugin code) out of gpufrac's go.mod, and the same tests
// run against Helm 3 and Helm 4 by choosing the binary.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/v1alpha1"
)

const (
	// Helm3 and Helm4 are the helm binaries' names in the bin directory.
	Helm3 = "helm"
	Helm4 = "helm4"
	// ChartRelease and ChartNamespace are the release and namespace the test
	// bed installs the chart as: the components' namespace the code and the
	// docs name (api.ComponentNamespace).
	ChartRelease   = "gpufrac"
	ChartNamespace = api.ComponentNamespace
)

// ErrHelmMissing is returned (wrapped) when a helm binary is not in bin/.
var ErrHelmMissing = errors.New("helm binary missing: run make tools")

// ChartOptions say how to render the chart.
type ChartOptions struct {
	// Helm is the helm binary's path; empty is <repository root>/bin/helm.
	Helm string
	// Dir is the chart's directory; empty is the repository's (ChartDir).
	// Another version's chart (an upgrade test's) is rendered from its own.
	Dir string
	// Release and Namespace default to ChartRelease and ChartNamespace.
	Release, Namespace string
	// ValuesFiles are passed as -f, in order.
	ValuesFiles []string
	// Set are passed as --set (key=value).
	Set []string
	// SetJSON are passed as --set-json (key=json).
	SetJSON []string
	// IncludeCRDs renders the chart's crds/ too, as `helm install` installs them.
	IncludeCRDs bool
	// APIVersions are passed as --api-versions: APIs the cluster serves
	// beyond helm's built-in set (e.g. monitoring.coreos.com/v1).
	APIVersions []string
	// KubeVersion, when set, is passed as --kube-version.
	KubeVersion string
}

// ChartAppVersion is the chart's appVersion, the tag of its default images.
func ChartAppVersion() (string, error) {
	dir, err := ChartDir()
	if err != nil {
		return "", err
	}
	raw, err := os.ReadFile(filepath.Join(dir, "Chart.yaml"))
	if err != nil {
		return "", err
	}
	var meta struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(raw, &meta); err != nil || meta.AppVersion == "" {
		return "", fmt.Errorf("%s/Chart.yaml: no appVersion (%v)", dir, err)
	}
	return meta.AppVersion, nil
}

// ChartDir is the chart's directory in the repository.
func ChartDir() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "deployments", "helm", "gpufrac"), nil
}

// HelmPath returns the path of a helm binary in the repository's bin/.
func HelmPath(name string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	p := filepath.Join(root, "bin", name)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%w: %s", ErrHelmMissing, p)
	}
	return p, nil
}

// HelmTemplate runs `helm template` and returns its output. A failure
// returns helm's own message (schema violations, template `fail`s).
func HelmTemplate(ctx context.Context, o ChartOptions) ([]byte, error) {
	helm := o.Helm
	if helm == "" {
		var err error
		if helm, err = HelmPath(Helm3); err != nil {
			return nil, err
		}
	}
	dir := o.Dir
	if dir == "" {
		var err error
		if dir, err = ChartDir(); err != nil {
			return nil, err
		}
	}
	release, ns := o.Release, o.Namespace
	if release == "" {
		release = ChartRelease
	}
	if ns == "" {
		ns = ChartNamespace
	}
	args := []string{"template", release, dir, "--namespace", ns}
	if o.IncludeCRDs {
		args = append(args, "--include-crds")
	}
	for _, f := range o.ValuesFiles {
		args = append(args, "--values", f)
	}
	for _, s := range o.Set {
		args = append(args, "--set", s)
	}
	for _, s := range o.SetJSON {
		args = append(args, "--set-json", s)
	}
	for _, v := range o.APIVersions {
		args = append(args, "--api-versions", v)
	}
	if o.KubeVersion != "" {
		args = append(args, "--kube-version", o.KubeVersion)
	}
	cmd := exec.CommandContext(ctx, helm, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// Helm reads its config and cache from HOME/XDG: keep the user's out.
	home, err := os.MkdirTemp("", "gpufrac-helm-")
	if err != nil {
		return nil, fmt.Errorf("rendering the chart: %w", err)
	}
	defer os.RemoveAll(home)
	cmd.Env = append(os.Environ(), "HOME="+home, "XDG_CONFIG_HOME="+home, "XDG_CACHE_HOME="+home, "XDG_DATA_HOME="+home)
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s", filepath.Base(helm), strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// RenderChart runs `helm template` and decodes the objects.
func RenderChart(ctx context.Context, o ChartOptions) (Objects, error) {
	out, err := HelmTemplate(ctx, o)
	if err != nil {
		return nil, err
	}
	return DecodeObjects("helm template", out)
}

// Objects are a rendered chart's objects, in helm's order.
type Objects []*unstructured.Unstructured

// Find returns the object of a kind and name, or nil.
func (objs Objects) Find(kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

// OfKind returns the objects of some kinds.
func (objs Objects) OfKind(kinds ...string) Objects {
	var out Objects
	for _, o := range objs {
		for _, k := range kinds {
			if o.GetKind() == k {
				out = append(out, o)
			}
		}
	}
	return out
}

// Without returns the objects not of the given kinds.
func (objs Objects) Without(kinds ...string) Objects {
	var out Objects
	for _, o := range objs {
		keep := true
		for _, k := range kinds {
			if o.GetKind() == k {
				keep = false
			}
		}
		if keep {
			out = append(out, o)
		}
	}
	return out
}

// Hooks returns the Helm hooks among the objects (annotation helm.sh/hook).
func (objs Objects) Hooks() Objects {
	var out Objects
	for _, o := range objs {
		if _, ok := o.GetAnnotations()[HookAnnotation]; ok {
			out = append(out, o)
		}
	}
	return out
}

// WithoutHooks returns the objects that are not Helm hooks: the release's.
func (objs Objects) WithoutHooks() Objects {
	var out Objects
	for _, o := range objs {
		if _, ok := o.GetAnnotations()[HookAnnotation]; !ok {
			out = append(out, o)
		}
	}
	return out
}

// HookAnnotation marks a Helm hook: helm runs it around an install or
// upgrade, and it is no object of the release.
const HookAnnotation = "helm.sh/hook"

// Container is what the test bed takes from a workload's first container.
type Container struct {
	// ServiceAccount is the pod template's serviceAccountName.
	ServiceAccount string
	// Namespace is the workload's namespace.
	Namespace string
	Image     string
	Args      []string
	// MemoryLimit is the container's resources.limits.memory ("" for none).
	MemoryLimit string
}

// WorkloadContainer reads the first container of a Deployment or DaemonSet.
func (objs Objects) WorkloadContainer(kind, name string) (Container, error) {
	obj := objs.Find(kind, name)
	if obj == nil {
		return Container{}, fmt.Errorf("the rendered chart has no %s %s", kind, name)
	}
	sa, _, _ := unstructured.NestedString(obj.Object, "spec", "template", "spec", "serviceAccountName")
	cs, _, err := unstructured.NestedSlice(obj.Object, "spec", "template", "spec", "containers")
	if err != nil || len(cs) == 0 {
		return Container{}, fmt.Errorf("%s %s has no containers", kind, name)
	}
	c, ok := cs[0].(map[string]any)
	if !ok {
		return Container{}, fmt.Errorf("%s %s: malformed container", kind, name)
	}
	image, _, _ := unstructured.NestedString(c, "image")
	args, _, err := unstructured.NestedStringSlice(c, "args")
	if err != nil {
		return Container{}, fmt.Errorf("%s %s: reading args: %w", kind, name, err)
	}
	mem, _, _ := unstructured.NestedString(c, "resources", "limits", "memory")
	return Container{ServiceAccount: sa, Namespace: obj.GetNamespace(), Image: image, Args: args, MemoryLimit: mem}, nil
}

// ConfigMapData returns a key of a ConfigMap's data.
func (objs Objects) ConfigMapData(name, key string) (string, error) {
	obj := objs.Find("ConfigMap", name)
	if obj == nil {
		return "", fmt.Errorf("the rendered chart has no ConfigMap %s", name)
	}
	v, ok, err := unstructured.NestedString(obj.Object, "data", key)
	if err != nil || !ok {
		return "", fmt.Errorf("ConfigMap %s has no data key %s", name, key)
	}
	return v, nil
}

// ExpandArgs replaces $(VAR) references in container args the way the
// kubelet does, from vars; a reference to an unknown variable is an error
// (the kubelet would leave it as it is, and the process would get garbage).
func ExpandArgs(args []string, vars map[string]string) ([]string, error) {
	out := make([]string, len(args))
	for i, a := range args {
		var b strings.Builder
		rest := a
		for {
			start := strings.Index(rest, "$(")
			if start < 0 {
				b.WriteString(rest)
				break
			}
			end := strings.Index(rest[start:], ")")
			if end < 0 {
				return nil, fmt.Errorf("arg %q: unterminated $(", a)
			}
			name := rest[start+2 : start+end]
			v, ok := vars[name]
			if !ok {
				return nil, fmt.Errorf("arg %q: no value for $(%s)", a, name)
			}
			b.WriteString(rest[:start] + v)
			rest = rest[start+end+1:]
		}
		out[i] = b.String()
	}
	return out, nil
}

// ReplaceFlag sets a flag in args: every --name=... is replaced by
// --name=value (appended when absent). The test bed uses it for what only
// differs because components run as local processes (addresses, kubeconfig).
func ReplaceFlag(args []string, name, value string) []string {
	prefix := "--" + name + "="
	var out []string
	found := false
	for _, a := range args {
		if strings.HasPrefix(a, prefix) || a == "--"+name {
			if !found {
				out = append(out, prefix+value)
				found = true
			}
			continue
		}
		out = append(out, a)
	}
	if !found {
		out = append(out, prefix+value)
	}
	return out
}

// Flag returns the value of the last --name=value in args (the one Go's
// flag package keeps).
func Flag(args []string, name string) (string, bool) {
	prefix := "--" + name + "="
	for _, a := range slices.Backward(args) {
		if v, ok := strings.CutPrefix(a, prefix); ok {
			return v, true
		}
	}
	return "", false
}

// Install is gpufrac as the chart installed it on the test bed: every object
// but the workloads was applied; the components run as local processes with
// the workloads' ServiceAccounts, arguments and config, which it holds.
type Install struct {
	// Objects is the whole rendering, workloads included.
	Objects Objects
	// Namespace is the release namespace (components, Lease).
	Namespace string
	// Node and Coordinator are the workloads' containers (zero when disabled).
	Node, Coordinator Container
	// NodeConfig is the admin's config the DaemonSet mounts (ConfigMap
	// gpufrac-node-config, key config.yaml).
	NodeConfig string
	// CoordinatorPrices is the price table the Deployment mounts (ConfigMap
	// gpufrac-coordinator-prices, key prices.yaml); empty without one.
	CoordinatorPrices string
}

// coordinatorPricesPath is where the chart's Deployment mounts its price table.
const coordinatorPricesPath = "/etc/gpufrac/prices/prices.yaml"

// CoordinatorProcessArgs are the coordinator's arguments as the kubelet
// expands them for a pod named podName, for a local process: the price
// table the Deployment would mount is written into dir, and --price-table
// names that copy. The caller sets what else differs (kubeconfig, metrics).
func (in *Install) CoordinatorProcessArgs(dir, podName string) ([]string, error) {
	args, err := ExpandArgs(in.Coordinator.Args, map[string]string{"POD_NAME": podName, "POD_IP": "127.0.0.1"})
	if err != nil {
		return nil, err
	}
	p, ok := Flag(args, "price-table")
	if !ok {
		return args, nil
	}
	if p != coordinatorPricesPath || in.CoordinatorPrices == "" {
		return nil, fmt.Errorf("the chart's coordinator reads --price-table=%s, but its ConfigMap gpufrac-coordinator-prices mounted at %s has no prices.yaml", p, coordinatorPricesPath)
	}
	local := filepath.Join(dir, "coordinator-prices.yaml")
	if err := os.WriteFile(local, []byte(in.CoordinatorPrices), 0o644); err != nil {
		return nil, fmt.Errorf("writing the coordinator's price table: %w", err)
	}
	return ReplaceFlag(args, "price-table", local), nil
}

// workloadKinds are what the test bed runs as processes instead (the node
// agents' pods, bound to their nodes, come from the DaemonSet's template:
// identity.go), and what only matters in a real cluster (Services and
// monitors of those pods).
var workloadKinds = []string{"DaemonSet", "Deployment", "PodDisruptionBudget", "Service", "ServiceMonitor", "PodMonitor"}

// TestbedValues is the values file the test bed installs the chart with, in
// the repository (tests/cluster/testbed-values.yaml).
func TestbedValues() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "tests", "cluster", "testbed-values.yaml"), nil
}

// InstallChart renders the chart with o (the CRDs included) and applies
// every object but the workloads with server-side apply, as `helm install`
// (or `helm upgrade`, on a cluster that has it) would; the Queue CRD is
// established when it returns. It is safe to call again with other values:
// that is an upgrade (objects the new rendering drops are not deleted).
func (c *Cluster) InstallChart(ctx context.Context, o ChartOptions) (*Install, error) {
	if o.Namespace == "" {
		o.Namespace = ChartNamespace
	}
	o.IncludeCRDs = true
	objs, err := RenderChart(ctx, o)
	if err != nil {
		return nil, err
	}
	in := &Install{Objects: objs, Namespace: o.Namespace}
	if objs.Find("DaemonSet", "gpufrac-node") != nil {
		if in.Node, err = objs.WorkloadContainer("DaemonSet", "gpufrac-node"); err != nil {
			return nil, err
		}
		if in.NodeConfig, err = objs.ConfigMapData("gpufrac-node-config", "config.yaml"); err != nil {
			return nil, err
		}
	}
	if objs.Find("Deployment", "gpufrac-coordinator") != nil {
		if in.Coordinator, err = objs.WorkloadContainer("Deployment", "gpufrac-coordinator"); err != nil {
			return nil, err
		}
		if objs.Find("ConfigMap", "gpufrac-coordinator-prices") != nil {
			if in.CoordinatorPrices, err = objs.ConfigMapData("gpufrac-coordinator-prices", "prices.yaml"); err != nil {
				return nil, err
			}
		}
	}
	// helm install needs the release namespace to exist (it stores the release there).
	ns, err := DecodeObjects("release namespace", []byte("apiVersion: v1\nkind: Namespace\nmetadata: {name: "+o.Namespace+"}\n"))
	if err != nil {
		return nil, err
	}
	applier := NewApplier(c.Client, c.Dynamic)
	if _, err := applier.ServerSideApply(ctx, "release namespace", ns, ApplyOptions{FieldManager: "helm"}); err != nil {
		return nil, err
	}
	// The admission policies last, once the Queue CRD they take parameters
	// from is established and the reservation namespace can take pods (its
	// default ServiceAccount exists), as installGpufrac's probes need.
	policies := []string{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
	// Hooks are left out: the chart's only one (crd-upgrade.yaml) upgrades
	// the CRD that was just applied from crds/ and is deleted once it
	// succeeded (deployments' TestChartUpgradesCRDsOnTestBed runs it).
	if _, err := applier.ServerSideApply(ctx, "the gpufrac chart", objs.WithoutHooks().Without(append(policies, workloadKinds...)...), ApplyOptions{FieldManager: "helm"}); err != nil {
		return nil, err
	}
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		crd, err := c.Dynamic.Resource(CRDResource()).Get(ctx, v1alpha1.QueueResource+"."+v1alpha1.Group, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		return ConditionTrue(crd, "Established"), nil
	}); err != nil {
		return nil, fmt.Errorf("waiting for the chart's Queue CRD to be established: %w", err)
	}
	if p := objs.OfKind(policies...); len(p) > 0 {
		if err := c.waitDefaultServiceAccount(ctx, api.ReservationNamespace); err != nil {
			return nil, err
		}
		if _, err := applier.ServerSideApply(ctx, "the gpufrac chart's admission policies", p, ApplyOptions{FieldManager: "helm"}); err != nil {
			return nil, err
		}
	}
	c.mu.Lock()
	c.install = in
	c.mu.Unlock()
	return in, nil
}

// Installed returns what the last InstallChart installed (nil before).
func (c *Cluster) Installed() *Install {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.install
}
