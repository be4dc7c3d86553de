// Package podstest helps test code that talks to the API server through
// pods.Client.
package podstest

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// Clientset is a pods.Client over a client-go clientset, usually
// k8s.io/client-go/kubernetes/fake's, so tests keep its object tracker,
// reactors and recorded actions. It stays out of gpufrac-node itself, which
// must not link the clientset (see pods.NewClient). It does not import
// package pods, so pods' own tests can use it; pods' tests check that it
// satisfies pods.Client.
type Clientset struct {
	kubernetes.Interface
}

// IsWatchListSemanticsUnSupported forwards client-go's marker of clients
// that cannot serve watch-list streams (the fake clientset is one), so an
// informer over this wrapper lists and watches as it would over the fake.
func (c Clientset) IsWatchListSemanticsUnSupported() bool {
	u, ok := c.Interface.(interface{ IsWatchListSemanticsUnSupported() bool })
	return ok && u.IsWatchListSemanticsUnSupported()
}

// ListPods implements pods.PodWatcher.
func (c Clientset) ListPods(ctx context.Context, namespace string, opts metav1.ListOptions) (*corev1.PodList, error) {
	return c.CoreV1().Pods(namespace).List(ctx, opts)
}

// WatchPods implements pods.PodWatcher.
func (c Clientset) WatchPods(ctx context.Context, namespace string, opts metav1.ListOptions) (watch.Interface, error) {
	return c.CoreV1().Pods(namespace).Watch(ctx, opts)
}

// PatchPod implements pods.PodAPI.
func (c Clientset) PatchPod(ctx context.Context, namespace, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions) (*corev1.Pod, error) {
	return c.CoreV1().Pods(namespace).Patch(ctx, name, pt, data, opts)
}

// EvictPod implements pods.Client.
func (c Clientset) EvictPod(ctx context.Context, eviction *policyv1.Eviction) error {
	return c.PolicyV1().Evictions(eviction.Namespace).Evict(ctx, eviction)
}

// GetNode implements pods.Client.
func (c Clientset) GetNode(ctx context.Context, name string) (*corev1.Node, error) {
	return c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
}

// PatchNode implements pods.Client.
func (c Clientset) PatchNode(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions) (*corev1.Node, error) {
	return c.CoreV1().Nodes().Patch(ctx, name, pt, data, opts)
}

// CreateEvent implements pods.Client.
func (c Clientset) CreateEvent(ctx context.Context, event *corev1.Event) (*corev1.Event, error) {
	return c.CoreV1().Events(event.Namespace).CreateWithEventNamespaceWithContext(ctx, event)
}

// PatchEvent implements pods.Client.
func (c Clientset) PatchEvent(ctx context.Context, event *corev1.Event, data []byte) (*corev1.Event, error) {
	return c.CoreV1().Events(event.Namespace).PatchWithEventNamespaceWithContext(ctx, event, data)
}
