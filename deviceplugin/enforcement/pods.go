package enforcement

import (
	"context"
	"fmt"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/gpufrac/gpufrac/deviceplugin/pods"
)

// PodInformer is a PodLookup over an informer on the pods bound to one node,
// indexed by UID.
type PodInformer struct {
	informer cache.SharedIndexInformer
}

var _ PodLookup = (*PodInformer)(nil)

// uidIndex is the informer index from pod UID to pod.
const uidIndex = "uid"

// NewPodInformer watches the pods with spec.nodeName == node. Call Run.
func NewPodInformer(client kubernetes.Interface, node string) (*PodInformer, error) {
	inf := pods.NewNodeInformer(client, node)
	if err := inf.AddIndexers(cache.Indexers{uidIndex: podUID}); err != nil {
		return nil, fmt.Errorf("indexing pods by UID: %w", err)
	}
	// Container statuses and the owner are all the watchdog reads; managed
	// fields are the bulk of a pod and are never needed.
	if err := inf.SetTransform(stripManagedFields); err != nil {
		return nil, fmt.Errorf("setting the pod informer transform: %w", err)
	}
	return &PodInformer{informer: inf}, nil
}

func stripManagedFields(obj any) (any, error) {
	if p, ok := obj.(*corev1.Pod); ok {
		p.ManagedFields = nil
	}
	return obj, nil
}

func podUID(obj any) ([]string, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return nil, nil
	}
	return []string{string(p.UID)}, nil
}

// Run starts the informer and blocks until ctx ends.
func (p *PodInformer) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { p.informer.RunWithContext(ctx) })
	if !cache.WaitForNamedCacheSyncWithContext(ctx, p.informer.HasSynced) {
		return fmt.Errorf("waiting for the enforcement pod informer: %w", ctx.Err())
	}
	<-ctx.Done()
	return nil
}

// HasSynced tells whether the informer has listed the node's pods.
func (p *PodInformer) HasSynced() bool { return p.informer.HasSynced() }

// PodByUID implements PodLookup. Before the informer has synced every pod
// is unknown, so no process is acted on from a partial view.
func (p *PodInformer) PodByUID(uid types.UID) (*corev1.Pod, bool) {
	if !p.informer.HasSynced() {
		return nil, false
	}
	objs, err := p.informer.GetIndexer().ByIndex(uidIndex, string(uid))
	if err != nil || len(objs) == 0 {
		return nil, false
	}
	pod, ok := objs[0].(*corev1.Pod)
	return pod, ok
}

// ContainerName returns the name of the container of pod whose runtime ID
// is id (init, regular and ephemeral containers), matching the status's
// "<runtime>://<id>".
func ContainerName(pod *corev1.Pod, id string) (string, bool) {
	if id == "" {
		return "", false
	}
	for _, list := range [][]corev1.ContainerStatus{pod.Status.ContainerStatuses, pod.Status.InitContainerStatuses, pod.Status.EphemeralContainerStatuses} {
		for _, cs := range list {
			if _, cid, ok := strings.Cut(cs.ContainerID, "://"); ok && cid == id {
				return cs.Name, true
			}
		}
	}
	return "", false
}
