package scheduler

import (
	"context"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/placement"
	"github.com/gpufrac/gpufrac/coordinator/state"
)

// A workload whose fractions wait for reservation pods keeps its placement
// from one cycle to the next. Placing it afresh each cycle is path
// dependent (other pods were bound meanwhile, new ones came), so a waiting
// fraction could move to another GPU every cycle and ask for yet another
// reservation: with 1,000 fractions arriving at once the coordinator
// reserved every GPU of a 130-node cluster for 350 GPUs' worth of fractions,
// and re-placed pods for seconds instead of binding them.

// plans are the placements of the pods that wait for their reservations or
// for their node to settle, by pod UID: the Scheduler keeps the last cycle's,
// and a cycle makes its own (cycle.plans), read from the last.
type plans map[types.UID]plan

// plan is where a pod waiting for its GPU's reservation was placed.
type plan struct {
	placement.Decision
	// seen is true once the pod's reservation was in the informer's cache:
	// missing later, it was removed (failed, or never admitted), and the
	// pod is placed again. Missing before, the cache may just lag behind
	// the creation.
	seen bool
	// since is when the pod began to wait for this node and GPU.
	since time.Time
}

// DefaultReservationReportDelay is the coordinator's
// Options.ReservationReportDelay: the kubelet admits a reservation and the
// node agent reports its GPU within a second or two, and writing a pod
// condition plus an event for each fraction of a burst would double its
// API requests for nothing.
const DefaultReservationReportDelay = 5 * time.Second

// keep returns the decisions w was given in the last cycle when it
// waited for reservations or for its node to settle (Scheduler.held), and
// they still hold on snap: every pod planned, each planned node still
// schedulable, with room, and allowing the pod by its labels and taints
// now (the wait lasts NewNodeSettle or a reservation's admission, and a pod
// bound to a node tainted NoExecute meanwhile is deleted by the taint
// manager the moment it lands), and every planned GPU's reservation not
// removed. It assumes them on snap. It returns nil when w must be placed
// afresh.
func (ps plans) keep(snap *state.Snapshot, w *workload) []placement.Decision {
	if len(ps) == 0 {
		return nil
	}
	ds := make([]placement.Decision, len(w.pods))
	for i, p := range w.pods {
		pl, ok := ps[p.pod.UID]
		if !ok {
			return nil
		}
		d := pl.Decision
		idx, ok := snap.Index(d.Node)
		if !ok || (p.Request.ShareMilli > 0 && snap.NoFraction[d.Node]) || !snap.Allows(&p.Request, idx) {
			return nil
		}
		d.NodeIndex = idx
		if len(d.GPUs) > 0 {
			ids := snap.Node(idx).GPUs
			for k, g := range d.GPUs {
				if gi := d.GPUIndices[k]; gi >= len(ids) || ids[gi].ID != g {
					return nil // the node's GPUs changed
				}
			}
		}
		if p.Request.ShareMilli > 0 && len(d.GPUs) == 1 {
			r := snap.Reservations[state.NodeGPU{Node: d.Node, GPU: d.GPUs[0]}]
			if (r == nil && pl.seen) || (r != nil && (r.Orphaned != "" || r.TakenBy != nil || r.Pod != nil && (r.Pod.DeletionTimestamp != nil || r.Pod.Status.Phase == corev1.PodFailed))) {
				return nil // the reservation is gone or going: place again
			}
		}
		ds[i] = d
	}
	cp := snap.Checkpoint()
	for i := range w.pods {
		if err := snap.Assume(&w.pods[i].Request, ds[i]); err != nil {
			_ = snap.Rollback(cp)
			return nil
		}
	}
	if err := snap.Commit(cp); err != nil {
		return nil
	}
	return ds
}

// record records the decisions of a workload that waits for reservations,
// for keep in the next cycle; a pod that keeps its plan in previous keeps
// the time it began to wait.
func (ps plans) record(previous plans, w *workload, ds []placement.Decision, snap *state.Snapshot, now time.Time) {
	for i, p := range w.pods {
		seen := true
		if p.Request.ShareMilli > 0 && len(ds[i].GPUs) == 1 {
			r := snap.Reservations[state.NodeGPU{Node: ds[i].Node, GPU: ds[i].GPUs[0]}]
			seen = r != nil && r.Pod != nil
		}
		since := now
		if old, ok := previous[p.pod.UID]; ok && old.Node == ds[i].Node && slices.Equal(old.GPUs, ds[i].GPUs) {
			since = old.since
		}
		ps[p.pod.UID] = plan{Decision: ds[i], seen: seen, since: since}
	}
}

// anyOf tells whether a pod of w has a plan.
func (ps plans) anyOf(w *workload) bool {
	for _, p := range w.pods {
		if _, ok := ps[p.pod.UID]; ok {
			return true
		}
	}
	return false
}

// allOf tells whether every pod of w has a plan.
func (ps plans) allOf(w *workload) bool {
	for _, p := range w.pods {
		if _, ok := ps[p.pod.UID]; !ok {
			return false
		}
	}
	return len(w.pods) > 0
}

// firstOf tells whether w's first pod has a plan: w was placed in an earlier
// cycle and waits for reservations.
func (ps plans) firstOf(w *workload) bool {
	if len(w.pods) == 0 {
		return false
	}
	_, ok := ps[w.pods[0].pod.UID]
	return ok
}

// reservationStuckFactor times ReservationReportDelay is how long a pod
// waits for a reservation the coordinator is still creating before it is
// told ReservationPending all the same (markWaiting).
const reservationStuckFactor = 12

// markWaiting gives the pods of w, which wait for reservations, the reason
// ReservationPending once the wait is the kubelet's: a reservation w waits
// for exists and has not been admitted ReservationReportDelay after its
// creation, and the pod has waited that long too. While the coordinator is
// still creating the reservations (in a burst their creates queue behind
// bindings on the client's rate limit) the pods are being served, as
// WaitingToBind pods are, and nothing is written: at 50,000 pods these
// writes were 30,057 of the 108,282 requests, on the budget the
// reservations and bindings they waited for needed (docs/benchmarks-history.md,
// "Scale"). A pod still waiting after reservationStuckFactor times the
// delay is told all the same (a create that keeps failing). Every pod
// counts in the cycle's result either way.
func (s *Scheduler) markWaiting(ctx context.Context, w *workload, msg string, ps plans, snap *state.Snapshot, now time.Time, res *Result) {
	delay := s.opts.ReservationReportDelay
	late := s.reservationsLate(w, ps, snap, now)
	for _, p := range w.pods {
		waited := now.Sub(ps[p.pod.UID].since)
		if waited < delay || (!late && waited < reservationStuckFactor*delay) {
			res.pending(w.queue, api.ReasonReservationPending, p.pod)
			continue
		}
		s.markPending(ctx, p.pod, w.queue, api.ReasonReservationPending, msg, res)
	}
}

// reservationsLate tells whether a reservation a fraction of w waits for
// exists and is not admitted ReservationReportDelay after its creation.
func (s *Scheduler) reservationsLate(w *workload, ps plans, snap *state.Snapshot, now time.Time) bool {
	for _, p := range w.pods {
		d := ps[p.pod.UID].Decision
		if p.Request.ShareMilli == 0 || len(d.GPUs) != 1 {
			continue
		}
		r := snap.Reservations[state.NodeGPU{Node: d.Node, GPU: d.GPUs[0]}]
		if r != nil && !r.Ready && r.Pod != nil && now.Sub(r.Pod.CreationTimestamp.Time) >= s.opts.ReservationReportDelay {
			return true
		}
	}
	return false
}

// reservationEcho is how long a reservation pod created is not asked for
// again while the informer does not show it yet: the cycles that run
// meanwhile see its GPU without a pod and would send a create that only
// meets AlreadyExists (a request per reservation, thousands in a burst).
// It was 5 s. The echo ends as soon as the informer shows the pod, so a
// longer one costs nothing while the informer keeps up, and the API server
// accepted the create, so the pod exists unless something deleted it; a
// loaded control plane at 50,000 pods lagged by more (a re-list took a
// minute, docs/benchmarks-history.md, "Scale").
const reservationEcho = 30 * time.Second

// reserveKey prefixes the writer's key of a reservation's creation.
const reserveKey = "reserve/"

// queueStatusKey prefixes the writer's key of a Queue's status.
const queueStatusKey = "queue/"

// creatingReservations lists the reservations being created or created that
// the informer may not show yet (the writer's, and those of reserveCreated),
// for state.Inputs.Creating: the kubelet gives each a GPU of its node, so
// it is counted there even when the fractions it was created for are placed
// elsewhere meanwhile.
func (s *Scheduler) creatingReservations() map[state.NodeGPU]bool {
	inFlight := s.writes.busyUnder(reserveKey)
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.reserveCreated) == 0 && len(inFlight) == 0 {
		return nil
	}
	out := make(map[state.NodeGPU]bool, len(s.reserveCreated)+len(inFlight))
	for key := range s.reserveCreated {
		out[key] = true
	}
	for _, k := range inFlight {
		if node, gpu, ok := strings.Cut(k, "/"); ok {
			out[state.NodeGPU{Node: node, GPU: gpu}] = true
		}
	}
	return out
}

// ensureReservations creates the reservation pods this cycle asked for
// (reserve records them in snap.Reservations without a pod), through the
// writer: one request each, and a burst of fractions may want thousands. A
// reservation whose creation is still queued or running, or was created
// less than reservationEcho ago, is not asked for again.
func (s *Scheduler) ensureReservations(ctx context.Context, snap *state.Snapshot) {
	if s.deps.Reserver == nil {
		return
	}
	now := s.clock.Now()
	s.mu.Lock()
	for key, at := range s.reserveCreated {
		// Kept until shown even when no pod waits for it any more: it is
		// counted on its node meanwhile (creatingReservations).
		if r := snap.Reservations[key]; snap.CreatingShown[key] || r != nil && r.Pod != nil || now.Sub(at) >= reservationEcho {
			delete(s.reserveCreated, key)
		}
	}
	created := maps.Clone(s.reserveCreated)
	s.mu.Unlock()
	var taken map[string]bool // computed once: a name per GPU asked for, among thousands
	for key, r := range snap.Reservations {
		if r.Pod != nil || r.TakenBy != nil {
			// Held, or lost and its GPU given whole to another pod: the
			// kubelet would give a new one another GPU (evictStranded).
			continue
		}
		if _, ok := created[key]; ok {
			continue
		}
		wkey := reserveKey + key.Node + "/" + key.GPU
		if s.writes.busy(wkey) {
			continue
		}
		if taken == nil {
			taken = reservationNames(snap)
		}
		attempt := reservationAttempt(taken, key.Node, key.GPU)
		s.writes.do(ctx, wkey, func(ctx context.Context) {
			s.fault(ctx, FaultReserve)
			if err := s.deps.Reserver.Ensure(ctx, key.Node, key.GPU, attempt); err != nil {
				klog.FromContext(ctx).Error(err, "Creating reservation", "node", key.Node, "gpu", key.GPU)
				return
			}
			s.mu.Lock()
			s.reserveCreated[key] = s.clock.Now()
			s.mu.Unlock()
			s.fault(ctx, FaultReservationCreated)
		})
	}
}
