// Package tools_test checks the tool wrapper modules of tests/tools against the
// project's own go.mod.
package tools_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/semver"
)

// A build is what one `go build` of tools.mk (or the project's vet and tests) compiles.
type build struct {
	name  string
	dir   string // relative to the repository root
	args  []string
	group string // the Kubernetes libraries it shares; "" for none
}

// The builds of tools.mk and the project. Go compiles a dependency once for all of
// them (the build cache) only when the package and everything under it are the same
// module versions: aligned versions let a cold CI run compile golang.org/x/sys,
// gRPC, protobuf, client-go and the rest once instead of once per tool.
// The Kubernetes build is not among them: it is the system under test and keeps
// exactly the versions k8s.io/kubernetes pins (TestKubernetesIsBuiltAsReleased).
var builds = []build{
	{"project", ".", []string{"-test", "./..."}, "k8s-1.36"},
	{"kwok", "tests/tools/kwok", []string{"sigs.k8s.io/kwok/cmd/kwok"}, "k8s-1.36"},
	{"helm3", "tests/tools/helm3", []string{"helm.sh/helm/v3/cmd/helm"}, "k8s-1.37"},
	{"helm4", "tests/tools/helm4", []string{"helm.sh/helm/v4/cmd/helm"}, "k8s-1.37"},
	{"containerd", "tests/tools/containerd", []string{"-tags", "no_btrfs", "github.com/containerd/containerd/v2/cmd/containerd",
		"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2", "github.com/containerd/containerd/v2/cmd/ctr"}, "k8s-1.37"},
	// Karpenter v1.14 and Kueue v0.17 are both on the Kubernetes 1.35 libraries and
	// controller-runtime v0.23: Karpenter's wrapper takes Kueue's patch releases, so
	// that Karpenter, built after Kueue, finds nearly all of its packages compiled.
	{"karpenter", "tests/tools/karpenter", []string{"github.com/gpufrac/gpufrac/tests/tools/karpenter/kwokdra"}, "k8s-1.35"},
	{"kueue", "tests/tools/kueue", []string{"sigs.k8s.io/kueue/cmd/kueue"}, "k8s-1.35"},
	// The KubeRay operator v1.6 is on the Kubernetes 1.35 libraries too, but on
	// controller-runtime v0.22 (its webhooks do not compile with v0.23's builder):
	// its wrapper takes Kueue's versions of everything else, controller-runtime its own.
	{"kuberay", "tests/tools/kuberay", []string{"github.com/ray-project/kuberay/ray-operator"}, "k8s-1.35"},
	{"etcd", "tests/tools/etcd", []string{"go.etcd.io/etcd/server/v3"}, ""},
	{"promql", "tests/tools/promql", []string{"."}, ""},
	{"actionlint", "tests/tools/actionlint", []string{"github.com/rhysd/actionlint/cmd/actionlint"}, ""},
}

// kubernetesBuild is the control plane and kubelet of the test bed.
var kubernetesBuild = build{"kubernetes", "tests/tools/kubernetes", []string{"k8s.io/kubernetes/cmd/kube-apiserver",
	"k8s.io/kubernetes/cmd/kube-scheduler", "k8s.io/kubernetes/cmd/kube-controller-manager", "k8s.io/kubernetes/cmd/kubelet"}, ""}

// ownPins are modules a tool keeps at its own release's version: etcd's storage
// engine is part of what etcd's release was tested with; the KubeRay operator is
// the release tools.mk pins (KUBERAY_VERSION), whatever version of KubeRay's API
// types Kueue's release compiles, on the controller-runtime its release compiles with.
var ownPins = map[string]map[string]bool{
	"etcd":    {"go.etcd.io/bbolt": true},
	"kuberay": {"github.com/ray-project/kuberay/ray-operator": true, "sigs.k8s.io/controller-runtime": true},
	"kueue":   {"github.com/ray-project/kuberay/ray-operator": true},
}

// kubernetesTied are the modules whose version goes with the Kubernetes libraries' own:
// they must agree only among builds on the same Kubernetes libraries.
func kubernetesTied(module string) bool {
	for _, p := range []string{"k8s.io/", "sigs.k8s.io/", "github.com/go-openapi/", "github.com/google/gnostic-models",
		"github.com/emicklei/go-restful"} {
		if strings.HasPrefix(module, p) {
			return true
		}
	}
	return false
}

// modulesOf lists the module versions of the packages a build compiles.
func modulesOf(t *testing.T, root string, b build) map[string]string {
	// The version built: a replace's, when the module is replaced.
	args := append([]string{"list", "-deps", "-f",
		"{{with .Module}}{{.Path}} {{with .Replace}}{{.Version}}{{else}}{{.Version}}{{end}}{{end}}"}, b.args...)
	cmd := exec.Command("go", args...)
	cmd.Dir = filepath.Join(root, b.dir)
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOTOOLCHAIN=local", "GOWORK=off")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Errorf("%s: go %s: %v\n%s", b.name, strings.Join(args, " "), err, stderr.String())
		return nil
	}
	mods := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		path, version, ok := strings.Cut(line, " ")
		// The main module has no version.
		if !ok || version == "" {
			continue
		}
		mods[path] = version
	}
	return mods
}

// TestToolModulesShareDependencyVersions fails when a tool wrapper or the project
// resolves a shared dependency to another version than the rest: that dependency,
// and every package above it, would then compile again in each cold CI run
// (docs/benchmarks-history.md, cold CI). The fix it prints is a `go get` in the modules behind.
func TestToolModulesShareDependencyVersions(t *testing.T) {
	if testing.Short() {
		t.Skip("lists every tool's build (downloads their modules on a cold cache)")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatalf("the go command is needed: %v", err)
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	lists := make([]map[string]string, len(builds))
	var wg sync.WaitGroup
	for i, b := range builds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lists[i] = modulesOf(t, root, b)
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}

	// module -> the scope it must agree in -> build -> version
	seen := map[string]map[string]map[string]string{}
	for i, b := range builds {
		for m, v := range lists[i] {
			if ownPins[b.name][m] {
				continue
			}
			scope := "all"
			if kubernetesTied(m) {
				if b.group == "" {
					continue
				}
				scope = b.group
			}
			if seen[m] == nil {
				seen[m] = map[string]map[string]string{}
			}
			if seen[m][scope] == nil {
				seen[m][scope] = map[string]string{}
			}
			seen[m][scope][b.name] = v
		}
	}
	var problems []string
	for m, scopes := range seen {
		for _, byBuild := range scopes {
			newest := ""
			for _, v := range byBuild {
				if newest == "" || semver.Compare(v, newest) > 0 {
					newest = v
				}
			}
			var behind []string
			for name, v := range byBuild {
				if v != newest {
					behind = append(behind, fmt.Sprintf("%s (%s)", name, v))
				}
			}
			if len(behind) > 0 {
				sort.Strings(behind)
				problems = append(problems, fmt.Sprintf("%s: %s in the newest; go get %s@%s in %s",
					m, newest, m, newest, strings.Join(behind, ", ")))
			}
		}
	}
	sort.Strings(problems)
	for _, p := range problems {
		t.Error(p)
	}
}

// TestKubernetesIsBuiltAsReleased: the test bed's kube-apiserver, scheduler,
// controller manager and kubelet are built from exactly the module versions
// k8s.io/kubernetes pins, as its release is, never from versions raised for the
// build cache's sake (a newer go-openapi, say, changes CRD validation).
func TestKubernetesIsBuiltAsReleased(t *testing.T) {
	if testing.Short() {
		t.Skip("lists the Kubernetes build (downloads its modules on a cold cache)")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	built := modulesOf(t, root, kubernetesBuild)
	k8sVersion := built["k8s.io/kubernetes"]
	if t.Failed() || k8sVersion == "" {
		t.Fatalf("the Kubernetes build does not list k8s.io/kubernetes: %v", built)
	}
	cmd := exec.Command("go", "mod", "download", "-json", "k8s.io/kubernetes@"+k8sVersion)
	cmd.Dir = filepath.Join(root, kubernetesBuild.dir)
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOTOOLCHAIN=local", "GOWORK=off")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go mod download k8s.io/kubernetes@%s: %v", k8sVersion, err)
	}
	var dl struct{ GoMod string }
	if err := json.Unmarshal(out, &dl); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(dl.GoMod)
	if err != nil {
		t.Fatal(err)
	}
	f, err := modfile.ParseLax(dl.GoMod, data, nil)
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, r := range f.Require {
		v, ok := built[r.Mod.Path]
		// v0.0.0: a staging module, which the wrapper replaces with its release of the same tag.
		if !ok || r.Mod.Version == "v0.0.0" {
			continue
		}
		checked++
		if v != r.Mod.Version {
			t.Errorf("%s: built at %s, k8s.io/kubernetes %s pins %s (tests/tools/kubernetes/go.mod)", r.Mod.Path, v, k8sVersion, r.Mod.Version)
		}
	}
	if checked < 50 {
		t.Errorf("only %d of the modules k8s.io/kubernetes pins are in its build: the listing is wrong", checked)
	}
}
