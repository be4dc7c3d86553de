package placeholder

import (
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/pricing"
)

// AnnotationInstanceType names the instance type a placeholder prefers
// (the cheapest capacity for its group, see sizeGroup); absent without a
// price table.
const AnnotationInstanceType = api.Domain + "/instance-type"

// AnnotationSizing says how a placeholder's capacity was sized: SizingTable
// (the price table's cheapest mix, AnnotationInstanceType) or SizingAlone (a
// node of its own, see alone); absent when the table knew the group's types
// but no mix held its placeholders (Karpenter's own choice stands).
const AnnotationSizing = api.Domain + "/sizing"

// The values of AnnotationSizing.
const (
	SizingTable = "price-table"
	SizingAlone = "alone"
)

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
// sizes the group without prices, see alone).
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

// aloneWeight is the weight of the preferred pod anti-affinity alone adds.
const aloneWeight = 100

// alone sizes a placeholder without prices: it asks for a node of its own,
// with a preferred pod anti-affinity on the node's hostname against every
// other placeholder. Karpenter treats preferred terms as required until
// nothing can be launched for them (then it drops them), so it cannot pack
// the placeholders into one NodeClaim of a large type, and launches for each
// the cheapest instance type that holds it, by its cloud provider's own
// prices: five 1-GPU placeholders get five 1-GPU nodes ($70.95/h on the
// test bed), not one 8-GPU node ($98.32/h) with three GPUs idle. This is the
// cheapest capacity whenever a type's price grows with its GPU count at
// least linearly; where a large type is cheaper per GPU (seven GPUs of work,
// an 8-GPU type dearer than seven 1-GPU ones), only a price table says so.
// kube-scheduler ignores all this: no scheduler binds a placeholder.
func alone(p *corev1.Pod) {
	if p.Spec.Affinity == nil {
		p.Spec.Affinity = &corev1.Affinity{}
	}
	if p.Spec.Affinity.PodAntiAffinity == nil {
		p.Spec.Affinity.PodAntiAffinity = &corev1.PodAntiAffinity{}
	}
	pa := p.Spec.Affinity.PodAntiAffinity
	pa.PreferredDuringSchedulingIgnoredDuringExecution = append(pa.PreferredDuringSchedulingIgnoredDuringExecution,
		corev1.WeightedPodAffinityTerm{Weight: aloneWeight, PodAffinityTerm: corev1.PodAffinityTerm{
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{api.LabelRole: api.RolePlaceholder}},
			TopologyKey:   corev1.LabelHostname,
		}})
	p.Annotations[AnnotationSizing] = SizingAlone
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
