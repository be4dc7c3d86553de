package nodeagent

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/enforcement/enforcementtest"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
	"github.com/gpufrac/gpufrac/tests/kubeletsim"
)

// waitValue polls /metrics until series has value want.
func (n *node) waitValue(series string, want float64) {
	n.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var got float64
	for time.Now().Before(deadline) {
		if got = n.metricValue(series); got == want {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	_, body := n.get("/metrics")
	n.t.Fatalf("%s = %v, want %v; metrics:\n%s", series, got, want, grepLines(body, "gpufrac_"))
}

// TestWatchdogStandaloneReportsAndNeverKills runs the real gpufrac-node
// with kill enforcement and no API access: a container process far over
// its 30% limit (a real process, so a wrongful kill would show) is reported
// as unknown - without the API, pod UIDs cannot be tied to PodResources -
// and never killed; the container's limit is exported from PodResources.
func TestWatchdogStandaloneReportsAndNeverKills(t *testing.T) {
	procRoot := filepath.Join(t.TempDir(), "proc")
	n := startNode(t, nodeOptions{
		config:    "version: v1\ndefault:\n  mode: fraction\n  fraction: {enforcement: kill, pollInterval: 100ms, samples: 1}\n",
		extraArgs: []string{"--proc-root=" + procRoot},
	})
	n.waitResource(api.ResourceFraction, "800 healthy units", registered(800))
	n.waitResource(api.ResourceGPU, "8 healthy GPUs", registered(8))
	hog := kubeletsim.PodRef{Namespace: "default", Name: "hog", UID: types.UID("11111111-2222-4333-8444-555555555555")}
	a := n.allocate(hog, api.ResourceFraction, 30)
	gpu, err := resource.GPUOfUnits(a.DeviceIDs)
	if err != nil {
		t.Fatal(err)
	}
	whole := n.allocate(pod("trainer"), api.ResourceGPU, 1).DeviceIDs[0]

	// The container's process: a real one, in the fixture tree under the
	// pod's cgroup with its real start time.
	victim := exec.Command("sleep", "300")
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	ended := make(chan string, 1)
	go func() { _ = victim.Wait(); ended <- victim.ProcessState.String() }()
	t.Cleanup(func() { _ = victim.Process.Kill() })
	pid := uint32(victim.Process.Pid)
	if err := enforcementtest.CopyProc(procRoot, pid, enforcementtest.CgroupContainerdSystemd(hog.UID, enforcementtest.ContainerID("hog/main"))); err != nil {
		t.Fatal(err)
	}
	// A host process on the whole GPU; fixture only, never signalled.
	if err := enforcementtest.WriteProc(procRoot, enforcementtest.Proc{PID: 3_999_999, StartTime: 42, Cgroup: enforcementtest.CgroupHost}); err != nil {
		t.Fatal(err)
	}
	const used, hostUsed = 40 << 30, 2 << 30
	if err := nvidia.WriteMockProcesses(n.stateDir, map[string][]nvidia.Process{
		gpu:   {{PID: pid, UsedBytes: used}},
		whole: {{PID: 3_999_999, UsedBytes: hostUsed}},
	}); err != nil {
		t.Fatal(err)
	}

	n.waitValue(fmt.Sprintf(`gpufrac_gpu_process_memory_used_bytes{gpu_uuid=%q,owner="unknown"}`, gpu), used)
	n.waitValue(fmt.Sprintf(`gpufrac_gpu_process_memory_used_bytes{gpu_uuid=%q,owner="unknown"}`, whole), hostUsed)
	n.waitValue(fmt.Sprintf(`gpufrac_container_gpu_memory_limit_bytes{container="main",gpu_uuid=%q,namespace="default",pod="hog"}`, gpu), 24576<<20)

	// Ten more polls at 100ms, all with the process far over its limit.
	polls := n.metricValue("gpufrac_enforcement_poll_duration_seconds_count")
	n.waitValue("gpufrac_enforcement_poll_duration_seconds_count", polls+10)
	select {
	case state := <-ended:
		t.Fatalf("the container process ended (%s): standalone gpufrac-node must never kill", state)
	default:
	}
	if err := syscall.Kill(int(pid), 0); err != nil {
		t.Fatalf("the container process is gone: %v", err)
	}
	for _, series := range []string{
		`gpufrac_memory_limit_actions_total{action="kill",result="success"}`,
		`gpufrac_memory_limit_violations_total{action="kill"}`,
	} {
		if got := n.metricValue(series); got != 0 {
			t.Errorf("%s = %v, want 0", series, got)
		}
	}
	log := n.log.String()
	for _, want := range []string{
		"No API access: the GPU memory watchdog cannot map processes to pods and only reports",
		"GPU memory held by a process gpufrac does not manage; reporting only",
		fmt.Sprintf("pid=%d", pid),
	} {
		if !strings.Contains(log, want) {
			t.Errorf("the log lacks %q", want)
		}
	}
	if c := strings.Count(log, fmt.Sprintf("reporting only\" gpu=%q pid=%d", gpu, pid)); c != 1 {
		t.Errorf("the unknown process was reported %d times in the log, want once", c)
	}
}
