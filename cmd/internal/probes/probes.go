// Package probes serves the HTTP endpoints every gpufrac daemon exposes:
// /metrics for Prometheus, /healthz (the process answers) and /readyz (the
// daemon can do its work). The mains start it; the daemons only say whether
// they are ready and what they measure.
package probes

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/klog/v2"
)

// Server is a running probe server.
type Server struct {
	addr net.Addr
	done chan struct{}
}

// Start listens on addr and serves until ctx ends. The registry also gets
// the handler's own error counter. ready returns nil when the
// daemon is ready, or the reason it is not, which /readyz answers with 503.
func Start(ctx context.Context, addr string, reg *prometheus.Registry, ready func() error) (*Server, error) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening for metrics and probes on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	s := &Server{addr: lis.Addr(), done: make(chan struct{})}
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.FromContext(ctx).Error(err, "Metrics and probe server stopped")
		}
	}()
	go func() {
		defer close(s.done)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-served
	}()
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.addr }

// Wait blocks until the server has shut down after its context ended.
func (s *Server) Wait() { <-s.done }
