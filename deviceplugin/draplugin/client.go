package draplugin

import (
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
)

// SliceAPI is what Publisher needs of the API server: the ResourceSlices.
type SliceAPI interface {
	ListResourceSlices(ctx context.Context, opts metav1.ListOptions) (*resourceapi.ResourceSliceList, error)
	WatchResourceSlices(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	CreateResourceSlice(ctx context.Context, s *resourceapi.ResourceSlice) (*resourceapi.ResourceSlice, error)
	UpdateResourceSlice(ctx context.Context, s *resourceapi.ResourceSlice) (*resourceapi.ResourceSlice, error)
	DeleteResourceSlice(ctx context.Context, name string, opts metav1.DeleteOptions) error
}

// API is all of resource.k8s.io a DRA driver on a node uses.
type API interface {
	ClaimGetter
	SliceAPI
}

// RESTClient is API over one resource.k8s.io/v1 REST client whose scheme
// holds that group version alone, JSON on the wire; not client-go's typed
// client, which imports k8s.io/client-go/kubernetes/scheme and so every API
// group (see package pods for the node agent's other REST clients). Its
// errors are the API's own (apierrors.IsNotFound sees them).
type RESTClient struct {
	rc     rest.Interface
	params runtime.ParameterCodec
}

var _ API = (*RESTClient)(nil)

// NewClient returns a RESTClient for cfg. As the clientset does, it fills
// in a default user agent and, when cfg has no rate limiter, a token bucket
// of cfg's QPS and Burst (else client-go's defaults). client-go shares the
// HTTP transport between clients of equal TLS configs, so this client and
// the node agent's others use one connection to the API server.
func NewClient(cfg *rest.Config) (*RESTClient, error) {
	s := runtime.NewScheme()
	if err := resourceapi.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("building the resource.k8s.io scheme: %w", err)
	}
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
	gv := resourceapi.SchemeGroupVersion
	c.APIPath = "/apis"
	c.GroupVersion = &gv
	c.NegotiatedSerializer = rest.CodecFactoryForGeneratedClient(s, serializer.NewCodecFactory(s)).WithoutConversion()
	rc, err := rest.RESTClientFor(&c)
	if err != nil {
		return nil, fmt.Errorf("building the %s REST client: %w", gv, err)
	}
	return &RESTClient{rc: rc, params: runtime.NewParameterCodec(s)}, nil
}

// GetResourceClaim implements ClaimGetter.
func (c *RESTClient) GetResourceClaim(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaim, error) {
	out := &resourceapi.ResourceClaim{}
	if err := c.rc.Get().Namespace(namespace).Resource("resourceclaims").Name(name).Do(ctx).Into(out); err != nil {
		return nil, err
	}
	return out, nil
}

// ListResourceSlices implements SliceAPI.
func (c *RESTClient) ListResourceSlices(ctx context.Context, opts metav1.ListOptions) (*resourceapi.ResourceSliceList, error) {
	out := &resourceapi.ResourceSliceList{}
	if err := c.rc.Get().Resource("resourceslices").VersionedParams(&opts, c.params).Do(ctx).Into(out); err != nil {
		return nil, err
	}
	return out, nil
}

// WatchResourceSlices implements SliceAPI.
func (c *RESTClient) WatchResourceSlices(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return c.rc.Get().Resource("resourceslices").VersionedParams(&opts, c.params).Watch(ctx)
}

// CreateResourceSlice implements SliceAPI.
func (c *RESTClient) CreateResourceSlice(ctx context.Context, s *resourceapi.ResourceSlice) (*resourceapi.ResourceSlice, error) {
	out := &resourceapi.ResourceSlice{}
	if err := c.rc.Post().Resource("resourceslices").Body(s).Do(ctx).Into(out); err != nil {
		return nil, err
	}
	return out, nil
}

// UpdateResourceSlice implements SliceAPI.
func (c *RESTClient) UpdateResourceSlice(ctx context.Context, s *resourceapi.ResourceSlice) (*resourceapi.ResourceSlice, error) {
	out := &resourceapi.ResourceSlice{}
	if err := c.rc.Put().Resource("resourceslices").Name(s.Name).Body(s).Do(ctx).Into(out); err != nil {
		return nil, err
	}
	return out, nil
}

// DeleteResourceSlice implements SliceAPI.
func (c *RESTClient) DeleteResourceSlice(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	return c.rc.Delete().Resource("resourceslices").Name(name).Body(&opts).Do(ctx).Error()
}
