package dra

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpufrac/gpufrac/tests/builders"
)

// TestWriteTakesUpAnExistingExtendedClaim: an extended claim an earlier
// attempt created and allocated (read back from the API server) is
// reserved and named in the pod's status, not created a second time; a new
// one is created.
func TestWriteTakesUpAnExistingExtendedClaim(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	pod := builders.MakePod("p", "team").Fraction(30).Obj()
	pod.UID = "pod-uid"
	existing, mappings := ExtendedClaim(pod)
	existing.Name, existing.GenerateName, existing.ResourceVersion = "p-extended-resources-abcde", "", "7"
	existing.Status.Allocation = allocated("x", result("gpu-0-shares", true, map[string]string{"shares": "30"})).Allocation
	existing.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	client := fake.NewClientset(pod, existing)
	read, err := client.ResourceV1().ResourceClaims("team").Get(ctx, existing.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := NewWriter(client).Write(ctx, pod, []Planned{{Claim: read, Extended: true, Mappings: mappings}}); err != nil {
		t.Fatal(err)
	}
	for _, a := range client.Actions() {
		if a.GetVerb() == "create" && a.GetResource().Resource == "resourceclaims" {
			t.Errorf("created a second extended claim: %v", a.(clienttesting.CreateAction).GetObject())
		}
	}
	got, err := client.CoreV1().Pods("team").Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if s := got.Status.ExtendedResourceClaimStatus; s == nil || s.ResourceClaimName != existing.Name {
		t.Errorf("pod's extendedResourceClaimStatus = %+v, want claim %s", s, existing.Name)
	}

	// A new one (no resourceVersion: never read from the API server) is created.
	client = fake.NewClientset(pod)
	fresh, mappings := ExtendedClaim(pod)
	fresh.UID = pod.UID + "-extended" // as the scheduler sets it for the allocator
	fresh.Name = "p-extended-resources-fghij"
	alloc := allocated("x", result("gpu-0-shares", true, map[string]string{"shares": "30"})).Allocation
	if err := NewWriter(client).Write(ctx, pod, []Planned{{Claim: fresh, Allocation: alloc, Extended: true, Mappings: mappings}}); err != nil {
		t.Fatal(err)
	}
	list, err := client.ResourceV1().ResourceClaims("team").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 || list.Items[0].Status.Allocation == nil {
		t.Errorf("claims after writing a new extended claim: %+v", list.Items)
	}
}

// TestWriteRefusesATenantMadeExtendedClaim (issue 25): an existing claim
// taken up as a pod's extended claim is written only if its spec is what
// ExtendedClaim builds for the pod; a tenant's claim with the annotation
// and the pod as controller but another spec gets no allocation, no
// reservation and no finalizer, and the pod's status does not name it.
func TestWriteRefusesATenantMadeExtendedClaim(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	pod := builders.MakePod("p", "team").Fraction(1).Obj()
	pod.UID = "pod-uid"
	forged, mappings := ExtendedClaim(pod)
	forged.Name, forged.GenerateName, forged.ResourceVersion = "p-extended-resources-forged", "", "7"
	forged.Spec = builders.MakeClaim("x", "team").WholeGPUs(4).Obj().Spec
	client := fake.NewClientset(pod, forged)
	read, err := client.ResourceV1().ResourceClaims("team").Get(ctx, forged.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	alloc := allocated("x", result("gpu-0", false, nil)).Allocation
	err = NewWriter(client).Write(ctx, pod, []Planned{{Claim: read, Allocation: alloc, Extended: true, Mappings: mappings}})
	if !errors.Is(err, ErrForeignExtendedClaim) {
		t.Fatalf("Write = %v, want ErrForeignExtendedClaim", err)
	}
	for _, a := range client.Actions() {
		if v := a.GetVerb(); v != "get" && v != "list" && v != "watch" {
			t.Errorf("wrote %s %s/%s", v, a.GetResource().Resource, a.GetSubresource())
		}
	}
}

// TestCheckExtendedClaimAfterARoundTrip: the claim the writer creates,
// read back through JSON or protobuf (as informers read it), is still the
// pod's: what the coordinator wrote must never be refused as forged.
func TestCheckExtendedClaimAfterARoundTrip(t *testing.T) {
	for _, pod := range []*corev1.Pod{
		builders.MakePod("frac", "team").Fraction(30).UID("u1").Obj(),
		builders.MakePod("whole", "team").GPUs(2).UID("u2").Obj(),
	} {
		claim, _ := ExtendedClaim(pod)
		claim.Name = pod.Name + "-extended-resources-x"
		js, err := json.Marshal(claim)
		if err != nil {
			t.Fatal(err)
		}
		fromJSON := &resourceapi.ResourceClaim{}
		if err := json.Unmarshal(js, fromJSON); err != nil {
			t.Fatal(err)
		}
		pb, err := claim.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		fromProto := &resourceapi.ResourceClaim{}
		if err := fromProto.Unmarshal(pb); err != nil {
			t.Fatal(err)
		}
		for enc, c := range map[string]*resourceapi.ResourceClaim{"json": fromJSON, "protobuf": fromProto} {
			if err := CheckExtendedClaim(pod, c); err != nil {
				t.Errorf("%s, read back from %s: %v", pod.Name, enc, err)
			}
		}
	}
}

// TestWriteRefusesAClaimMadeAgainMeanwhile (review of issue 25, finding
// 6): the claim taken up passes CheckExtendedClaim and already carries the
// delete-protection finalizer (the tenant set it, so no update precedes the
// status write). Between the read and the status write the tenant deletes
// it and makes another under its name; the status write meets a conflict
// and the writer reads the claim again. The new claim (another UID; the
// same spec or the tenant's own) gets no allocation and no reservation, and
// Write fails, so the pod is not bound with it.
func TestWriteRefusesAClaimMadeAgainMeanwhile(t *testing.T) {
	tests := []struct {
		name   string
		remake func(c *resourceapi.ResourceClaim)
	}{
		{name: "same spec, another UID", remake: func(*resourceapi.ResourceClaim) {}},
		{name: "the tenant's spec", remake: func(c *resourceapi.ResourceClaim) {
			c.Spec = builders.MakeClaim("x", "team").WholeGPUs(4).Obj().Spec
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			pod := builders.MakePod("p", "team").Fraction(30).UID("pod-uid").Obj()
			claim, mappings := ExtendedClaim(pod)
			claim.Name, claim.GenerateName, claim.ResourceVersion, claim.UID = "p-extended-resources-abcde", "", "7", "claim-uid"
			claim.Finalizers = []string{resourceapi.Finalizer}
			client := fake.NewClientset(pod, claim)
			read, err := client.ResourceV1().ResourceClaims("team").Get(ctx, claim.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if err := CheckExtendedClaim(pod, read); err != nil {
				t.Fatalf("the claim read first must pass the check: %v", err)
			}
			tenants := claim.DeepCopy()
			tenants.UID = "tenant-uid"
			tt.remake(tenants)
			swapped := false
			client.PrependReactor("update", "resourceclaims", func(a clienttesting.Action) (bool, runtime.Object, error) {
				if swapped || a.GetSubresource() != "status" {
					return false, nil, nil
				}
				// The claim is deleted and made again before the write lands.
				swapped = true
				if err := client.Tracker().Delete(a.GetResource(), "team", claim.Name); err != nil {
					t.Fatal(err)
				}
				if err := client.Tracker().Add(tenants); err != nil {
					t.Fatal(err)
				}
				return true, nil, apierrors.NewConflict(a.GetResource().GroupResource(), claim.Name, errors.New("the object has been modified"))
			})
			alloc := allocated("x", result("gpu-0-shares", true, map[string]string{"shares": "30"})).Allocation
			err = NewWriter(client).Write(ctx, pod, []Planned{{Claim: read, Allocation: alloc, Extended: true, Mappings: mappings}})
			if !swapped {
				t.Fatal("the status write never ran")
			}
			if !errors.Is(err, ErrClaimReplaced) {
				t.Errorf("Write = %v, want ErrClaimReplaced", err)
			}
			got, err := client.ResourceV1().ResourceClaims("team").Get(ctx, claim.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got.Status.Allocation != nil || len(got.Status.ReservedFor) != 0 {
				t.Errorf("the claim made again got allocation %+v, reservedFor %+v; want none", got.Status.Allocation, got.Status.ReservedFor)
			}
			if !slices.Equal(got.Finalizers, tenants.Finalizers) {
				t.Errorf("the claim made again has finalizers %v, want %v as its maker set them", got.Finalizers, tenants.Finalizers)
			}
			p, err := client.CoreV1().Pods("team").Get(ctx, pod.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if s := p.Status.ExtendedResourceClaimStatus; s != nil {
				t.Errorf("the pod's status names claim %s; want none", s.ResourceClaimName)
			}
		})
	}
}
