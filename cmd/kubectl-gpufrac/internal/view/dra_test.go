package view

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/api"
)

// draNode is a node in mode dra with gpus GPUs and their slice.
func draNode(t *testing.T, name string, gpus int) (corev1.Node, resourceapi.ResourceSlice) {
	t.Helper()
	n := gpuNode(t, name, gpus, true, -1)
	inv, _ := api.DecodeInventory(n.Annotations[api.AnnotationGPUInventory])
	slice := resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Driver: api.DRADriver, Pool: resourceapi.ResourcePool{Name: name}}}
	for i := range inv {
		inv[i].Driver = api.DRADriver
		for _, v := range []api.DRAView{api.DRAViewWhole, api.DRAViewShares, api.DRAViewMemory} {
			slice.Spec.Devices = append(slice.Spec.Devices, resourceapi.Device{Name: api.DRADeviceName(i, v), Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				api.DRAAttrUUID:        {StringValue: ptr.To(inv[i].UUID)},
				api.DRAAttrMemoryBytes: {IntValue: ptr.To(int64(81559) << 20)},
			}})
		}
	}
	ann, _ := api.EncodeInventory(inv)
	n.Annotations[api.AnnotationGPUInventory] = ann
	n.Status.Allocatable = corev1.ResourceList{}
	return n, slice
}

func claimPod(name, node string) corev1.Pod {
	return corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name), Annotations: map[string]string{}},
		Spec: corev1.PodSpec{NodeName: node, ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("gpu-30pct")}},
			Containers: []corev1.Container{{Name: "main"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

func allocatedClaim(name, node, device string, consumed map[string]string, pods ...string) resourceapi.ResourceClaim {
	r := resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: api.DRADriver, Pool: node, Device: device}
	for k, v := range consumed {
		if r.ConsumedCapacity == nil {
			r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{}
		}
		r.ConsumedCapacity[resourceapi.QualifiedName(k)] = resource.MustParse(v)
	}
	c := resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}}
	c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{r}}}
	for _, p := range pods {
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: p, UID: types.UID("uid-" + p)})
	}
	return c
}

func TestViewShowsClaimsOnDRANodes(t *testing.T) {
	node, slice := draNode(t, "dra", 4)
	pods := []corev1.Pod{
		claimPod("s1", "dra"), claimPod("s2", "dra"), claimPod("m20", "dra"), claimPod("w", "dra"),
		// A gpufrac.io/gpu-fraction pod the coordinator served there through a claim.
		pod("frac", "dra", api.ResourceFraction, 40),
		claimPod("waiting", ""),
	}
	pods[4].UID = "uid-frac"
	claims := []resourceapi.ResourceClaim{
		allocatedClaim("s1-gpu", "dra", "gpu-0-shares", map[string]string{"shares": "30"}, "s1"),
		allocatedClaim("s2-gpu", "dra", "gpu-0-shares", map[string]string{"shares": "30"}, "s2"),
		allocatedClaim("m20-gpu", "dra", "gpu-1-memory", map[string]string{"memory": "20Gi"}, "m20"),
		allocatedClaim("w-gpu", "dra", "gpu-2", nil, "w"),
		allocatedClaim("frac-extended-resources-x", "dra", "gpu-3-shares", map[string]string{"shares": "40"}, "frac"),
	}
	v := BuildWithClaims([]corev1.Node{node}, pods, claims, []resourceapi.ResourceSlice{slice})
	var b strings.Builder
	if err := v.Render(&b, Options{}); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"served through DRA (driver gpu.gpufrac.io)",
		"fraction (DRA)  ok      60%   default/s1 30% (claim), default/s2 30% (claim)",
		"26%   default/m20 20 GiB (claim)",
		"100%  default/w (whole)",
		"40%   default/frac 40% (claim)",
		"default/waiting  claims gpu-30pct",
		"4 GPUs on 1 node: 1 held whole, 3 shared by 4 fractions, 0 free",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the view lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "not written back") {
		t.Errorf("a claim-served pod shows as not written back:\n%s", out)
	}
}
