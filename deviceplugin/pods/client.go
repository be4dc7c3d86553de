package pods

import (
	"context"
	"fmt"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/flowcontrol"
)

// The node agent talks to the API server through Client, not through
// k8s.io/client-go/kubernetes: the clientset, the informer factory and even
// the generated typed core/v1 client import k8s.io/client-go/kubernetes/scheme,
// which links and registers all of k8s.io/api's group versions. Their code
// and tables are most of gpufrac-node's executable, and the executable's
// pages are most of its resident memory (docs/benchmarks.md, gpufrac-node).

// PodWatcher lists and watches pods.
type PodWatcher interface {
	// ListPods lists the pods in namespace ("" for all) that opts select.
	ListPods(ctx context.Context, namespace string, opts metav1.ListOptions) (*corev1.PodList, error)
	// WatchPods watches the pods in namespace ("" for all) that opts select.
	WatchPods(ctx context.Context, namespace string, opts metav1.ListOptions) (watch.Interface, error)
}

// PodAPI is what the pod hint needs of the API server: the pods bound to
// its node, and patches of their annotations.
type PodAPI interface {
	PodWatcher
	// PatchPod patches a pod.
	PatchPod(ctx context.Context, namespace, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions) (*corev1.Pod, error)
}

// Client is all of the Kubernetes API gpufrac-node uses: the pods bound to
// its node (PodAPI) and their eviction, its Node (labels, the GPU inventory
// annotation) and events. NewClient serves it from core/v1 and policy/v1
// alone; tests adapt a client-go clientset (podstest.Clientset).
type Client interface {
	PodAPI
	// EvictPod posts a policy/v1 Eviction for the pod it names.
	EvictPod(ctx context.Context, eviction *policyv1.Eviction) error
	// GetNode reads a Node.
	GetNode(ctx context.Context, name string) (*corev1.Node, error)
	// PatchNode patches a Node.
	PatchNode(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions) (*corev1.Node, error)
	// CreateEvent creates an event in its own namespace.
	CreateEvent(ctx context.Context, event *corev1.Event) (*corev1.Event, error)
	// PatchEvent patches the event named by event (name and namespace) with
	// a strategic merge patch.
	PatchEvent(ctx context.Context, event *corev1.Event, data []byte) (*corev1.Event, error)
}

// NewScheme returns a scheme holding only the API types gpufrac-node reads
// and writes: core/v1 (with the meta/v1 options, Status and WatchEvent) and
// policy/v1 (Eviction).
func NewScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, policyv1.AddToScheme} {
		if err := add(s); err != nil {
			return nil, fmt.Errorf("building the API scheme: %w", err)
		}
	}
	return s, nil
}

// RESTClient is Client over the API server's REST API: one HTTP client and
// one rate limiter shared by a core/v1 and a policy/v1 REST client, JSON on
// the wire, requests shaped as client-go's generated clients shape them.
// Like theirs, its errors are the API's own (apierrors.IsNotFound and the
// reflector's checks see them as they are, and their messages name the
// object); callers wrap them with the action.
type RESTClient struct {
	core, policy rest.Interface
	params       runtime.ParameterCodec
}

var _ Client = (*RESTClient)(nil)

// WithDefaults returns a copy of cfg as the clientset would use it: a
// default user agent and, when cfg has no rate limiter, one token bucket
// (cfg's QPS and Burst, else client-go's defaults). REST clients built from
// the one copy share that bucket.
func WithDefaults(cfg *rest.Config) *rest.Config {
	c := *cfg
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	if c.RateLimiter == nil {
		qps, burst := c.QPS, c.Burst
		if qps == 0 {
			qps = rest.DefaultQPS
		}
		if burst == 0 {
			burst = rest.DefaultBurst
		}
		if qps > 0 {
			c.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(qps, burst)
		}
	}
	return &c
}

// NewClient returns a RESTClient for WithDefaults(cfg): one token bucket
// for all its requests.
func NewClient(cfg *rest.Config) (*RESTClient, error) {
	s, err := NewScheme()
	if err != nil {
		return nil, err
	}
	c := *WithDefaults(cfg)
	hc, err := rest.HTTPClientFor(&c)
	if err != nil {
		return nil, fmt.Errorf("building the API HTTP client: %w", err)
	}
	codecs := rest.CodecFactoryForGeneratedClient(s, serializer.NewCodecFactory(s)).WithoutConversion()
	core, err := restClientFor(c, hc, codecs, "/api", corev1.SchemeGroupVersion)
	if err != nil {
		return nil, err
	}
	policy, err := restClientFor(c, hc, codecs, "/apis", policyv1.SchemeGroupVersion)
	if err != nil {
		return nil, err
	}
	return &RESTClient{core: core, policy: policy, params: runtime.NewParameterCodec(s)}, nil
}

func restClientFor(c rest.Config, hc *http.Client, codecs runtime.NegotiatedSerializer, apiPath string, gv schema.GroupVersion) (*rest.RESTClient, error) {
	c.APIPath = apiPath
	c.GroupVersion = &gv
	c.NegotiatedSerializer = codecs
	rc, err := rest.RESTClientForConfigAndClient(&c, hc)
	if err != nil {
		return nil, fmt.Errorf("building the %s REST client: %w", gv, err)
	}
	return rc, nil
}

// timeout is the request timeout opts ask for (0: none).
func timeout(opts metav1.ListOptions) time.Duration {
	if opts.TimeoutSeconds == nil {
		return 0
	}
	return time.Duration(*opts.TimeoutSeconds) * time.Second
}

// ListPods implements PodWatcher.
func (c *RESTClient) ListPods(ctx context.Context, namespace string, opts metav1.ListOptions) (*corev1.PodList, error) {
	out := &corev1.PodList{}
	err := c.core.Get().NamespaceIfScoped(namespace, namespace != "").Resource("pods").
		VersionedParams(&opts, c.params).Timeout(timeout(opts)).Do(ctx).Into(out)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// WatchPods implements PodWatcher.
func (c *RESTClient) WatchPods(ctx context.Context, namespace string, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return c.core.Get().NamespaceIfScoped(namespace, namespace != "").Resource("pods").
		VersionedParams(&opts, c.params).Timeout(timeout(opts)).Watch(ctx)
}

// PatchPod implements PodAPI.
func (c *RESTClient) PatchPod(ctx context.Context, namespace, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions) (*corev1.Pod, error) {
	out := &corev1.Pod{}
	err := c.core.Patch(pt).Namespace(namespace).Resource("pods").Name(name).
		VersionedParams(&opts, c.params).Body(data).Do(ctx).Into(out)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// EvictPod implements Client: the eviction subresource lives under core/v1
// pods, its body is a policy/v1 Eviction.
func (c *RESTClient) EvictPod(ctx context.Context, eviction *policyv1.Eviction) error {
	return c.policy.Post().AbsPath("/api/v1").Namespace(eviction.Namespace).Resource("pods").
		Name(eviction.Name).SubResource("eviction").Body(eviction).Do(ctx).Error()
}

// GetNode implements Client.
func (c *RESTClient) GetNode(ctx context.Context, name string) (*corev1.Node, error) {
	out := &corev1.Node{}
	if err := c.core.Get().Resource("nodes").Name(name).Do(ctx).Into(out); err != nil {
		return nil, err
	}
	return out, nil
}

// PatchNode implements Client.
func (c *RESTClient) PatchNode(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions) (*corev1.Node, error) {
	out := &corev1.Node{}
	err := c.core.Patch(pt).Resource("nodes").Name(name).
		VersionedParams(&opts, c.params).Body(data).Do(ctx).Into(out)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// CreateEvent implements Client.
func (c *RESTClient) CreateEvent(ctx context.Context, event *corev1.Event) (*corev1.Event, error) {
	out := &corev1.Event{}
	err := c.core.Post().NamespaceIfScoped(event.Namespace, event.Namespace != "").Resource("events").
		Body(event).Do(ctx).Into(out)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// PatchEvent implements Client.
func (c *RESTClient) PatchEvent(ctx context.Context, event *corev1.Event, data []byte) (*corev1.Event, error) {
	out := &corev1.Event{}
	err := c.core.Patch(types.StrategicMergePatchType).NamespaceIfScoped(event.Namespace, event.Namespace != "").
		Resource("events").Name(event.Name).Body(data).Do(ctx).Into(out)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// NewNodeInformer returns an informer (not started) on the pods bound to
// node (field selector spec.nodeName), indexed by namespace.
func NewNodeInformer(w PodWatcher, node string) cache.SharedIndexInformer {
	sel := fields.OneTermEqualSelector("spec.nodeName", node).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.FieldSelector = sel
			list, err := w.ListPods(ctx, metav1.NamespaceAll, opts)
			if err != nil {
				return nil, err // not a typed nil in a non-nil runtime.Object
			}
			return list, nil
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = sel
			return w.WatchPods(ctx, metav1.NamespaceAll, opts)
		},
	}
	// client-go 0.35+ lists through a watch stream (WatchListClient, on by
	// default) unless the client says it cannot: client-go's fake clientset
	// does, and so does podstest.Clientset by forwarding to it.
	return cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, w), &corev1.Pod{}, 0,
		cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
}
