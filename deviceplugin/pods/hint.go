package pods

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpufrac/gpufrac/api"
	gpurequest "github.com/gpufrac/gpufrac/api/request"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
)

// inflightTTL bounds how long an Allocate answer the kubelet never reports
// (PodResources unreachable and the pod still Pending) keeps counting as a
// placed fraction. The kubelet records an allocation right after Allocate,
// so in practice answers are confirmed within one write-back period.
const inflightTTL = 10 * time.Minute

// informerLagWait is how long GPUFor waits for the pod informer when the
// kubelet asks for a fraction of a size no known pod is waiting for: the
// kubelet sees a binding through its own watch and may admit the pod before
// this agent's informer shows it. Without the wait, the fraction would go by
// best fit instead of where the coordinator planned it.
const informerLagWait = 500 * time.Millisecond

// informerLagPoll is how often GPUFor looks again while it waits.
const informerLagPoll = 10 * time.Millisecond

// reservationTakenTTL is how long a reservation handed its GPU is skipped
// by ReservationGPU (see ReservationTaken).
const reservationTakenTTL = 3 * time.Second

// writeBackResync is the write-back's period when nothing kicks it.
const writeBackResync = 2 * time.Second

// writeBackRetries are the waits between the write-back passes that follow
// a kick (an Allocate answer) while the kubelet has not listed every
// allocation the hint was told of: the kubelet records an allocation only
// after the Allocate RPC returns, so the pass the kick runs at once often
// finds nothing yet. The next pass, 50 ms later, usually does. The burst
// ends at the first pass that finds nothing missing, or after the last
// wait, and the loop goes back to writeBackResync: it never spins while
// nothing is pending. (Measured before the burst, 2026-11-24: a
// reservation's reserved-gpu was written 0.83 s after its admission, on
// the next period.)
func writeBackRetries() []time.Duration {
	return []time.Duration{50 * time.Millisecond, 150 * time.Millisecond, 400 * time.Millisecond, time.Second}
}

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
// Untrusted input: gpufrac.io/gpu is a pod annotation. The coordinator
// writes it through the binding (CONTRACT: only the binding may set it, as
// the admission policies enforce), but where the policies are missing any
// pod's author can. So it is read only from pods whose spec.schedulerName
// is the coordinator's (HintOptions.SchedulerName), and the fraction
// resource honours it only on a GPU a reservation pod holds (see
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
	informer  cache.SharedIndexInformer
	lister    corelisters.PodLister
	podRes    *PodResources
	resync    time.Duration
	retries   []time.Duration // writeBackRetries; tests may change them
	clock     clock.WithTicker
	lagWait   time.Duration // informerLagWait; tests shorten it
	scheduler string        // the coordinator's scheduler name

	mu sync.Mutex
	// records: pod UID -> what the hint knows of the pod, for the pods the
	// informer shows on this node.
	records map[types.UID]*record
	// order: the records, oldest pod first (then namespace/name); rebuilt
	// by reconcileLocked.
	order []*record
	// listing: container -> the fraction units it holds, from the last
	// PodResources listing (nil before the first).
	listing map[containerKey]listedFraction
	// wholeListing: pod -> the whole GPUs (nvidia.com/gpu device IDs) its
	// containers hold, from the last PodResources listing.
	wholeListing map[types.NamespacedName][]string
	// unattributed: Allocate answers for which no waiting container was
	// known yet (the informer had not shown the pod), oldest first.
	unattributed []answer
	// awaited: devices of whole allocations (DevicesAllocated) no
	// PodResources listing has shown yet, oldest first. They keep the
	// write-back's burst going; see writeBackRetries.
	awaited []awaitedDevices
	kick    chan struct{} // asks the write-back loop to run now
}

// awaitedDevices are the devices of one allocation the write-back waits to
// see listed.
type awaitedDevices struct {
	ids []string
	at  time.Time
}

// containerKey names one container of a pod on this node. PodResources
// carries no pod UID, so namespace and name identify the pod; the informer
// maps them to the UID of the pod of that name now.
type containerKey struct{ namespace, pod, container string }

// listedFraction is a container's fraction units in a PodResources listing.
type listedFraction struct {
	gpu   string
	units int
}

// answer is one Allocate answer: units given on gpu at a time.
type answer struct {
	gpu   string
	units int
	at    time.Time
}

// record is what the hint knows of one pod bound to this node.
type record struct {
	pod *corev1.Pod
	// planned is the coordinator's GPU for the pod's fractions
	// (gpufrac.io/gpu), read only from pods with the coordinator's
	// scheduler name; "" otherwise.
	planned string
	// slots are the pod's app containers asking fraction units, in spec order.
	slots []*slot
	// initUnits are the fraction units its init containers ask, which are refused.
	initUnits []int
	// whole tells whether the pod asks whole GPUs (nvidia.com/gpu).
	whole bool
	// reservation tells whether it is a gpufrac reservation pod
	// (IsReservation); planned is then the GPU it asks for.
	reservation bool
	// handedAt is when ReservationTaken marked the reservation handed its
	// GPU (zero when never).
	handedAt time.Time
	// sent are the annotations the write-back last patched on the pod, and
	// sentRV the pod's resourceVersion in the informer then. While the
	// informer still shows sentRV it has not caught up with the patch, and
	// the same annotations are not sent again.
	sent   map[string]string
	sentRV string
}

func (r *record) key() types.NamespacedName {
	return types.NamespacedName{Namespace: r.pod.Namespace, Name: r.pod.Name}
}

func (r *record) terminated() bool { return terminated(r.pod) }

// pending tells whether the kubelet has not started the pod: phase Pending
// (or not set yet).
func (r *record) pending() bool {
	return r.pod.Status.Phase == corev1.PodPending || r.pod.Status.Phase == ""
}

// slotState is what the hint knows of one fraction container's admission.
type slotState int

const (
	// waiting: not known to be admitted, no Allocate answer recorded on it.
	waiting slotState = iota
	// answered: an Allocate answer is recorded on it (gpu, answeredAt),
	// not yet confirmed by the kubelet.
	answered
	// admitted: the kubelet reported it (PodResources, the allocated-gpu
	// write-back, or a phase past Pending); gpu is the GPU it got, "" when
	// only the phase tells (then the planned GPU is assumed).
	admitted
)

// slot is one app container's fraction.
type slot struct {
	container  string
	units      int
	state      slotState
	gpu        string
	answeredAt time.Time
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
	inf := NewNodeInformer(client, node)
	h := &Hint{
		client:    client,
		informer:  inf,
		lister:    corelisters.NewPodLister(inf.GetIndexer()),
		podRes:    podRes,
		resync:    writeBackResync,
		retries:   writeBackRetries(),
		clock:     clock.RealClock{},
		lagWait:   informerLagWait,
		scheduler: api.SchedulerName,
		records:   map[types.UID]*record{},
		kick:      make(chan struct{}, 1),
	}
	for _, o := range opts {
		o(h)
	}
	return h
}

// Run starts the informer and the write-back loop until ctx ends. The
// write-back runs every resync period and at once when an allocation kicks
// it; after a kick it runs again after each of h.retries while the kubelet
// has not listed every allocation it was told of (or the pass failed).
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
	logger := klog.FromContext(ctx)
	t := h.clock.NewTicker(h.resync)
	defer t.Stop()
	next := len(h.retries) // the burst's next wait; len(h.retries): no burst
	for {
		pending, err := h.writeBack(ctx)
		if err != nil {
			logger.V(2).Info("Writing back allocated GPUs failed; will retry", "err", err)
		}
		var retry clock.Timer
		var retryC <-chan time.Time
		if next < len(h.retries) && (pending || err != nil) {
			retry = h.clock.NewTimer(h.retries[next])
			retryC = retry.C()
			next++
		} else {
			next = len(h.retries)
		}
		select {
		case <-ctx.Done():
		case <-t.C():
		case <-retryC:
		case <-h.kick:
			next = 0
		}
		if retry != nil {
			retry.Stop()
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

// HasSynced tells whether the pod informer has synced.
func (h *Hint) HasSynced() bool { return h.informer.HasSynced() }

// Pod returns the pod of that name bound to this node, as the informer
// shows it now.
func (h *Hint) Pod(namespace, name string) (*corev1.Pod, bool) {
	p, err := h.lister.Pods(namespace).Get(name)
	return p, err == nil
}

// FractionUnits is the number of fraction units a container asks for, as
// the request model reads it (its limit, else its request).
func FractionUnits(c *corev1.Container) int {
	p := gpurequest.Parse(&corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{*c}}}, gpurequest.Options{})
	return p.Fraction()
}

func terminated(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// newRecord reads what a pod asks for.
func (h *Hint) newRecord(p *corev1.Pod) *record {
	r := &record{reservation: IsReservation(p.Namespace, p.Name)}
	req := gpurequest.Parse(p, gpurequest.Options{})
	for _, c := range req.FractionContainers() {
		r.slots = append(r.slots, &slot{container: c.Name, units: c.Units()})
	}
	for _, c := range req.InitFractions() {
		r.initUnits = append(r.initUnits, c.Units())
	}
	r.whole = req.Whole() > 0
	return r
}

// plannedGPU is the GPU the coordinator chose for p, when p is the
// coordinator's: a reservation pod (the coordinator alone creates pods in
// the reservation namespace) or a pod with the coordinator's scheduler name.
func (h *Hint) plannedGPU(p *corev1.Pod, reservation bool) string {
	if !reservation && p.Spec.SchedulerName != h.scheduler {
		return ""
	}
	return p.Annotations[api.AnnotationGPU]
}

// reconcileLocked brings the records in line with the informer's pods and
// the last PodResources listing: new pods get a record, gone pods lose
// theirs, answers past inflightTTL are dropped, containers newly known to be
// admitted take over the answer they account for, and answers recorded
// before their pod was known find it. h.mu must be held.
func (h *Hint) reconcileLocked(pods []*corev1.Pod) {
	seen := make(map[types.UID]bool, len(pods))
	for _, p := range pods {
		seen[p.UID] = true
		r := h.records[p.UID]
		if r == nil {
			r = h.newRecord(p)
			h.records[p.UID] = r
		}
		r.pod = p
		r.planned = h.plannedGPU(p, r.reservation)
	}
	h.order = h.order[:0]
	for uid, r := range h.records {
		if !seen[uid] {
			delete(h.records, uid)
			continue
		}
		h.order = append(h.order, r)
	}
	slices.SortFunc(h.order, func(a, b *record) int {
		if c := a.pod.CreationTimestamp.Compare(b.pod.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.pod.Namespace+"/"+a.pod.Name, b.pod.Namespace+"/"+b.pod.Name)
	})

	now := h.clock.Now()
	for _, r := range h.order {
		for _, s := range r.slots {
			if s.state == answered && now.Sub(s.answeredAt) >= inflightTTL {
				s.state, s.gpu = waiting, ""
			}
		}
	}
	h.unattributed = slices.DeleteFunc(h.unattributed, func(a answer) bool { return now.Sub(a.at) >= inflightTTL })

	for _, r := range h.order {
		if r.terminated() {
			continue
		}
		for _, s := range r.slots {
			gpu, known := h.admissionOf(r, s)
			switch {
			case !known:
			case s.state == admitted:
				if gpu != "" {
					s.gpu = gpu // a better source than the phase
				}
			default:
				h.admitLocked(r, s, gpu)
			}
		}
	}
	kept := h.unattributed[:0]
	for _, a := range h.unattributed {
		if s := h.waitingSlotLocked(a.units, a.gpu); s != nil {
			s.state, s.gpu, s.answeredAt = answered, a.gpu, a.at
			continue
		}
		kept = append(kept, a)
	}
	h.unattributed = kept
}

// admissionOf tells whether the container behind s is known to be admitted
// and, if known, the GPU it got: from the PodResources listing, else the
// pod's allocated-gpu annotation, else ("" GPU) a phase past Pending.
func (h *Hint) admissionOf(r *record, s *slot) (gpu string, known bool) {
	if l, ok := h.listing[containerKey{r.pod.Namespace, r.pod.Name, s.container}]; ok {
		return l.gpu, true
	}
	if g := r.pod.Annotations[api.AnnotationAllocatedGPU]; g != "" && !strings.Contains(g, ",") {
		return g, true
	}
	return "", !r.pending()
}

// admitLocked records that the container behind s (of r) was admitted and
// got gpu ("" when unknown), and settles the answer that accounts for it:
// its own when it had one that fits; else the answer recorded on another
// waiting container of its size on that GPU (same-size pods are
// interchangeable until the kubelet tells), which then waits again and takes
// s's own answer, if any; else an answer not yet attributed.
func (h *Hint) admitLocked(r *record, s *slot, gpu string) {
	own := s.state == answered
	ownGPU, ownAt := s.gpu, s.answeredAt
	s.state = admitted
	if own && (gpu == "" || gpu == ownGPU) {
		s.gpu = ownGPU
		return
	}
	s.gpu = gpu
	if gpu == "" {
		// Only the phase tells: take the answer most likely its own.
		if t := h.answeredSlotLocked(s.units, r.planned); t != nil {
			s.gpu = t.gpu
			t.state, t.gpu = waiting, ""
		} else if t := h.answeredSlotLocked(s.units, ""); t != nil {
			s.gpu = t.gpu
			t.state, t.gpu = waiting, ""
		} else if i := h.unattributedLocked(s.units, ""); i >= 0 {
			s.gpu = h.unattributed[i].gpu
			h.unattributed = slices.Delete(h.unattributed, i, i+1)
		}
		return
	}
	if t := h.answeredSlotLocked(s.units, gpu); t != nil {
		if own {
			t.gpu, t.answeredAt = ownGPU, ownAt // the answers swap owners
		} else {
			t.state, t.gpu = waiting, ""
		}
		return
	}
	if i := h.unattributedLocked(s.units, gpu); i >= 0 {
		h.unattributed = slices.Delete(h.unattributed, i, i+1)
	}
	if own {
		// s's answer went to a container not known to be admitted yet.
		h.attributeLocked(answer{gpu: ownGPU, units: s.units, at: ownAt})
	}
}

// answeredSlotLocked returns the oldest container with an answer of units
// on gpu ("" for any GPU), nil if none.
func (h *Hint) answeredSlotLocked(units int, gpu string) *slot {
	for _, r := range h.order {
		if r.terminated() {
			continue
		}
		for _, s := range r.slots {
			if s.state == answered && s.units == units && (gpu == "" || s.gpu == gpu) {
				return s
			}
		}
	}
	return nil
}

// unattributedLocked returns the index of the oldest unattributed answer
// of units on gpu ("" for any), -1 if none.
func (h *Hint) unattributedLocked(units int, gpu string) int {
	return slices.IndexFunc(h.unattributed, func(a answer) bool { return a.units == units && (gpu == "" || a.gpu == gpu) })
}

// waitingSlotLocked returns the container an answer of units on gpu is
// recorded on: the oldest waiting container of that size the coordinator
// planned on gpu, else the oldest waiting one of that size with a plan,
// else the oldest waiting one of that size; nil if none.
func (h *Hint) waitingSlotLocked(units int, gpu string) *slot {
	var planned, any *slot
	for _, r := range h.order {
		if r.terminated() {
			continue
		}
		for _, s := range r.slots {
			if s.state != waiting || s.units != units {
				continue
			}
			if r.planned == gpu && gpu != "" {
				return s
			}
			if planned == nil && r.planned != "" {
				planned = s
			}
			if any == nil {
				any = s
			}
		}
	}
	if planned != nil {
		return planned
	}
	return any
}

// attributeLocked records an answer on the container it most likely
// serves, or keeps it unattributed.
func (h *Hint) attributeLocked(a answer) {
	if s := h.waitingSlotLocked(a.units, a.gpu); s != nil {
		s.state, s.gpu, s.answeredAt = answered, a.gpu, a.at
		return
	}
	h.unattributed = append(h.unattributed, a)
}

// reconcile lists the informer's pods and reconciles the records. It
// returns false when the informer cannot be read.
func (h *Hint) reconcile() bool {
	pods, err := h.lister.List(labelsEverything())
	if err != nil {
		return false
	}
	h.mu.Lock()
	h.reconcileLocked(pods)
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
	if r := h.waitingReservationLocked(""); r != nil {
		return r.planned, true
	}
	return "", false
}

// waitingReservationLocked returns the oldest reservation pod waiting for
// admission that asks for gpu ("" for any GPU) and was not handed a GPU in
// the last reservationTakenTTL; nil if none.
func (h *Hint) waitingReservationLocked(gpu string) *record {
	now := h.clock.Now()
	for _, r := range h.order {
		if !r.reservation || r.planned == "" || !r.pending() || r.pod.Annotations[api.AnnotationReservedGPU] != "" ||
			len(h.wholeListing[r.key()]) > 0 || (gpu != "" && r.planned != gpu) {
			continue
		}
		if !r.handedAt.IsZero() && now.Sub(r.handedAt) < reservationTakenTTL {
			continue
		}
		return r
	}
	return nil
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
	now := h.clock.Now()
	for _, r := range h.order {
		if r.reservation && r.planned == uuid && r.pending() {
			r.handedAt = now
		}
	}
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

// reservationOnly is one look for ReservationOnly. unsure tells that only a
// waiting whole-GPU pod that carries gpufrac.io/allocated-gpu without being
// listed stands between the reservation and the GPU.
func (h *Hint) reservationOnly(ctx context.Context, uuid string) (only, unsure bool) {
	if h.podRes != nil {
		if as, err := h.podRes.List(ctx); err == nil {
			h.setListing(as)
		}
	}
	if !h.reconcile() {
		return false, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !slices.ContainsFunc(h.order, func(r *record) bool {
		return r.reservation && r.planned == uuid && r.pending() && r.pod.Annotations[api.AnnotationReservedGPU] == "" && len(h.wholeListing[r.key()]) == 0
	}) {
		return false, false
	}
	for _, r := range h.order {
		if r.reservation || !r.whole || r.terminated() || !r.pending() || len(h.wholeListing[r.key()]) > 0 {
			continue
		}
		if r.pod.Annotations[api.AnnotationAllocatedGPU] != "" {
			unsure = true // written back, yet not listed: wait for the listing
			continue
		}
		klog.FromContext(ctx).V(2).Info("A GPU carrying fractions is not given whole while a pod other than its reservation waits for whole GPUs",
			"gpu", uuid, "waiting", klog.KObj(r.pod))
		return false, false
	}
	return !unsure, unsure
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

// plannedSlot is a fraction container of a pod the coordinator placed.
type plannedSlot struct {
	r *record
	s *slot
}

// gpuFor is one look at the records for GPUFor. unseen tells that no
// container of this size waits for admission (app containers, and init
// containers whose fraction Refusal refuses) besides answers not yet
// attributed.
func (h *Hint) gpuFor(units int) (gpu string, ok, unseen bool) {
	if !h.reconcile() {
		return "", false, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	remaining := map[string]int{} // GPU UUID -> planned fractions of this size not yet given
	var waitingPlanned, all []plannedSlot
	pending := 0 // containers of this size waiting, planned or not
	for _, r := range h.order {
		if r.terminated() {
			continue
		}
		if r.pending() && slices.Contains(r.initUnits, units) {
			pending++
		}
		for _, s := range r.slots {
			if s.units != units {
				continue
			}
			switch s.state {
			case waiting:
				pending++
			case answered:
				remaining[s.gpu]-- // placed, whoever it turns out to be
			}
			if r.planned == "" {
				continue
			}
			all = append(all, plannedSlot{r, s})
			remaining[r.planned]++
			switch s.state {
			case admitted:
				got := s.gpu
				if got == "" {
					got = r.planned // admitted, GPU unknown: assume as planned
				}
				remaining[got]--
			case waiting:
				waitingPlanned = append(waitingPlanned, plannedSlot{r, s})
			}
		}
	}
	flying := 0
	for _, a := range h.unattributed {
		if a.units == units {
			remaining[a.gpu]--
			flying++
		}
	}
	if len(waitingPlanned) <= flying {
		return "", false, pending <= flying
	}
	for _, it := range waitingPlanned {
		if remaining[it.r.planned] > 0 {
			return it.r.planned, true, false
		}
	}
	for _, it := range all {
		if remaining[it.r.planned] > 0 {
			return it.r.planned, true, false
		}
	}
	return waitingPlanned[0].r.planned, true, false
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
	for _, r := range h.order {
		if r.terminated() || !r.pending() || !slices.Contains(r.initUnits, units) {
			continue
		}
		return fmt.Errorf("pod %s asks %d units in an init container: %w", klog.KObj(r.pod), units, ErrInitContainerFraction)
	}
	return nil
}

// Allocated implements resource.PodHint: the answer is recorded on the
// waiting container it most likely serves (see waitingSlotLocked) until
// the kubelet reports the container that got it, and the write-back runs at
// once.
func (h *Hint) Allocated(ctx context.Context, uuid string, units int) {
	h.reconcile()
	h.mu.Lock()
	h.attributeLocked(answer{gpu: uuid, units: units, at: h.clock.Now()})
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
	h.awaited = append(h.awaited, awaitedDevices{ids: slices.Clone(ids), at: h.clock.Now()})
	h.mu.Unlock()
	klog.FromContext(ctx).V(4).Info("Devices allocated", "devices", ids)
	h.kickWriteBack()
}

// kickWriteBack drops the PodResources cache and asks the write-back loop
// to run now (a kick already waiting covers this one).
func (h *Hint) kickWriteBack() {
	if h.podRes != nil {
		h.podRes.Invalidate()
	}
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// pendingLocked tells whether the last listing lacks something the
// write-back waits for: an Allocate answer not confirmed yet (fractions),
// devices told by DevicesAllocated and not listed, or a listed pod the
// informer does not show yet (so it cannot be annotated). Awaited devices
// that are listed, or older than the whole burst, are forgotten. h.mu must
// be held.
func (h *Hint) pendingLocked() bool {
	pending := len(h.unattributed) > 0
	for _, r := range h.order {
		for _, s := range r.slots {
			pending = pending || s.state == answered
		}
	}
	listed := map[string]bool{}
	for _, ids := range h.wholeListing {
		for _, id := range ids {
			listed[id] = true
		}
	}
	var span time.Duration
	for _, d := range h.retries {
		span += d
	}
	now := h.clock.Now()
	h.awaited = slices.DeleteFunc(h.awaited, func(a awaitedDevices) bool {
		return now.Sub(a.at) > span || !slices.ContainsFunc(a.ids, func(id string) bool { return !listed[id] })
	})
	if pending || len(h.awaited) > 0 {
		return true
	}
	known := make(map[types.NamespacedName]bool, len(h.order))
	for _, r := range h.order {
		known[r.key()] = true
	}
	for key := range h.wholeListing {
		if !known[key] {
			return true
		}
	}
	for key := range h.listing {
		if !known[types.NamespacedName{Namespace: key.namespace, Name: key.pod}] {
			return true
		}
	}
	return false
}

// answersInFlight counts the Allocate answers not yet confirmed by the
// kubelet, recorded on a container or not.
func (h *Hint) answersInFlight() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := len(h.unattributed)
	for _, r := range h.order {
		for _, s := range r.slots {
			if s.state == answered {
				n++
			}
		}
	}
	return n
}

// setListing stores a PodResources listing: each container's fraction
// units and each pod's whole GPUs.
func (h *Hint) setListing(as []Assignment) {
	listing := map[containerKey]listedFraction{}
	whole := map[types.NamespacedName][]string{}
	for _, a := range as {
		switch a.Resource {
		case api.ResourceFraction:
			gpu, err := resource.GPUOfUnits(a.DeviceIDs)
			if err != nil {
				continue
			}
			listing[containerKey{a.Namespace, a.Pod, a.Container}] = listedFraction{gpu: gpu, units: len(a.DeviceIDs)}
		case api.ResourceGPU:
			key := types.NamespacedName{Namespace: a.Namespace, Name: a.Pod}
			whole[key] = append(whole[key], a.DeviceIDs...)
		}
	}
	for key, ids := range whole {
		slices.Sort(ids)
		whole[key] = slices.Compact(ids)
	}
	h.mu.Lock()
	h.listing, h.wholeListing = listing, whole
	h.mu.Unlock()
}

// writeBack reads the kubelet's PodResources into the records and annotates
// each pod with what its record says it holds: fraction pods
// (gpufrac.io/allocated-gpu, the GPU of the units of their first app
// container listed), reservation pods (gpufrac.io/reserved-gpu, their one
// GPU) and pods holding whole GPUs (gpufrac.io/allocated-gpu, the sorted,
// comma-separated device IDs of all their containers: GPU UUIDs, or MIG
// UUIDs in the single strategy). A pod holding both a fraction and whole
// GPUs keeps its fraction's GPU: the coordinator and the hint read
// allocated-gpu of fraction pods as one UUID.
//
// Only annotations that differ from the informer's pod are patched, and
// not again while the informer has not shown the last patch (record.sent).
// pending tells whether the listing still lacks an allocation the hint was
// told of (see pendingLocked); it is true when the listing fails.
func (h *Hint) writeBack(ctx context.Context) (pending bool, err error) {
	h.podRes.Invalidate()
	as, err := h.podRes.List(ctx)
	if err != nil {
		return true, err
	}
	h.setListing(as)
	pods, err := h.lister.List(labelsEverything())
	if err != nil {
		return true, fmt.Errorf("listing pods from the informer: %w", err)
	}
	type want struct {
		r    *record
		pod  *corev1.Pod
		anns map[string]string
	}
	var wants []want
	h.mu.Lock()
	h.reconcileLocked(pods)
	pending = h.pendingLocked()
	for _, r := range h.order {
		anns := map[string]string{}
		held := h.wholeListing[r.key()]
		for _, s := range r.slots {
			if l, ok := h.listing[containerKey{r.pod.Namespace, r.pod.Name, s.container}]; ok {
				anns[api.AnnotationAllocatedGPU] = l.gpu
				break
			}
		}
		switch {
		case r.reservation:
			if len(held) == 1 {
				anns[api.AnnotationReservedGPU] = held[0]
			}
		case len(held) > 0 && anns[api.AnnotationAllocatedGPU] == "":
			anns[api.AnnotationAllocatedGPU] = strings.Join(held, ",")
		}
		if r.sentRV != r.pod.ResourceVersion {
			r.sent, r.sentRV = nil, "" // the informer has caught up
		}
		for k, v := range anns {
			if r.pod.Annotations[k] == v || r.sent[k] == v {
				delete(anns, k)
			}
		}
		if len(anns) > 0 {
			wants = append(wants, want{r, r.pod, anns})
		}
	}
	h.mu.Unlock()

	var firstErr error
	for _, w := range wants {
		body, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": w.anns}})
		if err != nil {
			return true, fmt.Errorf("encoding annotations of pod %s: %w", klog.KObj(w.pod), err)
		}
		if _, err := h.client.CoreV1().Pods(w.pod.Namespace).Patch(ctx, w.pod.Name, types.MergePatchType, body, metav1PatchOptions()); err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("annotating pod %s: %w", klog.KObj(w.pod), err)
			}
			continue
		}
		h.mu.Lock()
		if w.r.sentRV != w.pod.ResourceVersion || w.r.sent == nil {
			w.r.sent, w.r.sentRV = map[string]string{}, w.pod.ResourceVersion
		}
		maps.Copy(w.r.sent, w.anns)
		h.mu.Unlock()
		klog.FromContext(ctx).V(2).Info("Wrote back GPU", "pod", klog.KObj(w.pod), "annotations", w.anns)
	}
	return pending || firstErr != nil, firstErr
}
