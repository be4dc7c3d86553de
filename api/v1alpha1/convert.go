package v1alpha1

import (
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// FromUnstructured converts a queue read with the dynamic client. It fails on
// any other group/kind and on fields that do not fit the types (the API
// server's schema normally rules those out). Unknown fields are dropped.
func FromUnstructured(u *unstructured.Unstructured) (*Queue, error) {
	if u == nil {
		return nil, fmt.Errorf("converting queue: nil object")
	}
	if gvk := u.GroupVersionKind(); gvk != QueueGVK() {
		return nil, fmt.Errorf("converting queue %q: object is %s, want %s", u.GetName(), gvk, QueueGVK())
	}
	q := &Queue{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.UnstructuredContent(), q); err != nil {
		// The converter's errors do not name the field ("unrecognized type:
		// int32"); encoding/json's do, and the message goes to the Queue's
		// condition and its pods.
		if raw, jerr := json.Marshal(u.UnstructuredContent()); jerr == nil {
			if jerr := json.Unmarshal(raw, &Queue{}); jerr != nil {
				err = jerr
			}
		}
		return nil, fmt.Errorf("converting queue %q: %w", u.GetName(), err)
	}
	return q, nil
}

// ToUnstructured converts a queue for the dynamic client (create, update,
// UpdateStatus). It sets apiVersion and kind when they are empty.
func ToUnstructured(q *Queue) (*unstructured.Unstructured, error) {
	if q == nil {
		return nil, fmt.Errorf("converting queue: nil object")
	}
	q = q.DeepCopy()
	if q.APIVersion == "" {
		q.APIVersion = APIVersion
	}
	if q.Kind == "" {
		q.Kind = QueueKind
	}
	content, err := runtime.DefaultUnstructuredConverter.ToUnstructured(q)
	if err != nil {
		return nil, fmt.Errorf("converting queue %q: %w", q.Name, err)
	}
	return &unstructured.Unstructured{Object: content}, nil
}

// DeepCopy returns an independent copy of q (nil for nil), for caches that
// must not share objects with the informer's store.
func (q *Queue) DeepCopy() *Queue {
	if q == nil {
		return nil
	}
	out := &Queue{TypeMeta: q.TypeMeta, Spec: q.Spec, Status: q.Status}
	q.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	out.Spec.Namespaces = copyStrings(q.Spec.Namespaces)
	out.Spec.Resources = QueueResources{
		GPU:    q.Spec.Resources.GPU.deepCopy(),
		CPU:    q.Spec.Resources.CPU.deepCopy(),
		Memory: q.Spec.Resources.Memory.deepCopy(),
	}
	out.Status.Allocated = copyList(q.Status.Allocated)
	out.Status.AllocatedNonPreemptible = copyList(q.Status.AllocatedNonPreemptible)
	out.Status.Requested = copyList(q.Status.Requested)
	if q.Status.Conditions != nil {
		out.Status.Conditions = make([]metav1.Condition, len(q.Status.Conditions))
		for i := range q.Status.Conditions {
			q.Status.Conditions[i].DeepCopyInto(&out.Status.Conditions[i])
		}
	}
	return out
}

func (r *ResourceQuota) deepCopy() *ResourceQuota {
	if r == nil {
		return nil
	}
	out := &ResourceQuota{}
	if r.Quota != nil {
		v := r.Quota.DeepCopy()
		out.Quota = &v
	}
	if r.Limit != nil {
		v := r.Limit.DeepCopy()
		out.Limit = &v
	}
	if r.OverQuotaWeight != nil {
		w := *r.OverQuotaWeight
		out.OverQuotaWeight = &w
	}
	return out
}

func copyList(l corev1.ResourceList) corev1.ResourceList {
	if l == nil {
		return nil
	}
	return l.DeepCopy()
}

func copyStrings(s []string) []string {
	if s == nil {
		return nil
	}
	return append([]string{}, s...)
}
