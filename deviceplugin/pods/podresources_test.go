package pods

import (
	"context"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	testclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
)

func TestUsageOf(t *testing.T) {
	unit := resource.UnitID
	tests := []struct {
		name        string
		assignments []Assignment
		whole, frac string // resource names; defaults when empty
		want        map[string]resource.GPUUsage
	}{
		{
			name: "nothing allocated",
			want: map[string]resource.GPUUsage{},
		},
		{
			name: "a whole GPU held by a workload",
			assignments: []Assignment{
				{Namespace: "default", Pod: "train", Container: "main", Resource: api.ResourceGPU, DeviceIDs: []string{gpuA, gpuB}},
			},
			want: map[string]resource.GPUUsage{
				gpuA: {WholeHolder: "default/train"},
				gpuB: {WholeHolder: "default/train"},
			},
		},
		{
			name: "a whole GPU held by a reservation, with fractions on it",
			assignments: []Assignment{
				{Namespace: api.ReservationNamespace, Pod: api.ReservationNamePrefix + "x", Container: "hold", Resource: api.ResourceGPU, DeviceIDs: []string{gpuA}},
				{Namespace: "default", Pod: "f1", Container: "main", Resource: api.ResourceFraction, DeviceIDs: []string{unit(gpuA, 0), unit(gpuA, 1)}},
				{Namespace: "default", Pod: "f2", Container: "main", Resource: api.ResourceFraction, DeviceIDs: []string{unit(gpuA, 7)}},
			},
			want: map[string]resource.GPUUsage{
				gpuA: {WholeHolder: api.ReservationNamespace + "/" + api.ReservationNamePrefix + "x", WholeHolderIsReservation: true, Units: 3},
			},
		},
		{
			name: "the reservation prefix outside the system namespace is a workload",
			assignments: []Assignment{
				{Namespace: "default", Pod: api.ReservationNamePrefix + "x", Container: "main", Resource: api.ResourceGPU, DeviceIDs: []string{gpuC}},
			},
			want: map[string]resource.GPUUsage{gpuC: {WholeHolder: "default/" + api.ReservationNamePrefix + "x"}},
		},
		{
			name: "fractions on several GPUs, a malformed ID skipped, other resources ignored",
			assignments: []Assignment{
				{Namespace: "default", Pod: "f1", Container: "a", Resource: api.ResourceFraction, DeviceIDs: []string{unit(gpuA, 0), "garbage", unit(gpuA, 2)}},
				{Namespace: "default", Pod: "f1", Container: "b", Resource: api.ResourceFraction, DeviceIDs: []string{unit(gpuB, 5)}},
				{Namespace: "default", Pod: "mig", Container: "main", Resource: "nvidia.com/mig-1g.10gb", DeviceIDs: []string{"MIG-1"}},
			},
			want: map[string]resource.GPUUsage{gpuA: {Units: 2}, gpuB: {Units: 1}},
		},
		{
			name: "time-sliced replicas of any resource name count as replicas",
			assignments: []Assignment{
				{Namespace: "default", Pod: "r1", Container: "main", Resource: api.DefaultTimesliceResource, DeviceIDs: []string{unit(gpuA, 0), unit(gpuA, 3)}},
				{Namespace: "default", Pod: "r2", Container: "main", Resource: "example.com/renamed", DeviceIDs: []string{unit(gpuB, 1)}},
			},
			want: map[string]resource.GPUUsage{gpuA: {Replicas: 2}, gpuB: {Replicas: 1}},
		},
		{
			name:  "custom resource names",
			whole: "example.com/gpu", frac: "example.com/frac",
			assignments: []Assignment{
				{Namespace: "default", Pod: "w", Container: "main", Resource: "example.com/gpu", DeviceIDs: []string{gpuA}},
				{Namespace: "default", Pod: "f", Container: "main", Resource: "example.com/frac", DeviceIDs: []string{unit(gpuB, 1)}},
				{Namespace: "default", Pod: "x", Container: "main", Resource: api.ResourceGPU, DeviceIDs: []string{gpuC}},
			},
			want: map[string]resource.GPUUsage{gpuA: {WholeHolder: "default/w"}, gpuB: {Units: 1}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			whole, frac := tt.whole, tt.frac
			if whole == "" {
				whole, frac = api.ResourceGPU, api.ResourceFraction
			}
			if diff := cmp.Diff(tt.want, UsageOf(tt.assignments, whole, frac)); diff != "" {
				t.Errorf("UsageOf (-want +got):\n%s", diff)
			}
		})
	}
}

func TestIsReservation(t *testing.T) {
	tests := []struct {
		name           string
		namespace, pod string
		want           bool
	}{
		{name: "reservation", namespace: api.ReservationNamespace, pod: api.ReservationNamePrefix + "node-a-0", want: true},
		{name: "placeholder in the system namespace", namespace: api.ReservationNamespace, pod: "gpufrac-placeholder-1"},
		{name: "prefix in another namespace", namespace: "default", pod: api.ReservationNamePrefix + "x"},
		{name: "prefix not at the start", namespace: api.ReservationNamespace, pod: "x-" + api.ReservationNamePrefix},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := IsReservation(tt.namespace, tt.pod); got != tt.want {
				t.Errorf("IsReservation(%q, %q) = %t, want %t", tt.namespace, tt.pod, got, tt.want)
			}
		})
	}
}

// fakeLister serves a PodResources List answer (resp, or the one set by
// SetResp) and counts calls; FailNext fails the next call once.
type fakeLister struct {
	podresourcesapi.UnimplementedPodResourcesListerServer
	resp *podresourcesapi.ListPodResourcesResponse

	mu      sync.Mutex
	calls   int
	nextErr error
}

func (f *fakeLister) List(context.Context, *podresourcesapi.ListPodResourcesRequest) (*podresourcesapi.ListPodResourcesResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if err := f.nextErr; err != nil {
		f.nextErr = nil
		return nil, err
	}
	return f.resp, nil
}

// SetResp changes the answer of later calls.
func (f *fakeLister) SetResp(resp *podresourcesapi.ListPodResourcesResponse) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.resp = resp
}

// FailNext makes the next call fail with err.
func (f *fakeLister) FailNext(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextErr = err
}

func (f *fakeLister) Calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// serveLister serves f on a unix socket until the test ends.
func serveLister(t *testing.T, f *fakeLister) string {
	t.Helper()
	sock := filepath.Join(shortDir(t), "pr.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	podresourcesapi.RegisterPodResourcesListerServer(srv, f)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() { srv.Stop(); <-done })
	return sock
}

func devices(res string, numa int64, ids ...string) *podresourcesapi.ContainerDevices {
	d := &podresourcesapi.ContainerDevices{ResourceName: res, DeviceIds: ids}
	if numa >= 0 {
		d.Topology = &podresourcesapi.TopologyInfo{Nodes: []*podresourcesapi.NUMANode{{ID: numa}}}
	}
	return d
}

// TestPodResourcesList checks List merges the kubelet's per-device and
// per-NUMA-node entries into one Assignment per container and resource.
func TestPodResourcesList(t *testing.T) {
	unit := resource.UnitID
	f := &fakeLister{resp: &podresourcesapi.ListPodResourcesResponse{PodResources: []*podresourcesapi.PodResources{
		{Namespace: "default", Name: "frac", Containers: []*podresourcesapi.ContainerResources{
			{Name: "main", Devices: []*podresourcesapi.ContainerDevices{
				devices(api.ResourceFraction, -1, unit(gpuA, 1)),
				devices(api.ResourceFraction, -1, unit(gpuA, 0)),
				// A device on two NUMA nodes is listed once per node.
				devices(api.ResourceFraction, 0, unit(gpuA, 2)),
				devices(api.ResourceFraction, 1, unit(gpuA, 2)),
			}},
			{Name: "sidecar"},
		}},
		{Namespace: api.ReservationNamespace, Name: api.ReservationNamePrefix + "r", Containers: []*podresourcesapi.ContainerResources{
			{Name: "hold", Devices: []*podresourcesapi.ContainerDevices{
				devices(api.ResourceGPU, 0, gpuA),
				devices(api.ResourceGPU, 1, gpuA),
			}},
		}},
		{Namespace: "default", Name: "mixed", Containers: []*podresourcesapi.ContainerResources{
			{Name: "main", Devices: []*podresourcesapi.ContainerDevices{
				devices(api.ResourceGPU, -1, gpuC, gpuB),
				devices("example.com/nic", -1, "nic-0"),
			}},
		}},
		// Claims: gpufrac's driver's devices are kept per container (twice
		// listed, once kept); another driver's are ignored.
		{Namespace: "team", Name: "claimer", Containers: []*podresourcesapi.ContainerResources{
			{Name: "main", DynamicResources: []*podresourcesapi.DynamicResource{
				{ClaimName: "c30", ClaimNamespace: "team", ClaimResources: []*podresourcesapi.ClaimResource{
					{DriverName: api.DRADriver, PoolName: "node-a", DeviceName: "gpu-0-shares", ShareId: ptr.To("s-1")},
					{DriverName: api.DRADriver, PoolName: "node-a", DeviceName: "gpu-0-shares", ShareId: ptr.To("s-1")},
					{DriverName: "nic.example.com", PoolName: "node-a", DeviceName: "nic-0"},
				}},
				{ClaimName: "whole", ClaimNamespace: "team", ClaimResources: []*podresourcesapi.ClaimResource{
					{DriverName: api.DRADriver, PoolName: "node-a", DeviceName: "gpu-1"},
				}},
			}},
		}},
	}}}
	pr, err := NewPodResources(serveLister(t, f), time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	got, err := pr.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := []Assignment{
		{Namespace: "default", Pod: "frac", Container: "main", Resource: api.ResourceFraction, DeviceIDs: []string{unit(gpuA, 0), unit(gpuA, 1), unit(gpuA, 2)}},
		{Namespace: api.ReservationNamespace, Pod: api.ReservationNamePrefix + "r", Container: "hold", Resource: api.ResourceGPU, DeviceIDs: []string{gpuA}},
		{Namespace: "default", Pod: "mixed", Container: "main", Resource: api.ResourceGPU, DeviceIDs: []string{gpuB, gpuC}},
		{Namespace: "default", Pod: "mixed", Container: "main", Resource: "example.com/nic", DeviceIDs: []string{"nic-0"}},
		{Namespace: "team", Pod: "claimer", Container: "main", Resource: api.DRADriver, Claims: []ClaimDevice{
			{ClaimNamespace: "team", ClaimName: "c30", Pool: "node-a", Device: "gpu-0-shares", ShareID: "s-1"},
			{ClaimNamespace: "team", ClaimName: "whole", Pool: "node-a", Device: "gpu-1"},
		}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("List (-want +got):\n%s", diff)
	}
	usage, err := pr.Usage(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	wantUsage := map[string]resource.GPUUsage{
		gpuA: {WholeHolder: api.ReservationNamespace + "/" + api.ReservationNamePrefix + "r", WholeHolderIsReservation: true, Units: 3},
		gpuB: {WholeHolder: "default/mixed"},
		gpuC: {WholeHolder: "default/mixed"},
	}
	if diff := cmp.Diff(wantUsage, usage); diff != "" {
		t.Errorf("Usage (-want +got):\n%s", diff)
	}
}

// TestPodResourcesCache checks List answers from its cache within the TTL
// and asks the kubelet again after it or after Invalidate.
func TestPodResourcesCache(t *testing.T) {
	f := &fakeLister{resp: &podresourcesapi.ListPodResourcesResponse{}}
	clk := testclock.NewFakePassiveClock(t0)
	pr, err := NewPodResources(serveLister(t, f), time.Second, clk)
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	steps := []struct {
		name      string
		do        func()
		wantCalls int
	}{
		{name: "first list asks the kubelet", wantCalls: 1},
		{name: "within the TTL the cache answers", do: func() { clk.SetTime(t0.Add(999 * time.Millisecond)) }, wantCalls: 1},
		{name: "after the TTL the kubelet is asked", do: func() { clk.SetTime(t0.Add(time.Second)) }, wantCalls: 2},
		{name: "fresh again", wantCalls: 2},
		{name: "Invalidate forces a list", do: pr.Invalidate, wantCalls: 3},
	}
	for _, s := range steps {
		if s.do != nil {
			s.do()
		}
		if _, err := pr.List(t.Context()); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got := f.Calls(); got != s.wantCalls {
			t.Errorf("%s: %d kubelet calls, want %d", s.name, got, s.wantCalls)
		}
	}
}

// TestPodResourcesUnavailable checks an absent kubelet gives an error, not
// an empty listing (callers then fall back to the available list alone).
func TestPodResourcesUnavailable(t *testing.T) {
	pr, err := NewPodResources(filepath.Join(shortDir(t), "missing.sock"), time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if _, err := pr.Usage(ctx); err == nil {
		t.Fatal("Usage without a kubelet succeeded")
	}
}

// TestUsageCountsAnsweredDevices: devices an Allocate answer gave count as
// allocated until a listing shows them, or answeredTTL passes, so a listing
// taken before the kubelet recorded the allocation (and cached) never makes
// a GPU look freer than it is.
func TestUsageCountsAnsweredDevices(t *testing.T) {
	ctx := testContext(t)
	n := startSimNode(t, ctx)
	n.fakePlugin(t, ctx, api.ResourceFraction, unitDevices(gpuA, gpuB), false)
	clk := testclock.NewFakePassiveClock(t0)
	pr, err := NewPodResources(filepath.Join(n.dir, "pr.sock"), time.Hour, clk) // the cache never expires by itself
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pr.Close() })
	if _, err := pr.List(ctx); err != nil { // an empty listing, cached
		t.Fatal(err)
	}
	ids := []string{resource.UnitID(gpuB, 0), resource.UnitID(gpuB, 1)}
	pr.Answered(api.ResourceFraction, ids)
	if _, err := pr.List(ctx); err != nil { // a stale listing, cached again
		t.Fatal(err)
	}
	usage, err := pr.Usage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := usage[gpuB].Units; got != 2 {
		t.Errorf("units on %s before the kubelet lists them = %d, want 2", gpuB, got)
	}
	clk.SetTime(t0.Add(answeredTTL))
	if usage, _ = pr.Usage(ctx); usage[gpuB].Units != 0 {
		t.Errorf("units on %s after answeredTTL = %d, want 0 (never listed)", gpuB, usage[gpuB].Units)
	}
	pr.mu.Lock()
	left := len(pr.answered)
	pr.mu.Unlock()
	if left != 0 {
		t.Errorf("%d answers kept after their TTL", left)
	}

	// A pod that ended before any listing showed its devices: a listing
	// taken answeredSettle after the answer, without them, forgets them at
	// once (they held the GPU against whole GPUs and reservations for
	// answeredTTL before; seen in the issue 16 comparison runs).
	clk.SetTime(t0.Add(time.Hour))
	pr.Answered(api.ResourceFraction, ids)
	if usage, _ = pr.Usage(ctx); usage[gpuB].Units != 2 {
		t.Errorf("units on %s right after the answer = %d, want 2", gpuB, usage[gpuB].Units)
	}
	clk.SetTime(t0.Add(time.Hour + answeredSettle))
	pr.Invalidate()
	if usage, _ = pr.Usage(ctx); usage[gpuB].Units != 0 {
		t.Errorf("units on %s in a listing %s after the answer that does not show them = %d, want 0", gpuB, answeredSettle, usage[gpuB].Units)
	}
}

// TestUsageWaitsForARestartedKubeletsPods: a restarted kubelet lists no
// pod until its pod sources synced, though it keeps their devices. After
// KubeletRestarted, a node that had pods is not called idle by such a
// listing (a whole GPU was given twice that way, issue 26) until the pods
// are listed or the wait ends; an idle node, or no restart, waits for nothing.
func TestUsageWaitsForARestartedKubeletsPods(t *testing.T) {
	busy := &podresourcesapi.ListPodResourcesResponse{PodResources: []*podresourcesapi.PodResources{
		{Namespace: "default", Name: "frac", Containers: []*podresourcesapi.ContainerResources{
			{Name: "main", Devices: []*podresourcesapi.ContainerDevices{devices(api.ResourceFraction, -1, resource.UnitID(gpuA, 0))}},
		}},
	}}
	empty := &podresourcesapi.ListPodResourcesResponse{}
	// The bounds below tell "returned when the pods were listed" from
	// "returned at the end of the wait" and "did not wait": far apart, so
	// a loaded machine's slower calls do not blur them.
	const syncWait = 2 * time.Second
	tests := []struct {
		name       string
		busyBefore bool          // the node listed pods before the restart
		restart    bool          // KubeletRestarted is called
		podsBackIn time.Duration // the kubelet lists its pods again after this (0: never)
		listedAgo  time.Duration // the last listing before the restart was this long ago
		wantShares int           // fraction units in use on gpuA, as Usage says
		minWait    time.Duration
		maxWait    time.Duration
	}{
		{name: "pods listed again: their devices are in use", busyBefore: true, restart: true, podsBackIn: 300 * time.Millisecond,
			wantShares: 1, minWait: 250 * time.Millisecond, maxWait: syncWait - 200*time.Millisecond},
		{name: "pods never listed again: idle after the wait", busyBefore: true, restart: true,
			wantShares: 0, minWait: syncWait, maxWait: 3 * syncWait},
		{name: "an idle node before the restart waits for nothing", restart: true,
			wantShares: 0, maxWait: syncWait / 2},
		{name: "no restart: an empty listing is taken as it is", busyBefore: true,
			wantShares: 0, maxWait: syncWait / 2},
		{name: "pods listed long ago, none since: still waited for", busyBefore: true, restart: true, listedAgo: time.Hour,
			podsBackIn: 300 * time.Millisecond, wantShares: 1, minWait: 250 * time.Millisecond, maxWait: syncWait - 200*time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeLister{resp: empty}
			if tt.busyBefore {
				f.SetResp(busy)
			}
			pr, err := NewPodResources(serveLister(t, f), time.Nanosecond, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer pr.Close()
			pr.syncWait = syncWait
			if _, err := pr.List(t.Context()); err != nil {
				t.Fatal(err)
			}
			if tt.listedAgo > 0 {
				pr.mu.Lock()
				pr.lastBusy = pr.lastBusy.Add(-tt.listedAgo)
				pr.mu.Unlock()
			}
			f.SetResp(empty)
			if tt.restart {
				pr.KubeletRestarted()
			}
			if tt.podsBackIn > 0 {
				timer := time.AfterFunc(tt.podsBackIn, func() { f.SetResp(busy) })
				defer timer.Stop()
			}
			began := time.Now()
			usage, err := pr.Usage(t.Context())
			took := time.Since(began)
			if err != nil {
				t.Fatal(err)
			}
			if got := usage[gpuA].Units; got != tt.wantShares {
				t.Errorf("fraction units in use on %s: %d, want %d (usage %+v)", gpuA, got, tt.wantShares, usage)
			}
			if took < tt.minWait || took > tt.maxWait {
				t.Errorf("Usage took %s, want %s..%s", took, tt.minWait, tt.maxWait)
			}
		})
	}
}
