package scheduler

import (
	"cmp"
	"math"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpufrac/gpufrac/api/request"
	"github.com/gpufrac/gpufrac/coordinator/placeholder"
	"github.com/gpufrac/gpufrac/coordinator/placement"
	"github.com/gpufrac/gpufrac/coordinator/podrequest"
	"github.com/gpufrac/gpufrac/coordinator/predicates"
	"github.com/gpufrac/gpufrac/coordinator/queue"
	"github.com/gpufrac/gpufrac/coordinator/state"
)

// A cycle charges the pods bound or being bound to their queues, counts the
// gang members among them and weighs their demand (readBound). At 50,000
// bound pods, reading each of them every cycle was most of a busy cycle's
// snapshot phase. So the bound pods' parts are kept between cycles in a
// boundLedger, in the shape of Kueue's cache of admitted workloads: the pod
// informer's events mark a pod dirty, and a cycle reads again only the
// dirty pods. The ledger keeps the sums (usage per queue and namespace,
// demand per request shape), so that a cycle replays a few sums instead of
// one charge per pod.
//
// A part depends on the pod object and on the parse inputs (GPU models,
// scalar worth, nodes in mode dra): the ledger is read again whole when
// they change. A part that read anything else the pod's events do not
// report (a resource claim, a Job, the namespace's default queue) is
// volatile: read again every cycle. Pods being bound are the scheduler's
// (assumed), read every cycle. The gang census keeps each gang's count of
// its bound members (census.go).

// boundLedger is what readBound keeps between cycles. The event side (dirty,
// fresh) is under mu; the rest is the cycle goroutine's.
type boundLedger struct {
	mu    sync.Mutex
	dirty map[types.UID]*corev1.Pod // pod -> its latest object; nil: deleted
	// fresh: pod -> its latest object, equal to the one held but for its
	// resourceVersion (an update that changed nothing the scheduler
	// reads): held instead, not read again, so that the ledger holds the
	// informer's objects (admittedOf matches reclaim's listed pods by object).
	fresh map[types.UID]*corev1.Pod

	built    bool   // read whole at least once
	inputs   uint64 // the parse generation its parts were read with
	parts    map[types.UID]*boundPart
	unbound  map[types.UID]*corev1.Pod // pods not shown bound: collect's pending pods and those being bound
	holders  map[types.UID]*corev1.Pod // placeholder pods, bound or not
	volatile map[types.UID]*boundPart
	gangs    map[string]*gangLedger // gangID -> its bound members, for the census
	charges  map[chargeKey]*chargeSum
	demand   map[demandKey]*boundDemand
	// being is beingBound's buffer, used again in each cycle (what it
	// returns is read before the next cycle).
	being []boundPart
}

func newBoundLedger() *boundLedger {
	return &boundLedger{dirty: map[types.UID]*corev1.Pod{}, fresh: map[types.UID]*corev1.Pod{}}
}

// ledgerKey is p's key in the ledger: its UID, or for an object without one
// (made by hand, never an informer's) its namespace and name, so that such
// pods do not count as one.
func ledgerKey(p *corev1.Pod) types.UID {
	if p.UID != "" {
		return p.UID
	}
	return types.UID("\x00" + p.Namespace + "/" + p.Name)
}

// changed records that p was added or updated (the informer's handlers).
func (l *boundLedger) changed(p *corev1.Pod) { l.mark(ledgerKey(p), p) }

// unchanged records p, an update equal to the pod's last object but for its
// resourceVersion: the ledger holds it in place of the last, without
// reading it again.
func (l *boundLedger) unchanged(p *corev1.Pod) {
	l.mu.Lock()
	k := ledgerKey(p)
	if d, ok := l.dirty[k]; ok {
		if d != nil {
			l.dirty[k] = p // read anyway: the newest object
		}
	} else {
		l.fresh[k] = p
	}
	l.mu.Unlock()
}

// deleted records that p is gone.
func (l *boundLedger) deleted(p *corev1.Pod) { l.mark(ledgerKey(p), nil) }

// mark records the pod of key k to be read again as p (nil: gone); an
// equal object recorded before is dropped.
func (l *boundLedger) mark(k types.UID, p *corev1.Pod) {
	l.mu.Lock()
	l.dirty[k] = p
	delete(l.fresh, k)
	l.mu.Unlock()
}

// takeDirty returns the pods changed since the last call, and those only
// replaced by equal objects.
func (l *boundLedger) takeDirty() (dirty, fresh map[types.UID]*corev1.Pod) {
	l.mu.Lock()
	defer l.mu.Unlock()
	dirty, fresh = l.dirty, l.fresh
	l.dirty = make(map[types.UID]*corev1.Pod, len(dirty))
	l.fresh = make(map[types.UID]*corev1.Pod, len(fresh))
	return dirty, fresh
}

// replace holds p, equal to the object held under its key but for its
// resourceVersion, in its place; nothing is read again.
func (l *boundLedger) replace(k types.UID, p *corev1.Pod) {
	if part := l.parts[k]; part != nil && part.pod.UID == p.UID {
		part.pod = p // volatile and members hold the same part
		if part.parsed {
			part.pi.pod = p
		}
		if part.gang != "" {
			if g := l.gangs[part.gang]; g != nil {
				g.tally = nil // its census holds the object
			}
		}
	}
	if q := l.unbound[k]; q != nil && q.UID == p.UID {
		l.unbound[k] = p
	}
	if q := l.holders[k]; q != nil && q.UID == p.UID {
		l.holders[k] = p
	}
}

// chargeKey sums the charges of one queue's pods of one namespace: whether
// non-preemptibility counts depends on both (books.allows), read each cycle.
type chargeKey struct {
	queue, namespace string
	nonPreemptible   bool
}

type chargeSum struct {
	res  queue.Resources
	pods int
}

// demandKey is what placement.Snapshot.AddDemand reads of a request: equal
// keys add the same demand.
type demandKey struct {
	cpu, mem    int64
	gpus, share int
	models      string
	invalid     bool
}

// boundDemand is the demand of n bound pods that ask req each.
type boundDemand struct {
	req placement.Request
	n   int
}

func demandKeyOf(r *placement.Request) demandKey {
	return demandKey{cpu: r.CPUMilli, mem: r.MemoryBytes, gpus: r.GPUs, share: r.ShareMilli,
		models: strings.Join(r.Models, "\x00"), invalid: r.Validate() != nil}
}

// boundPart is what one pod bound or being bound adds to a cycle.
type boundPart struct {
	pod      *corev1.Pod
	node     string
	being    bool // being bound: assumed, not shown bound
	terminal bool
	stable   bool // read from the pod object and the parse inputs alone

	charged bool
	charge  chargeKey
	res     queue.Resources

	demands bool
	demand  placement.Request

	parsed bool    // pi is its parse: as admitted (bound) or as it is (being bound)
	pi     podInfo // for the census and reclaim (admittedOf)
	member bool    // a gang member this scheduler admitted: counted in the census
	gang   string  // its gangID, when a member kept in the ledger
}

// boundPartOf reads p, bound or being bound to node; ok is false for a pod
// that adds nothing (another scheduler's finished pod).
func (s *Scheduler) boundPartOf(v *draCycle, p *corev1.Pod, node string, being bool) (part boundPart, ok bool) {
	e := s.parses.kept(p)
	h := s.headOf(e, p)
	if h.terminal && !h.ours {
		return boundPart{}, false // no entry made: other schedulers' finished pods pile up
	}
	if e == nil {
		if e = s.parses.entry(p); e != nil {
			e.head = h
		}
	}
	part = boundPart{pod: p, node: node, being: being, terminal: h.terminal}
	// Bound: parsed as its binding recorded; being bound: as it is.
	var pi *podInfo
	var parsed bool
	if being {
		pi, parsed = s.ownRef(v, e, p)
	} else {
		pi, parsed = s.admittedRef(v, e, p)
	}
	part.stable = !being && e != nil && e.admitted.done
	if parsed {
		part.parsed, part.pi = true, *pi
		part.member = h.ours && node != "" && pi.GangName() != ""
	}
	if h.terminal {
		return part, true
	}
	if parsed {
		part.charged = true
		part.charge = chargeKey{queue: pi.Queue, namespace: p.Namespace, nonPreemptible: pi.NonPreemptible}
		part.res = pi.res
	}
	if h.skip {
		return part, true
	}
	part.demands = true
	if being && parsed {
		part.demand = pi.Request
		return part, true
	}
	own, parsedOwn := s.ownRef(v, e, p)
	part.stable = part.stable && e != nil && e.own.done && e.own.fixed
	if parsedOwn {
		part.demand = own.Request
		return part, true
	}
	part.demand = podrequest.Demand(request.Parse(p, request.Options{TimesliceResource: s.opts.TimesliceResource}).Demand())
	return part, true
}

// add adds part's sums to the ledger.
func (l *boundLedger) add(part *boundPart) {
	if part.charged && !part.terminal {
		c := l.charges[part.charge]
		if c == nil {
			c = &chargeSum{}
			l.charges[part.charge] = c
		}
		c.res, c.pods = plus(c.res, part.res), c.pods+1
	}
	if part.demands {
		k := demandKeyOf(&part.demand)
		d := l.demand[k]
		if d == nil {
			d = &boundDemand{req: part.demand}
			l.demand[k] = d
		}
		d.n++
	}
}

// plus is a + b, wrapping as int64 does, so that Sub undoes it exactly
// (Resources.Add saturates: a sum that saturated would not come back).
func plus(a, b queue.Resources) queue.Resources {
	return queue.Resources{GPUMilli: a.GPUMilli + b.GPUMilli, CPUMilli: a.CPUMilli + b.CPUMilli, MemoryBytes: a.MemoryBytes + b.MemoryBytes}
}

// saturated is r with the components that wrapped past the largest int64
// at the largest, as Resources.Add would have left them.
func saturated(r queue.Resources) queue.Resources {
	for _, v := range []*int64{&r.GPUMilli, &r.CPUMilli, &r.MemoryBytes} {
		if *v < 0 {
			*v = math.MaxInt64
		}
	}
	return r
}

// remove takes part's sums out of the ledger.
func (l *boundLedger) remove(part *boundPart) {
	if part.charged && !part.terminal {
		if c := l.charges[part.charge]; c != nil {
			if c.res, c.pods = c.res.Sub(part.res), c.pods-1; c.pods == 0 {
				delete(l.charges, part.charge)
			}
		}
	}
	if part.demands {
		k := demandKeyOf(&part.demand)
		if d := l.demand[k]; d != nil {
			if d.n--; d.n == 0 {
				delete(l.demand, k)
			}
		}
	}
}

// forget drops the pod of key k.
func (l *boundLedger) forget(k types.UID) {
	if old := l.parts[k]; old != nil {
		l.remove(old)
		delete(l.parts, k)
		delete(l.volatile, k)
		if old.gang != "" {
			l.dropMember(k, old)
		}
	}
	delete(l.unbound, k)
	delete(l.holders, k)
}

// setBound reads p (its latest object) into the ledger.
func (s *Scheduler) setBound(v *draCycle, p *corev1.Pod) {
	l, k := s.bound, ledgerKey(p)
	l.forget(k)
	if placeholder.IsPlaceholder(p) {
		l.holders[k] = p
	}
	if p.Spec.NodeName == "" {
		l.unbound[k] = p
		return
	}
	part, ok := s.boundPartOf(v, p, p.Spec.NodeName, false)
	if !ok {
		return
	}
	l.parts[k] = &part
	l.add(&part)
	if !part.stable {
		l.volatile[k] = &part
	}
	if part.member {
		id, name := s.gangIDs.of(part.pi.Queue, p.Namespace, part.pi.GangName())
		part.gang = id
		l.addMember(k, &part, name)
	}
}

// rebuildBound reads every pod afresh: those of the list the first time,
// then the ledger's own, which are as new as the events it took (the list
// may be older: a pod deleted since it was taken would come back).
func (s *Scheduler) rebuildBound(v *draCycle, list []*corev1.Pod) {
	l := s.bound
	pods := list
	if l.built {
		pods = make([]*corev1.Pod, 0, len(l.parts)+len(l.unbound))
		for _, part := range l.parts {
			pods = append(pods, part.pod)
		}
		for _, p := range l.unbound {
			pods = append(pods, p)
		}
		for k, p := range l.holders {
			if l.parts[k] == nil && l.unbound[k] == nil {
				pods = append(pods, p) // a finished placeholder: no part
			}
		}
	}
	l.built, l.inputs = true, s.parses.gen
	l.parts = make(map[types.UID]*boundPart, len(pods))
	l.unbound = map[types.UID]*corev1.Pod{}
	l.holders = map[types.UID]*corev1.Pod{}
	l.volatile = map[types.UID]*boundPart{}
	l.gangs = map[string]*gangLedger{}
	l.charges = map[chargeKey]*chargeSum{}
	l.demand = map[demandKey]*boundDemand{}
	for _, p := range pods {
		s.setBound(v, p)
	}
}

// readBound brings the ledger up to date with the pod informer's events
// (read whole when the parse inputs changed), charges the pods bound or
// being bound to their queues (books.charge), counts the gang members among
// them (gangsPlaced) and returns their demand for feedDemand. Pods this
// scheduler cannot parse count with their plain requests; placeholders and
// reservation pods are left out of the demand. list lists every pod; it is
// called only when the ledger is read the first time or a pod being bound
// is not in it.
func (s *Scheduler) readBound(v *draCycle, list func() ([]*corev1.Pod, error), assumed map[types.UID]state.Assumed, b *books) ([]boundDemand, *gangsPlaced, error) {
	if err := s.updateBound(v, list); err != nil {
		return nil, nil, err
	}
	being, err := s.beingBound(v, list, assumed)
	if err != nil {
		return nil, nil, err
	}
	return s.bound.replay(being, b), s.census(being), nil
}

// updateBound brings the ledger up to date with the events taken: read
// whole the first time and when the parse inputs changed, then the pods
// the events changed, then the volatile parts.
func (s *Scheduler) updateBound(v *draCycle, list func() ([]*corev1.Pod, error)) error {
	l := s.bound
	var first []*corev1.Pod
	if !l.built {
		// Listed before the events are taken, which go on top: the
		// list is older than they are, or newer by the events of a
		// handler still running, which marks them for the next cycle.
		var err error
		if first, err = list(); err != nil {
			return err
		}
	}
	dirty, fresh := l.takeDirty()
	if !l.built || l.inputs != s.parses.gen {
		s.rebuildBound(v, first)
		if first != nil {
			fresh = nil // the list holds the informer's objects
		}
	}
	for k, p := range dirty {
		if p == nil {
			l.forget(k)
			continue
		}
		s.setBound(v, p)
	}
	for k, p := range fresh {
		l.replace(k, p)
	}
	if len(l.volatile) > 0 {
		again := make([]*corev1.Pod, 0, len(l.volatile))
		for _, part := range l.volatile {
			again = append(again, part.pod)
		}
		for _, p := range again {
			s.setBound(v, p)
		}
	}
	return nil
}

// replay charges the sums of the parts kept, then the pods being bound, to
// the books; it returns their demand.
func (l *boundLedger) replay(being []boundPart, b *books) []boundDemand {
	for k, c := range l.charges {
		b.chargeSum(k, saturated(c.res))
	}
	out := make([]boundDemand, 0, len(l.demand)+len(being))
	for _, d := range l.demand {
		out = append(out, *d)
	}
	for i := range being {
		part := &being[i]
		if part.charged && !part.terminal {
			b.chargeSum(part.charge, part.res)
		}
		if part.demands {
			out = append(out, boundDemand{req: part.demand, n: 1})
		}
	}
	return out
}

// beingBound reads the pods being bound that the ledger does not show
// bound. A pod the list shows bound whose events the ledger has not (or no
// longer) is read for this cycle alone, so that it counts once, never
// nowhere, and never after its deletion.
func (s *Scheduler) beingBound(v *draCycle, list func() ([]*corev1.Pod, error), assumed map[types.UID]state.Assumed) ([]boundPart, error) {
	l := s.bound
	// The parts are made in the last cycle's buffer: a pod's part is 450
	// bytes, and a busy cycle has thousands being bound.
	clear(l.being)
	var (
		being = l.being[:0]
		byUID map[types.UID]*corev1.Pod
	)
	defer func() { l.being = being }()
	for uid, a := range assumed {
		if l.parts[uid] != nil {
			continue // shown bound
		}
		p := l.unbound[uid]
		if p == nil && a.Pod.Name != "" {
			// Listed before its events were handled, or deleted since:
			// read again from the lister by name (a pod of that name with
			// another UID is another pod).
			if q, err := s.deps.Pods.Pods(a.Pod.Namespace).Get(a.Pod.Name); err == nil && q.UID == uid {
				p = q
			} else {
				continue
			}
			if p.Spec.NodeName != "" {
				// Shown bound by the lister alone: counted as bound for
				// this cycle, not kept (its deletion may be taken already).
				if part, ok := s.boundPartOf(v, p, p.Spec.NodeName, false); ok {
					being = append(being, part)
				}
				continue
			}
		}
		if p == nil {
			// Listed before its events were handled, or deleted since.
			if byUID == nil {
				pods, err := list()
				if err != nil {
					return nil, err
				}
				byUID = make(map[types.UID]*corev1.Pod, len(pods))
				for _, q := range pods {
					byUID[q.UID] = q
				}
			}
			if p = byUID[uid]; p == nil {
				continue
			}
			if p.Spec.NodeName != "" {
				// Shown bound by the list alone: counted as bound for this
				// cycle, not kept (its deletion may be taken already).
				if part, ok := s.boundPartOf(v, p, p.Spec.NodeName, false); ok {
					being = append(being, part)
				}
				continue
			}
		}
		if part, ok := s.boundPartOf(v, p, a.Node, true); ok {
			being = append(being, part)
		}
	}
	return being, nil
}

// placeholders are the placeholder pods the ledger holds, by name (then UID).
func (l *boundLedger) placeholders() []*corev1.Pod {
	out := make([]*corev1.Pod, 0, len(l.holders))
	for _, p := range l.holders {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b *corev1.Pod) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name), strings.Compare(string(a.UID), string(b.UID)))
	})
	return out
}

// admittedOf is parseAdmitted of p, a pod shown bound, from its part in the
// ledger when the part was read from this object (reclaim reads every bound
// pod; the parse cache keeps only what the cycle read).
func (s *Scheduler) admittedOf(v *draCycle, p *corev1.Pod) (podInfo, bool) {
	if part := s.bound.parts[p.UID]; part != nil && part.pod == p && !part.being {
		return part.pi, part.parsed
	}
	pi, ok, _ := s.parseAdmitted(v, p)
	return pi, ok
}

// podHead is what readBound reads of a pod besides its parses.
type podHead struct {
	set      bool // read (a kept entry's head is read once)
	terminal bool // state.Terminal
	ours     bool // this scheduler's pod
	skip     bool // a placeholder or reservation pod: its demand is counted elsewhere
}

// headOf is p's head, kept in its parse entry e (nil: read afresh).
func (s *Scheduler) headOf(e *parseEntry, p *corev1.Pod) podHead {
	if e != nil && e.head.set {
		return e.head
	}
	h := podHead{set: true, terminal: predicates.Terminal(p), ours: p.Spec.SchedulerName == s.opts.SchedulerName,
		skip: placeholder.IsPlaceholder(p) || predicates.IsReservation(p)}
	if e != nil {
		e.head = h
	}
	return h
}

// admittedRef is parseAdmitted of p, the kept parse itself when there is
// one (not a copy): read only.
func (s *Scheduler) admittedRef(v *draCycle, e *parseEntry, p *corev1.Pod) (*podInfo, bool) {
	if e != nil && e.admitted.done {
		return &e.admitted.pi, e.admitted.queue != "" && e.admitted.err == nil
	}
	pi, ok, _ := s.parseAdmitted(v, p)
	return &pi, ok
}

// ownRef is parse of p, the kept parse itself when it cannot change (its
// queue is the pod's own): read only.
func (s *Scheduler) ownRef(v *draCycle, e *parseEntry, p *corev1.Pod) (*podInfo, bool) {
	if e != nil && e.own.done && e.own.fixed {
		return &e.own.pi, e.own.err == nil
	}
	pi, err := s.parse(v, p)
	return &pi, err == nil
}
