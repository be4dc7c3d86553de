package e2e

import (
	"context"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpufrac/gpufrac/tests/cluster"
)

// Issue 31: a coordinator that restarts while a new node settles keeps the
// settle. The settle is 20 s here (100 ms by default), so that the restart
// falls inside it: the first coordinator is killed the moment Karpenter
// registers the node its pod waits for, and the second, which never saw
// the node's karpenter.sh/unregistered taint go, takes the registration
// time from the NodeClaim and binds the pod no earlier than the settle
// allows. Before, it bound the pod in its first cycle, a few seconds after
// the registration. Only the lower bound is asserted (the settle is what
// the coordinator guarantees), with 5 s of margin for the API's
// one-second timestamps and the polls.
func TestRestartKeepsTheSettleOfANewNode(t *testing.T) {
	t.Parallel()
	const settle = 20 * time.Second
	c := karpenterCluster(t)
	applyYAML(t, c, queuesYAML(map[string]string{"team-a": "8"}))
	args := []string{"--leader-elect=false", "--new-node-settle=" + settle.String()}
	first := startCoordinator(t, c, "c1", args...)
	create(t, c, pod("w", "team-a").GPUs(1).Obj())
	var registered time.Time
	waitFor(t, 2*time.Minute, "a NodeClaim registered", func(ctx context.Context) (bool, error) {
		l, err := c.Dynamic.Resource(cluster.NodeClaimResource()).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for i := range l.Items {
			if cluster.ConditionTrue(&l.Items[i], "Registered") {
				registered = time.Now()
				return true, nil
			}
		}
		return false, nil
	})
	first.stop(syscall.SIGKILL)
	startCoordinator(t, c, "c2", args...)
	var bound time.Time
	waitFor(t, 2*time.Minute, "w bound", func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods("default").Get(ctx, "w", metav1.GetOptions{})
		if err != nil || p.Spec.NodeName == "" {
			return false, nil
		}
		bound = time.Now()
		return true, nil
	})
	after := bound.Sub(registered)
	t.Logf("w bound %s after its node registered (settle %s, the coordinator restarted meanwhile)", after.Round(100*time.Millisecond), settle)
	if after < settle-5*time.Second {
		t.Errorf("w bound %s after its node registered, within the settle of %s", after.Round(100*time.Millisecond), settle)
	}
}
