package pods

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
)

// Hint watches the pods bound to this node. It tells the fraction resource
// which GPU the coordinator chose for the next fraction request
// (resource.PodHint), and writes back, from the kubelet's PodResources, the
// GPU each fraction pod (gpufrac.io/allocated-gpu) and each reservation pod
// (gpufrac.io/reserved-gpu) actually got.
type Hint struct {
	client  kubernetes.Interface
	factory informers.SharedInformerFactory
	lister  corelisters.PodLister
	synced  cache.InformerSynced
	podRes  *PodResources
	resync  time.Duration

	mu       sync.Mutex
	assigned map[types.UID]string // pod UID -> GPU given, until PodResources and the annotation show it
	kick     chan struct{}        // asks the write-back loop to run now
}

var _ resource.PodHint = (*Hint)(nil)

// NewHint watches pods with spec.nodeName == node. podRes may be nil, and
// then nothing is written back.
func NewHint(client kubernetes.Interface, node string, podRes *PodResources) *Hint {
	f := informers.NewSharedInformerFactoryWithOptions(client, 10*time.Minute,
		informers.WithTweakListOptions(func(o *metav1ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
		}))
	inf := f.Core().V1().Pods()
	return &Hint{
		client:   client,
		factory:  f,
		lister:   inf.Lister(),
		synced:   inf.Informer().HasSynced,
		podRes:   podRes,
		resync:   2 * time.Second,
		assigned: map[types.UID]string{},
		kick:     make(chan struct{}, 1),
	}
}

// Run starts the informer and the write-back loop until ctx ends.
func (h *Hint) Run(ctx context.Context) error {
	h.factory.Start(ctx.Done())
	defer h.factory.Shutdown()
	if !cache.WaitForNamedCacheSyncWithContext(ctx, h.synced) {
		return fmt.Errorf("waiting for the pod informer: %w", ctx.Err())
	}
	if h.podRes == nil {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(h.resync)
	defer t.Stop()
	for {
		if err := h.writeBack(ctx); err != nil {
			klog.FromContext(ctx).V(2).Info("Writing back allocated GPUs failed; will retry", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-h.kick:
		}
	}
}

// HasSynced tells whether the pod informer has synced.
func (h *Hint) HasSynced() bool { return h.synced() }

// FractionUnits is the number of fraction units a container asks for.
func FractionUnits(c *corev1.Container) int {
	q, ok := c.Resources.Limits[api.ResourceFraction]
	if !ok {
		q, ok = c.Resources.Requests[api.ResourceFraction]
	}
	if !ok {
		return 0
	}
	return int(q.Value())
}

// candidates are the pods waiting for fraction units of this size: bound
// here, annotated by the coordinator, not yet allocated, oldest first.
func (h *Hint) candidates(units int) []*corev1.Pod {
	all, err := h.lister.List(labelsEverything())
	if err != nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []*corev1.Pod
	for _, p := range all {
		if p.Annotations[api.AnnotationGPU] == "" || p.Annotations[api.AnnotationAllocatedGPU] != "" {
			continue
		}
		if p.Status.Phase != corev1.PodPending && p.Status.Phase != "" {
			continue
		}
		if _, done := h.assigned[p.UID]; done {
			continue
		}
		for i := range p.Spec.Containers {
			if FractionUnits(&p.Spec.Containers[i]) == units {
				out = append(out, p)
				break
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return a.CreationTimestamp.Before(&b.CreationTimestamp)
		}
		return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
	})
	return out
}

// GPUFor implements resource.PodHint.
func (h *Hint) GPUFor(units int) (string, bool) {
	c := h.candidates(units)
	if len(c) == 0 {
		return "", false
	}
	return c[0].Annotations[api.AnnotationGPU], true
}

// Allocated implements resource.PodHint. Same-size pods are
// interchangeable: the pod whose chosen GPU matches is preferred, else the
// oldest of that size. The write-back from PodResources records the truth.
func (h *Hint) Allocated(ctx context.Context, uuid string, units int) {
	c := h.candidates(units)
	if len(c) == 0 {
		return
	}
	pick := c[0]
	for _, p := range c {
		if p.Annotations[api.AnnotationGPU] == uuid {
			pick = p
			break
		}
	}
	h.mu.Lock()
	h.assigned[pick.UID] = uuid
	h.mu.Unlock()
	klog.FromContext(ctx).V(4).Info("Fraction allocated", "pod", klog.KObj(pick), "gpu", uuid, "units", units)
	if h.podRes != nil {
		h.podRes.Invalidate()
	}
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// writeBack annotates fraction and reservation pods with the GPU the
// kubelet's PodResources says they hold.
func (h *Hint) writeBack(ctx context.Context) error {
	h.podRes.Invalidate()
	as, err := h.podRes.List(ctx)
	if err != nil {
		return err
	}
	want := map[types.NamespacedName]map[string]string{} // pod -> annotation -> GPU
	for _, a := range as {
		key := types.NamespacedName{Namespace: a.Namespace, Name: a.Pod}
		switch {
		case a.Resource == api.ResourceFraction:
			gpu, err := resource.GPUOfUnits(a.DeviceIDs)
			if err != nil {
				continue
			}
			setWant(want, key, api.AnnotationAllocatedGPU, gpu)
		case a.Resource == api.ResourceGPU && IsReservation(a.Namespace, a.Pod) && len(a.DeviceIDs) == 1:
			setWant(want, key, api.AnnotationReservedGPU, a.DeviceIDs[0])
		}
	}
	var firstErr error
	for key, anns := range want {
		p, err := h.lister.Pods(key.Namespace).Get(key.Name)
		if err != nil {
			continue // not in the cache (yet, or any more)
		}
		patch := map[string]string{}
		for k, v := range anns {
			if p.Annotations[k] != v {
				patch[k] = v
			}
		}
		if len(patch) == 0 {
			h.forget(p.UID)
			continue
		}
		body, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": patch}})
		if _, err := h.client.CoreV1().Pods(key.Namespace).Patch(ctx, key.Name, types.MergePatchType, body, metav1PatchOptions()); err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("annotating pod %s: %w", key, err)
			}
			continue
		}
		klog.FromContext(ctx).V(2).Info("Wrote back GPU", "pod", klog.KObj(p), "annotations", patch)
		h.forget(p.UID)
	}
	return firstErr
}

func (h *Hint) forget(uid types.UID) {
	h.mu.Lock()
	delete(h.assigned, uid)
	h.mu.Unlock()
}

func setWant(want map[types.NamespacedName]map[string]string, key types.NamespacedName, ann, gpu string) {
	if want[key] == nil {
		want[key] = map[string]string{}
	}
	want[key][ann] = gpu
}
