package probes

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestServesMetricsAndProbes(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "gpufrac_test_total", Help: "A counter for the test."})
	reg.MustRegister(c)
	c.Add(3)
	var notReady atomic.Pointer[error]
	reason := errors.New("device plugins not registered with the kubelet")
	notReady.Store(&reason)
	ready := func() error {
		if e := notReady.Load(); e != nil {
			return *e
		}
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := Start(ctx, "127.0.0.1:0", reg, ready)
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + s.Addr().String()

	tests := []struct {
		name       string
		path       string
		ready      bool
		wantStatus int
		wantBody   string
	}{
		{"healthz while not ready", "/healthz", false, http.StatusOK, "ok"},
		{"readyz not ready says why", "/readyz", false, http.StatusServiceUnavailable, reason.Error()},
		{"readyz ready", "/readyz", true, http.StatusOK, "ok"},
		{"metrics has the registry", "/metrics", true, http.StatusOK, "gpufrac_test_total 3"},
		{"unknown path", "/debug/pprof/", true, http.StatusNotFound, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.ready {
				notReady.Store(nil)
			} else {
				notReady.Store(&reason)
			}
			status, body := get(t, base+tc.path)
			if status != tc.wantStatus || !strings.Contains(body, tc.wantBody) {
				t.Errorf("GET %s = %d %q, want %d containing %q", tc.path, status, body, tc.wantStatus, tc.wantBody)
			}
		})
	}

	cancel()
	done := make(chan struct{})
	go func() { s.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("server did not shut down after its context ended")
	}
	if conn, err := net.DialTimeout("tcp", s.Addr().String(), time.Second); err == nil {
		conn.Close()
		t.Errorf("%s still accepts connections after shutdown", s.Addr())
	}
}

func TestListenErrorNamesTheAddress(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = Start(context.Background(), l.Addr().String(), prometheus.NewRegistry(), func() error { return nil })
	if err == nil || !strings.Contains(err.Error(), l.Addr().String()) {
		t.Fatalf("Start on a taken address: err = %v, want one naming %s", err, l.Addr())
	}
}

func TestProfilingOnLoopbackOnly(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0", "10.1.2.3:6060", "example.com:6060", "nonsense"} {
		if _, err := StartProfiling(t.Context(), addr); err == nil {
			t.Errorf("StartProfiling(%q) served; want an error (loopback only)", addr)
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	s, err := StartProfiling(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	code, body := get(t, "http://"+s.Addr().String()+"/debug/pprof/heap?debug=1")
	if code != http.StatusOK || !strings.Contains(body, "heap profile") {
		t.Errorf("heap profile: status %d, body %.80q", code, body)
	}
	code, _ = get(t, "http://"+s.Addr().String()+"/metrics")
	if code != http.StatusNotFound {
		t.Errorf("/metrics on the profiling server: status %d, want 404 (profiles only)", code)
	}
	cancel()
	s.Wait()
}
