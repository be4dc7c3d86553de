package pods

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	k8sresource "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	testclock "k8s.io/utils/clock/testing"

	"github.com/gpufrac/gpufrac/api"
)

const (
	gpuA = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
	gpuB = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
	gpuC = "GPU-cccccccc-0000-0000-0000-000000000000"
)

// call is one Allocated call made before the query.
type call struct {
	gpu   string
	units int
}

type hintAnswer struct {
	GPU string
	OK  bool
}

func TestGPUFor(t *testing.T) {
	tests := []struct {
		name      string
		pods      []*corev1.Pod
		allocated []call
		units     int
		want      hintAnswer
	}{
		{
			name: "the oldest pending pod of the size gives its GPU",
			pods: []*corev1.Pod{
				makePod("default", "young").fraction("main", 30).gpu(gpuA).age(time.Minute).obj(),
				makePod("default", "old").fraction("main", 30).gpu(gpuB).age(time.Hour).obj(),
			},
			units: 30,
			want:  hintAnswer{gpuB, true},
		},
		{
			name: "equal ages are ordered by namespace and name",
			pods: []*corev1.Pod{
				makePod("team-b", "a").fraction("main", 30).gpu(gpuA).obj(),
				makePod("team-a", "z").fraction("main", 30).gpu(gpuB).obj(),
			},
			units: 30,
			want:  hintAnswer{gpuB, true},
		},
		{
			name:  "a pod of another size does not match",
			pods:  []*corev1.Pod{makePod("default", "p").fraction("main", 50).gpu(gpuA).obj()},
			units: 30,
			want:  hintAnswer{},
		},
		{
			name:  "a pod without the coordinator's choice does not match",
			pods:  []*corev1.Pod{makePod("default", "p").fraction("main", 30).obj()},
			units: 30,
			want:  hintAnswer{},
		},
		{
			name: "pods bound to another node are not seen",
			pods: []*corev1.Pod{
				makePod("default", "elsewhere").fraction("main", 30).gpu(gpuA).on("node-b").age(time.Hour).obj(),
				makePod("default", "here").fraction("main", 30).gpu(gpuB).obj(),
			},
			units: 30,
			want:  hintAnswer{gpuB, true},
		},
		{
			name: "a pod carrying allocated-gpu is skipped",
			pods: []*corev1.Pod{
				makePod("default", "old").fraction("main", 30).gpu(gpuA).annotate(api.AnnotationAllocatedGPU, gpuA).age(time.Hour).obj(),
				makePod("default", "young").fraction("main", 30).gpu(gpuB).obj(),
			},
			units: 30,
			want:  hintAnswer{gpuB, true},
		},
		{
			name: "a running pod is skipped",
			pods: []*corev1.Pod{
				makePod("default", "old").fraction("main", 30).gpu(gpuA).phase(corev1.PodRunning).age(time.Hour).obj(),
				makePod("default", "young").fraction("main", 30).gpu(gpuB).obj(),
			},
			units: 30,
			want:  hintAnswer{gpuB, true},
		},
		{
			name: "a finished pod is neither waiting nor planned",
			pods: []*corev1.Pod{
				makePod("default", "done").fraction("main", 30).gpu(gpuA).phase(corev1.PodSucceeded).age(time.Hour).obj(),
				makePod("default", "failed").fraction("main", 30).gpu(gpuA).phase(corev1.PodFailed).age(time.Hour).obj(),
			},
			units: 30,
			want:  hintAnswer{},
		},
		{
			name: "any container of the pod may ask",
			pods: []*corev1.Pod{
				makePod("default", "p").plain("sidecar").fraction("main", 30).gpu(gpuA).obj(),
			},
			units: 30,
			want:  hintAnswer{gpuA, true},
		},
		{
			name: "a request without a limit counts",
			pods: []*corev1.Pod{func() *corev1.Pod {
				p := makePod("default", "p").plain("main").gpu(gpuC).obj()
				p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{api.ResourceFraction: *k8sresource.NewQuantity(25, k8sresource.DecimalSI)}
				return p
			}()},
			units: 25,
			want:  hintAnswer{gpuC, true},
		},
		{
			name: "a fraction recorded by Allocated serves the pod planned there",
			pods: []*corev1.Pod{
				makePod("default", "old").fraction("main", 30).gpu(gpuA).age(time.Hour).obj(),
				makePod("default", "young").fraction("main", 30).gpu(gpuB).obj(),
			},
			allocated: []call{{gpuA, 30}},
			units:     30,
			want:      hintAnswer{gpuB, true},
		},
		{
			name: "same-size pods are interchangeable: the young pod's GPU served first leaves the old pod's",
			pods: []*corev1.Pod{
				makePod("default", "old").fraction("main", 30).gpu(gpuA).age(time.Hour).obj(),
				makePod("default", "young").fraction("main", 30).gpu(gpuB).obj(),
			},
			allocated: []call{{gpuB, 30}},
			units:     30,
			want:      hintAnswer{gpuA, true},
		},
		{
			name: "every placed pod served: no hint",
			pods: []*corev1.Pod{
				makePod("default", "old").fraction("main", 30).gpu(gpuA).age(time.Hour).obj(),
				makePod("default", "young").fraction("main", 30).gpu(gpuB).obj(),
			},
			allocated: []call{{gpuB, 30}, {gpuA, 30}},
			units:     30,
			want:      hintAnswer{},
		},
		{
			name: "an allocation of another size serves nobody of this size",
			pods: []*corev1.Pod{
				makePod("default", "p").fraction("main", 30).gpu(gpuA).obj(),
			},
			allocated: []call{{gpuA, 50}},
			units:     30,
			want:      hintAnswer{gpuA, true},
		},
		{
			name: "a pod whose fraction went to another GPU frees its planned GPU for the next pod",
			pods: []*corev1.Pod{
				makePod("default", "old").fraction("main", 30).gpu(gpuA).annotate(api.AnnotationAllocatedGPU, gpuB).age(time.Hour).obj(),
				makePod("default", "young").fraction("main", 30).gpu(gpuB).obj(),
			},
			units: 30,
			want:  hintAnswer{gpuA, true},
		},
		{
			name: "two same-size containers of one pod are two fractions",
			pods: []*corev1.Pod{
				makePod("default", "p").fraction("a", 30).fraction("b", 30).gpu(gpuA).obj(),
			},
			allocated: []call{{gpuA, 30}},
			units:     30,
			want:      hintAnswer{gpuA, true},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testContext(t)
			objs := make([]runtime.Object, len(tt.pods))
			for i, p := range tt.pods {
				objs[i] = p
			}
			c := newFakeClient(objs...)
			h := NewHint(c, node, nil)
			h.lagWait = 0 // answers as of the informer's view; TestGPUForWaitsForTheInformer covers the wait
			startInformer(t, ctx, h, c)
			for _, a := range tt.allocated {
				h.Allocated(ctx, a.gpu, a.units)
			}
			var got hintAnswer
			got.GPU, got.OK = h.GPUFor(tt.units)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("GPUFor(%d) (-want +got):\n%s", tt.units, diff)
			}
		})
	}
}

// TestHintWatchesOnlyItsNode checks the informer asks the API server for
// the pods of this node only.
func TestHintWatchesOnlyItsNode(t *testing.T) {
	ctx := testContext(t)
	c := newFakeClient()
	h := NewHint(c, node, nil)
	h.lagWait = 0 // answers as of the informer's view; TestGPUForWaitsForTheInformer covers the wait
	startInformer(t, ctx, h, c)
	c.mu.Lock()
	got := append([]string(nil), c.selectors...)
	c.mu.Unlock()
	want := []string{"spec.nodeName=" + node, "spec.nodeName=" + node} // list, then watch
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("field selectors (-want +got):\n%s", diff)
	}
}

// TestGPUForFollowsPodChanges walks one pod through its life: placed,
// allocated (in flight), admitted (running), gone.
func TestGPUForFollowsPodChanges(t *testing.T) {
	ctx := testContext(t)
	c := newFakeClient()
	h := NewHint(c, node, nil)
	h.lagWait = 0 // answers as of the informer's view; TestGPUForWaitsForTheInformer covers the wait
	startInformer(t, ctx, h, c)
	query := func() hintAnswer {
		var a hintAnswer
		a.GPU, a.OK = h.GPUFor(30)
		return a
	}
	if got := query(); got != (hintAnswer{}) {
		t.Fatalf("GPUFor on an empty node = %+v", got)
	}

	p := makePod("default", "p").fraction("main", 30).gpu(gpuA).obj()
	if _, err := c.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "the new pod's hint", func() bool { return query() == hintAnswer{gpuA, true} })

	h.Allocated(ctx, gpuA, 30)
	if got := query(); got != (hintAnswer{}) {
		t.Fatalf("GPUFor after Allocated = %+v, want no hint", got)
	}

	// The pod runs: the phase accounts for the in-flight answer, which
	// then no longer counts, so a second pod on the same GPU gets its hint.
	p.Status.Phase = corev1.PodRunning
	if _, err := c.CoreV1().Pods("default").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "the running pod in the cache", func() bool {
		got, err := h.pods.lister.Pods("default").Get("p")
		return err == nil && got.Status.Phase == corev1.PodRunning
	})
	p2 := makePod("default", "p2").fraction("main", 30).gpu(gpuA).obj()
	if _, err := c.CoreV1().Pods("default").Create(ctx, p2, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "the second pod's hint", func() bool { return query() == hintAnswer{gpuA, true} })
	if inflight := h.answersInFlight(); inflight != 0 {
		t.Errorf("%d answers still in flight after the pod started", inflight)
	}
}

// TestInflightExpires checks an Allocate answer the kubelet never reports
// stops counting after inflightTTL.
func TestInflightExpires(t *testing.T) {
	ctx := testContext(t)
	c := newFakeClient(makePod("default", "p").fraction("main", 30).gpu(gpuA).obj())
	clk := testclock.NewFakeClock(t0)
	h := NewHint(c, node, nil, WithClock(clk))
	h.lagWait = 0 // answers as of the informer's view; TestGPUForWaitsForTheInformer covers the wait
	startInformer(t, ctx, h, c)
	h.Allocated(ctx, gpuA, 30)
	if _, ok := h.GPUFor(30); ok {
		t.Fatal("hint given while the answer is in flight")
	}
	clk.SetTime(t0.Add(inflightTTL - time.Second))
	if _, ok := h.GPUFor(30); ok {
		t.Fatal("hint given before the in-flight answer expired")
	}
	clk.SetTime(t0.Add(inflightTTL))
	if gpu, ok := h.GPUFor(30); !ok || gpu != gpuA {
		t.Fatalf("GPUFor after expiry = %q, %t; want %q, true", gpu, ok, gpuA)
	}
}

// TestGPUForWaitsForTheInformer: the kubelet may admit a fraction before this
// agent's informer shows the pod. GPUFor then waits for the informer instead of
// answering "no hint" (which would put the fraction by best fit); it does not
// wait when a pod of the size is known but not the coordinator's. The wait
// runs on the hint's clock: the test steps a fake clock and never sleeps.
func TestGPUForWaitsForTheInformer(t *testing.T) {
	const lagWait = 300 * time.Millisecond
	tests := []struct {
		name  string
		known []*corev1.Pod // in the informer from the start
		late  *corev1.Pod   // created while GPUFor waits
		want  hintAnswer
		// waited is the fake time GPUFor took.
		waited time.Duration
	}{
		{
			name:   "the planned pod shows up late: its GPU, one poll after it shows",
			late:   makePod("default", "late").fraction("main", 30).gpu(gpuB).obj(),
			want:   hintAnswer{gpuB, true},
			waited: informerLagPoll,
		},
		{
			name:   "nothing shows up: no hint after the wait",
			want:   hintAnswer{},
			waited: lagWait,
		},
		{
			name:  "a pod of the size without a plan is known: no hint at once",
			known: []*corev1.Pod{makePod("default", "other-scheduler").fraction("main", 30).scheduler("default-scheduler").obj()},
			want:  hintAnswer{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testContext(t)
			var objs []runtime.Object
			for _, p := range tt.known {
				objs = append(objs, p)
			}
			c := newFakeClient(objs...)
			clk := testclock.NewFakeClock(t0)
			h := NewHint(c, node, nil, WithClock(clk))
			h.lagWait = lagWait
			startInformer(t, ctx, h, c)
			done := make(chan hintAnswer, 1)
			go func() {
				var a hintAnswer
				a.GPU, a.OK = h.GPUFor(30)
				done <- a
			}()
			if tt.late != nil {
				eventually(t, ctx, "GPUFor to wait on the clock", clk.HasWaiters)
				if _, err := c.CoreV1().Pods(tt.late.Namespace).Create(ctx, tt.late, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
				eventually(t, ctx, "the late pod in the informer", func() bool {
					_, err := h.pods.lister.Pods(tt.late.Namespace).Get(tt.late.Name)
					return err == nil
				})
			}
			// Step the fake clock one poll at a time while GPUFor waits.
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case got := <-done:
					if got != tt.want {
						t.Errorf("GPUFor(30) = %+v, want %+v", got, tt.want)
					}
					if waited := clk.Since(t0); waited != tt.waited {
						t.Errorf("GPUFor(30) took %s on the clock, want %s", waited, tt.waited)
					}
					return
				case <-tick.C:
					if clk.HasWaiters() {
						clk.Step(informerLagPoll)
					}
				case <-ctx.Done():
					t.Fatalf("GPUFor(30) did not return: %v", ctx.Err())
				}
			}
		})
	}
}
