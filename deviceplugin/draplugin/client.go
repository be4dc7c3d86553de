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

	"github.com/gpufrac/gpufrac/deviceplugin/pods"
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

// NewClient returns a RESTClient for cfg, defaulted as pods.WithDefaults
// does (its own rate limiter unless cfg has one, as before with the
// helper's clientset). client-go caches TLS transports by TLS config, so
// it can share the node agent's transport to the API server.
func NewClient(cfg *rest.Config) (*RESTClient, error) {
	s := runtime.NewScheme()
	if err := resourceapi.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("building the resource.k8s.io scheme: %w", err)
	}
	c := *pods.WithDefaults(cfg)
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
