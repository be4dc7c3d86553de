// Package placeholder asks Karpenter for capacity on behalf of work the
// coordinator admitted but cannot place. Karpenter provisions only for pods
// the default scheduler finds Unschedulable, and it knows nothing of
// fractions, queues or gangs; the coordinator never marks its own pods
// Unschedulable. So it creates placeholder pods instead: default scheduler,
// lowest priority, whole nvidia.com/gpu requests (fractions packed first fit
// decreasing), the pods' node selectors, required affinity, tolerations and,
// for a gang, its one node pool. When the capacity shows up the placeholders
// are deleted and the real pods are placed, preferring the nodes where the
// placeholders landed.
package placeholder

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpufrac/gpufrac/api"
)

// Label keys of placeholder pods.
const (
	// LabelGroup holds the hash of the demand group a placeholder serves.
	LabelGroup = api.Domain + "/placeholder-group"
	// AnnotationWorkloads lists the workloads a placeholder was created for.
	AnnotationWorkloads = api.Domain + "/workloads"
	// NamePrefix starts every placeholder pod's name.
	NamePrefix = "gpufrac-placeholder-"
)

// Options configure placeholder pods.
type Options struct {
	Image             string
	PriorityClassName string
	// PoolLabel is the node label of node pools (karpenter.sh/nodepool).
	PoolLabel string
}

// DefaultOptions are the coordinator's flag defaults.
func DefaultOptions() Options {
	return Options{Image: "registry.k8s.io/pause:3.10", PriorityClassName: "gpufrac-placeholder", PoolLabel: api.LabelNodePool}
}

// Item is one pending pod's demand.
type Item struct {
	// Workload is the workload's key ("namespace/name" of the pod or gang).
	Workload string
	// Pod is the pending pod (its constraints are copied).
	Pod *corev1.Pod
	// GPUs is a whole-GPU request; FractionPercent a fraction of one GPU.
	GPUs, FractionPercent int
	CPUMilli, MemoryBytes int64
	// Models restricts the GPU product (node label nvidia.com/gpu.product).
	Models []string
	// Pool pins a gang's node pool ("" for none).
	Pool string
}

// Plan turns the demand of admitted, unplaceable pods into placeholder pods.
// Items sharing constraints form a group; a group's fractions are packed
// first fit decreasing into whole GPUs. Names are deterministic per group
// and bin, so repeated plans and restarted coordinators agree.
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
		for i, b := range bins {
			out = append(out, podFor(h, i, b, its[0], o))
		}
	}
	return out
}

// bin is one placeholder's demand.
type bin struct {
	gpus        int
	fracPercent int // fractions packed in (when gpus == 1 and from fractions)
	cpu, mem    int64
	workloads   []string
}

// pack makes one bin per whole-GPU pod and packs fractions into whole GPUs,
// largest first, each into the first GPU with room.
func pack(its []Item) []bin {
	var bins []bin
	var fr []Item
	for _, it := range its {
		if it.GPUs > 0 {
			bins = append(bins, bin{gpus: it.GPUs, cpu: it.CPUMilli, mem: it.MemoryBytes, workloads: []string{it.Workload}})
		} else if it.FractionPercent > 0 {
			fr = append(fr, it)
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
// go: selectors, affinity, tolerations, models, pool, and whole vs fraction.
func groupKey(it Item) string {
	p := it.Pod
	kind := "whole"
	if it.FractionPercent > 0 {
		kind = "fraction"
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
	return fmt.Sprintf("%s|%s|sel=%v|aff=%s|tol=%v|models=%v|pool=%s", kind, p.Namespace, sel, aff, tol, models, it.Pool)
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
	if ra := requiredAffinity(src); ra != nil || len(first.Models) > 0 {
		ns := &corev1.NodeSelector{}
		if ra != nil {
			ns = ra.DeepCopy()
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
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      NamePrefix + group + "-" + strconv.Itoa(i),
			Namespace: api.SystemNamespace,
			Labels:    map[string]string{api.LabelRole: api.RolePlaceholder, LabelGroup: group},
			Annotations: map[string]string{
				AnnotationWorkloads:            workloads,
				api.Domain + "/fraction-units": strconv.Itoa(b.fracPercent),
			},
		},
		Spec: corev1.PodSpec{
			PriorityClassName:             o.PriorityClassName,
			TerminationGracePeriodSeconds: new(int64),
			AutomountServiceAccountToken:  new(bool),
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
}

// IsPlaceholder tells whether p is a placeholder pod.
func IsPlaceholder(p *corev1.Pod) bool {
	return p.Namespace == api.SystemNamespace && p.Labels[api.LabelRole] == api.RolePlaceholder
}

// GroupOf is the group label value of the placeholders serving an item.
func GroupOf(it Item) string { return hash(groupKey(it)) }
