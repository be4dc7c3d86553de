package main

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// TestLinksTheUpstreamDRAHelpers: mode dra runs on
// k8s.io/dynamic-resource-allocation's kubeletplugin and resourceslice
// helpers, not on a fork of them. The fork (deviceplugin/draplugin) existed
// only to keep client-go's typed clientset, which registers every API group
// at init, out of the binary for an idle RSS under 40 MiB; issue 27 raised
// the target to 64 MiB and replaced the fork with the helpers
// (docs/benchmarks.md, "Idle node agent", measures it).
func TestLinksTheUpstreamDRAHelpers(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out, err := exec.Command(goBin, "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	for _, want := range []string{
		"github.com/gpufrac/gpufrac/deviceplugin/agent",
		"k8s.io/dynamic-resource-allocation/kubeletplugin",
		"k8s.io/dynamic-resource-allocation/resourceslice",
	} {
		if !slices.Contains(deps, want) {
			t.Errorf("gpufrac-node does not link %s (%d packages)", want, len(deps))
		}
	}
	for _, d := range deps {
		if strings.HasPrefix(d, "github.com/gpufrac/gpufrac/deviceplugin/draplugin") {
			t.Errorf("gpufrac-node links %s, the fork issue 27 removed", d)
		}
	}
}
