package kubecheck

import (
	"sort"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Topology is where a new node must be for pod to run on it, as node
// selectors that all must match (each an OR of its terms), to AND with the
// pod's own required node affinity. It is what a Karpenter placeholder
// carries for the pod, so that Karpenter buys a node where the pod can run:
//
//   - the node affinity of each PV the pod's claims are bound to (a zonal
//     disk's zone);
//   - the allowed topologies of the class of each claim not bound yet;
//   - for each hard topology spread constraint on a key other than the
//     hostname, the domains it may not go to (NotIn): those where one more
//     matching pod would exceed maxSkew; a domain no node has yet is always
//     allowed;
//   - for each required anti-affinity term on such a key, the domains with a
//     matching pod (NotIn); for each required affinity term, the domains with
//     one (In), when there is any.
//
// A new node is a new hostname: spread and anti-affinity by hostname never
// restrict it. Bound pods are read from the snapshot of the last Begin.
// Claims or volumes not found are skipped (the pod waits on them anyway).
func (c *Checker) Topology(pod *corev1.Pod) []corev1.NodeSelector {
	var out []corev1.NodeSelector
	for i := range pod.Spec.Volumes {
		v := &pod.Spec.Volumes[i]
		name := ""
		switch {
		case v.PersistentVolumeClaim != nil:
			name = v.PersistentVolumeClaim.ClaimName
		case v.Ephemeral != nil:
			name = pod.Name + "-" + v.Name
		default:
			continue
		}
		pvc, err := c.pvcs.PersistentVolumeClaims(pod.Namespace).Get(name)
		if err != nil {
			continue
		}
		if pvc.Spec.VolumeName != "" {
			pv, err := c.pvs.Get(pvc.Spec.VolumeName)
			if err == nil && pv.Spec.NodeAffinity != nil && pv.Spec.NodeAffinity.Required != nil {
				out = append(out, *pv.Spec.NodeAffinity.Required.DeepCopy())
			}
			continue
		}
		if cls := pvc.Spec.StorageClassName; cls != nil && *cls != "" {
			if sc, err := c.classes.Get(*cls); err == nil {
				if ns := allowedTopologies(sc); ns != nil {
					out = append(out, *ns)
				}
			}
		}
	}
	out = append(out, c.podTopology(pod)...)
	return out
}

// allowedTopologies is a class's allowed topologies as a node selector.
func allowedTopologies(sc *storagev1.StorageClass) *corev1.NodeSelector {
	if len(sc.AllowedTopologies) == 0 {
		return nil
	}
	ns := &corev1.NodeSelector{}
	for _, t := range sc.AllowedTopologies {
		var term corev1.NodeSelectorTerm
		for _, e := range t.MatchLabelExpressions {
			term.MatchExpressions = append(term.MatchExpressions, corev1.NodeSelectorRequirement{
				Key: e.Key, Operator: corev1.NodeSelectorOpIn, Values: append([]string(nil), e.Values...)})
		}
		ns.NodeSelectorTerms = append(ns.NodeSelectorTerms, term)
	}
	return ns
}

// podTopology is the part of Topology that spread constraints and
// inter-pod affinity give, counted on the snapshot.
func (c *Checker) podTopology(pod *corev1.Pod) []corev1.NodeSelector {
	var out []corev1.NodeSelector
	for _, tsc := range pod.Spec.TopologySpreadConstraints {
		if tsc.WhenUnsatisfiable != corev1.DoNotSchedule || tsc.TopologyKey == corev1.LabelHostname {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(tsc.LabelSelector)
		if err != nil {
			continue
		}
		counts := c.countByDomain(tsc.TopologyKey, []string{pod.Namespace}, sel)
		if len(counts) == 0 {
			continue
		}
		lowest := -1
		for _, n := range counts {
			if lowest < 0 || n < lowest {
				lowest = n
			}
		}
		var blocked []string
		for d, n := range counts {
			if n+1-lowest > int(tsc.MaxSkew) {
				blocked = append(blocked, d)
			}
		}
		if ns := requirement(tsc.TopologyKey, corev1.NodeSelectorOpNotIn, blocked); ns != nil {
			out = append(out, *ns)
		}
	}
	a := pod.Spec.Affinity
	if a == nil {
		return out
	}
	terms := func(ts []corev1.PodAffinityTerm, op corev1.NodeSelectorOperator) {
		for _, t := range ts {
			if t.TopologyKey == corev1.LabelHostname || t.TopologyKey == "" {
				continue
			}
			sel, err := metav1.LabelSelectorAsSelector(t.LabelSelector)
			if err != nil {
				continue
			}
			nss := t.Namespaces
			if len(nss) == 0 && t.NamespaceSelector == nil {
				nss = []string{pod.Namespace}
			}
			counts := c.countByDomain(t.TopologyKey, nss, sel)
			var with []string
			for d, n := range counts {
				if n > 0 {
					with = append(with, d)
				}
			}
			if ns := requirement(t.TopologyKey, op, with); ns != nil {
				out = append(out, *ns)
			}
		}
	}
	if a.PodAntiAffinity != nil {
		terms(a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution, corev1.NodeSelectorOpNotIn)
	}
	if a.PodAffinity != nil {
		terms(a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution, corev1.NodeSelectorOpIn)
	}
	return out
}

// countByDomain counts, by value of the node label key, the bound pods in
// namespaces (nil: all) that sel matches; every node's domain is present,
// with 0 when no pod matches there.
func (c *Checker) countByDomain(key string, namespaces []string, sel labels.Selector) map[string]int {
	infos, err := c.snap.NodeInfos().List()
	if err != nil {
		return nil
	}
	counts := map[string]int{}
	for _, ni := range infos {
		n := ni.Node()
		if n == nil {
			continue
		}
		d, ok := n.Labels[key]
		if !ok {
			continue
		}
		counts[d] += 0
		for _, pi := range ni.GetPods() {
			p := pi.GetPod()
			if len(namespaces) > 0 && !contains(namespaces, p.Namespace) {
				continue
			}
			if sel.Matches(labels.Set(p.Labels)) {
				counts[d]++
			}
		}
	}
	return counts
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// requirement is a one-expression node selector, nil when values is empty.
func requirement(key string, op corev1.NodeSelectorOperator, values []string) *corev1.NodeSelector {
	if len(values) == 0 {
		return nil
	}
	sort.Strings(values)
	return &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
		{Key: key, Operator: op, Values: values}}}}}
}
