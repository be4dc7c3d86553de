package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/gpufrac/gpufrac/coordinator/podrequest"
)

// TestMain lets a test run this binary's main() in a child process.
func TestMain(m *testing.M) {
	if os.Getenv("GPUFRAC_COORDINATOR_RUN_MAIN") == "1" {
		os.Args = append([]string{os.Args[0]}, strings.Fields(os.Getenv("GPUFRAC_COORDINATOR_ARGS"))...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func runMain(t *testing.T, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "GPUFRAC_COORDINATOR_RUN_MAIN=1", "GPUFRAC_COORDINATOR_ARGS="+strings.Join(args, " "))
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(out), ee.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(out), 0
}

// TestNonPreemptiblePriorityHasOneDefault: the flag's default is the
// library's (podrequest.DefaultNonPreemptiblePriority), not a second number.
func TestNonPreemptiblePriorityHasOneDefault(t *testing.T) {
	out, _ := runMain(t, "-h")
	m := regexp.MustCompile(`(?m)-non-preemptible-priority int\n.*\(default (-?\d+)\)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no default for --non-preemptible-priority in the usage:\n%s", out)
	}
	if want := fmt.Sprint(podrequest.DefaultNonPreemptiblePriority); m[1] != want {
		t.Errorf("--non-preemptible-priority defaults to %s, the scheduler's default is %s", m[1], want)
	}
}

// TestNonPreemptiblePriorityOutOfRangeIsRefused: a value no pod priority
// can have is an error at start, not a silent wrap-around.
func TestNonPreemptiblePriorityOutOfRangeIsRefused(t *testing.T) {
	out, code := runMain(t, "--non-preemptible-priority=4294967296", "--kubeconfig=/nonexistent")
	if code != 2 || !strings.Contains(out, "outside the range of a pod priority") {
		t.Errorf("exit %d, output:\n%s\nwant exit 2 naming the range", code, out)
	}
}

// TestBadPriceTableIsRefused: a price table that does not parse (a typo in
// a field) stops the coordinator at start with the reason, and a missing
// file too; it never runs as if every GPU cost 1.
func TestBadPriceTableIsRefused(t *testing.T) {
	dir := t.TempDir()
	bad := dir + "/prices.yaml"
	if err := os.WriteFile(bad, []byte("instanceTypes: [{name: a, gpu: 1, price: 1}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string]string{bad: `unknown field \"gpu\"`, dir + "/missing.yaml": "no such file"} {
		out, code := runMain(t, "--price-table="+file, "--kubeconfig=/nonexistent")
		if code != 2 || !strings.Contains(out, "Invalid --price-table") || !strings.Contains(out, want) {
			t.Errorf("--price-table=%s: exit %d, output:\n%s\nwant exit 2 saying %q", file, code, out, want)
		}
	}
}

// TestNegativeNewNodeSettleIsRefused: a negative --new-node-settle is an
// error at start, not silently the same as 0 (binding on a node the moment
// it loses a NoExecute taint); the chart's schema refuses it too.
func TestNegativeNewNodeSettleIsRefused(t *testing.T) {
	out, code := runMain(t, "--new-node-settle=-100ms", "--kubeconfig=/nonexistent")
	if code != 2 || !strings.Contains(out, "--new-node-settle must not be negative") {
		t.Errorf("exit %d, output:\n%s\nwant exit 2 saying it must not be negative", code, out)
	}
}

// TestNegativePlaceBudgetIsRefused: a negative --place-budget is an error at
// start (0 is the way to place without a budget); the chart's schema refuses
// it too.
func TestNegativePlaceBudgetIsRefused(t *testing.T) {
	out, code := runMain(t, "--place-budget=-1s", "--kubeconfig=/nonexistent")
	if code != 2 || !strings.Contains(out, "--place-budget must not be negative") {
		t.Errorf("exit %d, output:\n%s\nwant exit 2 saying it must not be negative", code, out)
	}
}

// TestBadGPUCountLabelIsRefused: a --gpu-count-label that is no label key
// would make every placeholder invalid (the API server refuses its
// affinity), so no capacity would ever be asked for: an error at start.
func TestBadGPUCountLabelIsRefused(t *testing.T) {
	out, code := runMain(t, "--gpu-count-label=not/a/label", "--kubeconfig=/nonexistent")
	if code != 2 || !strings.Contains(out, "--gpu-count-label is not a label key") {
		t.Errorf("exit %d, output:\n%s\nwant exit 2 saying it is not a label key", code, out)
	}
}

// TestApplyCRDsRefusesOtherObjects: --apply-crds applies only gpufrac's
// CRDs; a directory with anything else stops it with the reason, before it
// talks to the API server.
func TestApplyCRDsRefusesOtherObjects(t *testing.T) {
	dir := t.TempDir()
	crd := "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: widgets.example.com}\nspec: {group: example.com, names: {plural: widgets}}\n"
	if err := os.WriteFile(dir+"/widgets.yaml", []byte(crd), 0o600); err != nil {
		t.Fatal(err)
	}
	out, code := runMain(t, "--apply-crds="+dir, "--kubeconfig=/nonexistent")
	if code != 1 || !strings.Contains(out, "Applying the CustomResourceDefinitions failed") || !strings.Contains(out, "not gpufrac's gpufrac.io") {
		t.Errorf("exit %d, output:\n%s\nwant exit 1 naming the foreign group", code, out)
	}
}
