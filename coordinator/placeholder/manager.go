package placeholder

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
)

// Manager creates and deletes placeholder pods.
type Manager struct {
	client   kubernetes.Interface
	recorder record.EventRecorder
}

// NewManager returns a manager; recorder may be nil.
func NewManager(client kubernetes.Interface, recorder record.EventRecorder) *Manager {
	if recorder == nil {
		recorder = &record.FakeRecorder{}
	}
	return &Manager{client: client, recorder: recorder}
}

// Create creates a placeholder (AlreadyExists is success: names are
// deterministic), and first the ResourceClaimTemplate of a DRA placeholder.
func (m *Manager) Create(ctx context.Context, p *corev1.Pod) error {
	if t := ClaimTemplate(p); t != nil {
		_, err := m.client.ResourceV1().ResourceClaimTemplates(t.Namespace).Create(ctx, t, metav1.CreateOptions{FieldManager: "gpufrac-coordinator"})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating the claim template of placeholder %s: %w", p.Name, err)
		}
	}
	_, err := m.client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{FieldManager: "gpufrac-coordinator"})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating placeholder %s: %w", p.Name, err)
	}
	if err == nil {
		klog.FromContext(ctx).V(2).Info("Created placeholder", "pod", klog.KObj(p), "gpus", p.Spec.Containers[0].Resources.Limits.Name("nvidia.com/gpu", "").Value(), "workloads", p.Annotations[AnnotationWorkloads])
	}
	return nil
}

// Delete deletes a placeholder (NotFound is success).
func (m *Manager) Delete(ctx context.Context, p *corev1.Pod, why string) error {
	zero := int64(0)
	err := m.client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting placeholder %s: %w", p.Name, err)
	}
	if ClaimTemplate(p) != nil {
		err := m.client.ResourceV1().ResourceClaimTemplates(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting the claim template of placeholder %s: %w", p.Name, err)
		}
	}
	klog.FromContext(ctx).V(2).Info("Deleted placeholder", "pod", klog.KObj(p), "node", p.Spec.NodeName, "why", why)
	return nil
}
