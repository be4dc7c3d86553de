package builders

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpufrac/gpufrac/api/v1alpha1"
)

// QueueWrapper builds a gpufrac.io/v1alpha1 Queue.
type QueueWrapper struct{ queue v1alpha1.Queue }

// MakeQueue starts a top-level queue that manages no resources.
func MakeQueue(name string) *QueueWrapper {
	return &QueueWrapper{queue: v1alpha1.Queue{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.QueueKind},
		ObjectMeta: metav1.ObjectMeta{Name: name},
	}}
}

// Obj returns a deep copy of the queue.
func (w *QueueWrapper) Obj() *v1alpha1.Queue { return w.queue.DeepCopy() }

// Parent sets spec.parent.
func (w *QueueWrapper) Parent(name string) *QueueWrapper {
	w.queue.Spec.Parent = name
	return w
}

// Priority sets spec.priority.
func (w *QueueWrapper) Priority(p int32) *QueueWrapper {
	w.queue.Spec.Priority = p
	return w
}

// GPUQuota sets the deserved GPUs ("2.5").
func (w *QueueWrapper) GPUQuota(q string) *QueueWrapper {
	quotaOf(&w.queue.Spec.Resources.GPU).Quota = quantity(q)
	return w
}

// GPULimit sets the GPU limit.
func (w *QueueWrapper) GPULimit(q string) *QueueWrapper {
	quotaOf(&w.queue.Spec.Resources.GPU).Limit = quantity(q)
	return w
}

// GPUWeight sets the GPU over-quota weight.
func (w *QueueWrapper) GPUWeight(weight int32) *QueueWrapper {
	quotaOf(&w.queue.Spec.Resources.GPU).OverQuotaWeight = &weight
	return w
}

// CPUQuota sets the deserved CPUs.
func (w *QueueWrapper) CPUQuota(q string) *QueueWrapper {
	quotaOf(&w.queue.Spec.Resources.CPU).Quota = quantity(q)
	return w
}

// CPULimit sets the CPU limit.
func (w *QueueWrapper) CPULimit(q string) *QueueWrapper {
	quotaOf(&w.queue.Spec.Resources.CPU).Limit = quantity(q)
	return w
}

// MemoryQuota sets the deserved memory.
func (w *QueueWrapper) MemoryQuota(q string) *QueueWrapper {
	quotaOf(&w.queue.Spec.Resources.Memory).Quota = quantity(q)
	return w
}

// MemoryLimit sets the memory limit.
func (w *QueueWrapper) MemoryLimit(q string) *QueueWrapper {
	quotaOf(&w.queue.Spec.Resources.Memory).Limit = quantity(q)
	return w
}

func quotaOf(p **v1alpha1.ResourceQuota) *v1alpha1.ResourceQuota {
	if *p == nil {
		*p = &v1alpha1.ResourceQuota{}
	}
	return *p
}

func quantity(s string) *resource.Quantity {
	q := resource.MustParse(s)
	return &q
}

// Namespaces sets spec.namespaces: the namespaces whose pods may use the
// queue (v1alpha1.AllNamespaces for every one).
func (w *QueueWrapper) Namespaces(ns ...string) *QueueWrapper {
	w.queue.Spec.Namespaces = append([]string{}, ns...)
	return w
}

// Admission sets spec.admission: who admits the queue's work against quota
// (v1alpha1.AdmissionKueue: Kueue).
func (w *QueueWrapper) Admission(a v1alpha1.QueueAdmission) *QueueWrapper {
	w.queue.Spec.Admission = a
	return w
}
