package pods

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/tests/kubeletsim"
)

// TestWriteBackWholeGPUs checks that pods holding whole nvidia.com/gpu
// devices get gpufrac.io/allocated-gpu with every device they hold (so
// kubectl-gpufrac can show who holds each GPU), while fraction pods keep
// their one GPU and reservations get only gpufrac.io/reserved-gpu.
func TestWriteBackWholeGPUs(t *testing.T) {
	type alloc struct {
		pod       string // namespace/name
		container string
		res       string
		count     int
	}
	// The simulator hands out whole GPUs in ID order (no preference) and
	// fraction units from gpuB (the fake plugin prefers the highest IDs).
	tests := []struct {
		name        string
		pods        []*corev1.Pod
		allocs      []alloc
		want        map[string]map[string]string // pod -> gpufrac annotations after write-back
		wantPatched []string
	}{
		{
			name:        "one whole GPU",
			pods:        []*corev1.Pod{makePod("default", "notebook").whole("main", 1).obj()},
			allocs:      []alloc{{"default/notebook", "main", api.ResourceGPU, 1}},
			want:        map[string]map[string]string{"default/notebook": {api.AnnotationAllocatedGPU: wholeUUID(0)}},
			wantPatched: []string{"default/notebook"},
		},
		{
			name: "every container's GPUs, sorted",
			pods: []*corev1.Pod{makePod("default", "trainer").whole("b", 1).whole("a", 2).obj()},
			// Container b gets GPU 0, container a GPUs 1 and 2.
			allocs: []alloc{{"default/trainer", "b", api.ResourceGPU, 1}, {"default/trainer", "a", api.ResourceGPU, 2}},
			want: map[string]map[string]string{"default/trainer": {
				api.AnnotationAllocatedGPU: strings.Join([]string{wholeUUID(0), wholeUUID(1), wholeUUID(2)}, ","),
			}},
			wantPatched: []string{"default/trainer"},
		},
		{
			name:        "a pod with a fraction keeps its fraction's GPU",
			pods:        []*corev1.Pod{makePod("default", "mixed").whole("main", 1).fraction("side", 20).obj()},
			allocs:      []alloc{{"default/mixed", "main", api.ResourceGPU, 1}, {"default/mixed", "side", api.ResourceFraction, 20}},
			want:        map[string]map[string]string{"default/mixed": {api.AnnotationAllocatedGPU: gpuB}},
			wantPatched: []string{"default/mixed"},
		},
		{
			name:   "a reservation gets reserved-gpu, not allocated-gpu",
			pods:   []*corev1.Pod{makePod(api.ReservationNamespace, api.ReservationNamePrefix+"n-0").whole("hold", 1).obj()},
			allocs: []alloc{{api.ReservationNamespace + "/" + api.ReservationNamePrefix + "n-0", "hold", api.ResourceGPU, 1}},
			want: map[string]map[string]string{
				api.ReservationNamespace + "/" + api.ReservationNamePrefix + "n-0": {api.AnnotationReservedGPU: wholeUUID(0)},
			},
			wantPatched: []string{api.ReservationNamespace + "/" + api.ReservationNamePrefix + "n-0"},
		},
		{
			name:        "already written: no patch",
			pods:        []*corev1.Pod{makePod("default", "done").whole("main", 2).annotate(api.AnnotationAllocatedGPU, wholeUUID(0)+","+wholeUUID(1)).obj()},
			allocs:      []alloc{{"default/done", "main", api.ResourceGPU, 2}},
			want:        map[string]map[string]string{"default/done": {api.AnnotationAllocatedGPU: wholeUUID(0) + "," + wholeUUID(1)}},
			wantPatched: nil,
		},
		{
			name:        "a stale list is corrected",
			pods:        []*corev1.Pod{makePod("default", "stale").whole("main", 1).annotate(api.AnnotationAllocatedGPU, wholeUUID(5)).obj()},
			allocs:      []alloc{{"default/stale", "main", api.ResourceGPU, 1}},
			want:        map[string]map[string]string{"default/stale": {api.AnnotationAllocatedGPU: wholeUUID(0)}},
			wantPatched: []string{"default/stale"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testContext(t)
			n := startSimNode(t, ctx)
			n.fakePlugin(t, ctx, api.ResourceFraction, unitDevices(gpuA, gpuB), true)
			var whole []*v1beta1.Device
			for i := range 6 {
				whole = append(whole, &v1beta1.Device{ID: wholeUUID(i), Health: v1beta1.Healthy})
			}
			n.fakePlugin(t, ctx, api.ResourceGPU, whole, false)

			byName := map[string]*corev1.Pod{}
			var objs []runtime.Object
			for _, p := range tt.pods {
				byName[p.Namespace+"/"+p.Name] = p
				objs = append(objs, p)
			}
			c := newFakeClient(objs...)
			h := NewHint(c, node, n.podRes)
			startInformer(t, ctx, h, c)
			for _, a := range tt.allocs {
				p := byName[a.pod]
				ref := kubeletsim.PodRef{Namespace: p.Namespace, Name: p.Name, UID: p.UID}
				if _, err := n.kubelet.Allocate(ctx, ref, a.container, a.res, a.count); err != nil {
					t.Fatal(err)
				}
			}

			if _, err := h.writeBack(ctx); err != nil {
				t.Fatalf("writeBack: %v", err)
			}
			got := c.annotations(t)
			for _, anns := range got {
				delete(anns, api.AnnotationGPU) // the coordinator's, not written back
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("annotations after write-back (-want +got):\n%s", diff)
			}
			patched := c.patches()
			slices.Sort(patched)
			if diff := cmp.Diff(tt.wantPatched, patched); diff != "" {
				t.Errorf("patched pods (-want +got):\n%s", diff)
			}
		})
	}
}
