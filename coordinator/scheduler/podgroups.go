package scheduler

import (
	"context"
	"fmt"
	"strings"

	schedulingv1alpha2 "k8s.io/api/scheduling/v1alpha2"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/podrequest"
)

// PodGroupStatusWriter writes a PodGroup's PodGroupScheduled condition, as
// kube-scheduler does for the PodGroups it schedules.
type PodGroupStatusWriter interface {
	SetPodGroupScheduled(ctx context.Context, namespace, name string, cond metav1.Condition) error
}

// ClientPodGroupStatus is a PodGroupStatusWriter over the typed client.
type ClientPodGroupStatus struct{ Client kubernetes.Interface }

// SetPodGroupScheduled reads the PodGroup and writes cond into its status,
// unless it says the group was scheduled and cond says it is not: as
// kube-scheduler, a group once scheduled is not told otherwise for members
// that come later (a restarted coordinator may not know it wrote it).
func (w ClientPodGroupStatus) SetPodGroupScheduled(ctx context.Context, namespace, name string, cond metav1.Condition) error {
	pgs := w.Client.SchedulingV1alpha2().PodGroups(namespace)
	pg, err := pgs.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading PodGroup %s/%s: %w", namespace, name, err)
	}
	if cur := apimeta.FindStatusCondition(pg.Status.Conditions, cond.Type); cur != nil && cur.Status == metav1.ConditionTrue && cond.Status != metav1.ConditionTrue {
		return nil
	}
	cond.ObservedGeneration = pg.Generation
	pg = pg.DeepCopy()
	if !apimeta.SetStatusCondition(&pg.Status.Conditions, cond) {
		return nil
	}
	if _, err := pgs.UpdateStatus(ctx, pg, metav1.UpdateOptions{FieldManager: "gpufrac-coordinator"}); err != nil {
		return fmt.Errorf("writing the status of PodGroup %s/%s: %w", namespace, name, err)
	}
	return nil
}

// podGroupOf is the PodGroup w's pods are in ("" when w is no PodGroup's
// gang).
func podGroupOf(w *workload) string {
	if !w.gang || len(w.pods) == 0 {
		return ""
	}
	name, ok := strings.CutPrefix(w.pods[0].GangName(), podrequest.PodGroupGangPrefix)
	if !ok {
		return ""
	}
	return name
}

// tellPodGroup writes, for a workload that is a PodGroup's gang and was
// left pending with a reason written on its pods, PodGroupScheduled=False
// (reason Unschedulable, the pods' reason and message), except for
// GangIncomplete: the group is not complete yet, and kube-scheduler, too,
// says nothing until it is. True is written from what the informer shows
// bound (tellBoundPodGroups), not when bindings are sent.
func (s *Scheduler) tellPodGroup(ctx context.Context, w *workload, o outcome) {
	name := podGroupOf(w)
	if name == "" || !o.write || o.reason == api.ReasonGangIncomplete {
		return
	}
	s.setPodGroupScheduled(ctx, w.pods[0].pod.Namespace, name, o.reason, metav1.Condition{
		Type: schedulingv1alpha2.PodGroupScheduled, Status: metav1.ConditionFalse,
		Reason: schedulingv1alpha2.PodGroupReasonUnschedulable, Message: o.reason + ": " + o.msg})
}

// tellBoundPodGroups writes PodGroupScheduled=True for the PodGroup gangs
// whose members the informer shows bound (or ended after they ran), at
// least min-member of them: a gang whose bindings failed, or that is rolled
// back, is never said to be scheduled.
func (s *Scheduler) tellBoundPodGroups(ctx context.Context, census map[string]*gangCensus) {
	for _, c := range census {
		ns, group, _ := strings.Cut(c.name, "/")
		name, ok := strings.CutPrefix(group, podrequest.PodGroupGangPrefix)
		if !ok || c.min == 0 || c.held-c.inflight+c.ran < c.min {
			continue
		}
		s.setPodGroupScheduled(ctx, ns, name, "", metav1.Condition{
			Type: schedulingv1alpha2.PodGroupScheduled, Status: metav1.ConditionTrue, Reason: "Scheduled",
			Message: fmt.Sprintf("gpufrac-coordinator bound %d of its pods (min-member %d)", c.held-c.inflight+c.ran, c.min)})
	}
}

// setPodGroupScheduled writes cond on PodGroup namespace/name unless the
// same status for the same pods' reason was written (or queued) already; a
// failed write is tried again by the next cycle.
func (s *Scheduler) setPodGroupScheduled(ctx context.Context, namespace, name, reason string, cond metav1.Condition) {
	if s.deps.PodGroupStatus == nil {
		return
	}
	key := namespace + "/" + name
	said := string(cond.Status) + "\x00" + reason
	if !s.podGroupSaid.say(key, said) {
		return
	}
	s.writes.do(ctx, podGroupStatusKey+key, func(ctx context.Context) {
		if err := s.deps.PodGroupStatus.SetPodGroupScheduled(ctx, namespace, name, cond); err != nil {
			klog.FromContext(ctx).V(2).Info("PodGroup condition not written", "podGroup", key, "err", err)
			s.podGroupSaid.failed(key, said) // the next cycle tries again
		}
	})
}

// forgetPodGroups forgets the conditions written for PodGroups that are
// neither a workload of this cycle nor bound any more: one that comes back
// is told again (the writer reads the group and changes nothing that holds).
func (s *Scheduler) forgetPodGroups(ws []*workload, census map[string]*gangCensus) {
	if s.podGroupSaid.empty() {
		return
	}
	live := map[string]bool{}
	for _, w := range ws {
		if name := podGroupOf(w); name != "" {
			live[w.pods[0].pod.Namespace+"/"+name] = true
		}
	}
	for _, c := range census {
		ns, group, _ := strings.Cut(c.name, "/")
		if name, ok := strings.CutPrefix(group, podrequest.PodGroupGangPrefix); ok {
			live[ns+"/"+name] = true
		}
	}
	s.podGroupSaid.keep(func(key string) bool { return live[key] })
}

// podGroupStatusKey prefixes the writer's keys of PodGroup conditions.
const podGroupStatusKey = "podgroup-status/"
