package scheduler

import "github.com/gpufrac/gpufrac/coordinator/state"

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
func (s *Scheduler) feedDemand(snap *state.Snapshot, bound []boundDemand, ws []*workload, b *books) {
	tree := b.tree.Clone()
	for _, w := range ws {
		if w.incomplete != "" || !tree.Check(w.queue, w.resources(), w.nonPreemptible).Allowed {
			continue
		}
		for k := range w.pods {
			_ = tree.Assume(w.pods[k].Queue, w.pods[k].res, w.pods[k].NonPreemptible)
			snap.AddDemand(&w.pods[k].Request)
		}
	}
	for i := range bound {
		snap.AddDemandN(&bound[i].req, bound[i].n)
	}
}
