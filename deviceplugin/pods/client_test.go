package pods

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// request is what the fake API server saw of one request.
type request struct {
	Method, Path, Query, ContentType, UserAgent string
	Body                                        map[string]any // JSON body, nil without one
}

// apiServer is a loopback HTTP server answering every request with the
// next of its canned responses and recording what it was asked.
type apiServer struct {
	t   *testing.T
	srv *httptest.Server

	mu   sync.Mutex
	seen []request
	// answer: "METHOD path" -> status and JSON body.
	answer map[string]response
	// watch: events streamed to a watch request, which then stays open
	// until the client goes away.
	watch []string
}

type response struct {
	status int
	body   string
}

func newAPIServer(t *testing.T) *apiServer {
	s := &apiServer{t: t, answer: map[string]response{}}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *apiServer) serve(w http.ResponseWriter, r *http.Request) {
	raw, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	req := request{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, ContentType: r.Header.Get("Content-Type"), UserAgent: r.UserAgent()}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &req.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
	}
	s.mu.Lock()
	s.seen = append(s.seen, req)
	a, ok := s.answer[r.Method+" "+r.URL.Path]
	events := s.watch
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if r.URL.Query().Get("watch") == "true" {
		w.WriteHeader(http.StatusOK)
		if r.URL.Query().Get("sendInitialEvents") == "true" {
			// A watch-list stream (client-go 0.35+ informers, served since
			// Kubernetes 1.32): the list's items as ADDED, then a bookmark
			// marking the end of the initial events.
			s.writeInitialEvents(w, r.URL.Path)
		}
		for _, ev := range events {
			fmt.Fprintln(w, ev)
		}
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		return
	}
	if !ok {
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404,"message":"%s not found"}`, r.URL.Path)
		return
	}
	w.WriteHeader(a.status)
	io.WriteString(w, a.body)
}

// writeInitialEvents streams the items of the list answered at path as a
// watch-list server does: one ADDED event per item, then a BOOKMARK with the
// list's resourceVersion and the k8s.io/initial-events-end annotation.
func (s *apiServer) writeInitialEvents(w io.Writer, path string) {
	s.mu.Lock()
	a := s.answer["GET "+path]
	s.mu.Unlock()
	var list struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
		Items []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal([]byte(a.body), &list); err != nil {
		s.t.Errorf("answer for GET %s is not a list: %v", path, err)
		return
	}
	for _, item := range list.Items {
		fmt.Fprintf(w, `{"type":"ADDED","object":%s}`+"\n", item)
	}
	fmt.Fprintf(w, `{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":%q,"annotations":{"k8s.io/initial-events-end":"true"}}}}`+"\n", list.Metadata.ResourceVersion)
}

func (s *apiServer) requests() []request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]request(nil), s.seen...)
}

func (s *apiServer) client(t *testing.T) kubernetes.Interface {
	t.Helper()
	c, err := kubernetes.NewForConfig(WithDefaults(&rest.Config{Host: s.srv.URL, UserAgent: "gpufrac-node"}))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

const podJSON = `{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"team","uid":"u1","resourceVersion":"7"},"spec":{"nodeName":"node-a"}}`

// Every API group client of a clientset for WithDefaults' config shares one
// token bucket, whether
// or not the config sets a QPS, and requests carry the config's user agent
// (client-go's default without one).
func TestNewClientset(t *testing.T) {
	for _, cfg := range []rest.Config{{Host: "https://api:6443"}, {Host: "https://api:6443", QPS: 50, Burst: 100, UserAgent: "gpufrac-node"}} {
		cs, err := kubernetes.NewForConfig(WithDefaults(&cfg))
		if err != nil {
			t.Fatal(err)
		}
		core := cs.CoreV1().RESTClient().GetRateLimiter()
		if core == nil {
			t.Fatalf("QPS %v: no rate limiter", cfg.QPS)
		}
		if cs.PolicyV1().RESTClient().GetRateLimiter() != core || cs.EventsV1().RESTClient().GetRateLimiter() != core {
			t.Errorf("QPS %v: the core/v1, policy/v1 and events.k8s.io/v1 clients do not share one rate limiter", cfg.QPS)
		}
		if want := float32(max(cfg.QPS, rest.DefaultQPS)); core.QPS() != want {
			t.Errorf("QPS %v: limiter QPS %v, want %v", cfg.QPS, core.QPS(), want)
		}
	}
	if got := WithDefaults(&rest.Config{}).UserAgent; got != rest.DefaultKubernetesUserAgent() {
		t.Errorf("default user agent %q, want client-go's %q", got, rest.DefaultKubernetesUserAgent())
	}
}

// The pod informer gpufrac-node runs, end to end over the clientset and
// HTTP: it lists and watches the node's pods only, with gpufrac-node's user
// agent, and the watch's events reach the lister.
func TestNodeInformerOverHTTP(t *testing.T) {
	ctx := testContext(t)
	s := newAPIServer(t)
	s.answer = map[string]response{"GET /api/v1/pods": {200, `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"9"},"items":[` + podJSON + `]}`}}
	s.watch = []string{`{"type":"ADDED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"q","namespace":"team","uid":"u2","resourceVersion":"10"},"spec":{"nodeName":"node-a"}}}`}
	inf := NewNodeInformer(s.client(t), "node-a")
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); inf.RunWithContext(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("pod informer did not sync")
	}
	eventually(t, ctx, "the watched pod in the cache", func() bool {
		_, ok, err := inf.GetIndexer().GetByKey("team/q")
		return ok && err == nil
	})
	keys := inf.GetIndexer().ListKeys()
	if diff := cmp.Diff([]string{"team/p", "team/q"}, slices.Sorted(slices.Values(keys))); diff != "" {
		t.Errorf("cached pods (-want +got):\n%s", diff)
	}
	for _, r := range s.requests() {
		if r.Method != "GET" || r.Path != "/api/v1/pods" {
			t.Errorf("unexpected request %s %s", r.Method, r.Path)
		}
		if r.UserAgent != "gpufrac-node" {
			t.Errorf("request %s %s with user agent %q", r.Method, r.Path, r.UserAgent)
		}
		if q := r.Query; !strings.Contains(q, "fieldSelector=spec.nodeName%3Dnode-a") {
			t.Errorf("request %s %s?%s does not select the node's pods", r.Method, r.Path, q)
		}
	}
	// client-go 0.36 lists through a watch stream: the first request is a
	// watch asking for the initial events (the client passes the reflector's
	// options through).
	if rs := s.requests(); len(rs) == 0 || !strings.Contains(rs[0].Query, "sendInitialEvents=true") {
		t.Errorf("requests %+v, want a watch-list first", rs)
	}
	w, err := s.client(t).CoreV1().Pods("").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	ev := <-w.ResultChan()
	if p, ok := ev.Object.(*corev1.Pod); !ok || ev.Type != watch.Added || p.Name != "q" {
		t.Errorf("watch event %s %T, want ADDED pod q", ev.Type, ev.Object)
	}
}
