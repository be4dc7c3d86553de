package cluster

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
)

// StartForTest starts a cluster for t and registers its teardown with t.Cleanup, so it
// stops on success, failure and panic alike. The harness logs go to t.Log. It fails
// the test (never skips it) when the tools are missing: run `make tools`. Callers that
// need a cluster should skip under testing.Short() themselves.
//
// On success the cluster's directory is removed; on failure it is kept and the test
// log names every component's log file.
func StartForTest(t testing.TB, opts Options) *Cluster {
	t.Helper()
	logger, _ := ktesting.NewTestContext(t)
	// t.Context is cancelled just before the cleanups run, which starts the teardown
	// early; the cleanup below waits for it to finish.
	ctx := klog.NewContext(t.Context(), logger)
	began := time.Now()
	c, err := Start(ctx, opts)
	if err != nil {
		t.Fatalf("starting local cluster: %v", err)
	}
	t.Logf("local cluster up in %s: %s (kubeconfig %s)", time.Since(began).Round(time.Millisecond), c.Dir, c.KubeconfigPath)
	t.Cleanup(func() {
		hwm := c.MemoryHighWater()
		stopBegan := time.Now()
		if err := c.Stop(); err != nil {
			t.Errorf("stopping local cluster: %v", err)
		}
		t.Logf("local cluster stopped in %s; peak RSS %s", time.Since(stopBegan).Round(time.Millisecond), formatRSS(hwm))
		if !t.Failed() {
			if err := os.RemoveAll(c.Dir); err != nil {
				t.Errorf("removing cluster dir: %v", err)
			}
			return
		}
		t.Logf("cluster dir kept: %s", c.Dir)
		for _, p := range c.Processes() {
			t.Logf("  %s (pid %d) log: %s", p.Name, p.PID, p.LogPath)
		}
	})
	return c
}

// formatRSS renders peak RSS per component, largest first, plus the total.
func formatRSS(hwm map[string]int64) string {
	names := make([]string, 0, len(hwm))
	var total int64
	for name, b := range hwm {
		names = append(names, name)
		total += b
	}
	sort.Slice(names, func(i, j int) bool { return hwm[names[i]] > hwm[names[j]] })
	var out strings.Builder
	for _, name := range names {
		fmt.Fprintf(&out, "%s=%dMiB ", name, hwm[name]>>20)
	}
	fmt.Fprintf(&out, "total=%dMiB", total>>20)
	return out.String()
}
