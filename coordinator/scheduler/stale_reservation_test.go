package scheduler

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/reservation"
)

// TestNoFractionOnAStaleReservationAfterItsNodeSettled: the reservation
// manager deletes an idle reservation; the pod informer's watch is broken,
// so the informer still shows the reservation, admitted, for minutes. Its
// node meanwhile loses a NoExecute taint (a missed heartbeat, say) and
// settles, out of the snapshot for NewNodeSettle. The manager must not take
// the reservation's absence from that snapshot for its deletion having
// shown: once the node settled, the stale reservation would look usable and
// a fraction would be bound at once on a GPU no reservation pod holds.
func TestNoFractionOnAStaleReservationAfterItsNodeSettled(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC))
	node := h100Node("n1", "a", 1)
	res := idleReservation()
	res.CreationTimestamp = metav1.NewTime(clk.Now().Add(-time.Hour))
	client := fake.NewSimpleClientset(res.DeepCopy())
	ro := reservation.DefaultOptions()
	ro.Grace, ro.AdmitTimeout = time.Minute, time.Hour
	rm := reservation.NewManager(client, nil, ro, clk)
	c := newClusterWith(t, Options{BindWorkers: 1, NewNodeSettle: 3 * time.Second},
		Deps{Queues: staticQueues{queueOf("q", "8")}, Clock: clk, Reserver: rm}, []*corev1.Node{node}, res)

	c.cycle() // idle from now
	clk.Step(2 * time.Minute)
	c.cycle() // idle past its grace: deleted
	if _, err := client.CoreV1().Pods(res.Namespace).Get(t.Context(), res.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the idle reservation was not deleted (get: %v)", err)
	}
	// The informer still shows it. Its node is tainted, then not: it settles.
	tainted := node.DeepCopy()
	tainted.Spec.Taints = []corev1.Taint{{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute}}
	_ = c.nodes.Update(tainted)
	clk.Step(time.Second)
	c.cycle()
	_ = c.nodes.Update(node.DeepCopy())
	clk.Step(time.Second)
	c.cycle()
	clk.Step(time.Second)
	c.cycle()
	// Settled; the informer still shows the deleted reservation.
	clk.Step(5 * time.Second)
	_ = c.pods.Add(fracPod("f1", "q", 40))
	c.cycle()
	c.cycle()
	if n := c.boundTo("f1"); n != "" {
		t.Errorf("f1 bound to %s (GPU %s), whose only reservation was deleted: no reservation pod holds the GPU", n, c.b.Annotations["f1"][api.AnnotationGPU])
	}
}
