package pods

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/flowcontrol"
)

// gpufrac-node talks to the API server through client-go's typed clientset
// (kubernetes.Interface): the pods bound to its node (NewNodeInformer,
// annotation patches), their eviction (policy/v1), its Node (labels, the GPU
// inventory annotation) and events (events.k8s.io/v1, tools/events). Tests
// use k8s.io/client-go/kubernetes/fake.

// WithDefaults returns a copy of cfg for gpufrac-node's API clients: a
// default user agent and, when cfg has no rate limiter, one token bucket
// (cfg's QPS and Burst, else client-go's defaults). Clients built from the
// one copy share that bucket: kubernetes.NewForConfig shares one only when
// cfg's QPS is set, and otherwise gives every API group client a bucket of
// its own.
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

// NewNodeInformer returns an informer (not started) on the pods bound to
// node (field selector spec.nodeName), indexed by namespace: client-go's
// generated pod informer, which lists through a watch stream where the
// client supports one (the fake clientset does not, and lists and watches).
func NewNodeInformer(client kubernetes.Interface, node string) cache.SharedIndexInformer {
	sel := fields.OneTermEqualSelector("spec.nodeName", node).String()
	return coreinformers.NewFilteredPodInformer(client, metav1.NamespaceAll, 0,
		cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc},
		func(o *metav1.ListOptions) { o.FieldSelector = sel })
}
