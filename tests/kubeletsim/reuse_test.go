package kubeletsim_test

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpufrac/gpufrac/tests/kubeletsim"
)

// TestInitContainerDeviceReuse: the kubelet's device manager hands a
// regular init container's devices on to the pod's later containers
// (devicesToReuse), and PodResources lists no regular init container. Found
// by the simulator's check against the real kubelet (issue 26): a pod whose
// init container and app container each ask one GPU runs on a node with one
// free GPU, which the simulator refused.
func TestInitContainerDeviceReuse(t *testing.T) {
	// step admits one container of a pod on a node with two devices.
	type step struct {
		pod, container string
		init           bool // AllocateInit, else Allocate
		n              int
		wantErr        error
	}
	tests := []struct {
		name  string
		steps []step
		// wantHeld is how many devices the pods hold in the end.
		wantHeld int
		// wantListed: pod -> container -> device count PodResources lists.
		wantListed map[string]map[string]int
	}{
		{
			name:       "the app container reuses its init container's device",
			steps:      []step{{pod: "a", container: "init", init: true, n: 1}, {pod: "a", container: "app", n: 1}},
			wantHeld:   1,
			wantListed: map[string]map[string]int{"a": {"app": 1}},
		},
		{
			name: "two app containers do not share the init container's device",
			steps: []step{
				{pod: "a", container: "init", init: true, n: 1},
				{pod: "a", container: "app-a", n: 1},
				{pod: "a", container: "app-b", n: 1},
			},
			wantHeld:   2,
			wantListed: map[string]map[string]int{"a": {"app-a": 1, "app-b": 1}},
		},
		{
			name: "init containers reuse each other's devices",
			steps: []step{
				{pod: "a", container: "init-a", init: true, n: 2},
				{pod: "a", container: "init-b", init: true, n: 1},
				{pod: "a", container: "app", n: 2},
			},
			wantHeld:   2,
			wantListed: map[string]map[string]int{"a": {"app": 2}},
		},
		{
			name:       "reused devices come first, free ones make up the rest",
			steps:      []step{{pod: "a", container: "init", init: true, n: 1}, {pod: "a", container: "app", n: 2}},
			wantHeld:   2,
			wantListed: map[string]map[string]int{"a": {"app": 2}},
		},
		{
			name: "a reused device is taken once",
			steps: []step{
				{pod: "a", container: "init", init: true, n: 1},
				{pod: "a", container: "app-a", n: 1},
				{pod: "a", container: "app-b", n: 1},
				{pod: "a", container: "app-c", n: 1, wantErr: kubeletsim.ErrInsufficientDevices},
			},
			wantHeld:   2,
			wantListed: map[string]map[string]int{"a": {"app-a": 1, "app-b": 1}},
		},
		{
			name:       "a sidecar (restartable init container) keeps its device",
			steps:      []step{{pod: "a", container: "sidecar", n: 1}, {pod: "a", container: "app", n: 1}},
			wantHeld:   2,
			wantListed: map[string]map[string]int{"a": {"app": 1, "sidecar": 1}},
		},
		{
			name: "another pod cannot reuse an init container's device",
			steps: []step{
				{pod: "a", container: "init", init: true, n: 1},
				{pod: "b", container: "app", n: 2, wantErr: kubeletsim.ErrInsufficientDevices},
			},
			wantHeld:   1,
			wantListed: map[string]map[string]int{"a": {}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testContext(t)
			k, opts := startKubelet(t, ctx, nil)
			startPlugin(t, ctx, opts.Dir, 2, nil)
			waitAllocatable(t, ctx, k, 2)
			for _, s := range tt.steps {
				admit := k.Allocate
				if s.init {
					admit = k.AllocateInit
				}
				a, err := admit(ctx, pod(s.pod), s.container, testResource, s.n)
				if !errors.Is(err, s.wantErr) {
					t.Fatalf("%s/%s: error %v, want %v", s.pod, s.container, err, s.wantErr)
				}
				if err == nil && len(a.DeviceIDs) != s.n {
					t.Fatalf("%s/%s got devices %v, want %d", s.pod, s.container, a.DeviceIDs, s.n)
				}
			}
			if got, _ := k.Resource(testResource); got.Allocated != tt.wantHeld {
				t.Errorf("%d devices held, want %d", got.Allocated, tt.wantHeld)
			}
			resp, err := podResourcesClient(t, opts.PodResourcesSocket).List(ctx, &podresourcesv1.ListPodResourcesRequest{})
			if err != nil {
				t.Fatal(err)
			}
			listed := map[string]map[string]int{}
			for _, p := range resp.GetPodResources() {
				listed[p.GetName()] = map[string]int{}
				for _, c := range p.GetContainers() {
					listed[p.GetName()][c.GetName()] = len(c.GetDevices())
				}
			}
			if diff := cmp.Diff(tt.wantListed, listed); diff != "" {
				t.Errorf("PodResources List (-want +got):\n%s", diff)
			}
		})
	}
}
