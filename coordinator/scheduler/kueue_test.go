package scheduler

import (
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/coordinator/kueue"
	"github.com/gpufrac/gpufrac/tests/builders"
)

// kueueQueue is a queue whose quota Kueue keeps.
func kueueQueue(name string) *v1alpha1.Queue {
	return builders.MakeQueue(name).Admission(v1alpha1.AdmissionKueue).Namespaces("default").Obj()
}

// workloadOf is job's Kueue Workload with one pod set of template tmpl
// (a pod's metadata and spec), admitted for count pods or not admitted.
func workloadOf(job *batchv1.Job, admitted bool, count int, tmpl *corev1.Pod) *kueue.Workload {
	w := &kueue.Workload{Namespace: job.Namespace, Name: "job-" + job.Name, Owner: job.UID, Admitted: admitted,
		Templates: []corev1.PodTemplateSpec{{ObjectMeta: metav1.ObjectMeta{Labels: tmpl.Labels, Annotations: tmpl.Annotations}, Spec: tmpl.Spec}}}
	if admitted {
		w.Count = count
	}
	return w
}

// staticWorkloads answers from a fixed list, as the informer's owner index.
func staticWorkloads(ws ...*kueue.Workload) kueue.Lookup {
	return func(ns string, owner types.UID) []*kueue.Workload {
		var out []*kueue.Workload
		for _, w := range ws {
			if w.Namespace == ns && w.Owner == owner {
				out = append(out, w)
			}
		}
		return out
	}
}

// TestKueueKeepsTheQuota: a queue whose quota Kueue keeps has its pods
// placed only when Kueue admitted a Workload of their controller, no more
// of them than Kueue admitted and none asking for more GPU than the pod
// template Kueue counted; the others wait with NotAdmittedByKueue and ask
// Karpenter for nothing. Owner references and requests are the tenant's
// to write.
func TestKueueKeepsTheQuota(t *testing.T) {
	job := builders.MakeJob("train", "default").Obj()
	other := builders.MakeJob("other", "default").Obj()
	t0 := metav1.NewTime(time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC))
	half := func(name string, created metav1.Time, owner *batchv1.Job) *corev1.Pod {
		b := builders.MakePod(name, "default").Queue("kq").Fraction(50).CPU("1").UID(name).Created(created)
		if owner != nil {
			b = b.OwnedByJob(owner)
		}
		return b.Obj()
	}
	tmpl := half("template", t0, nil)
	flavored := builders.MakeJob("flavored", "default").Obj()
	flavored.Spec.Template.Spec.NodeSelector = map[string]string{"flavor": "t4"}
	twoSets := func(w *kueue.Workload) *kueue.Workload {
		w.Templates = append(w.Templates, w.Templates[0])
		return w
	}
	boundFor := func(p *corev1.Pod, owner *batchv1.Job) *corev1.Pod {
		p = admitted(p, "n1")
		p.Annotations[api.AnnotationAdmittedOwner] = string(owner.UID)
		return p
	}
	deleting := func(p *corev1.Pod) *corev1.Pod {
		now := metav1.NewTime(t0.Add(time.Minute))
		p.DeletionTimestamp = &now
		return p
	}
	inNamespace := func(p *corev1.Pod, ns string) *corev1.Pod {
		p.Namespace = ns
		return p
	}
	for _, tc := range []struct {
		name      string
		queue     *v1alpha1.Queue
		pods      []*corev1.Pod
		busy      bool // n1's GPU is taken: what is admitted has no room
		workloads []*kueue.Workload
		noKueue   bool // the coordinator does not read Workloads
		unsynced  bool // it has not read them yet
		wantBound []string
		wantWait  map[string]string // pod -> a part of its NotAdmittedByKueue message
		wantAsk   bool              // a placeholder asks Karpenter for capacity
	}{
		{name: "admitted: placed", pods: []*corev1.Pod{half("p0", t0, job)},
			workloads: []*kueue.Workload{workloadOf(job, true, 1, tmpl)}, wantBound: []string{"p0"}},
		{name: "not admitted yet: waits", pods: []*corev1.Pod{half("p0", t0, job)},
			workloads: []*kueue.Workload{workloadOf(job, false, 1, tmpl)},
			wantWait:  map[string]string{"p0": "has not admitted a Workload of Job train"}},
		{name: "no Workload: waits", pods: []*corev1.Pod{half("p0", t0, job)},
			wantWait: map[string]string{"p0": "has not admitted a Workload of Job train"}},
		{name: "another Job's admission does not count", pods: []*corev1.Pod{half("p0", t0, job)},
			workloads: []*kueue.Workload{workloadOf(other, true, 1, tmpl)},
			wantWait:  map[string]string{"p0": "has not admitted a Workload of Job train"}},
		{name: "a bare pod: waits", pods: []*corev1.Pod{half("bare", t0, nil)},
			workloads: []*kueue.Workload{workloadOf(job, true, 1, tmpl)},
			wantWait:  map[string]string{"bare": "has no controller"}},
		{name: "more pods than admitted: the newer waits",
			pods:      []*corev1.Pod{half("p0", t0, job), half("p1", metav1.NewTime(t0.Add(time.Second)), job)},
			workloads: []*kueue.Workload{workloadOf(job, true, 1, tmpl)},
			wantBound: []string{"p0"}, wantWait: map[string]string{"p1": "Kueue admitted 1 pods of Workload job-train"}},
		{name: "more GPU than the template Kueue counted: waits",
			pods:      []*corev1.Pod{builders.MakePod("big", "default").Queue("kq").GPUs(1).CPU("1").UID("big").OwnedByJob(job).Obj()},
			workloads: []*kueue.Workload{workloadOf(job, true, 1, tmpl)},
			wantWait:  map[string]string{"big": "it asks 1 whole GPUs, the template 0"}},
		{name: "a whole GPU where Kueue counted a share: waits",
			pods:      []*corev1.Pod{builders.MakePod("whole", "default").Queue("kq").GPUs(1).CPU("1").UID("whole").OwnedByJob(job).Obj()},
			workloads: []*kueue.Workload{workloadOf(job, true, 1, builders.MakePod("t", "default").Fraction(100).Obj())},
			wantWait:  map[string]string{"whole": "it asks 1 whole GPUs, the template 0"}},
		{name: "MIG devices where Kueue counted a share: waits",
			pods:      []*corev1.Pod{builders.MakePod("mig", "default").Queue("kq").Resource("nvidia.com/mig-1g.10gb", "4").CPU("1").UID("mig").OwnedByJob(job).Obj()},
			workloads: []*kueue.Workload{workloadOf(job, true, 1, tmpl)},
			wantWait:  map[string]string{"mig": "of nvidia.com/mig-1g.10gb, the template 0"}},
		{name: "without the node selector of its Job's template (Kueue's flavor): waits",
			pods:      []*corev1.Pod{half("p0", t0, flavored)},
			workloads: []*kueue.Workload{workloadOf(flavored, true, 1, tmpl)},
			wantWait:  map[string]string{"p0": "lacks the node selector flavor=t4"}},
		{name: "a Workload with two pod sets: waits", pods: []*corev1.Pod{half("p0", t0, job)},
			workloads: []*kueue.Workload{twoSets(workloadOf(job, true, 2, tmpl))},
			wantWait:  map[string]string{"p0": "has 2 pod sets"}},
		{name: "a finished or evicted Workload admits nothing", pods: []*corev1.Pod{half("p0", t0, job)},
			workloads: []*kueue.Workload{workloadOf(job, false, 1, tmpl)},
			wantWait:  map[string]string{"p0": "has not admitted"}},
		{name: "a bound pod keeps its slot when its owner references change",
			pods:      []*corev1.Pod{boundFor(half("p0", t0, nil), job), half("p1", metav1.NewTime(t0.Add(time.Second)), job)},
			workloads: []*kueue.Workload{workloadOf(job, true, 1, tmpl)},
			wantWait:  map[string]string{"p1": "Kueue admitted 1 pods of Workload job-train"}},
		{name: "a bound pod being deleted keeps its slot",
			pods:      []*corev1.Pod{deleting(boundFor(half("p0", t0, job), job)), half("p1", metav1.NewTime(t0.Add(time.Second)), job)},
			workloads: []*kueue.Workload{workloadOf(job, true, 1, tmpl)},
			wantWait:  map[string]string{"p1": "Kueue admitted 1 pods of Workload job-train"}},
		{name: "a pod of another namespace takes no slot",
			pods:      []*corev1.Pod{inNamespace(boundFor(half("forged", t0, job), job), "evil"), half("p0", metav1.NewTime(t0.Add(time.Second)), job)},
			workloads: []*kueue.Workload{workloadOf(job, true, 1, tmpl)},
			wantBound: []string{"p0"}},
		{name: "Workloads not read: waits", pods: []*corev1.Pod{half("p0", t0, job)}, noKueue: true,
			workloads: []*kueue.Workload{workloadOf(job, true, 1, tmpl)},
			wantWait:  map[string]string{"p0": "does not read Kueue's Workloads"}},
		{name: "Workloads not read yet: waits", pods: []*corev1.Pod{half("p0", t0, job)}, unsynced: true,
			workloads: []*kueue.Workload{workloadOf(job, true, 1, tmpl)},
			wantWait:  map[string]string{"p0": "has not read Kueue's Workloads yet"}},
		{name: "admitted without room: Karpenter is asked", pods: []*corev1.Pod{half("p0", t0, job)}, busy: true,
			workloads: []*kueue.Workload{workloadOf(job, true, 1, tmpl)}, wantAsk: true},
		{name: "not admitted without room: Karpenter is not asked", pods: []*corev1.Pod{half("p0", t0, job)}, busy: true,
			wantWait: map[string]string{"p0": "has not admitted"}},
		{name: "a queue of gpufrac's own is not Kueue's", queue: queueOf("kq", "8"), pods: []*corev1.Pod{half("bare", t0, nil)},
			wantBound: []string{"bare"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := tc.queue
			if q == nil {
				q = kueueQueue("kq")
			}
			pods := tc.pods
			queues := []*v1alpha1.Queue{q}
			if tc.busy {
				queues = append(queues, queueOf("q", "8"))
				pods = append(pods, admitted(gpuPod("busy", "q", 1), "n1"))
			}
			c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 1)}, queues, pods...)
			if !tc.noKueue {
				c.s.deps.Kueue = staticWorkloads(tc.workloads...)
			}
			c.s.deps.KueueSynced = func() bool { return !tc.unsynced }
			c.s.deps.Jobs = func(ns, name string) (*batchv1.Job, bool) {
				for _, j := range []*batchv1.Job{job, other, flavored} {
					if j.Namespace == ns && j.Name == name {
						return j, true
					}
				}
				return nil, false
			}
			ph := &clusterPlaceholders{c: c, deleted: map[string]string{}}
			c.s.deps.Placeholders = ph
			c.s.opts.ElasticPools = true
			c.cycle()
			for _, name := range tc.wantBound {
				if c.boundTo(name) == "" {
					t.Errorf("%s pending %s %q, want it bound", name, c.reason(name), c.b.Messages[name])
				}
				if q != nil && q.Spec.Admission == v1alpha1.AdmissionKueue {
					// The slot it takes, recorded for later cycles.
					if got := c.b.Annotations[name][api.AnnotationAdmittedOwner]; got != string(job.UID) {
						t.Errorf("%s bound with %s %q, want %q", name, api.AnnotationAdmittedOwner, got, job.UID)
					}
				}
			}
			for name, msg := range tc.wantWait {
				if n := c.boundTo(name); n != "" {
					t.Errorf("%s bound to %s, want it waiting for Kueue", name, n)
				}
				if r, m := c.reason(name), c.b.Messages[name]; r != api.ReasonNotAdmittedByKueue || !strings.Contains(m, msg) {
					t.Errorf("%s pending %s %q, want %s with %q", name, r, m, api.ReasonNotAdmittedByKueue, msg)
				}
			}
			if asked := len(ph.created) > 0; asked != tc.wantAsk {
				t.Errorf("placeholders created %v, want some: %v", ph.created, tc.wantAsk)
			}
		})
	}
}
