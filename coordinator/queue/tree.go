// Package queue is the quota arithmetic of gpufrac-coordinator: a tree of
// queues with deserved quotas, limits and over-quota weights, the usage
// charged to each, and the decisions built on them: admission (Check), fair
// share (FairShare), the order queues are served in (Order) and which running
// workloads to reclaim for a starved queue (ReclaimVictims).
//
// It is pure: no API client, no clock, no goroutines. The caller builds a
// Tree from the Queue objects (SpecFromAPI, NewTree), replays the usage of
// bound and assumed pods (Assume), and in each scheduling cycle computes the
// fair share from the cluster capacity and the demand, then asks Check per
// workload. A Tree is not safe for concurrent use; Clone gives a cycle its own
// copy.
//
// Units are those of Resources: milli-GPU, milli-CPU and bytes. Usage is
// charged to the leaf queue and to every ancestor, so a parent's usage is the
// sum of its children's.
package queue

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpufrac/gpufrac/api/v1alpha1"
)

// Spec is one queue as the arithmetic sees it.
type Spec struct {
	// Name is the queue's name (the Queue object's name, the pods' gpufrac.io/queue label).
	Name string
	// Parent names the parent queue; empty for a top-level queue.
	Parent string
	// Priority breaks ties in Order among siblings: higher first.
	Priority int32
	// Quota is the deserved amount per resource; Unlimited for a resource the
	// queue does not manage.
	Quota Resources
	// Limit caps usage per resource; Unlimited when not set. Note that the
	// zero value is a limit of zero: start from UnlimitedResources.
	Limit Resources
	// Weights are the over-quota weights per resource.
	Weights Weights
	// Invalid, when set, says why the caller could not read the queue (its
	// object does not convert, its amounts do not parse). NewTree leaves the
	// queue out and reports Invalid as its problem, so its pods and its
	// children learn why instead of hearing that it does not exist.
	Invalid string
}

// maxCount bounds GPU and CPU amounts (in units, not milli) so that their
// milli values fit an int64 with room for sums; maxMemory does the same for bytes.
const (
	maxCount  = 1_000_000_000_000 // 10^12 GPUs or cores
	maxMemory = 1 << 60           // 1 EiB
)

// SpecFromAPI converts a Queue object. A resource block that is absent leaves
// the resource unmanaged (quota and limit Unlimited); inside a block an absent
// quota is zero, an absent limit Unlimited and an absent weight
// v1alpha1.DefaultOverQuotaWeight.
func SpecFromAPI(q *v1alpha1.Queue) (Spec, error) {
	s := Spec{
		Name:     q.Name,
		Parent:   q.Spec.Parent,
		Priority: q.Spec.Priority,
		Quota:    UnlimitedResources(),
		Limit:    UnlimitedResources(),
		Weights:  DefaultWeights(),
	}
	blocks := [numDims]*v1alpha1.ResourceQuota{
		dimGPU: q.Spec.Resources.GPU, dimCPU: q.Spec.Resources.CPU, dimMemory: q.Spec.Resources.Memory,
	}
	var errs []error
	for d := range numDims {
		b := blocks[d]
		if b == nil {
			continue
		}
		quota, err := amount(d, b.Quota, 0)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s quota: %w", d.name(), err))
		}
		limit, err := amount(d, b.Limit, Unlimited)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s limit: %w", d.name(), err))
		}
		s.Quota.set(d, quota)
		s.Limit.set(d, limit)
		w := int64(v1alpha1.DefaultOverQuotaWeight)
		if b.OverQuotaWeight != nil {
			w = int64(*b.OverQuotaWeight)
		}
		switch d {
		case dimGPU:
			s.Weights.GPU = w
		case dimCPU:
			s.Weights.CPU = w
		default:
			s.Weights.Memory = w
		}
	}
	switch q.Spec.Admission {
	case "":
	case v1alpha1.AdmissionKueue:
		// Kueue keeps the quota: a second one here would hold back what
		// Kueue admitted (the CRD refuses it too).
		r := q.Spec.Resources
		if r.GPU != nil || r.CPU != nil || r.Memory != nil || q.Spec.Parent != "" {
			errs = append(errs, fmt.Errorf("admission %s: the queue has resources or a parent, and Kueue keeps its quota", q.Spec.Admission))
		}
	default:
		errs = append(errs, fmt.Errorf("admission %q: want %q or none", q.Spec.Admission, v1alpha1.AdmissionKueue))
	}
	if err := errors.Join(errs...); err != nil {
		return s, fmt.Errorf("converting queue %q: %w", q.Name, err)
	}
	return s, nil
}

// amount converts a quantity of resource d to the package's unit, def when absent.
func amount(d dim, q *resource.Quantity, def int64) (int64, error) {
	if q == nil {
		return def, nil
	}
	if q.Sign() < 0 {
		return 0, fmt.Errorf("%s is negative", q)
	}
	if d == dimMemory {
		if q.Cmp(*resource.NewQuantity(maxMemory, resource.BinarySI)) > 0 {
			return 0, fmt.Errorf("%s is too large", q)
		}
		return q.Value(), nil // fractional bytes round up
	}
	if q.Cmp(*resource.NewQuantity(maxCount, resource.DecimalSI)) > 0 {
		return 0, fmt.Errorf("%s is too large", q)
	}
	return q.MilliValue(), nil
}

// node is one queue of a Tree with its usage.
type node struct {
	spec     Spec
	parent   *node
	children []*node // sorted by name
	// used is charged by Assume to this queue and its ancestors;
	// usedNonPreemptible is the non-preemptible part of it.
	used               Resources
	usedNonPreemptible Resources
}

func (n *node) isLeaf() bool { return len(n.children) == 0 }

// path returns n and its ancestors, n first.
func (n *node) path() []*node {
	var out []*node
	for ; n != nil; n = n.parent {
		out = append(out, n)
	}
	return out
}

// Tree is the queue hierarchy with the usage charged to each queue and the
// last fair share computed.
type Tree struct {
	queues map[string]*node // name -> queue
	roots  []*node          // top-level queues, sorted by name
	// fair is the last FairShare result, name -> share; nil before the first call.
	fair    map[string]Resources
	oversub []Oversubscription
}

// ErrInvalidQueue is matched (errors.Is) by the problems NewTree reports.
var ErrInvalidQueue = errors.New("invalid queue")

// ErrUnknownQueue is returned for a queue name the tree does not hold (it
// does not exist or NewTree left it out).
var ErrUnknownQueue = errors.New("unknown queue")

// ErrNotLeaf is returned when work is charged to a queue that has child queues.
var ErrNotLeaf = errors.New("queue has child queues")

// TreeError lists the queues NewTree left out of the tree and why.
type TreeError struct {
	// Problems maps a left-out queue's name to why it was left out.
	Problems map[string]string
}

// Error lists every problem, sorted by queue name.
func (e *TreeError) Error() string {
	names := make([]string, 0, len(e.Problems))
	for n := range e.Problems {
		names = append(names, n)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("queue %s: %s", n, e.Problems[n])
	}
	return "invalid queues: " + strings.Join(parts, "; ")
}

// Is makes errors.Is(err, ErrInvalidQueue) true.
func (e *TreeError) Is(target error) bool { return target == ErrInvalidQueue }

// Oversubscription reports a parent whose children's quotas add up to more
// than its own quota for one resource. It is allowed: the children's deserved
// shares are then scaled down when the parent's quota runs out.
type Oversubscription struct {
	// Parent is the parent queue; Resource is "gpu", "cpu" or "memory".
	Parent, Resource string
	// ChildrenQuota is the sum of the children's quotas and ParentQuota the
	// parent's, in the package's units.
	ChildrenQuota, ParentQuota int64
}

// String says it for people.
func (o Oversubscription) String() string {
	d := dimFromName(o.Resource)
	return fmt.Sprintf("queue %s: children deserve %s %s in total, more than its quota of %s",
		o.Parent, d.format(o.ChildrenQuota), d.label(), d.format(o.ParentQuota))
}

func dimFromName(name string) dim {
	for d := range numDims {
		if d.name() == name {
			return d
		}
	}
	return dimMemory
}

// NewTree builds the hierarchy. It always returns a usable tree; invalid
// queues are left out of it and reported in a *TreeError: empty or duplicate
// names, negative amounts or weights, a quota above the limit, an unknown
// parent, a cycle of parents, and the descendants of any of these.
// Children's quotas adding up to more than the parent's are allowed and
// reported by Oversubscribed.
func NewTree(specs []Spec) (*Tree, error) {
	t := &Tree{queues: map[string]*node{}}
	problems := map[string]string{}
	unreadable := map[string]bool{} // queue -> the caller could not read it (Spec.Invalid)
	byName := map[string]Spec{}
	for _, s := range specs {
		switch {
		case s.Name == "":
			problems["(unnamed)"] = "a queue has no name"
			continue
		case problems[s.Name] != "":
			continue
		}
		if s.Invalid != "" {
			problems[s.Name] = s.Invalid
			unreadable[s.Name] = true
			continue
		}
		if _, dup := byName[s.Name]; dup {
			problems[s.Name] = "defined more than once"
			delete(byName, s.Name)
			continue
		}
		if p := specProblem(s); p != "" {
			problems[s.Name] = p
			continue
		}
		byName[s.Name] = s
	}
	// Resolve each queue's ancestry; a queue is valid only if every ancestor is.
	const (
		visiting = iota + 1
		valid
		invalid
	)
	state := map[string]int{} // name -> visiting / valid / invalid
	var visit func(name string) int
	visit = func(name string) int {
		if st := state[name]; st != 0 {
			return st // visiting here means a cycle: the caller marks it invalid
		}
		s, ok := byName[name]
		if !ok {
			return invalid
		}
		if s.Parent == "" {
			state[name] = valid
			return valid
		}
		state[name] = visiting
		if visit(s.Parent) == valid {
			state[name] = valid
			return valid
		}
		state[name] = invalid
		if problems[name] == "" {
			_, parentKnown := byName[s.Parent]
			switch cycle := cycleThrough(name, byName); {
			case cycle != nil:
				problems[name] = "its parents form a cycle: " + strings.Join(cycle, " -> ")
			case !parentKnown && problems[s.Parent] == "":
				problems[name] = fmt.Sprintf("parent %q does not exist", s.Parent)
			case unreadable[s.Parent]:
				problems[name] = fmt.Sprintf("parent %q is invalid: %s", s.Parent, problems[s.Parent])
			default:
				problems[name] = fmt.Sprintf("parent %q is invalid", s.Parent)
			}
		}
		return invalid
	}
	names := make([]string, 0, len(byName))
	for name := range byName {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		visit(name)
	}
	for _, name := range names {
		if state[name] == valid {
			t.queues[name] = &node{spec: byName[name]}
		}
	}
	for _, name := range names { // sorted, so children end up sorted too
		n, ok := t.queues[name]
		if !ok {
			continue
		}
		if n.spec.Parent == "" {
			t.roots = append(t.roots, n)
			continue
		}
		p := t.queues[n.spec.Parent]
		n.parent = p
		p.children = append(p.children, n)
	}
	for _, name := range names {
		if n, ok := t.queues[name]; ok {
			t.oversub = append(t.oversub, n.oversubscription()...)
		}
	}
	if len(problems) > 0 {
		return t, &TreeError{Problems: problems}
	}
	return t, nil
}

// specProblem checks one spec's numbers.
func specProblem(s Spec) string {
	var out []string
	for d := range numDims {
		q, l, w := s.Quota.get(d), s.Limit.get(d), s.Weights.get(d)
		switch {
		case q < 0:
			out = append(out, fmt.Sprintf("%s quota is negative", d.name()))
		case l < 0:
			out = append(out, fmt.Sprintf("%s limit is negative", d.name()))
		case q > l:
			out = append(out, fmt.Sprintf("%s quota %s is above its limit %s", d.name(), d.format(q), d.format(l)))
		}
		if w < 0 {
			out = append(out, fmt.Sprintf("%s overQuotaWeight is negative", d.name()))
		}
	}
	if s.Parent == s.Name {
		out = append(out, "it is its own parent")
	}
	return strings.Join(out, ", ")
}

// cycleThrough returns the cycle of parents through name ("a -> b -> a"),
// or nil when following name's parents never leads back to it.
func cycleThrough(name string, byName map[string]Spec) []string {
	chain := []string{name}
	for cur := byName[name].Parent; len(chain) <= len(byName); cur = byName[cur].Parent {
		if _, ok := byName[cur]; !ok {
			return nil
		}
		chain = append(chain, cur)
		if cur == name {
			return chain
		}
	}
	return nil
}

func (n *node) oversubscription() []Oversubscription {
	if n.isLeaf() {
		return nil
	}
	var out []Oversubscription
	for d := range numDims {
		parent := n.spec.Quota.get(d)
		if parent == Unlimited {
			continue
		}
		var sum int64
		for _, c := range n.children {
			sum = satAdd(sum, c.spec.Quota.get(d))
		}
		if sum > parent {
			out = append(out, Oversubscription{Parent: n.spec.Name, Resource: d.name(), ChildrenQuota: sum, ParentQuota: parent})
		}
	}
	return out
}

// Oversubscribed lists the parents whose children's quotas exceed their own,
// by parent name and resource.
func (t *Tree) Oversubscribed() []Oversubscription {
	return append([]Oversubscription(nil), t.oversub...)
}

// Names lists every queue of the tree, sorted.
func (t *Tree) Names() []string {
	out := make([]string, 0, len(t.queues))
	for name := range t.queues {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// Leaves lists the queues that take pods (those without children), sorted.
func (t *Tree) Leaves() []string {
	var out []string
	for _, name := range t.Names() {
		if t.queues[name].isLeaf() {
			out = append(out, name)
		}
	}
	return out
}

// Spec returns a queue's spec.
func (t *Tree) Spec(queue string) (Spec, bool) {
	n, ok := t.queues[queue]
	if !ok {
		return Spec{}, false
	}
	return n.spec, true
}

// Usage returns what is charged to a queue (its children included) and the
// non-preemptible part of it.
func (t *Tree) Usage(queue string) (used, nonPreemptible Resources, ok bool) {
	n, ok := t.queues[queue]
	if !ok {
		return Resources{}, Resources{}, false
	}
	return n.used, n.usedNonPreemptible, true
}

// leaf returns the queue if it can take work, or an error saying why not.
func (t *Tree) leaf(queue string) (*node, error) {
	n, ok := t.queues[queue]
	if !ok {
		return nil, fmt.Errorf("queue %q: %w: create a Queue of that name or use an existing leaf queue", queue, ErrUnknownQueue)
	}
	if !n.isLeaf() {
		kids := make([]string, len(n.children))
		for i, c := range n.children {
			kids[i] = c.spec.Name
		}
		return nil, fmt.Errorf("queue %q: %w (%s); pods must use a leaf queue", queue, ErrNotLeaf, strings.Join(kids, ", "))
	}
	return n, nil
}

// ValidateLeaf returns nil when pods may be charged to queue, else an error
// matching ErrUnknownQueue or ErrNotLeaf that a user can act on.
func (t *Tree) ValidateLeaf(queue string) error {
	_, err := t.leaf(queue)
	return err
}

// Assume charges req to a leaf queue and all its ancestors, and to their
// non-preemptible usage too when nonPreemptible. It fails, changing nothing,
// for an unknown or non-leaf queue.
func (t *Tree) Assume(queue string, req Resources, nonPreemptible bool) error {
	n, err := t.leaf(queue)
	if err != nil {
		return fmt.Errorf("assuming %s: %w", req, err)
	}
	for _, a := range n.path() {
		a.used = a.used.Add(req)
		if nonPreemptible {
			a.usedNonPreemptible = a.usedNonPreemptible.Add(req)
		}
	}
	return nil
}

// Forget undoes an Assume with the same arguments. It fails, changing
// nothing, for an unknown or non-leaf queue and when the queue does not hold
// that much usage (a Forget without its Assume).
func (t *Tree) Forget(queue string, req Resources, nonPreemptible bool) error {
	n, err := t.leaf(queue)
	if err != nil {
		return fmt.Errorf("forgetting %s: %w", req, err)
	}
	// Ancestors hold at least their leaves' usage, so checking the leaf is enough.
	if !req.LessOrEqual(n.used) || (nonPreemptible && !req.LessOrEqual(n.usedNonPreemptible)) {
		return fmt.Errorf("forgetting %s in queue %q: more than the %s charged to it", req, queue, n.used)
	}
	for _, a := range n.path() {
		a.used = a.used.Sub(req)
		if nonPreemptible {
			a.usedNonPreemptible = a.usedNonPreemptible.Sub(req)
		}
	}
	return nil
}

// Clone returns an independent copy of the tree with its usage and fair
// share, for a scheduling cycle to change freely.
func (t *Tree) Clone() *Tree {
	out := &Tree{queues: make(map[string]*node, len(t.queues)), oversub: t.oversub}
	for name, n := range t.queues {
		cp := *n
		cp.parent, cp.children = nil, nil
		out.queues[name] = &cp
	}
	for _, r := range t.roots {
		out.roots = append(out.roots, out.queues[r.spec.Name])
	}
	for name, n := range t.queues {
		c := out.queues[name]
		if n.parent != nil {
			c.parent = out.queues[n.parent.spec.Name]
		}
		for _, k := range n.children {
			c.children = append(c.children, out.queues[k.spec.Name])
		}
	}
	if t.fair != nil {
		out.fair = make(map[string]Resources, len(t.fair))
		for k, v := range t.fair {
			out.fair[k] = v
		}
	}
	return out
}
