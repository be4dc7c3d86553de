// Package consolidation is GPU-aware consolidation, which Karpenter cannot
// do for shared GPUs: Karpenter never disrupts a node whose GPU is shared
// (the reservation pods carry karpenter.sh/do-not-disrupt) and judges only
// CPU and memory anyway. So after a peak an 8-GPU node can stay up for a few
// fractions while 1-GPU nodes empty. Here the coordinator finds a Karpenter
// node whose running GPU work fits on the other nodes (placement policy,
// constraints, pools and gangs respected: the placement library simulates
// it), taints the node gpufrac.io/draining so nothing new lands there,
// evicts its preemptible pods through the Eviction API (PodDisruptionBudgets
// apply) within a disruption budget, and releases its reservations once its
// GPUs are free. The pods' controllers re-create them; the coordinator places
// them on the other nodes; the node is empty and Karpenter removes it.
//
// The Planner is pure: the cluster comes in as data (nodes, pods, PDBs) and
// a Plan comes out. The Controller runs it on the informers' view, under the
// coordinator's lease, and does the writes. Its only state is the taint on
// the draining node: a restarted coordinator resumes the drain or abandons
// it (removes the taint), and abandoning is always safe.
//
// What is never touched: non-preemptible pods (gpufrac.io/preemptible
// "false" or priority at the threshold), any pod annotated
// karpenter.sh/do-not-disrupt except gpufrac's own reservations, GPU pods of
// other schedulers, pods nothing would re-create (no controller owner) unless
// allowed, gangs with any member that may not move, GPU pods of DaemonSets
// or static pods (they cannot move, and their reservations would be
// released under them). A node holding any of these is not drained.
package consolidation

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/request"
	"github.com/gpufrac/gpufrac/coordinator/placeholder"
	"github.com/gpufrac/gpufrac/coordinator/placement"
	"github.com/gpufrac/gpufrac/coordinator/podrequest"
	"github.com/gpufrac/gpufrac/coordinator/predicates"
	"github.com/gpufrac/gpufrac/coordinator/pricing"
	"github.com/gpufrac/gpufrac/coordinator/state"
)

// PlannerOptions configure what the planner may move and how it simulates.
type PlannerOptions struct {
	// SchedulerName is the coordinator's schedulerName: only its pods move.
	SchedulerName string
	// PoolLabel is the node label of node pools (gangs stay in one).
	PoolLabel string
	// Policy and Seed are the placement policy the coordinator places with.
	Policy string
	Seed   uint64
	// TimesliceResource is the time-sliced replica resource ("" default).
	TimesliceResource string
	// NonPreemptiblePriority is the priority from which pods are
	// non-preemptible (nil: podrequest's default), as the scheduler uses it.
	NonPreemptiblePriority *int32
	// MoveBarePods lets pods without a controller owner move. Nothing
	// re-creates such a pod after its eviction, so by default a node
	// running one is not drained.
	MoveBarePods bool
	// MinSavingPerMove is the least saving per hour, per pod moved, that
	// makes a drain worth its restarts, in the price table's unit (GPUs
	// without a table).
	MinSavingPerMove float64
	// Prices prices the nodes (nil: every GPU costs 1).
	Prices *pricing.Table
	// Jobs finds a pod's owning Job (gangs derived from parallelism); may be nil.
	Jobs func(namespace, name string) (*batchv1.Job, bool)
}

// Cluster is what one planning pass reads.
type Cluster struct {
	Nodes []*corev1.Node
	Pods  []*corev1.Pod
	PDBs  []*policyv1.PodDisruptionBudget
	// Drifted names the nodes whose Karpenter NodeClaim is Drifted, where
	// the scheduler places nothing new (scheduler.Options.AvoidDriftedNodes):
	// no move goes there, and they give no room to pods waiting. They may
	// still be drained.
	Drifted map[string]bool
}

// Verdict is what the planner thinks of one node.
type Verdict string

// The verdicts, also the values of the metric gpufrac_consolidation_nodes's
// label verdict.
const (
	// VerdictCandidate: the node can be drained and it is worth it.
	VerdictCandidate Verdict = "candidate"
	// VerdictNotRemovable: not a Ready Karpenter GPU node (static nodes,
	// nodes already going, nodes annotated do-not-disrupt).
	VerdictNotRemovable Verdict = "not_removable"
	// VerdictNothingToMove: no gpufrac pod runs there (Karpenter's own
	// emptiness consolidation handles it once its reservations go).
	VerdictNothingToMove Verdict = "nothing_to_move"
	// VerdictProtected: a pod there may not be moved.
	VerdictProtected Verdict = "protected"
	// VerdictBusy: capacity is being added or used there (a placeholder
	// landed, pods are terminating).
	VerdictBusy Verdict = "busy"
	// VerdictPDB: a PodDisruptionBudget allows fewer disruptions than the move needs.
	VerdictPDB Verdict = "pdb"
	// VerdictDoesNotFit: its pods do not fit on the other nodes.
	VerdictDoesNotFit Verdict = "does_not_fit"
	// VerdictBelowThreshold: the saving does not outweigh the restarts.
	VerdictBelowThreshold Verdict = "below_threshold"
	// VerdictDraining: the node is being drained.
	VerdictDraining Verdict = "draining"
)

// Verdicts lists every verdict (for the metric's series).
func Verdicts() []Verdict {
	return []Verdict{VerdictCandidate, VerdictNotRemovable, VerdictNothingToMove, VerdictProtected, VerdictBusy,
		VerdictPDB, VerdictDoesNotFit, VerdictBelowThreshold, VerdictDraining}
}

// NodeVerdict is the planner's verdict on one node, with why.
type NodeVerdict struct {
	Node    string
	Verdict Verdict
	Reason  string
}

// Plan is a drain: the node, the pods to evict (whole gangs, members on
// other nodes included), the reservations to release once its fractions are
// gone, and what removing the node saves per hour.
type Plan struct {
	Node string
	// Saving is the node's price per hour (pricing.Table.NodePrice).
	Saving float64
	// PriceSource says where the price came from.
	PriceSource pricing.Source
	// Pods are the pods to evict, sorted by namespace and name.
	Pods []*corev1.Pod
	// Units are Pods as they must be evicted together: a gang's members,
	// or one pod. In the order of Pods' first member.
	Units [][]*corev1.Pod
	// Reservations are the node's reservation pods.
	Reservations []*corev1.Pod
	// Terminating counts gpufrac pods on the node already going.
	Terminating int
}

// Moves is how many pods the plan restarts.
func (p *Plan) Moves() int { return len(p.Pods) }

// ErrCannotDrain is matched by the errors Remaining returns when a drain
// must be abandoned (a protected pod arrived, the rest no longer fits).
var ErrCannotDrain = errors.New("the node can no longer be drained")

// Planner finds nodes worth draining.
type Planner struct {
	opts   PlannerOptions
	placer *placement.Placer
}

// NewPlanner returns a planner.
func NewPlanner(o PlannerOptions) (*Planner, error) {
	if o.SchedulerName == "" {
		o.SchedulerName = api.SchedulerName
	}
	if o.PoolLabel == "" {
		o.PoolLabel = api.LabelNodePool
	}
	if o.Policy == "" {
		o.Policy = placement.DefaultPolicy
	}
	p, err := placement.New(o.Policy, placement.Options{Seed: o.Seed})
	if err != nil {
		return nil, fmt.Errorf("creating the consolidation planner: %w", err)
	}
	return &Planner{opts: o, placer: p}, nil
}

// view is one pass's parsed cluster.
type view struct {
	c        Cluster
	byNode   map[string][]*corev1.Pod                   // node name -> non-terminal pods bound there
	parsed   map[types.UID]parsedPod                    // coordinator's pods -> their request
	gangs    map[string][]*corev1.Pod                   // gang key -> bound members
	models   []string                                   // GPU products in the cluster
	draining map[string]bool                            // node name -> tainted gpufrac.io/draining
	nodes    map[string]*corev1.Node                    // node name -> node
	pending  []*corev1.Pod                              // the coordinator's pods waiting to be placed, in creation order
	pdbs     map[string][]*policyv1.PodDisruptionBudget // namespace -> PDBs

	// undrained is the cluster with the draining nodes given back, built
	// on first use by wantsRoom (nil when it could not be built).
	undrained      *state.Snapshot
	undrainedBuilt bool
}

type parsedPod struct {
	r   podrequest.Parsed
	err error
}

func (p *Planner) newView(c Cluster) *view {
	v := &view{
		c: c, byNode: map[string][]*corev1.Pod{}, parsed: map[types.UID]parsedPod{}, gangs: map[string][]*corev1.Pod{},
		draining: map[string]bool{}, nodes: map[string]*corev1.Node{}, pdbs: map[string][]*policyv1.PodDisruptionBudget{},
	}
	seen := map[string]bool{}
	for _, n := range c.Nodes {
		v.nodes[n.Name] = n
		if predicates.Draining(n) {
			v.draining[n.Name] = true
		}
		if m := n.Labels[api.LabelGPUProduct]; m != "" && !seen[m] {
			seen[m] = true
			v.models = append(v.models, m)
		}
	}
	sort.Strings(v.models)
	opts := podrequest.Options{MaxGPUs: 1 << 10, NonPreemptiblePriority: p.opts.NonPreemptiblePriority, JobLookup: p.opts.Jobs,
		GPUModels: v.models, TimesliceResource: p.opts.TimesliceResource}
	for _, pod := range c.Pods {
		if predicates.Terminal(pod) {
			continue
		}
		if pod.Spec.SchedulerName == p.opts.SchedulerName {
			r, err := podrequest.Parse(pod, opts)
			v.parsed[pod.UID] = parsedPod{r: r, err: err}
			if err == nil && r.Gang != nil && pod.Spec.NodeName != "" {
				v.gangs[r.Gang.Key()] = append(v.gangs[r.Gang.Key()], pod)
			}
			if pod.Spec.NodeName == "" && pod.DeletionTimestamp == nil && err == nil && activelyPending(pod) {
				v.pending = append(v.pending, pod)
			}
		}
		if pod.Spec.NodeName != "" {
			v.byNode[pod.Spec.NodeName] = append(v.byNode[pod.Spec.NodeName], pod)
		}
	}
	sort.SliceStable(v.pending, func(i, j int) bool {
		return v.pending[i].CreationTimestamp.Before(&v.pending[j].CreationTimestamp)
	})
	v.pdbs = pdbsByNamespace(c.PDBs)
	return v
}

// activelyPending tells whether a pending pod of the coordinator is being
// placed or waits for capacity, as opposed to waiting on its queue or gang
// or being refused: only the former compete for the room a drain uses. A
// pod with scheduling gates waits on whoever set them, not on room.
func activelyPending(p *corev1.Pod) bool {
	if len(p.Spec.SchedulingGates) > 0 {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			switch c.Reason {
			case api.ReasonInvalidRequest, api.ReasonOverQuota, api.ReasonOverLimit, api.ReasonGangIncomplete, api.ReasonNotAdmittedByKueue, api.ReasonKubeChecksNotReady:
				return false
			}
		}
	}
	return true
}

// removable tells whether Karpenter may remove the node once it is empty:
// a Ready node of a NodePool, not going already, not annotated
// do-not-disrupt, with GPUs.
func removable(n *corev1.Node) (bool, string) {
	switch {
	case n.Labels[api.LabelNodePool] == "":
		return false, "not a Karpenter node (no " + api.LabelNodePool + " label)"
	case n.DeletionTimestamp != nil:
		return false, "being deleted"
	case n.Annotations[api.AnnotationDoNotDisrupt] == "true":
		return false, "the node is annotated " + api.AnnotationDoNotDisrupt
	case !predicates.NodeReady(n):
		return false, "not Ready or unschedulable"
	case nodeGPUs(n) == 0:
		return false, "no GPUs"
	}
	for _, t := range n.Spec.Taints {
		if t.Key == taintKarpenterDisrupted {
			return false, "Karpenter is disrupting it"
		}
	}
	return true, ""
}

// taintKarpenterDisrupted is the taint Karpenter puts on nodes it disrupts.
const taintKarpenterDisrupted = "karpenter.sh/disrupted"

// nodeGPUs is the node's GPU count: its inventory's GPUs (every mode),
// else its allocatable nvidia.com/gpu.
func nodeGPUs(n *corev1.Node) int {
	if raw := n.Annotations[api.AnnotationGPUInventory]; raw != "" {
		if inv, err := api.DecodeInventory(raw); err == nil && len(inv) > 0 {
			return len(inv)
		}
	}
	q := n.Status.Allocatable[api.ResourceGPU]
	return int(q.Value())
}

// classify sorts the pods of a node: those to move, reservations, and the
// first reason the node may not be drained ("" when it may).
func (p *Planner) classify(v *view, node string) (plan Plan, verdict Verdict, reason string) {
	plan.Node = node
	moving := map[types.UID]bool{}
	for _, pod := range v.byNode[node] {
		if pod.DeletionTimestamp != nil {
			if pod.Spec.SchedulerName == p.opts.SchedulerName || predicates.IsReservation(pod) {
				plan.Terminating++
			}
			continue
		}
		if ownedByDaemonSet(pod) || isMirror(pod) {
			if !usesGPU(pod, p.opts.TimesliceResource) {
				continue // stays with the node, holding no GPU
			}
			// Owner references are the pod author's to write: a GPU pod
			// left behind would run on when its reservations are released.
			return plan, VerdictProtected, fmt.Sprintf("pod %s/%s uses GPUs and is a DaemonSet or static pod: it cannot move", pod.Namespace, pod.Name)
		}
		if predicates.IsReservation(pod) {
			plan.Reservations = append(plan.Reservations, pod)
			continue
		}
		if pod.Namespace == api.ReservationNamespace && pod.Labels[api.LabelRole] == api.RolePlaceholder {
			return plan, VerdictBusy, fmt.Sprintf("placeholder %s landed there: capacity is being used", pod.Name)
		}
		if why := p.unmovable(v, pod); why != "" {
			if pod.Spec.SchedulerName != p.opts.SchedulerName && !usesGPU(pod, p.opts.TimesliceResource) && pod.Annotations[api.AnnotationDoNotDisrupt] != "true" {
				continue // a CPU pod of another scheduler: Karpenter moves it itself
			}
			return plan, VerdictProtected, why
		}
		if moving[pod.UID] {
			continue // a member of a gang already taken
		}
		pr := v.parsed[pod.UID]
		members := []*corev1.Pod{pod}
		if pr.r.Gang != nil {
			members = v.gangs[pr.r.Gang.Key()]
		}
		var unit []*corev1.Pod
		for _, m := range members {
			if m.DeletionTimestamp != nil {
				continue
			}
			if m.Spec.NodeName != node {
				if why := p.unmovable(v, m); why != "" {
					return plan, VerdictProtected, fmt.Sprintf("gang %s moves whole or not at all, and its member %s/%s may not move: %s", pr.r.Gang.Key(), m.Namespace, m.Name, why)
				}
			}
			if !moving[m.UID] {
				moving[m.UID] = true
				unit = append(unit, m)
			}
		}
		sortPods(unit)
		plan.Units = append(plan.Units, unit)
		plan.Pods = append(plan.Pods, unit...)
	}
	sortPods(plan.Pods)
	sort.SliceStable(plan.Units, func(i, j int) bool { return podLess(plan.Units[i][0], plan.Units[j][0]) })
	return plan, "", ""
}

// unmovable says why a pod may not be moved ("" when it may). Annotations
// and labels are tenants' input: they can only keep their own pod in place
// (do-not-disrupt, preemptible "false"), never make another pod move. A pod
// admitted non-preemptible (its binding's gpufrac.io/admitted-preemptible
// "false", which only the coordinator writes) stays so whatever its author
// edits after, as the scheduler's books and reclaim read it.
func (p *Planner) unmovable(v *view, pod *corev1.Pod) string {
	if pod.Annotations[api.AnnotationDoNotDisrupt] == "true" {
		return fmt.Sprintf("pod %s/%s is annotated %s", pod.Namespace, pod.Name, api.AnnotationDoNotDisrupt)
	}
	if pod.Spec.SchedulerName != p.opts.SchedulerName {
		return fmt.Sprintf("pod %s/%s uses GPUs and is scheduled by %q, not the coordinator", pod.Namespace, pod.Name, schedulerOf(pod))
	}
	pr, ok := v.parsed[pod.UID]
	switch {
	case !ok || pr.err != nil:
		return fmt.Sprintf("pod %s/%s: its request does not parse: %v", pod.Namespace, pod.Name, pr.err)
	case pr.r.NonPreemptible:
		return fmt.Sprintf("pod %s/%s is non-preemptible", pod.Namespace, pod.Name)
	case pod.Annotations[api.AnnotationAdmittedPreemptible] == "false":
		return fmt.Sprintf("pod %s/%s was admitted non-preemptible", pod.Namespace, pod.Name)
	case !p.opts.MoveBarePods && metav1.GetControllerOf(pod) == nil:
		return fmt.Sprintf("pod %s/%s has no controller to re-create it", pod.Namespace, pod.Name)
	case predicates.UsesKubeChecks(pod):
		// Where it could land again depends on kube-scheduler's checks
		// (a local volume, spread, anti-affinity, a host port), which the
		// planner's simulation does not make.
		return fmt.Sprintf("pod %s/%s has volumes, topology spread, pod (anti-)affinity or host ports, which consolidation does not check where it would land", pod.Namespace, pod.Name)
	}
	return ""
}

func schedulerOf(p *corev1.Pod) string {
	if p.Spec.SchedulerName == "" {
		return corev1.DefaultSchedulerName
	}
	return p.Spec.SchedulerName
}

func ownedByDaemonSet(p *corev1.Pod) bool {
	ref := metav1.GetControllerOf(p)
	return ref != nil && ref.Kind == "DaemonSet"
}

// ownedByNode tells whether a Node owns the pod (static pods' mirrors, and
// node-bound pods), as Karpenter reads it: such pods go with their node.
// An owner reference is its pod author's to write, so this only says the
// author let the pod go with the node.
func ownedByNode(p *corev1.Pod) bool {
	return slices.ContainsFunc(p.OwnerReferences, func(r metav1.OwnerReference) bool { return r.Kind == "Node" && r.APIVersion == "v1" })
}

func isMirror(p *corev1.Pod) bool {
	_, ok := p.Annotations[corev1.MirrorPodAnnotationKey]
	return ok
}

// usesGPU tells whether a pod asks for GPUs of any kind.
func usesGPU(p *corev1.Pod, timeslice string) bool {
	d := request.Parse(p, request.Options{TimesliceResource: timeslice}).Demand()
	return d.UsesGPU()
}

// pdbsByNamespace indexes PodDisruptionBudgets by namespace.
func pdbsByNamespace(pdbs []*policyv1.PodDisruptionBudget) map[string][]*policyv1.PodDisruptionBudget {
	out := map[string][]*policyv1.PodDisruptionBudget{}
	for _, b := range pdbs {
		out[b.Namespace] = append(out[b.Namespace], b)
	}
	return out
}

// pdbsOf lists the PodDisruptionBudgets covering a pod: those of its
// namespace whose selector matches it (in policy/v1 an empty selector
// matches every pod of the namespace and a null one none, the Eviction
// API's own rule).
func pdbsOf(pdbs map[string][]*policyv1.PodDisruptionBudget, pod *corev1.Pod) []*policyv1.PodDisruptionBudget {
	var out []*policyv1.PodDisruptionBudget
	for _, b := range pdbs[pod.Namespace] {
		sel, err := metav1.LabelSelectorAsSelector(b.Spec.Selector)
		if err == nil && sel.Matches(labels.Set(pod.Labels)) {
			out = append(out, b)
		}
	}
	return out
}

// pdbAllows tells whether the PodDisruptionBudgets covering the pods allow
// evicting them all now ("" when they do). A budget covers the pods its
// selector matches; in policy/v1 an empty selector matches every pod of its
// namespace and a null one none (the Eviction API's own rule).
func pdbAllows(pdbs map[string][]*policyv1.PodDisruptionBudget, pods []*corev1.Pod) string {
	need := map[*policyv1.PodDisruptionBudget]int32{}
	var blocked []string
	for _, pod := range pods {
		var covering []string
		for _, b := range pdbsOf(pdbs, pod) {
			need[b]++
			covering = append(covering, b.Namespace+"/"+b.Name)
		}
		if len(covering) > 1 {
			// The Eviction API refuses such a pod whatever the budgets allow.
			sort.Strings(covering)
			blocked = append(blocked, fmt.Sprintf("%s/%s is covered by %d PodDisruptionBudgets (%s), which the Eviction API refuses", pod.Namespace, pod.Name, len(covering), strings.Join(covering, ", ")))
		}
	}
	for b, n := range need {
		if n > b.Status.DisruptionsAllowed {
			blocked = append(blocked, fmt.Sprintf("%s/%s allows %d disruptions and the move needs %d", b.Namespace, b.Name, b.Status.DisruptionsAllowed, n))
		}
	}
	sort.Strings(blocked)
	return strings.Join(blocked, "; ")
}

// Candidates judges every node and returns the best drain (nil when none):
// the largest saving, then the fewest moves, then the name. Nodes already
// draining are left out of the targets; their remaining pods are simulated
// first, as they need room too.
func (p *Planner) Candidates(c Cluster) (*Plan, []NodeVerdict) {
	v := p.newView(c)
	var verdicts []NodeVerdict
	var best *Plan
	names := make([]string, 0, len(c.Nodes))
	for _, n := range c.Nodes {
		names = append(names, n.Name)
	}
	sort.Strings(names)
	var draining []Plan
	for _, name := range names {
		if v.draining[name] {
			if plan, verdict, _ := p.classify(v, name); verdict == "" {
				draining = append(draining, plan)
			}
		}
	}
	for _, name := range names {
		n := v.nodes[name]
		if v.draining[name] {
			verdicts = append(verdicts, NodeVerdict{Node: name, Verdict: VerdictDraining})
			continue
		}
		plan, verdict, reason := p.judge(v, n, draining)
		verdicts = append(verdicts, NodeVerdict{Node: name, Verdict: verdict, Reason: reason})
		if verdict != VerdictCandidate {
			continue
		}
		if best == nil || plan.Saving > best.Saving+1e-9 || (plan.Saving > best.Saving-1e-9 && plan.Moves() < best.Moves()) {
			best = &plan
		}
	}
	return best, verdicts
}

// judge gives one node its verdict and, for a candidate, its plan.
func (p *Planner) judge(v *view, n *corev1.Node, draining []Plan) (Plan, Verdict, string) {
	if ok, why := removable(n); !ok {
		return Plan{}, VerdictNotRemovable, why
	}
	plan, verdict, reason := p.classify(v, n.Name)
	if verdict != "" {
		return plan, verdict, reason
	}
	if plan.Terminating > 0 {
		return plan, VerdictBusy, fmt.Sprintf("%d gpufrac pods are terminating there", plan.Terminating)
	}
	if len(plan.Pods) == 0 {
		return plan, VerdictNothingToMove, "no gpufrac pod runs there"
	}
	plan.Saving, plan.PriceSource = p.opts.Prices.NodePrice(n, nodeGPUs(n))
	if need := p.opts.MinSavingPerMove * float64(plan.Moves()); plan.Saving+1e-9 < need {
		return plan, VerdictBelowThreshold, fmt.Sprintf("saves %.2f per hour for %d restarts; the threshold asks %.2f", plan.Saving, plan.Moves(), need)
	}
	if why := pdbAllows(v.pdbs, plan.Pods); why != "" {
		return plan, VerdictPDB, why
	}
	exclude := map[string]bool{n.Name: true}
	for _, m := range v.c.Nodes {
		if m.Name != n.Name && p.idle(v, m) {
			// Karpenter removes it: moving the work there saves nothing
			// and restarts every pod moved.
			exclude[m.Name] = true
		}
	}
	var moves []*corev1.Pod
	for _, d := range draining {
		exclude[d.Node] = true
		moves = append(moves, d.Pods...)
	}
	moves = append(moves, plan.Pods...)
	if err := p.fits(v, exclude, moves); err != nil {
		return plan, VerdictDoesNotFit, err.Error()
	}
	return plan, VerdictCandidate, fmt.Sprintf("saves %.2f per hour (%s price) for %d restarts", plan.Saving, plan.PriceSource, plan.Moves())
}

// idle tells whether node m is a Karpenter node (removable) whose GPUs
// run nothing but reservations: Karpenter removes it once its reservations
// go (the reservation manager lets them go soon on such a node), so it is
// no destination for a drain's pods. A node where a placeholder landed,
// or with pods bound that use GPUs, is not idle.
func (p *Planner) idle(v *view, m *corev1.Node) bool {
	if ok, _ := removable(m); !ok {
		return false
	}
	for _, pod := range v.byNode[m.Name] {
		switch {
		case pod.DeletionTimestamp != nil || predicates.IsReservation(pod):
		case pod.Namespace == api.ReservationNamespace && pod.Labels[api.LabelRole] == api.RolePlaceholder:
			return false
		case usesGPU(pod, p.opts.TimesliceResource):
			return false
		}
	}
	return true
}

// Remaining is what is left of the drain of node: the pods still to move
// and the reservations, and an error wrapping ErrCannotDrain when the drain
// must be abandoned: a pod that may not move is there now, or what is left
// no longer fits on the other nodes (the other drains' pods included).
func (p *Planner) Remaining(c Cluster, node string) (Plan, error) {
	v := p.newView(c)
	plan, verdict, reason := p.classify(v, node)
	if verdict == VerdictProtected {
		return plan, fmt.Errorf("%w: %s", ErrCannotDrain, reason)
	}
	if verdict == VerdictBusy {
		// A placeholder landed despite the taint (it tolerates it): the
		// scheduler deletes it; wait.
		return Plan{Node: node, Terminating: max(plan.Terminating, 1), Reservations: plan.Reservations}, nil
	}
	if len(plan.Pods) == 0 {
		return plan, nil
	}
	exclude := map[string]bool{}
	var moves []*corev1.Pod
	for name := range v.draining {
		exclude[name] = true
		if name == node {
			continue
		}
		if other, verdict, _ := p.classify(v, name); verdict == "" {
			moves = append(moves, other.Pods...)
		}
	}
	exclude[node] = true
	moves = append(moves, plan.Pods...)
	if err := p.fits(v, exclude, moves); err != nil {
		return plan, fmt.Errorf("%w: %w", ErrCannotDrain, err)
	}
	return plan, nil
}

// Starved counts the coordinator's pods that wait for capacity (reason
// NoCapacity or DriftedNodesOnly: placeholders ask Karpenter for more) and that the draining
// nodes, given back, could hold. While any do, a node kept out of placement
// by a drain is capacity bought twice. A pod no node could hold either way
// (a tenant's node selector that matches nothing) is not counted: giving
// the drains back would not place it, and it would keep every drain off.
func (p *Planner) Starved(c Cluster) int {
	v := p.newView(c)
	n := 0
	for _, pod := range v.pending {
		for _, cond := range pod.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse &&
				(cond.Reason == api.ReasonNoCapacity || cond.Reason == api.ReasonDriftedNodesOnly) && p.wantsRoom(v, pod) {
				n++
				break
			}
		}
	}
	return n
}

// PendingWork counts the coordinator's pods being placed or waiting for
// capacity, and the placeholders asking Karpenter for more: while any
// exist, no new drain starts (the room it would use is wanted). Only work
// that the cluster's nodes could hold, the draining ones given back, is
// counted; so is a placeholder unless every workload it was made for is
// such uncountable work. Pods are tenants' input: one that no node could
// ever hold must not stop consolidation, nor take its disruption budget.
func (p *Planner) PendingWork(c Cluster) (pending, placeholders int) {
	v := p.newView(c)
	wants := map[string]bool{} // workload key of pending pods -> some pod of it wants room
	for _, pod := range v.pending {
		w := p.wantsRoom(v, pod)
		if w {
			pending++
		}
		key := workloadKey(v, pod)
		wants[key] = wants[key] || w
	}
	for _, pod := range c.Pods {
		if predicates.Terminal(pod) || pod.DeletionTimestamp != nil {
			continue
		}
		if !placeholder.IsPlaceholder(pod) {
			continue
		}
		// The workload keys it was made for ("namespace/name" of a pod,
		// "namespace/group" of a gang), comma-separated.
		keys := strings.Split(pod.Annotations[placeholder.AnnotationWorkloads], ",")
		for _, k := range keys {
			if w, known := wants[k]; !known || w {
				placeholders++ // made for work that wants room, or for work not seen pending: counted
				break
			}
		}
	}
	return pending, placeholders
}

// workloadKey is the scheduler's key of the workload a pod belongs to.
func workloadKey(v *view, pod *corev1.Pod) string {
	if g := v.parsed[pod.UID].r.Gang; g != nil {
		return g.Key()
	}
	return pod.Namespace + "/" + pod.Name
}

// wantsRoom tells whether a pending pod of the coordinator fits on one of
// the cluster's nodes as they stand, the draining ones given back (their
// taint ignored): only such a pod competes for the room a drain takes.
// Gang members are judged one by one. When the cluster cannot be
// simulated, every pod counts, as before.
func (p *Planner) wantsRoom(v *view, pod *corev1.Pod) bool {
	if !v.undrainedBuilt {
		v.undrainedBuilt = true
		nodes := make([]*corev1.Node, 0, len(v.c.Nodes))
		for _, n := range v.c.Nodes {
			if v.c.Drifted[n.Name] {
				continue // nothing is placed there
			}
			if v.draining[n.Name] {
				n = n.DeepCopy()
				n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == api.TaintDraining })
			}
			nodes = append(nodes, n)
		}
		snap, err := state.Build(state.Inputs{Nodes: nodes, Pods: v.c.Pods, PoolLabel: p.opts.PoolLabel, TimesliceResource: p.opts.TimesliceResource})
		if err == nil {
			v.undrained = snap
		}
	}
	if v.undrained == nil {
		return true
	}
	r := v.parsed[pod.UID].r.Request
	_, err := p.placeOne(v.undrained, &r)
	return err == nil
}

func sortPods(pods []*corev1.Pod) {
	sort.Slice(pods, func(i, j int) bool { return podLess(pods[i], pods[j]) })
}

func podLess(a, b *corev1.Pod) bool {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name)) < 0
}
