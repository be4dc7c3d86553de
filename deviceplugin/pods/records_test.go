package pods

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	testclock "k8s.io/utils/clock/testing"

	"github.com/gpufrac/gpufrac/api"
)

// startHint starts a hint (informer only, no write-back loop) over pods.
func startHint(t *testing.T, podRes *PodResources, pods ...*corev1.Pod) *Hint {
	t.Helper()
	ctx := testContext(t)
	objs := make([]runtime.Object, len(pods))
	for i, p := range pods {
		objs[i] = p
	}
	c := newFakeClient(objs...)
	h := NewHint(c, node, podRes)
	h.lagWait = 0
	startInformer(t, ctx, h, c)
	return h
}

// slots returns the record of every fraction container, by "pod/container".
func (h *Hint) slots() map[string]slotView {
	h.reconcile()
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ledger.slotViews()
}

// TestHintTrustsOnlyTheCoordinatorsPods: gpufrac.io/gpu is read only from
// pods whose spec.schedulerName is the coordinator's (issue 12: a pod with
// spec.nodeName and its own annotation naming a victim's GPU).
func TestHintTrustsOnlyTheCoordinatorsPods(t *testing.T) {
	tests := []struct {
		name string
		opts []HintOption
		pod  *corev1.Pod
		want hintAnswer
	}{
		{name: "a pod of the default scheduler carrying its own gpufrac.io/gpu",
			pod:  makePod("tenant", "spoof").fraction("main", 10).gpu(gpuA).scheduler("default-scheduler").obj(),
			want: hintAnswer{}},
		{name: "a pod without a scheduler name",
			pod:  makePod("tenant", "spoof").fraction("main", 10).gpu(gpuA).scheduler("").obj(),
			want: hintAnswer{}},
		{name: "the coordinator's pod",
			pod:  makePod("tenant", "placed").fraction("main", 10).gpu(gpuA).obj(),
			want: hintAnswer{gpuA, true}},
		{name: "a renamed coordinator: its name is trusted, the default is not",
			opts: []HintOption{WithSchedulerName("gpu-sched")},
			pod:  makePod("tenant", "placed").fraction("main", 10).gpu(gpuA).obj(),
			want: hintAnswer{}},
		{name: "a renamed coordinator's pod",
			opts: []HintOption{WithSchedulerName("gpu-sched")},
			pod:  makePod("tenant", "placed").fraction("main", 10).gpu(gpuA).scheduler("gpu-sched").obj(),
			want: hintAnswer{gpuA, true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testContext(t)
			c := newFakeClient(tt.pod)
			h := NewHint(c, node, nil, tt.opts...)
			h.lagWait = 0
			startInformer(t, ctx, h, c)
			var got hintAnswer
			got.GPU, got.OK = h.GPUFor(10)
			if got != tt.want {
				t.Errorf("GPUFor(10) = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestAnswersFollowTheKubelet: an Allocate answer is recorded on the pod
// it most likely serves, and moves to the pod the kubelet says got it.
func TestAnswersFollowTheKubelet(t *testing.T) {
	ctx := testContext(t)
	n := startSimNode(t, ctx)
	n.fakePlugin(t, ctx, api.ResourceFraction, unitDevices(gpuA, gpuB), true) // prefers the highest IDs: gpuB
	old := makePod("default", "old").fraction("main", 30).gpu(gpuB).age(time.Hour).obj()
	young := makePod("default", "young").fraction("main", 30).gpu(gpuA).obj()
	h := startHint(t, n.podRes, old, young)

	// The kubelet admits the young pod on gpuB (the plugin's choice); the
	// answer is first recorded on the pod planned there, the old one.
	h.Allocated(ctx, gpuB, 30)
	want := map[string]slotView{"old/main": {"answered", gpuB}, "young/main": {"waiting", ""}}
	if diff := cmp.Diff(want, h.slots()); diff != "" {
		t.Fatalf("records after the answer (-want +got):\n%s", diff)
	}
	if gpu, ok := h.GPUFor(30); !ok || gpu != gpuA {
		t.Errorf("GPUFor(30) while the answer flies = %q, %t; want the young pod's %s", gpu, ok, gpuA)
	}

	// PodResources says the young pod holds gpuB: the answer moves to it,
	// and the old pod waits again, still for gpuA's slot (interchangeable).
	n.allocate(t, ctx, young, api.ResourceFraction, 30)
	if _, err := h.writeBack(ctx); err != nil {
		t.Fatal(err)
	}
	want = map[string]slotView{"old/main": {"waiting", ""}, "young/main": {"admitted", gpuB}}
	if diff := cmp.Diff(want, h.slots()); diff != "" {
		t.Errorf("records after the kubelet's listing (-want +got):\n%s", diff)
	}
	if gpu, ok := h.GPUFor(30); !ok || gpu != gpuA {
		t.Errorf("GPUFor(30) for the old pod = %q, %t; want %s, the GPU still lacking its planned fraction", gpu, ok, gpuA)
	}
	if got := h.answersInFlight(); got != 0 {
		t.Errorf("%d answers in flight after the kubelet reported the admission", got)
	}
}

// TestAnswerBeforeThePodIsKnown: an answer for a pod the informer has not
// shown yet is kept unattributed and goes to the pod once it shows.
func TestAnswerBeforeThePodIsKnown(t *testing.T) {
	ctx := testContext(t)
	c := newFakeClient()
	h := NewHint(c, node, nil)
	h.lagWait = 0
	startInformer(t, ctx, h, c)
	h.Allocated(ctx, gpuA, 20)
	if got := h.answersInFlight(); got != 1 {
		t.Fatalf("answers in flight = %d, want 1", got)
	}
	p := makePod("default", "late").fraction("main", 20).gpu(gpuA).obj()
	if _, err := c.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "the answer on the late pod's record", func() bool {
		return h.slots()["late/main"] == slotView{"answered", gpuA}
	})
	if _, ok := h.GPUFor(20); ok {
		t.Error("GPUFor(20) gave a hint though the only pod of the size was answered")
	}
}

// TestRefusesFractionsOfInitContainers: a size that a pod waiting here
// asks in an init container is refused, naming the pod; other sizes and
// pods that already ended are not.
func TestRefusesFractionsOfInitContainers(t *testing.T) {
	bad := makePod("tenant", "init-frac").initFraction("setup", 20).plain("main").obj()
	done := makePod("tenant", "init-done").initFraction("setup", 40).plain("main").phase(corev1.PodFailed).obj()
	good := makePod("team", "app").fraction("main", 20).gpu(gpuA).obj()
	h := startHint(t, nil, bad, done, good)
	err := h.Refusal(20)
	if !errors.Is(err, ErrInitContainerFraction) || !strings.Contains(err.Error(), "tenant/init-frac") {
		t.Errorf("Refusal(20) = %v, want ErrInitContainerFraction naming tenant/init-frac", err)
	}
	for _, units := range []int{10, 40} {
		if err := h.Refusal(units); err != nil {
			t.Errorf("Refusal(%d) = %v, want nil", units, err)
		}
	}
}

// TestReservationOnly: a GPU carrying fractions may go whole only to the
// reservation waiting for it, and only while no other pod waits here for
// whole GPUs.
func TestReservationOnly(t *testing.T) {
	reservation := makePod(api.ReservationNamespace, api.ReservationNamePrefix+"n-3").whole("hold", 1).gpu(gpuA).obj()
	tests := []struct {
		name   string
		pods   []*corev1.Pod
		admit  []*corev1.Pod // admitted whole through the kubelet simulator first
		gpu    string
		want   bool
		wantRG string // ReservationGPU's answer
	}{
		{name: "the reservation alone", pods: []*corev1.Pod{reservation}, gpu: gpuA, want: true, wantRG: gpuA},
		{name: "another GPU", pods: []*corev1.Pod{reservation}, gpu: gpuB, want: false, wantRG: gpuA},
		{name: "a whole-GPU pod waits beside it", pods: []*corev1.Pod{reservation, makePod("tenant", "trainer").whole("main", 1).obj()},
			gpu: gpuA, want: false, wantRG: gpuA},
		{name: "a whole-GPU pod already admitted does not count",
			pods:  []*corev1.Pod{reservation, makePod("tenant", "trainer").whole("main", 1).obj()},
			admit: []*corev1.Pod{makePod("tenant", "trainer").whole("main", 1).obj()},
			gpu:   gpuA, want: true, wantRG: gpuA},
		{name: "a pod dressed as a reservation outside the reservation namespace is no reservation",
			pods: []*corev1.Pod{makePod("tenant", api.ReservationNamePrefix+"x").whole("hold", 1).gpu(gpuA).obj()},
			gpu:  gpuA, want: false},
		// Issue 25 (6d): gpufrac.io/allocated-gpu was taken for "admitted"
		// at once, though the kubelet's listing did not show the pod
		// holding anything (a forged or stale annotation): the shared GPU
		// went whole to whichever one-GPU pod the kubelet admitted.
		{name: "a waiting whole-GPU pod claiming allocated-gpu the kubelet does not list still counts",
			pods: []*corev1.Pod{reservation, makePod("tenant", "trainer").whole("main", 1).annotate(api.AnnotationAllocatedGPU, gpuB).obj()},
			gpu:  gpuA, want: false, wantRG: gpuA},
		{name: "a reservation already holding its GPU", pods: []*corev1.Pod{makePod(api.ReservationNamespace, api.ReservationNamePrefix+"n-3").whole("hold", 1).gpu(gpuA).
			annotate(api.AnnotationReservedGPU, gpuA).obj()}, gpu: gpuA, want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testContext(t)
			n := startSimNode(t, ctx)
			n.fakePlugin(t, ctx, api.ResourceGPU, []*v1beta1.Device{{ID: wholeUUID(0), Health: v1beta1.Healthy}}, false)
			for _, p := range tt.admit {
				n.allocate(t, ctx, p, api.ResourceGPU, 1)
			}
			h := startHint(t, n.podRes, tt.pods...)
			if got := h.ReservationOnly(ctx, tt.gpu); got != tt.want {
				t.Errorf("ReservationOnly(%s) = %t, want %t", tt.gpu, got, tt.want)
			}
			if got, _ := h.ReservationGPU(); got != tt.wantRG {
				t.Errorf("ReservationGPU() = %q, want %q", got, tt.wantRG)
			}
		})
	}
}

// TestReservationTakenExpiresOnTheClock: a reservation handed its GPU is
// skipped for reservationTakenTTL of the hint's clock, then asked about again.
func TestReservationTakenExpiresOnTheClock(t *testing.T) {
	ctx := testContext(t)
	r := makePod(api.ReservationNamespace, api.ReservationNamePrefix+"n-1").whole("hold", 1).gpu(gpuB).obj()
	c := newFakeClient(r)
	clk := testclock.NewFakeClock(t0)
	h := NewHint(c, node, nil, WithClock(clk))
	startInformer(t, ctx, h, c)
	if g, ok := h.ReservationGPU(); !ok || g != gpuB {
		t.Fatalf("ReservationGPU() = %q, %t", g, ok)
	}
	h.ReservationTaken(gpuB)
	if g, ok := h.ReservationGPU(); ok {
		t.Fatalf("ReservationGPU() right after it was taken = %q", g)
	}
	clk.Step(reservationTakenTTL)
	if g, ok := h.ReservationGPU(); !ok || g != gpuB {
		t.Errorf("ReservationGPU() after the mark expired = %q, %t; want %s", g, ok, gpuB)
	}
}

// TestRecordsAreKeyedByUID: a pod deleted and created again under the same
// name is a new record; the old one's answer does not carry over.
func TestRecordsAreKeyedByUID(t *testing.T) {
	ctx := testContext(t)
	p := makePod("default", "p").fraction("main", 10).gpu(gpuA).obj()
	c := newFakeClient(p)
	h := NewHint(c, node, nil)
	h.lagWait = 0
	startInformer(t, ctx, h, c)
	h.Allocated(ctx, gpuA, 10)
	if err := c.CoreV1().Pods("default").Delete(ctx, "p", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	p2 := p.DeepCopy()
	p2.UID = types.UID("second-incarnation")
	p2.ResourceVersion = ""
	if _, err := c.CoreV1().Pods("default").Create(ctx, p2, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "the new incarnation in the informer", func() bool {
		got, err := h.pods.lister.Pods("default").Get("p")
		return err == nil && got.UID == p2.UID
	})
	// The old incarnation's answer went with its record (the kubelet
	// freed its units): the new pod waits, and gets its hint.
	if got := h.slots()["p/main"]; got != (slotView{"waiting", ""}) {
		t.Errorf("new incarnation's record = %+v, want waiting", got)
	}
	if got := h.answersInFlight(); got != 0 {
		t.Errorf("%d answers in flight after the answered pod went", got)
	}
	if gpu, ok := h.GPUFor(10); !ok || gpu != gpuA {
		t.Errorf("GPUFor(10) = %q, %t; want %s for the new incarnation", gpu, ok, gpuA)
	}
	h.mu.Lock()
	_, oldKept := h.ledger.records[p.UID]
	h.mu.Unlock()
	if oldKept {
		t.Error("the deleted pod's record is kept")
	}
}
