package kubeletsim_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"
	"k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpufrac/gpufrac/tests/kubeletsim"
	"github.com/gpufrac/gpufrac/tests/kubeletsim/kubeletsimtest"
)

// defaultResponse is the fake plugin's default Allocate answer for ids.
func defaultResponse(ids ...string) *v1beta1.ContainerAllocateResponse {
	r := &v1beta1.ContainerAllocateResponse{
		Envs:        map[string]string{kubeletsimtest.EnvDevices: strings.Join(ids, ",")},
		Annotations: map[string]string{kubeletsimtest.CDIKind + "/devices": strings.Join(ids, ",")},
	}
	for _, id := range ids {
		r.Devices = append(r.Devices, &v1beta1.DeviceSpec{ContainerPath: "/dev/" + id, HostPath: "/dev/" + id, Permissions: "rw"})
		r.CdiDevices = append(r.CdiDevices, &v1beta1.CDIDevice{Name: kubeletsimtest.CDIKind + "=" + id})
	}
	return r
}

// pluginErr is the comparable part of a *kubeletsim.PluginError.
type pluginErr struct {
	Resource, Op, Message string
}

func TestAllocate(t *testing.T) {
	tests := []struct {
		name      string
		plugin    func(*kubeletsimtest.Options)
		preferred kubeletsimtest.PreferredFunc
		allocate  kubeletsimtest.AllocateFunc
		preStart  kubeletsimtest.PreStartFunc
		strict    bool
		resource  string // testResource when empty
		n         int
		// want is the allocation; nil when an error is expected.
		want *kubeletsim.Allocation
		// wantErr is a sentinel the error must match.
		wantErr error
		// wantPluginErr is the RPC and message of an expected *PluginError.
		wantPluginErr *pluginErr
		wantCalls     kubeletsimtest.Calls
	}{
		{
			name: "without preferred allocation the lowest free IDs are used",
			n:    2,
			want: &kubeletsim.Allocation{
				DeviceIDs: []string{"dev-0", "dev-1"},
				Response:  defaultResponse("dev-0", "dev-1"),
			},
			wantCalls: kubeletsimtest.Calls{Allocate: [][]string{{"dev-0", "dev-1"}}},
		},
		{
			name:   "preferred allocation is used",
			plugin: func(o *kubeletsimtest.Options) { o.PreferredAllocation = true },
			n:      2,
			want: &kubeletsim.Allocation{
				DeviceIDs: []string{"dev-2", "dev-3"},
				Preferred: []string{"dev-3", "dev-2"},
				Response:  defaultResponse("dev-3", "dev-2"),
			},
			wantCalls: kubeletsimtest.Calls{
				Preferred: []*v1beta1.ContainerPreferredAllocationRequest{{
					AvailableDeviceIDs: []string{"dev-0", "dev-1", "dev-2", "dev-3"},
					AllocationSize:     2,
				}},
				Allocate: [][]string{{"dev-3", "dev-2"}},
			},
		},
		{
			name:   "short preferred answer is completed as the kubelet does",
			plugin: func(o *kubeletsimtest.Options) { o.PreferredAllocation = true },
			preferred: func(*v1beta1.ContainerPreferredAllocationRequest) ([]string, error) {
				return []string{"dev-3"}, nil
			},
			n: 2,
			want: &kubeletsim.Allocation{
				DeviceIDs: []string{"dev-0", "dev-3"},
				Preferred: []string{"dev-3"},
				Response:  defaultResponse("dev-3", "dev-0"),
			},
			wantCalls: kubeletsimtest.Calls{
				Preferred: []*v1beta1.ContainerPreferredAllocationRequest{{
					AvailableDeviceIDs: []string{"dev-0", "dev-1", "dev-2", "dev-3"},
					AllocationSize:     2,
				}},
				Allocate: [][]string{{"dev-3", "dev-0"}},
			},
		},
		{
			name:   "preferred devices that are not available are ignored",
			plugin: func(o *kubeletsimtest.Options) { o.PreferredAllocation = true },
			preferred: func(*v1beta1.ContainerPreferredAllocationRequest) ([]string, error) {
				return []string{"dev-9", "dev-2"}, nil
			},
			n: 2,
			want: &kubeletsim.Allocation{
				DeviceIDs: []string{"dev-0", "dev-2"},
				Preferred: []string{"dev-9", "dev-2"},
				Response:  defaultResponse("dev-2", "dev-0"),
			},
			wantCalls: kubeletsimtest.Calls{
				Preferred: []*v1beta1.ContainerPreferredAllocationRequest{{
					AvailableDeviceIDs: []string{"dev-0", "dev-1", "dev-2", "dev-3"},
					AllocationSize:     2,
				}},
				Allocate: [][]string{{"dev-2", "dev-0"}},
			},
		},
		{
			name:   "strict mode rejects a short preferred answer",
			plugin: func(o *kubeletsimtest.Options) { o.PreferredAllocation = true },
			preferred: func(*v1beta1.ContainerPreferredAllocationRequest) ([]string, error) {
				return []string{"dev-3"}, nil
			},
			strict:  true,
			n:       2,
			wantErr: kubeletsim.ErrBadPluginResponse,
			wantCalls: kubeletsimtest.Calls{
				Preferred: []*v1beta1.ContainerPreferredAllocationRequest{{
					AvailableDeviceIDs: []string{"dev-0", "dev-1", "dev-2", "dev-3"},
					AllocationSize:     2,
				}},
			},
		},
		{
			name:   "strict mode rejects duplicate preferred devices",
			plugin: func(o *kubeletsimtest.Options) { o.PreferredAllocation = true },
			preferred: func(*v1beta1.ContainerPreferredAllocationRequest) ([]string, error) {
				return []string{"dev-1", "dev-1"}, nil
			},
			strict:  true,
			n:       2,
			wantErr: kubeletsim.ErrBadPluginResponse,
			wantCalls: kubeletsimtest.Calls{
				Preferred: []*v1beta1.ContainerPreferredAllocationRequest{{
					AvailableDeviceIDs: []string{"dev-0", "dev-1", "dev-2", "dev-3"},
					AllocationSize:     2,
				}},
			},
		},
		{
			name:   "strict mode accepts a valid preferred answer",
			plugin: func(o *kubeletsimtest.Options) { o.PreferredAllocation = true },
			strict: true,
			n:      1,
			want: &kubeletsim.Allocation{
				DeviceIDs: []string{"dev-3"},
				Preferred: []string{"dev-3"},
				Response:  defaultResponse("dev-3"),
			},
			wantCalls: kubeletsimtest.Calls{
				Preferred: []*v1beta1.ContainerPreferredAllocationRequest{{
					AvailableDeviceIDs: []string{"dev-0", "dev-1", "dev-2", "dev-3"},
					AllocationSize:     1,
				}},
				Allocate: [][]string{{"dev-3"}},
			},
		},
		{
			name:   "GetPreferredAllocation error fails admission",
			plugin: func(o *kubeletsimtest.Options) { o.PreferredAllocation = true },
			preferred: func(*v1beta1.ContainerPreferredAllocationRequest) ([]string, error) {
				return nil, errors.New("no GPU with room for 30%")
			},
			n:             1,
			wantPluginErr: &pluginErr{Resource: testResource, Op: "GetPreferredAllocation", Message: "no GPU with room for 30%"},
			wantCalls: kubeletsimtest.Calls{
				Preferred: []*v1beta1.ContainerPreferredAllocationRequest{{
					AvailableDeviceIDs: []string{"dev-0", "dev-1", "dev-2", "dev-3"},
					AllocationSize:     1,
				}},
			},
		},
		{
			name: "Allocate error carries the plugin's message",
			allocate: func(*v1beta1.ContainerAllocateRequest) (*v1beta1.ContainerAllocateResponse, error) {
				return nil, status.Error(codes.FailedPrecondition, "pod ns/a not found among pods bound to this node")
			},
			n:             1,
			wantPluginErr: &pluginErr{Resource: testResource, Op: "Allocate", Message: "pod ns/a not found among pods bound to this node"},
			wantCalls:     kubeletsimtest.Calls{Allocate: [][]string{{"dev-0"}}},
		},
		{
			name:   "PreStartContainer is called when the plugin requires it",
			plugin: func(o *kubeletsimtest.Options) { o.PreStartRequired = true },
			n:      2,
			want: &kubeletsim.Allocation{
				DeviceIDs: []string{"dev-0", "dev-1"},
				Response:  defaultResponse("dev-0", "dev-1"),
			},
			wantCalls: kubeletsimtest.Calls{
				Allocate: [][]string{{"dev-0", "dev-1"}},
				PreStart: [][]string{{"dev-0", "dev-1"}},
			},
		},
		{
			name:   "PreStartContainer error fails admission",
			plugin: func(o *kubeletsimtest.Options) { o.PreStartRequired = true },
			preStart: func(*v1beta1.PreStartContainerRequest) error {
				return errors.New("MPS daemon not ready")
			},
			n:             1,
			wantPluginErr: &pluginErr{Resource: testResource, Op: "PreStartContainer", Message: "MPS daemon not ready"},
			wantCalls: kubeletsimtest.Calls{
				Allocate: [][]string{{"dev-0"}},
				PreStart: [][]string{{"dev-0"}},
			},
		},
		{
			name:    "more devices than the node has",
			n:       5,
			wantErr: kubeletsim.ErrInsufficientDevices,
		},
		{
			name:     "unregistered resource",
			resource: "example.com/other",
			n:        1,
			wantErr:  kubeletsim.ErrUnknownResource,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testContext(t)
			k, opts := startKubelet(t, ctx, func(o *kubeletsim.Options) { o.Strict = tc.strict })
			p := startPlugin(t, ctx, opts.Dir, 4, tc.plugin)
			if tc.preferred != nil {
				p.SetPreferredFunc(tc.preferred)
			}
			if tc.allocate != nil {
				p.SetAllocateFunc(tc.allocate)
			}
			if tc.preStart != nil {
				p.SetPreStartFunc(tc.preStart)
			}
			waitAllocatable(t, ctx, k, 4)
			resource := tc.resource
			if resource == "" {
				resource = testResource
			}

			got, err := k.Allocate(ctx, pod("a"), "main", resource, tc.n)
			switch {
			case tc.want != nil:
				if err != nil {
					t.Fatalf("Allocate() error = %v", err)
				}
				want := *tc.want
				want.Pod, want.Container, want.Resource = pod("a"), "main", testResource
				if diff := cmp.Diff(&want, got, protocmp.Transform()); diff != "" {
					t.Errorf("Allocate() (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff([]kubeletsim.Allocation{want}, k.Allocations(), protocmp.Transform()); diff != "" {
					t.Errorf("Allocations() (-want +got):\n%s", diff)
				}
			case tc.wantPluginErr != nil:
				var pe *kubeletsim.PluginError
				if !errors.As(err, &pe) {
					t.Fatalf("Allocate() error = %v, want a *PluginError", err)
				}
				gotPE := pluginErr{Resource: pe.Resource, Op: pe.Op, Message: pe.Message()}
				if diff := cmp.Diff(*tc.wantPluginErr, gotPE); diff != "" {
					t.Errorf("PluginError (-want +got):\n%s", diff)
				}
			default:
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("Allocate() error = %v, want %v", err, tc.wantErr)
				}
			}
			if tc.want == nil {
				// A failed admission holds nothing.
				if got := k.Allocations(); len(got) != 0 {
					t.Errorf("Allocations() after a failed admission = %v, want none", got)
				}
				if s, _ := k.Resource(testResource); s.Allocated != 0 {
					t.Errorf("Allocated after a failed admission = %d, want 0", s.Allocated)
				}
			}
			if diff := cmp.Diff(tc.wantCalls, p.Calls(), protocmp.Transform(), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("plugin calls (-want +got):\n%s", diff)
			}
		})
	}
}

func TestAllocationsHoldDevicesUntilRelease(t *testing.T) {
	ctx := testContext(t)
	k, opts := startKubelet(t, ctx, nil)
	p := startPlugin(t, ctx, opts.Dir, 4, nil)
	waitAllocatable(t, ctx, k, 4)

	steps := []struct {
		name    string
		do      func() ([]string, error)
		want    []string
		wantErr error
	}{
		{
			name: "pod a takes two",
			do:   allocateIDs(t, k, pod("a"), "c", 2),
			want: []string{"dev-0", "dev-1"},
		},
		{
			name: "pod b takes the other two",
			do:   allocateIDs(t, k, pod("b"), "c", 2),
			want: []string{"dev-2", "dev-3"},
		},
		{
			name:    "pod c finds nothing free",
			do:      allocateIDs(t, k, pod("c"), "c", 1),
			wantErr: kubeletsim.ErrInsufficientDevices,
		},
		{
			name: "pod b asking again gets the same devices",
			do:   allocateIDs(t, k, pod("b"), "c", 2),
			want: []string{"dev-2", "dev-3"},
		},
		{
			name:    "pod b cannot change its request",
			do:      allocateIDs(t, k, pod("b"), "c", 1),
			wantErr: kubeletsim.ErrRequestChanged,
		},
		{
			name:    "a UID cannot change name",
			do:      allocateIDs(t, k, kubeletsim.PodRef{Namespace: "ns", Name: "other", UID: pod("a").UID}, "d", 1),
			wantErr: kubeletsim.ErrPodIdentity,
		},
		{
			name: "releasing pod a frees its devices",
			do: func() ([]string, error) {
				if got := k.Release(pod("a").UID); got != 1 {
					return nil, fmt.Errorf("Release() = %d, want 1", got)
				}
				if got := k.Release(pod("a").UID); got != 0 {
					return nil, fmt.Errorf("second Release() = %d, want 0", got)
				}
				if err := p.SetHealth("dev-0", v1beta1.Unhealthy); err != nil {
					return nil, err
				}
				return nil, k.WaitForResource(waitContext(t, ctx), testResource, func(s kubeletsim.ResourceState) bool {
					return s.Allocatable == 3 && s.Allocated == 2
				})
			},
		},
		{
			name: "pod c gets the freed healthy device",
			do:   allocateIDs(t, k, pod("c"), "c", 1),
			want: []string{"dev-1"},
		},
	}
	for _, st := range steps {
		got, err := st.do()
		if !errors.Is(err, st.wantErr) {
			t.Fatalf("%s: error = %v, want %v", st.name, err, st.wantErr)
		}
		if diff := cmp.Diff(st.want, got); diff != "" {
			t.Fatalf("%s: devices (-want +got):\n%s", st.name, diff)
		}
	}
	if got := len(p.Calls().Allocate); got != 3 {
		t.Errorf("plugin got %d Allocate calls, want 3 (a repeated request must not call the plugin)", got)
	}
}

// allocateIDs returns a step that admits one container and returns its devices.
func allocateIDs(t *testing.T, k *kubeletsim.Kubelet, pod kubeletsim.PodRef, container string, n int) func() ([]string, error) {
	return func() ([]string, error) {
		a, err := k.Allocate(testContext(t), pod, container, testResource, n)
		if err != nil {
			return nil, err
		}
		return a.DeviceIDs, nil
	}
}

func TestConcurrentAllocations(t *testing.T) {
	ctx := testContext(t)
	const devices = 16
	k, opts := startKubelet(t, ctx, nil)
	startPlugin(t, ctx, opts.Dir, devices, func(o *kubeletsimtest.Options) { o.PreferredAllocation = true })
	waitAllocatable(t, ctx, k, devices)
	client := podResourcesClient(t, opts.PodResourcesSocket)

	var wg sync.WaitGroup
	errs := make(chan error, devices)
	for i := range devices {
		wg.Add(2)
		go func() {
			defer wg.Done()
			if _, err := k.Allocate(ctx, pod(fmt.Sprintf("p%d", i)), "c", testResource, 1); err != nil {
				errs <- err
			}
		}()
		go func() {
			// Readers race the admissions.
			defer wg.Done()
			_ = k.Resources()
			if _, err := client.List(ctx, &podresourcesv1.ListPodResourcesRequest{}); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("concurrent call failed: %v", err)
	}
	var got []string
	for _, a := range k.Allocations() {
		got = append(got, a.DeviceIDs...)
	}
	slices.Sort(got)
	var want []string
	for _, d := range kubeletsimtest.Devices("dev", devices) {
		want = append(want, d.ID)
	}
	slices.Sort(want)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("devices held after concurrent admissions, each exactly once (-want +got):\n%s", diff)
	}
	if _, err := k.Allocate(ctx, pod("extra"), "c", testResource, 1); !errors.Is(err, kubeletsim.ErrInsufficientDevices) {
		t.Errorf("Allocate() on a full node error = %v, want %v", err, kubeletsim.ErrInsufficientDevices)
	}
}

func TestRandomPicks(t *testing.T) {
	ctx := testContext(t)
	const devices = 8
	picks := func(seed uint64) []string {
		k, opts := startKubelet(t, ctx, func(o *kubeletsim.Options) { o.Rand = rand.New(rand.NewPCG(seed, 0)) })
		startPlugin(t, ctx, opts.Dir, devices, nil)
		waitAllocatable(t, ctx, k, devices)
		var out []string
		for i := range devices {
			a, err := k.Allocate(ctx, pod(fmt.Sprintf("p%d", i)), "c", testResource, 1)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, a.DeviceIDs...)
		}
		return out
	}
	first, again := picks(7), picks(7)
	if diff := cmp.Diff(first, again); diff != "" {
		t.Errorf("picks with the same seed differ (-first +again):\n%s", diff)
	}
	if slices.IsSorted(first) {
		t.Errorf("seeded picks %v came out in ID order; Rand was not used", first)
	}
	sorted := slices.Sorted(slices.Values(first))
	var all []string
	for _, d := range kubeletsimtest.Devices("dev", devices) {
		all = append(all, d.ID)
	}
	if diff := cmp.Diff(slices.Sorted(slices.Values(all)), sorted); diff != "" {
		t.Errorf("seeded picks are not each device once (-want +got):\n%s", diff)
	}
}

// BenchmarkAllocateRelease measures one admission (GetPreferredAllocation +
// Allocate over gRPC) and its release on a node with 800 devices, the size
// of 8 GPUs shared in fractions.
func BenchmarkAllocateRelease(b *testing.B) {
	ctx := b.Context()
	dir, err := os.MkdirTemp("", "ks")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = os.RemoveAll(dir) })
	k := kubeletsim.New(kubeletsim.Options{Dir: dir})
	if err := k.Start(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(k.Stop)
	p := kubeletsimtest.New(kubeletsimtest.Options{
		Dir: dir, Endpoint: testEndpoint, Resource: testResource,
		Devices: kubeletsimtest.Devices("dev", 800), PreferredAllocation: true,
	})
	if err := p.Start(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(p.Stop)
	waitCtx, cancel := context.WithTimeout(ctx, waitTimeout)
	defer cancel()
	if err := k.WaitForResource(waitCtx, testResource, func(s kubeletsim.ResourceState) bool { return s.Allocatable == 800 }); err != nil {
		b.Fatal(err)
	}
	ref := pod("bench")
	for b.Loop() {
		if _, err := k.Allocate(ctx, ref, "c", testResource, 30); err != nil {
			b.Fatal(err)
		}
		k.Release(ref.UID)
	}
}

// TestPluginErrorKubeletCause: the cause the kubelet's device manager puts
// in "Allocate failed due to ...": Allocate's gRPC error bare, the other
// RPCs' behind its prefix (found against the real kubelet, issue 26).
func TestPluginErrorKubeletCause(t *testing.T) {
	rpcErr := status.Error(codes.InvalidArgument, "at most 100 units")
	tests := []struct {
		op   string
		want string
	}{
		{op: "Allocate", want: "rpc error: code = InvalidArgument desc = at most 100 units"},
		{op: "GetPreferredAllocation", want: "device plugin GetPreferredAllocation rpc failed with err: rpc error: code = InvalidArgument desc = at most 100 units"},
		{op: "PreStartContainer", want: "device plugin PreStartContainer rpc failed with err: rpc error: code = InvalidArgument desc = at most 100 units"},
	}
	for _, tt := range tests {
		t.Run(tt.op, func(t *testing.T) {
			pe := &kubeletsim.PluginError{Resource: testResource, Op: tt.op, Err: rpcErr}
			if diff := cmp.Diff(tt.want, pe.KubeletCause()); diff != "" {
				t.Errorf("KubeletCause() (-want +got):\n%s", diff)
			}
		})
	}
}
