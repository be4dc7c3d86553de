package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	k8sresource "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/dra"
	"github.com/gpufrac/gpufrac/deviceplugin/enforcement/enforcementtest"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
	"github.com/gpufrac/gpufrac/tests/builders"
	"github.com/gpufrac/gpufrac/tests/cluster"
	"github.com/gpufrac/gpufrac/tests/kubeletsim"
)

// apiClaims reads claims for the kubelet simulator from the API server.
type apiClaims struct{ cs kubernetes.Interface }

func (a apiClaims) GetClaim(ctx context.Context, ns, name string) (*resourceapi.ResourceClaim, error) {
	return a.cs.ResourceV1().ResourceClaims(ns).Get(ctx, name, metav1.GetOptions{})
}

const draConfig = `version: v1
default:
  mode: dra
  fraction: {enforcement: kill, pollInterval: 100ms, samples: 1}
  gpus: [{indices: "7", mode: exclusive}]
`

// TestDRADriverServesClaimsLikeFractions runs the real gpufrac-node in mode
// dra against a real API server (v1.36) and the kubelet simulator's DRA side:
//
//  1. it registers as DRA driver gpu.gpufrac.io and publishes its GPUs,
//     which the API server stores unchanged (shared views with
//     allowMultipleAllocations and request policies, counters in a slice of
//     their own, an exclusive-only GPU);
//  2. claims for 30 % and for 20 GiB of GPU 0's views are prepared with CDI
//     device IDs whose specs give the container exactly the env a
//     gpufrac.io/gpu-fraction container gets;
//  3. a claim over what is left of the GPU is refused with the holders named;
//  4. the memory watchdog knows the claim containers' limits (PodResources'
//     dynamic resources and the driver's record) and kills a process of the
//     30 % container over its limit;
//  5. after a restart of gpufrac-node the prepared claims still count;
//  6. its slices are owned by the Node and come back when someone wipes them;
//  7. after the Node is deleted and registered again (a new UID), the
//     garbage collector's deletion of its slices does not repeat forever:
//     they come back owned by the new Node.
//
// /readyz is ready once the kubelet accepted the driver, after restarts too.
func TestDRADriverServesClaimsLikeFractions(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the local control plane (make tools)")
	}
	c := cluster.StartForTest(t, cluster.Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	// The chart the test bed installs brings gpufrac's DeviceClasses.
	if _, err := c.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	procRoot := filepath.Join(t.TempDir(), "proc")
	n := startNode(t, nodeOptions{config: draConfig, claims: apiClaims{c.Client},
		extraArgs: []string{"--kubeconfig=" + c.KubeconfigPath, "--allow-standalone=false", "--proc-root=" + procRoot}})
	if err := n.kubelet.WaitForDRADriver(ctx, api.DRADriver); err != nil {
		t.Fatalf("%v\n%s", err, n.log.String())
	}
	n.waitReadyz(200, "")

	// 1. The published pool, as the API server stored it.
	var devices map[string]resourceapi.Device
	var counterSets int
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		slices, err := c.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=node-a,spec.driver=" + api.DRADriver})
		if err != nil {
			return false, err
		}
		devices, counterSets = map[string]resourceapi.Device{}, 0
		for _, s := range slices.Items {
			for _, d := range s.Spec.Devices {
				devices[d.Name] = d
			}
			counterSets += len(s.Spec.SharedCounters)
		}
		return len(devices) == 7*3+1 && counterSets == 7, nil
	}); err != nil {
		t.Fatalf("published devices: %d in %d counter sets, want 22 in 7: %v\n%s", len(devices), counterSets, err, n.log.String())
	}
	shares := devices["gpu-0-shares"]
	if shares.AllowMultipleAllocations == nil || !*shares.AllowMultipleAllocations || shares.Capacity[api.DRACapacityShares].RequestPolicy == nil || len(shares.ConsumesCounters) != 1 {
		t.Errorf("gpu-0-shares as stored: %+v", shares)
	}
	if w := devices["gpu-7"]; len(w.ConsumesCounters) != 0 || *w.Attributes[api.DRAAttrType].StringValue != api.DRATypeGPU {
		t.Errorf("gpu-7 (exclusive) as stored: %+v", w)
	}
	if _, ok := devices["gpu-7-shares"]; ok {
		t.Error("the exclusive GPU 7 has a shared view")
	}
	gpu0UUID := *shares.Attributes[api.DRAAttrUUID].StringValue
	gpu0MiB := uint64(*shares.Attributes[api.DRAAttrMemoryBytes].IntValue) >> 20

	// 2. Claims, allocated as kube-scheduler would write them, and their pods.
	p30 := createClaimPod(t, ctx, c.Client, "p30", builders.MakeClaim("c30", "default").Shares(30).Obj(), "gpu-0-shares", map[string]string{api.DRACapacityShares: "30"})
	p20 := createClaimPod(t, ctx, c.Client, "p20", builders.MakeClaim("m20", "default").GPUMemory("20Gi").Obj(), "gpu-1-memory", map[string]string{api.DRACapacityMemory: "20Gi"})
	for _, p := range []*corev1.Pod{p30, p20} {
		if err := n.kubelet.PrepareClaims(ctx, p); err != nil {
			t.Fatalf("preparing %s: %v\n%s", p.Name, err, n.log.String())
		}
	}
	gpu0 := nvidia.GPU{UUID: gpu0UUID, MemoryBytes: gpu0MiB << 20}
	env30, err := dra.ResolveCDIEnv(n.cdiDir, n.kubelet.ContainerCDIDevices(p30.UID, "main"))
	if err != nil {
		t.Fatal(err)
	}
	fraction := resource.SharedResponse(resource.StrategyDeviceSpecs, gpu0, resource.MemoryLimitMiB(gpu0, 30)).Envs
	if diff := cmp.Diff(fraction, env30); diff != "" {
		t.Errorf("env of the 30 %% claim's container (-gpu-fraction: 30 +claim):\n%s", diff)
	}
	env20, err := dra.ResolveCDIEnv(n.cdiDir, n.kubelet.ContainerCDIDevices(p20.UID, "main"))
	if err != nil {
		t.Fatal(err)
	}
	if env20[api.EnvMemoryLimitMiB] != "20480" || env20[api.EnvVisibleDevices] != "void" {
		t.Errorf("env of the 20 GiB claim's container: %v", env20)
	}

	// 3. 80 % more of GPU 0 does not fit beside the 30 %.
	p80 := createClaimPod(t, ctx, c.Client, "p80", builders.MakeClaim("c80", "default").Shares(80).Obj(), "gpu-0-shares", map[string]string{api.DRACapacityShares: "80"})
	err = n.kubelet.PrepareClaims(ctx, p80)
	var perr *kubeletsim.DRAPluginError
	if !errors.As(err, &perr) || !strings.Contains(perr.Msg, "80 shares of GPU "+gpu0UUID+" (gpu-0-shares) asked, 30 of 100 are held by default/c30 (30 shares)") {
		t.Fatalf("an over-capacity claim: %v, want the driver's refusal naming the holder", err)
	}

	// 4. The watchdog: the 30 % container's limit, and its process killed
	// when it holds 40 GiB.
	n.waitValue(fmt.Sprintf(`gpufrac_container_gpu_memory_limit_bytes{container="main",gpu_uuid=%q,namespace="default",pod="p30"}`, gpu0UUID), float64(resource.MemoryLimitMiB(gpu0, 30)<<20))
	hog := exec.Command("sleep", "300")
	if err := hog.Start(); err != nil {
		t.Fatal(err)
	}
	ended := make(chan string, 1)
	go func() { _ = hog.Wait(); ended <- hog.ProcessState.String() }()
	t.Cleanup(func() { _ = hog.Process.Kill() })
	cid := enforcementtest.ContainerID("default/p30/main")
	if err := enforcementtest.CopyProc(procRoot, uint32(hog.Process.Pid), enforcementtest.CgroupContainerdSystemd(p30.UID, cid)); err != nil {
		t.Fatal(err)
	}
	setContainerID(t, ctx, c.Client, p30, "main", cid)
	if err := nvidia.WriteMockProcesses(n.stateDir, map[string][]nvidia.Process{gpu0UUID: {{PID: uint32(hog.Process.Pid), UsedBytes: 40 << 30}}}); err != nil {
		t.Fatal(err)
	}
	select {
	case state := <-ended:
		t.Logf("the over-limit process of the claim's container ended: %s", state)
	case <-time.After(30 * time.Second):
		t.Fatalf("the process of the 30 %% claim's container holding 40 GiB was not killed\n%s", n.log.String())
	}

	// 5. A restarted gpufrac-node still counts the 30 %.
	n.restart()
	if err := n.kubelet.WaitForDRADriver(ctx, api.DRADriver); err != nil {
		t.Fatal(err)
	}
	n.waitReadyz(200, "")
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		err := n.kubelet.PrepareClaims(ctx, p80)
		return errors.As(err, &perr) && strings.Contains(perr.Msg, "30 of 100 are held by default/c30"), nil
	}); err != nil {
		t.Fatalf("after a restart the 80 %% claim was not refused for the 30 %%: %v\n%s", err, n.log.String())
	}
	if err := n.kubelet.UnprepareClaims(ctx, p30.UID); err != nil {
		t.Fatal(err)
	}
	if err := n.kubelet.PrepareClaims(ctx, p80); err != nil {
		t.Fatalf("the 80 %% claim once the 30 %% went: %v", err)
	}

	// 6. The slices are owned by the Node, and put back when someone wipes
	// them (the kubelet does when it takes the driver for gone).
	sel := metav1.ListOptions{FieldSelector: "spec.nodeName=node-a,spec.driver=" + api.DRADriver}
	node, err := c.Client.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	before, err := c.Client.ResourceV1().ResourceSlices().List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range before.Items {
		if o := s.OwnerReferences; len(o) != 1 || o[0].Kind != "Node" || o[0].UID != node.UID || o[0].Controller == nil || !*o[0].Controller {
			t.Errorf("slice %s owners %+v, want the Node (UID %s) as controller", s.Name, o, node.UID)
		}
	}
	if err := c.Client.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		after, err := c.Client.ResourceV1().ResourceSlices().List(ctx, sel)
		if err != nil {
			return false, err
		}
		devs := 0
		for _, s := range after.Items {
			devs += len(s.Spec.Devices)
		}
		return len(after.Items) == len(before.Items) && devs == 7*3+1, nil
	}); err != nil {
		t.Fatalf("wiped slices not published again: %v\n%s", err, n.log.String())
	}

	// 7. The Node deleted and registered again: the garbage collector
	// deletes the slices owned by the old one; they come back owned by the
	// new one and stay (with the old UID they would be deleted again and
	// again).
	if err := c.Client.CoreV1().Nodes().Delete(ctx, "node-a", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}); err != nil {
		t.Fatal(err)
	}
	renewed, err := c.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ownedByRenewed := func(ctx context.Context) (bool, error) {
		after, err := c.Client.ResourceV1().ResourceSlices().List(ctx, sel)
		if err != nil {
			return false, err
		}
		devs := 0
		for _, s := range after.Items {
			if o := s.OwnerReferences; len(o) != 1 || o[0].UID != renewed.UID {
				return false, nil
			}
			devs += len(s.Spec.Devices)
		}
		return len(after.Items) == len(before.Items) && devs == 7*3+1, nil
	}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, ownedByRenewed); err != nil {
		t.Fatalf("slices not published for the re-created Node %s: %v\n%s", renewed.UID, err, n.log.String())
	}
	// They stay: the garbage collector has nothing to delete any more.
	time.Sleep(3 * time.Second)
	if ok, err := ownedByRenewed(ctx); err != nil || !ok {
		t.Fatalf("slices of the re-created Node did not stay (%v)\n%s", err, n.log.String())
	}
}

// createClaimPod creates claim, a pod on node-a whose container main uses it,
// and writes the claim's allocation (device of gpufrac's pool node-a, with a
// fresh share ID and the consumed capacity) reserved for the pod, as an
// allocating scheduler does.
func createClaimPod(t *testing.T, ctx context.Context, cs kubernetes.Interface, name string, claim *resourceapi.ResourceClaim, device string, consumed map[string]string) *corev1.Pod {
	t.Helper()
	claim, err := cs.ResourceV1().ResourceClaims(claim.Namespace).Create(ctx, claim, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := cs.CoreV1().Pods("default").Create(ctx, builders.MakePod(name, "default").SchedulerName("default-scheduler").Node("node-a").Claim("gpu", claim.Name).Obj(), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	share := types.UID(uuid.NewUUID())
	res := resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: api.DRADriver, Pool: "node-a", Device: device, ShareID: &share,
		ConsumedCapacity: map[resourceapi.QualifiedName]k8sresource.Quantity{}}
	for k, v := range consumed {
		res.ConsumedCapacity[resourceapi.QualifiedName(k)] = k8sresource.MustParse(v)
	}
	claim.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{res}}}
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: p.Name, UID: p.UID}}
	if _, err := cs.ResourceV1().ResourceClaims(claim.Namespace).UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("allocating claim %s: %v", claim.Name, err)
	}
	return p
}

// setContainerID writes a container status with the container's ID, as the
// kubelet does once it runs (the watchdog maps processes through it).
func setContainerID(t *testing.T, ctx context.Context, cs kubernetes.Interface, p *corev1.Pod, container, id string) {
	t.Helper()
	cur, err := cs.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: container, ContainerID: "containerd://" + id, Ready: true,
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}}
	cur.Status.Phase = corev1.PodRunning
	if _, err := cs.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}
