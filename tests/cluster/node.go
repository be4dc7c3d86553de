package cluster

import (
	"context"
	"fmt"
	"maps"

	"github.com/gpufrac/gpufrac/api"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// NodeSpec describes a kwok fake node for AddNode.
type NodeSpec struct {
	// Name is the node's name.
	Name string
	// Labels are added to the defaults (kubernetes.io/hostname, kubernetes.io/os=linux,
	// kubernetes.io/arch=amd64, type=kwok), overriding them on conflict.
	Labels map[string]string
	// Capacity is the node's capacity and allocatable, e.g. cpu, memory, pods,
	// nvidia.com/gpu. Empty means 32 CPUs, 256Gi memory and 110 pods.
	Capacity corev1.ResourceList
	// Taints are the node's taints.
	Taints []corev1.Taint
	// Annotations are added to kwok's (KwokNodeAnnotation), e.g. the GPU
	// inventory a node agent would publish.
	Annotations map[string]string
}

// AddNode creates a fake node that the cluster's kwok manages: kwok marks it Ready,
// keeps its lease fresh and runs the pods bound to it. It returns the created node;
// the node is usually Ready well under a second later.
func (c *Cluster) AddNode(ctx context.Context, spec NodeSpec) (*corev1.Node, error) {
	created, err := c.Client.CoreV1().Nodes().Create(ctx, NewNode(spec), metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("creating node %s: %w", spec.Name, err)
	}
	return created, nil
}

// NewNode is the Node object AddNode creates, for callers that create many
// nodes through a client of their own (AddNode's shares the harness's rate
// limit).
func NewNode(spec NodeSpec) *corev1.Node {
	capacity := spec.Capacity
	if len(capacity) == 0 {
		capacity = ResourceList(map[corev1.ResourceName]string{
			corev1.ResourceCPU: "32", corev1.ResourceMemory: "256Gi", corev1.ResourcePods: "110",
		})
	}
	nodeLabels := map[string]string{
		corev1.LabelHostname:   spec.Name,
		corev1.LabelOSStable:   "linux",
		corev1.LabelArchStable: "amd64",
		"type":                 "kwok",
	}
	maps.Copy(nodeLabels, spec.Labels)
	annotations := maps.Clone(spec.Annotations)
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[KwokNodeAnnotation] = KwokNodeAnnotationValue
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        spec.Name,
			Labels:      nodeLabels,
			Annotations: annotations,
		},
		Spec: corev1.NodeSpec{Taints: spec.Taints},
		// The API server keeps a node's status on create; kwok's node-initialize stage
		// keeps capacity and allocatable and adds conditions, addresses and nodeInfo.
		Status: corev1.NodeStatus{
			Capacity:    capacity.DeepCopy(),
			Allocatable: capacity.DeepCopy(),
			Phase:       corev1.NodeRunning,
		},
	}
}

// ResourceList parses quantities such as {"cpu": "8", "nvidia.com/gpu": "8"}. It panics
// on a malformed quantity: it is meant for literals in tests.
func ResourceList(quantities map[corev1.ResourceName]string) corev1.ResourceList {
	out := corev1.ResourceList{}
	for name, q := range quantities {
		out[name] = resource.MustParse(q)
	}
	return out
}

// IsNodeReady reports whether the node's Ready condition is True.
func IsNodeReady(node *corev1.Node) bool {
	for _, cond := range node.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// startNodeInformer watches nodes labelled api.LabelGPUNode=true and, once per kwok
// node (by UID), calls Options.OnNode and runs the node agent (with
// Options.NodeAgents), each in its own goroutine. A node that loses the label counts
// as deleted (the filtered watch reports it so).
func (c *Cluster) startNodeInformer(ctx context.Context) error {
	selector := labels.Set{api.LabelGPUNode: "true"}.AsSelector().String()
	c.informers = informers.NewSharedInformerFactoryWithOptions(c.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
	nodes := c.informers.Core().V1().Nodes().Informer()
	c.nodeLister = c.informers.Core().V1().Nodes().Lister()
	logger := klog.FromContext(c.ctx)
	if _, err := nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.nodeSeen(logger, obj) },
		UpdateFunc: func(_, obj any) { c.nodeSeen(logger, obj) },
		DeleteFunc: func(obj any) { c.nodeGone(obj) },
	}); err != nil {
		return fmt.Errorf("adding node event handler: %w", err)
	}
	// The informer lives as long as the cluster, not the startup context.
	c.informers.Start(c.ctx.Done())
	for typ, ok := range c.informers.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("syncing the %v informer: %w", typ, ctx.Err())
		}
	}
	return nil
}

// nodeSeen starts the OnNode call and the node agent for a kwok GPU node not seen before.
func (c *Cluster) nodeSeen(logger klog.Logger, obj any) {
	node, ok := obj.(*corev1.Node)
	if !ok || node.Annotations[KwokNodeAnnotation] != KwokNodeAnnotationValue || node.DeletionTimestamp != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopping {
		return
	}
	if _, seen := c.nodeCtx[node.UID]; seen {
		return
	}
	nodeCtx, cancel := context.WithCancel(klog.NewContext(c.ctx, logger.WithValues("node", klog.KObj(node))))
	c.nodeCtx[node.UID] = cancel
	node = node.DeepCopy()
	if c.opts.NodeAgents != nil {
		c.hooks.Go(func() { c.runNodeAgent(nodeCtx, node) })
	}
	if c.opts.OnNode != nil {
		c.hooks.Go(func() { c.opts.OnNode(nodeCtx, node.DeepCopy()) })
	}
}

// nodeGone cancels the OnNode call and the node agent of a deleted node.
func (c *Cluster) nodeGone(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	node, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if cancel, ok := c.nodeCtx[node.UID]; ok {
		cancel()
		// The UID stays in the map so a late update never starts a second call.
		c.nodeCtx[node.UID] = func() {}
	}
}
