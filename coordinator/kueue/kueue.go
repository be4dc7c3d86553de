// Package kueue reads what Kueue admitted, for the queues whose quota Kueue
// keeps (Queue spec.admission: Kueue). Kueue admits a Job's Workload against
// its ClusterQueue's quota and unsuspends the Job; the Job controller then
// creates the pods, and the coordinator places them. The coordinator
// places a pod of such a queue only when its controller (the Job) owns a
// Workload Kueue admitted, no more pods than Kueue admitted, and none that
// asks for more GPU than the Workload's pod template Kueue counted: the
// pod's owner references and its request are the tenant's to write.
//
// The Workloads are read as unstructured objects: the Kueue module would
// bring its own Kubernetes libraries, and four fields are all that is read.
package kueue

import (
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// WorkloadResource is Kueue's Workload, at the version Kueue v0.15 and
// later store.
var WorkloadResource = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "workloads"}

// ConditionAdmitted is the Workload condition Kueue sets once the workload
// has its quota and every admission check passed.
const ConditionAdmitted = "Admitted"

// ConditionFinished and ConditionEvicted are the Workload conditions of a
// workload that no longer holds its quota, though Admitted may still say
// true.
const (
	ConditionFinished = "Finished"
	ConditionEvicted  = "Evicted"
)

// OwnerIndex names the informer index of Workloads by their controller's
// UID (OwnerIndexFunc).
const OwnerIndex = "gpufrac.io/kueue-owner"

// Workload is what the coordinator reads of a Kueue Workload.
type Workload struct {
	Namespace, Name string
	// Owner is the UID of the Workload's controller: the Job whose pods it
	// admits.
	Owner types.UID
	// Admitted says Kueue admitted it (condition Admitted true).
	Admitted bool
	// Count is the number of pods admitted: each pod set's admitted count
	// (status.admission), or its spec count where the admission has none.
	Count int
	// Templates are the pod sets' templates, as Kueue counted them.
	Templates []corev1.PodTemplateSpec
}

// wire is the part of a Workload the coordinator reads.
type wire struct {
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Active  *bool `json:"active"`
		PodSets []struct {
			Name     string                 `json:"name"`
			Count    int32                  `json:"count"`
			Template corev1.PodTemplateSpec `json:"template"`
		} `json:"podSets"`
	} `json:"spec"`
	Status struct {
		Conditions []metav1.Condition `json:"conditions"`
		Admission  *struct {
			PodSetAssignments []struct {
				Name  string `json:"name"`
				Count *int32 `json:"count"`
			} `json:"podSetAssignments"`
		} `json:"admission"`
	} `json:"status"`
}

// FromUnstructured reads a Workload from the dynamic informer.
func FromUnstructured(u *unstructured.Unstructured) (*Workload, error) {
	var w wire
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.UnstructuredContent(), &w); err != nil {
		return nil, fmt.Errorf("reading Kueue Workload %s/%s: %w", u.GetNamespace(), u.GetName(), err)
	}
	out := &Workload{Namespace: w.Namespace, Name: w.Name}
	if ref := metav1.GetControllerOf(&w.ObjectMeta); ref != nil {
		out.Owner = ref.UID
	}
	// Admitted and still holding its quota: Kueue v0.17 leaves Admitted
	// true on a Workload that finished (its quota released) and on one it
	// is evicting, and a Workload deactivated (spec.active false) is
	// evicted.
	out.Admitted = conditionTrue(w.Status.Conditions, ConditionAdmitted) &&
		!conditionTrue(w.Status.Conditions, ConditionFinished) && !conditionTrue(w.Status.Conditions, ConditionEvicted) &&
		(w.Spec.Active == nil || *w.Spec.Active)
	specCount := map[string]int32{}
	for _, ps := range w.Spec.PodSets {
		specCount[ps.Name] = ps.Count
		out.Templates = append(out.Templates, ps.Template)
	}
	if a := w.Status.Admission; out.Admitted && a != nil {
		for _, psa := range a.PodSetAssignments {
			n := specCount[psa.Name]
			if psa.Count != nil {
				n = *psa.Count
			}
			out.Count += int(max(n, 0))
		}
	}
	return out, nil
}

// conditionTrue tells whether condition t is true.
func conditionTrue(conds []metav1.Condition, t string) bool {
	for _, c := range conds {
		if c.Type == t {
			return c.Status == metav1.ConditionTrue
		}
	}
	return false
}

// OwnerIndexFunc indexes Workloads (unstructured) by their controller's UID.
func OwnerIndexFunc(obj any) ([]string, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, nil
	}
	for _, ref := range u.GetOwnerReferences() {
		if ref.Controller != nil && *ref.Controller {
			return []string{string(ref.UID)}, nil
		}
	}
	return nil, nil
}

// Lookup answers the Workloads a controller (by UID) owns in a namespace.
type Lookup func(namespace string, owner types.UID) []*Workload

// OwnerOf is the controller a pod counts for: for a bound pod the one the
// coordinator recorded at binding (api.AnnotationAdmittedOwner; the pod's
// owner references are its author's to change afterwards), else its
// controller reference. "" for none.
type OwnerOf func(p *corev1.Pod) types.UID

// Gate decides, for the pods of queues whose quota Kueue keeps, which may
// be placed. Build one per scheduling cycle (NewGate), then ask Admits for
// each pending pod.
type Gate struct {
	lookup Lookup
	// slots holds, per namespace and controller UID, the live pods in the
	// order they take the Workload's admitted slots: bound ones first,
	// then by age; pos is each pod's place there.
	slots map[slotKey][]*corev1.Pod
	pos   map[types.UID]int
}

type slotKey struct {
	namespace string
	owner     types.UID
}

// NewGate indexes the live pods (those that hold or may take a GPU: bound
// pods until they are terminal, pending pods not being deleted) of the
// controllers in wanted, by namespace and the controller owner says.
func NewGate(lookup Lookup, live []*corev1.Pod, owner OwnerOf, wanted map[types.UID]bool) *Gate {
	g := &Gate{lookup: lookup, slots: map[slotKey][]*corev1.Pod{}, pos: map[types.UID]int{}}
	for _, p := range live {
		if uid := owner(p); uid != "" && wanted[uid] {
			k := slotKey{p.Namespace, uid}
			g.slots[k] = append(g.slots[k], p)
		}
	}
	for _, ps := range g.slots {
		sort.SliceStable(ps, func(i, j int) bool {
			a, b := ps[i], ps[j]
			if (a.Spec.NodeName != "") != (b.Spec.NodeName != "") {
				return a.Spec.NodeName != ""
			}
			if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
				return a.CreationTimestamp.Before(&b.CreationTimestamp)
			}
			return a.Name < b.Name
		})
		for i, p := range ps {
			g.pos[p.UID] = i
		}
	}
	return g
}

// Admits tells whether pending pod p may be placed: its controller owns a
// Workload Kueue admitted (with one pod set: several, each with its own
// count, are not read yet), p is among the first Count live pods of that
// controller in p's namespace, and fits(template) says "" for the
// Workload's pod template (the caller checks that p asks no more than the
// template Kueue counted, and within its node selection). When not, why
// says so, for the pod's condition.
func (g *Gate) Admits(p *corev1.Pod, fits func(corev1.PodTemplateSpec) string) (ok bool, why string) {
	ref := metav1.GetControllerOf(p)
	if ref == nil {
		return false, "its queue's quota is kept by Kueue, and the pod has no controller: create it through a Job Kueue admits"
	}
	var admitted []*Workload
	for _, w := range g.lookup(p.Namespace, ref.UID) {
		if w.Admitted {
			admitted = append(admitted, w)
		}
	}
	if len(admitted) == 0 {
		return false, fmt.Sprintf("its queue's quota is kept by Kueue, which has not admitted a Workload of %s %s (yet)", ref.Kind, ref.Name)
	}
	sort.Slice(admitted, func(i, j int) bool { return admitted[i].Name < admitted[j].Name })
	w := admitted[0]
	if len(admitted) > 1 {
		return false, fmt.Sprintf("%s %s owns %d Workloads Kueue admitted (%s, %s...): the coordinator places the pods of one", ref.Kind, ref.Name, len(admitted), admitted[0].Name, admitted[1].Name)
	}
	if len(w.Templates) != 1 {
		return false, fmt.Sprintf("Kueue Workload %s has %d pod sets: the coordinator places the pods of Workloads with one (a batch/v1 Job's)", w.Name, len(w.Templates))
	}
	if why := fits(w.Templates[0]); why != "" {
		return false, fmt.Sprintf("the pod does not match the pod template of Kueue Workload %s that Kueue admitted: %s", w.Name, why)
	}
	k := slotKey{p.Namespace, ref.UID}
	i, ok := g.pos[p.UID]
	if !ok || i >= w.Count {
		return false, fmt.Sprintf("Kueue admitted %d pods of Workload %s and %s %s has %d live: this one is beyond them", w.Count, w.Name, ref.Kind, ref.Name, len(g.slots[k]))
	}
	return true, ""
}
