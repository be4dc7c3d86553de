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
	"net/http/pprof"
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
	return serve(ctx, addr, mux, "metrics and probes")
}

// serve listens on addr and serves mux until ctx ends; what names the
// endpoints in errors.
func serve(ctx context.Context, addr string, mux *http.ServeMux, what string) (*Server, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening for %s on %s: %w", what, addr, err)
	}
	// WriteTimeout stays unset: a CPU profile or trace streams for as long
	// as it was asked to run.
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	s := &Server{addr: lis.Addr(), done: make(chan struct{})}
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.FromContext(ctx).Error(err, "HTTP server stopped", "serving", what)
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

// StartProfiling serves Go's runtime profiles (net/http/pprof: CPU, heap,
// goroutines, ...) on addr until ctx ends. addr must be a loopback address:
// a profile shows the process's memory and code paths, so it is for a
// person on the machine (kubectl port-forward on a cluster), never for the
// network. The mains start it only when asked (a flag that is empty by
// default).
func StartProfiling(ctx context.Context, addr string) (*Server, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("profiling address %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, fmt.Errorf("profiling address %q: profiles are served on loopback only (127.0.0.1, ::1 or localhost)", addr)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return serve(ctx, addr, mux, "profiling")
}
