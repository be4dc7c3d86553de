package scheduler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/gpufrac/gpufrac/coordinator/kubecheck"
	"github.com/gpufrac/gpufrac/coordinator/placeholder"
	"github.com/gpufrac/gpufrac/coordinator/placement"
	"github.com/gpufrac/gpufrac/coordinator/predicates"
)

// kubeChecks is one cycle's use of kube-scheduler's filter plugins
// (Deps.Kube, coordinator/kubecheck): begun on the first pod that needs
// them, so a cycle with no such pod pays for no snapshot. Every pod placed
// is assumed into kube-scheduler's cache (a pod without spread constraints
// may still count in another's), taken back when its workload's placement
// is rolled back or it is not sent to binding; a pod sent to binding stays
// assumed until the informer shows it bound or its binding fails. A nil
// *kubeChecks checks nothing.
type kubeChecks struct {
	k      *kubecheck.Checker
	ctx    context.Context
	logger klog.Logger
	began  bool
	err    error // Begin failed: pods that need checks wait
	// placedPods are the pods placed, in order (see mark, rollback).
	placedPods []placedPod
	// reserved are the pods whose volumes are reserved and not yet handed to
	// a binding (gate); end takes back what is left.
	reserved map[types.UID]placedPod
	// sent are the pods sent to binding (sent): they stay assumed.
	sent map[types.UID]bool
	// without, while reclaim asks whether a workload fits, are the pods
	// its checks take as gone (its victims).
	without []*corev1.Pod
	// carried are the pods the last cycle left assumed: placed, waiting
	// for their reservations or their node to settle, planned on the same
	// node for this cycle (see end).
	carried map[types.UID]placedPod
}

// placedPod is a pod placed in this cycle: assumed into the checks'
// snapshot, its volumes reserved when it has checks.
type placedPod struct {
	pod      *corev1.Pod
	node     string
	pc       *kubecheck.PodCheck
	assumed  bool
	reserved bool
}

func (s *Scheduler) newKubeChecks(c *cycle) *kubeChecks {
	if s.deps.Kube == nil {
		return nil
	}
	return &kubeChecks{k: s.deps.Kube, ctx: c.ctx, logger: c.logger, reserved: map[types.UID]placedPod{}, sent: map[types.UID]bool{},
		carried: s.kubeCarried}
}

// check returns pod's checks, nil when it needs none.
func (k *kubeChecks) check(pod *corev1.Pod) (*kubecheck.PodCheck, error) {
	if k == nil || !k.k.Needs(pod) {
		return nil, nil
	}
	if err := k.begin(); err != nil {
		return nil, err
	}
	pc, err := k.k.Check(k.ctx, pod)
	if err != nil || len(k.without) == 0 {
		return pc, err
	}
	return pc.Without(k.without), nil
}

// begin brings the checks' snapshot up to date, once per cycle.
func (k *kubeChecks) begin() error {
	if !k.began {
		k.began = true
		k.err = k.k.Begin(k.logger)
	}
	return k.err
}

// placed records pod placed on node: its volumes are reserved there (its
// checks' VolumeBinding Reserve), so the next pod placed, a member of the
// same gang included, does not pick the same volume, and it is assumed into
// the checks' snapshot (once begun). A reservation that fails fails the
// placement.
func (k *kubeChecks) placed(pod *corev1.Pod, node string, pc *kubecheck.PodCheck) error {
	if k == nil {
		return nil
	}
	pp := placedPod{pod: pod, node: node, pc: pc}
	if pc != nil {
		if err := pc.Reserve(k.ctx, node); err != nil {
			return err
		}
		pp.reserved = true
		k.reserved[pod.UID] = pp
	}
	if err := k.k.Assume(k.logger, pod, node); err != nil {
		k.logger.Error(err, "kube-scheduler's checks: assuming a placed pod", "pod", klog.KObj(pod), "node", node)
	} else {
		pp.assumed = true
	}
	k.placedPods = append(k.placedPods, pp)
	return nil
}

// mark is where a workload's placement attempt begins, for rollback.
func (k *kubeChecks) mark() int {
	if k == nil {
		return 0
	}
	return len(k.placedPods)
}

// rollback takes back the pods placed since m: their reservations and
// their place in the snapshot.
func (k *kubeChecks) rollback(m int) {
	if k == nil {
		return
	}
	for _, pp := range k.placedPods[m:] {
		if pp.reserved {
			if _, ok := k.reserved[pp.pod.UID]; ok {
				pp.pc.Unreserve(k.ctx, pp.node)
				delete(k.reserved, pp.pod.UID)
			}
		}
		if pp.assumed {
			k.k.Forget(k.logger, pp.pod)
		}
	}
	k.placedPods = k.placedPods[:m]
}

// end forgets what the cycle assumed and did not send to binding, but for
// the pods that stay planned on the same node for the next cycle (plans)
// and have no volume to check again: those stay assumed (returned, for
// the next cycle's kubeChecks). That next cycle forgets them first where
// their workload cannot keep its plan (forgetCarriedOutside), and keeps
// the other plans before it places any other workload (order), assuming
// them again, so no workload is checked with them that was checked
// without them before (a planned workload placed afresh may see those
// planned after it: they hold their nodes, as kube-scheduler's pods
// waiting in Permit do); left assumed,
// they are not put in kube-scheduler's cache and taken out again in every
// cycle they wait (AssumePod made a tenth of the coordinator's allocations
// at full size).
func (k *kubeChecks) end(next plans) map[types.UID]placedPod {
	if k == nil {
		return nil
	}
	// Placed and not sent to binding (waiting for reservations, a node
	// that settles, the bind queue): their volumes are reserved and they
	// are assumed again when they are placed in a later cycle.
	for uid, pp := range k.reserved {
		pp.pc.Unreserve(k.ctx, pp.node)
		delete(k.reserved, uid)
	}
	var carried map[types.UID]placedPod
	for _, pp := range k.placedPods {
		uid := pp.pod.UID
		if !pp.assumed || k.sent[uid] {
			continue
		}
		if plan, ok := next[uid]; ok && plan.Node == pp.node && !hasCheckedVolume(pp.pod) {
			if carried == nil {
				carried = map[types.UID]placedPod{}
			}
			carried[uid] = placedPod{pod: pp.pod, node: pp.node, assumed: true} // not its check
			continue
		}
		k.k.Forget(k.logger, pp.pod)
	}
	for uid, pp := range k.carried {
		if _, again := carried[uid]; !again && !k.sent[uid] {
			k.k.Forget(k.logger, pp.pod) // a no-op when forgotten already
		}
	}
	if k.began {
		k.k.End(k.logger)
	}
	return carried
}

// forgetCarriedOutside takes back the assumptions the last cycle left for
// pods that cannot be kept on their plans in this cycle, before any
// workload is checked: those in none of its workloads (deleted, bound,
// backing off, their gang rolled back), and those of a workload that is
// not planned whole or waits for members (plans.keep places it afresh, and
// it is not ordered before the others).
func (k *kubeChecks) forgetCarriedOutside(ws []*workload, ps plans) {
	if k == nil || len(k.carried) == 0 {
		return
	}
	in := make(map[types.UID]bool, len(k.carried))
	for _, w := range ws {
		if w.incomplete != "" || !ps.allOf(w) {
			continue
		}
		for _, p := range w.pods {
			if _, ok := k.carried[p.pod.UID]; ok {
				in[p.pod.UID] = true
			}
		}
	}
	for uid, pp := range k.carried {
		if !in[uid] {
			k.k.Forget(k.logger, pp.pod)
			delete(k.carried, uid)
		}
	}
}

// forgetCarried takes back the assumptions the last cycle left for w's
// pods (end): w is not kept on its plan this cycle (it is placed afresh, or
// not at all), and a pod is never checked with itself assumed.
func (k *kubeChecks) forgetCarried(w *workload) {
	if k == nil || len(k.carried) == 0 {
		return
	}
	for _, p := range w.pods {
		if pp, ok := k.carried[p.pod.UID]; ok {
			k.k.Forget(k.logger, pp.pod)
			delete(k.carried, p.pod.UID)
		}
	}
}

// keep assumes the pods of w placed in an earlier cycle (its kept plans) on
// their nodes; those with volumes are checked there again (their volumes
// are reserved again, which needs the check). It returns the reasons of the first pod
// whose node no longer passes, "" when every one does.
func (k *kubeChecks) keep(w *workload, ds []placement.Decision) (string, error) {
	if k == nil {
		return "", nil
	}
	m := k.mark()
	for i, d := range ds {
		p := w.pods[i].pod
		if !hasCheckedVolume(p) {
			// Checked when it was placed, and every pod placed since was
			// checked against it (it stays assumed): checked again it
			// would pay PodTopologySpread's PreFilter, a walk of every node,
			// in every cycle it waits for its reservations.
			if err := k.placed(p, d.Node, nil); err != nil {
				k.rollback(m)
				return fmt.Sprintf("pod %s: %v", p.Name, err), nil
			}
			continue
		}
		pc, err := k.check(p)
		if err != nil {
			k.rollback(m)
			return "", err
		}
		if ok, why := pc.Allows(k.ctx, d.Node); !ok {
			k.rollback(m)
			return fmt.Sprintf("pod %s no longer fits node %s: %v", p.Name, d.Node, why), nil
		}
		if err := k.placed(p, d.Node, pc); err != nil {
			k.rollback(m)
			return fmt.Sprintf("pod %s: %v", p.Name, err), nil
		}
	}
	return "", nil
}

// gate hands the volume reservations of w's pods (made as they were
// placed) to the gate their bindings pass; nil when none has volumes.
func (k *kubeChecks) gate(w *workload) *volumeGate {
	if k == nil {
		return nil
	}
	var g *volumeGate
	for _, p := range w.pods {
		pp, ok := k.reserved[p.pod.UID]
		if !ok {
			continue
		}
		delete(k.reserved, p.pod.UID)
		if g == nil {
			g = &volumeGate{}
		}
		g.pods = append(g.pods, gatedPod{uid: p.pod.UID, check: pp.pc, node: pp.node, preBind: pp.pc.NeedsPreBind(k.ctx, pp.node)})
	}
	if g == nil || !slices.ContainsFunc(g.pods, func(p gatedPod) bool { return p.preBind }) {
		// Nothing to bind first: the reservations (of volumes all bound
		// already, if any) need no gate, and taking them back is a no-op.
		return nil
	}
	return g
}

// sending records w's pods as sent to binding: they stay assumed in
// kube-scheduler's cache after the cycle, until the informer shows them
// bound or their binding fails.
func (k *kubeChecks) sending(w *workload) {
	if k == nil {
		return
	}
	for _, p := range w.pods {
		k.sent[p.pod.UID] = true
	}
}

// volumeGate binds the volumes of one workload's pods before any of them is
// bound: the first binding of the workload to reach it runs every pod's
// PreBind (kube-scheduler's VolumeBinding: write the PV and PVC bindings,
// wait for the PV controller), the others wait for it; when one fails, the
// reservations are all taken back and every pod of the workload goes back
// to pending. A gang's volumes are thus bound only once all its pods are
// placed, and before any of them runs.
type volumeGate struct {
	once sync.Once
	err  error
	pods []gatedPod
}

type gatedPod struct {
	uid     types.UID
	check   *kubecheck.PodCheck
	node    string
	preBind bool
}

// pass runs the gate once and returns its outcome.
func (g *volumeGate) pass(ctx context.Context) error {
	if g == nil {
		return nil
	}
	g.once.Do(func() {
		// In parallel, as kube-scheduler's binding goroutines run them:
		// each waits for the PV controller.
		errs := make([]error, len(g.pods))
		var wg sync.WaitGroup
		for i, p := range g.pods {
			if !p.preBind {
				continue
			}
			wg.Go(func() { errs[i] = p.check.PreBind(ctx, p.node) })
		}
		wg.Wait()
		if g.err = errors.Join(errs...); g.err != nil {
			for _, p := range g.pods {
				p.check.Unreserve(ctx, p.node)
			}
		}
	})
	return g.err
}

// unreserveAll takes back every reservation of the gate before any
// binding was sent.
func (g *volumeGate) unreserveAll(ctx context.Context) {
	if g == nil {
		return
	}
	for _, p := range g.pods {
		p.check.Unreserve(ctx, p.node)
	}
}

// unreserve takes back the reservation of one pod whose binding failed
// after the gate passed.
func (g *volumeGate) unreserve(ctx context.Context, uid types.UID) {
	if g == nil || g.err != nil {
		return // nothing passed, or all were taken back already
	}
	for _, p := range g.pods {
		if p.uid == uid {
			p.check.Unreserve(ctx, p.node)
		}
	}
}

// volumeTopology is where a new node must be for pod's volumes
// (kubecheck.Checker.VolumeTopology), for its placeholders.
func (k *kubeChecks) volumeTopology(pod *corev1.Pod) []corev1.NodeSelector {
	if k == nil || !kubecheck.PodNeeds(pod) {
		return nil
	}
	return k.k.VolumeTopology(pod)
}

// withDomains fills the domains of items that ask for capacity
// (kubecheck.Checker.DomainTopology): only those, since it counts pods.
func (k *kubeChecks) withDomains(items []placeholder.Item) []placeholder.Item {
	if k == nil {
		return items
	}
	for i := range items {
		if !kubecheck.PodNeeds(items[i].Pod) || k.begin() != nil {
			continue
		}
		items[i].Domains = k.k.DomainTopology(items[i].Pod)
	}
	return items
}

// forgetKube takes back pod's assumption in kube-scheduler's cache (its
// binding failed or was never sent).
func (s *Scheduler) forgetKube(ctx context.Context, pod *corev1.Pod) {
	if s.deps.Kube != nil {
		s.deps.Kube.Forget(klog.FromContext(ctx), pod)
	}
}

// hasCheckedVolume tells whether p has a volume kube-scheduler's volume
// plugins read.
func hasCheckedVolume(p *corev1.Pod) bool {
	for i := range p.Spec.Volumes {
		if predicates.CheckedVolume(&p.Spec.Volumes[i]) {
			return true
		}
	}
	return false
}

// podFilter is a pod's checks as placement's node filter.
type podFilter struct {
	ctx context.Context
	pc  *kubecheck.PodCheck
}

func (f podFilter) Allows(node string) (bool, []string) { return f.pc.Allows(f.ctx, node) }
