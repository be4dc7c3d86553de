package pods

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	k8sresource "k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/deviceplugin/plugin"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
	"github.com/gpufrac/gpufrac/tests/kubeletsim"
	"github.com/gpufrac/gpufrac/tests/kubeletsim/kubeletsimtest"
)

func wholeUUID(i int) string { return fmt.Sprintf("GPU-%08d-1111-1111-1111-111111111111", i) }

// unitDevices are the fraction devices of the given GPUs.
func unitDevices(gpus ...string) []*v1beta1.Device {
	var out []*v1beta1.Device
	for _, g := range gpus {
		for k := 0; k < api.UnitsPerGPU; k++ {
			out = append(out, &v1beta1.Device{ID: resource.UnitID(g, k), Health: v1beta1.Healthy})
		}
	}
	return out
}

// simNode is a kubelet simulator with its PodResources client.
type simNode struct {
	dir     string
	kubelet *kubeletsim.Kubelet
	podRes  *PodResources
}

func startSimNode(t testing.TB, ctx context.Context) *simNode {
	t.Helper()
	dir := shortDir(t)
	sock := filepath.Join(dir, "pr.sock")
	k := kubeletsim.New(kubeletsim.Options{NodeName: node, Dir: dir, PodResourcesSocket: sock, Strict: true})
	if err := k.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Stop)
	pr, err := NewPodResources(sock, 100*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pr.Close() })
	return &simNode{dir: dir, kubelet: k, podRes: pr}
}

// fakePlugin registers a kubeletsimtest plugin for res and waits for its devices.
func (n *simNode) fakePlugin(t testing.TB, ctx context.Context, res string, devs []*v1beta1.Device, preferred bool) {
	t.Helper()
	p := kubeletsimtest.New(kubeletsimtest.Options{
		Dir: n.dir, Endpoint: plugin.EndpointName(res), Resource: res, Devices: devs, PreferredAllocation: preferred,
	})
	if err := p.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	n.waitAllocatable(t, ctx, res, len(devs))
}

func (n *simNode) waitAllocatable(t testing.TB, ctx context.Context, res string, want int) {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := n.kubelet.WaitForResource(wctx, res, func(s kubeletsim.ResourceState) bool { return s.Allocatable == want }); err != nil {
		t.Fatal(err)
	}
}

func (n *simNode) allocate(t testing.TB, ctx context.Context, p *corev1.Pod, res string, count int) []string {
	t.Helper()
	a, err := n.kubelet.Allocate(ctx, kubeletsim.PodRef{Namespace: p.Namespace, Name: p.Name, UID: p.UID}, "main", res, count)
	if err != nil {
		t.Fatal(err)
	}
	return a.DeviceIDs
}

// reserve holds each of the GPUs whole with a reservation pod, as the
// coordinator does before it binds fractions there: the hint is honoured
// only on such GPUs. The GPUs are served whole by a fake plugin that hands
// them out in ID order, so pass them sorted.
func (n *simNode) reserve(t testing.TB, ctx context.Context, gpus ...string) {
	t.Helper()
	var devs []*v1beta1.Device
	for _, g := range gpus {
		devs = append(devs, &v1beta1.Device{ID: g, Health: v1beta1.Healthy})
	}
	n.fakePlugin(t, ctx, api.ResourceGPU, devs, false)
	for i, g := range gpus {
		r := makePod(api.ReservationNamespace, fmt.Sprintf("%s%d", api.ReservationNamePrefix, i)).whole("hold", 1).obj()
		if got := n.allocate(t, ctx, r, api.ResourceGPU, 1); len(got) != 1 || got[0] != g {
			t.Fatalf("reservation %s got %v, want %s", r.Name, got, g)
		}
	}
}

// whole adds a container asking for n whole GPUs.
func (b *podBuilder) whole(container string, n int) *podBuilder {
	q := *k8sresource.NewQuantity(int64(n), k8sresource.DecimalSI)
	b.p.Spec.Containers = append(b.p.Spec.Containers, corev1.Container{Name: container,
		Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{api.ResourceGPU: q}}})
	return b
}

func TestWriteBack(t *testing.T) {
	ctx := testContext(t)
	n := startSimNode(t, ctx)
	// The fake plugin prefers the highest IDs: fractions land on gpuB.
	n.fakePlugin(t, ctx, api.ResourceFraction, unitDevices(gpuA, gpuB), true)
	var whole []*v1beta1.Device
	for i := range 6 {
		whole = append(whole, &v1beta1.Device{ID: wholeUUID(i), Health: v1beta1.Healthy})
	}
	// No preference: the simulator hands out whole GPUs in ID order.
	n.fakePlugin(t, ctx, api.ResourceGPU, whole, false)

	frac := makePod("default", "frac").fraction("main", 30).gpu(gpuA).obj()
	done := makePod("default", "frac-done").fraction("main", 20).gpu(gpuB).annotate(api.AnnotationAllocatedGPU, gpuB).obj()
	trainer := makePod("default", "trainer").whole("main", 1).obj()
	reservation := makePod(api.ReservationNamespace, api.ReservationNamePrefix+"one").whole("main", 1).obj()
	imposter := makePod("default", api.ReservationNamePrefix+"imposter").whole("main", 1).obj()
	two := makePod(api.ReservationNamespace, api.ReservationNamePrefix+"two").whole("main", 2).obj()
	ghost := makePod("default", "ghost").fraction("main", 10).obj() // known to the kubelet only
	c := newFakeClient(frac, done, trainer, reservation, imposter, two)
	h := NewHint(c, node, n.podRes)
	startInformer(t, ctx, h, c)

	for _, a := range []struct {
		pod   *corev1.Pod
		res   string
		count int
	}{
		{trainer, api.ResourceGPU, 1},
		{reservation, api.ResourceGPU, 1},
		{imposter, api.ResourceGPU, 1},
		{two, api.ResourceGPU, 2},
		{frac, api.ResourceFraction, 30},
		{done, api.ResourceFraction, 20},
		{ghost, api.ResourceFraction, 10},
	} {
		n.allocate(t, ctx, a.pod, a.res, a.count)
	}

	if _, err := h.writeBack(ctx); err != nil {
		t.Fatalf("writeBack: %v", err)
	}
	want := map[string]map[string]string{
		"default/frac":      {api.AnnotationGPU: gpuA, api.AnnotationAllocatedGPU: gpuB}, // the GPU actually held
		"default/frac-done": {api.AnnotationGPU: gpuB, api.AnnotationAllocatedGPU: gpuB},
		// Whole-GPU pods, a reservation's name outside gpufrac-reservations included.
		"default/trainer": {api.AnnotationAllocatedGPU: wholeUUID(0)},
		"default/" + api.ReservationNamePrefix + "imposter":                {api.AnnotationAllocatedGPU: wholeUUID(2)},
		api.ReservationNamespace + "/" + api.ReservationNamePrefix + "one": {api.AnnotationReservedGPU: wholeUUID(1)},
	}
	if diff := cmp.Diff(want, c.annotations(t)); diff != "" {
		t.Errorf("annotations after write-back (-want +got):\n%s", diff)
	}
	wantPatches := []string{"default/frac", "default/" + api.ReservationNamePrefix + "imposter", "default/trainer",
		api.ReservationNamespace + "/" + api.ReservationNamePrefix + "one"}
	got := c.patches()
	slices.Sort(got)
	if diff := cmp.Diff(wantPatches, got); diff != "" {
		t.Errorf("patches (-want +got):\n%s", diff)
	}

	// Once the cache shows the annotations, another pass patches nothing.
	eventually(t, ctx, "the annotations in the informer cache", func() bool {
		p, err := h.pods.lister.Pods("default").Get("frac")
		r, err2 := h.pods.lister.Pods(api.ReservationNamespace).Get(api.ReservationNamePrefix + "one")
		w, err3 := h.pods.lister.Pods("default").Get("trainer")
		i, err4 := h.pods.lister.Pods("default").Get(api.ReservationNamePrefix + "imposter")
		return err == nil && err2 == nil && err3 == nil && err4 == nil &&
			p.Annotations[api.AnnotationAllocatedGPU] == gpuB && r.Annotations[api.AnnotationReservedGPU] == wholeUUID(1) &&
			w.Annotations[api.AnnotationAllocatedGPU] == wholeUUID(0) && i.Annotations[api.AnnotationAllocatedGPU] == wholeUUID(2)
	})
	if _, err := h.writeBack(ctx); err != nil {
		t.Fatalf("second writeBack: %v", err)
	}
	if got := len(c.patches()); got != len(wantPatches) {
		t.Errorf("second pass sent %d more patches", got-len(wantPatches))
	}
}

// TestRunWritesBackWhenAllocated checks the loop runs as soon as Allocated
// kicks it, not only on its period.
func TestRunWritesBackWhenAllocated(t *testing.T) {
	ctx := testContext(t)
	n := startSimNode(t, ctx)
	n.fakePlugin(t, ctx, api.ResourceFraction, unitDevices(gpuA, gpuB), true)
	p := makePod("default", "p").fraction("main", 40).gpu(gpuB).obj()
	c := newFakeClient(p)
	h := NewHint(c, node, n.podRes)
	h.resync = time.Hour // only a kick can run the loop again
	runHint(t, ctx, h)
	eventually(t, ctx, "the informer to sync", h.HasSynced)

	ids := n.allocate(t, ctx, p, api.ResourceFraction, 40)
	gpu, err := resource.GPUOfUnits(ids)
	if err != nil {
		t.Fatal(err)
	}
	h.Allocated(ctx, gpu, 40)
	eventually(t, ctx, "allocated-gpu on the pod", func() bool {
		return c.annotations(t)["default/p"][api.AnnotationAllocatedGPU] == gpu
	})
}

// TestAdmissionOrderDoesNotMatter runs the fraction resource with the hint
// behind a real device-plugin endpoint: whatever order the kubelet admits
// two same-size pods in, each GPU the coordinator chose gets one fraction,
// and the write-back records what each pod really holds.
func TestAdmissionOrderDoesNotMatter(t *testing.T) {
	gpus := []nvidia.GPU{
		{Index: 0, UUID: gpuA, MemoryBytes: 80 << 30},
		{Index: 1, UUID: gpuB, MemoryBytes: 80 << 30},
	}
	tests := []struct {
		name  string
		order []string // pod names in admission order
		// settle waits for the first pod's write-back before admitting the next.
		settle bool
	}{
		{name: "oldest first", order: []string{"old", "young"}},
		{name: "youngest first, back to back", order: []string{"young", "old"}},
		{name: "youngest first, written back in between", order: []string{"young", "old"}, settle: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testContext(t)
			n := startSimNode(t, ctx)
			n.reserve(t, ctx, gpuA, gpuB)
			pods := map[string]*corev1.Pod{
				"old":   makePod("default", "old").fraction("main", 30).gpu(gpuA).age(time.Hour).obj(),
				"young": makePod("default", "young").fraction("main", 30).gpu(gpuB).obj(),
			}
			c := newFakeClient(pods["old"], pods["young"])
			h := NewHint(c, node, n.podRes)
			runHint(t, ctx, h)
			eventually(t, ctx, "the informer to sync", h.HasSynced)

			frac := resource.NewFraction(resource.FractionOptions{GPUs: gpus, Usage: n.podRes, Hint: h})
			srv := plugin.NewServer(n.dir, frac, nil)
			if err := srv.Start(ctx); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(srv.Stop)
			if err := srv.Register(ctx); err != nil {
				t.Fatal(err)
			}
			n.waitAllocatable(t, ctx, api.ResourceFraction, 200)

			got := map[string]string{} // pod -> GPU held
			for i, name := range tt.order {
				ids := n.allocate(t, ctx, pods[name], api.ResourceFraction, 30)
				gpu, err := resource.GPUOfUnits(ids)
				if err != nil {
					t.Fatal(err)
				}
				got[name] = gpu
				if tt.settle && i == 0 {
					eventually(t, ctx, "the first pod's write-back in the cache", func() bool {
						p, err := h.pods.lister.Pods("default").Get(name)
						return err == nil && p.Annotations[api.AnnotationAllocatedGPU] != ""
					})
				}
			}
			held := []string{got["old"], got["young"]}
			slices.Sort(held)
			if diff := cmp.Diff([]string{gpuA, gpuB}, held); diff != "" {
				t.Errorf("GPUs held by the two pods (-want +got):\n%s", diff)
			}
			eventually(t, ctx, "both pods written back", func() bool {
				anns := c.annotations(t)
				return anns["default/old"][api.AnnotationAllocatedGPU] == got["old"] &&
					anns["default/young"][api.AnnotationAllocatedGPU] == got["young"]
			})
		})
	}
}
