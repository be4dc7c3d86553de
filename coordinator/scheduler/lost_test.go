package scheduler

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/tests/builders"
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

// A non-preemptible fraction the coordinator evicts itself (off a GPU
// given whole to another pod; a gang rollback alike) carries the Eviction
// API's DisruptionTarget when it is deleted: the coordinator's own doing,
// placed again, not lost work. Another such pod the coordinator did not
// evict still counts.
func TestSelfEvictedWorkIsNotReportedLost(t *testing.T) {
	whole := builders.MakePod("w1", "tenant-b").UID("w1").Node("n1").SchedulerName("").GPUs(1).CPU("1").Obj()
	whole.Status.Phase = corev1.PodRunning
	whole.Annotations = map[string]string{api.AnnotationAllocatedGPU: "GPU-n1-0"}
	f1 := runningFraction("f1", "n1", "GPU-n1-0", 30)
	f1.Spec.SchedulerName = api.SchedulerName
	f1.Annotations[api.AnnotationAdmittedPreemptible] = "false"
	c, _, _ := lostReservationCluster(t, f1, whole)
	c.cycle()
	if got := c.b.ReleasedPods()["f1"]; got != ReasonGPUTaken {
		t.Fatalf("f1 released with %q, want %q", got, ReasonGPUTaken)
	}
	evicted := func(p *corev1.Pod) *corev1.Pod {
		p = p.DeepCopy()
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{
			Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "EvictionByEvictionAPI", Message: "Eviction API: evicting"})
		return p
	}
	c.s.OnPodDelete(evicted(f1))
	if n := testutil.ToFloat64(c.s.metrics.nonPreemptibleLost.WithLabelValues("EvictionByEvictionAPI")); n != 0 {
		t.Errorf("gpufrac_nonpreemptible_pods_lost_total{reason=EvictionByEvictionAPI} = %v after the coordinator's own eviction, want 0", n)
	}
	other := runningFraction("f2", "n1", "GPU-n1-1", 30)
	other.UID = "f2"
	other.Spec.SchedulerName = api.SchedulerName
	other.Annotations[api.AnnotationAdmittedPreemptible] = "false"
	c.s.OnPodDelete(evicted(other))
	if n := testutil.ToFloat64(c.s.metrics.nonPreemptibleLost.WithLabelValues("EvictionByEvictionAPI")); n != 1 {
		t.Errorf("gpufrac_nonpreemptible_pods_lost_total{reason=EvictionByEvictionAPI} = %v after a drain's eviction, want 1", n)
	}
}
