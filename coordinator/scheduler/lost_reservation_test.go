package scheduler

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/reservation"
	"github.com/gpufrac/gpufrac/tests/builders"
)

// runningFraction is a fraction pod admitted on gpu of node: the node
// agent wrote back the GPU it gave.
func runningFraction(name, node, gpu string, pct int) *corev1.Pod {
	p := admitted(fracPod(name, "q", pct), node)
	p.Annotations[api.AnnotationGPU] = gpu
	p.Annotations[api.AnnotationAllocatedGPU] = gpu
	return p
}

// lostReservationCluster is a scheduler with a reservation manager on a
// fake clientset, over pods given as data.
func lostReservationCluster(t *testing.T, pods ...*corev1.Pod) (*cluster, *fake.Clientset, *prometheus.Registry) {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC))
	client := fake.NewClientset()
	rm := reservation.NewManager(client, nil, reservation.DefaultOptions(), clk)
	reg := prometheus.NewRegistry()
	c := newClusterWith(t, Options{BindWorkers: 1},
		Deps{Queues: staticQueues{queueOf("q", "8")}, Clock: clk, Reserver: rm, Registry: reg},
		[]*corev1.Node{h100Node("n1", "a", 2)}, pods...)
	return c, client, reg
}

// reservationOf tells whether the first reservation pod of gpu on n1 exists.
func reservationOf(t *testing.T, client *fake.Clientset, gpu string) bool {
	t.Helper()
	_, err := client.CoreV1().Pods(api.ReservationNamespace).Get(t.Context(), reservation.Name("n1", gpu), metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	return err == nil
}

// TestLostReservationIsMadeAgain (issue 25): a reservation pod preempted,
// evicted or deleted while fractions run on its GPU is created again in the
// next cycle, for the same GPU; the fractions keep running.
func TestLostReservationIsMadeAgain(t *testing.T) {
	c, client, _ := lostReservationCluster(t, runningFraction("f1", "n1", "GPU-n1-0", 30))
	c.cycle()
	if !reservationOf(t, client, "GPU-n1-0") {
		t.Error("no reservation made again for GPU-n1-0, where f1 runs")
	}
	if r := c.b.ReleasedPods(); len(r) != 0 {
		t.Errorf("released %v; the GPU was not taken", r)
	}
}

// TestFractionsOnATakenGPUAreEvicted (issue 25): the reservation was lost
// and the GPU given whole to another pod before it was made again (the node
// agent wrote gpufrac.io/allocated-gpu on that pod): the fractions there
// share the GPU with an exclusive pod. They are evicted with a reason and
// counted; no reservation is asked for that GPU (the kubelet would give it
// another one); fractions on other GPUs stay. An eviction that fails is
// tried again in the next cycle.
func TestFractionsOnATakenGPUAreEvicted(t *testing.T) {
	whole := builders.MakePod("w1", "tenant-b").UID("w1").Node("n1").SchedulerName("").GPUs(1).CPU("1").Obj()
	whole.Status.Phase = corev1.PodRunning
	whole.Annotations = map[string]string{api.AnnotationAllocatedGPU: "GPU-n1-0"}
	other := runningFraction("f3", "n1", "GPU-n1-1", 50)
	res := reservation.Pod("n1", "GPU-n1-1", reservation.DefaultOptions())
	res.UID, res.Status.Phase = "res-1", corev1.PodRunning
	res.Annotations[api.AnnotationReservedGPU] = "GPU-n1-1"
	c, client, reg := lostReservationCluster(t, runningFraction("f1", "n1", "GPU-n1-0", 30), runningFraction("f2", "n1", "GPU-n1-0", 20), whole, other, res)
	_, _ = client.CoreV1().Pods(res.Namespace).Create(t.Context(), res, metav1.CreateOptions{})
	c.b.NextReleaseErr = apierrors.NewTimeoutError("etcdserver: request timed out", 1)

	c.cycle()
	if got := len(c.b.ReleasedPods()); got != 1 {
		t.Fatalf("released %v after one failed eviction, want the other one", c.b.ReleasedPods())
	}
	c.cycle()
	got := c.b.ReleasedPods()
	for _, name := range []string{"f1", "f2"} {
		if got[name] != ReasonGPUTaken {
			t.Errorf("%s released with reason %q, want %q (all released: %v)", name, got[name], ReasonGPUTaken, got)
		}
	}
	if _, ok := got["f3"]; ok {
		t.Error("f3, on a GPU its reservation holds, was released")
	}
	if reservationOf(t, client, "GPU-n1-0") {
		t.Error("a reservation was asked for GPU-n1-0, which w1 holds whole")
	}
	if n := testutil.ToFloat64(c.s.metrics.fractionsEvicted.WithLabelValues(EvictedGPUTaken)); n != 2 {
		t.Errorf("gpufrac_fractions_evicted_total{reason=gpu_taken} = %v, want 2", n)
	}
	if n, err := testutil.GatherAndCount(reg, "gpufrac_fractions_evicted_total"); err != nil || n != 1 {
		t.Errorf("gpufrac_fractions_evicted_total series: %d (%v)", n, err)
	}
	// Once evicted (terminating), they are not evicted again.
	calls := c.b.ReleaseCalls
	for _, name := range []string{"f1", "f2"} {
		obj, _, _ := c.pods.GetByKey("default/" + name)
		p := obj.(*corev1.Pod).DeepCopy()
		now := metav1.Now()
		p.DeletionTimestamp = &now
		_ = c.pods.Update(p)
	}
	c.cycle()
	if c.b.ReleaseCalls != calls {
		t.Errorf("%d more evictions of terminating pods", c.b.ReleaseCalls-calls)
	}
}

// TestForgedAllocatedGPUEvictsNothing: gpufrac.io/allocated-gpu is
// untrusted where the admission policies are missing. A whole-GPU pod that
// names a GPU a reservation pod holds lies (the kubelet gives a device to
// one pod): the fractions there stay.
func TestForgedAllocatedGPUEvictsNothing(t *testing.T) {
	forger := builders.MakePod("w1", "tenant-b").UID("w1").Node("n1").SchedulerName("").GPUs(1).CPU("1").Obj()
	forger.Status.Phase = corev1.PodRunning
	forger.Annotations = map[string]string{api.AnnotationAllocatedGPU: "GPU-n1-0"}
	res := reservation.Pod("n1", "GPU-n1-0", reservation.DefaultOptions())
	res.UID, res.Status.Phase = "res-0", corev1.PodRunning
	res.Annotations[api.AnnotationReservedGPU] = "GPU-n1-0"
	c, _, _ := lostReservationCluster(t, runningFraction("f1", "n1", "GPU-n1-0", 30), forger, res)
	c.cycle()
	c.cycle()
	if r := c.b.ReleasedPods(); len(r) != 0 {
		t.Errorf("released %v on a forged gpufrac.io/allocated-gpu", r)
	}
}

// TestLostReservationsGPUIsNotPlacedWhole: while its reservation is made
// again, the GPU where fractions run is not free for the coordinator's own
// whole-GPU placement: of two pods asking one GPU each, one gets the clean
// GPU and the other waits.
func TestLostReservationsGPUIsNotPlacedWhole(t *testing.T) {
	c, _, _ := lostReservationCluster(t, runningFraction("f1", "n1", "GPU-n1-0", 30), gpuPod("w1", "q", 1), gpuPod("w2", "q", 1))
	c.cycle()
	c.cycle()
	bound := 0
	for _, name := range []string{"w1", "w2"} {
		if c.boundTo(name) != "" {
			bound++
		}
	}
	if bound != 1 {
		t.Errorf("%d of two one-GPU pods bound to n1, whose other GPU carries f1 without a reservation; want 1", bound)
	}
}
