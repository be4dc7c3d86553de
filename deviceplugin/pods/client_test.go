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
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/pods/podstest"
)

// podstest.Clientset must stay a drop-in Client for tests.
var _ Client = podstest.Clientset{}

// ignoreZeroFields leaves out of JSON bodies the fields a Go struct
// serialises as null, "" or {} when unset.
var ignoreZeroFields = cmpopts.IgnoreMapEntries(func(_ string, v any) bool {
	switch v := v.(type) {
	case nil:
		return true
	case string:
		return v == ""
	case map[string]any:
		return len(v) == 0
	}
	return false
})

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

func (s *apiServer) client(t *testing.T) *RESTClient {
	t.Helper()
	c, err := NewClient(&rest.Config{Host: s.srv.URL, UserAgent: "gpufrac-node"})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

const (
	podJSON   = `{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"team","uid":"u1","resourceVersion":"7"},"spec":{"nodeName":"node-a"}}`
	nodeJSON  = `{"kind":"Node","apiVersion":"v1","metadata":{"name":"node-a","labels":{"pool":"a"}}}`
	eventJSON = `{"kind":"Event","apiVersion":"v1","metadata":{"name":"node-a.1","namespace":"default"},"reason":"GPUXid","count":2}`
)

func TestRESTClient(t *testing.T) {
	uid := types.UID("u1")
	event := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "node-a.1", Namespace: "default"}, Reason: "GPUXid", Count: 1}
	tests := []struct {
		name   string
		answer map[string]response
		call   func(ctx context.Context, c *RESTClient) (string, error) // what the caller got, in short
		want   string
		wantIs func(error) bool // nil: no error
		// wantReq is the request, with the user agent and without it
		// (every request must carry gpufrac-node's).
		wantReq request
	}{
		{
			name:   "list the node's pods in all namespaces",
			answer: map[string]response{"GET /api/v1/pods": {200, `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"9"},"items":[` + podJSON + `]}`}},
			call: func(ctx context.Context, c *RESTClient) (string, error) {
				l, err := c.ListPods(ctx, "", metav1.ListOptions{FieldSelector: "spec.nodeName=node-a", ResourceVersion: "0"})
				if err != nil {
					return "", err
				}
				return fmt.Sprintf("rv %s, %d: %s/%s on %s", l.ResourceVersion, len(l.Items), l.Items[0].Namespace, l.Items[0].Name, l.Items[0].Spec.NodeName), nil
			},
			want:    "rv 9, 1: team/p on node-a",
			wantReq: request{Method: "GET", Path: "/api/v1/pods", Query: "fieldSelector=spec.nodeName%3Dnode-a&resourceVersion=0"},
		},
		{
			name:   "list pods in one namespace",
			answer: map[string]response{"GET /api/v1/namespaces/team/pods": {200, `{"kind":"PodList","apiVersion":"v1","items":[]}`}},
			call: func(ctx context.Context, c *RESTClient) (string, error) {
				l, err := c.ListPods(ctx, "team", metav1.ListOptions{})
				if err != nil {
					return "", err
				}
				return fmt.Sprint(len(l.Items)), nil
			},
			want:    "0",
			wantReq: request{Method: "GET", Path: "/api/v1/namespaces/team/pods"},
		},
		{
			name:   "merge-patch a pod's annotations with a field manager",
			answer: map[string]response{"PATCH /api/v1/namespaces/team/pods/p": {200, podJSON}},
			call: func(ctx context.Context, c *RESTClient) (string, error) {
				p, err := c.PatchPod(ctx, "team", "p", types.MergePatchType, []byte(`{"metadata":{"annotations":{"gpufrac.io/allocated-gpu":"GPU-1"}}}`), metav1.PatchOptions{FieldManager: "gpufrac-node"})
				if err != nil {
					return "", err
				}
				return string(p.UID), nil
			},
			want: "u1",
			wantReq: request{Method: "PATCH", Path: "/api/v1/namespaces/team/pods/p", Query: "fieldManager=gpufrac-node", ContentType: "application/merge-patch+json",
				Body: map[string]any{"metadata": map[string]any{"annotations": map[string]any{api.AnnotationAllocatedGPU: "GPU-1"}}}},
		},
		{
			name:   "patching a pod that is gone is NotFound",
			answer: map[string]response{},
			call: func(ctx context.Context, c *RESTClient) (string, error) {
				_, err := c.PatchPod(ctx, "team", "gone", types.MergePatchType, []byte(`{}`), metav1.PatchOptions{})
				return "", err
			},
			wantIs:  apierrors.IsNotFound,
			wantReq: request{Method: "PATCH", Path: "/api/v1/namespaces/team/pods/gone", ContentType: "application/merge-patch+json", Body: map[string]any{}},
		},
		{
			name:   "evict a pod through policy/v1 with its UID as precondition",
			answer: map[string]response{"POST /api/v1/namespaces/team/pods/p/eviction": {201, `{"kind":"Status","apiVersion":"v1","status":"Success"}`}},
			call: func(ctx context.Context, c *RESTClient) (string, error) {
				return "", c.EvictPod(ctx, &policyv1.Eviction{
					ObjectMeta:    metav1.ObjectMeta{Name: "p", Namespace: "team"},
					DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}},
				})
			},
			wantReq: request{Method: "POST", Path: "/api/v1/namespaces/team/pods/p/eviction", ContentType: "application/json",
				Body: map[string]any{"kind": "Eviction", "apiVersion": "policy/v1",
					"metadata":      map[string]any{"name": "p", "namespace": "team"},
					"deleteOptions": map[string]any{"preconditions": map[string]any{"uid": "u1"}}}},
		},
		{
			name: "an eviction a PodDisruptionBudget refuses is TooManyRequests",
			answer: map[string]response{"POST /api/v1/namespaces/team/pods/p/eviction": {429,
				`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"TooManyRequests","code":429,"message":"Cannot evict pod as it would violate the pod's disruption budget."}`}},
			call: func(ctx context.Context, c *RESTClient) (string, error) {
				return "", c.EvictPod(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "team"}})
			},
			wantIs: apierrors.IsTooManyRequests,
			wantReq: request{Method: "POST", Path: "/api/v1/namespaces/team/pods/p/eviction", ContentType: "application/json",
				Body: map[string]any{"kind": "Eviction", "apiVersion": "policy/v1", "metadata": map[string]any{"name": "p", "namespace": "team"}}},
		},
		{
			name:   "read the node's labels",
			answer: map[string]response{"GET /api/v1/nodes/node-a": {200, nodeJSON}},
			call: func(ctx context.Context, c *RESTClient) (string, error) {
				n, err := c.GetNode(ctx, "node-a")
				if err != nil {
					return "", err
				}
				return fmt.Sprint(n.Labels), nil
			},
			want:    "map[pool:a]",
			wantReq: request{Method: "GET", Path: "/api/v1/nodes/node-a"},
		},
		{
			name:   "patch the node's inventory annotation",
			answer: map[string]response{"PATCH /api/v1/nodes/node-a": {200, nodeJSON}},
			call: func(ctx context.Context, c *RESTClient) (string, error) {
				n, err := c.PatchNode(ctx, "node-a", types.MergePatchType, []byte(`{"metadata":{"annotations":{"gpufrac.io/gpus":"[]"}}}`), metav1.PatchOptions{FieldManager: "gpufrac-node"})
				if err != nil {
					return "", err
				}
				return n.Name, nil
			},
			want: "node-a",
			wantReq: request{Method: "PATCH", Path: "/api/v1/nodes/node-a", Query: "fieldManager=gpufrac-node", ContentType: "application/merge-patch+json",
				Body: map[string]any{"metadata": map[string]any{"annotations": map[string]any{"gpufrac.io/gpus": "[]"}}}},
		},
		{
			name:   "create an event in its namespace",
			answer: map[string]response{"POST /api/v1/namespaces/default/events": {201, eventJSON}},
			call: func(ctx context.Context, c *RESTClient) (string, error) {
				e, err := c.CreateEvent(ctx, event)
				if err != nil {
					return "", err
				}
				return fmt.Sprint(e.Reason, " ", e.Count), nil
			},
			want: "GPUXid 2",
			wantReq: request{Method: "POST", Path: "/api/v1/namespaces/default/events", ContentType: "application/json",
				Body: map[string]any{"kind": "Event", "apiVersion": "v1", "metadata": map[string]any{"name": "node-a.1", "namespace": "default"},
					"reason": "GPUXid", "count": float64(1)}},
		},
		{
			name:   "patch an event's count with a strategic merge patch",
			answer: map[string]response{"PATCH /api/v1/namespaces/default/events/node-a.1": {200, eventJSON}},
			call: func(ctx context.Context, c *RESTClient) (string, error) {
				e, err := c.PatchEvent(ctx, event, []byte(`{"count":2}`))
				if err != nil {
					return "", err
				}
				return fmt.Sprint(e.Count), nil
			},
			want: "2",
			wantReq: request{Method: "PATCH", Path: "/api/v1/namespaces/default/events/node-a.1", ContentType: "application/strategic-merge-patch+json",
				Body: map[string]any{"count": float64(2)}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newAPIServer(t)
			s.answer = tt.answer
			got, err := tt.call(t.Context(), s.client(t))
			switch {
			case tt.wantIs == nil && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.wantIs != nil && !tt.wantIs(err):
				t.Fatalf("error %v (%T) is not the API error expected", err, err)
			}
			if got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
			want := tt.wantReq
			want.UserAgent = "gpufrac-node"
			if diff := cmp.Diff([]request{want}, s.requests(), ignoreZeroFields); diff != "" {
				t.Errorf("requests (-want +got):\n%s", diff)
			}
		})
	}
}

// The pod informer gpufrac-node runs, end to end over RESTClient: it lists
// and watches the node's pods only, and the watch's events reach the lister.
func TestNodeInformerOverREST(t *testing.T) {
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
	w, err := s.client(t).WatchPods(ctx, "", metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	ev := <-w.ResultChan()
	if p, ok := ev.Object.(*corev1.Pod); !ok || ev.Type != watch.Added || p.Name != "q" {
		t.Errorf("watch event %s %T, want ADDED pod q", ev.Type, ev.Object)
	}
}
