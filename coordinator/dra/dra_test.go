package dra

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	k8sresource "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/config"
	nodedra "github.com/gpufrac/gpufrac/deviceplugin/dra"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/tests/builders"
)

const h100Bytes = 81559 << 20

func gpuUUID(i int) string { return fmt.Sprintf("GPU-%d", i) }

// nodeSlices are the ResourceSlices gpufrac-node publishes for a node whose
// GPUs have the given modes (the node agent's own builder).
func nodeSlices(t *testing.T, node string, modes ...config.Mode) []*resourceapi.ResourceSlice {
	t.Helper()
	var gpus []nodedra.GPU
	for i, m := range modes {
		gpus = append(gpus, nodedra.GPU{GPU: nvidia.GPU{Index: i, Minor: i, UUID: gpuUUID(i), Name: "NVIDIA H100 80GB HBM3", MemoryBytes: h100Bytes}, Mode: m, Healthy: true})
	}
	p, err := nodedra.Build(node, gpus)
	if err != nil {
		t.Fatal(err)
	}
	pool := p.Resources.Pools[node]
	var out []*resourceapi.ResourceSlice
	for i, s := range pool.Slices {
		out = append(out, &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", node, i)},
			Spec: resourceapi.ResourceSliceSpec{
				Driver: api.DRADriver, NodeName: ptr.To(node),
				Pool:           resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: int64(len(pool.Slices))},
				Devices:        s.Devices,
				SharedCounters: s.SharedCounters,
			},
		})
	}
	return out
}

func testNode(name string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}}}
}

// result is an allocation result of gpufrac's driver on node-a.
func result(device string, share bool, consumed map[string]string) resourceapi.DeviceRequestAllocationResult {
	r := resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: api.DRADriver, Pool: "node-a", Device: device}
	if share {
		id := types.UID("share-" + device + fmt.Sprint(len(consumed)))
		r.ShareID = &id
		r.ConsumedCapacity = map[resourceapi.QualifiedName]k8sresource.Quantity{}
		for k, v := range consumed {
			r.ConsumedCapacity[resourceapi.QualifiedName(k)] = k8sresource.MustParse(v)
		}
	}
	return r
}

func allocated(name string, rs ...resourceapi.DeviceRequestAllocationResult) Allocated {
	return Allocated{Namespace: "team", Name: name, Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: rs}}}
}

func TestUsage(t *testing.T) {
	fr, ex := config.ModeFraction, config.ModeExclusive
	devs := IndexDevices(nodeSlices(t, "node-a", fr, fr, ex, fr))
	if d := devs[DeviceKey{"node-a", "gpu-1-memory"}]; d.GPU != gpuUUID(1) || d.View != api.DRAViewMemory || d.MemoryBytes != h100Bytes {
		t.Fatalf("indexed gpu-1-memory = %+v", d)
	}
	allocs := []Allocated{
		allocated("s30", result("gpu-0-shares", true, map[string]string{"shares": "30"})),
		allocated("s50", result("gpu-0-shares", true, map[string]string{"shares": "50"})),
		allocated("m20", result("gpu-1-memory", true, map[string]string{"memory": "20Gi"})),
		allocated("w", result("gpu-2", false, nil)),
		{Namespace: "other", Name: "nic", Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{Driver: "nic.example.com", Pool: "node-a", Device: "nic-0"}}}}},
	}
	want := Usage{"node-a": {
		gpuUUID(0): {UsedMilli: 800, View: api.DRAViewShares, Holders: []string{"team/s30", "team/s50"}},
		gpuUUID(1): {UsedMilli: 252, View: api.DRAViewMemory, Holders: []string{"team/m20"}}, // 20480 of 81559 MiB, rounded up
		gpuUUID(2): {UsedMilli: 1000, View: api.DRAViewWhole, Holders: []string{"team/w"}},
	}}
	if diff := cmp.Diff(want, UsageOf(devs, allocs)); diff != "" {
		t.Errorf("UsageOf (-want +got):\n%s", diff)
	}
}

func TestAskOf(t *testing.T) {
	tests := []struct {
		name    string
		claim   *resourceapi.ResourceClaim
		want    Ask
		wantErr string
	}{
		{name: "30 %", claim: builders.MakeClaim("c", "team").Shares(30).Obj(), want: Ask{Shares: 30}},
		{name: "20 GiB", claim: builders.MakeClaim("c", "team").GPUMemory("20Gi").Obj(), want: Ask{MemoryBytes: 20 << 30}},
		{name: "two whole GPUs", claim: builders.MakeClaim("c", "team").WholeGPUs(2).Obj(), want: Ask{GPUs: 2}},
		{name: "a fraction without capacity is the whole GPU", claim: builders.MakeClaim("c", "team").Request("gpu", api.DRAClassFraction, 1).Obj(), want: Ask{Shares: 100}},
		{name: "another driver's class asks nothing of gpufrac", claim: builders.MakeClaim("c", "team").Request("nic", "nic.example.com", 1).Obj(), want: Ask{}},
		{name: "shares and memory", claim: builders.MakeClaim("c", "team").Shares(30).Capacity("memory", "1Gi").Obj(),
			wantErr: "asks both shares and memory"},
		{name: "two fractions in one request", claim: builders.MakeClaim("c", "team").Request("gpu", api.DRAClassFraction, 2).Obj(),
			wantErr: "asks 2 devices of class fraction.gpufrac.io"},
		{name: "two GPU requests", claim: builders.MakeClaim("c", "team").WholeGPUs(1).Request("more", api.DRAClassGPU, 1).Obj(),
			wantErr: "in 2 requests"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := AskOf(tc.claim)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("AskOf error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("AskOf = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// allocate runs the allocator for claims on node-a with allocs held.
func allocate(t *testing.T, slices []*resourceapi.ResourceSlice, allocs []Allocated, pin []string, claims ...*resourceapi.ResourceClaim) ([]resourceapi.AllocationResult, error) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	for i, c := range claims {
		c.UID = types.UID(fmt.Sprintf("uid-%d", i))
	}
	return NewAllocator().Allocate(ctx, World{Slices: slices, Classes: GpufracClasses(), Allocated: allocs}, testNode("node-a"), claims, pin)
}

func TestAllocatorFollowsPlacementAndCapacity(t *testing.T) {
	fr := config.ModeFraction
	slices := nodeSlices(t, "node-a", fr, fr, fr, fr)
	held := []Allocated{allocated("s80", result("gpu-0-shares", true, map[string]string{"shares": "80"}))}
	tests := []struct {
		name       string
		claim      *resourceapi.ResourceClaim
		pin        []string
		wantDevice string
		wantShares string
		wantNoFit  bool
	}{
		{name: "30 % pinned to GPU 2", claim: builders.MakeClaim("c", "team").Shares(30).Obj(), pin: []string{gpuUUID(2)}, wantDevice: "gpu-2-shares", wantShares: "30"},
		{name: "20 % fits beside 80 on GPU 0", claim: builders.MakeClaim("c", "team").Shares(20).Obj(), pin: []string{gpuUUID(0)}, wantDevice: "gpu-0-shares", wantShares: "20"},
		{name: "30 % does not fit GPU 0", claim: builders.MakeClaim("c", "team").Shares(30).Obj(), pin: []string{gpuUUID(0)}, wantNoFit: true},
		{name: "bytes on GPU 0 while shared by percent", claim: builders.MakeClaim("c", "team").GPUMemory("1Gi").Obj(), pin: []string{gpuUUID(0)}, wantNoFit: true},
		{name: "the whole GPU 0 while shared", claim: builders.MakeClaim("c", "team").WholeGPUs(1).Obj(), pin: []string{gpuUUID(0)}, wantNoFit: true},
		{name: "unpinned: first fit skips GPU 0", claim: builders.MakeClaim("c", "team").Shares(30).Obj(), wantDevice: "gpu-1-shares", wantShares: "30"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, err := allocate(t, slices, held, tc.pin, tc.claim)
			if tc.wantNoFit {
				if !errors.Is(err, ErrNoFit) {
					t.Fatalf("Allocate = %v, %v; want ErrNoFit", res, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			r := res[0].Devices.Results[0]
			if r.Device != tc.wantDevice {
				t.Errorf("device %s, want %s", r.Device, tc.wantDevice)
			}
			if tc.wantShares != "" {
				q := r.ConsumedCapacity[api.DRACapacityShares]
				if q.String() != tc.wantShares || r.ShareID == nil {
					t.Errorf("consumed %v share %v, want %s shares and a share ID", r.ConsumedCapacity, r.ShareID, tc.wantShares)
				}
			}
		})
	}
}

func TestExtendedClaimAsksSharesNotDevices(t *testing.T) {
	pod := builders.MakePod("p", "team").Fraction(30).Container("side").GPUs(2).Obj()
	pod.UID = "pod-uid"
	claim, mappings := ExtendedClaim(pod)
	if claim.Annotations[resourceapi.ExtendedResourceClaimAnnotation] != "true" || claim.GenerateName != "p-extended-resources-" ||
		claim.OwnerReferences[0].UID != "pod-uid" || !*claim.OwnerReferences[0].Controller {
		t.Errorf("claim metadata %+v", claim.ObjectMeta)
	}
	want := []corev1.ContainerExtendedResourceRequest{
		{ContainerName: "main", ResourceName: api.ResourceFraction, RequestName: "container-0-request-0"},
		{ContainerName: "side", ResourceName: api.ResourceGPU, RequestName: "container-1-request-0"},
	}
	if diff := cmp.Diff(want, mappings); diff != "" {
		t.Errorf("mappings (-want +got):\n%s", diff)
	}
	// Allocated for real: one share of 30 on one GPU, two whole GPUs.
	res, err := allocate(t, nodeSlices(t, "node-a", config.ModeFraction, config.ModeFraction, config.ModeFraction), nil, nil, claim)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range res[0].Devices.Results {
		q := r.ConsumedCapacity[api.DRACapacityShares]
		got = append(got, r.Request+" "+r.Device+" "+q.String())
	}
	if diff := cmp.Diff([]string{"container-0-request-0 gpu-0-shares 30", "container-1-request-0 gpu-1 0", "container-1-request-0 gpu-2 0"}, got); diff != "" {
		t.Errorf("allocation (-want +got):\n%s", diff)
	}
}

// TestGpufracDevicesOnlyThroughCountedRequests: the coordinator charges a
// pod's queue for what its claims ask of gpufrac's classes (AskOf). A
// claim whose request names another class that still selects gpufrac's
// devices (the chart's optional gpu-extended.gpufrac.io, which maps
// nvidia.com/gpu, or any class an admin made that matches them) asks
// nothing by that count; the allocator would still give it a whole GPU,
// charged to no queue. Allocate refuses such an allocation.
func TestGpufracDevicesOnlyThroughCountedRequests(t *testing.T) {
	slices := nodeSlices(t, "node-a", config.ModeFraction, config.ModeExclusive)
	extended := GpufracClasses()[0].DeepCopy()
	extended.Name = "gpu-extended.gpufrac.io"
	classes := append(GpufracClasses(), extended)
	claim := builders.MakeClaim("c", "team").Request("gpu", extended.Name, 1).Obj()
	claim.UID = "uid-0"
	if a, err := AskOf(claim); err != nil || !a.IsZero() {
		t.Fatalf("AskOf = %+v, %v; the test needs a claim the coordinator counts as asking nothing", a, err)
	}
	_, ctx := ktesting.NewTestContext(t)
	res, err := NewAllocator().Allocate(ctx, World{Slices: slices, Classes: classes}, testNode("node-a"), []*resourceapi.ResourceClaim{claim}, nil)
	if !errors.Is(err, ErrUncounted) {
		t.Fatalf("Allocate = %+v, %v; want ErrUncounted", res, err)
	}
	if !strings.Contains(err.Error(), extended.Name) {
		t.Errorf("error %q does not name the class", err)
	}
	// The same GPU through gpufrac's own class is counted and allocated.
	claim = builders.MakeClaim("c", "team").WholeGPUs(1).Obj()
	claim.UID = "uid-0"
	if _, err := NewAllocator().Allocate(ctx, World{Slices: slices, Classes: classes}, testNode("node-a"), []*resourceapi.ResourceClaim{claim}, nil); err != nil {
		t.Fatalf("Allocate through %s: %v", api.DRAClassGPU, err)
	}
}
