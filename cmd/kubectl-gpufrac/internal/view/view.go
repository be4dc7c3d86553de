// Package view builds and prints the cluster's GPU view for kubectl-gpufrac: per
// node, per GPU, who holds what. Everything comes from the API: each node's GPU
// inventory (annotation gpufrac.io/gpus, written by gpufrac-node), its Karpenter
// labels, and the pods' requests, annotations (gpufrac.io/allocated-gpu,
// gpufrac.io/reserved-gpu, karpenter.sh/do-not-disrupt) and conditions; on nodes
// in mode dra, the allocated ResourceClaims of gpufrac's driver (which device of
// which GPU, what share, reserved for which pods) and the ResourceSlices that
// name the devices' GPUs.
package view

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpufrac/gpufrac/api"
	gpurequest "github.com/gpufrac/gpufrac/api/request"
)

const (
	// reasonUnexpectedAdmissionError is the kubelet's reason for a pod whose device
	// allocation failed at admission.
	reasonUnexpectedAdmissionError = "UnexpectedAdmissionError"
	// labelKarpenterNodePool is the label Karpenter puts on every node it creates.
	labelKarpenterNodePool = "karpenter.sh/nodepool"
	// annotationPlaceholderWorkloads lists the pods a placeholder asks capacity
	// for (coordinator/placeholder.AnnotationWorkloads; not imported: that
	// package brings the coordinator's controllers; the queue view imports
	// only the coordinator's request parsing and quota arithmetic).
	annotationPlaceholderWorkloads = api.Domain + "/workloads"
)

// Role says what a holding is.
type Role string

// The roles of pods holding GPU capacity.
const (
	// RoleWhole is a pod holding whole GPUs (nvidia.com/gpu).
	RoleWhole Role = "whole"
	// RoleFraction is a pod holding a fraction of one GPU.
	RoleFraction Role = "fraction"
	// RoleReservation is gpufrac-coordinator's reservation pod holding a shared
	// GPU whole for its fractions.
	RoleReservation Role = "reservation"
	// RolePlaceholder is gpufrac-coordinator's placeholder pod holding capacity
	// it asked Karpenter for, until the real pods are placed.
	RolePlaceholder Role = "placeholder"
	// RoleClaim is a pod holding part of a GPU through a resource claim of
	// gpufrac's DRA driver (a share of percent or of bytes); a claim for a
	// whole GPU is RoleWhole, for a MIG device RoleMIG.
	RoleClaim Role = "claim"
	// RoleMIG is a pod holding a MIG device of the GPU through a claim.
	RoleMIG Role = "mig"
)

// View is the cluster's GPUs and the pods that hold or want them.
type View struct {
	// Nodes are the nodes with GPUs, by name.
	Nodes []Node
	// Pending are GPU pods not bound to a node yet (placeholders excluded).
	Pending []Pod
	// Placeholders are pending placeholder pods: capacity asked from Karpenter.
	Placeholders []Pod
	// Rejected are GPU pods a kubelet refused at device admission.
	Rejected []Pod
}

// Node is one node with GPUs.
type Node struct {
	// Name is the node's name.
	Name string
	// Ready is the node's Ready condition.
	Ready bool
	// Cordoned: the node is unschedulable (kubectl cordon, a drain); no
	// scheduler places new pods there.
	Cordoned bool
	// Inventory is false when no gpufrac-node published the node's GPUs.
	Inventory bool
	// GPUs are the node's GPUs by index.
	GPUs []GPU
	// WholeGPUs and FractionUnits are the node's allocatable counts.
	WholeGPUs, FractionUnits int64
	// MIG is the node's allocatable MIG devices, by resource
	// (nvidia.com/mig-1g.10gb -> 7); none is 0 or absent.
	MIG map[string]int64
	// NodePool is the Karpenter NodePool that made the node ("" for nodes
	// Karpenter does not manage); InstanceType its instance type.
	NodePool, InstanceType string
	// DoNotDisrupt are the running pods annotated karpenter.sh/do-not-disrupt:
	// while any is there, Karpenter does not disrupt the node.
	DoNotDisrupt []Holder
	// Unplaced are pods on the node holding GPUs that no annotation ties to a GPU
	// yet (gpufrac-node writes the GPUs back within seconds of admission).
	Unplaced []Holder
	// DRA is set for nodes in mode dra: their GPUs are served through gpufrac's
	// DRA driver and held through claims.
	DRA bool
}

// GPU is one GPU of a node.
type GPU struct {
	api.GPUInfo
	// Holders are the pods holding (part of) the GPU, reservations first.
	Holders []Holder
}

// UsedPercent is how much of the GPU its holders use, 0 to 100 (more means
// the annotations disagree): the sum of its fractions, or 100 when a pod or
// placeholder holds it whole. A reservation holds the GPU for its fractions
// and adds nothing itself.
func (g GPU) UsedPercent() int {
	used := 0
	for _, h := range g.Holders {
		switch h.Role {
		case RoleFraction, RoleClaim:
			used += h.Percent
		case RoleWhole, RolePlaceholder, RoleMIG:
			used += 100
		}
	}
	return used
}

// Reserved tells whether a reservation pod holds the GPU.
func (g GPU) Reserved() bool {
	return slices.ContainsFunc(g.Holders, func(h Holder) bool { return h.Role == RoleReservation })
}

// Holder is a pod holding GPU capacity.
type Holder struct {
	// Pod is namespace/name.
	Pod string
	// Phase is the pod's phase.
	Phase corev1.PodPhase
	// Terminating is set when the pod is being deleted.
	Terminating bool
	// Percent of one GPU, for fractions.
	Percent int
	// Whole counts whole GPUs (nvidia.com/gpu) the pod holds.
	Whole int
	// Role says what the holding is.
	Role Role
	// Gang is the pod's gang (label gpufrac.io/pod-group), if any.
	Gang string
	// Claim names the resource claim a RoleClaim, RoleMIG or claim-held
	// RoleWhole holding comes through (namespace/name), and Detail what it
	// holds ("30%", "20 GiB", "1g.10gb").
	Claim, Detail string
}

// Pod is a GPU pod outside the node view.
type Pod struct {
	// Pod is namespace/name.
	Pod string
	// Request describes what it asks for ("8 GPUs", "30% of a GPU").
	Request string
	// Queue is the pod's gpufrac.io/queue label, or for a placeholder the pods
	// it asks capacity for.
	Queue string
	// Why is the scheduler's or kubelet's reason and message.
	Why string
}

// Load lists nodes and pods through the API and builds the view. Resource
// claims and slices are read when the API server serves them and the user may
// list them; without them, nodes in mode dra show their GPUs free. With
// node set, only that node is read (get nodes) with the pods bound to it
// (a field selector), so Pending and Placeholders stay empty.
func Load(ctx context.Context, client kubernetes.Interface, node string) (*View, error) {
	var nodes []corev1.Node
	podOpts := metav1.ListOptions{}
	if node != "" {
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("reading node %s: %w", node, err)
		}
		nodes = []corev1.Node{*n}
		podOpts.FieldSelector = "spec.nodeName=" + node
	} else {
		l, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("listing nodes: %w", err)
		}
		nodes = l.Items
	}
	pods, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, podOpts)
	if err != nil {
		return nil, fmt.Errorf("listing pods: %w", err)
	}
	var claims []resourceapi.ResourceClaim
	var resourceSlices []resourceapi.ResourceSlice
	if l, err := client.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{}); err == nil {
		claims = l.Items
	}
	if l, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.driver=" + api.DRADriver}); err == nil {
		resourceSlices = l.Items
	}
	items := pods.Items
	if node != "" {
		// The field selector did this already; kept for API servers (and
		// fakes) that ignore it.
		items = slices.DeleteFunc(items, func(p corev1.Pod) bool { return p.Spec.NodeName != node })
	}
	v := BuildWithClaims(nodes, items, claims, resourceSlices)
	if node != "" && len(v.Nodes) == 0 {
		return nil, fmt.Errorf("node %s: %w", node, ErrNoGPUs)
	}
	return v, nil
}

// ErrNoGPUs reports a node asked for by name that has no GPUs gpufrac knows of.
var ErrNoGPUs = errors.New("no GPUs (no gpufrac.io/gpus inventory and no GPU resources allocatable)")

// request is what a pod asks for, summed over its containers.
type request struct {
	whole, units int
}

// podRequest reads the pod through the request model (api/request) that
// the coordinator and gpufrac-node use.
func podRequest(pod *corev1.Pod) request {
	r := gpurequest.Parse(pod, gpurequest.Options{})
	return request{whole: r.Whole(), units: r.Fraction()}
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

// roleOf tells a pod's role from its labels, namespace and request.
func roleOf(p *corev1.Pod, r request) Role {
	if p.Namespace == api.ReservationNamespace {
		switch p.Labels[api.LabelRole] {
		case api.RoleReservation:
			return RoleReservation
		case api.RolePlaceholder:
			return RolePlaceholder
		}
	}
	if r.units > 0 {
		return RoleFraction
	}
	return RoleWhole
}

// Build makes the view from nodes and pods: pure, for tests.
func Build(nodes []corev1.Node, pods []corev1.Pod) *View {
	return BuildWithClaims(nodes, pods, nil, nil)
}

// BuildWithClaims is Build plus the resource claims and slices of gpufrac's
// DRA driver, which say who holds the GPUs of nodes in mode dra.
func BuildWithClaims(nodes []corev1.Node, pods []corev1.Pod, claims []resourceapi.ResourceClaim, resourceSlices []resourceapi.ResourceSlice) *View {
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
		node := Node{Name: n.Name, Ready: nodeReady(n), Cordoned: n.Spec.Unschedulable, Inventory: invErr == nil && len(inv) > 0,
			WholeGPUs: whole.Value(), FractionUnits: units.Value(),
			NodePool: n.Labels[labelKarpenterNodePool], InstanceType: n.Labels[corev1.LabelInstanceTypeStable]}
		for name, q := range n.Status.Allocatable {
			if strings.HasPrefix(string(name), api.MIGResourcePrefix) && q.Value() > 0 {
				if node.MIG == nil {
					node.MIG = map[string]int64{}
				}
				node.MIG[string(name)] = q.Value()
			}
		}
		slices.SortFunc(inv, func(a, b api.GPUInfo) int { return cmp.Compare(a.Index, b.Index) })
		for _, g := range inv {
			node.GPUs = append(node.GPUs, GPU{GPUInfo: g})
			node.DRA = node.DRA || g.Driver == api.DRADriver
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
		terminal := p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
		if node := byName[p.Spec.NodeName]; node != nil && !terminal && p.Annotations[api.AnnotationDoNotDisrupt] == "true" {
			node.DoNotDisrupt = append(node.DoNotDisrupt, Holder{Pod: p.Namespace + "/" + p.Name, Role: roleOf(p, r)})
		}
		if r.whole == 0 && r.units == 0 {
			if len(p.Spec.ResourceClaims) > 0 && p.Spec.NodeName == "" && !terminal {
				// Claims (nodes in mode dra): their holdings come from the claims.
				pp := Pod{Pod: p.Namespace + "/" + p.Name, Request: claimRequest(p), Queue: p.Labels[api.LabelQueue], Why: schedulingMessage(p)}
				if roleOf(p, r) == RolePlaceholder {
					pp.Queue = p.Annotations[annotationPlaceholderWorkloads]
					v.Placeholders = append(v.Placeholders, pp)
				} else {
					v.Pending = append(v.Pending, pp)
				}
			}
			continue
		}
		name := p.Namespace + "/" + p.Name
		role := roleOf(p, r)
		switch {
		case p.Status.Phase == corev1.PodFailed && p.Status.Reason == reasonUnexpectedAdmissionError:
			v.Rejected = append(v.Rejected, Pod{Pod: name, Request: r.String(), Queue: p.Labels[api.LabelQueue],
				Why: strings.TrimPrefix(p.Status.Message, "Pod was rejected: ")})
			continue
		case terminal:
			continue
		case p.Spec.NodeName == "" && role == RolePlaceholder:
			v.Placeholders = append(v.Placeholders, Pod{Pod: name, Request: r.String(),
				Queue: p.Annotations[annotationPlaceholderWorkloads], Why: schedulingMessage(p)})
			continue
		case p.Spec.NodeName == "":
			v.Pending = append(v.Pending, Pod{Pod: name, Request: r.String(), Queue: p.Labels[api.LabelQueue], Why: schedulingMessage(p)})
			continue
		}
		node := byName[p.Spec.NodeName]
		if node == nil || node.DRA {
			// On a node in mode dra even gpufrac.io/gpu-fraction and
			// nvidia.com/gpu are held through claims: placeClaims shows them.
			continue
		}
		place(node, gpuOf, p, Holder{Pod: name, Phase: p.Status.Phase, Terminating: p.DeletionTimestamp != nil, Role: role,
			Gang: p.Labels[api.LabelPodGroup]}, r)
	}
	placeClaims(byName, gpuOf, pods, claims, resourceSlices)
	for i := range v.Nodes {
		for j := range v.Nodes[i].GPUs {
			// Reservations first: they say the GPU is shared.
			slices.SortStableFunc(v.Nodes[i].GPUs[j].Holders, func(a, b Holder) int {
				return cmp.Compare(rank(a.Role), rank(b.Role))
			})
		}
	}
	return v
}

// claimRequest describes what a pod asks through claims: its claim entries.
func claimRequest(p *corev1.Pod) string {
	if n := p.Annotations[api.Domain+"/claim-gpus"]; n != "" {
		return n + " GPUs (claim)"
	}
	names := make([]string, 0, len(p.Spec.ResourceClaims))
	for _, c := range p.Spec.ResourceClaims {
		switch {
		case c.ResourceClaimTemplateName != nil:
			names = append(names, *c.ResourceClaimTemplateName)
		case c.ResourceClaimName != nil:
			names = append(names, *c.ResourceClaimName)
		}
	}
	return "claims " + strings.Join(names, ", ")
}

// dev is a device of gpufrac's driver: the GPU it is part of and what it is.
type dev struct {
	gpu, profile string
	view         api.DRAView
	memoryBytes  int64
}

// placeClaims records the allocated claims of gpufrac's driver on the GPUs of
// nodes in mode dra: each device (or share of one) to the pods the claim is
// reserved for. Devices are tied to GPUs through the slices (attribute uuid,
// parentUUID for MIG devices).
func placeClaims(byName map[string]*Node, gpuOf map[string]*GPU, pods []corev1.Pod, claims []resourceapi.ResourceClaim, resourceSlices []resourceapi.ResourceSlice) {
	devs := map[[2]string]dev{} // pool, device -> what it is
	str := func(d resourceapi.Device, name string) string {
		if a, ok := d.Attributes[resourceapi.QualifiedName(name)]; ok && a.StringValue != nil {
			return *a.StringValue
		}
		return ""
	}
	for _, s := range resourceSlices {
		for _, d := range s.Spec.Devices {
			_, view, err := api.ParseDRADeviceName(d.Name)
			if err != nil {
				continue
			}
			x := dev{gpu: str(d, api.DRAAttrUUID), view: view, profile: str(d, api.DRAAttrProfile)}
			if p := str(d, api.DRAAttrParentUUID); p != "" {
				x.gpu = p
			}
			if a, ok := d.Attributes[api.DRAAttrMemoryBytes]; ok && a.IntValue != nil {
				x.memoryBytes = *a.IntValue
			}
			devs[[2]string{s.Spec.Pool.Name, d.Name}] = x
		}
	}
	podByUID := map[string]*corev1.Pod{}
	for i := range pods {
		podByUID[string(pods[i].UID)] = &pods[i]
	}
	for _, c := range claims {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver != api.DRADriver || byName[r.Pool] == nil {
				continue
			}
			d, ok := devs[[2]string{r.Pool, r.Device}]
			g := gpuOf[d.gpu]
			if !ok || g == nil {
				continue
			}
			h := Holder{Claim: c.Namespace + "/" + c.Name}
			switch d.view {
			case api.DRAViewShares:
				q := r.ConsumedCapacity[api.DRACapacityShares]
				h.Role, h.Percent, h.Detail = RoleClaim, int(q.Value()), fmt.Sprintf("%d%%", q.Value())
			case api.DRAViewMemory:
				q := r.ConsumedCapacity[api.DRACapacityMemory]
				h.Role, h.Detail = RoleClaim, fmt.Sprintf("%d GiB", (q.Value()+1<<29)>>30)
				if d.memoryBytes > 0 {
					h.Percent = int((q.Value()*100 + d.memoryBytes - 1) / d.memoryBytes)
				}
			case api.DRAViewMIG:
				h.Role, h.Whole, h.Detail = RoleMIG, 1, d.profile
			default:
				h.Role, h.Whole = RoleWhole, 1
			}
			holders := 0
			for _, ref := range c.Status.ReservedFor {
				p := podByUID[string(ref.UID)]
				if p == nil {
					continue
				}
				x := h
				x.Pod, x.Phase, x.Terminating, x.Gang = p.Namespace+"/"+p.Name, p.Status.Phase, p.DeletionTimestamp != nil, p.Labels[api.LabelPodGroup]
				if p.Namespace == api.ReservationNamespace && p.Labels[api.LabelRole] == api.RolePlaceholder {
					x.Role = RolePlaceholder
				}
				if holders > 0 {
					x.Percent = 0 // a claim shared by pods holds its share once
				}
				g.Holders = append(g.Holders, x)
				holders++
			}
			if holders == 0 {
				h.Pod = "(claim " + h.Claim + ")"
				g.Holders = append(g.Holders, h)
			}
		}
	}
}

func rank(r Role) int {
	if r == RoleReservation {
		return 0
	}
	return 1
}

// place records a bound pod's holdings on its node's GPUs, or as unplaced.
func place(node *Node, gpuOf map[string]*GPU, p *corev1.Pod, h Holder, r request) {
	if r.units > 0 {
		f := h
		f.Role, f.Percent = RoleFraction, r.units
		if g := gpuOf[p.Annotations[api.AnnotationAllocatedGPU]]; g != nil {
			g.Holders = append(g.Holders, f)
		} else {
			node.Unplaced = append(node.Unplaced, f)
		}
	}
	if r.whole == 0 {
		return
	}
	if h.Role == RoleReservation {
		if g := gpuOf[p.Annotations[api.AnnotationReservedGPU]]; g != nil {
			h.Whole = 1
			g.Holders = append(g.Holders, h)
			return
		}
		h.Whole = r.whole
		node.Unplaced = append(node.Unplaced, h)
		return
	}
	// gpufrac-node lists the whole GPUs a pod holds in allocated-gpu
	// (comma-separated); a pod that also holds a fraction has its fraction's
	// GPU there instead.
	placed := 0
	if r.units == 0 {
		for uuid := range strings.SplitSeq(p.Annotations[api.AnnotationAllocatedGPU], ",") {
			if g := gpuOf[strings.TrimSpace(uuid)]; g != nil {
				w := h
				w.Whole = 1
				g.Holders = append(g.Holders, w)
				placed++
			}
		}
	}
	if placed < r.whole {
		w := h
		w.Whole = r.whole - placed
		node.Unplaced = append(node.Unplaced, w)
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
			return strings.TrimSuffix(strings.TrimSpace(c.Reason+": "+c.Message), ":")
		}
	}
	return "waiting for a scheduler"
}

// Options controls Render.
type Options struct {
	// Wide prints full GPU UUIDs and reservation pod names.
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
		fmt.Fprintln(tw, "  POD\tASKS\tQUEUE\tWHY")
		for _, p := range v.Pending {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", p.Pod, p.Request, orDash(p.Queue), p.Why)
		}
	}
	if len(v.Placeholders) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "Placeholders (gpufrac-coordinator asking Karpenter for capacity):")
		fmt.Fprintln(tw, "  POD\tASKS\tFOR\tWHY")
		for _, p := range v.Placeholders {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", p.Pod, p.Request, orDash(p.Queue), p.Why)
		}
	}
	if len(v.Rejected) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "Rejected at device admission (Failed):")
		for _, p := range v.Rejected {
			fmt.Fprintf(tw, "  %s\t%s\t%s\n", p.Pod, p.Request, p.Why)
		}
	}
	if len(v.Nodes) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, v.summary())
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("printing GPU view: %w", err)
	}
	return nil
}

// summary is one line of totals.
func (v *View) summary() string {
	var gpus, whole, shared, fractions, free, fromKarpenter int
	for _, n := range v.Nodes {
		if n.NodePool != "" {
			fromKarpenter++
		}
		for _, g := range n.GPUs {
			gpus++
			var frac, hold int
			for _, h := range g.Holders {
				switch h.Role {
				case RoleFraction, RoleClaim:
					frac++
				case RoleWhole, RolePlaceholder, RoleMIG:
					hold++
				}
			}
			switch {
			case frac > 0:
				shared++
				fractions += frac
			case hold > 0:
				whole++
			case len(g.Holders) == 0:
				free++
			}
		}
	}
	s := plural(gpus, "GPU") + " on " + plural(len(v.Nodes), "node")
	if fromKarpenter > 0 {
		s += fmt.Sprintf(" (%d made by Karpenter)", fromKarpenter)
	}
	s += fmt.Sprintf(": %d held whole, %d shared by %s, %d free", whole, shared, plural(fractions, "fraction"), free)
	if reserved := gpus - whole - shared - free; reserved > 0 {
		s += fmt.Sprintf(", %d reserved with no fraction yet", reserved)
	}
	if len(v.Pending) > 0 {
		s += "; " + plural(len(v.Pending), "GPU pod") + " pending"
	}
	return s + "."
}

// plural is "1 GPU", "2 GPUs".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func renderNode(w io.Writer, n Node, opts Options) {
	status := "Ready"
	if !n.Ready {
		status = "NotReady"
	}
	if n.Cordoned {
		status += ", cordoned"
	}
	model := "GPUs not published (no gpufrac-node?)"
	if n.Inventory {
		model = fmt.Sprintf("%d× %s, %d GiB each", len(n.GPUs), n.GPUs[0].Model, (n.GPUs[0].MemoryMiB+512)/1024)
	}
	origin := ""
	if n.NodePool != "" {
		origin = "  made by Karpenter (NodePool " + n.NodePool
		if n.InstanceType != "" {
			origin += ", " + n.InstanceType
		}
		origin += ")"
	}
	if n.DRA {
		fmt.Fprintf(w, "NODE %s (%s)%s  %s  served through DRA (driver %s)\n", n.Name, status, origin, model, api.DRADriver)
	} else {
		mig := ""
		for _, name := range slices.Sorted(maps.Keys(n.MIG)) {
			mig += fmt.Sprintf(", %s %d", name, n.MIG[name])
		}
		fmt.Fprintf(w, "NODE %s (%s)%s  %s  allocatable: %s %d, %s %d%s\n", n.Name, status, origin, model,
			api.ResourceGPU, n.WholeGPUs, api.ResourceFraction, n.FractionUnits, mig)
	}
	renderProtection(w, n, opts)
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
			mode := g.Mode
			if len(g.MIGDevices) > 0 {
				mode += " " + migDevices(g.MIGDevices)
			}
			if g.Driver == api.DRADriver {
				mode += " (DRA)"
			}
			fmt.Fprintf(w, "  %d\t%s\t%s\t%s\t%s\t%s\n", g.Index, uuid, mode, health, used, holders(g.Holders, opts))
		}
	}
	var whole, fractions []string
	for _, h := range n.Unplaced {
		switch h.Role {
		case RoleFraction:
			fractions = append(fractions, describe(h, opts))
		default:
			whole = append(whole, fmt.Sprintf("%s ×%d", h.Pod, h.Whole)+phaseNote(h))
		}
	}
	if len(whole) > 0 {
		fmt.Fprintf(w, "  whole GPUs held, which ones not written back yet: %s\n", strings.Join(whole, ", "))
	}
	if len(fractions) > 0 {
		fmt.Fprintf(w, "  fractions whose GPU is not written back yet: %s\n", strings.Join(fractions, ", "))
	}
}

// migDevices describes a GPU's MIG devices by profile: "7× 1g.10gb",
// "1× 3g.40gb + 2× 1g.10gb".
func migDevices(ds []api.MIGDeviceInfo) string {
	count := map[string]int{}
	for _, d := range ds {
		count[d.Profile]++
	}
	var parts []string
	for _, p := range slices.Sorted(maps.Keys(count)) {
		parts = append(parts, fmt.Sprintf("%d× %s", count[p], p))
	}
	return strings.Join(parts, " + ")
}

// renderProtection says which pods keep Karpenter from disrupting the node.
// For a node Karpenter made without such pods it says Karpenter may
// consolidate it.
func renderProtection(w io.Writer, n Node, opts Options) {
	if len(n.DoNotDisrupt) == 0 {
		if n.NodePool != "" {
			fmt.Fprintln(w, "  no do-not-disrupt pods: Karpenter may consolidate this node when it is empty or underused")
		}
		return
	}
	reservations := 0
	var others []string
	for _, h := range n.DoNotDisrupt {
		if h.Role == RoleReservation && !opts.Wide {
			reservations++
			continue
		}
		others = append(others, h.Pod)
	}
	var parts []string
	switch reservations {
	case 0:
	case 1:
		parts = append(parts, "1 reservation (shared GPU)")
	default:
		parts = append(parts, fmt.Sprintf("%d reservations (shared GPUs)", reservations))
	}
	parts = append(parts, others...)
	fmt.Fprintf(w, "  do-not-disrupt: %s\n", strings.Join(parts, ", "))
}

func holders(hs []Holder, opts Options) string {
	if len(hs) == 0 {
		return "free"
	}
	parts := make([]string, 0, len(hs))
	for _, h := range hs {
		parts = append(parts, describe(h, opts))
	}
	return strings.Join(parts, ", ")
}

// describe renders one holding of a GPU: "default/p 30%", "default/train (whole)",
// "default/w (whole, gang g)", "[reservation]" (with its name when wide) or
// "gpufrac-reservations/p (placeholder)", plus the phase when the pod is not Running.
func describe(h Holder, opts Options) string {
	var s string
	switch h.Role {
	case RoleFraction:
		s = fmt.Sprintf("%s %d%%", h.Pod, h.Percent)
		if h.Gang != "" {
			s += " (gang " + h.Gang + ")"
		}
	case RoleClaim, RoleMIG:
		s = fmt.Sprintf("%s %s (claim)", h.Pod, h.Detail)
		if opts.Wide {
			s = fmt.Sprintf("%s %s (claim %s)", h.Pod, h.Detail, h.Claim)
		}
	case RoleReservation:
		s = "[reservation]"
		if opts.Wide {
			s = "[reservation " + h.Pod + "]"
		}
	case RolePlaceholder:
		s = h.Pod + " (placeholder)"
	default:
		s = h.Pod + " (whole)"
		if h.Gang != "" {
			s = h.Pod + " (whole, gang " + h.Gang + ")"
		}
	}
	return s + phaseNote(h)
}

// phaseNote is " [Phase]" for pods not Running, " [Terminating]" for pods
// being deleted.
func phaseNote(h Holder) string {
	switch {
	case h.Terminating:
		return " [Terminating]"
	case h.Phase == corev1.PodRunning || h.Phase == "":
		return ""
	}
	return " [" + string(h.Phase) + "]"
}
