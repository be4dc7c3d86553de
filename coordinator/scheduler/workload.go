package scheduler

import (
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/podrequest"
	"github.com/gpufrac/gpufrac/coordinator/queue"
	"github.com/gpufrac/gpufrac/coordinator/state"
)

// podInfo is one pod, parsed: what it asks, its queue, gang and priority
// (podrequest.Parsed, kept per pod object by the parse cache), and what a
// cycle adds.
type podInfo struct {
	pod *corev1.Pod
	podrequest.Parsed
	// res is the pod's charge to its queue (Parsed.QueueResources), taken
	// when it was parsed: the cycle may narrow the placement request after
	// (a GPU its claim holds already is not asked again), not the charge.
	res queue.Resources
	// extended is the pod's extended-resource claim an earlier attempt
	// made and did not see through (Scheduler.extendedClaimOf), pending
	// pods only.
	extended *resourceapi.ResourceClaim
}

// gangIDs interns gangs' IDs (gangID) from one cycle to the next: a gang's
// bound members are counted in every cycle, and their gang's ID is made
// once, not once per member and cycle. It keeps the IDs asked for in this
// cycle and the last (turn starts a cycle). For the cycle's goroutine only.
type gangIDs struct{ cur, prev map[gangName]string }

// gangName is a gang in a namespace, charged to a queue.
type gangName struct{ queue, namespace, name string }

// turn starts a cycle: the IDs not asked for in the last one are let go.
func (g *gangIDs) turn() {
	g.prev, g.cur = g.cur, make(map[gangName]string, len(g.cur))
}

// of is the ID of the gang name in namespace charged to queue, and its key
// ("namespace/name", the ID's tail).
func (g *gangIDs) of(queue, namespace, name string) (id, key string) {
	k := gangName{queue: queue, namespace: namespace, name: name}
	id, ok := g.cur[k]
	if !ok {
		if id, ok = g.prev[k]; !ok {
			id = gangID(queue, namespace+"/"+name)
		}
		if g.cur == nil {
			g.cur = map[gangName]string{}
		}
		g.cur[k] = id
	}
	return id, id[len(queue)+1:]
}

// workload is what is admitted all or nothing: a gang's pending members, or one pod.
type workload struct {
	key string
	// gangID is the gang's ID (gangID) when made by group.
	gangID         string
	queue          string
	gang           bool
	pods           []podInfo
	priority       int32
	nonPreemptible bool
	created        time.Time
	// pool is the node pool of members already bound, when pinned ("" is
	// then the nodes of no pool); pinned says members are bound.
	pool   string
	pinned bool
	// incomplete explains why a gang waits for members ("" when complete).
	incomplete string
	// kueue says Kueue keeps the queue's quota and admitted the pods
	// (holdForKueue): their bindings record the Workload's owner.
	kueue bool
}

// claimsGPU tells whether a pod of w gets its GPUs through claims.
func (w *workload) claimsGPU() bool {
	for _, p := range w.pods {
		if p.ClaimsGPU {
			return true
		}
	}
	return false
}

func (w *workload) resources() queue.Resources {
	var r queue.Resources
	for _, p := range w.pods {
		r = r.Add(p.res)
	}
	return r
}

// candidatePools lists the pools a gang may go to: the pool of its bound
// members, else every pool in the snapshot, sorted by name (nodes without the
// pool label form the pool "").
func (w *workload) candidatePools(snap *state.Snapshot) []string {
	if w.pinned {
		return []string{w.pool}
	}
	return slices.Clone(snap.Pools())
}

type invalidPod struct {
	pod     *corev1.Pod
	message string
}

// group parses pending pods and gathers them into workloads. Gang members
// already bound (or being bound) count toward min-member and pin the pool.
// deferred counts the pods left for a later cycle because their Job or a
// claim is not in the informers' caches yet.
func (s *Scheduler) group(v *draCycle, pending []*corev1.Pod, placed *gangsPlaced, b *books) (_ []*workload, _ []invalidPod, deferred int) {
	var invalid []invalidPod
	// A workload is keyed "namespace/name", a gang's by its group and a
	// single pod's by its own name: the two are kept apart here, and a
	// single pod named like a pending gang is refused below.
	singles := make(map[string]*workload, len(pending))
	gangs := map[string]*workload{}
	order := make([]*workload, 0, len(pending))
	for _, p := range pending {
		pi, err := s.parsePending(v, p, b)
		if errors.Is(err, podrequest.ErrJobNotFound) || errors.Is(err, podrequest.ErrClaimsPending) {
			deferred++
			continue // the Job or a claim is not in the cache yet: try again next cycle
		}
		if err != nil {
			invalid = append(invalid, invalidPod{pod: p, message: err.Error()})
			continue
		}
		var key, id string
		if g := pi.GangName(); g != "" {
			id, key = s.gangIDs.of(pi.Queue, p.Namespace, g)
		} else {
			key = p.Namespace + "/" + p.Name
		}
		byKey := singles
		if id != "" {
			byKey = gangs
		}
		w := byKey[key]
		if w == nil {
			w = &workload{key: key, gangID: id, queue: pi.Queue, gang: id != "", priority: pi.Priority, created: p.CreationTimestamp.Time}
			byKey[key] = w
			order = append(order, w)
		}
		w.add(pi)
	}
	ws := order[:0]
	for _, w := range order {
		if !w.gang && gangs[w.key] != nil {
			// Taken for one of the gang's members, it would count toward
			// its min-member (or, first seen, place the gang as single
			// pods), and the two would share the key's back-off and
			// placeholders.
			invalid = append(invalid, invalidPod{pod: w.pods[0].pod, message: fmt.Sprintf(
				"pod %s has the name of gang %s (label %s or a Job) and is in no gang: the coordinator cannot tell them apart while the gang is pending; rename the pod or the gang",
				w.key, w.key, api.LabelPodGroup)})
			continue
		}
		if w.gang {
			if mixed := w.mixedQueues(); mixed != "" {
				for _, q := range w.pods {
					invalid = append(invalid, invalidPod{pod: q.pod, message: mixed})
				}
				continue
			}
			w.pool, w.pinned = placed.pool[w.gangID]
			w.incomplete = w.gangIncomplete(placed.bound[w.gangID])
		}
		ws = append(ws, w)
	}
	return ws, invalid, deferred
}

// parsePending parses a pending pod for group: its request, its queue
// checked, its own extended-resource claim (a claim it did not make is an
// error), and a GPU its claim holds already, on a node, taken as placed
// there.
func (s *Scheduler) parsePending(v *draCycle, p *corev1.Pod, b *books) (podInfo, error) {
	pi, err := s.parse(v, p)
	if err == nil {
		err = b.validQueue(pi.Queue, p.Namespace)
	}
	if err != nil {
		return pi, err
	}
	claims := pi.Claims
	if !pi.ClaimsGPU && (pi.Request.GPUs > 0 || pi.Request.ShareMilli > 0) {
		own, forged, why := v.extendedClaimOf(p)
		if forged != nil {
			return pi, errors.New(forgedClaimMessage(forged, why))
		}
		if pi.extended = own; pi.extended != nil {
			claims = []*resourceapi.ResourceClaim{pi.extended}
		}
	}
	if node := allocatedGPUClaimNode(claims); (pi.ClaimsGPU || pi.extended != nil) && node != "" {
		// Its GPU is held already, on that node: place it there and
		// take nothing more (the snapshot charges the claim).
		r := withOnlyNodes(&pi.Request, map[string]bool{node: true})
		r.GPUs, r.ShareMilli = 0, 0
		pi.Request = *r
	}
	return pi, nil
}

// add adds a pod to w: the workload's priority is its pods' highest, its
// age its oldest pod's.
func (w *workload) add(pi podInfo) {
	w.pods = append(w.pods, pi)
	w.nonPreemptible = w.nonPreemptible || pi.NonPreemptible
	if pi.Priority > w.priority {
		w.priority = pi.Priority
	}
	if created := pi.pod.CreationTimestamp.Time; created.Before(w.created) {
		w.created = created
	}
}

// mixedQueues says why gang w is refused when its members name more than
// one queue ("" when they name one).
func (w *workload) mixedQueues() string {
	for _, p := range w.pods {
		if p.Queue != w.queue {
			return fmt.Sprintf("gang %s mixes queues %s and %s: all members must use one queue", w.key, w.queue, p.Queue)
		}
	}
	return ""
}

// gangIncomplete says why gang w waits for members, bound of its members
// bound or being bound ("" when it has its min-member).
func (w *workload) gangIncomplete(bound int) string {
	if missing := w.pods[0].MissingPodGroup(); missing != "" {
		return fmt.Sprintf("waiting for PodGroup %s/%s, which does not exist yet: its gang policy says how many pods start together", w.pods[0].pod.Namespace, missing)
	}
	want := 0
	for _, p := range w.pods {
		want = max(want, p.GangMinMember())
	}
	if have := len(w.pods) + bound; have < want {
		return fmt.Sprintf("gang %s has %d of its %d members (%d pending, %d placed); waiting for the rest before placing any", w.key, have, want, len(w.pods), bound)
	}
	return ""
}

// gangsPlaced are the gang members bound or being bound (readBound counts
// them, census.go): a gang's members already placed count toward its
// min-member and pin its node pool. A gang is one queue's (gangID): a pod of
// another queue that carries the same pod group name (tenant input) counts
// for its own queue's gang, never toward this one's min-member or rollback.
// Its censuses are the ledger's: read, never changed.
type gangsPlaced struct {
	bound  map[string]int         // gangID -> members placed
	pool   map[string]string      // gangID -> their pool
	census map[string]*gangCensus // gangID -> its bound members, for checkGangBinds
}

// newGangsPlaced makes an empty count for n gangs.
func newGangsPlaced(n int) *gangsPlaced {
	return &gangsPlaced{bound: make(map[string]int, n), pool: make(map[string]string, n), census: make(map[string]*gangCensus, n)}
}

// maxCensusRoom bounds the room a gang's census makes for its members
// before it counts them.
const maxCensusRoom = 256

// gangID names a gang in one queue: its queue and "namespace/group".
func gangID(queue, key string) string { return queue + "|" + key }

// id is the workload's gang ID (gangID), "" for a single pod.
func (w *workload) id() string {
	if !w.gang {
		return ""
	}
	if w.gangID != "" {
		return w.gangID
	}
	return gangID(w.queue, w.key)
}

// poolOf is node's pool, and whether the node exists.
func (s *Scheduler) poolOf(node string) (string, bool) {
	n, err := s.deps.Nodes.Get(node)
	if err != nil {
		return "", false
	}
	return n.Labels[s.opts.PoolLabel], true
}
