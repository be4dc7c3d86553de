package builders

import (
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpufrac/gpufrac/api"
)

// NodeWrapper builds a node.
type NodeWrapper struct{ node corev1.Node }

// MakeNode starts a Ready node with 32 CPUs, 256Gi of memory, 110 pods and
// no GPUs; capacity and allocatable are kept equal.
func MakeNode(name string) *NodeWrapper {
	w := &NodeWrapper{node: corev1.Node{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelHostname: name}},
		Status: corev1.NodeStatus{
			Capacity:    corev1.ResourceList{},
			Allocatable: corev1.ResourceList{},
			Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
		},
	}}
	return w.CPU("32").Memory("256Gi").Pods(110)
}

// Obj returns a deep copy of the node.
func (w *NodeWrapper) Obj() *corev1.Node { return w.node.DeepCopy() }

// Resource sets the capacity and allocatable of a resource.
func (w *NodeWrapper) Resource(name corev1.ResourceName, q string) *NodeWrapper {
	w.node.Status.Capacity[name] = resource.MustParse(q)
	w.node.Status.Allocatable[name] = resource.MustParse(q)
	return w
}

// GPUs sets the whole-GPU resource (nvidia.com/gpu).
func (w *NodeWrapper) GPUs(n int) *NodeWrapper {
	return w.Resource(api.ResourceGPU, strconv.Itoa(n))
}

// FractionUnits sets the fraction resource (gpufrac.io/gpu-fraction):
// api.UnitsPerGPU units per shareable GPU.
func (w *NodeWrapper) FractionUnits(n int) *NodeWrapper {
	return w.Resource(api.ResourceFraction, strconv.Itoa(n))
}

// Inventory publishes n GPUs in mode (exclusive, fraction) as gpufrac-node
// does (annotation gpufrac.io/gpus, UUIDs "GPU-<node>-<i>", H100 80 GiB,
// healthy) and serves them: nvidia.com/gpu n, and in mode fraction
// api.UnitsPerGPU fraction units per GPU.
func (w *NodeWrapper) Inventory(mode string, n int) *NodeWrapper {
	inv := make([]api.GPUInfo, 0, n)
	for i := 0; i < n; i++ {
		inv = append(inv, api.GPUInfo{UUID: GPUUUID(w.node.Name, i), Index: i, Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559, Mode: mode, Healthy: true})
	}
	s, err := api.EncodeInventory(inv)
	if err != nil {
		panic(err) // a slice of plain structs always encodes
	}
	if w.node.Annotations == nil {
		w.node.Annotations = map[string]string{}
	}
	w.node.Annotations[api.AnnotationGPUInventory] = s
	w = w.GPUs(n)
	if mode == "fraction" {
		w = w.FractionUnits(n * api.UnitsPerGPU)
	}
	return w
}

// GPUUUID is the UUID Inventory gives GPU i of a node.
func GPUUUID(node string, i int) string { return "GPU-" + node + "-" + strconv.Itoa(i) }

// CPU sets the node's CPU ("32").
func (w *NodeWrapper) CPU(q string) *NodeWrapper { return w.Resource(corev1.ResourceCPU, q) }

// Memory sets the node's memory ("256Gi").
func (w *NodeWrapper) Memory(q string) *NodeWrapper { return w.Resource(corev1.ResourceMemory, q) }

// Pods sets the node's pod capacity.
func (w *NodeWrapper) Pods(n int) *NodeWrapper {
	return w.Resource(corev1.ResourcePods, strconv.Itoa(n))
}

// Label sets a label.
func (w *NodeWrapper) Label(key, value string) *NodeWrapper {
	w.node.Labels[key] = value
	return w
}

// Product sets the GPU model label (nvidia.com/gpu.product).
func (w *NodeWrapper) Product(model string) *NodeWrapper {
	return w.Label(api.LabelGPUProduct, model)
}

// Pool sets the node-pool label (karpenter.sh/nodepool).
func (w *NodeWrapper) Pool(name string) *NodeWrapper { return w.Label(api.LabelNodePool, name) }

// Taint adds a taint.
func (w *NodeWrapper) Taint(key, value string, effect corev1.TaintEffect) *NodeWrapper {
	w.node.Spec.Taints = append(w.node.Spec.Taints, corev1.Taint{Key: key, Value: value, Effect: effect})
	return w
}

// Unschedulable cordons the node.
func (w *NodeWrapper) Unschedulable() *NodeWrapper {
	w.node.Spec.Unschedulable = true
	return w
}

// NotReady sets the Ready condition to False.
func (w *NodeWrapper) NotReady() *NodeWrapper {
	for i := range w.node.Status.Conditions {
		if w.node.Status.Conditions[i].Type == corev1.NodeReady {
			w.node.Status.Conditions[i].Status = corev1.ConditionFalse
		}
	}
	return w
}
