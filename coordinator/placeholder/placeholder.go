// Package placeholder asks Karpenter for capacity on behalf of work the
// coordinator admitted but cannot place. Karpenter provisions for pending
// pods whose PodScheduled condition says Unschedulable, whatever their
// scheduler, and it knows nothing of fractions, queues or gangs; the
// coordinator never marks its own pods Unschedulable. So it creates
// placeholder pods instead: lowest priority, whole nvidia.com/gpu requests
// (fractions packed first fit decreasing), the pods' node selectors,
// required affinity, tolerations and, for a gang, its one node pool.
// Sized without a price table, each prefers the smallest nodes that hold
// it, so that Karpenter launches the cheapest such type instead of packing
// them all into one large node (see smallest).
//
// Placeholders name a scheduler nobody serves (SchedulerName), and the
// coordinator writes their Unschedulable condition itself (Manager.Create):
// no scheduler ever binds one. Karpenter nominates a new node (or NodeClaim)
// for them, which the coordinator prefers for their work; it deletes a
// group's placeholders just before it places that work, and takes the node
// as soon as it is Ready and untainted. Were kube-scheduler to bind them
// (placeholders of earlier versions), a placeholder and a real pod could be
// bound to the same GPU in the same moment, and the kubelet would reject
// one; the coordinator had to let a new node settle for seconds first.
//
// MIG devices and time-sliced replicas are asked for as the whole GPUs
// behind them: each kind (MIG, replicas of one resource) is packed apart,
// first fit decreasing by its share of a GPU (see PackMilli). Caveat: a
// node Karpenter brings up serves its GPUs in the mode its node group's
// config gives new nodes; the admin must set that group (a gpufrac-node
// config group matching the node pool's labels) to mode mig with the right
// layout, or timeslice, for such a pool. Otherwise the placeholders land,
// the new GPUs serve whole GPUs or fractions, and the MIG or replica pods
// still find no room. Likewise the pods should select that pool (node
// selector or affinity, which placeholders copy): a placeholder free to go
// anywhere may land on an existing node's idle whole GPUs, which serve no
// MIG device, and Karpenter is asked for nothing.
package placeholder

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/pricing"
	"github.com/gpufrac/gpufrac/coordinator/restricted"
)

// Label keys of placeholder pods.
const (
	// LabelGroup holds the hash of the demand group a placeholder serves.
	LabelGroup = api.Domain + "/placeholder-group"
	// AnnotationWorkloads lists the workloads a placeholder was created for.
	AnnotationWorkloads = api.Domain + "/workloads"
	// NamePrefix starts every placeholder pod's name.
	NamePrefix = "gpufrac-placeholder-"
	// SchedulerName is the scheduler of placeholder pods: one no scheduler
	// serves, so none is ever bound (see the package doc).
	SchedulerName = "gpufrac-placeholder"
	// AnnotationPackedMilli is the milli-GPU of MIG devices or replicas
	// packed into a placeholder (PackMilli); absent on other kinds.
	AnnotationPackedMilli = api.Domain + "/packed-milli"
	// AnnotationClaimGPUs is the whole GPUs a DRA placeholder's claim asks;
	// its ResourceClaimTemplate (ClaimTemplate) has the pod's name.
	AnnotationClaimGPUs = api.Domain + "/claim-gpus"
	// claimName is the entry of a DRA placeholder's resource claim.
	claimName = "gpus"
)

// Options configure placeholder pods.
type Options struct {
	Image             string
	PriorityClassName string
	// PoolLabel is the node label of node pools (karpenter.sh/nodepool).
	PoolLabel string
	// Prices, when it lists instance types, steers each group's
	// placeholders to the cheapest types that hold it (see sizeGroup);
	// without it each placeholder prefers the smallest nodes that hold it
	// (see smallest).
	Prices *pricing.Table
	// GPUCountLabel is the node label with the node's GPU count that the
	// cloud provider gives its offerings (DefaultGPUCountLabel on AWS); empty
	// sizes nothing without a price table.
	GPUCountLabel string
}

// DefaultOptions are the coordinator's flag defaults.
func DefaultOptions() Options {
	return Options{Image: "registry.k8s.io/pause:3.10", PriorityClassName: "gpufrac-placeholder", PoolLabel: api.LabelNodePool,
		GPUCountLabel: DefaultGPUCountLabel}
}

// Item is one pending pod's demand.
type Item struct {
	// Workload is the workload's key ("namespace/name" of the pod or gang).
	Workload string
	// Pod is the pending pod (its constraints are copied).
	Pod *corev1.Pod
	// GPUs is a whole-GPU request; FractionPercent a fraction of one GPU.
	GPUs, FractionPercent int
	// Scalars are MIG devices or time-sliced replicas by resource name
	// (placement.Request.Scalars), and ScalarMilli their worth in milli-GPU
	// (what the pod's queue is charged for them).
	Scalars               map[string]int64
	ScalarMilli           int64
	CPUMilli, MemoryBytes int64
	// Models restricts the GPU product (node label nvidia.com/gpu.product).
	Models []string
	// Pool pins a gang's node pool ("" for none).
	Pool string
	// Gang says the item is a member of a gang: its placeholders do not
	// prefer the smallest nodes (a gang's members talk to each other, so
	// one large node, as Karpenter packs them, beats many small ones).
	Gang bool
	// DRA says the pod's GPUs come through resource claims (nodes in mode
	// dra): its placeholder asks whole GPUs through a claim of class
	// gpu.gpufrac.io, not nvidia.com/gpu, which such nodes never advertise
	// (Karpenter would wait for it forever before calling the node
	// initialized). Karpenter must run with --ignore-dra-requests=false and
	// know the devices of the instance types (ResourceSliceTemplates).
	DRA bool
	// Topology is where a node must be for the pod's volumes
	// (kubecheck.Checker.VolumeTopology: the zones of its bound PVs, the
	// allowed topologies of its claims' classes): selectors that all must
	// match, ANDed into the placeholder's required node affinity. Part of the
	// group: it changes only when the claims are bound.
	Topology []corev1.NodeSelector
	// Domains is where its spread constraints and required pod
	// (anti-)affinity let it go (kubecheck.Checker.DomainTopology), ANDed
	// likewise. Not part of the group: it moves as pods land, and a group
	// whose name moved would drop its placeholders and Karpenter's
	// nomination with them. A group's placeholders carry the domains of its
	// first item when they are made.
	Domains []corev1.NodeSelector
}

// Plan turns the demand of admitted, unplaceable pods into placeholder pods.
// Items sharing constraints form a group; a group's fractions are packed
// first fit decreasing into whole GPUs. A group's placeholders prefer the
// cheapest mix of instance types when the price table knows their types
// (sizeGroup); otherwise each prefers the smallest nodes that hold it,
// which Karpenter prices itself (smallest). Names are deterministic per
// group and bin, so repeated plans and restarted coordinators agree.
func Plan(items []Item, o Options) []*corev1.Pod {
	groups := map[string][]Item{}
	var keys []string
	for _, it := range items {
		k := groupKey(it)
		if _, ok := groups[k]; !ok {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], it)
	}
	sort.Strings(keys)
	var out []*corev1.Pod
	for _, k := range keys {
		its := groups[k]
		h := hash(k)
		bins := pack(its)
		group := make([]*corev1.Pod, 0, len(bins))
		gpus := make([]int, 0, len(bins))
		for i, b := range bins {
			group = append(group, podFor(h, i, b, its[0], o))
			gpus = append(gpus, b.gpus)
		}
		gang := slices.ContainsFunc(its, func(it Item) bool { return it.Gang })
		if !sizeGroup(group, gpus, o.Prices) && o.GPUCountLabel != "" && !gang {
			for i, p := range group {
				smallest(p, o.GPUCountLabel, gpus[i])
			}
		}
		out = append(out, group...)
	}
	return out
}

// bin is one placeholder's demand.
type bin struct {
	gpus        int
	fracPercent int   // fractions packed in (when gpus == 1 and from fractions)
	milli       int64 // MIG devices or replicas packed in, by PackMilli
	cpu, mem    int64
	workloads   []string
}

// milliPerGPU is one GPU in milli-GPU.
const milliPerGPU = 1000

// migComputeSlices is the compute slices of a MIG GPU (A100, H100, H200,
// B200); a g-slice MIG profile fits floor(7/g) times on one GPU.
const migComputeSlices = 7

// PackMilli is the share of a GPU an item's MIG devices or replicas are
// packed by: their worth (ScalarMilli), and for MIG devices at least
// 1000/k each (rounded down) when k of the profile fit one GPU: floor(7/g)
// for a g-slice profile, times floor(g/c) for a compute-instance profile
// "<c>c.<g>g". No more fit however small their memory: seven 1g.10gb
// devices of an H100 are worth 875 milli, yet the eighth needs another GPU;
// a 4g.40gb device takes a GPU of its own.
func PackMilli(it Item) int64 {
	var bySlices int64
	for name, n := range it.Scalars {
		if per := migPerGPU(name); per > 0 {
			// Rounded down: per of them must fit 1000, and one more must
			// not (true while per <= 30).
			bySlices += n * (milliPerGPU / int64(per))
		}
	}
	return max(it.ScalarMilli, bySlices)
}

// migPerGPU is how many devices of a MIG resource fit one GPU
// ("nvidia.com/mig-3g.40gb" 2, "nvidia.com/mig-1c.3g.40gb" 6), 0 for
// anything else.
func migPerGPU(name string) int {
	profile, ok := strings.CutPrefix(name, api.MIGResourcePrefix)
	if !ok {
		return 0
	}
	fields := strings.Split(profile, ".")
	slices := func(f string, unit byte) int {
		if len(f) < 2 || f[len(f)-1] != unit {
			return 0
		}
		n, err := strconv.Atoi(f[:len(f)-1])
		if err != nil || n < 1 || n > migComputeSlices {
			return 0
		}
		return n
	}
	if c := slices(fields[0], 'c'); c > 0 && len(fields) > 1 {
		if g := slices(fields[1], 'g'); g >= c {
			return (migComputeSlices / g) * (g / c)
		}
		return 0
	}
	if g := slices(fields[0], 'g'); g > 0 {
		return migComputeSlices / g
	}
	return 0
}

// pack makes one bin per whole-GPU pod and packs fractions into whole GPUs,
// largest first, each into the first GPU with room; MIG devices and
// replicas likewise by PackMilli (an item of more than one GPU's worth gets
// a bin of its own, rounded up to whole GPUs). A group holds one kind.
func pack(its []Item) []bin {
	var bins []bin
	var fr, sc []Item
	for _, it := range its {
		switch {
		case it.GPUs > 0:
			bins = append(bins, bin{gpus: it.GPUs, cpu: it.CPUMilli, mem: it.MemoryBytes, workloads: []string{it.Workload}})
		case it.FractionPercent > 0:
			fr = append(fr, it)
		case PackMilli(it) > milliPerGPU:
			gpus := int((PackMilli(it) + milliPerGPU - 1) / milliPerGPU)
			bins = append(bins, bin{gpus: gpus, milli: PackMilli(it), cpu: it.CPUMilli, mem: it.MemoryBytes, workloads: []string{it.Workload}})
		case PackMilli(it) > 0:
			sc = append(sc, it)
		}
	}
	sort.SliceStable(fr, func(i, j int) bool { return fr[i].FractionPercent > fr[j].FractionPercent })
	var gpus []bin
	for _, it := range fr {
		placed := false
		for i := range gpus {
			if gpus[i].fracPercent+it.FractionPercent <= 100 {
				gpus[i].fracPercent += it.FractionPercent
				gpus[i].cpu += it.CPUMilli
				gpus[i].mem += it.MemoryBytes
				gpus[i].workloads = appendUnique(gpus[i].workloads, it.Workload)
				placed = true
				break
			}
		}
		if !placed {
			gpus = append(gpus, bin{gpus: 1, fracPercent: it.FractionPercent, cpu: it.CPUMilli, mem: it.MemoryBytes, workloads: []string{it.Workload}})
		}
	}
	sort.SliceStable(sc, func(i, j int) bool { return PackMilli(sc[i]) > PackMilli(sc[j]) })
	for _, it := range sc {
		m := PackMilli(it)
		placed := false
		for i := range gpus {
			if gpus[i].fracPercent == 0 && gpus[i].milli+m <= milliPerGPU {
				gpus[i].milli += m
				gpus[i].cpu += it.CPUMilli
				gpus[i].mem += it.MemoryBytes
				gpus[i].workloads = appendUnique(gpus[i].workloads, it.Workload)
				placed = true
				break
			}
		}
		if !placed {
			gpus = append(gpus, bin{gpus: 1, milli: m, cpu: it.CPUMilli, mem: it.MemoryBytes, workloads: []string{it.Workload}})
		}
	}
	return append(bins, gpus...)
}

func appendUnique(s []string, x string) []string {
	for _, v := range s {
		if v == x {
			return s
		}
	}
	return append(s, x)
}

// groupKey is the text of everything that decides where a placeholder may
// go: selectors, affinity, tolerations, models, pool, and the kind of GPU
// (whole, fraction, MIG, or replicas of one resource).
func groupKey(it Item) string {
	p := it.Pod
	kind := "whole"
	if it.DRA {
		kind = "dra-"
	}
	switch {
	case it.FractionPercent > 0:
		kind += "fraction"
	case len(it.Scalars) > 0:
		kind += scalarKind(it.Scalars)
	case it.DRA:
		kind += "whole"
	}
	sel := make([]string, 0, len(p.Spec.NodeSelector))
	for k, v := range p.Spec.NodeSelector {
		sel = append(sel, k+"="+v)
	}
	sort.Strings(sel)
	aff := ""
	if a := requiredAffinity(p); a != nil {
		aff = a.String()
	}
	tol := make([]string, 0, len(p.Spec.Tolerations))
	for _, t := range p.Spec.Tolerations {
		tol = append(tol, t.String())
	}
	sort.Strings(tol)
	models := append([]string(nil), it.Models...)
	sort.Strings(models)
	key := fmt.Sprintf("%s|%s|sel=%v|aff=%s|tol=%v|models=%v|pool=%s", kind, p.Namespace, sel, aff, tol, models, it.Pool)
	for i := range it.Topology {
		key += "|topo=" + it.Topology[i].String()
	}
	return key
}

// scalarKind is the group kind of MIG devices ("mig") or replicas
// ("replicas:<resource>"); podrequest keeps the two out of one pod.
func scalarKind(sc map[string]int64) string {
	names := make([]string, 0, len(sc))
	for name := range sc {
		if strings.HasPrefix(name, api.MIGResourcePrefix) {
			return "mig"
		}
		names = append(names, name)
	}
	sort.Strings(names)
	return "replicas:" + strings.Join(names, ",")
}

func hash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:5])
}

func requiredAffinity(p *corev1.Pod) *corev1.NodeSelector {
	if p.Spec.Affinity == nil || p.Spec.Affinity.NodeAffinity == nil {
		return nil
	}
	return p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
}

// and is the node selector matching both a and b: the cross product of
// their terms, each the union of the two. An empty selector requires nothing.
func and(a, b *corev1.NodeSelector) *corev1.NodeSelector {
	switch {
	case len(a.NodeSelectorTerms) == 0:
		return b.DeepCopy()
	case len(b.NodeSelectorTerms) == 0:
		return a
	}
	out := &corev1.NodeSelector{}
	for _, x := range a.NodeSelectorTerms {
		for _, y := range b.NodeSelectorTerms {
			t := *x.DeepCopy()
			y := y.DeepCopy()
			t.MatchExpressions = append(t.MatchExpressions, y.MatchExpressions...)
			t.MatchFields = append(t.MatchFields, y.MatchFields...)
			out.NodeSelectorTerms = append(out.NodeSelectorTerms, t)
		}
	}
	return out
}

// podFor builds the placeholder pod of bin i of a group.
func podFor(group string, i int, b bin, first Item, o Options) *corev1.Pod {
	src := first.Pod
	gpus := *resource.NewQuantity(int64(b.gpus), resource.DecimalSI)
	req := corev1.ResourceList{api.ResourceGPU: gpus}
	if b.cpu > 0 {
		req[corev1.ResourceCPU] = *resource.NewMilliQuantity(b.cpu, resource.DecimalSI)
	}
	if b.mem > 0 {
		req[corev1.ResourceMemory] = *resource.NewQuantity(b.mem, resource.BinarySI)
	}
	sel := map[string]string{}
	for k, v := range src.Spec.NodeSelector {
		sel[k] = v
	}
	if first.Pool != "" {
		sel[o.PoolLabel] = first.Pool
	}
	var aff *corev1.Affinity
	if ra := requiredAffinity(src); ra != nil || len(first.Models) > 0 || len(first.Topology) > 0 || len(first.Domains) > 0 {
		ns := &corev1.NodeSelector{}
		if ra != nil {
			ns = ra.DeepCopy()
		}
		for i := range first.Topology {
			ns = and(ns, &first.Topology[i])
		}
		for i := range first.Domains {
			ns = and(ns, &first.Domains[i])
		}
		if len(first.Models) > 0 {
			req := corev1.NodeSelectorRequirement{Key: api.LabelGPUProduct, Operator: corev1.NodeSelectorOpIn, Values: first.Models}
			if len(ns.NodeSelectorTerms) == 0 {
				ns.NodeSelectorTerms = []corev1.NodeSelectorTerm{{}}
			}
			for t := range ns.NodeSelectorTerms {
				ns.NodeSelectorTerms[t].MatchExpressions = append(ns.NodeSelectorTerms[t].MatchExpressions, req)
			}
		}
		aff = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: ns}}
	}
	workloads := ""
	for j, w := range b.workloads {
		if j > 0 {
			workloads += ","
		}
		workloads += w
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      NamePrefix + group + "-" + strconv.Itoa(i),
			Namespace: api.ReservationNamespace,
			Labels:    map[string]string{api.LabelRole: api.RolePlaceholder, LabelGroup: group},
			Annotations: map[string]string{
				AnnotationWorkloads:            workloads,
				api.Domain + "/fraction-units": strconv.Itoa(b.fracPercent),
			},
		},
		Spec: corev1.PodSpec{
			SchedulerName:                 SchedulerName,
			PriorityClassName:             o.PriorityClassName,
			TerminationGracePeriodSeconds: new(int64),
			NodeSelector:                  sel,
			Affinity:                      aff,
			Tolerations:                   append([]corev1.Toleration(nil), src.Spec.Tolerations...),
			Containers: []corev1.Container{{
				Name:      "placeholder",
				Image:     o.Image,
				Resources: corev1.ResourceRequirements{Requests: req, Limits: corev1.ResourceList{api.ResourceGPU: gpus}},
			}},
		},
	}
	if b.milli > 0 {
		pod.Annotations[AnnotationPackedMilli] = strconv.FormatInt(b.milli, 10)
	}
	if first.DRA {
		c := &pod.Spec.Containers[0]
		delete(c.Resources.Requests, api.ResourceGPU)
		delete(c.Resources.Limits, api.ResourceGPU)
		c.Resources.Claims = []corev1.ResourceClaim{{Name: claimName}}
		pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: claimName, ResourceClaimTemplateName: &pod.Name}}
		pod.Annotations[AnnotationClaimGPUs] = strconv.Itoa(b.gpus)
	}
	// The reservation namespace enforces Pod Security "restricted".
	restricted.Apply(&pod.Spec)
	return pod
}

// ClaimTemplate is the ResourceClaimTemplate of a DRA placeholder pod
// (nil for others): the pod's name and namespace, AnnotationClaimGPUs whole
// GPUs of class gpu.gpufrac.io.
func ClaimTemplate(p *corev1.Pod) *resourceapi.ResourceClaimTemplate {
	n, err := strconv.Atoi(p.Annotations[AnnotationClaimGPUs])
	if len(p.Spec.ResourceClaims) == 0 || err != nil || n < 1 {
		return nil
	}
	return &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, Labels: map[string]string{api.LabelRole: api.RolePlaceholder}},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpus", Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: api.DRAClassGPU, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: int64(n),
			}}},
		}}},
	}
}

// IsPlaceholder tells whether p is a placeholder pod.
func IsPlaceholder(p *corev1.Pod) bool {
	return p.Namespace == api.ReservationNamespace && p.Labels[api.LabelRole] == api.RolePlaceholder
}

// GroupOf is the group label value of the placeholders serving an item.
func GroupOf(it Item) string { return hash(groupKey(it)) }

// NeverBound tells whether p is a placeholder no scheduler serves
// (SchedulerName), not one kube-scheduler may bind (earlier versions).
func NeverBound(p *corev1.Pod) bool { return IsPlaceholder(p) && p.Spec.SchedulerName == SchedulerName }

// AsksKarpenter tells whether p's PodScheduled condition is what Karpenter
// provisions for: False, reason Unschedulable.
func AsksKarpenter(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			return c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable
		}
	}
	return false
}
