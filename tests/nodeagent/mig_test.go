package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
	"github.com/gpufrac/gpufrac/tests/kubeletsim"
)

// withdrawn holds once a resource advertises no healthy device.
func withdrawn(st kubeletsim.ResourceState) bool { return healthyCount(st) == 0 }

func TestTimeslicedReplicas(t *testing.T) {
	n := startNode(t, nodeOptions{config: `version: v1
default:
  mode: timeslice
  timeslice: {replicas: 4, failRequestsGreaterThanOne: true}
`})
	st := n.waitResource(api.DefaultTimesliceResource, "32 replicas (4 on each of 8 GPUs)", registered(32))
	perGPU := map[string]int{}
	for _, d := range st.Devices {
		g, _, err := resource.ParseUnitID(d.ID)
		if err != nil {
			t.Fatalf("replica %q: %v", d.ID, err)
		}
		perGPU[g]++
	}
	if len(perGPU) != 8 {
		t.Errorf("replicas on %d GPUs, want 8", len(perGPU))
	}
	for g, k := range perGPU {
		if k != 4 {
			t.Errorf("GPU %s has %d replicas, want 4", g, k)
		}
	}
	for _, other := range []string{api.ResourceGPU, api.ResourceFraction} {
		if _, ok := n.kubelet.Resource(other); ok {
			t.Errorf("%s is served on a time-sliced node", other)
		}
	}

	// One replica: one GPU, a quarter of its 80 GiB.
	a := n.allocate(pod("ts-1"), api.DefaultTimesliceResource, 1)
	if got := a.Response.Envs[api.EnvVisibleDevices]; got != "void" {
		t.Errorf("replica: %s = %q, want void", api.EnvVisibleDevices, got)
	}
	if got := a.Response.Envs[api.EnvMemoryLimitMiB]; got != "20480" {
		t.Errorf("%s = %q, want 20480 (81920 MiB / 4)", api.EnvMemoryLimitMiB, got)
	}
	if got := len(a.Response.Devices); got != 4 {
		t.Errorf("replica got %d device specs, want 4 (one GPU and the control devices)", got)
	}
	// The next replica goes to another, idle GPU.
	b := n.allocate(pod("ts-2"), api.DefaultTimesliceResource, 1)
	ga, _, _ := resource.ParseUnitID(a.DeviceIDs[0])
	gb, _, _ := resource.ParseUnitID(b.DeviceIDs[0])
	if ga == gb {
		t.Errorf("two replicas share GPU %s while 7 GPUs are idle", ga)
	}
	// Two replicas are refused, with the reason.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err := n.kubelet.Allocate(ctx, pod("ts-many"), "main", api.DefaultTimesliceResource, 2)
	var pe *kubeletsim.PluginError
	if !errors.As(err, &pe) || !strings.Contains(pe.Message(), "requests for more than one time-sliced replica are refused") {
		t.Fatalf("2-replica request: error = %v, want the plugin's refusal", err)
	}
	n.waitMetrics(fmt.Sprintf("gpufrac_timeslice_replicas_allocated{gpu_uuid=%q,resource=%q} 1", ga, api.DefaultTimesliceResource))
	n.waitMetrics(fmt.Sprintf("gpufrac_timeslice_replicas{gpu_uuid=%q,resource=%q} 4", gb, api.DefaultTimesliceResource))
}

func TestMixedNodeServesMIGAndFractions(t *testing.T) {
	specDir := t.TempDir()
	n := startNode(t, nodeOptions{
		quietPeriod: time.Minute,
		extraArgs:   []string{"--device-list-strategy=cdi", "--cdi-spec-dirs=" + specDir},
		config: `version: v1
default:
  mode: fraction
  mig: {strategy: mixed, layout: all-1g.10gb}
  gpus: [{indices: "0-3", mode: mig}]
`})
	mig := n.waitResource("nvidia.com/mig-1g.10gb", "28 MIG devices (7 on each of GPUs 0-3)", registered(28))
	whole := n.waitResource(api.ResourceGPU, "4 whole GPUs (4-7)", registered(4))
	n.waitResource(api.ResourceFraction, "400 units (GPUs 4-7)", registered(400))
	wholeIDs := map[string]bool{}
	for _, d := range whole.Devices {
		wholeIDs[d.ID] = true
	}
	for _, d := range mig.Devices {
		if !strings.HasPrefix(d.ID, "MIG-") {
			t.Fatalf("MIG device ID %q is not a MIG UUID", d.ID)
		}
	}
	// The NVIDIA toolkit's CDI spec for this layout, so the CDI names resolve.
	n.waitMetrics(fmt.Sprintf("mig_uuid=%q", mig.Devices[27].ID))
	n.writeCDISpec(specDir, "dgxh100")
	n.waitMetrics("gpufrac_cdi_devices_unresolved 0")

	// A MIG device allocation names the MIG device, never its parent GPU.
	a := n.allocate(pod("mig-1"), "nvidia.com/mig-1g.10gb", 1)
	if len(a.Response.CdiDevices) != 1 || a.Response.CdiDevices[0].Name != "nvidia.com/gpu="+a.DeviceIDs[0] {
		t.Errorf("MIG allocation CDI devices = %v, want nvidia.com/gpu=%s", a.Response.CdiDevices, a.DeviceIDs[0])
	}
	// No memory limit (the hardware isolates MIG memory); only
	// NVIDIA_VISIBLE_DEVICES=void, as in every response.
	if diff := cmp.Diff(map[string]string{api.EnvVisibleDevices: "void"}, a.Response.Envs); diff != "" {
		t.Errorf("MIG allocation envs (-want +got):\n%s", diff)
	}
	parent := parentOf(t, n, a.DeviceIDs[0])
	if wholeIDs[parent] {
		t.Errorf("GPU %s serves MIG devices and is also served whole", parent)
	}
	n.waitMetrics(fmt.Sprintf(`gpufrac_mig_device_allocated{gpu_uuid=%q,mig_uuid=%q,profile="1g.10gb"} 1`, parent, a.DeviceIDs[0]))

	// An Xid on GPU 0 makes its 7 MIG devices unhealthy, and only those.
	if err := nvidia.WriteMockXid(n.stateDir, "0", 79); err != nil {
		t.Fatal(err)
	}
	n.waitResource("nvidia.com/mig-1g.10gb", "21 healthy MIG devices after an Xid on GPU 0", registered(21))
	n.waitResource(api.ResourceGPU, "4 healthy whole GPUs", registered(4))
}

// parentOf finds the GPU of a MIG device from the gpufrac_mig_device_memory_total_bytes series.
func parentOf(t *testing.T, n *node, migUUID string) string {
	t.Helper()
	body := n.waitMetrics(fmt.Sprintf("mig_uuid=%q", migUUID))
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, "gpufrac_mig_device_memory_total_bytes{") && strings.Contains(l, fmt.Sprintf("mig_uuid=%q", migUUID)) {
			_, rest, _ := strings.Cut(l, `gpu_uuid="`)
			g, _, _ := strings.Cut(rest, `"`)
			return g
		}
	}
	t.Fatalf("no memory series for MIG device %s", migUUID)
	return ""
}

func TestMIGSingleStrategyServesMIGDevicesAsGPUs(t *testing.T) {
	n := startNode(t, nodeOptions{model: "dgxa100", config: `version: v1
default:
  mode: mig
  mig: {strategy: single, layout: all-3g.20gb}
`})
	st := n.waitResource(api.ResourceGPU, "16 MIG devices (2 on each A100)", registered(16))
	for _, d := range st.Devices {
		if !strings.HasPrefix(d.ID, "MIG-") {
			t.Fatalf("single strategy serves %q as %s, want MIG UUIDs", d.ID, api.ResourceGPU)
		}
	}
	if _, ok := n.kubelet.Resource(api.ResourceFraction); ok {
		t.Error("fractions are served on an all-MIG node")
	}
}

func TestConfigEditSwitchesFractionToMIGLive(t *testing.T) {
	n := startNode(t, nodeOptions{config: fractionConfig})
	n.waitResource(api.ResourceFraction, "800 units", registered(800))
	n.waitResource(api.ResourceGPU, "8 whole GPUs", registered(8))

	n.writeConfig("version: v1\ndefault:\n  mode: mig\n  mig: {strategy: mixed, layout: all-3g.40gb}\n")
	n.waitResource("nvidia.com/mig-3g.40gb", "16 MIG devices", registered(16))
	n.waitResource(api.ResourceFraction, "withdrawn", withdrawn)
	n.waitResource(api.ResourceGPU, "withdrawn (every GPU is in MIG mode)", withdrawn)
	n.waitMetrics(`gpufrac_mig_operations_total{operation="enable_mig",result="success"} 8`)
	n.waitMetrics(`gpufrac_mig_operations_total{operation="create_instance",result="success"} 16`)

	// And back: MIG instances destroyed, MIG off, whole GPUs and fractions again.
	n.writeConfig(fractionConfig)
	n.waitResource(api.ResourceFraction, "800 units again", registered(800))
	n.waitResource(api.ResourceGPU, "8 whole GPUs again", registered(8))
	n.waitResource("nvidia.com/mig-3g.40gb", "withdrawn", withdrawn)
	n.waitMetrics(`gpufrac_mig_operations_total{operation="disable_mig",result="success"} 8`)
}

func TestMIGLayoutChangeWaitsForAllocatedDevice(t *testing.T) {
	const before = "version: v1\ndefault:\n  mode: fraction\n  mig: {layout: all-3g.40gb}\n  gpus: [{indices: \"0\", mode: mig}]\n"
	specDir := t.TempDir()
	n := startNode(t, nodeOptions{config: before, extraArgs: []string{"--device-list-strategy=cdi", "--cdi-spec-dirs=" + specDir}})
	st := n.waitResource("nvidia.com/mig-3g.40gb", "2 MIG devices on GPU 0", registered(2))
	// The NVIDIA toolkit's CDI spec for this layout.
	n.waitMetrics(fmt.Sprintf("mig_uuid=%q", st.Devices[1].ID))
	n.writeCDISpec(specDir, "dgxh100")
	n.waitMetrics("gpufrac_cdi_devices_unresolved 0")
	p := pod("holds-a-3g")
	n.allocate(p, "nvidia.com/mig-3g.40gb", 1)

	// The new layout waits: GPU 0 keeps its instances and stops serving
	// devices so it can drain.
	n.writeConfig(strings.Replace(before, "all-3g.40gb", "all-1g.10gb", 1))
	n.waitMetrics(`reason="DevicesAllocated"} 1`)
	n.waitResource("nvidia.com/mig-3g.40gb", "withdrawn while the change is pending", withdrawn)
	if st, ok := n.kubelet.Resource("nvidia.com/mig-1g.10gb"); ok && healthyCount(st) > 0 {
		t.Fatalf("new layout applied while a MIG device is allocated: %d 1g.10gb devices", healthyCount(st))
	}
	// The pod ends: the change goes through on the manager's next check.
	if n.kubelet.Release(p.UID) == 0 {
		t.Fatal("the pod held no allocation")
	}
	n.waitResource("nvidia.com/mig-1g.10gb", "7 MIG devices after the GPU drained", registered(7))
	n.waitResource(api.ResourceFraction, "700 units on GPUs 1-7 throughout", registered(700))
	if body := n.waitMetrics("gpufrac_mig_operations_total"); strings.Contains(body, `gpufrac_mig_layout_pending{`) {
		t.Errorf("layout still pending after it was applied:\n%s", grepLines(body, "gpufrac_mig_layout_pending"))
	}
}

func TestMIGModeChangeRefusedOnABusyGPUIsReported(t *testing.T) {
	n := startNode(t, nodeOptions{config: fractionConfig})
	whole := n.waitResource(api.ResourceGPU, "8 whole GPUs", registered(8))
	busy := whole.Devices[0].ID
	// A process outside Kubernetes keeps GPU busy: MIG mode cannot be activated there.
	if err := nvidia.WriteMockProcesses(n.stateDir, map[string][]nvidia.Process{busy: {{PID: 4242, UsedBytes: 1 << 30}}}); err != nil {
		t.Fatal(err)
	}
	n.waitMetrics(fmt.Sprintf("gpufrac_gpu_memory_used_bytes{gpu_uuid=%q} 1.073741824e+09", busy))
	n.writeConfig("version: v1\ndefault:\n  mode: mig\n  mig: {layout: all-7g.80gb}\n")
	n.waitResource("nvidia.com/mig-7g.80gb", "7 MIG devices (the idle GPUs)", registered(7))
	n.waitMetrics(fmt.Sprintf(`gpufrac_mig_layout_pending{gpu_uuid=%q,reason="InUse"} 1`, busy))
	if mode := n.metricValue(`gpufrac_mig_operations_total{operation="enable_mig",result="error"}`); mode != 1 {
		t.Errorf("failed enable_mig operations = %v, want 1 (tried once, not retried in a loop)", mode)
	}
	// The log is read once the process has exited: the harness's buffer is
	// written by the process's output copier until then.
	n.stop()
	if !strings.Contains(n.log.String(), "left it as found") {
		t.Error("the log does not say the MIG mode was left as found")
	}
}

func TestMIGConfigThatTheGPUsCannotServeIsRefused(t *testing.T) {
	n := startNode(t, nodeOptions{model: "dgxa100", config: fractionConfig})
	n.waitResource(api.ResourceFraction, "800 units", registered(800))
	before := n.metricValue(`gpufrac_config_reloads_total{result="rejected"}`)
	bad := []string{
		// 3g.40gb is an H100 profile; an A100 40GB offers 3g.20gb.
		"version: v1\ndefault:\n  mode: fraction\n  gpus: [{indices: \"0-3\", mode: mig, migLayout: all-3g.40gb}]\n",
		// Two 4g instances do not fit on one GPU.
		"version: v1\ndefault:\n  mode: mig\n  mig: {layout: \"4g.20gb,4g.20gb\"}\n",
	}
	for i, cfg := range bad {
		n.writeConfig(cfg)
		deadline := time.Now().Add(10 * time.Second)
		for n.metricValue(`gpufrac_config_reloads_total{result="rejected"}`)-before != float64(i+1) {
			if time.Now().After(deadline) {
				t.Fatalf("config %d was not rejected", i)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if st, _ := n.kubelet.Resource(api.ResourceFraction); healthyCount(st) != 800 {
		t.Errorf("fraction units = %d after the refused configs, want 800 (the last good config)", healthyCount(st))
	}
	for name := range n.kubelet.Resources() {
		if strings.HasPrefix(name, api.MIGResourcePrefix) {
			t.Errorf("a refused layout was applied: %s is served", name)
		}
	}
	n.stop()
	log := n.log.String()
	for _, want := range []string{
		`layout \"all-3g.40gb\": unknown profile 3g.40gb for this GPU model (it offers 1g.5gb, 1g.5gb+me, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb)`,
		`layout \"4g.20gb,4g.20gb\": 2 instances of 4g.20gb, but the GPU allows at most 1`,
	} {
		if !strings.Contains(log, want) {
			t.Errorf("the log does not explain the refusal with %q", want)
		}
	}
}
