package scheduler

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpufrac/gpufrac/coordinator/placeholder"
	"github.com/gpufrac/gpufrac/coordinator/placement"
	"github.com/gpufrac/gpufrac/coordinator/predicates"
	"github.com/gpufrac/gpufrac/coordinator/state"
)

// feedDemand tells the snapshot what GPU demand the cluster serves
// (placement.Snapshot.AddDemand): every pod bound or being bound, and every
// pending pod this cycle may place. The placement policy weighs the demand
// that only some GPU models can host against those models' free capacity,
// so that flexible pods leave it to them. Pods this scheduler cannot parse
// (another scheduler's, no queue) count with their plain requests, without
// model constraints; placeholders and reservation pods stand for demand
// counted elsewhere and are skipped.
//
// A pending pod's model list (gpufrac.io/gpu-models) is tenant input. It only
// ever makes other pods prefer other models, never keeps them from a node
// they fit; still, pending pods count only when their queue's quota admits
// them now (incomplete gangs and pods their queue may not run do not), so a
// tenant cannot steer the cluster with a backlog it may not run. They are
// admitted together, in the order the cycle serves them (ws is sorted): a
// backlog of pods each within the queue's limit alone counts only as far
// as the queue may run them all.
func (s *Scheduler) feedDemand(snap *state.Snapshot, bound []placement.Request, ws []*workload, b *books) {
	tree := b.tree.Clone()
	for _, w := range ws {
		if w.incomplete != "" || !tree.Check(w.queue, w.resources(), w.nonPreemptible).Allowed {
			continue
		}
		for k := range w.pods {
			_ = tree.Assume(w.pods[k].queue, w.pods[k].res, w.pods[k].nonPreemptible)
			snap.AddDemand(&w.pods[k].req)
		}
	}
	for i := range bound {
		snap.AddDemand(&bound[i])
	}
}

// readBound charges the pods bound or being bound to their queues
// (books.charge), counts the gang members among them (gangsPlaced) and
// returns their requests for feedDemand, in one pass over the pods: at
// 50,000 pods each pass costs about as much as the snapshot's reads of
// them, and this one runs while the snapshot is built. Pods this scheduler
// cannot parse count with their plain requests; placeholders and
// reservation pods are left out of the requests.
func (s *Scheduler) readBound(v *draCycle, pods []*corev1.Pod, assumed map[types.UID]state.Assumed, b *books) ([]placement.Request, *gangsPlaced) {
	out := s.boundDemand[:0]
	gangs := newGangsPlaced()
	for _, p := range pods {
		var a state.Assumed
		being := false
		nodeName := p.Spec.NodeName
		if nodeName == "" {
			// Bound pods are most: their assumption (gone or going) changes nothing here.
			if a, being = assumed[p.UID]; !being {
				continue
			}
		}
		// What is read of each pod object is kept with its parses: at
		// 50,000 pods, reading them again each cycle was most of this walk.
		e := s.parseEntryKept(p)
		h := s.headOf(e, p)
		if h.terminal && !h.ours {
			continue // no entry made: other schedulers' finished pods pile up
		}
		if e == nil {
			if e = s.parseEntryOf(p); e != nil {
				e.head = h
			}
		}
		// Bound: parsed as its binding recorded; being bound: as it is.
		var pi *podInfo
		var ok bool
		if nodeName != "" {
			pi, ok = s.admittedRef(v, e, p)
		} else {
			pi, ok = s.ownRef(v, e, p)
		}
		if ok && h.ours {
			node := nodeName
			if node == "" {
				node = a.Node
			}
			if node != "" {
				gangs.count(s, p, pi, node, being, h.terminal)
			}
		}
		if h.terminal {
			continue
		}
		if ok {
			b.charge(p, pi)
		}
		if h.skip {
			continue
		}
		if nodeName == "" && ok {
			out = append(out, pi.req)
			continue
		}
		if own, ok := s.ownRef(v, e, p); ok {
			out = append(out, own.req)
			continue
		}
		d := state.DemandOf(p, s.opts.TimesliceResource)
		r := placement.Request{CPUMilli: d.CPUMilli, MemoryBytes: d.MemoryBytes, GPUs: d.WholeGPUs}
		if d.WholeGPUs == 0 && d.FractionPercent > 0 {
			r.ShareMilli = min(d.FractionPercent*placement.MilliPerGPU/100, placement.MilliPerGPU)
		}
		out = append(out, r)
	}
	s.boundDemand = out // the next cycle reuses the array
	return out, gangs
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
