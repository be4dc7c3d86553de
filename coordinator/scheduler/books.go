package scheduler

import (
	"errors"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/coordinator/queue"
	"github.com/gpufrac/gpufrac/coordinator/state"
)

// QueueSource lists the Queue objects: those it could read, and those it
// could not (invalid), each with why.
type QueueSource interface {
	Queues() (valid []*v1alpha1.Queue, invalid []InvalidQueue, err error)
}

// InvalidQueue is a Queue object that did not convert.
type InvalidQueue struct {
	// Name is the object's name.
	Name string
	// Object is the object as read, for events and status; may be nil.
	Object runtime.Object
	// Conditions are the object's status conditions as read.
	Conditions []metav1.Condition
	// Err says why it did not convert.
	Err error
}

// QueuesFromLister reads Queue objects from the dynamic informer's lister
// for queues.gpufrac.io. Objects that do not convert are returned as
// invalid: the cycle reports them on the Queue (condition Valid=False and
// an event) and their pods get InvalidRequest saying why.
func QueuesFromLister(l cache.GenericLister) QueueSource { return listerSource{l} }

type listerSource struct{ l cache.GenericLister }

func (s listerSource) Queues() ([]*v1alpha1.Queue, []InvalidQueue, error) {
	objs, err := s.l.List(labels.Everything())
	if err != nil {
		return nil, nil, err
	}
	out := make([]*v1alpha1.Queue, 0, len(objs))
	var invalid []InvalidQueue
	for _, o := range objs {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		q, err := v1alpha1.FromUnstructured(u)
		if err != nil {
			invalid = append(invalid, InvalidQueue{Name: u.GetName(), Object: u, Conditions: conditionsOf(u), Err: err})
			continue
		}
		out = append(out, q)
	}
	return out, invalid, nil
}

// conditionsOf reads status.conditions of an object that may not convert
// as a whole; conditions that do not convert are dropped.
func conditionsOf(u *unstructured.Unstructured) []metav1.Condition {
	raw, ok, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	if !ok {
		return nil
	}
	var out []metav1.Condition
	for _, r := range raw {
		m, ok := r.(map[string]any)
		if !ok {
			continue
		}
		var c metav1.Condition
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, &c); err == nil {
			out = append(out, c)
		}
	}
	return out
}

// books is the queues' accounting for one cycle: the tree, charged with the
// pods the coordinator admitted (bound, or being bound), and the fair
// shares from this cycle's demand.
type books struct {
	tree     *queue.Tree
	capacity queue.Resources
	treeErr  error
	// specs: queue name -> its spec (namespaces allowed), of every Queue object.
	specs map[string]*v1alpha1.QueueSpec
}

// newBooks builds the queue tree. Queues that do not convert (invalid),
// whose amounts are wrong, or that the tree refuses (unknown or invalid
// parent, cycles) are left out; their pods get InvalidRequest with the
// reason and the cycle reports it on the Queue (problems).
func newBooks(qs []*v1alpha1.Queue, invalid []InvalidQueue) (*books, error) {
	specs := make([]queue.Spec, 0, len(qs)+len(invalid))
	byName := make(map[string]*v1alpha1.QueueSpec, len(qs))
	for _, q := range qs {
		byName[q.Name] = &q.Spec
		sp, err := queue.SpecFromAPI(q)
		if err != nil {
			sp = queue.Spec{Name: q.Name, Parent: q.Spec.Parent, Invalid: err.Error()}
		}
		specs = append(specs, sp)
	}
	for _, iq := range invalid {
		specs = append(specs, queue.Spec{Name: iq.Name, Invalid: iq.Err.Error()})
	}
	t, err := queue.NewTree(specs)
	b := &books{tree: t, treeErr: err, specs: byName}
	if t == nil {
		return nil, fmt.Errorf("building queue tree: %w", err)
	}
	return b, nil
}

// setCapacity sets the cluster's capacity the fair shares divide (demand).
func (b *books) setCapacity(snap *state.Snapshot) {
	b.capacity = queue.Resources{GPUMilli: snap.GPUCapacityMilli, CPUMilli: snap.CPUCapacityMilli, MemoryBytes: snap.MemoryCapacityBytes}
}

// problems lists the queues left out of the tree and why (name -> why).
func (b *books) problems() map[string]string {
	var te *queue.TreeError
	if errors.As(b.treeErr, &te) {
		return te.Problems
	}
	return nil
}

// validQueue tells whether pods of namespace ns may be charged to the queue:
// a valid leaf whose spec.namespaces lets ns in. The admission policies
// refuse the pods of other namespaces at creation; this check is what is
// left where they are not installed, or when a queue's list changed since.
func (b *books) validQueue(name, ns string) error {
	if err := b.tree.ValidateLeaf(name); err != nil {
		var te *queue.TreeError
		if errors.As(b.treeErr, &te) {
			if why, ok := te.Problems[name]; ok {
				return fmt.Errorf("queue %s is invalid: %s", name, why)
			}
		}
		return err
	}
	if !b.allows(name, ns) {
		return fmt.Errorf("%s", QueueNamespaceMessage(name, ns))
	}
	return nil
}

// QueueNamespaceMessage says that a queue does not take pods from a
// namespace and what to change; the admission policy says the same.
func QueueNamespaceMessage(queue, ns string) string {
	return fmt.Sprintf("queue %s does not take pods from namespace %s: set label %s to a queue whose spec.namespaces lists %s, or ask the cluster admin to add %s to spec.namespaces of Queue %s",
		queue, ns, api.LabelQueue, ns, ns, queue)
}

// allows tells whether the queue lets pods of namespace ns in.
func (b *books) allows(name, ns string) bool {
	spec, ok := b.specs[name]
	return ok && spec.AllowsNamespace(ns)
}

// chargeSum charges res, the sum of pods bound or being bound of one queue
// and namespace (boundLedger): a bound pod by the queue its binding recorded
// (parseAdmitted; other bound pods are not the coordinator's work, whatever
// their labels say, and are not parsed), a pod being bound by its parsed
// queue. Non-preemptibility counts only for a namespace the queue allows (a
// queue may have dropped a namespace since).
func (b *books) chargeSum(k chargeKey, res queue.Resources) {
	np := k.nonPreemptible && b.allows(k.queue, k.namespace)
	_ = b.tree.Assume(k.queue, res, np) // unknown queues are not charged
}

// demand computes fair shares from each queue's demand: its usage plus its
// pending workloads (queue.Tree.FairShare takes the whole demand, not what
// is added to the usage).
func (b *books) demand(ws []*workload) {
	demand := map[string]queue.Resources{}
	for _, w := range ws {
		if w.incomplete == "" {
			demand[w.queue] = demand[w.queue].Add(w.resources())
		}
	}
	for q, d := range demand {
		if used, _, ok := b.tree.Usage(q); ok {
			demand[q] = d.Add(used)
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

// assume charges w's pods as check admitted them: a gang with a
// non-preemptible member is admitted, charged and recorded on its bindings
// (gpufrac.io/admitted-preemptible) as non-preemptible whole.
func (b *books) assume(w *workload) {
	for _, p := range w.pods {
		_ = b.tree.Assume(p.Queue, p.res, w.nonPreemptible)
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
