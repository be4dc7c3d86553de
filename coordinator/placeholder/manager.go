package placeholder

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// Manager creates and deletes placeholder pods.
type Manager struct {
	client   kubernetes.Interface
	recorder record.EventRecorder
	clock    clock.PassiveClock
}

// NewManager returns a manager; recorder may be nil.
func NewManager(client kubernetes.Interface, recorder record.EventRecorder) *Manager {
	if recorder == nil {
		recorder = &record.FakeRecorder{}
	}
	return &Manager{client: client, recorder: recorder, clock: clock.RealClock{}}
}

// Create creates a placeholder (AlreadyExists is success: names are
// deterministic), and first the ResourceClaimTemplate of a DRA placeholder;
// then it marks it Unschedulable (MarkUnschedulable), since no scheduler
// will. An error there leaves the pod created but not yet asking: the
// caller marks it again later (AsksKarpenter tells).
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
	if p.Spec.SchedulerName != SchedulerName {
		return nil // kube-scheduler's: it writes the condition
	}
	return m.MarkUnschedulable(ctx, p)
}

// MarkUnschedulable writes the PodScheduled condition Karpenter provisions
// for (False, reason Unschedulable) on a placeholder no scheduler serves.
// Only placeholders get it: on the coordinator's own pods that reason is
// never written (package binder), so over-quota work buys no node.
func (m *Manager) MarkUnschedulable(ctx context.Context, p *corev1.Pod) error {
	if !IsPlaceholder(p) {
		return fmt.Errorf("marking %s/%s Unschedulable: not a placeholder", p.Namespace, p.Name)
	}
	cond := map[string]any{
		"type": corev1.PodScheduled, "status": corev1.ConditionFalse, "reason": corev1.PodReasonUnschedulable,
		"message":            "gpufrac-coordinator asks Karpenter for capacity for " + p.Annotations[AnnotationWorkloads],
		"lastTransitionTime": m.clock.Now().UTC().Format(time.RFC3339),
	}
	body, _ := json.Marshal(map[string]any{"status": map[string]any{"conditions": []any{cond}}})
	_, err := m.client.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.StrategicMergePatchType, body, metav1.PatchOptions{FieldManager: "gpufrac-coordinator"}, "status")
	if err != nil {
		return fmt.Errorf("marking placeholder %s Unschedulable: %w", p.Name, err)
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
