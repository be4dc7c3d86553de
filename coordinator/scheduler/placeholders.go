package scheduler

import (
	"context"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/gpufrac/gpufrac/coordinator/placeholder"
	"github.com/gpufrac/gpufrac/coordinator/predicates"
	"github.com/gpufrac/gpufrac/coordinator/state"
)

// Placeholders creates, marks and deletes placeholder pods
// (coordinator/placeholder.Manager).
type Placeholders interface {
	// Create creates p and marks it Unschedulable.
	Create(ctx context.Context, p *corev1.Pod) error
	// MarkUnschedulable marks p Unschedulable again (its Create failed to).
	MarkUnschedulable(ctx context.Context, p *corev1.Pod) error
	Delete(ctx context.Context, p *corev1.Pod, why string) error
}

// remarkAfter is how old a placeholder no scheduler serves must be, still
// not asking Karpenter (placeholder.AsksKarpenter), before it is marked
// again: younger, the informer may simply not show the mark yet.
const remarkAfter = 5 * time.Second

// releaseCooldown is how long a group whose placeholders were released gets
// no new placeholders, so its pods can take the capacity first.
const releaseCooldown = 10 * time.Second

// items lists a workload's pending pods as placeholder demand. A gang's
// items carry its one pool.
func (s *Scheduler) items(w *workload, snap *state.Snapshot, existing []*corev1.Pod, kc *kubeChecks) []placeholder.Item {
	pool := ""
	if w.gang {
		pool = s.gangPool(w, snap, existing)
	}
	out := make([]placeholder.Item, 0, len(w.pods))
	for _, p := range w.pods {
		it := placeholder.Item{
			Workload: w.key, Pod: p.pod, GPUs: p.Request.GPUs, FractionPercent: p.Request.ShareMilli / 10,
			CPUMilli: p.Request.CPUMilli, MemoryBytes: p.Request.MemoryBytes, Models: p.Request.Models, Pool: pool,
			Gang: w.gang, DRA: p.ClaimsGPU, Topology: kc.volumeTopology(p.pod),
		}
		if len(p.Request.Scalars) > 0 {
			// A MIG or replica pod's queue charge is its scalars' worth.
			it.Scalars, it.ScalarMilli = p.Request.Scalars, p.res.GPUMilli
		}
		out = append(out, it)
	}
	return out
}

// gangPool picks the one node pool a gang's capacity is asked in: the pool
// of members already placed, else the pool its existing placeholders ask
// for, else the first pool its pods may use (their required affinity or node
// selector on the pool label), else the first pool among the nodes (for a
// gang asking GPUs, the first with GPU nodes; none when no pool has any).
func (s *Scheduler) gangPool(w *workload, snap *state.Snapshot, existing []*corev1.Pod) string {
	if w.pinned {
		return w.pool
	}
	key := s.opts.PoolLabel
	for _, ph := range existing {
		if ph.Annotations[placeholder.AnnotationWorkloads] == w.key && ph.Spec.NodeSelector[key] != "" {
			return ph.Spec.NodeSelector[key]
		}
	}
	pod := w.pods[0].pod
	if v := pod.Spec.NodeSelector[key]; v != "" {
		return v
	}
	if a := pod.Spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		var allowed []string
		for _, t := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
			for _, e := range t.MatchExpressions {
				if e.Key == key && e.Operator == corev1.NodeSelectorOpIn {
					allowed = append(allowed, e.Values...)
				}
			}
		}
		if len(allowed) > 0 {
			sort.Strings(allowed)
			return allowed[0]
		}
	}
	pools := w.candidatePools(snap)
	if len(pools) == 0 {
		return ""
	}
	// A gang that asks for GPUs asks in a pool that has GPU nodes its pods
	// may use (model, selectors, taints): the first pool by name may be a
	// CPU pool (nodes of every pool are in the snapshot), where Karpenter
	// could never buy its GPUs.
	asksGPUs := false
	for _, p := range w.pods {
		asksGPUs = asksGPUs || p.Request.GPUs > 0 || p.Request.ShareMilli > 0 || len(p.Request.Scalars) > 0
	}
	if asksGPUs {
		gpuPools := map[string]bool{}
		r := &w.pods[0].Request
		for i := 0; i < snap.Len(); i++ {
			if snap.NodeGPUs(i) > 0 && snap.Allows(r, i) {
				gpuPools[snap.NodePool(i)] = true
			}
		}
		for _, p := range pools {
			if gpuPools[p] {
				return p
			}
		}
		return "" // no GPU node yet: Karpenter picks the pool, as with no node at all
	}
	return pools[0]
}

// syncPlaceholders makes the placeholder pods match the demand of admitted
// work that found no room. Placeholders that landed on a node (the capacity
// came) are deleted so the real pods can take it; their nodes become the
// preferred nodes of the group.
//
// A group whose landed placeholders were released gets no new ones for
// releaseCooldown, so its pods can take that capacity first, but only while
// that capacity may still be theirs: while one of the nodes where they
// landed settles (settling: the coordinator binds nothing there yet) or has
// pods being bound. Past that, its pods that still found no room found the
// capacity taken (another group's pods took the node, whose placeholder
// landed there first and was released a moment before) and it asks again at
// once instead of idling out the cooldown: in the issue 16 comparison a
// fraction whose placeholder landed so waited 18 s (sim min at 1 h = 60 s)
// for a node it could have had in 6.
//
// Placeholders withdrawn this cycle (withdrawPlaceholders) are gone already:
// they are neither deleted again nor created anew until a later cycle.
func (s *Scheduler) syncPlaceholders(ctx context.Context, demand []placeholder.Item, pods []*corev1.Pod, settling func(node string) bool, withdrawn map[types.UID]bool) {
	if s.deps.Placeholders == nil {
		return
	}
	logger := klog.FromContext(ctx)
	now := s.clock.Now()
	desired := placeholder.Plan(demand, s.opts.Placeholder)
	want := map[string]*corev1.Pod{}
	wantGroup := map[string]bool{}
	for _, p := range desired {
		want[p.Name] = p
		wantGroup[p.Labels[placeholder.LabelGroup]] = true
	}
	// Groups whose capacity arrived: a placeholder of theirs is on a node.
	landedGroup := map[string]bool{}
	for _, p := range pods {
		if placeholder.IsPlaceholder(p) && p.DeletionTimestamp == nil && p.Spec.NodeName != "" && !predicates.Terminal(p) {
			landedGroup[p.Labels[placeholder.LabelGroup]] = true
		}
	}
	have := map[string]*corev1.Pod{}
	for _, p := range pods {
		if !placeholder.IsPlaceholder(p) || p.DeletionTimestamp != nil {
			continue
		}
		have[p.Name] = p
		if withdrawn[p.UID] {
			continue
		}
		group := p.Labels[placeholder.LabelGroup]
		switch {
		case want[p.Name] == nil && !wantGroup[group]:
			// Nothing waits for this group any more.
			_ = s.deps.Placeholders.Delete(ctx, p, "no pending work needs it")
		case p.Spec.NodeName != "" && !predicates.Terminal(p):
			// The capacity arrived: free it for the real pods, and prefer this node.
			s.hints.landed(group, p.Spec.NodeName, now)
			_ = s.deps.Placeholders.Delete(ctx, p, "capacity arrived on "+p.Spec.NodeName)
			s.metrics.placeholderLanded.Inc()
		case landedGroup[group]:
			// The group's other placeholders go too: left pending, the default
			// scheduler would bind the next one to the capacity just freed for
			// the real pods, and the two schedulers would chase each other.
			// Whatever the group still lacks is asked for again after the
			// cooldown, avoiding the nodes that already landed.
			_ = s.deps.Placeholders.Delete(ctx, p, "another placeholder of the group landed")
		case want[p.Name] == nil:
			_ = s.deps.Placeholders.Delete(ctx, p, "the group needs fewer GPUs")
		case p.Spec.NodeName == "" && !placeholder.NeverBound(p):
			// Made by an earlier version: kube-scheduler serves it, and
			// could bind it to the GPU the coordinator's work takes in the
			// same moment (new nodes settle only NewNodeSettle now). It is
			// made again, nobody's to bind, in a later cycle.
			_ = s.deps.Placeholders.Delete(ctx, p, "made by an earlier version, which kube-scheduler binds: replaced by one nobody binds")
		case placeholder.NeverBound(p) && !placeholder.AsksKarpenter(p) && now.Sub(p.CreationTimestamp.Time) >= remarkAfter:
			// Created, but marking it failed: Karpenter does not see it.
			if err := s.deps.Placeholders.MarkUnschedulable(ctx, p); err != nil {
				logger.Error(err, "Marking placeholder Unschedulable", "pod", klog.KObj(p))
			}
		}
	}
	for name, p := range want {
		if have[name] != nil || landedGroup[p.Labels[placeholder.LabelGroup]] {
			continue
		}
		if s.cooling(p.Labels[placeholder.LabelGroup], now, settling) {
			continue
		}
		if err := s.deps.Placeholders.Create(ctx, p); err != nil {
			logger.Error(err, "Creating placeholder")
			continue
		}
		s.metrics.placeholdersCreated.Inc()
	}
}

// cooling tells whether group still waits for its pods to take the
// capacity its released placeholders found (see syncPlaceholders): one of
// its preferred nodes is settling or has a pod being bound.
func (s *Scheduler) cooling(group string, now time.Time, settling func(node string) bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hints.cooling(group, now, func(n string) bool {
		if settling(n) {
			return true
		}
		for _, a := range s.assumed {
			if a.Node == n {
				return true
			}
		}
		return false
	})
}

// settlingIn tells which nodes exist but are left out of snap (not Ready,
// or settling: state.Inputs.Settling) or are held (settling, their pods
// bound later: see settlingNodes).
func settlingIn(snap *state.Snapshot, nodes []*corev1.Node, held map[string]bool) func(node string) bool {
	exists := nodeExists(nodes)
	return func(node string) bool {
		_, in := snap.Index(node)
		return exists(node) && (!in || held[node])
	}
}

// nodeExists tells whether nodes name a node. Its index is made when first
// asked: most cycles never ask.
func nodeExists(nodes []*corev1.Node) func(node string) bool {
	var names map[string]bool
	return func(node string) bool {
		if names == nil {
			names = make(map[string]bool, len(nodes))
			for _, n := range nodes {
				names[n.Name] = true
			}
		}
		return names[node]
	}
}

// withdrawPlaceholders deletes the pending placeholders asked for w once w
// found room (on the node they brought or any other), before w's
// reservations are made and w is bound. Left pending, a placeholder keeps
// asking Karpenter: its simulation, which sees w's pods and reservations on
// the node it nominated and the placeholder no longer fitting, would buy
// another node. Other work it also asked for asks again in a later cycle.
// The placeholders deleted are added to withdrawn, for syncPlaceholders.
//
// It tells whether w must wait for a later cycle:
//   - a delete failed: the placeholder still asks, and for a placeholder
//     kube-scheduler serves, may still be bound to w's GPU;
//   - it deleted a placeholder kube-scheduler serves (one of an earlier
//     version; placeholder.NeverBound is false): kube-scheduler may bind it
//     to the very GPU w takes, in the same moment, and the kubelet admits
//     only one of the two (a whole-GPU job failed so in the issue 16
//     comparison). w is bound once the informer shows it gone, or bound
//     after all and terminating (holding its GPU until it is gone).
//
// Placeholders no scheduler serves are never bound: deleted, w goes on in
// the same cycle.
func (s *Scheduler) withdrawPlaceholders(ctx context.Context, w *workload, existing []*corev1.Pod, withdrawn map[types.UID]bool) (wait bool) {
	if s.deps.Placeholders == nil {
		return false
	}
	for _, ph := range existing {
		if ph.Spec.NodeName != "" || ph.DeletionTimestamp != nil || withdrawn[ph.UID] ||
			!slices.Contains(strings.Split(ph.Annotations[placeholder.AnnotationWorkloads], ","), w.key) {
			continue
		}
		if err := s.deps.Placeholders.Delete(ctx, ph, "its work found room on a node"); err != nil {
			klog.FromContext(ctx).Error(err, "Withdrawing placeholder; its work waits", "pod", klog.KObj(ph), "workload", w.key)
			wait = true
			continue
		}
		withdrawn[ph.UID] = true
		wait = wait || !placeholder.NeverBound(ph)
	}
	return wait
}

// preferredNodes are the nodes where a workload's placeholders landed.
func (s *Scheduler) preferredNodes(items []placeholder.Item) map[string]bool {
	if len(items) == 0 {
		return nil
	}
	nodes, claims := s.hints.of(placeholder.GroupOf(items[0]))
	if s.deps.NodeClaims != nil {
		for _, c := range claims {
			if n := s.deps.NodeClaims(c); n != "" {
				nodes = appendUniqueStr(nodes, n)
			}
		}
	}
	if len(nodes) == 0 {
		return nil
	}
	out := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		out[n] = true
	}
	return out
}

func appendUniqueStr(s []string, x string) []string {
	for _, v := range s {
		if v == x {
			return s
		}
	}
	return append(s, x)
}

// pruneHints forgets the placement hints of placeholder groups that have
// neither placeholders nor admitted pending work (live), nodes that no
// longer exist, and release times past their cooldown. Without it the
// hints grow with every group and every node Karpenter ever made.
func (s *Scheduler) pruneHints(live func() map[string]bool, nodes []*corev1.Node) {
	s.hints.prune(live, nodeExists(nodes), s.clock.Now())
}
