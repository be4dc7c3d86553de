package builders

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpufrac/gpufrac/api"
)

// ClaimWrapper builds a ResourceClaim (or, with Template, its template).
type ClaimWrapper struct{ claim resourceapi.ResourceClaim }

// MakeClaim starts a claim with no requests.
func MakeClaim(name, namespace string) *ClaimWrapper {
	return &ClaimWrapper{claim: resourceapi.ResourceClaim{
		TypeMeta:   metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaim"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
	}}
}

// Obj returns a copy of the claim.
func (w *ClaimWrapper) Obj() *resourceapi.ResourceClaim { return w.claim.DeepCopy() }

// Template returns a ResourceClaimTemplate with the claim's name, namespace
// and spec.
func (w *ClaimWrapper) Template() *resourceapi.ResourceClaimTemplate {
	return &resourceapi.ResourceClaimTemplate{
		TypeMeta:   metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaimTemplate"},
		ObjectMeta: metav1.ObjectMeta{Name: w.claim.Name, Namespace: w.claim.Namespace},
		Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: *w.claim.Spec.DeepCopy()},
	}
}

// Request adds request name: count devices of class.
func (w *ClaimWrapper) Request(name, class string, count int64) *ClaimWrapper {
	w.claim.Spec.Devices.Requests = append(w.claim.Spec.Devices.Requests, resourceapi.DeviceRequest{
		Name:    name,
		Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count},
	})
	return w
}

// Capacity asks the last request's device for q of capacity name.
func (w *ClaimWrapper) Capacity(name, q string) *ClaimWrapper {
	r := w.claim.Spec.Devices.Requests[len(w.claim.Spec.Devices.Requests)-1].Exactly
	if r.Capacity == nil {
		r.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{}}
	}
	r.Capacity.Requests[resourceapi.QualifiedName(name)] = resource.MustParse(q)
	return w
}

// Selector adds a CEL selector to the last request.
func (w *ClaimWrapper) Selector(expr string) *ClaimWrapper {
	r := w.claim.Spec.Devices.Requests[len(w.claim.Spec.Devices.Requests)-1].Exactly
	r.Selectors = append(r.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: expr}})
	return w
}

// Shares is one request "gpu" for percent of one GPU (gpufrac's fraction class).
func (w *ClaimWrapper) Shares(percent int) *ClaimWrapper {
	return w.Request("gpu", api.DRAClassFraction, 1).Capacity(api.DRACapacityShares, resource.NewQuantity(int64(percent), resource.DecimalSI).String())
}

// GPUMemory is one request "gpu" for q of one GPU's memory (fraction class).
func (w *ClaimWrapper) GPUMemory(q string) *ClaimWrapper {
	return w.Request("gpu", api.DRAClassFraction, 1).Capacity(api.DRACapacityMemory, q)
}

// WholeGPUs is one request "gpu" for n whole GPUs.
func (w *ClaimWrapper) WholeGPUs(n int64) *ClaimWrapper {
	return w.Request("gpu", api.DRAClassGPU, n)
}
