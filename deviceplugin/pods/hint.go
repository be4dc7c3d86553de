package pods

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpufrac/gpufrac/api"
	gpurequest "github.com/gpufrac/gpufrac/api/request"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
)

// informerLagWait is how long GPUFor waits for the pod informer when the
// kubelet asks for a fraction of a size no known pod is waiting for: the
// kubelet sees a binding through its own watch and may admit the pod before
// this agent's informer shows it. Without the wait, the fraction would go by
// best fit instead of where the coordinator planned it.
const informerLagWait = 500 * time.Millisecond

// informerLagPoll is how often GPUFor looks again while it waits.
const informerLagPoll = 10 * time.Millisecond

// Hint watches the pods bound to this node and keeps one record per pod
// UID: what the pod asks (read by the request model, api/request), the GPU
// the coordinator chose for its fractions, the Allocate answers the kubelet
// got for it, and what the kubelet's PodResources says it holds. From those
// records it tells the fraction resource which GPU the coordinator chose
// for the next fraction request (resource.PodHint), refuses fractions asked
// by init containers, tells the whole-GPU resource which GPU a waiting
// reservation pod asks for (resource.ReservationHint), and writes back the
// GPU each fraction pod (gpufrac.io/allocated-gpu), each reservation pod
// (gpufrac.io/reserved-gpu) and each pod holding whole GPUs
// (gpufrac.io/allocated-gpu, comma-separated) actually got.
//
// The records are a ledger (ledger.go: pure, guarded by mu); the pods come
// from the node's pod informer (informer.go); the write-back loop
// (writeback.go) patches the annotations.
//
// Untrusted input: gpufrac.io/gpu is a pod annotation. The coordinator
// writes it through the binding (CONTRACT: only the binding may set it, as
// the admission policies enforce), but where the policies are missing any
// pod's author can. So it is read only from pods whose spec.schedulerName
// is the coordinator's (WithSchedulerName), and the fraction resource
// honours it only on a GPU a reservation pod holds (see
// resource.Fraction.Preferred). gpufrac.io/allocated-gpu on a pod is read as
// "admitted": a pod's author who forges it only loses their own hint.
//
// Allocate does not say which pod it serves (the kubelet admits pods one at
// a time, container by container). An answer is recorded on the waiting
// container of its size the coordinator planned on that GPU, else on the
// oldest waiting container of its size; when the kubelet's PodResources (or
// the pod's phase) later tells which container really got which GPU, the
// answer moves to that container's record. Same-size pods are thus
// interchangeable only until the kubelet says who got what: whichever the
// kubelet admits first, the GPUs end up with the units the coordinator
// planned, and each record ends with what its pod holds.
type Hint struct {
	client    kubernetes.Interface
	pods      *nodePods
	podRes    *PodResources
	resync    time.Duration
	retries   []time.Duration // writeBackRetries; tests may change them
	clock     clock.WithTicker
	lagWait   time.Duration // informerLagWait; tests shorten it
	scheduler string        // the coordinator's scheduler name

	mu     sync.Mutex
	ledger *ledger // guarded by mu

	kick chan struct{} // asks the write-back loop to run now
}

var (
	_ resource.PodHint            = (*Hint)(nil)
	_ resource.ReservationHint    = (*Hint)(nil)
	_ resource.AllocationRecorder = (*Hint)(nil)
)

// HintOption configures a Hint.
type HintOption func(*Hint)

// WithSchedulerName sets the coordinator's scheduler name: only pods with
// it have their gpufrac.io/gpu read (default api.SchedulerName).
func WithSchedulerName(name string) HintOption {
	return func(h *Hint) {
		if name != "" {
			h.scheduler = name
		}
	}
}

// WithClock sets the clock of the informer-lag wait, the answers' expiry,
// the reservation marks and the write-back period (default the real clock).
func WithClock(c clock.WithTicker) HintOption {
	return func(h *Hint) { h.clock = c }
}

// NewHint watches pods with spec.nodeName == node. podRes may be nil, and
// then nothing is written back and admissions are learnt from pod phases.
func NewHint(client kubernetes.Interface, node string, podRes *PodResources, opts ...HintOption) *Hint {
	h := &Hint{
		client:    client,
		pods:      newNodePods(client, node),
		podRes:    podRes,
		resync:    writeBackResync,
		retries:   writeBackRetries(),
		clock:     clock.RealClock{},
		lagWait:   informerLagWait,
		scheduler: api.SchedulerName,
		kick:      make(chan struct{}, 1),
	}
	for _, o := range opts {
		o(h)
	}
	h.ledger = newLedger(h.scheduler)
	return h
}

// Run starts the informer and, with PodResources, the write-back loop
// until ctx ends.
func (h *Hint) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { h.pods.run(ctx) })
	if !h.pods.waitForSync(ctx) {
		return fmt.Errorf("waiting for the pod informer: %w", ctx.Err())
	}
	if h.podRes == nil {
		<-ctx.Done()
		return nil
	}
	h.writeBackLoop(ctx)
	return nil
}

// HasSynced tells whether the pod informer has synced.
func (h *Hint) HasSynced() bool { return h.pods.hasSynced() }

// Pod returns the pod of that name bound to this node, as the informer
// shows it now.
func (h *Hint) Pod(namespace, name string) (*corev1.Pod, bool) { return h.pods.get(namespace, name) }

// FractionUnits is the number of fraction units a container asks for, as
// the request model reads it (its limit, else its request).
func FractionUnits(c *corev1.Container) int {
	p := gpurequest.Parse(&corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{*c}}}, gpurequest.Options{})
	return p.Fraction()
}

// reconcile brings the ledger in line with the informer's pods. It returns
// false when the informer cannot be read.
func (h *Hint) reconcile() bool {
	pods, err := h.pods.list()
	if err != nil {
		return false
	}
	h.mu.Lock()
	h.ledger.reconcile(pods, h.clock.Now())
	h.mu.Unlock()
	return true
}

// ReservationGPU implements resource.ReservationHint: the GPU asked for by
// the oldest reservation pod bound here, waiting for admission and not yet
// handed a GPU.
func (h *Hint) ReservationGPU() (string, bool) {
	if !h.reconcile() {
		return "", false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if r := h.ledger.waitingReservation("", h.clock.Now()); r != nil {
		return r.planned, true
	}
	return "", false
}

// ReservationTaken implements resource.ReservationHint: the reservations
// waiting for uuid are marked handed. The mark only has to outlive the
// admission in flight (the kubelet records the allocation right after
// Allocate; from then on PodResources shows it), so it lasts
// reservationTakenTTL. A longer mark kept a reservation whose GPU another
// one-GPU pod took from getting it back later.
func (h *Hint) ReservationTaken(uuid string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ledger.reservationTaken(uuid, h.clock.Now())
}

// ReservationOnly implements resource.ReservationHint. It reads the
// kubelet's PodResources again (the list is cached briefly and dropped
// after every allocation), so that pods already admitted do not count as
// waiting.
//
// A waiting whole-GPU pod that carries gpufrac.io/allocated-gpu while the
// listing does not show it holding GPUs is not taken for admitted at once:
// the annotation is written only after a listing showed the allocation, so
// either the listing lags or the annotation is not the node agent's
// (untrusted: a pod's author can forge it where the admission policies are
// missing, and a pod re-created under the name can show the old one's for
// a moment). As GPUFor does for the informer's lag, ReservationOnly lists
// again until informerLagWait has passed, and then counts the pod as
// waiting (the shared GPU is refused: fail closed).
func (h *Hint) ReservationOnly(ctx context.Context, uuid string) bool {
	deadline := h.clock.Now().Add(h.lagWait)
	for {
		only, unsure := h.reservationOnly(ctx, uuid)
		if !unsure {
			return only
		}
		if !h.clock.Now().Before(deadline) {
			klog.FromContext(ctx).V(2).Info("A GPU carrying fractions is not given whole: a waiting pod claims whole GPUs (gpufrac.io/allocated-gpu) the kubelet does not list",
				"gpu", uuid)
			return false
		}
		<-h.clock.After(informerLagPoll)
	}
}

// reservationOnly is one look for ReservationOnly (see ledger.reservationOnly).
func (h *Hint) reservationOnly(ctx context.Context, uuid string) (only, unsure bool) {
	if h.podRes != nil {
		if as, err := h.podRes.List(ctx); err == nil {
			li := newListing(as)
			h.mu.Lock()
			h.ledger.setListing(li)
			h.mu.Unlock()
		}
	}
	if !h.reconcile() {
		return false, false
	}
	h.mu.Lock()
	only, unsure, blocker := h.ledger.reservationOnly(uuid)
	h.mu.Unlock()
	if blocker != nil {
		klog.FromContext(ctx).V(2).Info("A GPU carrying fractions is not given whole while a pod other than its reservation waits for whole GPUs",
			"gpu", uuid, "waiting", klog.KObj(blocker))
	}
	return only, unsure
}

// GPUFor implements resource.PodHint. Among the containers of this size
// the coordinator placed here and the kubelet has not admitted yet, oldest
// first, it returns the first chosen GPU that still lacks a fraction of this
// size; with none, the GPU of any placed container whose planned fraction
// went elsewhere. ok is false when every such container is already served.
//
// When no container of this size on this node is waiting for admission in
// the informer's view (the coordinator's or not), the kubelet is admitting
// a pod the informer has not shown yet: GPUFor waits for it up to
// informerLagWait, on the hint's clock, before it answers.
func (h *Hint) GPUFor(units int) (string, bool) {
	deadline := h.clock.Now().Add(h.lagWait)
	for {
		gpu, ok, unseen := h.gpuFor(units)
		if ok || !unseen || !h.clock.Now().Before(deadline) {
			return gpu, ok
		}
		<-h.clock.After(informerLagPoll)
	}
}

// gpuFor is one look for GPUFor (see ledger.gpuFor).
func (h *Hint) gpuFor(units int) (gpu string, ok, unseen bool) {
	if !h.reconcile() {
		return "", false, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ledger.gpuFor(units)
}

// ErrInitContainerFraction is returned (wrapped, naming the pod) for a
// fraction request that only init containers can be asking for.
var ErrInitContainerFraction = fmt.Errorf("fractions (%s) are served to app containers only: "+
	"the kubelet reports no init container's devices, so gpufrac-node could neither record nor limit the share; move the fraction to an app container", api.ResourceFraction)

// Refusal implements resource.PodHint: a request for units is refused
// while a pod waiting for admission here asks that many units in an init
// container. Allocate does not say which pod it serves, so when such a pod
// waits beside an app container of the same size the request is refused
// too (fail closed): the kubelet admits one pod at a time, and that pod's
// init containers come first.
func (h *Hint) Refusal(units int) error {
	if !h.reconcile() {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ledger.refusal(units)
}

// Allocated implements resource.PodHint: the answer is recorded on the
// waiting container it most likely serves (see ledger.waitingSlot) until
// the kubelet reports the container that got it, and the write-back runs at
// once.
func (h *Hint) Allocated(ctx context.Context, uuid string, units int) {
	h.reconcile()
	h.mu.Lock()
	h.ledger.attribute(answer{gpu: uuid, units: units, at: h.clock.Now()})
	h.mu.Unlock()
	klog.FromContext(ctx).V(4).Info("Fraction allocated", "gpu", uuid, "units", units)
	h.kickWriteBack()
}

// DevicesAllocated implements resource.AllocationRecorder: the write-back
// runs at once, and again shortly after until the kubelet lists the devices
// (see writeBackRetries), so the pod that got them - a reservation waiting
// for its reserved-gpu above all - is written back within moments.
func (h *Hint) DevicesAllocated(ctx context.Context, ids []string) {
	h.mu.Lock()
	h.ledger.await(ids, h.clock.Now())
	h.mu.Unlock()
	klog.FromContext(ctx).V(4).Info("Devices allocated", "devices", ids)
	h.kickWriteBack()
}

// answersInFlight counts the Allocate answers not yet confirmed by the
// kubelet, recorded on a container or not.
func (h *Hint) answersInFlight() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ledger.answersInFlight()
}
