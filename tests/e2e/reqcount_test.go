package e2e

import (
	"bytes"
	"encoding/pem"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// countingProxy stands between one scheduler and the API server and counts
// its requests, as the audit log would by user: one per request (a watch
// when it starts), by "verb resource[/subresource]". The scale benchmark
// counted requests from the API server's audit log until the full-size run
// of 2026-11-24 found only 6,088 of kube-scheduler's 50,000 bindings there
// (docs/benchmarks-history.md, "Scale"); a count on the wire does not depend on the
// API server keeping up with its log. The proxy speaks HTTP/2 over TLS on
// loopback to the scheduler, as the API server does: over plain HTTP/1.1 a
// client opens one connection per request in flight beyond its idle pool,
// and the coordinator's run at full size dialed tens of thousands of them
// (a few per cent of what it allocated, and their goroutines). The proxy
// adds the scheduler's own bearer token (from its kubeconfig) toward the API
// server: the API server sees the same user as without the proxy.
type countingProxy struct {
	srv *httptest.Server
	// kubeconfig is the scheduler's kubeconfig pointing at the proxy.
	kubeconfig string

	mu      sync.Mutex
	counts  requestCounts
	stopped bool // take was called: later requests are not counted
}

// startCountingProxy starts a proxy for the API server that kubeconfig
// names and writes a copy of kubeconfig that goes through it.
func startCountingProxy(t *testing.T, kubeconfig string) *countingProxy {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	kctx := cfg.Contexts[cfg.CurrentContext]
	if kctx == nil || cfg.Clusters[kctx.Cluster] == nil {
		t.Fatalf("kubeconfig %s names no cluster in its current context", kubeconfig)
	}
	cl := cfg.Clusters[kctx.Cluster]
	auth := cfg.AuthInfos[kctx.AuthInfo]
	if auth == nil || auth.Token == "" {
		t.Fatalf("kubeconfig %s has no token in its current context", kubeconfig)
	}
	bearer := "Bearer " + auth.Token
	target, err := url.Parse(cl.Server)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := rest.TransportFor(&rest.Config{Host: cl.Server, TLSClientConfig: rest.TLSClientConfig{CAData: cl.CertificateAuthorityData}})
	if err != nil {
		t.Fatal(err)
	}
	p := &countingProxy{counts: requestCounts{byKind: map[string]int{}, failed: map[string]int{}, reasons: map[string]int{}}}
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.Out.Header.Set("Authorization", bearer)
		},
		Transport:     rt,
		FlushInterval: -1, // watches stream
		ModifyResponse: func(resp *http.Response) error {
			if resp.StatusCode >= 300 {
				p.countFailed(resp.Request, resp.StatusCode)
			}
			return nil
		},
	}
	p.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.count(r)
		rp.ServeHTTP(w, r)
	}))
	p.srv.EnableHTTP2 = true
	p.srv.StartTLS()
	t.Cleanup(func() {
		p.srv.CloseClientConnections()
		p.srv.Close()
	})
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.srv.Certificate().Raw})
	cl.Server, cl.CertificateAuthorityData, cl.CertificateAuthority = p.srv.URL, ca, ""
	auth.Token = ""
	p.kubeconfig = filepath.Join(t.TempDir(), "kubeconfig-proxied")
	if err := clientcmd.WriteToFile(*cfg, p.kubeconfig); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *countingProxy) count(r *http.Request) {
	kind := requestKind(r)
	reason := ""
	if kind == "patch pods/status" && r.Body != nil {
		// Which pending reason the scheduler wrote (the body is small).
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		r.Body.Close()
		r.Body = io.NopCloser(bytes.NewReader(body))
		if m := patchReason.FindSubmatch(body); err == nil && m != nil {
			reason = kind + " " + string(m[1])
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return
	}
	if reason != "" {
		p.counts.reasons[reason]++
	}
	p.counts.byKind[kind]++
	p.counts.total++
	if kind == "create pods/binding" {
		p.counts.bindings++
	}
}

// patchReason finds the reason a status patch writes.
var patchReason = regexp.MustCompile(`"reason":"([A-Za-z]+)"`)

// countFailed counts an answer that was not a success (a create that met
// AlreadyExists, a delete of a pod gone).
func (p *countingProxy) countFailed(r *http.Request, code int) {
	kind := fmt.Sprintf("%s %d", requestKind(r), code)
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.stopped {
		p.counts.failed[kind]++
	}
}

// take returns the requests counted so far and stops counting.
func (p *countingProxy) take() requestCounts {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopped = true
	out := p.counts
	out.byKind = make(map[string]int, len(p.counts.byKind))
	for k, v := range p.counts.byKind {
		out.byKind[k] = v
	}
	out.failed = maps.Clone(p.counts.failed)
	out.reasons = maps.Clone(p.counts.reasons)
	return out
}

// requestKind names a request as the audit log's verb and objectRef do:
// "create pods/binding", "watch pods", "patch pods/status", "get /version".
func requestKind(r *http.Request) string {
	segs := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	var rest []string
	switch {
	case len(segs) > 2 && segs[0] == "api":
		rest = segs[2:]
	case len(segs) > 3 && segs[0] == "apis":
		rest = segs[3:]
	default:
		return strings.ToLower(r.Method) + " " + r.URL.Path
	}
	if len(rest) > 2 && rest[0] == "namespaces" {
		rest = rest[2:]
	}
	resource, named := rest[0], len(rest) > 1
	if len(rest) > 2 {
		resource += "/" + rest[2]
	}
	var verb string
	switch r.Method {
	case http.MethodGet:
		switch w := r.URL.Query().Get("watch"); {
		case w == "true" || w == "1":
			verb = "watch"
		case named:
			verb = "get"
		default:
			verb = "list"
		}
	case http.MethodPost:
		verb = "create"
	case http.MethodPut:
		verb = "update"
	case http.MethodPatch:
		verb = "patch"
	case http.MethodDelete:
		verb = "delete"
		if !named {
			verb = "deletecollection"
		}
	default:
		verb = strings.ToLower(r.Method)
	}
	return verb + " " + resource
}

// TestRequestKind: requests are named as the audit log names them.
func TestRequestKind(t *testing.T) {
	for _, tc := range []struct{ method, url, want string }{
		{"POST", "/api/v1/namespaces/bench/pods/p-1/binding", "create pods/binding"},
		{"GET", "/api/v1/pods?limit=500&resourceVersion=0", "list pods"},
		{"GET", "/api/v1/pods?allowWatchBookmarks=true&watch=true", "watch pods"},
		{"GET", "/api/v1/namespaces/bench", "get namespaces"},
		{"GET", "/api/v1/namespaces", "list namespaces"},
		{"PATCH", "/api/v1/namespaces/bench/pods/p-1/status", "patch pods/status"},
		{"POST", "/apis/events.k8s.io/v1/namespaces/bench/events", "create events"},
		{"PUT", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/x", "update leases"},
		{"PATCH", "/apis/gpufrac.io/v1alpha1/queues/q/status", "patch queues/status"},
		{"DELETE", "/api/v1/namespaces/gpufrac-system/pods/r-1", "delete pods"},
		{"GET", "/apis/resource.k8s.io/v1/resourceslices?watch=1", "watch resourceslices"},
		{"GET", "/version", "get /version"},
		{"GET", "/apis", "get /apis"},
	} {
		r, err := http.NewRequest(tc.method, "http://x"+tc.url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := requestKind(r); got != tc.want {
			t.Errorf("%s %s: %q, want %q", tc.method, tc.url, got, tc.want)
		}
	}
}
