package kubeletsim_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	"k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpufrac/gpufrac/tests/kubeletsim"
	"github.com/gpufrac/gpufrac/tests/kubeletsim/kubeletsimtest"
)

// dev is a ContainerDevices entry for one device, with an optional NUMA node.
func dev(resource, id string, numa ...int64) *podresourcesv1.ContainerDevices {
	d := &podresourcesv1.ContainerDevices{ResourceName: resource, DeviceIds: []string{id}}
	if len(numa) > 0 {
		d.Topology = &podresourcesv1.TopologyInfo{}
		for _, n := range numa {
			d.Topology.Nodes = append(d.Topology.Nodes, &podresourcesv1.NUMANode{ID: n})
		}
	}
	return d
}

func TestPodResources(t *testing.T) {
	ctx := testContext(t)
	k, opts := startKubelet(t, ctx, nil)
	// dev-0 sits on NUMA node 0, dev-1 on both nodes, the rest report no topology.
	devices := kubeletsimtest.Devices("dev", 4)
	devices[0].Topology = &v1beta1.TopologyInfo{Nodes: []*v1beta1.NUMANode{{ID: 0}}}
	devices[1].Topology = &v1beta1.TopologyInfo{Nodes: []*v1beta1.NUMANode{{ID: 0}, {ID: 1}}}
	startPlugin(t, ctx, opts.Dir, 4, func(o *kubeletsimtest.Options) { o.Devices = devices })
	other := startPlugin(t, ctx, opts.Dir, 2, func(o *kubeletsimtest.Options) {
		o.Endpoint = "other.sock"
		o.Resource = "example.com/other"
		o.Devices = kubeletsimtest.Devices("o", 2)
	})
	waitAllocatable(t, ctx, k, 4)
	err := k.WaitForResource(waitContext(t, ctx), "example.com/other", func(s kubeletsim.ResourceState) bool { return s.Allocatable == 2 })
	if err != nil {
		t.Fatal(err)
	}

	// Pod b: one container with both resources; pod a: two containers.
	admit := []struct {
		pod       kubeletsim.PodRef
		container string
		resource  string
		n         int
	}{
		{pod("b"), "main", testResource, 2},
		{pod("b"), "main", "example.com/other", 1},
		{pod("a"), "sidecar", testResource, 1},
		{pod("a"), "main", testResource, 1},
	}
	for _, a := range admit {
		if _, err := k.Allocate(ctx, a.pod, a.container, a.resource, a.n); err != nil {
			t.Fatal(err)
		}
	}
	if err := other.SetHealth("o-1", v1beta1.Unhealthy); err != nil {
		t.Fatal(err)
	}
	err = k.WaitForResource(waitContext(t, ctx), "example.com/other", func(s kubeletsim.ResourceState) bool { return s.Allocatable == 1 })
	if err != nil {
		t.Fatal(err)
	}

	client := podResourcesClient(t, opts.PodResourcesSocket)
	podA := &podresourcesv1.PodResources{Name: "a", Namespace: "ns", Containers: []*podresourcesv1.ContainerResources{
		{Name: "main", Devices: []*podresourcesv1.ContainerDevices{dev(testResource, "dev-3")}},
		{Name: "sidecar", Devices: []*podresourcesv1.ContainerDevices{dev(testResource, "dev-2")}},
	}}
	podB := &podresourcesv1.PodResources{Name: "b", Namespace: "ns", Containers: []*podresourcesv1.ContainerResources{
		{Name: "main", Devices: []*podresourcesv1.ContainerDevices{
			// One entry per device and NUMA node, as the kubelet reports.
			dev(testResource, "dev-0", 0),
			dev(testResource, "dev-1", 0),
			dev(testResource, "dev-1", 1),
			dev("example.com/other", "o-0"),
		}},
	}}

	t.Run("List", func(t *testing.T) {
		got, err := client.List(waitContext(t, ctx), &podresourcesv1.ListPodResourcesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		want := &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{podA, podB}}
		if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
			t.Errorf("List() (-want +got):\n%s", diff)
		}
	})

	t.Run("Get", func(t *testing.T) {
		tests := []struct {
			name      string
			pod       string
			want      *podresourcesv1.GetPodResourcesResponse
			wantError string
		}{
			{name: "known pod", pod: "b", want: &podresourcesv1.GetPodResourcesResponse{PodResources: podB}},
			{name: "unknown pod", pod: "zz", wantError: "pod zz in namespace ns not found"},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				got, err := client.Get(waitContext(t, ctx), &podresourcesv1.GetPodResourcesRequest{PodName: tc.pod, PodNamespace: "ns"})
				if tc.wantError != "" {
					if err == nil || !strings.Contains(err.Error(), tc.wantError) {
						t.Fatalf("Get() error = %v, want one containing %q", err, tc.wantError)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(tc.want, got, protocmp.Transform()); diff != "" {
					t.Errorf("Get() (-want +got):\n%s", diff)
				}
			})
		}
	})

	t.Run("GetAllocatableResources", func(t *testing.T) {
		got, err := client.GetAllocatableResources(waitContext(t, ctx), &podresourcesv1.AllocatableResourcesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		// Healthy devices only, allocated or not; o-1 is unhealthy.
		want := &podresourcesv1.AllocatableResourcesResponse{Devices: []*podresourcesv1.ContainerDevices{
			dev(testResource, "dev-0", 0),
			dev(testResource, "dev-1", 0),
			dev(testResource, "dev-1", 1),
			dev(testResource, "dev-2"),
			dev(testResource, "dev-3"),
			dev("example.com/other", "o-0"),
		}}
		if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
			t.Errorf("GetAllocatableResources() (-want +got):\n%s", diff)
		}
	})

	t.Run("Release removes the pod", func(t *testing.T) {
		if got := k.Release(pod("b").UID); got != 2 {
			t.Fatalf("Release() = %d, want 2", got)
		}
		got, err := client.List(waitContext(t, ctx), &podresourcesv1.ListPodResourcesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		want := &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{podA}}
		if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
			t.Errorf("List() after Release (-want +got):\n%s", diff)
		}
	})
}
