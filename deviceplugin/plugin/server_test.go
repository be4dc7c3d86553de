package plugin

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
	"github.com/gpufrac/gpufrac/deviceplugin/resource/resourcetest"
)

func h100s(n int) []nvidia.GPU {
	out := make([]nvidia.GPU, n)
	for i := range out {
		out[i] = nvidia.GPU{Index: i, UUID: fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", i), Minor: i, MemoryBytes: 80 << 30}
	}
	return out
}

// dial starts srv on a socket in a temp dir and returns a client over it.
func dial(t testing.TB, res resource.Resource) (pluginapi.DevicePluginClient, *Server) {
	t.Helper()
	dir, err := filepathTemp(t)
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(dir, res, nil)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("unix://"+srv.SocketPath(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", srv.SocketPath())
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pluginapi.NewDevicePluginClient(conn), srv
}

// TestRegisterRetriesSoonWhileTheKubeletIsNotYetAccepting: kubelet.sock
// exists (bound, not yet listening: connections are refused) when Register
// starts, and accepts 100 ms later; Register must get through well within
// gRPC's default first retry of 1 s (the node agent's re-registration after a
// kubelet restart took just over 1 s so).
func TestRegisterRetriesSoonWhileTheKubeletIsNotYetAccepting(t *testing.T) {
	dir, err := filepathTemp(t)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, filepath.Base(pluginapi.KubeletSocket))
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: sock}); err != nil {
		t.Fatal(err)
	}
	srv := NewServer(dir, whole(1), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()

	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- srv.Register(ctx) }()
	time.Sleep(100 * time.Millisecond) // refused meanwhile
	_ = syscall.Close(fd)
	_ = os.Remove(sock)
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	reg := &flakyRegistration{}
	g := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(g, reg)
	go func() { _ = g.Serve(lis) }()
	defer g.Stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 600*time.Millisecond {
		t.Errorf("registration took %s once the kubelet accepted after 100 ms, want under 600 ms", took)
	}
	if calls, _ := reg.count(); calls != 1 {
		t.Errorf("registration calls = %d, want 1", calls)
	}
}

func filepathTemp(t testing.TB) (string, error) {
	// Unix socket paths must stay short; t.TempDir() can exceed 108 bytes.
	d, err := os.MkdirTemp("", "dp")
	if err == nil {
		t.Cleanup(func() { os.RemoveAll(d) })
	}
	return filepath.Clean(d), err
}

func TestListAndWatchPushesUpdates(t *testing.T) {
	healthy := map[string]bool{}
	health := func(u string) bool { return !healthy[u] }
	gs := h100s(2)
	client, srv := dial(t, resource.NewFraction(resource.FractionOptions{GPUs: gs, Health: health}))
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Devices) != 200 {
		t.Fatalf("first list has %d devices, want 200", len(first.Devices))
	}
	healthy[gs[1].UUID] = true // unhealthy now
	srv.Update()
	second, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	bad := 0
	for _, d := range second.Devices {
		if d.Health == pluginapi.Unhealthy {
			bad++
		}
	}
	if bad != 100 {
		t.Errorf("after Update %d devices unhealthy, want 100", bad)
	}
	srv.SetResource(resource.NewWhole(resource.WholeOptions{GPUs: gs, Name: srv.ResourceName()}))
	third, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(third.Devices) != 2 {
		t.Errorf("after SetResource %d devices, want 2", len(third.Devices))
	}
}

func TestAllocateErrorsCarryTheReason(t *testing.T) {
	client, _ := dial(t, resource.NewFraction(resource.FractionOptions{GPUs: h100s(2)}))
	var ids []string
	for k := 0; k < 60; k++ {
		ids = append(ids, resource.UnitID(h100s(2)[0].UUID, k), resource.UnitID(h100s(2)[1].UUID, k))
	}
	_, err := client.Allocate(t.Context(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}})
	if err == nil {
		t.Fatal("Allocate across GPUs succeeded")
	}
	if got := err.Error(); !strings.Contains(got, "at most 100 units") {
		t.Errorf("error %q does not explain the 100-unit limit", got)
	}
}

// available800 is what the kubelet passes on an empty 8-GPU node.
func available800(gs []nvidia.GPU) []string {
	var ids []string
	for _, g := range gs {
		for k := 0; k < 100; k++ {
			ids = append(ids, resource.UnitID(g.UUID, k))
		}
	}
	return ids
}

// reportP99 records per-op latencies and reports p50/p99 in microseconds.
func reportP99(b *testing.B, lat []time.Duration) {
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	if len(lat) == 0 {
		return
	}
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
}

// BenchmarkAllocateFraction measures Allocate of a 30-unit fraction on
// 8 GPUs / 800 units through the real gRPC endpoint, as the kubelet calls it.
func BenchmarkAllocateFraction(b *testing.B) {
	gs := h100s(8)
	client, _ := dial(b, resource.NewFraction(resource.FractionOptions{GPUs: gs, Usage: &resourcetest.Usage{}}))
	req := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: available800(gs)[:30]}}}
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if _, err := client.Allocate(ctx, req); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	reportP99(b, lat)
}

// BenchmarkPreferredFraction measures GetPreferredAllocation of 30 units
// with all 800 units available, through gRPC.
func BenchmarkPreferredFraction(b *testing.B) {
	gs := h100s(8)
	client, _ := dial(b, resource.NewFraction(resource.FractionOptions{GPUs: gs, Usage: &resourcetest.Usage{}}))
	req := &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
		AvailableDeviceIDs: available800(gs), AllocationSize: 30,
	}}}
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if _, err := client.GetPreferredAllocation(ctx, req); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	reportP99(b, lat)
}

// BenchmarkPreferredWhole measures GetPreferredAllocation of 4 whole GPUs
// out of 8 (go-gpuallocator's best-effort policy when topology is known).
func BenchmarkPreferredWhole(b *testing.B) {
	m, err := nvidia.NewMock("dgxh100")
	if err != nil {
		b.Fatal(err)
	}
	if err := m.Init(); err != nil {
		b.Fatal(err)
	}
	gs, err := m.GPUs()
	if err != nil {
		b.Fatal(err)
	}
	topo, err := nvidia.AllocatorDevices(m)
	if err != nil {
		b.Fatal(err)
	}
	client, _ := dial(b, resource.NewWhole(resource.WholeOptions{GPUs: gs, Topology: topo, Usage: &resourcetest.Usage{}}))
	var ids []string
	for _, g := range gs {
		ids = append(ids, g.UUID)
	}
	req := &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
		AvailableDeviceIDs: ids, AllocationSize: 4,
	}}}
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		resp, err := client.GetPreferredAllocation(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		if len(resp.ContainerResponses[0].DeviceIDs) != 4 {
			b.Fatalf("got %v", resp)
		}
		lat = append(lat, time.Since(t0))
	}
	reportP99(b, lat)
}
