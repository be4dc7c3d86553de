// Package v1alpha1 holds the gpufrac.io/v1alpha1 API types: the cluster-scoped
// Queue that carries quota, limits and fair-share weights for GPU, CPU and
// memory.
//
// There is no generated code: the types are plain structs, the coordinator
// reads queues with the dynamic client and converts them with FromUnstructured
// (runtime.DefaultUnstructuredConverter), and writes status with
// ToUnstructured. The schema the API server enforces is
// deployments/helm/gpufrac/crds/gpufrac.io_queues.yaml; crd_test.go keeps the two in step.
package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/gpufrac/gpufrac/api"
)

const (
	// Group is the API group of every gpufrac custom resource.
	Group = api.Domain
	// Version is this package's API version.
	Version = "v1alpha1"
	// APIVersion is the apiVersion field of objects of this package.
	APIVersion = Group + "/" + Version
	// QueueKind is the kind of a Queue.
	QueueKind = "Queue"
	// QueueListKind is the kind of a list of queues.
	QueueListKind = "QueueList"
	// QueueResource is the plural resource name of queues.
	QueueResource = "queues"

	// ResourceGPU keys GPUs (whole GPUs, fractions allowed: "2.5") in
	// QueueResources and in the status resource lists.
	ResourceGPU corev1.ResourceName = "gpu"
	// ResourceCPU keys CPU (cores, "500m") in the status resource lists.
	ResourceCPU corev1.ResourceName = "cpu"
	// ResourceMemory keys memory (bytes, "64Gi") in the status resource lists.
	ResourceMemory corev1.ResourceName = "memory"

	// DefaultOverQuotaWeight is the weight of a resource whose
	// overQuotaWeight is absent.
	DefaultOverQuotaWeight int32 = 1
)

// QueueGVR is the group, version and resource of queues, for the dynamic client.
func QueueGVR() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: Group, Version: Version, Resource: QueueResource}
}

// QueueGVK is the group, version and kind of a Queue.
func QueueGVK() schema.GroupVersionKind {
	return schema.GroupVersionKind{Group: Group, Version: Version, Kind: QueueKind}
}

// Queue is a cluster-scoped queue of GPU workloads. Queues form a tree through
// Spec.Parent; only leaf queues take pods (label gpufrac.io/queue). Usage is
// charged to the leaf and to every ancestor.
type Queue struct {
	metav1.TypeMeta `json:",inline"`
	// Standard object metadata; queues are cluster-scoped, so no namespace.
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is what the administrator wants.
	Spec QueueSpec `json:"spec,omitempty"`
	// Status is what the coordinator observed, written through the status subresource.
	Status QueueStatus `json:"status,omitempty"`
}

// QueueList is a list of queues.
type QueueList struct {
	metav1.TypeMeta `json:",inline"`
	// Standard list metadata.
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the queues.
	Items []Queue `json:"items"`
}

// QueueSpec is a queue's place in the hierarchy, priority and resources.
type QueueSpec struct {
	// Parent names the parent queue; empty for a top-level queue. A queue with
	// children takes no pods.
	Parent string `json:"parent,omitempty"`
	// Priority orders sibling queues whose fair-share usage is equal: higher first.
	Priority int32 `json:"priority,omitempty"`
	// Resources are the queue's quota, limit and over-quota weight per resource.
	Resources QueueResources `json:"resources,omitempty"`
	// Namespaces lists the namespaces whose pods may use this queue (label
	// gpufrac.io/queue, or a namespace's gpufrac.io/default-queue);
	// AllNamespaces ("*") lets every namespace in. Empty or absent: no
	// namespace may, so a queue serves nobody until its administrator says
	// who. It is read on the leaf queue a pod names; a parent's list is not
	// inherited. The admission policies refuse a pod outside the list, and
	// the coordinator refuses it too (InvalidRequest) where they are absent.
	Namespaces []string `json:"namespaces,omitempty"`
	// Admission says who admits the queue's work against quota: empty for
	// gpufrac (the queue's resources), AdmissionKueue for Kueue. A Kueue
	// queue has no resources and no parent: Kueue keeps the quota, and the
	// coordinator places only the pods of Workloads Kueue admitted
	// (docs/integrations/kueue.md).
	Admission QueueAdmission `json:"admission,omitempty"`
}

// QueueAdmission names who admits a queue's work against quota.
type QueueAdmission string

// AdmissionKueue in QueueSpec.Admission: Kueue keeps the queue's quota.
const AdmissionKueue QueueAdmission = "Kueue"

// AllNamespaces in QueueSpec.Namespaces lets pods of every namespace use the queue.
const AllNamespaces = "*"

// AllowsNamespace tells whether pods of namespace ns may use the queue.
func (s *QueueSpec) AllowsNamespace(ns string) bool {
	for _, n := range s.Namespaces {
		if n == ns || n == AllNamespaces {
			return true
		}
	}
	return false
}

// QueueResources holds one ResourceQuota per resource. A resource left out is
// not managed by the queue: no quota or limit check and no fair-share
// ordering for it (as if its quota were unlimited).
type QueueResources struct {
	// GPU is counted in GPUs; fractions are allowed ("2.5" = two and a half GPUs).
	GPU *ResourceQuota `json:"gpu,omitempty"`
	// CPU is counted in cores ("500m", "16").
	CPU *ResourceQuota `json:"cpu,omitempty"`
	// Memory is counted in bytes ("64Gi").
	Memory *ResourceQuota `json:"memory,omitempty"`
}

// ResourceQuota is the quota, limit and over-quota weight of one resource.
type ResourceQuota struct {
	// Quota is the deserved amount: non-preemptible work fits within it and
	// it can be reclaimed from other queues. Absent means zero.
	Quota *resource.Quantity `json:"quota,omitempty"`
	// Limit is a hard cap on use, over-quota work included. Absent means unlimited.
	Limit *resource.Quantity `json:"limit,omitempty"`
	// OverQuotaWeight is the queue's weight when the surplus beyond deserved
	// quotas is shared out among queues that want more. Absent means 1; 0
	// means the queue gets no surplus.
	OverQuotaWeight *int32 `json:"overQuotaWeight,omitempty"`
}

// QueueStatus is what the coordinator last observed for a queue. Allocated and
// requested amounts include the queue's children.
type QueueStatus struct {
	// Allocated is what the queue's bound and assumed pods use (keys gpu, cpu, memory).
	Allocated corev1.ResourceList `json:"allocated,omitempty"`
	// AllocatedNonPreemptible is the non-preemptible part of Allocated.
	AllocatedNonPreemptible corev1.ResourceList `json:"allocatedNonPreemptible,omitempty"`
	// Requested is what the queue's pending pods ask for.
	Requested corev1.ResourceList `json:"requested,omitempty"`
	// PendingGangs counts the workloads (gangs or single pods) waiting in the queue.
	PendingGangs int32 `json:"pendingGangs,omitempty"`
	// Conditions are the queue's conditions (for example a bad parent).
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ConditionValid is the Queue condition that says whether the coordinator
// could use the queue: False (reason ReasonInvalidQueue) with the problem
// in its message when the object does not convert, its numbers are wrong,
// or its parent is missing or invalid; its pods then stay pending with
// InvalidRequest saying the same.
const ConditionValid = "Valid"

// The reasons of ConditionValid.
const (
	ReasonQueueValid   = "Valid"
	ReasonInvalidQueue = "InvalidQueue"
)
