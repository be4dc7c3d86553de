// Package nodeagent runs the real gpufrac-node binary on mock GPUs against
// the kubelet simulator, over the real device-plugin and PodResources gRPC APIs.
package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
	"github.com/gpufrac/gpufrac/tests/kubeletsim"
)

func pod(name string) kubeletsim.PodRef {
	return kubeletsim.PodRef{Namespace: "default", Name: name, UID: types.UID("uid-" + name)}
}

func registered(n int) func(kubeletsim.ResourceState) bool {
	return func(st kubeletsim.ResourceState) bool { return st.Connected && healthyCount(st) == n }
}

func (n *node) allocate(p kubeletsim.PodRef, res string, count int) *kubeletsim.Allocation {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(n.t.Context(), 10*time.Second)
	defer cancel()
	a, err := n.kubelet.Allocate(ctx, p, "main", res, count)
	if err != nil {
		n.t.Fatalf("allocating %d %s to %s: %v", count, res, p, err)
	}
	return a
}

func TestRegistersWholeAndFractionResources(t *testing.T) {
	n := startNode(t, nodeOptions{})
	whole := n.waitResource(api.ResourceGPU, "8 healthy GPUs", registered(8))
	frac := n.waitResource(api.ResourceFraction, "800 healthy units", registered(800))
	if !whole.Options.GetGetPreferredAllocationAvailable() || !frac.Options.GetGetPreferredAllocationAvailable() {
		t.Error("plugins do not offer GetPreferredAllocation")
	}
	for _, d := range frac.Devices {
		if _, _, err := resource.ParseUnitID(d.ID); err != nil {
			t.Fatalf("fraction device %q: %v", d.ID, err)
		}
	}
	// /readyz turns ready once both are registered; /metrics shows the GPUs.
	deadline := time.Now().Add(5 * time.Second)
	for code, _ := n.get("/readyz"); code != 200; code, _ = n.get("/readyz") {
		if time.Now().After(deadline) {
			t.Fatalf("/readyz = %d after registration", code)
		}
		time.Sleep(20 * time.Millisecond)
	}
	body := n.waitMetrics("gpufrac_gpu_memory_total_bytes")
	if got := strings.Count(body, "\ngpufrac_gpu_memory_total_bytes{"); got != 8 {
		t.Errorf("gpufrac_gpu_memory_total_bytes has %d series, want 8", got)
	}
	for _, m := range []string{"gpufrac_gpu_memory_used_bytes{", "gpufrac_gpu_utilization_ratio{", "gpufrac_gpu_fraction_units_allocated{", "gpufrac_gpu_healthy{", "gpufrac_build_info{"} {
		if !strings.Contains(body, m) {
			t.Errorf("/metrics lacks %s", m)
		}
	}
	if code, _ := n.get("/healthz"); code != 200 {
		t.Errorf("/healthz = %d", code)
	}
}

func TestWholeAndFractionAllocations(t *testing.T) {
	n := startNode(t, nodeOptions{})
	n.waitResource(api.ResourceGPU, "8 healthy GPUs", registered(8))
	n.waitResource(api.ResourceFraction, "800 healthy units", registered(800))

	// Whole GPUs: two distinct UUIDs, device nodes, no NVIDIA_VISIBLE_DEVICES.
	w := n.allocate(pod("trainer"), api.ResourceGPU, 2)
	if len(w.DeviceIDs) != 2 || w.DeviceIDs[0] == w.DeviceIDs[1] || !strings.HasPrefix(w.DeviceIDs[0], "GPU-") {
		t.Fatalf("whole allocation devices = %v", w.DeviceIDs)
	}
	var paths []string
	for _, d := range w.Response.Devices {
		paths = append(paths, d.HostPath)
	}
	for _, want := range []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"} {
		if !strings.Contains(strings.Join(paths, " "), want) {
			t.Errorf("whole allocation lacks %s: %v", want, paths)
		}
	}
	// NVIDIA_VISIBLE_DEVICES=void: the image's own ENV cannot select GPUs.
	if got := w.Response.Envs[api.EnvVisibleDevices]; got != "void" {
		t.Errorf("whole allocation: %s = %q, want void", api.EnvVisibleDevices, got)
	}

	// A 30-unit fraction: exactly one GPU, the 30% memory limit of an 80 GiB H100.
	f := n.allocate(pod("infer-30"), api.ResourceFraction, 30)
	gpu, err := resource.GPUOfUnits(f.DeviceIDs)
	if err != nil || len(f.DeviceIDs) != 30 {
		t.Fatalf("30-unit fraction got %d units: %v", len(f.DeviceIDs), err)
	}
	if got := f.Response.Envs[api.EnvMemoryLimitMiB]; got != "24576" {
		t.Errorf("%s = %q, want 24576", api.EnvMemoryLimitMiB, got)
	}
	for k, v := range f.Response.Envs {
		if strings.HasPrefix(k, "CUDA_MPS_") {
			t.Errorf("fraction: %s=%s set, but no MPS daemon applies it", k, v)
		}
	}
	if got := f.Response.Envs[api.EnvVisibleDevices]; got != "void" {
		t.Errorf("fraction: %s = %q, want void", api.EnvVisibleDevices, got)
	}
	if got := len(f.Response.Devices); got != 4 { // /dev/nvidiaN + 3 control devices
		t.Errorf("fraction got %d device specs, want 4 (one GPU)", got)
	}
	if gpu == w.DeviceIDs[0] || gpu == w.DeviceIDs[1] {
		t.Errorf("fraction landed on %s, a GPU held whole by another pod", gpu)
	}

	// Best fit: a 70 goes beside the 30 (fullest GPU with room), not on a fresh GPU.
	c := n.allocate(pod("seventy"), api.ResourceFraction, 70)
	if gc, _ := resource.GPUOfUnits(c.DeviceIDs); gc != gpu {
		t.Errorf("70-unit fraction went to %s, want best fit %s beside the 30", gc, gpu)
	}

	// Two 60-unit requests cannot share a GPU.
	a := n.allocate(pod("sixty-a"), api.ResourceFraction, 60)
	b := n.allocate(pod("sixty-b"), api.ResourceFraction, 60)
	ga, _ := resource.GPUOfUnits(a.DeviceIDs)
	gb, _ := resource.GPUOfUnits(b.DeviceIDs)
	if ga == gb {
		t.Errorf("two 60-unit fractions share GPU %s", ga)
	}
	// PodResources reports what was allocated.
	allocs := n.kubelet.Allocations()
	if len(allocs) != 5 {
		t.Errorf("PodResources-backed allocations = %d, want 5", len(allocs))
	}
	n.waitMetrics(fmt.Sprintf("gpufrac_gpu_fraction_units_allocated{gpu_uuid=%q} 100", gpu))
}

func TestBadFractionRequestsFailWithAReason(t *testing.T) {
	n := startNode(t, nodeOptions{})
	n.waitResource(api.ResourceFraction, "800 healthy units", registered(800))
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err := n.kubelet.Allocate(ctx, pod("too-big"), "main", api.ResourceFraction, 150)
	var pe *kubeletsim.PluginError
	if !errors.As(err, &pe) || !strings.Contains(pe.Message(), "at most 100 units") {
		t.Fatalf("150-unit request error = %v, want the plugin's 100-unit message", err)
	}
	// Eight 60s take one GPU each: 320 units stay free, but no GPU has 50.
	for i := 0; i < 8; i++ {
		n.allocate(pod(fmt.Sprintf("sixty-%d", i)), api.ResourceFraction, 60)
	}
	_, err = n.kubelet.Allocate(ctx, pod("fifty"), "main", api.ResourceFraction, 50)
	if !errors.As(err, &pe) || !strings.Contains(pe.Message(), "no GPU on this node has 50 free fraction units") {
		t.Fatalf("50-unit request on a fragmented node: error = %v, want the plugin's one-GPU message", err)
	}
}

func TestXidMarksGPUUnhealthyAndItRecovers(t *testing.T) {
	n := startNode(t, nodeOptions{quietPeriod: 2 * time.Second})
	whole := n.waitResource(api.ResourceGPU, "8 healthy GPUs", registered(8))
	n.waitResource(api.ResourceFraction, "800 healthy units", registered(800))
	victim := whole.Devices[3].ID

	if err := nvidia.WriteMockXid(n.stateDir, victim, 79); err != nil {
		t.Fatal(err)
	}
	frac := n.waitResource(api.ResourceFraction, "700 healthy units", registered(700))
	for _, d := range frac.Devices {
		g, _, _ := resource.ParseUnitID(d.ID)
		if (g == victim) != (d.Health == "Unhealthy") {
			t.Fatalf("unit %s health %s; only %s's units should be unhealthy", d.ID, d.Health, victim)
		}
	}
	whole = n.waitResource(api.ResourceGPU, "7 healthy GPUs", registered(7))
	for _, d := range whole.Devices {
		if (d.ID == victim) != (d.Health == "Unhealthy") {
			t.Fatalf("GPU %s health %s after Xid on %s", d.ID, d.Health, victim)
		}
	}
	n.waitMetrics(fmt.Sprintf("gpufrac_gpu_xid_errors_total{critical=\"true\",gpu_uuid=%q,xid=\"79\"} 1", victim))

	// An application Xid on another GPU changes nothing.
	if err := nvidia.WriteMockXid(n.stateDir, whole.Devices[5].ID, 13); err != nil {
		t.Fatal(err)
	}
	n.waitMetrics("xid=\"13\"} 1")
	// After the quiet period the GPU is healthy again.
	n.waitResource(api.ResourceGPU, "8 healthy GPUs again", registered(8))
	n.waitResource(api.ResourceFraction, "800 healthy units again", registered(800))
}

func TestReRegistersAfterKubeletRestart(t *testing.T) {
	n := startNode(t, nodeOptions{})
	n.waitResource(api.ResourceGPU, "registered", registered(8))
	n.waitResource(api.ResourceFraction, "registered", registered(800))
	before := n.kubelet.Registrations(api.ResourceGPU)

	// The clock starts when the restarted kubelet serves kubelet.sock again:
	// from then on re-registration is the plugin's job.
	if err := n.kubelet.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	n.waitResource(api.ResourceGPU, "re-registered", func(st kubeletsim.ResourceState) bool {
		return st.Registrations > before && st.Connected && healthyCount(st) == 8
	})
	n.waitResource(api.ResourceFraction, "re-registered", func(st kubeletsim.ResourceState) bool {
		return st.Connected && healthyCount(st) == 800
	})
	if took := time.Since(start); took > time.Second {
		t.Errorf("re-registration took %s, want under 1s", took)
	}
	// Allocation works through the new endpoints.
	n.allocate(pod("after-restart"), api.ResourceFraction, 25)
}

const fractionConfig = `version: v1
default:
  mode: fraction
`

func TestConfigEditIsAppliedLive(t *testing.T) {
	n := startNode(t, nodeOptions{config: fractionConfig})
	n.waitResource(api.ResourceFraction, "800 units", registered(800))
	before := n.metricValue(`gpufrac_config_reloads_total{result="success"}`)

	// GPUs 0-3 become exclusive: 400 units remain, all 8 whole GPUs stay.
	n.writeConfig("version: v1\ndefault:\n  mode: fraction\n  gpus: [{indices: \"0-3\", mode: exclusive}]\n")
	n.waitResource(api.ResourceFraction, "400 units after the edit", registered(400))
	n.waitResource(api.ResourceGPU, "8 whole GPUs", registered(8))

	// The whole node becomes exclusive: the fraction resource is withdrawn.
	n.writeConfig("version: v1\ndefault:\n  mode: exclusive\n")
	n.waitResource(api.ResourceFraction, "withdrawn", func(st kubeletsim.ResourceState) bool { return healthyCount(st) == 0 })
	n.waitResource(api.ResourceGPU, "8 whole GPUs", registered(8))

	// And back: the fraction resource registers again.
	n.writeConfig(fractionConfig)
	n.waitResource(api.ResourceFraction, "800 units again", registered(800))
	if got := n.metricValue(`gpufrac_config_reloads_total{result="success"}`) - before; got != 3 {
		t.Errorf("successful reloads = %v, want 3", got)
	}
}

func TestBrokenConfigIsRefusedAndTheOldOneStays(t *testing.T) {
	n := startNode(t, nodeOptions{config: fractionConfig})
	n.waitResource(api.ResourceFraction, "800 units", registered(800))
	before := n.metricValue(`gpufrac_config_reloads_total{result="rejected"}`)

	for i, bad := range []string{
		"version: v1\ndefault:\n  mode: frac\n",                                // unknown mode
		"version: v1\ndefault: {mode: [fraction\n",                             // not YAML
		"version: v1\ndefault:\n  mode: mig\n",                                 // valid, but not served by this build
		"version: v1\ndefault:\n  gpus: [{indices: \"9\", mode: exclusive}]\n", // GPU 9 does not exist
	} {
		n.writeConfig(bad)
		// Each bad config is read and refused before the next is written:
		// writes close together may be read as one (the watcher debounces),
		// so a count over all of them would assert a timing, not a rule.
		deadline := time.Now().Add(10 * time.Second)
		for n.metricValue(`gpufrac_config_reloads_total{result="rejected"}`)-before < float64(i+1) {
			if time.Now().After(deadline) {
				t.Fatalf("after bad config %q: rejected reloads = %v, want at least %d", bad, n.metricValue(`gpufrac_config_reloads_total{result="rejected"}`)-before, i+1)
			}
			time.Sleep(20 * time.Millisecond)
		}
		st, _ := n.kubelet.Resource(api.ResourceFraction)
		if healthyCount(st) != 800 || !st.Connected {
			t.Fatalf("after bad config %q the fraction resource has %d healthy units (connected %v), want 800", bad, healthyCount(st), st.Connected)
		}
	}
	if !strings.Contains(n.log.String(), "Config rejected; keeping the last good config") {
		t.Error("the log does not say the config was rejected")
	}
	// A good edit after the bad ones is taken.
	n.writeConfig("version: v1\ndefault:\n  mode: exclusive\n")
	n.waitResource(api.ResourceFraction, "withdrawn", func(st kubeletsim.ResourceState) bool { return healthyCount(st) == 0 })
}
