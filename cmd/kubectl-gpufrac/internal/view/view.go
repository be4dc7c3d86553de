// Package view builds and prints the cluster's GPU view for kubectl-gpufrac: per
// node, per GPU, who holds what. Everything comes from the API: each node's GPU
// inventory (annotation gpufrac.io/gpus, written by gpufrac-node) and the pods'
// requests and annotations (gpufrac.io/allocated-gpu, gpufrac.io/reserved-gpu).
package view

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpufrac/gpufrac/api"
)

// reasonUnexpectedAdmissionError is the kubelet's reason for a pod whose device
// allocation failed at admission.
const reasonUnexpectedAdmissionError = "UnexpectedAdmissionError"

// View is the cluster's GPUs and the pods that hold or want them.
type View struct {
	// Nodes are the nodes with GPUs, by name.
	Nodes []Node
	// Pending are GPU pods not bound to a node yet.
	Pending []Pod
	// Rejected are GPU pods a kubelet refused at device admission.
	Rejected []Pod
}

// Node is one node with GPUs.
type Node struct {
	// Name is the node's name.
	Name string
	// Ready is the node's Ready condition.
	Ready bool
	// Inventory is false when no gpufrac-node published the node's GPUs.
	Inventory bool
	// GPUs are the node's GPUs by index.
	GPUs []GPU
	// WholeGPUs and FractionUnits are the node's allocatable counts.
	WholeGPUs, FractionUnits int64
	// Unplaced are pods on the node holding GPUs that no annotation ties to a GPU
	// (whole-GPU pods, or fraction pods not written back yet).
	Unplaced []Holder
}

// GPU is one GPU of a node.
type GPU struct {
	api.GPUInfo
	// Holders are the pods holding (part of) the GPU.
	Holders []Holder
}

// UsedPercent is how much of the GPU its holders take, 0 to 100 (more means
// the annotations disagree).
func (g GPU) UsedPercent() int {
	used := 0
	for _, h := range g.Holders {
		used += h.Percent
	}
	return used
}

// Holder is a pod holding GPU capacity.
type Holder struct {
	// Pod is namespace/name.
	Pod string
	// Phase is the pod's phase.
	Phase corev1.PodPhase
	// Percent of one GPU (a fraction, or 100 for a whole GPU or a reservation).
	Percent int
	// Whole counts whole GPUs (nvidia.com/gpu) the pod holds.
	Whole int
	// Role says what the holding is: "whole", "fraction" or "reservation".
	Role string
}

// Pod is a GPU pod outside the node view.
type Pod struct {
	// Pod is namespace/name.
	Pod string
	// Request describes what it asks for ("8 GPUs", "30% of a GPU").
	Request string
	// Why is the scheduler's or kubelet's message.
	Why string
}

// Load lists nodes and pods through the API and builds the view.
func Load(ctx context.Context, client kubernetes.Interface) (*View, error) {
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	pods, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing pods: %w", err)
	}
	return Build(nodes.Items, pods.Items), nil
}

// request is what a pod asks for, summed over its containers.
type request struct {
	whole, units int
}

func podRequest(pod *corev1.Pod) request {
	var r request
	for _, c := range pod.Spec.Containers {
		r.whole += quantity(c.Resources, api.ResourceGPU)
		r.units += quantity(c.Resources, api.ResourceFraction)
	}
	return r
}

func quantity(res corev1.ResourceRequirements, name corev1.ResourceName) int {
	if q, ok := res.Limits[name]; ok {
		return int(q.Value())
	}
	if q, ok := res.Requests[name]; ok {
		return int(q.Value())
	}
	return 0
}

func (r request) String() string {
	var parts []string
	if r.whole == 1 {
		parts = append(parts, "1 GPU")
	} else if r.whole > 1 {
		parts = append(parts, fmt.Sprintf("%d GPUs", r.whole))
	}
	if r.units > 0 {
		parts = append(parts, fmt.Sprintf("%d%% of a GPU", r.units))
	}
	return strings.Join(parts, " + ")
}

// Build makes the view from nodes and pods: pure, for tests.
func Build(nodes []corev1.Node, pods []corev1.Pod) *View {
	v := &View{}
	byName := map[string]*Node{}
	gpuOf := map[string]*GPU{} // GPU UUID -> its entry
	for i := range nodes {
		n := &nodes[i]
		inv, invErr := api.DecodeInventory(n.Annotations[api.AnnotationGPUInventory])
		whole := n.Status.Allocatable[api.ResourceGPU]
		units := n.Status.Allocatable[api.ResourceFraction]
		if (invErr != nil || len(inv) == 0) && whole.IsZero() && units.IsZero() {
			continue
		}
		node := Node{Name: n.Name, Ready: nodeReady(n), Inventory: invErr == nil && len(inv) > 0,
			WholeGPUs: whole.Value(), FractionUnits: units.Value()}
		slices.SortFunc(inv, func(a, b api.GPUInfo) int { return cmp.Compare(a.Index, b.Index) })
		for _, g := range inv {
			node.GPUs = append(node.GPUs, GPU{GPUInfo: g})
		}
		v.Nodes = append(v.Nodes, node)
	}
	slices.SortFunc(v.Nodes, func(a, b Node) int { return cmp.Compare(a.Name, b.Name) })
	for i := range v.Nodes {
		n := &v.Nodes[i]
		byName[n.Name] = n
		for j := range n.GPUs {
			gpuOf[n.GPUs[j].UUID] = &n.GPUs[j]
		}
	}

	slices.SortFunc(pods, func(a, b corev1.Pod) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	for i := range pods {
		p := &pods[i]
		r := podRequest(p)
		if r.whole == 0 && r.units == 0 {
			continue
		}
		name := p.Namespace + "/" + p.Name
		switch {
		case p.Status.Phase == corev1.PodFailed && p.Status.Reason == reasonUnexpectedAdmissionError:
			v.Rejected = append(v.Rejected, Pod{Pod: name, Request: r.String(), Why: strings.TrimPrefix(p.Status.Message, "Pod was rejected: ")})
			continue
		case p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed:
			continue
		case p.Spec.NodeName == "":
			v.Pending = append(v.Pending, Pod{Pod: name, Request: r.String(), Why: schedulingMessage(p)})
			continue
		}
		node := byName[p.Spec.NodeName]
		if node == nil {
			continue
		}
		place(node, gpuOf, p, name, r)
	}
	return v
}

// place records a bound pod's holdings on its node's GPUs, or as unplaced.
func place(node *Node, gpuOf map[string]*GPU, p *corev1.Pod, name string, r request) {
	if r.units > 0 {
		h := Holder{Pod: name, Phase: p.Status.Phase, Percent: r.units, Role: "fraction"}
		if g := gpuOf[p.Annotations[api.AnnotationAllocatedGPU]]; g != nil {
			g.Holders = append(g.Holders, h)
		} else {
			node.Unplaced = append(node.Unplaced, h)
		}
	}
	if r.whole == 0 {
		return
	}
	if uuid := p.Annotations[api.AnnotationReservedGPU]; uuid != "" && gpuOf[uuid] != nil {
		g := gpuOf[uuid]
		g.Holders = append(g.Holders, Holder{Pod: name, Phase: p.Status.Phase, Percent: 100, Whole: 1, Role: "reservation"})
		return
	}
	// Whole GPUs are attributed when the node agent lists them in allocated-gpu
	// (comma-separated); otherwise only the node is known.
	placed := 0
	for uuid := range strings.SplitSeq(p.Annotations[api.AnnotationAllocatedGPU], ",") {
		if g := gpuOf[strings.TrimSpace(uuid)]; g != nil && r.units == 0 {
			g.Holders = append(g.Holders, Holder{Pod: name, Phase: p.Status.Phase, Percent: 100, Whole: 1, Role: "whole"})
			placed++
		}
	}
	if placed < r.whole {
		node.Unplaced = append(node.Unplaced, Holder{Pod: name, Phase: p.Status.Phase, Whole: r.whole - placed, Role: "whole"})
	}
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// schedulingMessage is why a pod is not bound yet, from its PodScheduled condition.
func schedulingMessage(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return strings.TrimSpace(c.Reason + ": " + c.Message)
		}
	}
	return "waiting for a scheduler"
}

// Options controls Render.
type Options struct {
	// Wide prints full GPU UUIDs.
	Wide bool
}

// Render prints the view as text.
func (v *View) Render(w io.Writer, opts Options) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if len(v.Nodes) == 0 {
		fmt.Fprintln(tw, "No GPU nodes.")
	}
	for i, n := range v.Nodes {
		if i > 0 {
			fmt.Fprintln(tw)
		}
		renderNode(tw, n, opts)
	}
	if len(v.Pending) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "Pending GPU pods:")
		for _, p := range v.Pending {
			fmt.Fprintf(tw, "  %s\t%s\t%s\n", p.Pod, p.Request, p.Why)
		}
	}
	if len(v.Rejected) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "Rejected at device admission (Failed):")
		for _, p := range v.Rejected {
			fmt.Fprintf(tw, "  %s\t%s\t%s\n", p.Pod, p.Request, p.Why)
		}
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("printing GPU view: %w", err)
	}
	return nil
}

func renderNode(w io.Writer, n Node, opts Options) {
	status := "Ready"
	if !n.Ready {
		status = "NotReady"
	}
	model := "GPUs not published (no gpufrac-node?)"
	if n.Inventory {
		model = fmt.Sprintf("%d× %s, %d GiB each", len(n.GPUs), n.GPUs[0].Model, (n.GPUs[0].MemoryMiB+512)/1024)
	}
	fmt.Fprintf(w, "NODE %s (%s)  %s  allocatable: %s %d, %s %d\n", n.Name, status, model,
		api.ResourceGPU, n.WholeGPUs, api.ResourceFraction, n.FractionUnits)
	if n.Inventory {
		fmt.Fprintln(w, "  GPU\tUUID\tMODE\tHEALTH\tUSED\tHELD BY")
		for _, g := range n.GPUs {
			uuid := g.UUID
			if !opts.Wide && len(uuid) > 12 {
				uuid = uuid[:12] + "…"
			}
			health := "ok"
			if !g.Healthy {
				health = "UNHEALTHY"
			}
			used := "-"
			if len(g.Holders) > 0 {
				used = fmt.Sprintf("%d%%", g.UsedPercent())
			}
			fmt.Fprintf(w, "  %d\t%s\t%s\t%s\t%s\t%s\n", g.Index, uuid, g.Mode, health, used, holders(g.Holders))
		}
	}
	var whole, fractions []string
	for _, h := range n.Unplaced {
		if h.Role == "fraction" {
			fractions = append(fractions, describe(h))
		} else {
			whole = append(whole, fmt.Sprintf("%s ×%d", h.Pod, h.Whole)+phaseNote(h.Phase))
		}
	}
	if len(whole) > 0 {
		fmt.Fprintf(w, "  whole GPUs held (which GPUs is not published by gpufrac-node): %s\n", strings.Join(whole, ", "))
	}
	if len(fractions) > 0 {
		fmt.Fprintf(w, "  fractions whose GPU is not written back yet: %s\n", strings.Join(fractions, ", "))
	}
}

func holders(hs []Holder) string {
	if len(hs) == 0 {
		return "free"
	}
	parts := make([]string, 0, len(hs))
	for _, h := range hs {
		parts = append(parts, describe(h))
	}
	return strings.Join(parts, ", ")
}

// describe renders one holding of a GPU: "default/p 30%", "default/train (whole)"
// or "default/r (reservation)", plus the phase when it is not Running.
func describe(h Holder) string {
	var s string
	switch h.Role {
	case "fraction":
		s = fmt.Sprintf("%s %d%%", h.Pod, h.Percent)
	case "reservation":
		s = h.Pod + " (reservation)"
	default:
		s = h.Pod + " (whole)"
	}
	return s + phaseNote(h.Phase)
}

// phaseNote is " [Phase]" for pods not Running.
func phaseNote(p corev1.PodPhase) string {
	if p == corev1.PodRunning || p == "" {
		return ""
	}
	return " [" + string(p) + "]"
}
