package app

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
)

// leaseServer is an API server that knows one Lease and answers every other
// request NotFound.
type leaseServer struct {
	mu    sync.Mutex
	lease *coordinationv1.Lease
}

func (s *leaseServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	s.mu.Lock()
	defer s.mu.Unlock()
	const leases = "/apis/coordination.k8s.io/v1/namespaces/gpufrac-system/leases"
	notFound := func() {
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(&apierrors.NewNotFound(schema.GroupResource{}, r.URL.Path).ErrStatus)
	}
	switch {
	case r.Method == http.MethodGet && r.URL.Path == leases+"/coord":
		if s.lease == nil {
			notFound()
			return
		}
	case (r.Method == http.MethodPost && r.URL.Path == leases) ||
		(r.Method == http.MethodPut && r.URL.Path == leases+"/coord"):
		l := &coordinationv1.Lease{}
		if err := json.NewDecoder(r.Body).Decode(l); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		l.ResourceVersion = time.Now().Format(time.RFC3339Nano)
		s.lease = l
		if r.Method == http.MethodPost {
			w.WriteHeader(http.StatusCreated)
		}
	default:
		notFound()
		return
	}
	_ = json.NewEncoder(w).Encode(s.lease)
}

// TestLeaseIsKeptWhileBindingsWaitForTheClient: the lease is taken and
// renewed through a client of its own. Through the client bindings use, a
// renewal waits behind every request queued in its rate limiter, and a burst
// of bindings longer than the renew deadline loses the lease (seen on the
// test bed at 200 QPS under load: TestScale's coordinator stepped down
// mid-burst).
func TestLeaseIsKeptWhileBindingsWaitForTheClient(t *testing.T) {
	srv := httptest.NewServer(&leaseServer{})
	defer srv.Close()
	cfg := Config{LeaderElect: true, LeaseNamespace: "gpufrac-system", LeaseName: "coord", Identity: "me",
		LeaseDuration: 4 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: 200 * time.Millisecond,
		QPS: 2, Burst: 1}
	a, err := New(cfg, &rest.Config{Host: srv.URL, ContentConfig: rest.ContentConfig{ContentType: "application/json"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// 40 requests queue in the shared client's rate limiter: 20 s of them at 2 QPS.
	for i := 0; i < 40; i++ {
		go func() { _, _ = a.client.CoreV1().Pods("bench").Get(ctx, "p", metav1.GetOptions{}) }()
	}
	time.Sleep(100 * time.Millisecond)

	leading := make(chan struct{})
	a.leadFn = func(ctx context.Context) error {
		close(leading)
		<-ctx.Done()
		return nil
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	select {
	case <-leading:
	case err := <-done:
		t.Fatalf("Run ended before leading: %v", err)
	case <-time.After(10 * time.Second):
		// The queue on the shared client lasts 20 s; the lease's own client needs about 1 s.
		t.Fatal("not leading 10 s after the start while the shared client's rate limiter was busy: the lease waits behind bindings")
	}
	// Still leading after more than a renew deadline, the queue not yet drained.
	select {
	case err := <-done:
		t.Fatalf("lost the lease while the shared client's rate limiter was busy: %v", err)
	case <-time.After(2 * cfg.RenewDeadline):
	}
	if !a.Leading() {
		t.Error("not leading any more")
	}
	cancel()
	if err := <-done; err != nil && !strings.Contains(err.Error(), "context canceled") {
		t.Errorf("Run after cancel = %v", err)
	}
}
