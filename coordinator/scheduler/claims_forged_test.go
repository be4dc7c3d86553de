package scheduler

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/coordinator/binder"
	"github.com/gpufrac/gpufrac/coordinator/dra"
	"github.com/gpufrac/gpufrac/tests/builders"
)

// TestTenantMadeExtendedClaimIsNeverAllocated (issue 25, item 1): a claim
// in the pod's namespace with the extended-resource annotation and a
// controller reference to the pod was taken up as the pod's extended claim
// and allocated as its author wrote it: a pod asking 1 % held whole GPUs
// while its queue was charged 0.01. Only a claim whose spec is what the
// coordinator writes for the pod's resources is taken up; with any other
// the pod is refused with a reason naming the claim, and nothing of that
// claim is written.
func TestTenantMadeExtendedClaimIsNeverAllocated(t *testing.T) {
	pod := fracPod("p", "q", 1)
	own, _ := dra.ExtendedClaim(pod)
	tests := []struct {
		name string
		// spec of the claim the tenant makes.
		spec resourceapi.ResourceClaimSpec
		// named: the pod's extendedResourceClaimStatus names the claim (the
		// coordinator's claim deleted and another made under its name).
		named bool
		// takenUp: the claim is what the coordinator writes, taken up.
		takenUp bool
	}{
		{name: "all devices", spec: builders.MakeClaim("x", "default").Request("container-0-request-0", api.DRAClassGPU, 0).Obj().Spec},
		{name: "one whole GPU", spec: builders.MakeClaim("x", "default").Request("container-0-request-0", api.DRAClassGPU, 1).Obj().Spec},
		{name: "four whole GPUs", spec: builders.MakeClaim("x", "default").WholeGPUs(4).Obj().Spec},
		{name: "100 shares", spec: builders.MakeClaim("x", "default").Request("container-0-request-0", api.DRAClassFraction, 1).Capacity(api.DRACapacityShares, "100").Obj().Spec},
		{name: "named in the pod's status", spec: builders.MakeClaim("x", "default").WholeGPUs(1).Obj().Spec, named: true},
		{name: "the coordinator's spec plus a device config", spec: func() resourceapi.ResourceClaimSpec {
			s := *own.Spec.DeepCopy()
			s.Devices.Config = []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: api.DRADriver}}}}
			return s
		}()},
		{name: "exactly the coordinator's spec", spec: *own.Spec.DeepCopy(), takenUp: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.spec.Devices.Requests[0].Exactly.Count == 0 {
				tt.spec.Devices.Requests[0].Exactly.AllocationMode = resourceapi.DeviceAllocationModeAll
			}
			p := pod.DeepCopy()
			claim := &resourceapi.ResourceClaim{
				ObjectMeta: metav1.ObjectMeta{Name: "p-extended-resources-forged", Namespace: "default", UID: "forged-uid", ResourceVersion: "3",
					Annotations:     map[string]string{resourceapi.ExtendedResourceClaimAnnotation: "true"},
					OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: p.Name, UID: p.UID, Controller: ptr.To(true)}}},
				Spec: tt.spec,
			}
			if tt.named {
				p.Status.ExtendedResourceClaimStatus = &corev1.PodExtendedResourceClaimStatus{ResourceClaimName: claim.Name}
			}
			n1, s1 := draNode(t, "n1")
			c := newCluster(t, "binpack", []*corev1.Node{n1}, []*v1alpha1.Queue{queueOf("q", "8")}, p)
			w := &recordingWriter{written: map[string][]dra.Planned{}}
			claims := []*resourceapi.ResourceClaim{claim}
			c.s.deps.DRA = &DRADeps{
				Slices:   func() ([]*resourceapi.ResourceSlice, error) { return s1, nil },
				Claims:   func() ([]*resourceapi.ResourceClaim, error) { return claims, nil },
				GetClaim: func(string, string) (*resourceapi.ResourceClaim, bool) { return nil, false },
				Classes:  dra.GpufracClasses(),
				Writer:   w,
			}
			c.cycle() // the first cycle learns which nodes are in mode dra
			c.cycle()

			if tt.takenUp {
				plans := w.written["p"]
				if c.boundTo("p") != "n1" || len(plans) != 1 || plans[0].Claim.Name != claim.Name {
					t.Fatalf("bound to %q, written %+v; want bound to n1 with claim %s taken up", c.boundTo("p"), plans, claim.Name)
				}
				return
			}
			for _, plan := range w.written["p"] {
				if plan.Claim.Name == claim.Name || plan.Claim.UID == claim.UID {
					t.Errorf("the tenant's claim was written with allocation %+v", plan.Allocation)
				}
			}
			if got := c.boundTo("p"); got != "" {
				t.Errorf("pod bound to %q with the tenant's claim present, want it refused", got)
			}
			reason, msg := c.b.Reason("p")
			if reason != binder.ReasonInvalidRequest || !strings.Contains(msg, claim.Name) || !strings.Contains(msg, resourceapi.ExtendedResourceClaimAnnotation) {
				t.Errorf("pending reason %q %q, want %s naming claim %s and the annotation", reason, msg, binder.ReasonInvalidRequest, claim.Name)
			}
		})
	}
}
