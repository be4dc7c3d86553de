package scheduler

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/gpufrac/gpufrac/coordinator/predicates"
	"github.com/gpufrac/gpufrac/coordinator/queue"
	"github.com/gpufrac/gpufrac/coordinator/state"
)

// Evictor evicts pods through the Eviction API.
type Evictor interface {
	Evict(ctx context.Context, pod *corev1.Pod, reason string) error
}

// evictionRetry is how long a victim whose eviction the API refused (a
// PodDisruptionBudget, 429) is left out of the candidates: other victims
// are chosen meanwhile, and the refused one is tried again after it.
const evictionRetry = 10 * time.Second

// terminatingWait bounds the wait for a terminating pod: a starved queue
// waits for one that would make room only while its grace period ends
// within terminatingWait and is not overdue by more. A pod's grace period
// is its author's to choose (an hour, a year) and a pod can hang in
// Terminating on a node whose runtime is stuck: waited for, such a pod
// would stall reclaim for every queue it would make room for. Past the
// bound, reclaim chooses other victims; the pod still counts as holding its
// resources, so nothing is placed on them before it is gone.
const terminatingWait = 2 * time.Minute

// reclaimScope is what reclaim reads of the cluster, built at most once per
// cycle and shared by every workload the cycle tries to reclaim for. Built
// per workload, as it was, a cycle with a backlog of pending pods in a
// starved queue parsed every pod and built whole-cluster snapshots once or
// twice per pending pod: seconds per cycle with a few hundred pods waiting
// on a few thousand running (BenchmarkCycleWithStarvedBacklog).
type reclaimScope struct {
	in state.Inputs
	// list lists every pod; index reads them into pods (listErr: it failed).
	list    func() ([]*corev1.Pod, error)
	pods    []*corev1.Pod
	listErr error
	dra     *draCycle
	now     time.Time
	// cache makes the what-if snapshots (without): only the nodes of the
	// pods left out are charged for them.
	cache *state.Cache

	indexed bool
	// byUID: pod UID -> the pod, for pods that still hold resources.
	byUID map[types.UID]*corev1.Pod
	// groups: "queue:namespace/name" -> a running workload the coordinator
	// admitted to that queue (a gang whole, or one pod), every queue's; keys
	// sorted in order.
	groups map[string]*victimGroup
	order  []string

	// going counts the terminating pods reclaim waits for (terminatingWait),
	// and withoutGoing is the cluster without them (nil until needed, or
	// when it could not be built).
	going        int
	withoutGoing *state.Snapshot
	goingPods    []*corev1.Pod // the pods withoutGoing leaves out
	goingBuilt   bool

	// roomy: queue -> the cluster without the preemptible running workloads
	// of every other queue, the most room reclaim could ever make for it.
	roomy map[string]*state.Snapshot
	// noVictims: (queue, need) -> true when no victims could be found for
	// it this cycle. The candidates only shrink during a cycle (refused
	// evictions), so the answer holds for the rest of it: a backlog of
	// same-sized pods asks once, not once per pod.
	noVictims map[reclaimNeed]bool
}

// reclaimNeed is what a workload asks a queue to reclaim for it.
type reclaimNeed struct {
	queue string
	need  queue.Resources
}

// victimGroup is a running workload reclaim may choose.
type victimGroup struct {
	w    queue.Workload
	pods []*corev1.Pod
}

func newReclaimScope(in state.Inputs, list func() ([]*corev1.Pod, error), cache *state.Cache, v *draCycle, now time.Time) *reclaimScope {
	return &reclaimScope{in: in, list: list, cache: cache, dra: v, now: now, roomy: map[string]*state.Snapshot{}, noVictims: map[reclaimNeed]bool{}}
}

// index parses the running pods once: the UID index, the candidate groups,
// and the terminating pods reclaim waits for.
func (sc *reclaimScope) index(s *Scheduler, b *books) {
	if sc.indexed {
		return
	}
	sc.indexed = true
	sc.groups = map[string]*victimGroup{}
	if sc.pods, sc.listErr = sc.list(); sc.listErr != nil {
		return
	}
	sc.byUID = make(map[types.UID]*corev1.Pod, len(sc.pods))
	for _, p := range sc.pods {
		if predicates.Terminal(p) {
			continue
		}
		sc.byUID[p.UID] = p
		if p.Spec.NodeName == "" {
			continue
		}
		if p.DeletionTimestamp != nil {
			if sc.waitsFor(p) {
				sc.going++
			}
			continue
		}
		pi, ok := s.admittedOf(sc.dra, p)
		if !ok {
			continue
		}
		// A pod is non-preemptible only inside its queue's namespaces:
		// gpufrac.io/preemptible "false" protects nothing in a namespace
		// the queue no longer lets in.
		np := pi.NonPreemptible && b.allows(pi.Queue, p.Namespace)
		// A workload is one queue's: pods of another queue that carry the
		// same pod group name (tenant input) are that queue's own workload,
		// never part of this one.
		key := pi.Queue + ":" + p.Namespace + "/" + p.Name
		if pi.GangName() != "" {
			// A gang's pods were admitted as one, so they share how; pods
			// relabelled into a gang after admission do not join its
			// protection.
			key = pi.Queue + ":" + p.Namespace + "/" + pi.GangName() + "/preemptible=" + strconv.FormatBool(!np)
		}
		g := sc.groups[key]
		if g == nil {
			g = &victimGroup{w: queue.Workload{Queue: pi.Queue, Key: key, Priority: pi.Priority, Preemptible: true, CreationUnixNano: p.CreationTimestamp.UnixNano()}}
			sc.groups[key] = g
			sc.order = append(sc.order, key)
		}
		g.w.Resources = g.w.Resources.Add(pi.res)
		g.w.Preemptible = g.w.Preemptible && !np
		g.w.Priority = min(g.w.Priority, pi.Priority)
		g.w.CreationUnixNano = min(g.w.CreationUnixNano, p.CreationTimestamp.UnixNano())
		g.pods = append(g.pods, p)
	}
	sort.Strings(sc.order)
}

// waitsFor tells whether reclaim waits for terminating pod p to end: its
// grace period ends within terminatingWait and is not overdue by more.
func (sc *reclaimScope) waitsFor(p *corev1.Pod) bool {
	end := p.DeletionTimestamp.Time
	return end.Sub(sc.now) <= terminatingWait && sc.now.Sub(end) <= terminatingWait
}

// holds finds a pod that still holds resources (not terminal) by UID.
func (sc *reclaimScope) holds(uid types.UID) *corev1.Pod { return sc.byUID[uid] }

// fits tells whether w fits on snap, leaving snap as it was. With kc, its
// pods must also pass kube-scheduler's checks with the pods gone taken out,
// as kube-scheduler's preemption checks a node without its victims: reclaim
// never evicts for a pod that a check would still reject, and victims'
// own anti-affinity does not keep them.
func (s *Scheduler) fits(v *draCycle, snap *state.Snapshot, w *workload, kc *kubeChecks, gone []*corev1.Pod) bool {
	if snap == nil {
		return false
	}
	cp := snap.Checkpoint()
	m := kc.mark()
	if kc != nil {
		kc.without = gone
		defer func() { kc.without = nil }()
	}
	_, err := s.place(v, snap, w, kc)
	kc.rollback(m)
	if rbErr := snap.Rollback(cp); rbErr != nil {
		return false
	}
	return err == nil
}

// without is the cluster as the cache holds it, without the pods gone says
// (a pure predicate: it may be asked more than once of a pod). The cache may
// have moved since the cycle's snapshot: a pod deleted meanwhile makes room in
// it, as one deleted after the cycle listed the pods did before the cache was
// fed by events; either way the window ends with the evictions.
func (sc *reclaimScope) without(gone func(*corev1.Pod) bool) *state.Snapshot {
	in := sc.in
	in.Nodes = nil // the cache's
	snap, err := sc.cache.SnapshotWithout(in, gone)
	if err != nil {
		return nil
	}
	return snap
}

// reclaim tries to give a queue below its deserved quota the room for w by
// evicting preemptible, over-quota workloads of other queues (whole gangs,
// lowest priority first). It returns a message for w's pods when it evicted
// or is still waiting for earlier victims to go; "" when nothing can be done.
//
// Victims are remembered only once their eviction succeeded, and only for
// the moment until the informer shows them terminating: from then on the
// API itself says they are going, so a restarted coordinator waits for
// them as its predecessor did, instead of evicting more.
func (s *Scheduler) reclaim(ctx context.Context, w *workload, b *books, sc *reclaimScope, kc *kubeChecks) string {
	if s.deps.Evictor == nil {
		return ""
	}
	if sc.index(s, b); sc.listErr != nil {
		return fmt.Sprintf("queue %s is below its deserved quota, but reclaim could not read the pods (%v): tried again in the next cycle", w.queue, sc.listErr)
	}
	now := sc.now
	// 1. Earlier victims still running, or pods terminating that would make
	// room: wait for them, evict nothing more.
	waiting := s.reclaims.waitingFor(w.queue, func(uid types.UID) bool {
		p := sc.holds(uid)
		return p != nil && p.DeletionTimestamp == nil // else gone, or the API shows it terminating
	})
	refused := s.reclaims.stillRefused(now, func(uid types.UID) bool { return sc.holds(uid) != nil })
	if waiting > 0 {
		return fmt.Sprintf("queue %s is below its deserved quota: waiting for %d reclaimed pods of other queues to end", w.queue, waiting)
	}
	if n := s.fitsWithoutTerminating(w, sc, kc); n > 0 {
		return fmt.Sprintf("queue %s is below its deserved quota: waiting for %d terminating pods to end", w.queue, n)
	}

	// 2. Candidates: running workloads (gangs whole) the coordinator
	// admitted to other queues, but for those with a victim whose eviction
	// was refused a moment ago (a gang is evicted whole or not at all).
	asked := reclaimNeed{queue: w.queue, need: w.resources()}
	if sc.noVictims[asked] {
		return ""
	}
	list := make([]queue.Workload, 0, len(sc.order))
	for _, key := range sc.order {
		g := sc.groups[key]
		if g.w.Queue == w.queue || g.refused(refused) {
			continue
		}
		list = append(list, g.w)
	}
	victims, ok := b.tree.ReclaimVictims(w.queue, asked.need, list)
	if !ok {
		sc.noVictims[asked] = true
		return ""
	}

	// 3. Verify: with the victims gone, does w fit? First on the most room
	// reclaim could ever make for this queue (built once per cycle and
	// queue), which is enough to turn most hopeless workloads away; then on
	// the cluster without these victims.
	if !s.fits(sc.dra, sc.roomyFor(w.queue), w, kc, sc.roomyGone(w.queue)) {
		return ""
	}
	evict, ok := s.victimsThatMakeRoom(w, b, sc, kc, asked.need, list, victims)
	if !ok {
		return ""
	}

	// 4. Evict, and remember the victims evicted so the next cycles wait
	// for them; a refused eviction is tried again after evictionRetry.
	var evicted int
	var lastErr error
	for _, p := range evict {
		msg := fmt.Sprintf("reclaimed by queue %s, which is below its deserved quota", w.queue)
		err := s.deps.Evictor.Evict(ctx, p, msg)
		if err != nil {
			s.reclaims.refusedAt(p.UID, now)
		} else {
			s.reclaims.evictedFor(w.queue, p.UID)
			evicted++
		}
		if err != nil {
			lastErr = err
			klog.FromContext(ctx).Error(err, "Evicting for reclaim refused; trying other victims", "pod", klog.KObj(p), "queue", w.queue, "retryAfter", evictionRetry)
		}
	}
	klog.FromContext(ctx).Info("Reclaiming quota", "queue", w.queue, "workload", w.key, "victims", len(victims), "pods", len(evict), "evicted", evicted)
	msg := fmt.Sprintf("queue %s is below its deserved quota: reclaiming %d pods (%d workloads) from over-quota queues", w.queue, evicted, len(victims))
	if lastErr != nil {
		msg += fmt.Sprintf("; %d evictions refused, tried again in %s: %v", len(evict)-evicted, evictionRetry, lastErr)
	}
	return msg
}

// reclaimEscalations bounds how many times victimsThatMakeRoom doubles the
// victims (up to 8 times what the GPUs need).
const reclaimEscalations = 3

// victimsThatMakeRoom returns the pods of victims when w fits without them.
// When it does not only because kube-scheduler's checks still reject it
// (other pods of an over-quota queue hold the anti-affinity, ports or
// spread that keep it out), it asks the queue tree for twice, four and
// eight times the victims, within the same fairness rules (each victim's
// queue stays at or above its deserved quota), as kube-scheduler's
// preemption takes every lower-priority pod that stands in the way.
func (s *Scheduler) victimsThatMakeRoom(w *workload, b *books, sc *reclaimScope, kc *kubeChecks, need queue.Resources, list []queue.Workload, victims []queue.Workload) ([]*corev1.Pod, bool) {
	for step := 0; ; step++ {
		gone := map[types.UID]bool{}
		var evict []*corev1.Pod
		for _, v := range victims {
			for _, p := range sc.groups[v.Key].pods {
				gone[p.UID] = true
				evict = append(evict, p)
			}
		}
		snap := sc.without(func(p *corev1.Pod) bool { return gone[p.UID] })
		if s.fits(sc.dra, snap, w, kc, evict) {
			return evict, true
		}
		if kc == nil || step == reclaimEscalations || !s.fits(sc.dra, snap, w, nil, nil) {
			// Without kube-scheduler's checks it does not fit either: more
			// victims than the GPUs need are not the answer.
			return nil, false
		}
		more, ok := b.tree.ReclaimVictimsUpTo(w.queue, need, list, 2*len(victims))
		if !ok || len(more) <= len(victims) {
			return nil, false
		}
		victims = more
	}
}

// refused tells whether the eviction of one of g's pods was refused lately.
func (g *victimGroup) refused(refused map[types.UID]bool) bool {
	if len(refused) == 0 {
		return false
	}
	for _, p := range g.pods {
		if refused[p.UID] {
			return true
		}
	}
	return false
}

// roomyGone are the pods roomyFor(q) leaves out.
func (sc *reclaimScope) roomyGone(q string) []*corev1.Pod {
	var out []*corev1.Pod
	for _, key := range sc.order {
		g := sc.groups[key]
		if g.w.Queue == q || !g.w.Preemptible {
			continue
		}
		out = append(out, g.pods...)
	}
	return out
}

// roomyFor is the cluster without the preemptible running workloads of
// every queue but q: no choice of victims makes more room for q.
func (sc *reclaimScope) roomyFor(q string) *state.Snapshot {
	if snap, ok := sc.roomy[q]; ok {
		return snap
	}
	gone := map[types.UID]bool{}
	for _, key := range sc.order {
		g := sc.groups[key]
		if g.w.Queue == q || !g.w.Preemptible {
			continue
		}
		for _, p := range g.pods {
			gone[p.UID] = true
		}
	}
	snap := sc.without(func(p *corev1.Pod) bool { return gone[p.UID] })
	sc.roomy[q] = snap
	return snap
}

// fitsWithoutTerminating returns the number of terminating pods reclaim
// waits for (deleted or evicted, still holding their resources, ending
// within terminatingWait) when w would fit once they are gone; 0 when none
// are or w would not fit even then.
func (s *Scheduler) fitsWithoutTerminating(w *workload, sc *reclaimScope, kc *kubeChecks) int {
	if sc.going == 0 {
		return 0
	}
	if !sc.goingBuilt {
		sc.goingBuilt = true
		going := map[types.UID]bool{}
		for _, p := range sc.pods {
			if p.DeletionTimestamp != nil && p.Spec.NodeName != "" && !predicates.Terminal(p) && sc.waitsFor(p) {
				sc.goingPods = append(sc.goingPods, p)
				going[p.UID] = true
			}
		}
		sc.withoutGoing = sc.without(func(p *corev1.Pod) bool { return going[p.UID] })
	}
	if !s.fits(sc.dra, sc.withoutGoing, w, kc, sc.goingPods) {
		return 0
	}
	return sc.going
}

// pruneReclaims forgets the reclaim victims that are gone or shown
// terminating (the API says they are going from then on) and the refused
// evictions whose wait is over or whose pod is gone. reclaim does so for the
// queue it serves; a queue that got its room back never calls it again, and
// what it left would keep the idle skip off (cycle.quiet).
func (s *Scheduler) pruneReclaims(list func() ([]*corev1.Pod, error), now time.Time) error {
	if s.reclaims.empty() {
		return nil
	}
	pods, err := list()
	if err != nil {
		return err
	}
	running := make(map[types.UID]bool, len(pods)) // holds resources -> not terminating
	for _, p := range pods {
		if !predicates.Terminal(p) {
			running[p.UID] = p.DeletionTimestamp == nil
		}
	}
	s.reclaims.prune(running, now)
	return nil
}
