package pods

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// nodePods is the hint's view of the pods bound to this node: the pod
// informer (NewNodeInformer) and its lister.
type nodePods struct {
	informer cache.SharedIndexInformer
	lister   corelisters.PodLister
}

func newNodePods(client kubernetes.Interface, node string) *nodePods {
	inf := NewNodeInformer(client, node)
	return &nodePods{informer: inf, lister: corelisters.NewPodLister(inf.GetIndexer())}
}

// run runs the informer until ctx ends.
func (n *nodePods) run(ctx context.Context) { n.informer.RunWithContext(ctx) }

// waitForSync waits until the informer has synced; false if ctx ended first.
func (n *nodePods) waitForSync(ctx context.Context) bool {
	return cache.WaitForNamedCacheSyncWithContext(ctx, n.informer.HasSynced)
}

func (n *nodePods) hasSynced() bool { return n.informer.HasSynced() }

// get returns the pod of that name as the informer shows it now.
func (n *nodePods) get(namespace, name string) (*corev1.Pod, bool) {
	p, err := n.lister.Pods(namespace).Get(name)
	return p, err == nil
}

// list returns every pod the informer shows now.
func (n *nodePods) list() ([]*corev1.Pod, error) { return n.lister.List(labels.Everything()) }
