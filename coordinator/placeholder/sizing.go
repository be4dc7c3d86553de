package placeholder

import (
	"slices"
	"sort"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/pricing"
)

// AnnotationInstanceType names the instance type a placeholder prefers
// (the cheapest capacity for its group, see sizeGroup); absent without a
// price table.
const AnnotationInstanceType = api.Domain + "/instance-type"

// AnnotationSizing says how a placeholder's capacity was sized: SizingTable
// (the price table's cheapest mix, AnnotationInstanceType) or SizingSmallest
// (the smallest node that holds it, see smallest); absent when neither
// applies (Karpenter's own choice stands).
const AnnotationSizing = api.Domain + "/sizing"

// The values of AnnotationSizing.
const (
	SizingTable    = "price-table"
	SizingSmallest = "smallest"
)

// DefaultGPUCountLabel is Options.GPUCountLabel's default: the label AWS's
// Karpenter provider gives every GPU offering and node, its GPU count.
const DefaultGPUCountLabel = "karpenter.k8s.aws/instance-gpu-count"

// sizingWeight is the weight of the preferred node affinity sizing adds.
// Karpenter treats preferred terms as required and relaxes them only when
// nothing can be launched for them, so a placeholder preferring a 1-GPU type
// gets a NodeClaim of that type instead of sharing one 8-GPU NodeClaim with
// the rest of its group; kube-scheduler only scores by it.
const sizingWeight = 100

// sizeGroup steers a group's placeholders to the cheapest instance types
// that hold the group's GPUs, per the admin's price table. Karpenter packs
// every pending pod that fits into one NodeClaim and launches the cheapest
// type holding them all: five 1-GPU placeholders become one 8-GPU node
// ($98.32/h) although five 1-GPU nodes ($70.95/h) would do. So: take the
// cheapest mix of the types the group may use (pricing.CheapestMix over its
// GPU count), pack the placeholders into its nodes first fit decreasing, and
// give each a preferred node affinity on its node's instance type. Nothing
// changes when a placeholder fits no node of the mix.
//
// It tells whether the table knew the group's types: false without a table
// or when no listed type matches the group's constraints (the caller then
// sizes the group without prices, see smallest).
func sizeGroup(pods []*corev1.Pod, gpus []int, prices *pricing.Table) (known bool) {
	if prices == nil || len(prices.InstanceTypes) == 0 || len(pods) == 0 {
		return false
	}
	var allowed []pricing.InstanceType
	for _, it := range prices.Sorted() {
		if admitsType(pods[0], it, prices) {
			allowed = append(allowed, it)
		}
	}
	total := 0
	for _, g := range gpus {
		total += g
	}
	mix, ok := pricing.CheapestMix(total, allowed)
	if !ok {
		return false
	}
	order := make([]int, len(pods)) // pod indices, most GPUs first
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return gpus[order[a]] > gpus[order[b]] })
	free := make([]int, len(mix.Types)) // node of the mix -> GPUs not yet packed
	for i, it := range mix.Types {
		free[i] = it.GPUs
	}
	chosen := make([]string, len(pods)) // pod index -> instance type
	for _, i := range order {
		for n := range free {
			if free[n] >= gpus[i] {
				free[n] -= gpus[i]
				chosen[i] = mix.Types[n].Name
				break
			}
		}
		if chosen[i] == "" {
			// The mix counts GPUs, not pods: a multi-GPU placeholder may fit
			// none of its nodes. Then Karpenter's own choice (the cheapest
			// type holding the group together) is the better guess.
			return true
		}
	}
	for i, p := range pods {
		prefer(p, prices.TypeLabel(), chosen[i])
	}
	return true
}

// smallestTerms is how many preferred node affinity terms smallest adds:
// nodes of at most 1, 2 and 4 times the placeholder's GPUs, weighing 100,
// 50 and 25.
const smallestTerms = 3

// smallest sizes a placeholder of gpus GPUs without prices: it prefers nodes
// whose GPU count (node label label) is at most gpus, else at most twice and
// four times that. Karpenter treats the heaviest preferred term as required
// and drops it only when nothing can be launched for it, then tries the
// next; so it launches for the placeholder the cheapest type, by its cloud
// provider's own prices, among the smallest that hold it, and cannot pack
// five 1-GPU placeholders into one 8-GPU node ($98.32/h on the test bed)
// where five 1-GPU nodes ($70.95/h) would do. Where no type is that small
// (a NodePool of 8-GPU types only), every term is dropped and Karpenter
// packs the placeholders as it would without them. The cheapest capacity
// whenever a type's price grows with its GPU count at least linearly; where
// a large type is cheaper per GPU, only a price table says so. A provider
// that publishes no such label leaves every term unsatisfiable: Karpenter's
// own packing.
func smallest(p *corev1.Pod, label string, gpus int) {
	if p.Spec.Affinity == nil {
		p.Spec.Affinity = &corev1.Affinity{}
	}
	if p.Spec.Affinity.NodeAffinity == nil {
		p.Spec.Affinity.NodeAffinity = &corev1.NodeAffinity{}
	}
	na := p.Spec.Affinity.NodeAffinity
	for i := range smallestTerms {
		atMost := gpus << i
		na.PreferredDuringSchedulingIgnoredDuringExecution = append(na.PreferredDuringSchedulingIgnoredDuringExecution,
			corev1.PreferredSchedulingTerm{Weight: int32(100 >> i), Preference: corev1.NodeSelectorTerm{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: label, Operator: corev1.NodeSelectorOpLt, Values: []string{strconv.Itoa(atMost + 1)}}},
			}})
	}
	p.Annotations[AnnotationSizing] = SizingSmallest
}

// prefer adds a preferred node affinity on the instance type to p.
func prefer(p *corev1.Pod, label, typ string) {
	if p.Spec.Affinity == nil {
		p.Spec.Affinity = &corev1.Affinity{}
	}
	if p.Spec.Affinity.NodeAffinity == nil {
		p.Spec.Affinity.NodeAffinity = &corev1.NodeAffinity{}
	}
	na := p.Spec.Affinity.NodeAffinity
	na.PreferredDuringSchedulingIgnoredDuringExecution = append(na.PreferredDuringSchedulingIgnoredDuringExecution,
		corev1.PreferredSchedulingTerm{Weight: sizingWeight, Preference: corev1.NodeSelectorTerm{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: label, Operator: corev1.NodeSelectorOpIn, Values: []string{typ}}},
		}})
	p.Annotations[AnnotationInstanceType] = typ
	p.Annotations[AnnotationSizing] = SizingTable
}

// admitsType tells whether a placeholder's node selector and required
// affinity (copied from the tenant's pod, so untrusted: they only ever
// narrow the choice) allow nodes of instance type it: only requirements on
// the instance-type, NodePool and GPU-product labels are judged (the last
// when the table gives the type's product), other keys are taken as
// satisfiable. A type limited to some NodePools is allowed when one of them is.
func admitsType(p *corev1.Pod, it pricing.InstanceType, prices *pricing.Table) bool {
	typeKey, poolKey := prices.TypeLabel(), prices.PoolLabel()
	if v, ok := p.Spec.NodeSelector[typeKey]; ok && v != it.Name {
		return false
	}
	if v, ok := p.Spec.NodeSelector[poolKey]; ok && len(it.NodePools) > 0 && !slices.Contains(it.NodePools, v) {
		return false
	}
	if v, ok := p.Spec.NodeSelector[api.LabelGPUProduct]; ok && it.GPUProduct != "" && v != it.GPUProduct {
		return false
	}
	ra := requiredAffinity(p)
	if ra == nil || len(ra.NodeSelectorTerms) == 0 {
		return true
	}
	for _, term := range ra.NodeSelectorTerms {
		if termAdmits(term, typeKey, poolKey, it) {
			return true
		}
	}
	return false
}

// termAdmits judges one node selector term's requirements on the type and
// pool keys (others pass).
func termAdmits(term corev1.NodeSelectorTerm, typeKey, poolKey string, it pricing.InstanceType) bool {
	for _, r := range term.MatchExpressions {
		switch r.Key {
		case typeKey:
			if !requirementAdmits(r, []string{it.Name}) {
				return false
			}
		case poolKey:
			if len(it.NodePools) > 0 && !requirementAdmits(r, it.NodePools) {
				return false
			}
			if len(it.NodePools) == 0 && r.Operator == corev1.NodeSelectorOpDoesNotExist {
				return false // Karpenter's nodes always carry their NodePool
			}
		case api.LabelGPUProduct:
			if it.GPUProduct != "" && !requirementAdmits(r, []string{it.GPUProduct}) {
				return false
			}
		}
	}
	return true
}

// requirementAdmits tells whether a node whose label takes one of values
// can satisfy r.
func requirementAdmits(r corev1.NodeSelectorRequirement, values []string) bool {
	for _, v := range values {
		switch r.Operator {
		case corev1.NodeSelectorOpIn:
			if slices.Contains(r.Values, v) {
				return true
			}
		case corev1.NodeSelectorOpNotIn:
			if !slices.Contains(r.Values, v) {
				return true
			}
		case corev1.NodeSelectorOpExists:
			return true
		case corev1.NodeSelectorOpDoesNotExist:
			return false
		default: // Gt, Lt: not on these labels; let Karpenter judge
			return true
		}
	}
	return false
}
