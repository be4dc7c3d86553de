package pods

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
)

// inflightTTL bounds how long an Allocate answer the kubelet never reports
// (PodResources unreachable and the pod still Pending) keeps counting as a
// placed fraction. The kubelet records an allocation right after Allocate,
// so in practice entries resolve within one write-back period.
const inflightTTL = 10 * time.Minute

// informerLagWait is how long GPUFor waits for the pod informer when the
// kubelet asks for a fraction of a size no known pod is waiting for: the
// kubelet sees a binding through its own watch and may admit the pod before
// this agent's informer shows it. Without the wait, the fraction would go by
// best fit instead of where the coordinator planned it.
const informerLagWait = 500 * time.Millisecond

// informerLagPoll is how often GPUFor looks again while it waits.
const informerLagPoll = 10 * time.Millisecond

// reservationTakenTTL is how long a GPU handed to a reservation is skipped by
// ReservationGPU (see ReservationTaken).
const reservationTakenTTL = 3 * time.Second

// Hint watches the pods bound to this node. It tells the fraction resource
// which GPU the coordinator chose for the next fraction request
// (resource.PodHint), and writes back, from the kubelet's PodResources, the
// GPU each fraction pod (gpufrac.io/allocated-gpu) and each reservation pod
// (gpufrac.io/reserved-gpu) actually got, and the GPUs each pod holding
// whole GPUs got (gpufrac.io/allocated-gpu, comma-separated).
//
// Allocate does not say which pod it serves, so the hint matches counts, not
// pods: the coordinator's choices for pods of one size form a demand per GPU;
// containers known to be admitted (PodResources, the allocated-gpu
// annotation, or a phase past Pending) and Allocate answers not yet seen
// admitted (in flight) consume it at the GPU they actually got. Same-size
// pods are interchangeable: whichever the kubelet admits, the GPUs end up
// with the units the coordinator planned.
type Hint struct {
	client   PodAPI
	informer cache.SharedIndexInformer
	lister   corelisters.PodLister
	podRes   *PodResources
	resync   time.Duration
	clock    clock.PassiveClock
	lagWait  time.Duration // informerLagWait; tests shorten it

	mu sync.Mutex
	// listing: container -> fraction units it holds, from the last
	// PodResources listing (nil before the first).
	listing map[containerKey]admission
	// seen: containers already known admitted; a container entering it
	// resolves one in-flight entry.
	seen map[containerKey]struct{}
	// inflight are Allocate answers not yet seen admitted, oldest first.
	inflight []given
	// taken: GPU UUID -> handed to a reservation pod not yet written back.
	taken map[string]bool
	kick  chan struct{} // asks the write-back loop to run now
}

// containerKey names one container of a pod on this node. PodResources
// carries no pod UID, so namespace and name identify the pod.
type containerKey struct{ namespace, pod, container string }

// admission is a container's fraction allocation as far as the hint knows.
type admission struct {
	units int
	gpu   string // "" when only the pod's phase tells it was admitted
	// planned is the coordinator's GPU for the pod, the best guess when gpu is "".
	planned string
}

// given is one Allocate answer.
type given struct {
	gpu   string
	units int
	at    time.Time
}

var (
	_ resource.PodHint         = (*Hint)(nil)
	_ resource.ReservationHint = (*Hint)(nil)
)

// NewHint watches pods with spec.nodeName == node. podRes may be nil, and
// then nothing is written back and admissions are learnt from pod phases.
func NewHint(client PodAPI, node string, podRes *PodResources) *Hint {
	inf := NewNodeInformer(client, node)
	return &Hint{
		client:   client,
		informer: inf,
		lister:   corelisters.NewPodLister(inf.GetIndexer()),
		podRes:   podRes,
		resync:   2 * time.Second,
		clock:    clock.RealClock{},
		lagWait:  informerLagWait,
		seen:     map[containerKey]struct{}{},
		taken:    map[string]bool{},
		kick:     make(chan struct{}, 1),
	}
}

// Run starts the informer and the write-back loop until ctx ends.
func (h *Hint) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { h.informer.RunWithContext(ctx) })
	if !cache.WaitForNamedCacheSyncWithContext(ctx, h.informer.HasSynced) {
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
func (h *Hint) HasSynced() bool { return h.informer.HasSynced() }

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

func terminated(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// reconcileLocked returns every fraction container known to be admitted and
// resolves the in-flight entries of containers newly seen admitted. h.mu
// must be held.
func (h *Hint) reconcileLocked(pods []*corev1.Pod) map[containerKey]admission {
	admitted := make(map[containerKey]admission, len(h.listing))
	for k, a := range h.listing {
		admitted[k] = a
	}
	for _, p := range pods {
		past := p.Status.Phase != corev1.PodPending && p.Status.Phase != ""
		for i := range p.Spec.Containers {
			c := &p.Spec.Containers[i]
			n := FractionUnits(c)
			if n <= 0 {
				continue
			}
			key := containerKey{p.Namespace, p.Name, c.Name}
			if _, ok := admitted[key]; ok {
				continue
			}
			if gpu := p.Annotations[api.AnnotationAllocatedGPU]; gpu != "" {
				admitted[key] = admission{units: n, gpu: gpu}
			} else if past {
				admitted[key] = admission{units: n, planned: p.Annotations[api.AnnotationGPU]}
			}
		}
	}
	for key, a := range admitted {
		if _, ok := h.seen[key]; ok {
			continue
		}
		h.seen[key] = struct{}{}
		h.resolveLocked(a)
	}
	for key := range h.seen {
		if _, ok := admitted[key]; !ok {
			delete(h.seen, key)
		}
	}
	now := h.clock.Now()
	kept := h.inflight[:0]
	for _, g := range h.inflight {
		if now.Sub(g.at) < inflightTTL {
			kept = append(kept, g)
		}
	}
	h.inflight = kept
	return admitted
}

// resolveLocked drops the in-flight entry a newly admitted container
// accounts for: the one with its GPU and size, or, when its GPU is unknown,
// the oldest of its size on its planned GPU, else the oldest of its size. An
// admission with a known GPU and no such entry predates this process and
// resolves nothing.
func (h *Hint) resolveLocked(a admission) {
	match := func(gpu string) bool {
		for i, g := range h.inflight {
			if g.units == a.units && (gpu == "" || g.gpu == gpu) {
				h.inflight = append(h.inflight[:i], h.inflight[i+1:]...)
				return true
			}
		}
		return false
	}
	if a.gpu != "" {
		match(a.gpu)
		return
	}
	if a.planned == "" || !match(a.planned) {
		match("")
	}
}

// demandItem is one container of a pod the coordinator placed.
type demandItem struct {
	pod *corev1.Pod
	gpu string
}

func olderFirst(items []demandItem) {
	sort.SliceStable(items, func(i, j int) bool {
		a, b := items[i].pod, items[j].pod
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return a.CreationTimestamp.Before(&b.CreationTimestamp)
		}
		return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
	})
}

// ReservationGPU implements resource.ReservationHint: the GPU asked for by
// the oldest reservation pod bound here and not yet given a GPU.
func (h *Hint) ReservationGPU() (string, bool) {
	all, err := h.lister.Pods(api.SystemNamespace).List(labelsEverything())
	if err != nil {
		return "", false
	}
	var best *corev1.Pod
	for _, p := range all {
		if p.Labels[api.LabelRole] != api.RoleReservation || p.Annotations[api.AnnotationGPU] == "" || p.Annotations[api.AnnotationReservedGPU] != "" {
			continue
		}
		h.mu.Lock()
		taken := h.taken[p.Annotations[api.AnnotationGPU]]
		h.mu.Unlock()
		if taken {
			continue
		}
		if p.Status.Phase != corev1.PodPending && p.Status.Phase != "" {
			continue
		}
		if best == nil || p.CreationTimestamp.Before(&best.CreationTimestamp) || (p.CreationTimestamp.Equal(&best.CreationTimestamp) && p.Name < best.Name) {
			best = p
		}
	}
	if best == nil {
		return "", false
	}
	return best.Annotations[api.AnnotationGPU], true
}

// ReservationTaken implements resource.ReservationHint. The mark only has
// to outlive the admission in flight (the kubelet records the allocation
// right after Allocate; from then on it never offers the GPU again), so it
// is dropped after reservationTakenTTL. A longer mark kept a reservation
// whose GPU another one-GPU pod took from getting it back later.
func (h *Hint) ReservationTaken(uuid string) {
	h.mu.Lock()
	h.taken[uuid] = true
	h.mu.Unlock()
	time.AfterFunc(reservationTakenTTL, func() {
		h.mu.Lock()
		delete(h.taken, uuid)
		h.mu.Unlock()
	})
}

// GPUFor implements resource.PodHint. Among the containers of this size the
// coordinator placed here and the kubelet has not admitted yet, oldest
// first, it returns the first chosen GPU that still lacks a fraction of this
// size; with none, the GPU of any placed container whose planned fraction
// went elsewhere. ok is false when every such container is already served.
//
// When no container of this size on this node is waiting for admission in
// the informer's view (annotated by the coordinator or not), the kubelet is
// admitting a pod the informer has not shown yet: GPUFor waits for it up to
// informerLagWait before it answers.
func (h *Hint) GPUFor(units int) (string, bool) {
	deadline := time.Now().Add(h.lagWait)
	for {
		gpu, ok, unseen := h.gpuFor(units)
		if ok || !unseen || !time.Now().Before(deadline) {
			return gpu, ok
		}
		time.Sleep(informerLagPoll)
	}
}

// gpuFor is one look at the informer's pods for GPUFor. unseen tells that no
// container of this size is waiting for admission besides those already
// answered (in flight).
func (h *Hint) gpuFor(units int) (gpu string, ok, unseen bool) {
	pods, err := h.lister.List(labelsEverything())
	if err != nil {
		return "", false, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	admitted := h.reconcileLocked(pods)
	remaining := map[string]int{} // GPU UUID -> planned fractions of this size not yet given
	var waiting, all []demandItem
	pending := 0 // containers of this size not admitted, annotated or not
	for _, p := range pods {
		if terminated(p) {
			continue
		}
		gpu := p.Annotations[api.AnnotationGPU]
		for i := range p.Spec.Containers {
			c := &p.Spec.Containers[i]
			if FractionUnits(c) != units {
				continue
			}
			if _, ok := admitted[containerKey{p.Namespace, p.Name, c.Name}]; !ok {
				pending++
			}
			if gpu == "" {
				continue
			}
			it := demandItem{pod: p, gpu: gpu}
			all = append(all, it)
			remaining[gpu]++
			if a, ok := admitted[containerKey{p.Namespace, p.Name, c.Name}]; ok {
				got := a.gpu
				if got == "" {
					got = gpu // admitted, GPU unknown: assume as planned
				}
				remaining[got]--
			} else {
				waiting = append(waiting, it)
			}
		}
	}
	flying := 0
	for _, g := range h.inflight {
		if g.units == units {
			remaining[g.gpu]--
			flying++
		}
	}
	if len(waiting) <= flying {
		return "", false, pending <= flying
	}
	olderFirst(waiting)
	olderFirst(all)
	for _, it := range waiting {
		if remaining[it.gpu] > 0 {
			return it.gpu, true, false
		}
	}
	for _, it := range all {
		if remaining[it.gpu] > 0 {
			return it.gpu, true, false
		}
	}
	return waiting[0].gpu, true, false
}

// Allocated implements resource.PodHint: the answer counts as a placed
// fraction of this size on uuid until the kubelet reports the container
// that got it, and the write-back runs at once.
func (h *Hint) Allocated(ctx context.Context, uuid string, units int) {
	h.mu.Lock()
	h.inflight = append(h.inflight, given{gpu: uuid, units: units, at: h.clock.Now()})
	h.mu.Unlock()
	klog.FromContext(ctx).V(4).Info("Fraction allocated", "gpu", uuid, "units", units)
	if h.podRes != nil {
		h.podRes.Invalidate()
	}
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// writeBack annotates pods with the GPUs the kubelet's PodResources says
// they hold: fraction pods (gpufrac.io/allocated-gpu, the GPU of their
// units), reservation pods (gpufrac.io/reserved-gpu) and pods holding whole
// GPUs (gpufrac.io/allocated-gpu, the sorted, comma-separated device IDs of
// all their containers: GPU UUIDs, or MIG UUIDs in the single strategy).
// A pod holding both a fraction and whole GPUs keeps its fraction's GPU:
// the coordinator and the hint read allocated-gpu of fraction pods as one
// UUID.
func (h *Hint) writeBack(ctx context.Context) error {
	h.podRes.Invalidate()
	as, err := h.podRes.List(ctx)
	if err != nil {
		return err
	}
	listing := map[containerKey]admission{}
	want := map[types.NamespacedName]map[string]string{} // pod -> annotation -> GPU
	whole := map[types.NamespacedName][]string{}         // pod -> whole GPUs held, over its containers
	for _, a := range as {
		key := types.NamespacedName{Namespace: a.Namespace, Name: a.Pod}
		switch {
		case a.Resource == api.ResourceFraction:
			gpu, err := resource.GPUOfUnits(a.DeviceIDs)
			if err != nil {
				continue
			}
			listing[containerKey{a.Namespace, a.Pod, a.Container}] = admission{units: len(a.DeviceIDs), gpu: gpu}
			setWant(want, key, api.AnnotationAllocatedGPU, gpu)
		case a.Resource == api.ResourceGPU && IsReservation(a.Namespace, a.Pod):
			if len(a.DeviceIDs) == 1 {
				setWant(want, key, api.AnnotationReservedGPU, a.DeviceIDs[0])
			}
		case a.Resource == api.ResourceGPU:
			whole[key] = append(whole[key], a.DeviceIDs...)
		}
	}
	for key, ids := range whole {
		if _, ok := want[key][api.AnnotationAllocatedGPU]; ok || len(ids) == 0 {
			continue // a fraction's GPU, or nothing to say
		}
		slices.Sort(ids)
		setWant(want, key, api.AnnotationAllocatedGPU, strings.Join(slices.Compact(ids), ","))
	}
	if pods, err := h.lister.List(labelsEverything()); err == nil {
		h.mu.Lock()
		h.listing = listing
		h.reconcileLocked(pods)
		h.mu.Unlock()
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
			continue
		}
		body, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": patch}})
		if err != nil {
			return fmt.Errorf("encoding annotations of pod %s: %w", key, err)
		}
		if _, err := h.client.PatchPod(ctx, key.Namespace, key.Name, types.MergePatchType, body, metav1PatchOptions()); err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("annotating pod %s: %w", key, err)
			}
			continue
		}
		klog.FromContext(ctx).V(2).Info("Wrote back GPU", "pod", klog.KObj(p), "annotations", patch)
	}
	return firstErr
}

func setWant(want map[types.NamespacedName]map[string]string, key types.NamespacedName, ann, gpu string) {
	if want[key] == nil {
		want[key] = map[string]string{}
	}
	want[key][ann] = gpu
}
