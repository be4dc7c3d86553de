package scheduler

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/coordinator/reservation"
	"github.com/gpufrac/gpufrac/tests/builders"
)

// TestReservationsNeverOutnumberTheGPUsWholePodsLeave mirrors the e2e
// TestHelmUpgradeWhileWorkRunsLosesNothing failure: whole-GPU pods (5 GPUs
// of 8) bound beside fractions waiting for reservations; the node agent
// writes the whole pods' GPUs back one by one, some on GPUs reservations
// asked for. At no time may the reservation pods alive on the node and the
// whole GPUs bound there outnumber its GPUs: the kubelet rejects the extra
// reservation ("Requested: 1, Available: 0").
func TestReservationsNeverOutnumberTheGPUsWholePodsLeave(t *testing.T) {
	gang := func(name string) *corev1.Pod {
		return builders.MakePod(name, "default").Queue("a").GPUs(2).CPU("1").UID(name).PodGroup("train").MinMember(2).Obj()
	}
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 8), h100Node("n2", "a", 8)},
		[]*v1alpha1.Queue{queueOf("a", "8"), builders.MakeQueue("b").GPUQuota("8").Namespaces("default").Obj()},
		fracPod("frac-30", "a", 30), fracPod("frac-40", "a", 40), fracPod("frac-50", "a", 50),
		gang("gang-0"), gang("gang-1"), gpuPod("whole", "a", 1))
	r := &fakeReserver{c: c}
	c.s.deps.Reserver = r

	check := func(step string) {
		t.Helper()
		perNode := map[string]int{}
		for _, obj := range c.pods.List() {
			p := obj.(*corev1.Pod)
			if p.Spec.NodeName == "" {
				continue
			}
			for _, ctr := range p.Spec.Containers {
				q := ctr.Resources.Limits[api.ResourceGPU]
				perNode[p.Spec.NodeName] += int(q.Value())
			}
		}
		t.Logf("%s: GPUs asked for per node %v, reservations ensured %v", step, perNode, r.ensured)
		for n, k := range perNode {
			if k > 8 {
				t.Errorf("%s: %d GPUs asked for on %s (whole pods and reservation pods), which has 8", step, k, n)
			}
		}
	}
	var given []string // GPUs written back
	c.cycle()
	check("first cycle")
	for _, n := range []string{"gang-0", "gang-1", "whole"} {
		if c.boundTo(n) == "" {
			t.Fatalf("%s not bound", n)
		}
	}
	node := c.boundTo("whole")
	if len(r.ensured) != 2 || node != "n1" {
		t.Fatalf("first cycle: reservations %v, whole pods on %s; want two on n1", r.ensured, node)
	}
	gpu := func(e string) string { return strings.TrimPrefix(e, node+"/") }
	rb := gpu(r.ensured[1])
	free := func(taken ...string) string { // a GPU nobody asked for nor took
		for i := range 8 {
			g := fmt.Sprintf("GPU-%s-%d", node, i)
			if !slices.Contains(taken, g) && !slices.Contains(r.ensured, node+"/"+g) && !slices.Contains(given, g) {
				return g
			}
		}
		t.Fatal("no GPU left")
		return ""
	}
	writeBack := func(pod string, ids ...string) {
		t.Helper()
		given = append(given, ids...)
		obj, _, _ := c.pods.GetByKey("default/" + pod)
		p := obj.(*corev1.Pod).DeepCopy()
		p.Annotations[api.AnnotationAllocatedGPU] = strings.Join(ids, ",")
		_ = c.pods.Update(p)
	}
	// 2. The kubelet admitted the whole pods before the reservations: the
	// node agent gave gang-0 the GPU reservation b asks for. Its write-back
	// shows; the reservation created next is slow to show in the informer.
	writeBack("gang-0", rb, free())
	r.lag = true
	c.cycle()
	check("gang-0 written back")
	if len(r.ensured) != 3 {
		t.Fatalf("after gang-0's write-back: reservations %v; want a third one for the fractions planned on %s", r.ensured, rb)
	}
	rc := gpu(r.ensured[2])
	// 3. gang-1 got the GPU reservation c asks for (c not shown yet).
	writeBack("gang-1", rc, free(rc))
	c.cycle()
	check("gang-1 written back")
	// Reservation c shows now.
	shown := reservation.PodAt(node, rc, 0, reservation.DefaultOptions())
	shown.UID = types.UID(shown.Name)
	_ = c.pods.Add(shown)
	r.lag = false
	c.cycle()
	check("reservation c shown")
	writeBack("whole", free())
	c.cycle()
	check("whole written back")
	onNode := 0
	for _, e := range r.ensured {
		if strings.HasPrefix(e, node+"/") {
			onNode++
		}
	}
	if onNode+5 > 8 {
		t.Errorf("%d reservations asked for on %s beside 5 whole GPUs: %d GPUs of 8 (%v)", onNode, node, onNode+5, r.ensured)
	}
}

// TestAFailedReservationCreateHoldsNoGPU: a reservation whose create the API
// server refused is not counted as one created but not shown yet (it would
// hold a GPU of its node for the echo window and delay its fractions): the
// next cycle asks for it again.
func TestAFailedReservationCreateHoldsNoGPU(t *testing.T) {
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 1)}, []*v1alpha1.Queue{queueOf("q", "8")},
		fracPod("f1", "q", 40))
	r := &fakeReserver{c: c, admit: true, ensureErr: 1}
	c.s.deps.Reserver = r
	c.cycle()
	if len(r.ensured) != 1 {
		t.Fatalf("first cycle: reservations asked for %v, want one", r.ensured)
	}
	c.cycle()
	if len(r.ensured) != 2 || r.ensured[1] != r.ensured[0] {
		t.Fatalf("after a refused create: reservations asked for %v, want the same GPU asked again at once", r.ensured)
	}
	c.cycle()
	if c.boundTo("f1") != "n1" {
		t.Errorf("f1 bound to %q once its reservation exists, want n1", c.boundTo("f1"))
	}
}
