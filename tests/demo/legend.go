package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/tests/cluster"
)

// facts are what the legend says about the running demo.
type facts struct {
	static, karpenter []string // node names (Karpenter's with their instance type)
	dra               []string // static nodes in mode dra
	real              []string // real nodes (kubelet and containerd on this machine)
	claimPods         []string // running demo pods whose GPU comes from a claim
	claimGPUs         int      // GPUs holding at least one allocated claim
	fractions         int      // running fraction pods
	sharedGPUs        int      // GPUs holding at least one running fraction
	reservations      int      // reservation pods holding a GPU
	whole             []string // running whole-GPU demo pods, with notes
	gangs             []string // "group (pod, pod)"
	refused           []string // "pod (Reason)"
	doNotDisrupt      int      // running demo pods annotated do-not-disrupt
	// bought: instance type -> Karpenter's GPU nodes of it; boughtGPUs their
	// GPUs and boughtPrice their price per hour (the kwok provider's
	// eks-node-viewer/instance-price label; 0 when a node lacks it).
	bought      map[string]int
	boughtGPUs  int
	boughtPrice float64
}

// gatherFacts reads the cluster for the legend.
func gatherFacts(ctx context.Context, client kubernetes.Interface) (facts, error) {
	var f facts
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: api.LabelGPUNode + "=true"})
	if err != nil {
		return f, fmt.Errorf("listing GPU nodes: %w", err)
	}
	for _, n := range nodes.Items {
		if _, ok := n.Labels[labelKarpenterNodePool]; ok {
			typ := n.Labels[corev1.LabelInstanceTypeStable]
			f.karpenter = append(f.karpenter, n.Name+" ("+typ+")")
			if f.bought == nil {
				f.bought = map[string]int{}
			}
			f.bought[typ]++
			q := n.Status.Capacity[api.ResourceGPU]
			f.boughtGPUs += int(q.Value())
			if price, err := strconv.ParseFloat(n.Labels[labelInstancePrice], 64); err == nil && f.boughtPrice >= 0 {
				f.boughtPrice += price
			} else {
				f.boughtPrice = -1 // unknown
			}
		} else if n.Labels[servingLabel] == "dra" {
			f.dra = append(f.dra, n.Name)
		} else if n.Name == realNode {
			f.real = append(f.real, n.Name)
		} else {
			f.static = append(f.static, n.Name)
		}
	}
	pods, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return f, fmt.Errorf("listing pods: %w", err)
	}
	shared := map[string]bool{}
	gangs := map[string][]string{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Namespace == api.ReservationNamespace && p.Labels[api.LabelRole] == api.RoleReservation && p.Annotations[api.AnnotationReservedGPU] != "" {
			f.reservations++
			continue
		}
		if p.Labels[demoLabel] != demoLabelValue {
			continue
		}
		if p.Status.Phase != corev1.PodRunning {
			if reason, _ := scheduledCondition(p); slices.Contains(refusedReasons, reason) {
				f.refused = append(f.refused, p.Name+" ("+reason+")")
			}
			continue
		}
		if p.Annotations[api.AnnotationDoNotDisrupt] == "true" {
			f.doNotDisrupt++
		}
		if len(p.Spec.ResourceClaims) > 0 || p.Status.ExtendedResourceClaimStatus != nil {
			f.claimPods = append(f.claimPods, p.Name)
			continue
		}
		if isFraction(p) {
			f.fractions++
			shared[p.Annotations[api.AnnotationAllocatedGPU]] = true
			continue
		}
		if g := p.Labels[api.LabelPodGroup]; g != "" {
			gangs[g] = append(gangs[g], p.Name)
			continue
		}
		if gpuPod(p) {
			note := ""
			if p.Annotations[api.AnnotationPreemptible] == "false" {
				note = " (non-preemptible: the coordinator annotated it karpenter.sh/do-not-disrupt)"
			}
			f.whole = append(f.whole, p.Name+note)
		}
	}
	f.sharedGPUs = len(shared)
	f.boughtPrice = max(f.boughtPrice, 0)
	claims, err := client.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return f, fmt.Errorf("listing resource claims: %w", err)
	}
	claimed := map[string]bool{}
	for _, c := range claims.Items {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			if minor, _, err := api.ParseDRADeviceName(r.Device); r.Driver == api.DRADriver && err == nil {
				claimed[fmt.Sprintf("%s/%d", r.Pool, minor)] = true
			}
		}
	}
	f.claimGPUs = len(claimed)
	slices.Sort(f.claimPods)
	for g, members := range gangs {
		slices.Sort(members)
		f.gangs = append(f.gangs, fmt.Sprintf("gang %s (%s)", g, strings.Join(members, ", ")))
	}
	slices.Sort(f.gangs)
	slices.Sort(f.refused)
	return f, nil
}

func isFraction(p *corev1.Pod) bool {
	for _, c := range p.Spec.Containers {
		if _, ok := c.Resources.Limits[api.ResourceFraction]; ok {
			return true
		}
	}
	return false
}

// printLegend explains the view just printed, with what is in this cluster.
func printLegend(ctx context.Context, cfg config, client kubernetes.Interface) error {
	f, err := gatherFacts(ctx, client)
	if err != nil {
		return err
	}
	writeLegend(os.Stdout, cfg, f)
	return nil
}

// writeLegend writes the legend for f.
func writeLegend(w io.Writer, cfg config, f facts) {
	var lines []string
	add := func(format string, args ...any) { lines = append(lines, fmt.Sprintf(format, args...)) }
	if len(f.static) > 0 {
		add("%s: the static nodes, %d mock H100s each, one pool; each runs a real gpufrac-node (device plugin on mock NVML) for a kubelet simulator.",
			strings.Join(f.static, ", "), cfg.gpusPerNode)
	}
	if len(f.dra) > 0 {
		add("%s: a static node group in mode dra (label and taint %s=dra), %d mock H100s a node: gpufrac-node is the DRA driver %s there and publishes each GPU in ResourceSlices as a whole device, a shareable device by percent of its memory, and a memory view; pods get GPUs through ResourceClaims, not nvidia.com/gpu or gpufrac.io/gpu-fraction.",
			strings.Join(f.dra, ", "), servingLabel, draGPUs, api.DRADriver)
	}
	if len(f.real) > 0 {
		add("%s: a real node, the kubelet v1.36.3 and containerd 2.4.2 with runc on this machine, %d mock H100s (taint %s keeps the examples off it): gpufrac-node runs there as the chart's DaemonSet pod from its image, and %s/%s runs in a container that sees only its GPU's device node.",
			strings.Join(f.real, ", "), realGPUs, realTaint, realNamespace, realPod)
	}
	if len(f.karpenter) > 0 {
		them := "them"
		if len(f.karpenter) == 1 {
			them = "it"
		}
		add("%s: made by Karpenter. gpufrac-coordinator asked for %s with placeholder pods for the burst's fractions it could not place on the static nodes; the fractions now share its GPUs.",
			strings.Join(f.karpenter, ", "), them)
	}
	if line := boughtLine(f, gpuInstanceTypes()); line != "" {
		add("%s", line)
	}
	if f.fractions > 0 {
		add("\"pod NN%%\": a fraction, NN%% of one GPU's memory, its compute time-shared (gpufrac.io/gpu-fraction): %d fractions share %d GPUs. gpufrac-coordinator chose each GPU, gpufrac-node served it and wrote it back (gpufrac.io/allocated-gpu).",
			f.fractions, f.sharedGPUs)
	}
	if len(f.claimPods) > 0 {
		add("\"(claim)\": a pod whose GPU share comes from a ResourceClaim (deployments/examples/claims.yaml: 30%% of a GPU, or 20 GiB of its memory): %s, on %d GPUs. gpufrac-coordinator allocated the claims, with its queues and placement (in a namespace a queue serves, pods with claims are gpufrac-scheduler's: the admission policies refuse kube-scheduler's); gpufrac-node prepared them with the same memory limit and watchdog as a fraction's. No reservations there: a GPU's devices draw on the same counters, so a GPU with a share allocated is never allocated whole.",
			strings.Join(f.claimPods, ", "), f.claimGPUs)
	}
	if f.reservations > 0 {
		add("[reservation]: a gpufrac-reservations pod holding a shared GPU whole, so no whole-GPU pod can land on it (%d in all). It carries karpenter.sh/do-not-disrupt: Karpenter never consolidates a node while its GPUs are shared; the reservation goes %s after the GPU's last fraction.",
			f.reservations, reservationGrace)
	}
	if len(f.whole) > 0 || len(f.gangs) > 0 {
		add("\"(whole)\": exclusive GPUs (nvidia.com/gpu), by UUID as gpufrac-node wrote them back: %s.",
			strings.Join(append(slices.Clone(f.whole), withNote(f.gangs, "placed all or nothing, in one pool")...), "; "))
	}
	add("\"do-not-disrupt\" under a node: pods that keep Karpenter from disrupting it (reservations, non-preemptible work); a Karpenter node without them may be consolidated.")
	if len(f.refused) > 0 {
		add("Pending %s: the coordinator will not place them as they stand, and says why in the pod's condition and an event. Never Unschedulable: Karpenter does not scale up for them, and no placeholder asks for capacity.",
			strings.Join(f.refused, ", "))
	}
	fmt.Fprintln(w, "\nWhat you are looking at:")
	for _, l := range lines {
		fmt.Fprintln(w, wrap("  - ", l, 110))
	}
}

// labelInstancePrice is the label the kwok provider puts the price per hour
// of a node's offering in.
const labelInstancePrice = "eks-node-viewer/instance-price"

// boughtLine says what Karpenter bought and why that is the cheap choice:
// with no price table each placeholder prefers the smallest nodes that
// hold it, and Karpenter launches the cheapest such type; types are what
// the provider sells, for the single node that would have held them all.
func boughtLine(f facts, types []cluster.InstanceType) string {
	if len(f.bought) == 0 {
		return ""
	}
	var parts []string
	for _, typ := range slices.Sorted(maps.Keys(f.bought)) {
		parts = append(parts, fmt.Sprintf("%d × %s", f.bought[typ], typ))
	}
	line := "Karpenter bought " + strings.Join(parts, ", ")
	if f.boughtPrice > 0 {
		line += fmt.Sprintf(", $%.2f/h", f.boughtPrice)
	}
	line += ": the chart sets no price table (coordinator.prices), so each placeholder prefers nodes with no more GPUs than it asks (label " +
		cluster.GPUCountLabel + "), and Karpenter launches the cheapest such instance type, by its provider's prices"
	// The cheapest single node that would have held them all, as Karpenter
	// buys for placeholders it may pack.
	var one *cluster.InstanceType
	for i, it := range types {
		q := it.Resources[api.ResourceGPU]
		if int(q.Value()) >= f.boughtGPUs && (one == nil || it.Price < one.Price) {
			one = &types[i]
		}
	}
	if one != nil && len(f.karpenter) > 1 && f.boughtPrice > 0 && one.Price > f.boughtPrice {
		q := one.Resources[api.ResourceGPU]
		line += fmt.Sprintf("; packed together they would have bought one %s, $%.2f/h with %d of its GPUs idle", one.Name, one.Price, int(q.Value())-f.boughtGPUs)
	}
	return line + ". A price table, where set, decides the mix instead."
}

func withNote(items []string, note string) []string {
	out := make([]string, 0, len(items))
	for _, it := range items {
		out = append(out, it+", "+note)
	}
	return out
}

// wrap breaks s into lines of at most width characters (words are not
// split), the first prefixed with prefix and the others indented as deep.
func wrap(prefix, s string, width int) string {
	indent := strings.Repeat(" ", len([]rune(prefix)))
	var b strings.Builder
	line := prefix
	for _, word := range strings.Fields(s) {
		if len([]rune(line))+1+len([]rune(word)) > width && strings.TrimSpace(line) != strings.TrimSpace(prefix) {
			b.WriteString(strings.TrimRight(line, " ") + "\n")
			line = indent
		}
		if line != prefix && line != indent {
			line += " "
		}
		line += word
	}
	b.WriteString(line)
	return b.String()
}
