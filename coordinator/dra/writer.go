package dra

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	k8sresource "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/api"
)

// ErrAllocatedElsewhere means a claim got another allocation while the
// coordinator was writing its own (kube-scheduler allocated it first).
var ErrAllocatedElsewhere = errors.New("claim allocated by someone else meanwhile")

// ErrForeignExtendedClaim means a claim presents itself as a pod's
// extended-resource claim (the annotation, a controller reference to the
// pod) but is not the claim the coordinator writes for the pod's resources.
var ErrForeignExtendedClaim = errors.New("not the extended-resource claim the coordinator writes for the pod")

// ErrClaimReplaced means a claim read again while it was being written is
// another object under the same name (another UID): the claim planned for
// was deleted and someone made a new one under its name.
var ErrClaimReplaced = errors.New("claim deleted and made again under its name")

// CheckExtendedClaim tells whether claim may be taken up as pod's
// extended-resource claim: nil when it is in the pod's namespace, its
// controller is the pod, and its spec is exactly what ExtendedClaim builds
// for the pod's resources; else an error wrapping ErrForeignExtendedClaim.
//
// Untrusted input: a tenant with edit rights in the namespace can create a
// claim with any name, annotations, owner references, managed fields and
// spec (and delete the coordinator's claim and make another under its
// name). None of that tells who wrote it; the spec decides. A claim whose
// spec is what the coordinator would write gives the pod nothing more than
// its resources ask, whoever created it, and the claim's spec is immutable.
// Only status (allocation, reservedFor) is out of a tenant's reach.
func CheckExtendedClaim(pod *corev1.Pod, claim *resourceapi.ResourceClaim) error {
	owner := metav1.GetControllerOf(claim)
	if claim.Namespace != pod.Namespace || owner == nil || owner.UID != pod.UID {
		return fmt.Errorf("claim %s/%s is not controlled by pod %s/%s: %w", claim.Namespace, claim.Name, pod.Namespace, pod.Name, ErrForeignExtendedClaim)
	}
	want, _ := ExtendedClaim(pod)
	if !apiequality.Semantic.DeepEqual(claim.Spec, want.Spec) {
		return fmt.Errorf("claim %s/%s asks %s where the pod's resources ask %s: %w",
			claim.Namespace, claim.Name, describeSpec(claim.Spec), describeSpec(want.Spec), ErrForeignExtendedClaim)
	}
	return nil
}

// describeSpec sums up a claim's device requests for messages.
func describeSpec(spec resourceapi.ResourceClaimSpec) string {
	var parts []string
	for _, r := range spec.Devices.Requests {
		switch {
		case r.Exactly == nil:
			parts = append(parts, r.Name+": "+strconv.Itoa(len(r.FirstAvailable))+" alternatives")
		case r.Exactly.AllocationMode == resourceapi.DeviceAllocationModeAll:
			parts = append(parts, r.Name+": all devices of "+r.Exactly.DeviceClassName)
		default:
			d := r.Name + ": " + strconv.FormatInt(r.Exactly.Count, 10) + " of " + r.Exactly.DeviceClassName
			if c := r.Exactly.Capacity; c != nil {
				if q, ok := c.Requests[api.DRACapacityShares]; ok {
					d += " (" + q.String() + " shares)"
				}
			}
			parts = append(parts, d)
		}
	}
	if len(spec.Devices.Constraints) > 0 || len(spec.Devices.Config) > 0 {
		parts = append(parts, "constraints or config")
	}
	if len(parts) == 0 {
		return "no devices"
	}
	return strings.Join(parts, ", ")
}

// Planned is one claim to write before a pod is bound.
type Planned struct {
	// Claim is the claim as read, or the extended-resource claim to create
	// (Extended).
	Claim *resourceapi.ResourceClaim
	// Allocation is the result to write; nil when the claim is allocated
	// already (a shared claim: the pod is only added to reservedFor).
	Allocation *resourceapi.AllocationResult
	// Extended marks the pod's extended-resource claim: created first (one
	// an earlier attempt created, read back with its resourceVersion, is
	// taken up as it is), and Mappings written to
	// pod.status.extendedResourceClaimStatus.
	Extended bool
	Mappings []corev1.ContainerExtendedResourceRequest
}

// ExtendedClaim builds the claim kube-scheduler makes for a pod's
// DRA-backed extended resources (KEP-5004), with the one difference that
// makes gpufrac.io/gpu-fraction work: a fraction of P percent becomes one
// device of class fraction.gpufrac.io with capacity shares P, where
// kube-scheduler asks P devices. nvidia.com/gpu: N becomes N devices of
// class gpu.gpufrac.io. One request per container and resource, named
// container-<i>-request-<j> as kube-scheduler names them.
func ExtendedClaim(pod *corev1.Pod) (*resourceapi.ResourceClaim, []corev1.ContainerExtendedResourceRequest) {
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: pod.Name + "-extended-resources-",
			Namespace:    pod.Namespace,
			Annotations:  map[string]string{resourceapi.ExtendedResourceClaimAnnotation: "true"},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
	}
	var mappings []corev1.ContainerExtendedResourceRequest
	for i, c := range pod.Spec.Containers {
		j := 0
		for _, name := range []corev1.ResourceName{api.ResourceFraction, api.ResourceGPU} {
			q, ok := c.Resources.Limits[name]
			if !ok {
				q, ok = c.Resources.Requests[name]
			}
			if !ok || q.Value() <= 0 {
				continue
			}
			req := resourceapi.DeviceRequest{Name: "container-" + strconv.Itoa(i) + "-request-" + strconv.Itoa(j)}
			if name == api.ResourceFraction {
				req.Exactly = &resourceapi.ExactDeviceRequest{
					DeviceClassName: api.DRAClassFraction, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
					Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]k8sresource.Quantity{
						api.DRACapacityShares: *k8sresource.NewQuantity(q.Value(), k8sresource.DecimalSI),
					}},
				}
			} else {
				req.Exactly = &resourceapi.ExactDeviceRequest{
					DeviceClassName: api.DRAClassGPU, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: q.Value(),
				}
			}
			claim.Spec.Devices.Requests = append(claim.Spec.Devices.Requests, req)
			mappings = append(mappings, corev1.ContainerExtendedResourceRequest{ContainerName: c.Name, ResourceName: string(name), RequestName: req.Name})
			j++
		}
	}
	return claim, mappings
}

// Writer persists planned claims as kube-scheduler's DynamicResources
// plugin does in PreBind. It needs create/update on resourceclaims,
// update on resourceclaims/status and resourceclaims/binding, and patch on
// pods/status.
type Writer struct {
	client kubernetes.Interface
}

// NewWriter returns a writer.
func NewWriter(client kubernetes.Interface) *Writer { return &Writer{client: client} }

// written is what Write did for one plan, for Undo.
type written struct {
	namespace, name string
	uid             types.UID // the claim written: another under its name is left alone
	created         bool      // the extended claim: delete it
	allocated       bool      // we wrote the allocation
}

// Write persists plans for pod before its binding: the extended claim is
// created; each claim we allocate gets the finalizer
// resource.kubernetes.io/delete-protection (kube-controller-manager then
// deallocates it when its last pod ends), then status.allocation and the
// pod in status.reservedFor (retried on conflicts from a fresh read; if the
// claim got another allocation meanwhile it fails with
// ErrAllocatedElsewhere); last, the pod's extendedResourceClaimStatus. On
// an error everything written is undone.
//
// The extended claim's Claim in plans is replaced by the claim created, so
// Undo finds it.
func (w *Writer) Write(ctx context.Context, pod *corev1.Pod, plans []Planned) error {
	var done []written
	for i := range plans {
		p := &plans[i]
		wr, err := w.writeOne(ctx, pod, p)
		if wr.name != "" {
			done = append(done, wr)
		}
		if err != nil {
			w.undo(ctx, pod, done)
			return err
		}
		if p.Extended {
			status := &corev1.PodExtendedResourceClaimStatus{RequestMappings: p.Mappings, ResourceClaimName: wr.name}
			body, err := json.Marshal(map[string]any{"status": map[string]any{"extendedResourceClaimStatus": status}})
			if err == nil {
				_, err = w.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, body, metav1.PatchOptions{}, "status")
			}
			if err != nil {
				w.undo(ctx, pod, done)
				return fmt.Errorf("writing the extended-resource claim of pod %s/%s: %w", pod.Namespace, pod.Name, err)
			}
		}
	}
	return nil
}

func (w *Writer) writeOne(ctx context.Context, pod *corev1.Pod, p *Planned) (written, error) {
	claims := w.client.ResourceV1().ResourceClaims(pod.Namespace)
	claim := p.Claim
	wr := written{namespace: pod.Namespace}
	if p.Extended && claim.ResourceVersion != "" {
		// Taken up as it is: only if it is what this writer would create.
		if err := CheckExtendedClaim(pod, claim); err != nil {
			return wr, fmt.Errorf("taking up the extended-resource claim of pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
	}
	if p.Extended && claim.ResourceVersion == "" {
		// A new extended claim; one an earlier attempt created (read
		// back from the API server) is taken up as it is.
		c, err := claims.Create(ctx, claim, metav1.CreateOptions{})
		if err != nil {
			return wr, fmt.Errorf("creating the extended-resource claim of pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		claim, wr.name, wr.created = c, c.Name, true
		p.Claim = c
	}
	wr.name, wr.uid = claim.Name, claim.UID
	if p.Allocation != nil && !slices.Contains(claim.Finalizers, resourceapi.Finalizer) {
		c := claim.DeepCopy()
		c.Finalizers = append(c.Finalizers, resourceapi.Finalizer)
		updated, err := claims.Update(ctx, c, metav1.UpdateOptions{})
		if err != nil {
			return wr, fmt.Errorf("adding the finalizer to claim %s/%s: %w", claim.Namespace, claim.Name, err)
		}
		claim = updated
	}
	ref := resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: pod.Name, UID: pod.UID}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		c := claim.DeepCopy()
		if p.Allocation != nil {
			if c.Status.Allocation != nil {
				return fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, ErrAllocatedElsewhere)
			}
			c.Status.Allocation = p.Allocation
		} else if c.Status.Allocation == nil {
			return fmt.Errorf("claim %s/%s is no longer allocated", c.Namespace, c.Name)
		}
		if !slices.ContainsFunc(c.Status.ReservedFor, func(r resourceapi.ResourceClaimConsumerReference) bool { return r.UID == pod.UID }) {
			c.Status.ReservedFor = append(c.Status.ReservedFor, ref)
		}
		_, err := claims.UpdateStatus(ctx, c, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			fresh, getErr := claims.Get(ctx, claim.Name, metav1.GetOptions{})
			if getErr != nil {
				return getErr
			}
			// Untrusted: the name may now be another claim (a tenant
			// deleted the one planned for, its finalizer already there,
			// and made one with its own spec). Only the claim planned
			// for, and for the extended claim only a spec the pod's
			// resources ask, gets the allocation.
			if fresh.UID != claim.UID {
				return fmt.Errorf("claim %s/%s: %w", fresh.Namespace, fresh.Name, ErrClaimReplaced)
			}
			if p.Extended {
				if err := CheckExtendedClaim(pod, fresh); err != nil {
					return err
				}
			}
			claim = fresh
		}
		return err
	})
	if err != nil {
		return wr, fmt.Errorf("allocating claim %s/%s to pod %s: %w", claim.Namespace, claim.Name, pod.Name, err)
	}
	wr.allocated = p.Allocation != nil
	return wr, nil
}

// Undo takes back what Write wrote for pod (its binding failed): see undo.
func (w *Writer) Undo(ctx context.Context, pod *corev1.Pod, plans []Planned) {
	var done []written
	for _, p := range plans {
		if p.Claim.Name == "" {
			continue // an extended claim never created
		}
		done = append(done, written{namespace: pod.Namespace, name: p.Claim.Name, uid: p.Claim.UID, created: p.Extended, allocated: p.Allocation != nil})
	}
	w.undo(ctx, pod, done)
}

// undo removes the pod from each claim's reservedFor; a claim we allocated
// that nobody else reserved loses its allocation and finalizer; an
// extended claim we created is deleted. A claim made again under the name
// since (another UID) is not ours and is left alone. Errors are logged: the claim
// controller of kube-controller-manager cleans up reservations of pods that
// are gone.
func (w *Writer) undo(ctx context.Context, pod *corev1.Pod, done []written) {
	logger := klog.FromContext(ctx)
	for _, d := range slices.Backward(done) {
		claims := w.client.ResourceV1().ResourceClaims(d.namespace)
		if d.created {
			// Its finalizer would keep it: take the allocation back first.
			d.allocated = true
			opts := metav1.DeleteOptions{}
			if d.uid != "" {
				opts.Preconditions = &metav1.Preconditions{UID: &d.uid}
			}
			defer func() {
				if err := claims.Delete(ctx, d.name, opts); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
					logger.Error(err, "Deleting the extended-resource claim of an unbound pod", "claim", klog.KRef(d.namespace, d.name))
				}
			}()
		}
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			c, err := claims.Get(ctx, d.name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if d.uid != "" && c.UID != d.uid {
				return nil
			}
			c.Status.ReservedFor = slices.DeleteFunc(c.Status.ReservedFor, func(r resourceapi.ResourceClaimConsumerReference) bool { return r.UID == pod.UID })
			if d.allocated && len(c.Status.ReservedFor) == 0 {
				c.Status.Allocation = nil
			}
			c, err = claims.UpdateStatus(ctx, c, metav1.UpdateOptions{})
			if err != nil || c.Status.Allocation != nil {
				return err
			}
			c.Finalizers = slices.DeleteFunc(c.Finalizers, func(f string) bool { return f == resourceapi.Finalizer })
			_, err = claims.Update(ctx, c, metav1.UpdateOptions{})
			return err
		})
		if err != nil && !apierrors.IsNotFound(err) {
			logger.Error(err, "Undoing the claim of an unbound pod", "claim", klog.KRef(d.namespace, d.name), "pod", klog.KObj(pod))
		}
	}
}
