package scheduler

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/gpufrac/gpufrac/api"
)

// A pod admitted non-preemptible that Kubernetes deletes before it finished
// (its spot node reclaimed: the pod garbage collector deletes it) is
// reported lost, by an event and a metric; a pod admitted preemptible, one
// its author deletes (no DisruptionTarget), one that finished, another
// scheduler's or one never bound is not.
func TestLostNonPreemptibleWorkIsReported(t *testing.T) {
	lost := func(reason string) func(p *corev1.Pod) {
		return func(p *corev1.Pod) {
			p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{
				Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: reason, Message: "node gone"})
		}
	}
	for _, tc := range []struct {
		name      string
		edit      []func(p *corev1.Pod)
		tombstone bool   // the informer missed the delete: DeletedFinalStateUnknown
		want      string // metric label reported; "" for none
	}{
		{name: "node reclaimed: garbage-collected", edit: []func(*corev1.Pod){lost("DeletionByPodGC")}, want: "DeletionByPodGC"},
		{name: "evicted by a drain", edit: []func(*corev1.Pod){lost("EvictionByEvictionAPI")}, want: "EvictionByEvictionAPI"},
		{name: "an unknown reason counts as Other", edit: []func(*corev1.Pod){lost("SomethingNew")}, want: "Other"},
		{name: "the informer missed the delete", edit: []func(*corev1.Pod){lost("DeletionByPodGC")}, tombstone: true, want: "DeletionByPodGC"},
		{name: "deleted by its author", want: ""},
		{
			name: "admitted preemptible",
			edit: []func(*corev1.Pod){lost("DeletionByPodGC"), func(p *corev1.Pod) { p.Annotations[api.AnnotationAdmittedPreemptible] = "true" }},
		},
		{name: "finished", edit: []func(*corev1.Pod){lost("DeletionByPodGC"), func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }}},
		{name: "another scheduler's", edit: []func(*corev1.Pod){lost("DeletionByPodGC"), func(p *corev1.Pod) { p.Spec.SchedulerName = "default-scheduler" }}},
		{name: "never bound", edit: []func(*corev1.Pod){lost("DeletionByPodGC"), func(p *corev1.Pod) { p.Spec.NodeName = "" }}},
		{
			name: "the DisruptionTarget is not True",
			edit: []func(*corev1.Pod){lost("DeletionByPodGC"), func(p *corev1.Pod) { p.Status.Conditions[0].Status = corev1.ConditionFalse }},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := record.NewFakeRecorder(4)
			c := newClusterWith(t, Options{BindWorkers: 1}, Deps{Queues: staticQueues{queueOf("q", "8")}, Recorder: rec},
				[]*corev1.Node{h100Node("n1", "a", 1)})
			p := admitted(gpuPod("train", "q", 1), "n1")
			p.Spec.SchedulerName = api.SchedulerName
			p.Annotations[api.AnnotationAdmittedPreemptible] = "false"
			for _, e := range tc.edit {
				e(p)
			}
			var obj any = p
			if tc.tombstone {
				obj = cache.DeletedFinalStateUnknown{Key: "default/train", Obj: p}
			}
			c.s.OnPodDelete(obj)
			for _, label := range []string{"DeletionByPodGC", "EvictionByEvictionAPI", "Other"} {
				want := 0.0
				if label == tc.want {
					want = 1
				}
				if got := testutil.ToFloat64(c.s.metrics.nonPreemptibleLost.WithLabelValues(label)); got != want {
					t.Errorf("gpufrac_nonpreemptible_pods_lost_total{reason=%q} = %v, want %v", label, got, want)
				}
			}
			select {
			case e := <-rec.Events:
				if tc.want == "" || !strings.Contains(e, ReasonNonPreemptibleLost) || !strings.Contains(e, "n1") {
					t.Errorf("event %q, want one only when lost (%q)", e, tc.want)
				}
			default:
				if tc.want != "" {
					t.Error("no event for the lost pod")
				}
			}
		})
	}
}
