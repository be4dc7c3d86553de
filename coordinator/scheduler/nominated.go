package scheduler

import (
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/placeholder"
)

// karpenterNominated is the reason of Karpenter's event on a pod it has
// planned capacity for ("Pod should schedule on: nodeclaim/x, node/y").
const karpenterNominated = "Nominated"

// NodeClaimNodes resolves a Karpenter NodeClaim name to the node it became
// ("" while it has none).
type NodeClaimNodes func(nodeClaim string) string

// NodeRegistrations tells when Karpenter registered a node: the latest
// lastTransitionTime of its NodeClaim's Registered and Initialized
// conditions, zero when no NodeClaim names the node or neither is True.
type NodeRegistrations func(node string) time.Time

// NodeDrift tells whether a Karpenter NodeClaim of a node has the condition
// Drifted=True. NodeClaims are Karpenter's to write: tenants cannot mark a
// node drifted.
type NodeDrift func(node string) bool

// OnEvent is the event informer's handler: Karpenter's Nominated events on
// placeholder pods name the node (or NodeClaim) it plans for them; those
// nodes become a preference for the placeholders' group.
func (s *Scheduler) OnEvent(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	ev, ok := obj.(*corev1.Event)
	if !ok || ev.Reason != karpenterNominated || ev.InvolvedObject.Kind != "Pod" ||
		ev.InvolvedObject.Namespace != api.ReservationNamespace || !strings.HasPrefix(ev.InvolvedObject.Name, placeholder.NamePrefix) {
		return
	}
	nodes, claims := parseNomination(ev.Message)
	group := groupOfPlaceholderName(ev.InvolvedObject.Name)
	if group == "" {
		return
	}
	s.hints.nominated(group, nodes, claims)
	s.Wake()
}

// parseNomination reads "Pod should schedule on: nodeclaim/a, node/b".
func parseNomination(msg string) (nodes, claims []string) {
	_, list, ok := strings.Cut(msg, ":")
	if !ok {
		return nil, nil
	}
	for _, f := range strings.Split(list, ",") {
		f = strings.TrimSpace(f)
		switch {
		case strings.HasPrefix(f, "node/"):
			nodes = append(nodes, strings.TrimPrefix(f, "node/"))
		case strings.HasPrefix(f, "nodeclaim/"):
			claims = append(claims, strings.TrimPrefix(f, "nodeclaim/"))
		}
	}
	return nodes, claims
}

// groupOfPlaceholderName extracts the group hash from "gpufrac-placeholder-<group>-<i>".
func groupOfPlaceholderName(name string) string {
	rest := strings.TrimPrefix(name, placeholder.NamePrefix)
	i := strings.LastIndex(rest, "-")
	if i <= 0 {
		return ""
	}
	return rest[:i]
}
