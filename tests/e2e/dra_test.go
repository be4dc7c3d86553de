package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
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
// and for 20 GiB: three 30 % claims share one GPU (its percent view), the
// 20 GiB claim takes another by memory, a whole-GPU claim a third; each
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
	// kube-scheduler takes the pods in the order their claims show up, so
	// which of GPUs 0-2 each kind lands on varies from run to run; what
	// does not: the three 30 % claims share one GPU's percent view, the
	// 20 GiB claim takes another GPU's memory view, the whole GPU a third,
	// and first fit keeps them on GPUs 0, 1 and 2.
	sharesDev, memDev, wholeDev := got["s1"], got["m20"], got["whole"]
	sharesGPU, memGPU, wholeGPU := strings.TrimSuffix(sharesDev, "-shares"), strings.TrimSuffix(memDev, "-memory"), wholeDev
	if got["s2"] != sharesDev || got["s3"] != sharesDev || sharesGPU == sharesDev || memGPU == memDev ||
		!cmp.Equal([]string{"gpu-0", "gpu-1", "gpu-2"}, slices.Sorted(slices.Values([]string{sharesGPU, memGPU, wholeGPU}))) {
		t.Fatalf("devices kube-scheduler allocated: %v; want s1-s3 on one gpu-N-shares, m20 on a gpu-M-memory, whole on a gpu-K, {N, M, K} = {0, 1, 2}", got)
	}
	t.Logf("devices kube-scheduler allocated: %v", got)

	gpu0 := nvidia.GPU{UUID: *devices[sharesDev].Attributes[api.DRAAttrUUID].StringValue, MemoryBytes: uint64(*devices[sharesDev].Attributes[api.DRAAttrMemoryBytes].IntValue)}
	gpu1 := *devices[memDev].Attributes[api.DRAAttrUUID].StringValue
	wantEnv := resource.SharedResponse(resource.StrategyDeviceSpecs, gpu0, resource.MemoryLimitMiB(gpu0, 30)).Envs
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

	// A fourth 30 % does not fit the shared GPU (90 held): it takes GPU 3.
	if _, err := c.Client.CoreV1().Pods("default").Create(t.Context(), draPod("s4", "gpu-30pct"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s4 := running(t, c, 60*time.Second, "s4")["s4"]
	if d := allocatedDevice(t, podClaim(t, c, s4)).Device; d != "gpu-3-shares" {
		t.Errorf("a fourth 30 %% claim got %s, want gpu-3-shares", d)
	}
	// When s1 goes, its claim is deallocated and unprepared: a 10 % claim
	// fits the shared GPU again.
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
	if d := allocatedDevice(t, podClaim(t, c, s10)).Device; d != sharesDev {
		t.Errorf("a 10 %% claim after s1 went got %s, want %s", d, sharesDev)
	}
}

// coordClaimPod is a pod of gpufrac-scheduler in queue whose container main
// uses a claim from template.
func coordClaimPod(name, queue, template string) *corev1.Pod {
	return pod(name, queue).SchedulerName(api.SchedulerName).ClaimTemplate("gpu", template).Obj()
}

func createPods(t *testing.T, c *cluster.Cluster, pods ...*corev1.Pod) {
	t.Helper()
	for _, p := range pods {
		if _, err := c.Client.CoreV1().Pods(p.Namespace).Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating pod %s: %v", p.Name, err)
		}
	}
}

// TestCoordinatorAllocatesClaims: gpufrac-coordinator schedules its own
// pods with claims on a node group in mode dra, allocating the claims with
// the structured allocator on the node and GPU its placement chose: three
// 30 % claims go where placement puts them, each on one GPU (and the third
// of a queue limited to 0.6 GPUs is OverLimit: claims are charged in GPU
// terms), a gang of two whole-GPU claims is bound
// together, the claims are allocated, reserved and finalized as
// kube-scheduler writes them, and the containers get the fraction env.
func TestCoordinatorAllocatesClaims(t *testing.T) {
	t.Parallel()
	c := startCluster(t, cluster.Options{NodeAgents: &cluster.NodeAgentOptions{Config: draConfig}})
	buildBinary(t, "gpufrac-coordinator")
	agent := addModeNode(t, c, "dra-0", "dra")
	devices := waitDRAPool(t, c, "dra-0", 24)
	createTemplates(t, c)
	applyYAML(t, c, queuesYAML(map[string]string{"team-a": "8"}))
	applyYAML(t, c, []byte("apiVersion: gpufrac.io/v1alpha1\nkind: Queue\nmetadata: {name: team-b}\nspec:\n  namespaces: [\"*\"]\n  resources:\n    gpu: {quota: \"0.6\", limit: \"0.6\"}\n"))
	startCoordinator(t, c, "c1", "--leader-elect=false")

	createPods(t, c,
		coordClaimPod("a1", "team-a", "gpu-30pct"), coordClaimPod("a2", "team-a", "gpu-30pct"),
		coordClaimPod("b1", "team-b", "gpu-30pct"), coordClaimPod("b2", "team-b", "gpu-30pct"), coordClaimPod("b3", "team-b", "gpu-30pct"),
	)
	gang := func(name string) *corev1.Pod {
		return pod(name, "team-a").SchedulerName(api.SchedulerName).PodGroup("g").MinMember(2).ClaimTemplate("gpu", "gpu-whole").Obj()
	}
	createPods(t, c, gang("g1"), gang("g2"))
	pods := running(t, c, 90*time.Second, "a1", "a2", "b1", "b2", "g1", "g2")

	// Each claim: allocated on the GPU the coordinator's placement chose
	// (the pod's gpufrac.io/gpu), finalized and reserved for its pod.
	gpuOf := func(n string) (string, resourceapi.DeviceRequestAllocationResult) {
		claim := podClaim(t, c, pods[n])
		if !slicesContainsFinalizer(claim.Finalizers) || len(claim.Status.ReservedFor) != 1 || claim.Status.ReservedFor[0].UID != pods[n].UID {
			t.Errorf("%s's claim: finalizers %v, reservedFor %v", n, claim.Finalizers, claim.Status.ReservedFor)
		}
		d := allocatedDevice(t, claim)
		return *devices[d.Device].Attributes[api.DRAAttrUUID].StringValue, d
	}
	held := map[string]int64{} // GPU -> shares
	for _, n := range []string{"a1", "a2", "b1", "b2"} {
		gpu, d := gpuOf(n)
		q := d.ConsumedCapacity[api.DRACapacityShares]
		if !strings.HasSuffix(d.Device, "-shares") || q.Value() != 30 {
			t.Errorf("%s: device %s consumed %v, want 30 shares of a shares view", n, d.Device, d.ConsumedCapacity)
		}
		if planned := pods[n].Annotations[api.AnnotationGPU]; planned != gpu {
			t.Errorf("%s: claim on GPU %s, placement chose %s", n, gpu, planned)
		}
		held[gpu] += q.Value()
	}
	for gpu, n := range held {
		if n > 100 {
			t.Errorf("GPU %s holds %d shares", gpu, n)
		}
	}
	g1, _ := gpuOf("g1")
	g2, _ := gpuOf("g2")
	if g1 == g2 || held[g1] > 0 || held[g2] > 0 {
		t.Errorf("the gang's whole-GPU claims: GPUs %s and %s (shares held there: %d, %d)", g1, g2, held[g1], held[g2])
	}
	// The third 30 % of team-b (limit 0.6 GPUs) waits OverLimit: claims
	// are charged in GPU terms.
	waitFor(t, 30*time.Second, "b3 OverLimit", func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods("default").Get(ctx, "b3", metav1.GetOptions{})
		return err == nil && p.Spec.NodeName == "" && scheduledReason(p) == api.ReasonOverLimit, nil
	})
	waitFor(t, 30*time.Second, "team-b charged 0.6 GPUs", func(ctx context.Context) (bool, error) {
		return queueGPU(ctx, c, "team-b") == 600, nil
	})

	// What the containers see: the fraction env of 30 %.
	uuid := *devices["gpu-0-shares"].Attributes[api.DRAAttrUUID].StringValue
	gpu0 := nvidia.GPU{UUID: uuid, MemoryBytes: uint64(*devices["gpu-0-shares"].Attributes[api.DRAAttrMemoryBytes].IntValue)}
	env, err := dra.ResolveCDIEnv(agent.CDIDir, agent.Kubelet.ContainerCDIDevices(pods["a1"].UID, "main"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := env[api.EnvMemoryLimitMiB], resource.SharedResponse(resource.StrategyDeviceSpecs, gpu0, resource.MemoryLimitMiB(gpu0, 30)).Envs[api.EnvMemoryLimitMiB]; got != want {
		t.Errorf("a1's %s = %s, want %s", api.EnvMemoryLimitMiB, got, want)
	}
}

func slicesContainsFinalizer(fs []string) bool {
	for _, f := range fs {
		if f == resourceapi.Finalizer {
			return true
		}
	}
	return false
}

// TestExtendedResourcesOnDRANodes is "the same request, either way": on a
// node group in mode dra (no device plugin, so no nvidia.com/gpu or
// gpufrac.io/gpu-fraction in the node's allocatable),
//
//   - gpufrac-coordinator serves gpufrac.io/gpu-fraction: 30 and
//     nvidia.com/gpu: 1 by writing the pod's extended-resource claim (30
//     shares of one GPU; one whole GPU) and its extendedResourceClaimStatus:
//     the container gets the same env as on a device-plugin node;
//   - kube-scheduler serves nvidia.com/gpu: 1 of a default-scheduler pod
//     through the chart's optional class mapping (dra.extendedResourceClass);
//   - a default-scheduler pod asking gpufrac.io/gpu-fraction is refused at
//     admission with the reason (the policies; without them kube-scheduler
//     would ask 30 devices: TestKubeSchedulerCannotServeFractionsAsExtendedResources).
func TestExtendedResourcesOnDRANodes(t *testing.T) {
	t.Parallel()
	c := startCluster(t, cluster.Options{NodeAgents: &cluster.NodeAgentOptions{Config: draConfig}})
	buildBinary(t, "gpufrac-coordinator")
	agent := addModeNode(t, c, "dra-0", "dra")
	devices := waitDRAPool(t, c, "dra-0", 24)
	applyYAML(t, c, queuesYAML(map[string]string{"team-a": "8"}))
	// The chart's optional class mapping nvidia.com/gpu (an upgrade of the
	// test bed's installation with dra.extendedResourceClass=true).
	values, err := cluster.TestbedValues()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.InstallChart(t.Context(), cluster.ChartOptions{ValuesFiles: []string{values}, Set: []string{"dra.extendedResourceClass=true"}}); err != nil {
		t.Fatal(err)
	}
	startCoordinator(t, c, "c1", "--leader-elect=false")

	createPods(t, c,
		pod("frac", "team-a").SchedulerName(api.SchedulerName).Fraction(30).Obj(),
		pod("whole", "team-a").SchedulerName(api.SchedulerName).GPUs(1).Obj(),
		builders.MakePod("default-whole", "default").SchedulerName(corev1.DefaultSchedulerName).CPU("1").GPUs(1).Obj(),
	)
	pods := running(t, c, 90*time.Second, "frac", "whole", "default-whole")
	claimOf := func(n string) *resourceapi.ResourceClaim {
		s := pods[n].Status.ExtendedResourceClaimStatus
		if s == nil {
			t.Fatalf("%s has no extendedResourceClaimStatus", n)
		}
		claim, err := c.Client.ResourceV1().ResourceClaims("default").Get(t.Context(), s.ResourceClaimName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return claim
	}
	fracClaim := claimOf("frac")
	r := allocatedDevice(t, fracClaim)
	if q := r.ConsumedCapacity[api.DRACapacityShares]; !strings.HasSuffix(r.Device, "-shares") || q.Value() != 30 {
		t.Errorf("frac's claim: device %s consumed %v, want 30 shares", r.Device, r.ConsumedCapacity)
	}
	gpu := nvidia.GPU{UUID: *devices[r.Device].Attributes[api.DRAAttrUUID].StringValue, MemoryBytes: uint64(*devices[r.Device].Attributes[api.DRAAttrMemoryBytes].IntValue)}
	env, err := dra.ResolveCDIEnv(agent.CDIDir, agent.Kubelet.ContainerCDIDevices(pods["frac"].UID, "main"))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(resource.SharedResponse(resource.StrategyDeviceSpecs, gpu, resource.MemoryLimitMiB(gpu, 30)).Envs, env); diff != "" {
		t.Errorf("frac's env (-device plugin +claim):\n%s", diff)
	}
	for _, n := range []string{"whole", "default-whole"} {
		r := allocatedDevice(t, claimOf(n))
		if _, view, _ := api.ParseDRADeviceName(r.Device); view != api.DRAViewWhole {
			t.Errorf("%s's claim got %s, want a whole GPU", n, r.Device)
		}
	}

	// A default-scheduler fraction: refused at admission, with the way out.
	_, err = c.Client.CoreV1().Pods("default").Create(t.Context(),
		builders.MakePod("default-frac", "default").SchedulerName(corev1.DefaultSchedulerName).Fraction(30).Obj(), metav1.CreateOptions{})
	if !cluster.RefusedBy(err, "gpufrac-scheduling") || !strings.Contains(err.Error(), "placed by gpufrac-coordinator") {
		t.Errorf("a default-scheduler fraction: %v, want the scheduling policy's refusal", err)
	}
}

// TestKubeSchedulerCannotServeFractionsAsExtendedResources shows why no
// class maps gpufrac.io/gpu-fraction: with such a mapping (here, on a test
// bed without gpufrac's admission policies) kube-scheduler asks 30 devices
// of the class for gpufrac.io/gpu-fraction: 30 and never schedules the pod,
// although a GPU is free.
func TestKubeSchedulerCannotServeFractionsAsExtendedResources(t *testing.T) {
	t.Parallel()
	c := startCluster(t, cluster.Options{NoAdmissionPolicies: true, NodeAgents: &cluster.NodeAgentOptions{Config: draConfig}})
	addModeNode(t, c, "dra-0", "dra")
	waitDRAPool(t, c, "dra-0", 24)
	mapped := &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: "fraction-mapped"},
		Spec: resourceapi.DeviceClassSpec{
			ExtendedResourceName: ptrTo(api.ResourceFraction),
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
				Expression: `device.driver == "gpu.gpufrac.io" && device.attributes["gpu.gpufrac.io"].type == "fraction"`}}},
		},
	}
	if _, err := c.Client.ResourceV1().DeviceClasses().Create(t.Context(), mapped, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	createPods(t, c, builders.MakePod("default-frac", "default").SchedulerName(corev1.DefaultSchedulerName).CPU("1").Fraction(30).Obj())
	var msg string
	waitFor(t, 60*time.Second, "kube-scheduler to refuse the fraction", func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods("default").Get(ctx, "default-frac", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Reason == corev1.PodReasonUnschedulable {
				msg = cond.Message
				// A first try may meet the new node's not-ready taint;
				// kube-scheduler tries again once it goes.
				return p.Spec.NodeName == "" && strings.Contains(msg, "cannot allocate all claims"), nil
			}
		}
		if p.Spec.NodeName != "" {
			return false, fmt.Errorf("kube-scheduler bound the fraction to %s", p.Spec.NodeName)
		}
		return false, nil
	})
	if !strings.Contains(msg, "cannot allocate all claims") {
		t.Errorf("kube-scheduler's reason: %q, want it unable to allocate the extended-resource claim", msg)
	}
	t.Logf("kube-scheduler on gpufrac.io/gpu-fraction: 30 mapped to a DeviceClass: %s", msg)
}

func ptrTo[T any](v T) *T { return &v }

// draKarpenterCluster is a test bed whose only GPU node pool, gpu-dra, is in
// mode dra: Karpenter sells an 8×H100 type whose devices it knows from
// templates (InstanceType.DRAGPUs), and runs with --ignore-dra-requests as
// dra says (true: Karpenter's default).
func draKarpenterCluster(t *testing.T, draRequests bool) *cluster.Cluster {
	t.Helper()
	types := []cluster.InstanceType{{
		Name: "gpu-dra-8x-h100",
		Resources: cluster.ResourceList(map[corev1.ResourceName]string{
			corev1.ResourceCPU: "192", corev1.ResourceMemory: "2048Gi", corev1.ResourcePods: "110",
		}),
		Price: 98.32, GPUProduct: cluster.H100Product, DRAGPUs: 8,
	}}
	pools := []cluster.NodePool{{
		Name:                "gpu-dra",
		Labels:              map[string]string{api.LabelGPUNode: "true", modeLabel: "dra"},
		InstanceTypes:       []string{"gpu-dra-8x-h100"},
		ConsolidationPolicy: "WhenEmpty",
	}}
	c := startCluster(t, cluster.Options{
		Karpenter:  &cluster.KarpenterOptions{InstanceTypes: types, NodePools: pools, DRARequests: draRequests},
		NodeAgents: &cluster.NodeAgentOptions{Config: draConfig, StopGracePeriod: 5 * time.Second},
	})
	buildBinary(t, "gpufrac-coordinator")
	createTemplates(t, c)
	applyYAML(t, c, queuesYAML(map[string]string{"team-a": "8"}))
	return c
}

// TestKarpenterProvisionsDRANodeGroup: on a cluster whose GPUs come from a
// Karpenter node pool in mode dra, claim pods of gpufrac-scheduler with no
// room get placeholders that ask whole GPUs through a claim (class
// gpu.gpufrac.io, never nvidia.com/gpu, which the pool's nodes do not
// advertise); Karpenter (--ignore-dra-requests=false) simulates them against
// the instance type's device templates and launches a node; its gpufrac-node
// publishes the pool, which initializes the NodeClaim; the pods then run on
// the new node through claims the coordinator allocated; when they go, the
// node is removed.
func TestKarpenterProvisionsDRANodeGroup(t *testing.T) {
	t.Parallel()
	c := draKarpenterCluster(t, true)
	startCoordinator(t, c, "c1", "--leader-elect=false")

	names := []string{"k1", "k2", "k3"}
	for _, n := range names {
		createPods(t, c, coordClaimPod(n, "team-a", "gpu-30pct"))
	}
	pods := running(t, c, 3*time.Minute, names...)
	node := pods["k1"].Spec.NodeName
	for _, n := range names {
		p := pods[n]
		nd, err := c.Client.CoreV1().Nodes().Get(t.Context(), p.Spec.NodeName, metav1.GetOptions{})
		if err != nil || nd.Labels[api.LabelNodePool] != "gpu-dra" {
			t.Errorf("%s runs on %q (%v), want a node of pool gpu-dra", n, p.Spec.NodeName, err)
		}
		if d := allocatedDevice(t, podClaim(t, c, p)); !strings.HasSuffix(d.Device, "-shares") {
			t.Errorf("%s's claim got %s, want a shares view", n, d.Device)
		}
	}
	// The NodeClaim asked for gpufrac's driver and was initialized once the
	// node's gpufrac-node published its pool.
	ncs, err := c.Dynamic.Resource(cluster.NodeClaimResource()).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, nc := range ncs.Items {
		if strings.Contains(nc.GetAnnotations()["karpenter.sh/requested-dra-drivers"], api.DRADriver) {
			found = true
		}
	}
	if !found {
		t.Errorf("no NodeClaim requested driver %s (annotation karpenter.sh/requested-dra-drivers)", api.DRADriver)
	}
	// No placeholder is left once the pods run.
	waitFor(t, 60*time.Second, "the placeholders to go", func(ctx context.Context) (bool, error) {
		l, err := c.Client.CoreV1().Pods(api.ReservationNamespace).List(ctx, metav1.ListOptions{LabelSelector: api.LabelRole + "=" + api.RolePlaceholder})
		return err == nil && len(l.Items) == 0, nil
	})

	// Scale to zero: the claims are deallocated and Karpenter removes the node.
	for _, n := range names {
		if err := c.Client.CoreV1().Pods("default").Delete(t.Context(), n, metav1.DeleteOptions{GracePeriodSeconds: ptrTo[int64](0)}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 3*time.Minute, "Karpenter to remove the empty node "+node, func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		return err != nil, nil
	})
}

// TestKarpenterIgnoresDRARequestsByDefault documents Karpenter's flag: with
// its default --ignore-dra-requests=true a placeholder asking GPUs through a
// claim gets no NodeClaim, so pools in mode dra need the flag set to false.
func TestKarpenterIgnoresDRARequestsByDefault(t *testing.T) {
	t.Parallel()
	c := draKarpenterCluster(t, false)
	startCoordinator(t, c, "c1", "--leader-elect=false")
	createPods(t, c, coordClaimPod("k1", "team-a", "gpu-30pct"))
	waitFor(t, 60*time.Second, "a placeholder with a claim", func(ctx context.Context) (bool, error) {
		l, err := c.Client.CoreV1().Pods(api.ReservationNamespace).List(ctx, metav1.ListOptions{LabelSelector: api.LabelRole + "=" + api.RolePlaceholder})
		return err == nil && len(l.Items) == 1 && len(l.Items[0].Spec.ResourceClaims) == 1, nil
	})
	// Karpenter batches for up to 3 s: give it 20.
	time.Sleep(20 * time.Second)
	ncs, err := c.Dynamic.Resource(cluster.NodeClaimResource()).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(ncs.Items); n != 0 {
		t.Errorf("%d NodeClaims with --ignore-dra-requests=true, want none", n)
	}
}

// TestTwoSchedulersDoNotGiveAGPUAwayTwice: kube-scheduler and
// gpufrac-coordinator allocate claims on the same node at the same time.
// Neither sees the other's allocations in flight, so both could give GPU 0
// away, one by percent and one by bytes, and the DRA driver would refuse the
// second one prepared (pods stuck). The coordinator waits
// (WaitingForKubeScheduler) while kube-scheduler places pods with claims:
// every pod runs.
func TestTwoSchedulersDoNotGiveAGPUAwayTwice(t *testing.T) {
	t.Parallel()
	c := startCluster(t, cluster.Options{NodeAgents: &cluster.NodeAgentOptions{Config: draConfig}})
	buildBinary(t, "gpufrac-coordinator")
	addModeNode(t, c, "dra-0", "dra")
	waitDRAPool(t, c, "dra-0", 24)
	createTemplates(t, c)
	applyYAML(t, c, queuesYAML(map[string]string{"team-a": "8"}))
	startCoordinator(t, c, "c1", "--leader-elect=false")
	for round := range 3 {
		var names []string
		var pods []*corev1.Pod
		for i := range 3 {
			n := fmt.Sprintf("s%d-%d", round, i)
			names, pods = append(names, n), append(pods, draPod(n, "gpu-30pct"))
		}
		e := fmt.Sprintf("e%d", round)
		names, pods = append(names, e), append(pods, coordClaimPod(e, "team-a", "gpu-20gib"))
		createPods(t, c, pods...)
		running(t, c, 60*time.Second, names...)
	}
}

// draMIGConfig serves nodes labelled dra-mig through the DRA driver with GPU
// 0 in MIG (seven 1g.10gb instances) and the others shared.
const draMIGConfig = `version: v1
default:
  mode: fraction
  mig: {strategy: mixed, layout: all-1g.10gb}
groups:
  - nodeSelector: {` + modeLabel + `: dra-mig}
    mode: dra
    gpus: [{indices: "0", mode: mig}]
`

// TestMIGClaimsThroughKubeScheduler: a GPU in MIG on a node in mode dra is
// published as its MIG devices over the GPU's counters (no whole-GPU device),
// which the API server takes as they are; kube-scheduler allocates claims of
// class mig.gpufrac.io selecting the profile, each to its own MIG device;
// an eighth claim finds none left and waits; the driver prepares them.
func TestMIGClaimsThroughKubeScheduler(t *testing.T) {
	t.Parallel()
	c := startCluster(t, cluster.Options{NodeAgents: &cluster.NodeAgentOptions{
		Config: draMIGConfig,
		Args:   []string{"--device-list-strategy=cdi"}, // the test bed has no nvidia-caps minors file
	}})
	agent := addModeNode(t, c, "dra-mig", "dra-mig")
	devices := waitDRAPool(t, c, "dra-mig", 7+7*3)
	if _, ok := devices["gpu-0"]; ok {
		t.Errorf("GPU 0 in MIG is published whole too")
	}
	var migDevices []string
	for name, d := range devices {
		if *d.Attributes[api.DRAAttrType].StringValue == api.DRATypeMIG {
			migDevices = append(migDevices, name)
			if len(d.ConsumesCounters) != 1 || d.ConsumesCounters[0].CounterSet != api.DRACounterSet(0) {
				t.Errorf("MIG device %s consumes %+v, want GPU 0's counter set", name, d.ConsumesCounters)
			}
		}
	}
	if len(migDevices) != 7 {
		t.Fatalf("MIG devices published: %v, want 7", migDevices)
	}

	tmpl := builders.MakeClaim("mig-1g", "default").Request("gpu", api.DRAClassMIG, 1).
		Selector(`device.attributes["` + api.DRADriver + `"].profile == "1g.10gb"`).Template()
	if _, err := c.Client.ResourceV1().ResourceClaimTemplates("default").Create(t.Context(), tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var names []string
	for i := range 8 {
		n := fmt.Sprintf("m%d", i)
		names = append(names, n)
		createPods(t, c, draPod(n, "mig-1g"))
	}
	// Seven of the eight run: which seven is kube-scheduler's choice (it
	// does not promise creation order), so the test waits for any seven.
	pods := map[string]*corev1.Pod{}
	waitFor(t, 90*time.Second, "7 of the 8 pods Running", func(ctx context.Context) (bool, error) {
		clear(pods)
		for _, n := range names {
			if p, err := c.Client.CoreV1().Pods("default").Get(ctx, n, metav1.GetOptions{}); err == nil && p.Status.Phase == corev1.PodRunning {
				pods[n] = p
			}
		}
		return len(pods) == 7, nil
	})
	left := ""
	for _, n := range names {
		if pods[n] == nil {
			left = n
		}
	}
	seen := map[string]string{}
	for n := range pods {
		d := allocatedDevice(t, podClaim(t, c, pods[n])).Device
		if !strings.HasPrefix(d, "gpu-0-mig-1g10gb-") {
			t.Errorf("%s got %s, want one of GPU 0's 1g.10gb devices", n, d)
		}
		if other, ok := seen[d]; ok {
			t.Errorf("%s and %s both got %s", n, other, d)
		}
		seen[d] = n
		env, err := dra.ResolveCDIEnv(agent.CDIDir, agent.Kubelet.ContainerCDIDevices(pods[n].UID, "main"))
		if err != nil {
			t.Fatal(err)
		}
		if env["NVIDIA_VISIBLE_DEVICES"] != "void" || env[api.EnvMemoryLimitMiB] != "" {
			t.Errorf("%s: env %v, want NVIDIA_VISIBLE_DEVICES=void and no memory limit (MIG is isolated in hardware)", n, env)
		}
	}
	waitFor(t, 30*time.Second, "kube-scheduler to find no MIG device for the eighth pod", func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods("default").Get(ctx, left, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Reason == corev1.PodReasonUnschedulable {
				return p.Spec.NodeName == "", nil
			}
		}
		return false, nil
	})
}
