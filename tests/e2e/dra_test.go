package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/dra"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
	"github.com/gpufrac/gpufrac/tests/builders"
	"github.com/gpufrac/gpufrac/tests/cluster"
)

// draConfig serves nodes labelled for dra through the DRA driver (fraction
// views on every GPU, the watchdog killing), the others through device
// plugins.
const draConfig = `version: v1
default:
  mode: fraction
  fraction: {enforcement: kill, pollInterval: 200ms, samples: 1}
groups:
  - nodeSelector: {` + modeLabel + `: dra}
    mode: dra
`

// draPod is a default-scheduler pod whose container main uses a claim
// from template (the claim entry is named gpu).
func draPod(name, template string) *corev1.Pod {
	return builders.MakePod(name, "default").SchedulerName(corev1.DefaultSchedulerName).CPU("1").Memory("1Gi").
		ClaimTemplate("gpu", template).Obj()
}

// createTemplates creates the ResourceClaimTemplates gpu-30pct (30 % of one
// GPU) and gpu-20gib (20 GiB of one GPU) in default.
func createTemplates(t *testing.T, c *cluster.Cluster) {
	t.Helper()
	for _, tmpl := range []*resourceapi.ResourceClaimTemplate{
		builders.MakeClaim("gpu-30pct", "default").Shares(30).Template(),
		builders.MakeClaim("gpu-20gib", "default").GPUMemory("20Gi").Template(),
		builders.MakeClaim("gpu-whole", "default").WholeGPUs(1).Template(),
	} {
		if _, err := c.Client.ResourceV1().ResourceClaimTemplates("default").Create(t.Context(), tmpl, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// waitDRAPool waits until node's driver published devices devices.
func waitDRAPool(t *testing.T, c *cluster.Cluster, node string, devices int) map[string]resourceapi.Device {
	t.Helper()
	out := map[string]resourceapi.Device{}
	waitFor(t, 60*time.Second, fmt.Sprintf("%s to publish %d DRA devices", node, devices), func(ctx context.Context) (bool, error) {
		slices, err := c.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node + ",spec.driver=" + api.DRADriver})
		if err != nil {
			return false, nil
		}
		clear(out)
		for _, s := range slices.Items {
			for _, d := range s.Spec.Devices {
				out[d.Name] = d
			}
		}
		return len(out) == devices, nil
	})
	return out
}

// podClaim returns the allocated claim of a pod's claim entry gpu.
func podClaim(t *testing.T, c *cluster.Cluster, p *corev1.Pod) *resourceapi.ResourceClaim {
	t.Helper()
	for _, s := range p.Status.ResourceClaimStatuses {
		if s.Name == "gpu" && s.ResourceClaimName != nil {
			claim, err := c.Client.ResourceV1().ResourceClaims(p.Namespace).Get(t.Context(), *s.ResourceClaimName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return claim
		}
	}
	t.Fatalf("pod %s has no claim for entry gpu: %+v", p.Name, p.Status.ResourceClaimStatuses)
	return nil
}

// allocatedDevice is the one device of gpufrac's driver a claim got.
func allocatedDevice(t *testing.T, claim *resourceapi.ResourceClaim) resourceapi.DeviceRequestAllocationResult {
	t.Helper()
	if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("claim %s allocation: %+v", claim.Name, claim.Status.Allocation)
	}
	return claim.Status.Allocation.Devices.Results[0]
}

// TestClaimsThroughKubeScheduler: on a node group in mode dra, kube-scheduler
// places default-scheduler pods with ResourceClaimTemplates for 30 % of a GPU
// and for 20 GiB: three 30 % claims share GPU 0 (gpu-0-shares), the 20 GiB
// claim takes GPU 1 by memory, a whole-GPU claim takes a third GPU; each
// container gets the env and the watchdog limit of a gpufrac.io/gpu-fraction
// container; when a pod goes, its claim is unprepared and its share is free
// again.
func TestClaimsThroughKubeScheduler(t *testing.T) {
	t.Parallel()
	c := startCluster(t, cluster.Options{NodeAgents: &cluster.NodeAgentOptions{Config: draConfig}})
	agent := addModeNode(t, c, "dra-0", "dra")
	devices := waitDRAPool(t, c, "dra-0", 24)
	createTemplates(t, c)

	names := []string{"s1", "s2", "s3", "m20", "whole"}
	for _, p := range []*corev1.Pod{draPod("s1", "gpu-30pct"), draPod("s2", "gpu-30pct"), draPod("s3", "gpu-30pct"), draPod("m20", "gpu-20gib"), draPod("whole", "gpu-whole")} {
		if _, err := c.Client.CoreV1().Pods("default").Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pods := running(t, c, 90*time.Second, names...)

	got := map[string]string{}
	for _, n := range names {
		got[n] = allocatedDevice(t, podClaim(t, c, pods[n])).Device
	}
	want := map[string]string{"s1": "gpu-0-shares", "s2": "gpu-0-shares", "s3": "gpu-0-shares", "m20": "gpu-1-memory", "whole": "gpu-2"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("devices kube-scheduler allocated (-want +got):\n%s", diff)
	}

	gpu0 := nvidia.GPU{UUID: *devices["gpu-0-shares"].Attributes[api.DRAAttrUUID].StringValue, MemoryBytes: uint64(*devices["gpu-0-shares"].Attributes[api.DRAAttrMemoryBytes].IntValue)}
	gpu1 := *devices["gpu-1-memory"].Attributes[api.DRAAttrUUID].StringValue
	wantEnv := resource.SharedResponse(resource.StrategyDeviceSpecs, gpu0, resource.MemoryLimitMiB(gpu0, 30), 30).Envs
	bed := &watchdogBed{agent: agent}
	for _, n := range []string{"s1", "s2", "s3"} {
		env, err := dra.ResolveCDIEnv(agent.CDIDir, agent.Kubelet.ContainerCDIDevices(pods[n].UID, "main"))
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(wantEnv, env); diff != "" {
			t.Errorf("%s: env (-gpufrac.io/gpu-fraction: 30 +claim):\n%s", n, diff)
		}
		bed.waitMetric(t, "gpufrac_container_gpu_memory_limit_bytes", map[string]string{"pod": n, "container": "main", "gpu_uuid": gpu0.UUID}, float64(resource.MemoryLimitMiB(gpu0, 30)<<20))
	}
	bed.waitMetric(t, "gpufrac_container_gpu_memory_limit_bytes", map[string]string{"pod": "m20", "container": "main", "gpu_uuid": gpu1}, 20<<30)

	// A fourth 30 % does not fit GPU 0 (90 held): it takes GPU 3.
	if _, err := c.Client.CoreV1().Pods("default").Create(t.Context(), draPod("s4", "gpu-30pct"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s4 := running(t, c, 60*time.Second, "s4")["s4"]
	if d := allocatedDevice(t, podClaim(t, c, s4)).Device; d != "gpu-3-shares" {
		t.Errorf("a fourth 30 %% claim got %s, want gpu-3-shares", d)
	}
	// When s1 goes, its claim is deallocated and unprepared: a 10 % claim
	// fits GPU 0 again.
	if err := c.Client.CoreV1().Pods("default").Delete(t.Context(), "s1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "s1's claim to be unprepared on dra-0", func(context.Context) (bool, error) {
		for _, pc := range agent.Kubelet.PreparedClaims() {
			for _, u := range pc.Pods {
				if u == pods["s1"].UID {
					return false, nil
				}
			}
		}
		return true, nil
	})
	tmpl := builders.MakeClaim("gpu-10pct", "default").Shares(10).Template()
	if _, err := c.Client.ResourceV1().ResourceClaimTemplates("default").Create(t.Context(), tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.CoreV1().Pods("default").Create(t.Context(), draPod("s10", "gpu-10pct"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s10 := running(t, c, 60*time.Second, "s10")["s10"]
	if d := allocatedDevice(t, podClaim(t, c, s10)).Device; d != "gpu-0-shares" {
		t.Errorf("a 10 %% claim after s1 went got %s, want gpu-0-shares", d)
	}
}
