package pods

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	testclock "k8s.io/utils/clock/testing"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
	"github.com/gpufrac/gpufrac/mig"
)

const migA = "MIG-aaaaaaaa-1111-1111-1111-111111111111"

// listingOf is a PodResources answer: pod "namespace/name" holds ids of
// resource in its container "main".
func listingOf(namespace, name, res string, ids ...string) *podresourcesapi.ListPodResourcesResponse {
	return &podresourcesapi.ListPodResourcesResponse{PodResources: []*podresourcesapi.PodResources{
		{Namespace: namespace, Name: name, Containers: []*podresourcesapi.ContainerResources{
			{Name: "main", Devices: []*podresourcesapi.ContainerDevices{devices(res, -1, ids...)}},
		}},
	}}
}

// TestKickedWriteBackRetriesShortly checks that an allocation of whole
// GPUs, MIG devices (single strategy) or fractions kicks the write-back,
// and that when the kubelet lists the allocation only after the kicked
// pass (it records it after the Allocate RPC returns), the pod is written
// back on the short retries, long before the resync period; and that the
// burst of retries ends, whether the allocation shows up or never does.
func TestKickedWriteBackRetriesShortly(t *testing.T) {
	reservation := makePod(api.ReservationNamespace, api.ReservationNamePrefix+"r").whole("main", 1).gpu(gpuA).obj()
	trainer := makePod("default", "trainer").whole("main", 1).obj()
	migUser := makePod("default", "mig-user").whole("main", 1).obj()
	frac := makePod("default", "frac").fraction("main", 30).gpu(gpuA).obj()
	gpus := []nvidia.GPU{{Index: 0, UUID: gpuA, MemoryBytes: 80 << 30}}
	errKubelet := errors.New("kubelet restarting")

	type allocateFunc func(t *testing.T, ctx context.Context, h *Hint, usage resource.UsageSource)
	whole := func(t *testing.T, ctx context.Context, h *Hint, usage resource.UsageSource) {
		w := resource.NewWhole(resource.WholeOptions{GPUs: gpus, Usage: usage, Reservations: h, Allocations: h})
		if _, err := w.Allocate(ctx, []string{gpuA}); err != nil {
			t.Fatalf("whole Allocate: %v", err)
		}
	}
	migSingle := func(t *testing.T, ctx context.Context, h *Hint, _ resource.UsageSource) {
		r, err := resource.NewMIG(resource.MIGOptions{Name: api.ResourceGPU, GPUs: gpus, Strategy: resource.StrategyCDI, Allocations: h,
			Devices: []mig.Device{{UUID: migA, GPU: gpuA, GI: 1, Profile: "7g.80gb", Full: true}}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Allocate(ctx, []string{migA}); err != nil {
			t.Fatalf("MIG Allocate: %v", err)
		}
	}
	fraction := func(t *testing.T, ctx context.Context, h *Hint, usage resource.UsageSource) {
		f := resource.NewFraction(resource.FractionOptions{GPUs: gpus, Usage: usage, Hint: h})
		ids := make([]string, 30)
		for k := range ids {
			ids[k] = resource.UnitID(gpuA, k)
		}
		if _, err := f.Allocate(ctx, ids); err != nil {
			t.Fatalf("fraction Allocate: %v", err)
		}
	}
	var units []string
	for k := range 30 {
		units = append(units, resource.UnitID(gpuA, k))
	}

	tests := []struct {
		name     string
		pod      *corev1.Pod
		allocate allocateFunc
		// listing is what the kubelet lists after the kicked pass (nil:
		// nothing, ever).
		listing *podresourcesapi.ListPodResourcesResponse
		// listFails fails the kicked pass's PodResources call;
		// patchFails the first patch.
		listFails, patchFails bool
		// retries is how many retries of the burst pass before the pod is
		// written back (0: not written).
		retries int
		want    map[string]map[string]string
	}{
		{
			name: "a reservation is written on the first retry", pod: reservation, allocate: whole,
			listing: listingOf(reservation.Namespace, reservation.Name, api.ResourceGPU, gpuA),
			retries: 1,
			want:    map[string]map[string]string{"gpufrac-reservations/gpufrac-reservation-r": {api.AnnotationGPU: gpuA, api.AnnotationReservedGPU: gpuA}},
		},
		{
			name: "a whole-GPU pod is written on the first retry", pod: trainer, allocate: whole,
			listing: listingOf("default", "trainer", api.ResourceGPU, gpuA),
			retries: 1,
			want:    map[string]map[string]string{"default/trainer": {api.AnnotationAllocatedGPU: gpuA}},
		},
		{
			name: "a MIG device in the single strategy is written on the first retry", pod: migUser, allocate: migSingle,
			listing: listingOf("default", "mig-user", api.ResourceGPU, migA),
			retries: 1,
			want:    map[string]map[string]string{"default/mig-user": {api.AnnotationAllocatedGPU: migA}},
		},
		{
			name: "a fraction is written on the first retry", pod: frac, allocate: fraction,
			listing: listingOf("default", "frac", api.ResourceFraction, units...),
			retries: 1,
			want:    map[string]map[string]string{"default/frac": {api.AnnotationGPU: gpuA, api.AnnotationAllocatedGPU: gpuA}},
		},
		{
			name: "PodResources failing once: the next retry writes", pod: reservation, allocate: whole,
			listing: listingOf(reservation.Namespace, reservation.Name, api.ResourceGPU, gpuA), listFails: true,
			retries: 1,
			want:    map[string]map[string]string{"gpufrac-reservations/gpufrac-reservation-r": {api.AnnotationGPU: gpuA, api.AnnotationReservedGPU: gpuA}},
		},
		{
			name: "the patch failing once: the next retry writes", pod: reservation, allocate: whole,
			listing: listingOf(reservation.Namespace, reservation.Name, api.ResourceGPU, gpuA), patchFails: true,
			retries: 2,
			want:    map[string]map[string]string{"gpufrac-reservations/gpufrac-reservation-r": {api.AnnotationGPU: gpuA, api.AnnotationReservedGPU: gpuA}},
		},
		{
			name: "never listed: the burst ends", pod: reservation, allocate: whole,
			want: map[string]map[string]string{"gpufrac-reservations/gpufrac-reservation-r": {api.AnnotationGPU: gpuA}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testContext(t)
			clk := testclock.NewFakeClock(t0)
			lister := &fakeLister{resp: &podresourcesapi.ListPodResourcesResponse{}}
			pr, err := NewPodResources(serveLister(t, lister), 100*time.Millisecond, clk)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { pr.Close() })
			c := newFakeClient([]runtime.Object{tt.pod}...)
			if tt.patchFails {
				failed := false
				c.PrependReactor("patch", "pods", func(clienttesting.Action) (bool, runtime.Object, error) {
					if failed {
						return false, nil, nil
					}
					failed = true
					return true, nil, errors.New("API server unavailable")
				})
			}
			h := NewHint(c, node, pr, WithClock(clk))
			runHint(t, ctx, h)
			// The first pass has run and the loop waits on its period alone.
			eventually(t, ctx, "the loop's first pass", func() bool {
				h.mu.Lock()
				defer h.mu.Unlock()
				return h.ledger.listing.fractions != nil && clk.Waiters() == 1
			})

			if tt.listFails {
				lister.FailNext(errKubelet)
			}
			before := lister.Calls()
			tt.allocate(t, ctx, h, pr)
			// The kicked pass found nothing listed (or failed) and armed the
			// first retry: the period's ticker and the retry wait.
			eventually(t, ctx, "the kicked pass and its retry", func() bool { return lister.Calls() > before && clk.Waiters() == 2 })
			if tt.listing != nil {
				lister.SetResp(tt.listing)
			}

			start := clk.Now()
			for i, d := range writeBackRetries() {
				passes := lister.Calls()
				clk.Step(d)
				eventually(t, ctx, "a retry pass", func() bool { return lister.Calls() > passes })
				if tt.retries == i+1 {
					eventually(t, ctx, "the write-back", func() bool { return cmp.Equal(tt.want, c.annotations(t)) })
					if took := clk.Now().Sub(start); took >= writeBackResync {
						t.Errorf("written back %v after the kick's pass, want well before the %v period", took, writeBackResync)
					}
				}
				// The burst ends once nothing is pending: only the ticker waits.
				if tt.retries != 0 && i+1 >= tt.retries {
					eventually(t, ctx, "the burst to end", func() bool { return clk.Waiters() == 1 })
					break
				}
				if i+1 < len(writeBackRetries()) {
					eventually(t, ctx, "the next retry armed", func() bool { return clk.Waiters() == 2 })
				}
			}
			// Whatever happened, the burst is over: only the period runs the
			// loop again, and no further patch is sent.
			eventually(t, ctx, "the burst to end", func() bool { return clk.Waiters() == 1 })
			passes := lister.Calls()
			clk.Step(writeBackResync - clk.Now().Sub(t0)%writeBackResync - time.Millisecond) // just before the next tick
			time.Sleep(50 * time.Millisecond)                                                // room for a pass that must not run
			if got := lister.Calls(); got != passes {
				t.Errorf("%d passes ran between the burst and the next period", got-passes)
			}
			if diff := cmp.Diff(tt.want, c.annotations(t)); diff != "" {
				t.Errorf("annotations (-want +got):\n%s", diff)
			}
			wantPatches := 0
			if tt.retries > 0 {
				wantPatches = 1
				if tt.patchFails {
					wantPatches = 2
				}
			}
			if got := len(c.patches()); got != wantPatches {
				t.Errorf("%d patches sent, want %d", got, wantPatches)
			}
		})
	}
}

// TestWriteBackDoesNotRepeatWhileTheInformerLags checks the write-back
// sends an annotation once even when the next pass (a retry 50 ms later)
// still sees the pod without it in the informer's cache, and sends it again
// once the cache shows the pod changed without it.
func TestWriteBackDoesNotRepeatWhileTheInformerLags(t *testing.T) {
	ctx := testContext(t)
	lister := &fakeLister{resp: listingOf(api.ReservationNamespace, api.ReservationNamePrefix+"r", api.ResourceGPU, gpuA)}
	pr, err := NewPodResources(serveLister(t, lister), 100*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pr.Close() })
	pod := makePod(api.ReservationNamespace, api.ReservationNamePrefix+"r").whole("main", 1).obj()
	pod.ResourceVersion = "1"
	c := newFakeClient(pod)
	h := NewHint(c, node, pr)
	// No informer runs: its cache is what the test puts there, so it lags
	// behind every patch.
	if err := h.pods.informer.GetIndexer().Add(pod.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name string
		// cached, when set, replaces the pod in the informer's cache first.
		cached      func(p *corev1.Pod)
		wantPatches int
	}{
		{name: "first pass patches", wantPatches: 1},
		{name: "the cache lags: no second patch", wantPatches: 1},
		{name: "the cache shows the annotation: nothing to do", cached: func(p *corev1.Pod) {
			p.ResourceVersion = "2"
			p.Annotations = map[string]string{api.AnnotationReservedGPU: gpuA}
		}, wantPatches: 1},
		{name: "someone removed it: written again", cached: func(p *corev1.Pod) {
			p.ResourceVersion = "3"
			p.Annotations = nil
		}, wantPatches: 2},
		{name: "and not twice", wantPatches: 2},
	}
	for _, st := range steps {
		if st.cached != nil {
			p := pod.DeepCopy()
			st.cached(p)
			if err := h.pods.informer.GetIndexer().Update(p); err != nil {
				t.Fatal(err)
			}
		}
		pending, err := h.writeBack(ctx)
		if err != nil {
			t.Fatalf("%s: writeBack: %v", st.name, err)
		}
		if pending {
			t.Errorf("%s: pending with everything listed and known", st.name)
		}
		if got := len(c.patches()); got != st.wantPatches {
			t.Errorf("%s: %d patches sent, want %d", st.name, got, st.wantPatches)
		}
	}
	got, err := c.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Annotations[api.AnnotationReservedGPU] != gpuA {
		t.Errorf("reserved-gpu = %q, want %s", got.Annotations[api.AnnotationReservedGPU], gpuA)
	}
}
