package enforcement

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	policyv1client "k8s.io/client-go/kubernetes/typed/policy/v1"
)

// APIEvictor evicts pods through the policy/v1 Eviction API, so
// PodDisruptionBudgets and the pod's termination grace period apply.
type APIEvictor struct {
	client policyv1client.EvictionsGetter
}

var _ Evictor = (*APIEvictor)(nil)

// NewEvictor returns an APIEvictor posting evictions through client (a
// clientset's PolicyV1()).
func NewEvictor(client policyv1client.EvictionsGetter) *APIEvictor {
	return &APIEvictor{client: client}
}

// Evict implements Evictor. The eviction is preconditioned on the pod's UID,
// so a pod re-created under the same name is never evicted in its place.
func (e *APIEvictor) Evict(ctx context.Context, pod *corev1.Pod) error {
	uid := pod.UID
	ev := &policyv1.Eviction{
		ObjectMeta:    metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace},
		DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}},
	}
	if err := e.client.Evictions(pod.Namespace).Evict(ctx, ev); err != nil {
		return fmt.Errorf("evicting pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}
