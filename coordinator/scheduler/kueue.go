package scheduler

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/coordinator/kueue"
	"github.com/gpufrac/gpufrac/coordinator/predicates"
)

// kueueKeeps tells whether Kueue keeps queue q's quota.
func (b *books) kueueKeeps(q string) bool {
	spec, ok := b.specs[q]
	return ok && spec.Admission == v1alpha1.AdmissionKueue
}

// holdForKueue keeps back the workloads of queues whose quota Kueue keeps
// until Kueue admitted each of their pods (kueue.Gate): they wait with
// reason NotAdmittedByKueue, which asks Karpenter for nothing and counts in
// no queue's demand. A gang waits whole when one member is not admitted.
func (c *cycle) holdForKueue(ws []*workload) []*workload {
	s := c.s
	var gate *kueue.Gate // built on first need: most clusters have no such queue
	return slices.DeleteFunc(ws, func(w *workload) bool {
		if !c.books.kueueKeeps(w.queue) {
			return false
		}
		why := ""
		switch {
		case s.deps.Kueue == nil:
			why = "its queue's quota is kept by Kueue, and this coordinator does not read Kueue's Workloads (the chart's kueue.enabled, the coordinator's --kueue, or Kueue's API is not served)"
		case s.deps.KueueSynced != nil && !s.deps.KueueSynced():
			why = "its queue's quota is kept by Kueue, and the coordinator has not read Kueue's Workloads yet (if this lasts, check that it may list workloads.kueue.x-k8s.io: the chart's kueue.enabled)"
		default:
			if gate == nil {
				gate = kueue.NewGate(s.deps.Kueue, c.livePods(), admittedOwner, c.kueueOwners(ws))
			}
			for _, pi := range w.pods {
				if ok, msg := gate.Admits(pi.pod, func(t corev1.PodTemplateSpec) string { return s.matchesTemplate(c.dra, pi, t) }); !ok {
					why = msg
					break
				}
			}
		}
		if why == "" {
			w.kueue = true
			return false
		}
		c.leave(w, wait(api.ReasonNotAdmittedByKueue, why))
		return true
	})
}

// kueueOwners are the controllers of the pending pods of Kueue queues: the
// gate counts only their pods.
func (c *cycle) kueueOwners(ws []*workload) map[types.UID]bool {
	owners := map[types.UID]bool{}
	for _, w := range ws {
		if c.books.kueueKeeps(w.queue) {
			for _, pi := range w.pods {
				if ref := metav1.GetControllerOf(pi.pod); ref != nil {
					owners[ref.UID] = true
				}
			}
		}
	}
	return owners
}

// admittedOwner is the controller a pod counts for in a Workload's slots:
// a bound pod's as its binding recorded (its owner references are its
// author's to change since), else its controller reference.
func admittedOwner(p *corev1.Pod) types.UID {
	if p.Spec.NodeName != "" {
		if uid, ok := p.Annotations[api.AnnotationAdmittedOwner]; ok {
			return types.UID(uid)
		}
	}
	if ref := metav1.GetControllerOf(p); ref != nil {
		return ref.UID
	}
	return ""
}

// livePods are the pods that hold or may take a GPU, as the ledger that
// collect read the pending pods from has them: bound pods until they are
// terminal (one being deleted still holds its GPU, as long as its grace
// period, which its author sets), pending pods not being deleted.
func (c *cycle) livePods() []*corev1.Pod {
	l := c.s.bound
	live := make([]*corev1.Pod, 0, len(l.parts)+len(l.unbound))
	for _, part := range l.parts {
		if !predicates.Terminal(part.pod) {
			live = append(live, part.pod)
		}
	}
	for _, p := range l.unbound {
		if !predicates.Terminal(p) && p.DeletionTimestamp == nil {
			live = append(live, p)
		}
	}
	return live
}

// matchesTemplate says why pi does not match template t of the Workload
// Kueue admitted ("" when it does): it may ask for no more of any GPU kind
// than a pod made from t (whole GPUs, a share, each MIG profile or replica
// resource by name, parsed the same way: Kueue charges each resource
// separately) and must keep the node selection t and its Job's template
// have (Kueue writes its flavor's node labels into the Job's template when
// it admits it). CPU and memory are not compared: Kueue counts them with
// LimitRange defaults the template does not show. GPUs through resource
// claims are refused: Kueue v0.17 does not charge claims by default.
func (s *Scheduler) matchesTemplate(v *draCycle, pi podInfo, t corev1.PodTemplateSpec) string {
	if pi.ClaimsGPU || len(pi.Claims) > 0 {
		return "GPUs through resource claims are not counted by Kueue; ask gpufrac.io/gpu-fraction or nvidia.com/gpu"
	}
	tp := &corev1.Pod{ObjectMeta: *t.ObjectMeta.DeepCopy(), Spec: *t.Spec.DeepCopy()}
	tp.Namespace, tp.Name = pi.pod.Namespace, pi.pod.Name
	if tp.Labels == nil {
		tp.Labels = map[string]string{}
	}
	tp.Labels[api.LabelQueue] = pi.Queue
	tp.OwnerReferences = nil
	tp.Spec.SchedulingGroup = nil
	tp.Spec.SchedulerName = pi.pod.Spec.SchedulerName
	tpi, err := s.parseAsIs(v, tp, nil, nil, nil)
	if err != nil {
		return fmt.Sprintf("its template does not parse: %v", err)
	}
	r, tr := pi.Request, tpi.Request
	switch {
	case r.GPUs > tr.GPUs:
		return fmt.Sprintf("it asks %d whole GPUs, the template %d", r.GPUs, tr.GPUs)
	case r.ShareMilli > tr.ShareMilli:
		return fmt.Sprintf("it asks a %d%% share, the template %d%%", r.ShareMilli/10, tr.ShareMilli/10)
	}
	names := make([]string, 0, len(r.Scalars))
	for name := range r.Scalars {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if n := r.Scalars[name]; n > tr.Scalars[name] {
			return fmt.Sprintf("it asks %d of %s, the template %d", n, name, tr.Scalars[name])
		}
	}
	want := maps.Clone(t.Spec.NodeSelector)
	if want == nil {
		want = map[string]string{}
	}
	if ref := metav1.GetControllerOf(pi.pod); ref != nil && ref.Kind == "Job" && s.deps.Jobs != nil {
		if job, ok := s.deps.Jobs(pi.pod.Namespace, ref.Name); ok && job.UID == ref.UID {
			for k, v := range job.Spec.Template.Spec.NodeSelector {
				want[k] = v
			}
		}
	}
	var missing []string
	for k, v := range want {
		if pi.pod.Spec.NodeSelector[k] != v {
			missing = append(missing, k+"="+v)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return fmt.Sprintf("it lacks the node selector %s of its template (Kueue's flavor)", strings.Join(missing, ","))
	}
	return ""
}
