package enforcement

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// EvictionAPI posts evictions (pods.Client does).
type EvictionAPI interface {
	// EvictPod posts a policy/v1 Eviction for the pod it names.
	EvictPod(ctx context.Context, eviction *policyv1.Eviction) error
}

// APIEvictor evicts pods through the policy/v1 Eviction API, so
// PodDisruptionBudgets and the pod's termination grace period apply.
type APIEvictor struct {
	client EvictionAPI
}

var _ Evictor = (*APIEvictor)(nil)

// NewEvictor returns an APIEvictor using client.
func NewEvictor(client EvictionAPI) *APIEvictor { return &APIEvictor{client: client} }

// Evict implements Evictor. The eviction is preconditioned on the pod's UID,
// so a pod re-created under the same name is never evicted in its place.
func (e *APIEvictor) Evict(ctx context.Context, pod *corev1.Pod) error {
	uid := pod.UID
	ev := &policyv1.Eviction{
		ObjectMeta:    metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace},
		DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}},
	}
	if err := e.client.EvictPod(ctx, ev); err != nil {
		return fmt.Errorf("evicting pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}
