package scheduler

import (
	"context"
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	k8sresource "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/coordinator/dra"
	"github.com/gpufrac/gpufrac/deviceplugin/config"
	nodedra "github.com/gpufrac/gpufrac/deviceplugin/dra"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/tests/builders"
)

// draNode is a Ready node in mode dra with one H100 in mode fraction, and
// the ResourceSlices its gpufrac-node publishes.
func draNode(t *testing.T, name string) (*corev1.Node, []*resourceapi.ResourceSlice) {
	t.Helper()
	return draNodeGPUs(t, name, 1)
}

// draNodeGPUs is draNode with n H100s (GPU-<name>-<i>).
func draNodeGPUs(t *testing.T, name string, n int) (*corev1.Node, []*resourceapi.ResourceSlice) {
	t.Helper()
	node := h100Node(name, "a", n)
	inv := make([]api.GPUInfo, n)
	gpus := make([]nodedra.GPU, n)
	for i := range inv {
		inv[i] = api.GPUInfo{UUID: fmt.Sprintf("GPU-%s-%d", name, i), Index: i, Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81920, Mode: "fraction", Healthy: true, Driver: api.DRADriver}
		gpus[i] = nodedra.GPU{GPU: nvidia.GPU{UUID: inv[i].UUID, Index: i, Minor: i, Name: inv[i].Model, MemoryBytes: 81920 << 20}, Mode: config.ModeFraction, Healthy: true}
	}
	s, _ := api.EncodeInventory(inv)
	node.Annotations[api.AnnotationGPUInventory] = s
	delete(node.Status.Allocatable, api.ResourceFraction)
	p, err := nodedra.Build(name, gpus)
	if err != nil {
		t.Fatal(err)
	}
	var out []*resourceapi.ResourceSlice
	pool := p.Resources.Pools[name]
	for i, sl := range pool.Slices {
		out = append(out, &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", name, i)},
			Spec: resourceapi.ResourceSliceSpec{Driver: api.DRADriver, NodeName: ptr.To(name),
				Pool:    resourceapi.ResourcePool{Name: name, Generation: 1, ResourceSliceCount: int64(len(pool.Slices))},
				Devices: sl.Devices, SharedCounters: sl.SharedCounters},
		})
	}
	return node, out
}

// sharesOn allocates claim c percent of the shared view of node's GPU 0,
// reserved for pod.
func sharesOn(c *resourceapi.ResourceClaim, node string, percent int64, pod types.UID) *resourceapi.ResourceClaim {
	id := types.UID("share-" + c.Name)
	c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
		Request: "gpu", Driver: api.DRADriver, Pool: node, Device: "gpu-0-shares", ShareID: &id,
		ConsumedCapacity: map[resourceapi.QualifiedName]k8sresource.Quantity{api.DRACapacityShares: *k8sresource.NewQuantity(percent, k8sresource.DecimalSI)},
	}}}}
	if pod != "" {
		c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: string(pod), UID: pod}}
	}
	return c
}

// recordingWriter records what the coordinator would write.
type recordingWriter struct{ written map[string][]dra.Planned }

func (w *recordingWriter) Write(_ context.Context, pod *corev1.Pod, plans []dra.Planned) error {
	w.written[pod.Name] = plans
	return nil
}
func (w *recordingWriter) Undo(context.Context, *corev1.Pod, []dra.Planned) {}

// TestPodWhoseClaimIsAllocatedGoesWhereTheClaimIs: a pending pod whose GPU
// claim is already allocated (the coordinator wrote the allocation and
// stopped before binding, or the claim is shared with a pod placed before)
// can run only on the node of that allocation, on the GPU the claim
// already holds. Placed as if it still needed a GPU, it went to another
// node, where the kubelet could never prepare the claim, or waited for a
// second 30 % on a node its own claim filled.
func TestPodWhoseClaimIsAllocatedGoesWhereTheClaimIs(t *testing.T) {
	n1, s1 := draNode(t, "n1")
	n2, s2 := draNode(t, "n2")
	pod := builders.MakePod("p", "default").Queue("q").CPU("1").UID("p").Claim("gpu", "mine").Obj()
	claims := []*resourceapi.ResourceClaim{
		sharesOn(builders.MakeClaim("other", "default").Shares(70).Obj(), "n1", 70, ""),
		sharesOn(builders.MakeClaim("mine", "default").Shares(30).Obj(), "n1", 30, pod.UID),
	}
	c := newCluster(t, "binpack", []*corev1.Node{n1, n2}, []*v1alpha1.Queue{queueOf("q", "8")}, pod)
	w := &recordingWriter{written: map[string][]dra.Planned{}}
	c.s.deps.DRA = &DRADeps{
		Slices: func() ([]*resourceapi.ResourceSlice, error) { return append(s1, s2...), nil },
		Claims: func() ([]*resourceapi.ResourceClaim, error) { return claims, nil },
		GetClaim: func(ns, name string) (*resourceapi.ResourceClaim, bool) {
			for _, cl := range claims {
				if cl.Namespace == ns && cl.Name == name {
					return cl, true
				}
			}
			return nil, false
		},
		Classes: dra.GpufracClasses(),
		Writer:  w,
	}
	c.cycle() // the first cycle learns which nodes are in mode dra
	c.cycle()
	if got := c.boundTo("p"); got != "n1" {
		t.Fatalf("pod bound to %q (reason %q), want n1, where its claim is allocated", got, c.reason("p"))
	}
	plans := w.written["p"]
	if len(plans) != 1 || plans[0].Allocation != nil || plans[0].Claim.Name != "mine" {
		t.Errorf("written %+v, want claim mine reserved as allocated", plans)
	}
}

// TestExtendedClaimLeftByAnEarlierAttemptIsReused: the coordinator created
// and allocated the extended-resource claim of a gpufrac.io/gpu-fraction pod
// on a node in mode dra and was killed before it wrote the pod's
// extendedResourceClaimStatus and bound it. That claim, owned by the pod
// and reserved for it, holds its 30 % as long as the pod lives. The next
// attempt must take it up (on its node), not make a second claim beside
// it: one pod would hold two shares, one of them for nothing.
func TestExtendedClaimLeftByAnEarlierAttemptIsReused(t *testing.T) {
	// Killed before the pod's status was written, or after (the binding
	// failed and the undo could not delete the claim).
	for _, named := range []bool{false, true} {
		t.Run(fmt.Sprintf("named in the pod's status %t", named), func(t *testing.T) { extendedClaimReused(t, named) })
	}
}

func extendedClaimReused(t *testing.T, named bool) {
	n1, s1 := draNode(t, "n1")
	n2, s2 := draNode(t, "n2")
	pod := fracPod("p", "q", 30)
	if named {
		pod.Status.ExtendedResourceClaimStatus = &corev1.PodExtendedResourceClaimStatus{ResourceClaimName: "p-extended-resources-abcde",
			RequestMappings: []corev1.ContainerExtendedResourceRequest{{ContainerName: pod.Spec.Containers[0].Name, ResourceName: api.ResourceFraction, RequestName: "container-0-request-0"}}}
	}
	orphan := sharesOn(builders.MakeClaim("p-extended-resources-abcde", "default").Shares(30).Obj(), "n1", 30, pod.UID)
	orphan.UID, orphan.ResourceVersion = "orphan-uid", "7"
	// What the coordinator wrote: the spec dra.ExtendedClaim builds for the
	// pod (a claim with any other spec is refused, issue 25).
	ext, _ := dra.ExtendedClaim(pod)
	orphan.Spec = ext.Spec
	orphan.Status.Allocation.Devices.Results[0].Request = ext.Spec.Devices.Requests[0].Name
	orphan.Annotations = map[string]string{resourceapi.ExtendedResourceClaimAnnotation: "true"}
	orphan.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID, Controller: ptr.To(true)}}
	claims := []*resourceapi.ResourceClaim{sharesOn(builders.MakeClaim("other", "default").Shares(70).Obj(), "n1", 70, ""), orphan}
	c := newCluster(t, "binpack", []*corev1.Node{n1, n2}, []*v1alpha1.Queue{queueOf("q", "8")}, pod)
	w := &recordingWriter{written: map[string][]dra.Planned{}}
	c.s.deps.DRA = &DRADeps{
		Slices:   func() ([]*resourceapi.ResourceSlice, error) { return append(s1, s2...), nil },
		Claims:   func() ([]*resourceapi.ResourceClaim, error) { return claims, nil },
		GetClaim: func(string, string) (*resourceapi.ResourceClaim, bool) { return nil, false },
		Classes:  dra.GpufracClasses(),
		Writer:   w,
	}
	c.cycle()
	c.cycle()
	if got := c.boundTo("p"); got != "n1" {
		t.Fatalf("pod bound to %q (reason %q), want n1, where its extended claim is allocated", got, c.reason("p"))
	}
	plans := w.written["p"]
	if len(plans) != 1 || !plans[0].Extended || plans[0].Claim.Name != orphan.Name || plans[0].Allocation != nil {
		t.Errorf("written %+v, want the existing extended claim %s, reserved as allocated", plans, orphan.Name)
	}
}

// TestClaimPodIsAnnotatedWithTheGPUItsClaimGot: placement does not model
// that a GPU holding a claim for bytes (its memory view) takes no share by
// percent, so it may choose that GPU for a 30 % claim; the claim then goes
// to another GPU of the node. The binding's gpufrac.io/gpu (what kubectl
// gpufrac -n shows, and the coordinator's own assumption) must name the
// GPU the claim got. It named placement's choice (make demo: dra-inference
// pods shown on dra-embed's GPU).
func TestClaimPodIsAnnotatedWithTheGPUItsClaimGot(t *testing.T) {
	n1, s1 := draNodeGPUs(t, "n1", 2)
	id := types.UID("share-bytes")
	bytes := builders.MakeClaim("bytes", "default").GPUMemory("20Gi").Obj()
	bytes.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
		Request: "gpu", Driver: api.DRADriver, Pool: "n1", Device: "gpu-0-memory", ShareID: &id,
		ConsumedCapacity: map[resourceapi.QualifiedName]k8sresource.Quantity{api.DRACapacityMemory: k8sresource.MustParse("20Gi")},
	}}}}
	mine := builders.MakeClaim("mine", "default").Shares(30).Obj()
	claims := []*resourceapi.ResourceClaim{bytes, mine}
	pod := builders.MakePod("p", "default").Queue("q").CPU("1").UID("p").Claim("gpu", "mine").Obj()
	c := newCluster(t, "binpack", []*corev1.Node{n1}, []*v1alpha1.Queue{queueOf("q", "8")}, pod)
	w := &recordingWriter{written: map[string][]dra.Planned{}}
	c.s.deps.DRA = &DRADeps{
		Slices: func() ([]*resourceapi.ResourceSlice, error) { return s1, nil },
		Claims: func() ([]*resourceapi.ResourceClaim, error) { return claims, nil },
		GetClaim: func(ns, name string) (*resourceapi.ResourceClaim, bool) {
			for _, cl := range claims {
				if cl.Namespace == ns && cl.Name == name {
					return cl, true
				}
			}
			return nil, false
		},
		Classes: dra.GpufracClasses(),
		Writer:  w,
	}
	c.cycle() // the first cycle learns which nodes are in mode dra
	c.cycle()
	if got := c.boundTo("p"); got != "n1" {
		t.Fatalf("pod bound to %q (reason %q: %s), want n1", got, c.reason("p"), c.b.Messages["p"])
	}
	plans := w.written["p"]
	if len(plans) != 1 || plans[0].Allocation == nil || len(plans[0].Allocation.Devices.Results) != 1 {
		t.Fatalf("written %+v, want claim mine allocated", plans)
	}
	dev := plans[0].Allocation.Devices.Results[0].Device
	if dev != "gpu-1-shares" {
		t.Fatalf("claim allocated %s, want gpu-1-shares (GPU 0 holds a claim for bytes)", dev)
	}
	if got := c.b.Annotations["p"][api.AnnotationGPU]; got != "GPU-n1-1" {
		t.Errorf("pod annotated %s=%q, want GPU-n1-1, the GPU its claim got (%s)", api.AnnotationGPU, got, dev)
	}
}

// TestGPUsOfCountsOnlyGpufracDevicesHeld: the GPUs a claim pod is
// annotated with are those its claims hold of gpufrac's devices. Another
// driver's device whose pool and name match one of gpufrac's (NVIDIA's DRA
// driver also names its pools after the node and its devices gpu-<n>), and
// an admin-access result (which holds nothing), name no GPU.
func TestGPUsOfCountsOnlyGpufracDevicesHeld(t *testing.T) {
	_, s1 := draNodeGPUs(t, "n1", 3)
	v := &draCycle{devs: dra.IndexDevices(s1)}
	for _, key := range []dra.DeviceKey{{Pool: "n1", Device: "gpu-0"}, {Pool: "n1", Device: "gpu-1-shares"}, {Pool: "n1", Device: "gpu-2-memory"}} {
		if _, ok := v.devs[key]; !ok {
			t.Fatalf("gpufrac publishes no device %v: the test needs it", key)
		}
	}
	res := []resourceapi.AllocationResult{{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
		{Request: "other", Driver: "gpu.nvidia.com", Pool: "n1", Device: "gpu-0"},
		{Request: "gpu", Driver: api.DRADriver, Pool: "n1", Device: "gpu-1-shares"},
		{Request: "debug", Driver: api.DRADriver, Pool: "n1", Device: "gpu-2-memory", AdminAccess: ptr.To(true)},
	}}}}
	if got, want := v.gpusOf(res), []string{"GPU-n1-1"}; !slices.Equal(got, want) {
		t.Errorf("gpusOf = %v, want %v (gpufrac's devices held, not another driver's of the same name nor an admin-access one)", got, want)
	}
}
