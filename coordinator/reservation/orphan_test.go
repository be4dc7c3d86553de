package reservation

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/state"
	"github.com/gpufrac/gpufrac/tests/apitest"
)

// TestReconcileRemovesOrphanedReservations: a reservation the coordinator
// can no longer use goes as soon as no fraction runs on its GPU, without
// waiting for the grace period; on a lost node (gone, not Ready) without a
// graceful period, since no kubelet would confirm it; on a node that is
// gone even with fractions on it, since nothing runs there.
func TestReconcileRemovesOrphanedReservations(t *testing.T) {
	tests := []struct {
		name        string
		r           state.Reservation
		wantRemoved bool
		wantGrace   *int64 // the deletion's grace period (nil: the pod's own)
	}{
		{name: "GPU switched to MIG, idle", r: state.Reservation{Ready: true, Orphaned: "GPU g on n is in mode mig"}, wantRemoved: true},
		{name: "GPU switched to MIG, a fraction still runs", r: state.Reservation{Ready: true, Fractions: 1, Orphaned: "GPU g on n is in mode mig"}},
		{name: "node cordoned, idle", r: state.Reservation{Ready: true, Orphaned: "node n is cordoned"}, wantRemoved: true},
		{name: "node not Ready, idle", r: state.Reservation{Ready: true, Orphaned: "node n is not Ready", NodeLost: true}, wantRemoved: true, wantGrace: new(int64)},
		{name: "node not Ready, a fraction may still run", r: state.Reservation{Ready: true, Fractions: 1, Orphaned: "node n is not Ready", NodeLost: true}},
		{name: "node gone, fractions listed on it", r: state.Reservation{Ready: true, Fractions: 2, Orphaned: "node n no longer exists", NodeLost: true, NodeGone: true}, wantRemoved: true, wantGrace: new(int64)},
		{name: "usable and idle: the grace period applies", r: state.Reservation{Ready: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
			p := Pod("n", "g", DefaultOptions())
			p.UID = "uid-r"
			p.CreationTimestamp = metav1.NewTime(clk.Now())
			client := fake.NewSimpleClientset(p)
			client.ClearActions()
			events := record.NewFakeRecorder(2)
			m := NewManager(client, events, Options{Grace: time.Minute, AdmitTimeout: time.Hour}, clk)
			r := tt.r
			r.Pod = p
			got := m.Reconcile(t.Context(), map[state.NodeGPU]*state.Reservation{{Node: "n", GPU: "g"}: &r}, nil, nil)
			if want := map[bool]int{true: 1}[tt.wantRemoved]; got != want {
				t.Fatalf("removed %d, want %d", got, want)
			}
			if !tt.wantRemoved {
				return
			}
			var opts *metav1.DeleteOptions
			for _, a := range client.Actions() {
				if d, ok := a.(clienttesting.DeleteActionImpl); ok {
					o := d.GetDeleteOptions()
					opts = &o
				}
			}
			if opts == nil {
				t.Fatal("no delete request")
			}
			if diff := cmp.Diff(tt.wantGrace, opts.GracePeriodSeconds); diff != "" {
				t.Errorf("grace period (-want +got):\n%s", diff)
			}
			if opts.Preconditions == nil || opts.Preconditions.UID == nil || *opts.Preconditions.UID != "uid-r" {
				t.Errorf("delete preconditions %+v, want the reservation's UID", opts.Preconditions)
			}
			if e := <-events.Events; e != fmt.Sprintf("Normal ReservationRemoved orphaned: %s", tt.r.Orphaned) {
				t.Errorf("event %q", e)
			}
		})
	}
}

// TestAPIFailuresAreRetried: a reservation create or delete the API server
// refuses once is reported (create) or left for the next reconcile
// (delete), and succeeds then.
func TestAPIFailuresAreRetried(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	client := fake.NewSimpleClientset()
	unavailable := apierrors.NewServiceUnavailable("the API server is restarting")
	creates := apitest.FailOnce(&client.Fake, "create", "pods", "", unavailable)
	deletes := apitest.FailOnce(&client.Fake, "delete", "pods", "", unavailable)
	m := NewManager(client, nil, Options{Grace: time.Minute, AdmitTimeout: time.Hour}, clk)
	ctx := t.Context()
	if err := m.Ensure(ctx, "n", "g", 0); !errors.Is(err, unavailable) || creates.Fired() != 1 {
		t.Fatalf("first Ensure = %v, want the injected error", err)
	}
	if err := m.Ensure(ctx, "n", "g", 0); err != nil {
		t.Fatalf("second Ensure = %v", err)
	}
	p, err := client.CoreV1().Pods(api.ReservationNamespace).Get(ctx, Name("n", "g"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rs := map[state.NodeGPU]*state.Reservation{{Node: "n", GPU: "g"}: {Pod: p, Ready: true, Orphaned: "node n is cordoned"}}
	if n := m.Reconcile(ctx, rs, nil, nil); n != 0 || deletes.Fired() != 1 {
		t.Fatalf("first reconcile removed %d (delete failures injected %d), want 0 and 1", n, deletes.Fired())
	}
	if n := m.Reconcile(ctx, rs, nil, nil); n != 1 {
		t.Fatalf("second reconcile removed %d, want 1", n)
	}
	if _, err := client.CoreV1().Pods(api.ReservationNamespace).Get(ctx, p.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the reservation still exists: %v", err)
	}
}

// TestRemoveFailed: reservation pods the kubelet rejected are deleted, with
// an event saying why; one already gone counts as removed.
func TestRemoveFailed(t *testing.T) {
	p := Pod("n", "g", DefaultOptions())
	p.UID = "uid-f"
	p.Status.Phase, p.Status.Message = corev1.PodFailed, "Pod was rejected: requested number of devices unavailable"
	gone := PodAt("n", "g", 1, DefaultOptions())
	client := fake.NewSimpleClientset(p)
	events := record.NewFakeRecorder(2)
	m := NewManager(client, events, DefaultOptions(), nil)
	if n := m.RemoveFailed(t.Context(), []*corev1.Pod{p, gone}); n != 2 {
		t.Errorf("removed %d, want 2", n)
	}
	if _, err := client.CoreV1().Pods(api.ReservationNamespace).Get(t.Context(), p.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the failed reservation still exists: %v", err)
	}
	if e := <-events.Events; e != "Normal ReservationRemoved reservation failed on n: "+p.Status.Message {
		t.Errorf("event %q", e)
	}
}

// TestRemovalsInBackground: with RemoveInBackground, Reconcile and
// RemoveFailed return before the API server answers; the reservation is in
// Removing from then on (no fraction on its GPU), is not deleted twice while
// its deletion runs, and a deletion that fails leaves Removing so that the
// next Reconcile decides again.
func TestRemovalsInBackground(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	p := Pod("n", "g", DefaultOptions())
	p.UID = "uid-r"
	failed := PodAt("n", "g", 1, DefaultOptions())
	failed.UID, failed.Status.Phase = "uid-f", corev1.PodFailed
	client := fake.NewSimpleClientset(p, failed)
	unavailable := apierrors.NewServiceUnavailable("the API server is restarting")
	failOnce := apitest.FailOnce(&client.Fake, "delete", "pods", "", unavailable)
	release := make(chan struct{})
	deletes := 0
	var mu sync.Mutex
	// Runs before the injected failure: every delete waits for release.
	client.PrependReactor("delete", "pods", func(clienttesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		deletes++
		mu.Unlock()
		<-release // the API server is slow
		return false, nil, nil
	})
	m := NewManager(client, nil, Options{Grace: time.Minute, AdmitTimeout: time.Hour}, clk)
	m.RemoveInBackground(4)
	ctx := t.Context()
	rs := map[state.NodeGPU]*state.Reservation{{Node: "n", GPU: "g"}: {Pod: p, Ready: true, Orphaned: "node n is cordoned"}}

	// Both return at once, the API server still holding the deletions.
	if n := m.Reconcile(ctx, rs, nil, nil); n != 1 {
		t.Fatalf("Reconcile handed %d reservations to deletion, want 1", n)
	}
	if n := m.RemoveFailed(ctx, []*corev1.Pod{failed}); n != 1 {
		t.Fatalf("RemoveFailed handed %d reservations to deletion, want 1", n)
	}
	if !m.Removing()["uid-r"] {
		t.Errorf("Removing() = %v while its deletion runs, want uid-r", m.Removing())
	}
	if n := m.Reconcile(ctx, rs, nil, nil); n != 0 {
		t.Errorf("deleted again (%d) while its deletion runs", n)
	}
	if n := m.RemoveFailed(ctx, []*corev1.Pod{failed}); n != 0 {
		t.Errorf("failed reservation deleted again (%d) while its deletion runs", n)
	}
	close(release)
	m.Wait()
	// The first delete the API server answered failed (injected), the other
	// went through: one reservation is left, out of Removing.
	if failOnce.Fired() != 1 {
		t.Fatalf("injected delete failures: %d, want 1", failOnce.Fired())
	}
	left, err := client.CoreV1().Pods(api.ReservationNamespace).List(ctx, metav1.ListOptions{})
	if err != nil || len(left.Items) != 1 {
		t.Fatalf("pods left: %v (err %v), want 1", left, err)
	}
	if m.Removing()[left.Items[0].UID] {
		t.Errorf("Removing() = %v after its deletion failed, want it out", m.Removing())
	}
	// The next Reconcile (or RemoveFailed) decides again, and it goes.
	for _, pod := range []*corev1.Pod{p, failed} {
		if pod.UID != left.Items[0].UID {
			continue
		}
		if pod == p {
			if n := m.Reconcile(ctx, rs, nil, nil); n != 1 {
				t.Errorf("Reconcile after the failure handed %d, want 1", n)
			}
		} else if n := m.RemoveFailed(ctx, []*corev1.Pod{failed}); n != 1 {
			t.Errorf("RemoveFailed after the failure handed %d, want 1", n)
		}
	}
	m.Wait()
	if left, err := client.CoreV1().Pods(api.ReservationNamespace).List(ctx, metav1.ListOptions{}); err != nil || len(left.Items) != 0 {
		t.Errorf("pods left after the retry: %d (err %v)", len(left.Items), err)
	}
	mu.Lock()
	defer mu.Unlock()
	if deletes != 3 {
		t.Errorf("%d deletes reached the API server, want 3 (two, one failed and retried)", deletes)
	}
}
