package scheduler

import (
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/coordinator/queue"
	"github.com/gpufrac/gpufrac/coordinator/state"
)

// QueueSource lists the Queue objects.
type QueueSource interface {
	Queues() ([]*v1alpha1.Queue, error)
}

// QueuesFromLister reads Queue objects from the dynamic informer's lister
// for queues.gpufrac.io. Objects that do not convert are skipped; their pods
// learn why through InvalidRequest.
func QueuesFromLister(l cache.GenericLister) QueueSource { return listerSource{l} }

type listerSource struct{ l cache.GenericLister }

func (s listerSource) Queues() ([]*v1alpha1.Queue, error) {
	objs, err := s.l.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	out := make([]*v1alpha1.Queue, 0, len(objs))
	for _, o := range objs {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		q, err := v1alpha1.FromUnstructured(u)
		if err != nil {
			continue
		}
		out = append(out, q)
	}
	return out, nil
}

// books is the queues' accounting for one cycle: the tree, charged with the
// bound and assumed pods, and the fair shares from this cycle's demand.
type books struct {
	tree     *queue.Tree
	capacity queue.Resources
	treeErr  error
}

// newBooks builds the queue tree. Queues the tree refuses (unknown parent,
// cycles) are left out and their pods get InvalidRequest with the reason.
func newBooks(qs []*v1alpha1.Queue, snap *state.Snapshot) (*books, error) {
	specs := make([]queue.Spec, 0, len(qs))
	for _, q := range qs {
		sp, err := queue.SpecFromAPI(q)
		if err != nil {
			continue // an invalid Queue object: its pods are told through validQueue
		}
		specs = append(specs, sp)
	}
	t, err := queue.NewTree(specs)
	b := &books{tree: t, treeErr: err}
	if t == nil {
		return nil, fmt.Errorf("building queue tree: %w", err)
	}
	b.capacity = queue.Resources{GPUMilli: snap.GPUCapacityMilli, CPUMilli: snap.CPUCapacityMilli, MemoryBytes: snap.MemoryCapacityBytes}
	return b, nil
}

// validQueue tells whether pods may be charged to the queue.
func (b *books) validQueue(name string) error {
	if err := b.tree.ValidateLeaf(name); err != nil {
		var te *queue.TreeError
		if errors.As(b.treeErr, &te) {
			if why, ok := te.Problems[name]; ok {
				return fmt.Errorf("queue %s is invalid: %s", name, why)
			}
		}
		return err
	}
	return nil
}

// chargeBound charges every bound or assumed pod with a queue label to its queue.
func (b *books) chargeBound(pods []*corev1.Pod, assumed map[types.UID]state.Assumed, parse func(*corev1.Pod) (podInfo, error)) {
	for _, p := range pods {
		if p.Labels[api.LabelQueue] == "" || state.Terminal(p) {
			continue
		}
		if _, ok := assumed[p.UID]; p.Spec.NodeName == "" && !ok {
			continue
		}
		pi, err := parse(p)
		if err != nil {
			continue
		}
		_ = b.tree.Assume(pi.queue, pi.res, pi.nonPreemptible) // unknown queues are not charged
	}
}

// demand computes fair shares from the pending workloads' demand on top of usage.
func (b *books) demand(ws []*workload) {
	demand := map[string]queue.Resources{}
	for _, w := range ws {
		if w.incomplete == "" {
			demand[w.queue] = demand[w.queue].Add(w.resources())
		}
	}
	b.tree.FairShare(b.capacity, demand)
}

type verdict struct {
	allowed   bool
	overQuota bool
	reason    string
	message   string
}

func (b *books) check(w *workload) verdict {
	v := b.tree.Check(w.queue, w.resources(), w.nonPreemptible)
	return verdict{allowed: v.Allowed, overQuota: v.OverQuota, reason: string(v.Reason), message: v.Message}
}

func (b *books) assume(w *workload) {
	for _, p := range w.pods {
		_ = b.tree.Assume(p.queue, p.res, p.nonPreemptible)
	}
}

// queueRank orders queues: lower rank is served first.
func (b *books) queueRank() map[string]int {
	rank := map[string]int{}
	for i, q := range b.tree.Order(b.tree.Leaves()) {
		rank[q] = i
	}
	return rank
}
