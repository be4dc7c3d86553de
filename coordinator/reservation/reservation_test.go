package reservation

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/predicates"
	"github.com/gpufrac/gpufrac/coordinator/state"
)

func TestNamesAreDeterministicPerAttempt(t *testing.T) {
	a, b := NameAt("node-1", "GPU-x", 0), NameAt("node-1", "GPU-x", 1)
	if a != Name("node-1", "GPU-x") || a == b || NameAt("node-1", "GPU-x", 1) != b {
		t.Errorf("names %q %q", a, b)
	}
	if NameAt("node-1", "GPU-y", 0) == a || NameAt("node-2", "GPU-x", 0) == a {
		t.Error("names collide across GPUs or nodes")
	}
	if !strings.HasPrefix(a, api.ReservationNamePrefix) || len(a) > 253 {
		t.Errorf("name %q", a)
	}
}

func TestPodHoldsTheGPUAndProtectsTheNode(t *testing.T) {
	p := PodAt("node-1", "GPU-x", 2, DefaultOptions())
	if p.Spec.NodeName != "node-1" || p.Namespace != api.ReservationNamespace || p.Annotations[api.AnnotationDoNotDisrupt] != "true" || p.Annotations[api.AnnotationGPU] != "GPU-x" {
		t.Errorf("pod %+v", p.ObjectMeta)
	}
	if q := p.Spec.Containers[0].Resources.Limits[api.ResourceGPU]; q.Value() != 1 {
		t.Errorf("GPU limit %s", q.String())
	}
	if len(p.Spec.Tolerations) != 1 || p.Spec.Tolerations[0].Operator != corev1.TolerationOpExists {
		t.Errorf("tolerations %v", p.Spec.Tolerations)
	}
	if p.Labels[api.LabelRole] != api.RoleReservation || !predicates.IsReservation(p) {
		t.Errorf("labels %v", p.Labels)
	}
}

func TestReconcileRemovesIdleReservationsAfterGrace(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	client := fake.NewSimpleClientset()
	m := NewManager(client, nil, Options{Grace: time.Minute, AdmitTimeout: time.Hour}, clk)
	ctx := t.Context()
	if err := m.Ensure(ctx, "n", "GPU-x", 0); err != nil {
		t.Fatal(err)
	}
	if err := m.Ensure(ctx, "n", "GPU-x", 0); err != nil {
		t.Fatalf("second Ensure (AlreadyExists) = %v", err)
	}
	p, err := client.CoreV1().Pods(api.ReservationNamespace).Get(ctx, Name("n", "GPU-x"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.CreationTimestamp = metav1.NewTime(clk.Now())
	key := state.NodeGPU{Node: "n", GPU: "GPU-x"}
	busy := map[state.NodeGPU]*state.Reservation{key: {Pod: p, Ready: true, Fractions: 1}}
	idle := map[state.NodeGPU]*state.Reservation{key: {Pod: p, Ready: true}}
	reg := prometheus.NewRegistry()
	if err := m.Register(reg); err != nil {
		t.Fatal(err)
	}
	if n := m.Reconcile(ctx, busy, nil, nil); n != 0 {
		t.Fatalf("removed %d busy reservations", n)
	}
	if got := testutil.ToFloat64(m.metrics.reservations.WithLabelValues(stateInUse)); got != 1 {
		t.Errorf("gpufrac_reservations{state=in_use} = %v, want 1", got)
	}
	m.Reconcile(ctx, idle, nil, nil) // idle from now
	clk.Step(59 * time.Second)
	if n := m.Reconcile(ctx, idle, nil, nil); n != 0 {
		t.Fatalf("removed within the grace period")
	}
	want := `
# HELP gpufrac_reservation_idle_max_seconds How long the longest-idle reservation pod has held its GPU without any fraction; it is removed after --reservation-grace, so a value well beyond it means reservations are not cleaned up.
# TYPE gpufrac_reservation_idle_max_seconds gauge
gpufrac_reservation_idle_max_seconds 59
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "gpufrac_reservation_idle_max_seconds"); err != nil {
		t.Error(err)
	}
	if got := testutil.ToFloat64(m.metrics.reservations.WithLabelValues(stateIdle)); got != 1 {
		t.Errorf("gpufrac_reservations{state=idle} = %v, want 1", got)
	}
	if n := m.Reconcile(ctx, idle, map[state.NodeGPU]bool{key: true}, nil); n != 0 {
		t.Fatalf("removed a reservation fractions are being placed on")
	}
	m.Reconcile(ctx, idle, nil, nil) // wanted reset the idle clock
	clk.Step(61 * time.Second)
	if n := m.Reconcile(ctx, idle, nil, nil); n != 1 {
		t.Fatalf("removed %d after the grace period, want 1", n)
	}
	if _, err := client.CoreV1().Pods(api.ReservationNamespace).Get(ctx, p.Name, metav1.GetOptions{}); err == nil {
		t.Error("reservation pod still exists")
	}
}

// TestRemovedReservationsAreReportedUntilGone: a reservation Reconcile
// deleted may still be in the informer's cache, as it was, in the next
// cycles. Removing names it until a Reconcile no longer sees it, so that
// no fraction is bound on its GPU meanwhile, and it is not deleted again.
func TestRemovedReservationsAreReportedUntilGone(t *testing.T) {
	m, _, _, p := ensured(t, Options{Grace: time.Minute, AdmitTimeout: time.Hour})
	ctx := t.Context()
	p.UID = "res-uid"
	key := state.NodeGPU{Node: "n", GPU: "GPU-x"}
	// The node is gone: removed at once.
	lost := map[state.NodeGPU]*state.Reservation{key: {Pod: p, Ready: true, Orphaned: "node n no longer exists", NodeGone: true, NodeLost: true}}
	if n := m.Reconcile(ctx, lost, nil, nil); n != 1 {
		t.Fatalf("removed %d, want 1", n)
	}
	if got := m.Removing(); !got["res-uid"] {
		t.Errorf("Removing() = %v right after the deletion, want res-uid", got)
	}
	// The informer still shows it: not deleted twice, still reported.
	if n := m.Reconcile(ctx, lost, nil, nil); n != 0 {
		t.Errorf("deleted again (%d) while the informer lags", n)
	}
	if got := m.Removing(); !got["res-uid"] {
		t.Errorf("Removing() = %v while the informer still shows it, want res-uid", got)
	}
	// Gone from the informer: forgotten.
	m.Reconcile(ctx, map[state.NodeGPU]*state.Reservation{}, nil, nil)
	if got := m.Removing(); len(got) != 0 {
		t.Errorf("Removing() = %v once it is gone, want none", got)
	}
}

// TestEmptyNodeGrace: an idle reservation on a node whose GPUs run nothing
// else goes after EmptyNodeGrace - at once when it is 0 - while one on a
// node with GPU work waits out Grace; a negative EmptyNodeGrace keeps
// Grace everywhere.
func TestEmptyNodeGrace(t *testing.T) {
	tests := []struct {
		name      string
		emptyNode time.Duration
		nodeIdle  bool
		// removedAfter is when the reservation goes, counted from the
		// first Reconcile that sees it idle.
		removedAfter time.Duration
	}{
		{name: "idle node", emptyNode: 5 * time.Second, nodeIdle: true, removedAfter: 5 * time.Second},
		{name: "idle node, no grace", emptyNode: 0, nodeIdle: true, removedAfter: 0},
		{name: "GPU work elsewhere on the node", emptyNode: 5 * time.Second, removedAfter: time.Minute},
		{name: "empty-node grace off", emptyNode: -1, nodeIdle: true, removedAfter: time.Minute},
		{name: "empty-node grace longer than grace", emptyNode: 2 * time.Minute, nodeIdle: true, removedAfter: time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, client, clk, p := ensured(t, Options{Grace: time.Minute, EmptyNodeGrace: tt.emptyNode, AdmitTimeout: time.Hour})
			ctx := t.Context()
			p.CreationTimestamp = metav1.NewTime(clk.Now())
			key := state.NodeGPU{Node: "n", GPU: "GPU-x"}
			rs := map[state.NodeGPU]*state.Reservation{key: {Pod: p, Ready: true, NodeIdle: tt.nodeIdle}}
			removed := func() bool {
				m.Reconcile(ctx, rs, nil, nil)
				_, err := client.CoreV1().Pods(api.ReservationNamespace).Get(ctx, p.Name, metav1.GetOptions{})
				return err != nil
			}
			if tt.removedAfter > 0 {
				if removed() {
					t.Fatal("removed the moment it went idle")
				}
				clk.Step(tt.removedAfter - time.Millisecond)
				if removed() {
					t.Fatalf("removed before %s", tt.removedAfter)
				}
				clk.Step(time.Millisecond)
			}
			if !removed() {
				t.Fatalf("still there %s after it went idle", tt.removedAfter)
			}
		})
	}
}

// ensured is a manager with options o on a fake clock and API, and the
// reservation pod of GPU-x on node n it created, as the API returns it.
func ensured(t *testing.T, o Options) (*Manager, *fake.Clientset, *clocktesting.FakeClock, *corev1.Pod) {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	client := fake.NewSimpleClientset()
	m := NewManager(client, nil, o, clk)
	if err := m.Ensure(t.Context(), "n", "GPU-x", 0); err != nil {
		t.Fatal(err)
	}
	p, err := client.CoreV1().Pods(api.ReservationNamespace).Get(t.Context(), Name("n", "GPU-x"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return m, client, clk, p
}
