package scheduler

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpufrac/gpufrac/coordinator/state"
)

// driftedNodes are the nodes whose Karpenter NodeClaim is Drifted
// (Deps.NodeDrifted), but for those Karpenter nominated for placeholders;
// nil when none is or Options.AvoidDriftedNodes is off.
// The snapshot leaves them out like cordoned nodes (state.Inputs.Drifted).
func (s *Scheduler) driftedNodes(nodes []*corev1.Node) map[string]bool {
	if !s.opts.AvoidDriftedNodes || s.deps.NodeDrifted == nil {
		return nil
	}
	// A drifted node Karpenter nominated for waiting placeholders, or where
	// one landed, stays usable: Karpenter buys nothing while it sees room
	// there, so the pods that asked would wait until the node is replaced,
	// which a fraction running there (do-not-disrupt) can put off forever.
	nominated := s.hints.nodes()
	var out map[string]bool
	for _, n := range nodes {
		if !nominated[n.Name] && s.deps.NodeDrifted(n.Name) {
			if out == nil {
				out = map[string]bool{}
			}
			out[n.Name] = true
		}
	}
	return out
}

// driftedSnapshot is a snapshot of the cycle's drifted nodes alone, as they
// would be were they not drifted, built once per cycle on first use; nil
// when there are none or it cannot be built. It only tells why a workload
// waits (fitsOnlyDrifted): nothing is placed there.
func (c *cycle) driftedSnapshot() *state.Snapshot {
	if c.driftBuilt {
		return c.driftSnap
	}
	c.driftBuilt = true
	drifted := c.inputs.Drifted
	if len(drifted) == 0 {
		return nil
	}
	in := c.inputs
	in.Drifted, in.Settling = nil, nil
	in.Nodes = slices.DeleteFunc(slices.Clone(c.nodes), func(n *corev1.Node) bool { return !drifted[n.Name] })
	pods, err := c.allPods()
	if err != nil {
		c.logger.Error(err, "Building the snapshot of drifted nodes")
		return nil
	}
	for _, p := range pods {
		if drifted[p.Spec.NodeName] || drifted[c.assumed[p.UID].Node] {
			in.Pods = append(in.Pods, p)
		}
	}
	snap, err := state.Build(in)
	if err != nil {
		c.logger.Error(err, "Building the snapshot of drifted nodes")
		return nil
	}
	c.driftSnap = snap
	return snap
}

// fitsOnlyDrifted tells whether w, which found no room, would fit on the
// drifted nodes, and names them: its pods then wait with
// api.ReasonDriftedNodesOnly. Nothing is kept of the trial.
func (c *cycle) fitsOnlyDrifted(w *workload) (string, bool) {
	snap := c.driftedSnapshot()
	if snap == nil {
		return "", false
	}
	cp := snap.Checkpoint()
	ds, err := c.s.place(c.dra, snap, w, nil)
	if rbErr := snap.Rollback(cp); rbErr != nil {
		c.logger.Error(rbErr, "Rolling back the snapshot of drifted nodes")
		c.driftSnap = nil
	}
	if err != nil {
		return "", false
	}
	var names []string
	for _, d := range ds {
		if !slices.Contains(names, d.Node) {
			names = append(names, d.Node)
		}
	}
	slices.Sort(names)
	return strings.Join(names, ", "), true
}

// driftedMessage is the pending message of a workload that fits only on
// drifted nodes.
func driftedMessage(nodes string, placeErr error) string {
	return fmt.Sprintf("only node(s) %s have room, and Karpenter marked them Drifted: gpufrac places nothing new there so that Karpenter can replace them; waiting for capacity elsewhere (placeholders ask Karpenter for it): %s", nodes, placeErr)
}
