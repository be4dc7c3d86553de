package kubecheck

import (
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	fwk "k8s.io/kube-scheduler/framework"
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
	return append(c.VolumeTopology(pod), c.DomainTopology(pod)...)
}

// MaxTopologyTerms bounds what Topology may make a placeholder's required
// affinity: the product of the selectors' terms (ANDed, each an OR of its
// terms). Past it the volumes' topology is left out and Karpenter's own
// reading of the pod's volumes would be the only guide: two-zone classes
// (or regional PVs) on k claims would otherwise give 2^k terms.
const MaxTopologyTerms = 64

// bounded drops repeated selectors and, when the product of their terms
// passes MaxTopologyTerms, all but the one-term selectors.
func bounded(nss []corev1.NodeSelector) []corev1.NodeSelector {
	seen := map[string]bool{}
	out := nss[:0:0]
	product := 1
	for _, ns := range nss {
		k := ns.String()
		if seen[k] {
			continue
		}
		seen[k] = true
		out = append(out, ns)
		product *= max(1, len(ns.NodeSelectorTerms))
		if product > MaxTopologyTerms {
			product = MaxTopologyTerms + 1
		}
	}
	if product <= MaxTopologyTerms {
		return out
	}
	single := out[:0:0]
	for _, ns := range out {
		if len(ns.NodeSelectorTerms) <= 1 {
			single = append(single, ns)
		}
	}
	return single
}

// VolumeTopology is the part of Topology the pod's volumes give: it changes
// only when its claims are bound, and costs two lister reads per claim.
func (c *Checker) VolumeTopology(pod *corev1.Pod) []corev1.NodeSelector {
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
	return bounded(out)
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

// DomainTopology is the part of Topology that spread constraints and
// inter-pod affinity give, counted on the snapshot. Counts are kept for the
// rest of the cycle (until End) by topology key, namespaces and selector:
// a cycle counts each app's pods once, however many of its pods ask for
// capacity, and later placements in the cycle do not move them.
func (c *Checker) DomainTopology(pod *corev1.Pod) []corev1.NodeSelector {
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
	out = append(out, c.existingAntiAffinity(pod)...)
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
			nss, selects := c.termNamespaces(pod, t)
			if !selects {
				continue // the term selects no namespace: it counts nothing
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

// termNamespaces are the namespaces an affinity term counts pods in: its
// list and those its namespace selector matches (an empty selector: all,
// returned as nil), else the pod's own; selects is false when it selects none.
func (c *Checker) termNamespaces(pod *corev1.Pod, t corev1.PodAffinityTerm) (nss []string, selects bool) {
	if len(t.Namespaces) == 0 && t.NamespaceSelector == nil {
		return []string{pod.Namespace}, true
	}
	nss = append(nss, t.Namespaces...)
	if t.NamespaceSelector != nil {
		sel, err := metav1.LabelSelectorAsSelector(t.NamespaceSelector)
		if err != nil {
			return nss, len(nss) > 0
		}
		if sel.Empty() {
			return nil, true
		}
		if c.namespaces != nil {
			list, err := c.namespaces.List(sel)
			if err == nil {
				for _, ns := range list {
					nss = append(nss, ns.Name)
				}
			}
		}
	}
	sort.Strings(nss)
	return nss, len(nss) > 0
}

// existingAntiAffinity is where bound pods' required anti-affinity on a key
// other than the hostname keeps pod out: per key, the domains of the nodes
// of such pods whose term matches pod.
func (c *Checker) existingAntiAffinity(pod *corev1.Pod) []corev1.NodeSelector {
	infos, err := c.snap.NodeInfos().HavePodsWithRequiredAntiAffinityList()
	if err != nil || len(infos) == 0 {
		return nil
	}
	var nsLabels labels.Set
	if c.namespaces != nil {
		if ns, err := c.namespaces.Get(pod.Namespace); err == nil {
			nsLabels = ns.Labels
		}
	}
	blocked := map[string]map[string]bool{} // key -> domains
	for _, ni := range infos {
		n := ni.Node()
		if n == nil {
			continue
		}
		for _, pi := range ni.GetPodsWithRequiredAntiAffinity() {
			for _, term := range pi.GetRequiredAntiAffinityTerms() {
				if term.TopologyKey == corev1.LabelHostname || term.TopologyKey == "" || !term.Matches(pod, nsLabels) {
					continue
				}
				if d, ok := n.Labels[term.TopologyKey]; ok {
					if blocked[term.TopologyKey] == nil {
						blocked[term.TopologyKey] = map[string]bool{}
					}
					blocked[term.TopologyKey][d] = true
				}
			}
		}
	}
	keys := make([]string, 0, len(blocked))
	for k := range blocked {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var out []corev1.NodeSelector
	for _, k := range keys {
		ds := make([]string, 0, len(blocked[k]))
		for d := range blocked[k] {
			ds = append(ds, d)
		}
		if ns := requirement(k, corev1.NodeSelectorOpNotIn, ds); ns != nil {
			out = append(out, *ns)
		}
	}
	return out
}

// countByDomain counts, by value of the node label key, the bound pods in
// namespaces (nil: all) that sel matches; every node's domain is present,
// with 0 when no pod matches there.
func (c *Checker) countByDomain(key string, namespaces []string, sel labels.Selector) map[string]int {
	memo := key + "\x00" + strings.Join(namespaces, ",") + "\x00" + sel.String()
	c.mu.Lock()
	defer c.mu.Unlock()
	if counts, ok := c.counts[memo]; ok {
		return counts
	}
	counts := c.countLocked(key, namespaces, sel)
	if c.counts == nil {
		c.counts = map[string]map[string]int{}
	}
	c.counts[memo] = counts
	return counts
}

func (c *Checker) countLocked(key string, namespaces []string, sel labels.Selector) map[string]int {
	if c.index == nil {
		c.index = newLabelIndex(c.snap)
	}
	x := c.index
	counts := map[string]int{}
	for _, d := range x.domainsOf(key) {
		counts[d] = 0
	}
	count := func(i int32) {
		ip := &x.pods[i]
		if len(namespaces) > 0 && !contains(namespaces, ip.pod.Namespace) {
			return
		}
		d, ok := ip.node.Labels[key]
		if ok && sel.Matches(labels.Set(ip.pod.Labels)) {
			counts[d]++
		}
	}
	if list, ok := x.candidates(sel); ok {
		for _, i := range list {
			count(i)
		}
		return counts
	}
	for i := range x.pods {
		count(int32(i))
	}
	return counts
}

// labelIndex is the snapshot's bound pods with their nodes, indexed by label
// (key and value) for the equality selectors spread constraints and pod
// affinity terms usually have: counting an app's pods walks its pods, not
// the cluster's. Built once per cycle, when the first count is asked, and
// indexed by a label key only when a selector asks for it (an app's
// selectors name one or two keys; indexing every label of every pod made
// it a busy cycle's largest allocation at 5,000 nodes).
type labelIndex struct {
	nodes   []*corev1.Node
	pods    []indexedPod
	byKey   map[string]map[string][]int32 // label key -> value -> positions in pods
	domains map[string][]string           // node label key -> its values
}

// byValue is the pods carrying label key, by its value.
func (x *labelIndex) byValue(key string) map[string][]int32 {
	if m, ok := x.byKey[key]; ok {
		return m
	}
	m := map[string][]int32{}
	for i := range x.pods {
		if v, ok := x.pods[i].pod.Labels[key]; ok {
			m[v] = append(m[v], int32(i))
		}
	}
	if x.byKey == nil {
		x.byKey = map[string]map[string][]int32{}
	}
	x.byKey[key] = m
	return m
}

// domainsOf is the values of the node label key, each once.
func (x *labelIndex) domainsOf(key string) []string {
	if ds, ok := x.domains[key]; ok {
		return ds
	}
	seen := map[string]bool{}
	var ds []string
	for _, n := range x.nodes {
		if d, ok := n.Labels[key]; ok && !seen[d] {
			seen[d] = true
			ds = append(ds, d)
		}
	}
	if x.domains == nil {
		x.domains = map[string][]string{}
	}
	x.domains[key] = ds
	return ds
}

type indexedPod struct {
	pod  *corev1.Pod
	node *corev1.Node
}

func newLabelIndex(snap interface {
	NodeInfos() fwk.NodeInfoLister
}) *labelIndex {
	x := &labelIndex{}
	infos, err := snap.NodeInfos().List()
	if err != nil {
		return x
	}
	pods := 0
	for _, ni := range infos {
		pods += len(ni.GetPods())
	}
	x.nodes = make([]*corev1.Node, 0, len(infos))
	x.pods = make([]indexedPod, 0, pods)
	for _, ni := range infos {
		n := ni.Node()
		if n == nil {
			continue
		}
		x.nodes = append(x.nodes, n)
		for _, pi := range ni.GetPods() {
			x.pods = append(x.pods, indexedPod{pod: pi.GetPod(), node: n})
		}
	}
	return x
}

// candidates is the shortest list of pods carrying one label the selector
// requires by equality; false when it requires none that way (every pod is
// a candidate).
func (x *labelIndex) candidates(sel labels.Selector) ([]int32, bool) {
	reqs, selectable := sel.Requirements()
	if !selectable {
		return nil, true // matches nothing
	}
	var best []int32
	found := false
	for _, r := range reqs {
		switch r.Operator() {
		case selection.Equals, selection.DoubleEquals, selection.In:
		default:
			continue
		}
		vals := r.Values().UnsortedList()
		if len(vals) != 1 {
			continue
		}
		list := x.byValue(r.Key())[vals[0]]
		if !found || len(list) < len(best) {
			best, found = list, true
		}
	}
	return best, found
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
