package main

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// TestLinksNoClientset keeps gpufrac-node small in memory: its idle RSS is
// mostly its executable's pages, and client-go's typed clientset (and the
// informer factory, tools/record, and k8s.io/dynamic-resource-allocation's
// kubeletplugin and resourceslice helpers, which take a clientset) links and
// registers every API group: idle RSS 28-32 MiB without, 40-46 MiB with
// (docs/benchmarks.md, "Idle node agent"). The agent's API clients are
// pods.NewClient and draplugin.NewClient, over schemes of the groups below.
func TestLinksNoClientset(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out, err := exec.Command(goBin, "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "github.com/gpufrac/gpufrac/deviceplugin/draplugin") {
		t.Fatalf("go list -deps lists no draplugin: is this the node agent? %d packages", len(deps))
	}
	forbidden := []string{
		"k8s.io/client-go/kubernetes",
		"k8s.io/client-go/informers",
		"k8s.io/client-go/tools/record",
		"k8s.io/dynamic-resource-allocation/kubeletplugin",
		"k8s.io/dynamic-resource-allocation/resourceslice",
	}
	allowedGroups := []string{"k8s.io/api/core/v1", "k8s.io/api/policy/v1", "k8s.io/api/resource/v1"}
	for _, d := range deps {
		for _, f := range forbidden {
			if d == f || strings.HasPrefix(d, f+"/") {
				t.Errorf("gpufrac-node links %s (forbidden: %s)", d, f)
			}
		}
		if strings.HasPrefix(d, "k8s.io/api/") && !slices.Contains(allowedGroups, d) {
			t.Errorf("gpufrac-node links API group package %s: add it to a REST client's scheme only if the agent uses it (and to this list)", d)
		}
	}
}
