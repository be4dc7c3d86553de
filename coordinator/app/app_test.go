package app

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpufrac/gpufrac/tests/apitest"
)

// testApp is an App on a fake clientset whose work under the lease is work.
func testApp(t *testing.T, work func(ctx context.Context) error) (*App, *fake.Clientset) {
	t.Helper()
	client := fake.NewSimpleClientset()
	a := &App{
		cfg: Config{LeaderElect: true, LeaseNamespace: "gpufrac-system", LeaseName: "coord", Identity: "me",
			LeaseDuration: 2 * time.Second, RenewDeadline: time.Second, RetryPeriod: 100 * time.Millisecond},
		client: client, election: client, reg: prometheus.NewRegistry(), leadFn: work,
	}
	return a, client
}

// holder reads the Lease's holder ("" when released or absent).
func holder(ctx context.Context, client *fake.Clientset) string {
	l, err := client.CoordinationV1().Leases("gpufrac-system").Get(ctx, "coord", metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// TestWorkStopsBeforeTheLeaseIsReleased: on shutdown everything under the
// lease stops before the lease is given up (the client-go leader-election
// example's warning); released earlier, another replica could lead while
// this one still binds.
func TestWorkStopsBeforeTheLeaseIsReleased(t *testing.T) {
	started := make(chan struct{})
	releasedWhileWorking := make(chan bool, 1)
	var client *fake.Clientset
	a, client := testApp(t, func(ctx context.Context) error {
		close(started)
		<-ctx.Done()
		// Stopping takes a moment (bindings in flight): the lease must be
		// held all that time.
		deadline := time.Now().Add(300 * time.Millisecond)
		for time.Now().Before(deadline) {
			if holder(context.Background(), client) == "" {
				releasedWhileWorking <- true
				return nil
			}
			time.Sleep(10 * time.Millisecond)
		}
		releasedWhileWorking <- false
		return nil
	})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("never started leading")
	}
	if h := holder(t.Context(), client); h != "me" {
		t.Fatalf("lease holder %q while leading, want me", h)
	}
	cancel()
	waitRunReturnsNil(t, done)
	if <-releasedWhileWorking {
		t.Error("the lease was released while the work under it was still stopping")
	}
	if h := holder(t.Context(), client); h != "" {
		t.Errorf("lease holder %q after Run returned, want released", h)
	}
}

// TestRunReturnsWhenTheWorkFails: work under the lease that fails (the
// informers cannot start, say) ends Run with its error, instead of the
// replica renewing a lease it does nothing with.
func TestRunReturnsWhenTheWorkFails(t *testing.T) {
	boom := errors.New("informers failed")
	a, client := testApp(t, func(context.Context) error { return boom })
	done := make(chan error, 1)
	go func() { done <- a.Run(t.Context()) }()
	select {
	case err := <-done:
		if !errors.Is(err, boom) {
			t.Errorf("Run = %v, want the work's error", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run still running 5 s after the work under the lease failed")
	}
	if h := holder(t.Context(), client); h != "" {
		t.Errorf("lease holder %q after the work failed, want released", h)
	}
	if a.Leading() {
		t.Error("Leading() after Run returned")
	}
}

// TestLosingTheLeaseStopsTheWorkAndFails: this replica cannot renew its
// lease in time (another one will take it): the work stops, and Run returns
// an error only after it has, so the process restarts with nothing running.
func TestLosingTheLeaseStopsTheWorkAndFails(t *testing.T) {
	started := make(chan struct{})
	var stopped atomic.Bool
	a, client := testApp(t, func(ctx context.Context) error {
		close(started)
		<-ctx.Done()
		time.Sleep(50 * time.Millisecond) // stopping takes a moment
		stopped.Store(true)
		return nil
	})
	renewals := apitest.Install(&client.Fake, "update", "leases", "")
	done := make(chan error, 1)
	go func() { done <- a.Run(t.Context()) }()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("never started leading")
	}
	// The API server refuses every renewal from now on (this replica was
	// partitioned away; another one takes over once the lease expires).
	renewals.FailNext(1_000_000, apierrors.NewServiceUnavailable("partitioned"))
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "lost the lease") {
			t.Errorf("Run = %v, want an error saying the lease was lost", err)
		}
		if !stopped.Load() {
			t.Error("Run returned before the work under the lease had stopped")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run still running 10 s after another replica took the lease")
	}
}

// waitRunReturnsNil waits for Run, whose context was just cancelled, to
// return nil on done within 10 s.
func waitRunReturnsNil(t *testing.T, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run after cancel = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10 s of its context ending")
	}
}
