package pods

import (
	"context"
	"fmt"
	"net"
	"sort"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/deviceplugin/plugin"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
)

// BenchmarkPreferredWithHint measures GetPreferredAllocation of 30 units on
// 8 GPUs / 800 units through the real gRPC endpoint with the agent's
// dependencies: the hint reads 110 pods bound to the node (the kubelet's pod
// limit; 40 already admitted and reported by PodResources from the kubelet
// simulator), and best fit reads PodResources. "cached" answers usage from
// the 100ms PodResources cache; "fresh" drops it before every call, as
// happens on the first call after an Allocate.
func BenchmarkPreferredWithHint(b *testing.B) {
	for _, fresh := range []bool{false, true} {
		name := "cached"
		if fresh {
			name = "fresh"
		}
		b.Run(name, func(b *testing.B) { benchPreferredWithHint(b, fresh) })
	}
}

func benchPreferredWithHint(b *testing.B, fresh bool) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	gpus := make([]nvidia.GPU, 8)
	var uuids []string
	for i := range gpus {
		gpus[i] = nvidia.GPU{Index: i, Minor: i, UUID: fmt.Sprintf("GPU-%08d-2222-2222-2222-222222222222", i), MemoryBytes: 80 << 30}
		uuids = append(uuids, gpus[i].UUID)
	}
	n := startSimNode(b, ctx)
	n.fakePlugin(b, ctx, api.ResourceFraction, unitDevices(uuids...), false)
	n.reserve(b, ctx, uuids[4:]...) // the coordinator's choices are reserved GPUs

	// 110 pods of 10 units: 40 admitted (the simulator hands out units in
	// ID order, so they fill GPUs 0-3), 70 pending with the coordinator's
	// choice spread over GPUs 4-7.
	var objs []runtime.Object
	var all []*corev1.Pod
	for i := range 110 {
		p := makePod("team", fmt.Sprintf("p%03d", i)).fraction("main", 10).gpu(uuids[4+i%4]).age(time.Duration(110-i) * time.Minute).obj()
		objs = append(objs, p)
		all = append(all, p)
	}
	c := newFakeClient(objs...)
	h := NewHint(c, node, n.podRes)
	infCtx, stopInformer := context.WithCancel(ctx)
	infDone := make(chan struct{})
	go func() { defer close(infDone); h.pods.informer.RunWithContext(infCtx) }()
	defer func() { stopInformer(); <-infDone }()
	if !cache.WaitForCacheSync(ctx.Done(), h.HasSynced) {
		b.Fatal("informer did not sync")
	}
	for _, p := range all[:40] {
		n.allocate(b, ctx, p, api.ResourceFraction, 10)
	}
	if _, err := h.writeBack(ctx); err != nil {
		b.Fatal(err)
	}

	frac := resource.NewFraction(resource.FractionOptions{GPUs: gpus, Usage: n.podRes, Hint: h})
	dir := shortDir(b)
	srv := plugin.NewServer(dir, frac, nil)
	if err := srv.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer srv.Stop()
	conn, err := grpc.NewClient("unix://"+srv.SocketPath(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", srv.SocketPath())
		}))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	client := pluginapi.NewDevicePluginClient(conn)
	var available []string
	for _, g := range uuids {
		for k := range api.UnitsPerGPU {
			available = append(available, resource.UnitID(g, k))
		}
	}
	req := &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
		AvailableDeviceIDs: available, AllocationSize: 10,
	}}}
	// The oldest pending pod (p040) was placed on GPU 4.
	want := uuids[4]
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		if fresh {
			n.podRes.Invalidate()
		}
		t0 := time.Now()
		resp, err := client.GetPreferredAllocation(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
		if got, err := resource.GPUOfUnits(resp.ContainerResponses[0].DeviceIDs); err != nil || got != want {
			b.Fatalf("preferred units on %s (%v), want %s", got, err, want)
		}
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
}
