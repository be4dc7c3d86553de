package pods

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/gpufrac/gpufrac/api"
	gpurequest "github.com/gpufrac/gpufrac/api/request"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
)

// inflightTTL bounds how long an Allocate answer the kubelet never reports
// (PodResources unreachable and the pod still Pending) keeps counting as a
// placed fraction. The kubelet records an allocation right after Allocate,
// so in practice answers are confirmed within one write-back period.
const inflightTTL = 10 * time.Minute

// reservationTakenTTL is how long a reservation handed its GPU is skipped
// by ReservationGPU (see Hint.ReservationTaken).
const reservationTakenTTL = 3 * time.Second

// ledger is the hint's record keeping: one record per pod UID, the last
// PodResources listing, the Allocate answers not yet attributed and the
// whole-GPU devices awaited in a listing. It is pure: no lock (Hint.mu
// guards it), no clock (times are passed in), no I/O. Its methods take what
// the informer, the kubelet and Allocate told and return decisions.
type ledger struct {
	scheduler string // the coordinator's scheduler name

	// records: pod UID -> what the ledger knows of the pod, for the pods
	// last passed to reconcile.
	records map[types.UID]*record
	// order: the records, oldest pod first (then namespace/name); rebuilt
	// by reconcile.
	order []*record
	// listing is the last PodResources listing (empty before the first).
	listing listing
	// unattributed: Allocate answers for which no waiting container was
	// known yet (the informer had not shown the pod), oldest first.
	unattributed []answer
	// awaited: devices of whole allocations (DevicesAllocated) no listing
	// has shown yet, oldest first. They keep the write-back's burst going.
	awaited []awaitedDevices
}

func newLedger(scheduler string) *ledger {
	return &ledger{scheduler: scheduler, records: map[types.UID]*record{}}
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

// fractionListing: container -> the fraction units it holds.
type fractionListing map[containerKey]listedFraction

// wholeListing: pod -> the whole GPUs (nvidia.com/gpu device IDs, sorted,
// distinct) its containers hold.
type wholeListing map[types.NamespacedName][]string

// listing is what one PodResources listing says the containers hold.
type listing struct {
	fractions fractionListing // nil before the first listing
	whole     wholeListing
}

// newListing reads a PodResources listing: each container's fraction units
// and each pod's whole GPUs.
func newListing(as []Assignment) listing {
	l := listing{fractions: fractionListing{}, whole: wholeListing{}}
	for _, a := range as {
		switch a.Resource {
		case api.ResourceFraction:
			gpu, err := resource.GPUOfUnits(a.DeviceIDs)
			if err != nil {
				continue
			}
			l.fractions[containerKey{a.Namespace, a.Pod, a.Container}] = listedFraction{gpu: gpu, units: len(a.DeviceIDs)}
		case api.ResourceGPU:
			key := types.NamespacedName{Namespace: a.Namespace, Name: a.Pod}
			l.whole[key] = append(l.whole[key], a.DeviceIDs...)
		}
	}
	for key, ids := range l.whole {
		slices.Sort(ids)
		l.whole[key] = slices.Compact(ids)
	}
	return l
}

// answer is one Allocate answer: units given on gpu at a time.
type answer struct {
	gpu   string
	units int
	at    time.Time
}

// awaitedDevices are the devices of one allocation the write-back waits to
// see listed.
type awaitedDevices struct {
	ids []string
	at  time.Time
}

// record is what the ledger knows of one pod bound to this node.
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
	// handedAt is when reservationTaken marked the reservation handed its
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

// slotState is what the ledger knows of one fraction container's admission.
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

func (s slotState) String() string {
	switch s {
	case waiting:
		return "waiting"
	case answered:
		return "answered"
	case admitted:
		return "admitted"
	}
	return fmt.Sprintf("slotState(%d)", int(s))
}

// slot is one app container's fraction.
type slot struct {
	container  string
	units      int
	state      slotState
	gpu        string
	answeredAt time.Time
}

func terminated(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// newRecord reads what a pod asks for.
func newRecord(p *corev1.Pod) *record {
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
func (l *ledger) plannedGPU(p *corev1.Pod, reservation bool) string {
	if !reservation && p.Spec.SchedulerName != l.scheduler {
		return ""
	}
	return p.Annotations[api.AnnotationGPU]
}

// setListing stores a PodResources listing; reconcile applies it.
func (l *ledger) setListing(li listing) { l.listing = li }

// reconcile brings the records in line with the informer's pods and the
// last listing, as of now: new pods get a record, gone pods lose theirs,
// answers past inflightTTL are dropped, containers newly known to be
// admitted take over the answer they account for, and answers recorded
// before their pod was known find it.
func (l *ledger) reconcile(pods []*corev1.Pod, now time.Time) {
	seen := make(map[types.UID]bool, len(pods))
	for _, p := range pods {
		seen[p.UID] = true
		r := l.records[p.UID]
		if r == nil {
			r = newRecord(p)
			l.records[p.UID] = r
		}
		r.pod = p
		r.planned = l.plannedGPU(p, r.reservation)
	}
	l.order = l.order[:0]
	for uid, r := range l.records {
		if !seen[uid] {
			delete(l.records, uid)
			continue
		}
		l.order = append(l.order, r)
	}
	slices.SortFunc(l.order, func(a, b *record) int {
		if c := a.pod.CreationTimestamp.Compare(b.pod.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.pod.Namespace+"/"+a.pod.Name, b.pod.Namespace+"/"+b.pod.Name)
	})

	for _, r := range l.order {
		for _, s := range r.slots {
			if s.state == answered && now.Sub(s.answeredAt) >= inflightTTL {
				s.state, s.gpu = waiting, ""
			}
		}
	}
	l.unattributed = slices.DeleteFunc(l.unattributed, func(a answer) bool { return now.Sub(a.at) >= inflightTTL })

	for _, r := range l.order {
		if r.terminated() {
			continue
		}
		for _, s := range r.slots {
			gpu, known := l.admissionOf(r, s)
			switch {
			case !known:
			case s.state == admitted:
				if gpu != "" {
					s.gpu = gpu // a better source than the phase
				}
			default:
				l.admit(r, s, gpu)
			}
		}
	}
	kept := l.unattributed[:0]
	for _, a := range l.unattributed {
		if s := l.waitingSlot(a.units, a.gpu); s != nil {
			s.state, s.gpu, s.answeredAt = answered, a.gpu, a.at
			continue
		}
		kept = append(kept, a)
	}
	l.unattributed = kept
}

// admissionOf tells whether the container behind s is known to be admitted
// and, if known, the GPU it got: from the listing, else the pod's
// allocated-gpu annotation, else ("" GPU) a phase past Pending.
func (l *ledger) admissionOf(r *record, s *slot) (gpu string, known bool) {
	if lf, ok := l.listing.fractions[containerKey{r.pod.Namespace, r.pod.Name, s.container}]; ok {
		return lf.gpu, true
	}
	if g := r.pod.Annotations[api.AnnotationAllocatedGPU]; g != "" && !strings.Contains(g, ",") {
		return g, true
	}
	return "", !r.pending()
}

// admit records that the container behind s (of r) was admitted and got
// gpu ("" when unknown), and settles the answer that accounts for it: its
// own when it had one that fits; else the answer recorded on another
// waiting container of its size on that GPU (same-size pods are
// interchangeable until the kubelet tells), which then waits again and
// takes s's own answer, if any; else an answer not yet attributed.
func (l *ledger) admit(r *record, s *slot, gpu string) {
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
		if t := l.answeredSlot(s.units, r.planned); t != nil {
			s.gpu = t.gpu
			t.state, t.gpu = waiting, ""
		} else if t := l.answeredSlot(s.units, ""); t != nil {
			s.gpu = t.gpu
			t.state, t.gpu = waiting, ""
		} else if i := l.unattributedIndex(s.units, ""); i >= 0 {
			s.gpu = l.unattributed[i].gpu
			l.unattributed = slices.Delete(l.unattributed, i, i+1)
		}
		return
	}
	if t := l.answeredSlot(s.units, gpu); t != nil {
		if own {
			t.gpu, t.answeredAt = ownGPU, ownAt // the answers swap owners
		} else {
			t.state, t.gpu = waiting, ""
		}
		return
	}
	if i := l.unattributedIndex(s.units, gpu); i >= 0 {
		l.unattributed = slices.Delete(l.unattributed, i, i+1)
	}
	if own {
		// s's answer went to a container not known to be admitted yet.
		l.attribute(answer{gpu: ownGPU, units: s.units, at: ownAt})
	}
}

// answeredSlot returns the oldest container with an answer of units on gpu
// ("" for any GPU), nil if none.
func (l *ledger) answeredSlot(units int, gpu string) *slot {
	for _, r := range l.order {
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

// unattributedIndex returns the index of the oldest unattributed answer of
// units on gpu ("" for any), -1 if none.
func (l *ledger) unattributedIndex(units int, gpu string) int {
	return slices.IndexFunc(l.unattributed, func(a answer) bool { return a.units == units && (gpu == "" || a.gpu == gpu) })
}

// waitingSlot returns the container an answer of units on gpu is recorded
// on: the oldest waiting container of that size the coordinator planned on
// gpu, else the oldest waiting one of that size with a plan, else the
// oldest waiting one of that size; nil if none.
func (l *ledger) waitingSlot(units int, gpu string) *slot {
	var planned, any *slot
	for _, r := range l.order {
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

// attribute records an answer on the container it most likely serves (see
// waitingSlot), or keeps it unattributed.
func (l *ledger) attribute(a answer) {
	if s := l.waitingSlot(a.units, a.gpu); s != nil {
		s.state, s.gpu, s.answeredAt = answered, a.gpu, a.at
		return
	}
	l.unattributed = append(l.unattributed, a)
}

// await records devices of a whole allocation the write-back waits to see
// listed.
func (l *ledger) await(ids []string, at time.Time) {
	l.awaited = append(l.awaited, awaitedDevices{ids: slices.Clone(ids), at: at})
}

// gpuFor is one look at the records for Hint.GPUFor: among the containers
// of this size the coordinator placed here and the kubelet has not
// admitted yet, oldest first, the first chosen GPU that still lacks a
// fraction of this size; with none, the GPU of any placed container whose
// planned fraction went elsewhere. ok is false when every such container is
// already served. unseen tells that no container of this size waits for
// admission (app containers, and init containers whose fraction refusal
// refuses) besides answers not yet attributed.
func (l *ledger) gpuFor(units int) (gpu string, ok, unseen bool) {
	type plannedSlot struct {
		r *record
		s *slot
	}
	remaining := map[string]int{} // GPU UUID -> planned fractions of this size not yet given
	var waitingPlanned, all []plannedSlot
	pending := 0 // containers of this size waiting, planned or not
	for _, r := range l.order {
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
	for _, a := range l.unattributed {
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

// refusal returns ErrInitContainerFraction, naming the pod, while a pod
// waiting for admission asks units in an init container; nil otherwise.
func (l *ledger) refusal(units int) error {
	for _, r := range l.order {
		if r.terminated() || !r.pending() || !slices.Contains(r.initUnits, units) {
			continue
		}
		return fmt.Errorf("pod %s asks %d units in an init container: %w", klog.KObj(r.pod), units, ErrInitContainerFraction)
	}
	return nil
}

// waitingReservation returns the oldest reservation pod waiting for
// admission that asks for gpu ("" for any GPU) and was not handed a GPU in
// the reservationTakenTTL before now; nil if none.
func (l *ledger) waitingReservation(gpu string, now time.Time) *record {
	for _, r := range l.order {
		if !r.reservation || r.planned == "" || !r.pending() || r.pod.Annotations[api.AnnotationReservedGPU] != "" ||
			len(l.listing.whole[r.key()]) > 0 || (gpu != "" && r.planned != gpu) {
			continue
		}
		if !r.handedAt.IsZero() && now.Sub(r.handedAt) < reservationTakenTTL {
			continue
		}
		return r
	}
	return nil
}

// reservationTaken marks the pending reservations that ask for gpu as
// handed it at now.
func (l *ledger) reservationTaken(gpu string, now time.Time) {
	for _, r := range l.order {
		if r.reservation && r.planned == gpu && r.pending() {
			r.handedAt = now
		}
	}
}

// reservationOnly is one look for Hint.ReservationOnly: only tells that a
// reservation waits for gpu and no other pod waits here for whole GPUs.
// unsure tells that only waiting whole-GPU pods carrying
// gpufrac.io/allocated-gpu without being listed stand in the way; blocker
// is the waiting pod that rules the GPU out, if one does.
func (l *ledger) reservationOnly(gpu string) (only, unsure bool, blocker *corev1.Pod) {
	if !slices.ContainsFunc(l.order, func(r *record) bool {
		return r.reservation && r.planned == gpu && r.pending() && r.pod.Annotations[api.AnnotationReservedGPU] == "" && len(l.listing.whole[r.key()]) == 0
	}) {
		return false, false, nil
	}
	for _, r := range l.order {
		if r.reservation || !r.whole || r.terminated() || !r.pending() || len(l.listing.whole[r.key()]) > 0 {
			continue
		}
		if r.pod.Annotations[api.AnnotationAllocatedGPU] != "" {
			unsure = true // written back, yet not listed: wait for the listing
			continue
		}
		return false, false, r.pod
	}
	return !unsure, unsure, nil
}

// pending tells whether the last listing lacks something the write-back
// waits for: an Allocate answer not confirmed yet (fractions), devices
// awaited and not listed, or a listed pod no record has yet (so it cannot
// be annotated). Awaited devices that are listed, or older than span
// before now, are forgotten.
func (l *ledger) pending(now time.Time, span time.Duration) bool {
	pending := len(l.unattributed) > 0
	for _, r := range l.order {
		for _, s := range r.slots {
			pending = pending || s.state == answered
		}
	}
	listed := map[string]bool{}
	for _, ids := range l.listing.whole {
		for _, id := range ids {
			listed[id] = true
		}
	}
	l.awaited = slices.DeleteFunc(l.awaited, func(a awaitedDevices) bool {
		return now.Sub(a.at) > span || !slices.ContainsFunc(a.ids, func(id string) bool { return !listed[id] })
	})
	if pending || len(l.awaited) > 0 {
		return true
	}
	known := make(map[types.NamespacedName]bool, len(l.order))
	for _, r := range l.order {
		known[r.key()] = true
	}
	for key := range l.listing.whole {
		if !known[key] {
			return true
		}
	}
	for key := range l.listing.fractions {
		if !known[types.NamespacedName{Namespace: key.namespace, Name: key.pod}] {
			return true
		}
	}
	return false
}

// answersInFlight counts the Allocate answers not yet confirmed by the
// kubelet, recorded on a container or not.
func (l *ledger) answersInFlight() int {
	n := len(l.unattributed)
	for _, r := range l.order {
		for _, s := range r.slots {
			if s.state == answered {
				n++
			}
		}
	}
	return n
}

// podWrite is one patch the write-back owes a pod: the annotations to set.
type podWrite struct {
	rec  *record
	pod  *corev1.Pod // the pod as the informer showed it when asked
	anns map[string]string
}

// writes returns the annotations each pod lacks per the listing: fraction
// pods gpufrac.io/allocated-gpu (the GPU of the units of their first app
// container listed), reservation pods gpufrac.io/reserved-gpu (their one
// GPU) and pods holding whole GPUs gpufrac.io/allocated-gpu (the sorted,
// comma-separated device IDs of all their containers: GPU UUIDs, or MIG
// UUIDs in the single strategy). A pod holding both a fraction and whole
// GPUs keeps its fraction's GPU: the coordinator and the hint read
// allocated-gpu of fraction pods as one UUID.
//
// Annotations the pod already carries are left out, and so are those sent
// (markSent) while the informer still shows the pod as it was then.
func (l *ledger) writes() []podWrite {
	var out []podWrite
	for _, r := range l.order {
		anns := map[string]string{}
		held := l.listing.whole[r.key()]
		for _, s := range r.slots {
			if lf, ok := l.listing.fractions[containerKey{r.pod.Namespace, r.pod.Name, s.container}]; ok {
				anns[api.AnnotationAllocatedGPU] = lf.gpu
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
			out = append(out, podWrite{rec: r, pod: r.pod, anns: anns})
		}
	}
	return out
}

// markSent records that w was patched, so writes does not ask for it again
// until the informer shows the pod changed.
func (l *ledger) markSent(w podWrite) {
	r := w.rec
	if r.sentRV != w.pod.ResourceVersion || r.sent == nil {
		r.sent, r.sentRV = map[string]string{}, w.pod.ResourceVersion
	}
	maps.Copy(r.sent, w.anns)
}
