package deployments_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/gpufrac/gpufrac/tests/cluster"
)

// mount is one volumeMount of gpufrac-node's container, with the host path
// of its volume (Host: "" for a ConfigMap or emptyDir).
type mount struct {
	Name, Path, Host  string
	ReadOnly          bool
	RecursiveReadOnly string
}

// nodeMounts reads gpufrac-node's volumeMounts, with the host paths of
// their hostPath volumes, and counts its hostPath volumes.
func nodeMounts(t *testing.T, objs cluster.Objects) ([]mount, int) {
	t.Helper()
	ds := objs.Find("DaemonSet", "gpufrac-node")
	if ds == nil {
		t.Fatal("no DaemonSet gpufrac-node")
	}
	vs, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "volumes")
	host := map[string]string{}
	for _, v := range vs {
		if p, ok, _ := unstructured.NestedString(v.(map[string]any), "hostPath", "path"); ok {
			host[v.(map[string]any)["name"].(string)] = p
		}
	}
	cs, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
	ms, _, _ := unstructured.NestedSlice(cs[0].(map[string]any), "volumeMounts")
	var out []mount
	for _, m := range ms {
		m := m.(map[string]any)
		ro, _ := m["readOnly"].(bool)
		rro, _ := m["recursiveReadOnly"].(string)
		name := m["name"].(string)
		out = append(out, mount{Name: name, Path: m["mountPath"].(string), Host: host[name], ReadOnly: ro, RecursiveReadOnly: rro})
	}
	return out, len(host)
}

// same is a mount of a host path at the same path.
func same(name, path string, ro bool) mount {
	return mount{Name: name, Path: path, Host: path, ReadOnly: ro}
}

// resourceRules lists "kind/name: resources" of every RBAC rule on
// resource.k8s.io the chart renders.
func resourceRules(objs cluster.Objects) []string {
	var out []string
	for _, r := range objs.OfKind("ClusterRole", "Role") {
		rules, _, _ := unstructured.NestedSlice(r.Object, "rules")
		for _, rule := range rules {
			groups, _, _ := unstructured.NestedStringSlice(rule.(map[string]any), "apiGroups")
			if slices.Contains(groups, "resource.k8s.io") || slices.Contains(groups, "*") {
				res, _, _ := unstructured.NestedStringSlice(rule.(map[string]any), "resources")
				out = append(out, r.GetKind()+"/"+r.GetName()+": "+strings.Join(res, ","))
			}
		}
	}
	return out
}

// TestChartHostAccessPerMode (issue 29): gpufrac-node's host mounts are what
// its mode needs, read-only where it only reads. The NVIDIA toolkit's CDI
// specs are only read (the CDI cache); with dra.enabled the kubelet's plugin
// registry, the driver's directory and dra.cdiDir are read-write (the driver
// creates sockets, its record of prepared claims and per-claim CDI specs
// there); with dra.enabled: false none of them is mounted, both binaries run
// with --dra=false, and neither DeviceClasses nor RBAC on resource.k8s.io
// are rendered. With node.cdiRegeneration the directory of its output is
// read-write (nvidia-ctk writes the spec there), the host's nvidia-ctk and
// the driver root are read-only (the driver root's submounts too), and
// gpufrac-node is given the two nvidia-ctk steps; without it, neither.
func TestChartHostAccessPerMode(t *testing.T) {
	base := []mount{
		same("device-plugins", "/var/lib/kubelet/device-plugins", false),
		same("pod-resources", "/var/lib/kubelet/pod-resources", true),
		{Name: "config", Path: "/etc/gpufrac", ReadOnly: true},
		{Name: "nvidia-all-gpus", Path: "/var/run/nvidia-container-devices/all", Host: "/dev/null", ReadOnly: true},
	}
	draDirs := []mount{
		same("plugins-registry", "/var/lib/kubelet/plugins_registry", false),
		same("dra-plugin", "/var/lib/kubelet/plugins/gpu.gpufrac.io", false),
	}
	regen := func(ctk, root, rro string) []mount {
		return []mount{
			same("cdi-regen-ctk", ctk, true),
			{Name: "cdi-regen-driver-root", Path: "/driver-root", Host: root, ReadOnly: true, RecursiveReadOnly: rro},
			{Name: "cdi-regen-staging", Path: "/run/gpufrac-cdi"},
		}
	}
	const (
		operatorGenerate  = "/usr/local/nvidia/toolkit/nvidia-ctk.real cdi generate --device-name-strategy=uuid --driver-root=/driver-root --nvidia-ctk-path=/usr/local/nvidia/toolkit/nvidia-ctk --output=/run/gpufrac-cdi/nvidia.yaml"
		operatorTransform = "/usr/local/nvidia/toolkit/nvidia-ctk.real cdi transform root --from=/driver-root --to=/run/nvidia/driver --input=/run/gpufrac-cdi/nvidia.yaml --output=/run/gpufrac-cdi/staged.yaml"
		hostGenerate      = "/usr/bin/nvidia-ctk cdi generate --device-name-strategy=uuid --driver-root=/driver-root --nvidia-ctk-path=/usr/bin/nvidia-ctk --output=/run/gpufrac-cdi/nvidia.yaml --dev-root=/driver-root"
		hostTransform     = "/usr/bin/nvidia-ctk cdi transform root --from=/driver-root --to=/ --input=/run/gpufrac-cdi/nvidia.yaml --output=/run/gpufrac-cdi/staged.yaml"
	)
	draFlags := []string{"kubelet-registry-dir", "dra-plugin-dir", "cdi-dir"}
	cases := []struct {
		name    string
		set     []string
		mounts  []mount
		dra     bool
		regen   []string // --cdi-regenerate-command steps
		timeout string
		output  string // --cdi-regenerate-output
	}{
		{name: "default: cdi, DRA on", dra: true,
			mounts: slices.Concat(base, []mount{
				same("cdi-0", "/etc/cdi", true),
				same("cdi-1", "/var/run/cdi", false), // dra.cdiDir: per-claim specs
			}, draDirs)},
		{name: "cdi, DRA off", set: []string{"dra.enabled=false"},
			mounts: slices.Concat(base, []mount{
				same("cdi-0", "/etc/cdi", true),
				same("cdi-1", "/var/run/cdi", true),
			})},
		{name: "cdi, DRA on, its CDI dir apart", set: []string{"dra.cdiDir=/run/gpufrac-cdi"}, dra: true,
			mounts: slices.Concat(base, []mount{
				same("cdi-0", "/etc/cdi", true),
				same("cdi-1", "/var/run/cdi", true),
			}, draDirs, []mount{same("dra-cdi", "/run/gpufrac-cdi", false)})},
		{name: "device-specs, DRA on", set: []string{"node.deviceListStrategy=device-specs"}, dra: true,
			mounts: slices.Concat(base, draDirs, []mount{same("dra-cdi", "/var/run/cdi", false)})},
		{name: "device-specs, DRA off", set: []string{"node.deviceListStrategy=device-specs", "dra.enabled=false"},
			mounts: base},
		{name: "cdi, DRA off, regeneration with the GPU Operator", set: []string{"dra.enabled=false", "node.cdiRegeneration.enabled=true"},
			mounts: slices.Concat(base, []mount{
				same("cdi-0", "/etc/cdi", true),
				same("cdi-1", "/var/run/cdi", false), // nvidia-ctk writes nvidia.yaml
			}, regen("/usr/local/nvidia/toolkit/nvidia-ctk.real", "/run/nvidia/driver", "Enabled")),
			regen: []string{operatorGenerate, operatorTransform}, timeout: "2m", output: "/var/run/cdi/nvidia.yaml"},
		{name: "cdi, DRA on, regeneration of a package install into /etc/cdi", dra: true, set: []string{
			"node.cdiRegeneration.enabled=true", "node.cdiRegeneration.toolkit=host", "node.cdiRegeneration.output=/etc/cdi/nvidia.yaml",
			"node.cdiRegeneration.driverRootRecursiveReadOnly=IfPossible", "node.cdiRegeneration.extraArgs={--dev-root=/driver-root}",
			"node.cdiRegeneration.timeout=5m"},
			mounts: slices.Concat(base, []mount{
				same("cdi-0", "/etc/cdi", false), // nvidia-ctk writes nvidia.yaml
				same("cdi-1", "/var/run/cdi", false),
			}, regen("/usr/bin/nvidia-ctk", "/", "IfPossible"), draDirs),
			regen: []string{hostGenerate, hostTransform}, timeout: "5m", output: "/etc/cdi/nvidia.yaml"},
	}
	for _, h := range helms {
		helm := helmPath(t, h)
		for _, tc := range cases {
			t.Run(h+"/"+tc.name, func(t *testing.T) {
				objs, err := cluster.RenderChart(t.Context(), cluster.ChartOptions{Helm: helm, Set: tc.set, KubeVersion: "1.36.0"})
				if err != nil {
					t.Fatal(err)
				}
				got, hostPaths := nodeMounts(t, objs)
				if diff := cmp.Diff(tc.mounts, got); diff != "" {
					t.Errorf("gpufrac-node's mounts (-want +got):\n%s", diff)
				}
				want := 0
				for _, m := range tc.mounts {
					if m.Host != "" {
						want++
					}
				}
				if hostPaths != want {
					t.Errorf("%d hostPath volumes, want %d, one per mount of a host path", hostPaths, want)
				}
				node, err := objs.WorkloadContainer("DaemonSet", "gpufrac-node")
				if err != nil {
					t.Fatal(err)
				}
				var steps []string
				for _, a := range node.Args {
					if v, ok := strings.CutPrefix(a, "--cdi-regenerate-command="); ok {
						steps = append(steps, v)
					}
				}
				if diff := cmp.Diff(tc.regen, steps); diff != "" {
					t.Errorf("--cdi-regenerate-command steps (-want +got):\n%s", diff)
				}
				if v, _ := cluster.Flag(node.Args, "cdi-regenerate-timeout"); v != tc.timeout {
					t.Errorf("--cdi-regenerate-timeout=%q, want %q", v, tc.timeout)
				}
				// The steps write a staged spec; gpufrac-node installs it
				// where the runtime reads only once it is valid.
				staged, _ := cluster.Flag(node.Args, "cdi-regenerate-staged")
				output, _ := cluster.Flag(node.Args, "cdi-regenerate-output")
				if wantStaged := map[bool]string{true: "/run/gpufrac-cdi/staged.yaml"}[len(tc.regen) > 0]; staged != wantStaged || output != tc.output {
					t.Errorf("--cdi-regenerate-staged=%q --cdi-regenerate-output=%q, want %q and %q", staged, output, wantStaged, tc.output)
				}
				coord, err := objs.WorkloadContainer("Deployment", "gpufrac-coordinator")
				if err != nil {
					t.Fatal(err)
				}
				for _, f := range draFlags {
					if _, ok := cluster.Flag(node.Args, f); ok != tc.dra {
						t.Errorf("gpufrac-node --%s given: %v, want %v", f, ok, tc.dra)
					}
				}
				for name, args := range map[string][]string{"gpufrac-node": node.Args, "gpufrac-coordinator": coord.Args} {
					v, ok := cluster.Flag(args, "dra")
					if tc.dra && ok || !tc.dra && v != "false" {
						t.Errorf("%s --dra=%q (given: %v) with DRA on: %v", name, v, ok, tc.dra)
					}
				}
				rules := resourceRules(objs)
				if tc.dra && len(rules) < 3 || !tc.dra && len(rules) != 0 {
					t.Errorf("RBAC on resource.k8s.io with DRA on %v: %q", tc.dra, rules)
				}
				if n := len(objs.OfKind("DeviceClass")); tc.dra && n == 0 || !tc.dra && n != 0 {
					t.Errorf("%d DeviceClasses with DRA on: %v", n, tc.dra)
				}
			})
		}
	}
}

// TestChartReservationNamespaceOutlivesUninstall (issue 29): helm uninstall
// keeps the reservation namespace (helm.sh/resource-policy: keep), so
// reservations of fractions still running are not deleted with the release;
// reservationNamespace.keepOnUninstall: false lets Helm delete it.
func TestChartReservationNamespaceOutlivesUninstall(t *testing.T) {
	for _, h := range helms {
		helm := helmPath(t, h)
		for _, tc := range []struct {
			set  []string
			want string
		}{
			{want: "keep"},
			{set: []string{"reservationNamespace.keepOnUninstall=false"}, want: ""},
		} {
			objs, err := cluster.RenderChart(t.Context(), cluster.ChartOptions{Helm: helm, Set: tc.set})
			if err != nil {
				t.Fatal(err)
			}
			ns := objs.Find("Namespace", "gpufrac-reservations")
			if ns == nil {
				t.Fatalf("%s %v: no reservation namespace", h, tc.set)
			}
			if got := ns.GetAnnotations()["helm.sh/resource-policy"]; got != tc.want {
				t.Errorf("%s %v: helm.sh/resource-policy %q, want %q", h, tc.set, got, tc.want)
			}
		}
	}
}

// securityContexts reads a workload's pod and first container's
// securityContext.
func securityContexts(t *testing.T, objs cluster.Objects, kind, name string) (pod, container map[string]any) {
	t.Helper()
	w := objs.Find(kind, name)
	if w == nil {
		t.Fatalf("no %s %s", kind, name)
	}
	pod, _, _ = unstructured.NestedMap(w.Object, "spec", "template", "spec", "securityContext")
	cs, _, _ := unstructured.NestedSlice(w.Object, "spec", "template", "spec", "containers")
	container, _, _ = unstructured.NestedMap(cs[0].(map[string]any), "securityContext")
	return pod, container
}

// jsonValue is v through JSON (every number a float64), so that maps decoded
// by different paths compare.
func jsonValue(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestChartSecurityContextOverrides (issue 29): node.podSecurityContext,
// node.securityContext and the coordinator's are merged over the chart's
// defaults key by key (as NVIDIA's and Kueue's charts let admins add
// seLinuxOptions or another UID); without them the defaults are exactly what
// the chart always rendered.
func TestChartSecurityContextOverrides(t *testing.T) {
	nodePod := map[string]any{"runAsUser": int64(0), "runAsNonRoot": false, "seccompProfile": map[string]any{"type": "RuntimeDefault"}}
	nodeCtr := map[string]any{"privileged": false, "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
		"capabilities": map[string]any{"drop": []any{"ALL"}, "add": []any{"KILL"}}}
	coordPod := map[string]any{"runAsNonRoot": true, "runAsUser": int64(65532), "runAsGroup": int64(65532), "seccompProfile": map[string]any{"type": "RuntimeDefault"}}
	coordCtr := map[string]any{"runAsNonRoot": true, "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
		"capabilities": map[string]any{"drop": []any{"ALL"}}}
	with := func(m map[string]any, k string, v any) map[string]any {
		out := map[string]any{}
		for kk, vv := range m {
			out[kk] = vv
		}
		out[k] = v
		return out
	}
	selinux := map[string]any{"type": "spc_t"}
	cases := []struct {
		name                                 string
		setJSON                              []string
		nodePod, nodeCtr, coordPod, coordCtr map[string]any
	}{
		{name: "defaults", nodePod: nodePod, nodeCtr: nodeCtr, coordPod: coordPod, coordCtr: coordCtr},
		{name: "overrides", setJSON: []string{
			`node.podSecurityContext={"seLinuxOptions":{"type":"spc_t"},"seccompProfile":{"type":"Localhost","localhostProfile":"gpufrac.json"}}`,
			`node.securityContext={"readOnlyRootFilesystem":false}`,
			`coordinator.podSecurityContext={"runAsUser":1000700000,"runAsGroup":1000700000}`,
			`coordinator.securityContext={"seLinuxOptions":{"type":"spc_t"}}`,
		},
			nodePod:  with(with(nodePod, "seLinuxOptions", selinux), "seccompProfile", map[string]any{"type": "Localhost", "localhostProfile": "gpufrac.json"}),
			nodeCtr:  with(nodeCtr, "readOnlyRootFilesystem", false),
			coordPod: with(with(coordPod, "runAsUser", int64(1000700000)), "runAsGroup", int64(1000700000)),
			coordCtr: with(coordCtr, "seLinuxOptions", selinux)},
	}
	for _, h := range helms {
		helm := helmPath(t, h)
		for _, tc := range cases {
			objs, err := cluster.RenderChart(t.Context(), cluster.ChartOptions{Helm: helm, SetJSON: tc.setJSON})
			if err != nil {
				t.Fatal(err)
			}
			pod, ctr := securityContexts(t, objs, "DaemonSet", "gpufrac-node")
			if diff := cmp.Diff(jsonValue(t, tc.nodePod), jsonValue(t, pod)); diff != "" {
				t.Errorf("%s %s: gpufrac-node pod securityContext (-want +got):\n%s", h, tc.name, diff)
			}
			if diff := cmp.Diff(jsonValue(t, tc.nodeCtr), jsonValue(t, ctr)); diff != "" {
				t.Errorf("%s %s: gpufrac-node container securityContext (-want +got):\n%s", h, tc.name, diff)
			}
			pod, ctr = securityContexts(t, objs, "Deployment", "gpufrac-coordinator")
			if diff := cmp.Diff(jsonValue(t, tc.coordPod), jsonValue(t, pod)); diff != "" {
				t.Errorf("%s %s: gpufrac-coordinator pod securityContext (-want +got):\n%s", h, tc.name, diff)
			}
			if diff := cmp.Diff(jsonValue(t, tc.coordCtr), jsonValue(t, ctr)); diff != "" {
				t.Errorf("%s %s: gpufrac-coordinator container securityContext (-want +got):\n%s", h, tc.name, diff)
			}
		}
	}
}

// TestChartExistingConfigMap (issue 29): node.existingConfigMap mounts the
// admin's ConfigMap instead of rendering gpufrac-node-config (gpufrac-node
// reads the config only through the mount, never by name), and the chart's
// checks of node.config, which it cannot see then, do not refuse the
// install; gpufrac-node checks the config itself.
func TestChartExistingConfigMap(t *testing.T) {
	configVolume := func(objs cluster.Objects) string {
		ds := objs.Find("DaemonSet", "gpufrac-node")
		vs, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "volumes")
		for _, v := range vs {
			if v.(map[string]any)["name"] == "config" {
				name, _, _ := unstructured.NestedString(v.(map[string]any), "configMap", "name")
				return name
			}
		}
		return ""
	}
	for _, h := range helms {
		helm := helmPath(t, h)
		objs, err := cluster.RenderChart(t.Context(), cluster.ChartOptions{Helm: helm})
		if err != nil {
			t.Fatal(err)
		}
		if got := configVolume(objs); got != "gpufrac-node-config" || objs.Find("ConfigMap", "gpufrac-node-config") == nil {
			t.Errorf("%s: default config volume %q, want the chart's ConfigMap gpufrac-node-config, rendered", h, got)
		}
		// The default node.config kills, which needs KILL: not checked
		// against a ConfigMap the chart does not render.
		objs, err = cluster.RenderChart(t.Context(), cluster.ChartOptions{Helm: helm, Set: []string{"node.existingConfigMap=gitops-gpu-config"},
			SetJSON: []string{"node.capabilities=[]"}})
		if err != nil {
			t.Fatal(err)
		}
		if got := configVolume(objs); got != "gitops-gpu-config" {
			t.Errorf("%s: config volume %q, want gitops-gpu-config", h, got)
		}
		if cm := objs.Find("ConfigMap", "gpufrac-node-config"); cm != nil {
			t.Errorf("%s: gpufrac-node-config rendered beside node.existingConfigMap", h)
		}
		c, err := objs.WorkloadContainer("DaemonSet", "gpufrac-node")
		if err != nil {
			t.Fatal(err)
		}
		if v, _ := cluster.Flag(c.Args, "config"); v != "/etc/gpufrac/config.yaml" {
			t.Errorf("%s: --config=%s", h, v)
		}
	}
}

// TestChartTenantReader: the ClusterRole tenants need for `kubectl gpufrac
// queues` reads Queues and nothing else; it is bound only to the groups
// named, and not made when turned off.
func TestChartTenantReader(t *testing.T) {
	for _, h := range helms {
		helm := helmPath(t, h)
		for _, tc := range []struct {
			set     []string
			role    bool
			subject []string
		}{
			{role: true},
			{set: []string{"tenantReader.groups={team-a,team-b}"}, role: true, subject: []string{"team-a", "team-b"}},
			{set: []string{"tenantReader.create=false", "tenantReader.groups={team-a}"}},
		} {
			objs, err := cluster.RenderChart(t.Context(), cluster.ChartOptions{Helm: helm, Set: tc.set})
			if err != nil {
				t.Fatal(err)
			}
			role := objs.Find("ClusterRole", "gpufrac-tenant-reader")
			if (role != nil) != tc.role {
				t.Fatalf("%s %v: ClusterRole made %v, want %v", h, tc.set, role != nil, tc.role)
			}
			if role != nil {
				rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
				want := []any{map[string]any{"apiGroups": []any{"gpufrac.io"}, "resources": []any{"queues"}, "verbs": []any{"get", "list", "watch"}}}
				if diff := cmp.Diff(want, rules); diff != "" {
					t.Errorf("%s %v: rules (-want +got):\n%s", h, tc.set, diff)
				}
			}
			binding := objs.Find("ClusterRoleBinding", "gpufrac-tenant-reader")
			var got []string
			if binding != nil {
				subjects, _, _ := unstructured.NestedSlice(binding.Object, "subjects")
				for _, s := range subjects {
					m := s.(map[string]any)
					if m["kind"] != "Group" {
						t.Errorf("%s %v: subject %v, want groups only", h, tc.set, m)
					}
					got = append(got, m["name"].(string))
				}
			}
			if diff := cmp.Diff(tc.subject, got); diff != "" {
				t.Errorf("%s %v: bound groups (-want +got):\n%s", h, tc.set, diff)
			}
		}
	}
}
