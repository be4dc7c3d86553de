package kubeletsim_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	"k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	testclock "k8s.io/utils/clock/testing"

	"github.com/gpufrac/gpufrac/tests/kubeletsim"
	"github.com/gpufrac/gpufrac/tests/kubeletsim/kubeletsimtest"
)

func TestRegister(t *testing.T) {
	tests := []struct {
		name    string
		req     *v1beta1.RegisterRequest
		strict  bool
		wantErr string // substring; empty means success
	}{
		{
			name: "valid registration",
			req:  &v1beta1.RegisterRequest{Version: v1beta1.Version, Endpoint: testEndpoint, ResourceName: testResource},
		},
		{
			name:    "unsupported version",
			req:     &v1beta1.RegisterRequest{Version: "v1alpha1", Endpoint: testEndpoint, ResourceName: testResource},
			wantErr: `requested API version "v1alpha1" is not supported`,
		},
		{
			name:    "resource name without domain",
			req:     &v1beta1.RegisterRequest{Version: v1beta1.Version, Endpoint: testEndpoint, ResourceName: "dev"},
			wantErr: `the ResourceName "dev" is invalid`,
		},
		{
			name:    "native resource name",
			req:     &v1beta1.RegisterRequest{Version: v1beta1.Version, Endpoint: testEndpoint, ResourceName: "kubernetes.io/dev"},
			wantErr: `the ResourceName "kubernetes.io/dev" is invalid`,
		},
		{
			name:    "resource name that is not qualified",
			req:     &v1beta1.RegisterRequest{Version: v1beta1.Version, Endpoint: testEndpoint, ResourceName: "example.com/a b"},
			wantErr: `the ResourceName "example.com/a b" is invalid`,
		},
		{
			name:    "endpoint outside the directory",
			req:     &v1beta1.RegisterRequest{Version: v1beta1.Version, Endpoint: "../dev.sock", ResourceName: testResource},
			wantErr: `the endpoint "../dev.sock" is invalid`,
		},
		{
			name:    "empty endpoint",
			req:     &v1beta1.RegisterRequest{Version: v1beta1.Version, ResourceName: testResource},
			wantErr: `the endpoint "" is invalid`,
		},
		{
			name: "request options differing from the plugin's are ignored",
			req: &v1beta1.RegisterRequest{Version: v1beta1.Version, Endpoint: testEndpoint, ResourceName: testResource,
				Options: &v1beta1.DevicePluginOptions{PreStartRequired: true}},
		},
		{
			name: "strict mode rejects request options differing from the plugin's",
			req: &v1beta1.RegisterRequest{Version: v1beta1.Version, Endpoint: testEndpoint, ResourceName: testResource,
				Options: &v1beta1.DevicePluginOptions{PreStartRequired: true}},
			strict:  true,
			wantErr: "differ from GetDevicePluginOptions",
		},
		{
			name: "strict mode accepts matching options",
			req: &v1beta1.RegisterRequest{Version: v1beta1.Version, Endpoint: testEndpoint, ResourceName: testResource,
				Options: &v1beta1.DevicePluginOptions{}},
			strict: true,
		},
		{
			name:    "endpoint nobody serves",
			req:     &v1beta1.RegisterRequest{Version: v1beta1.Version, Endpoint: "nobody.sock", ResourceName: testResource},
			wantErr: "failed to get device plugin options",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testContext(t)
			k, opts := startKubelet(t, ctx, func(o *kubeletsim.Options) { o.Strict = tc.strict })
			startPlugin(t, ctx, opts.Dir, 4, func(o *kubeletsimtest.Options) { o.Manual = true })

			_, err := registrationClient(t, k.SocketPath()).Register(waitContext(t, ctx), tc.req)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Register() error = %v, want one containing %q", err, tc.wantErr)
				}
				if diff := cmp.Diff(map[string]kubeletsim.ResourceState{}, k.Resources()); diff != "" {
					t.Errorf("Resources() after a rejected registration (-want +got):\n%s", diff)
				}
				return
			}
			if err != nil {
				t.Fatalf("Register() error = %v", err)
			}
			waitAllocatable(t, ctx, k, 4)
			got, _ := k.Resource(testResource)
			want := kubeletsim.ResourceState{
				Name:          testResource,
				Capacity:      4,
				Allocatable:   4,
				Devices:       kubeletsimtest.Devices("dev", 4),
				Connected:     true,
				Endpoint:      testEndpoint,
				Options:       &v1beta1.DevicePluginOptions{},
				Registrations: 1,
			}
			if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
				t.Errorf("Resource() (-want +got):\n%s", diff)
			}
		})
	}
}

// recorder keeps the last device list OnChange reported per resource.
type recorder struct {
	mu   sync.Mutex
	last map[string][]*v1beta1.Device
	seen map[string]bool
}

func newRecorder(k *kubeletsim.Kubelet) *recorder {
	r := &recorder{last: map[string][]*v1beta1.Device{}, seen: map[string]bool{}}
	k.OnChange(func(resource string, devs []*v1beta1.Device) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.last[resource] = devs
		r.seen[resource] = true
	})
	return r
}

// waitFor polls until the last reported list for resource matches want
// (nil want means "reported as removed").
func (r *recorder) waitFor(t *testing.T, ctx context.Context, resource string, want []*v1beta1.Device) {
	t.Helper()
	last := func() ([]*v1beta1.Device, bool) {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.last[resource], r.seen[resource]
	}
	eventually(t, ctx, func() bool {
		got, seen := last()
		return seen && (want == nil) == (got == nil) && cmp.Diff(want, got, protocmp.Transform()) == ""
	}, func() string {
		got, _ := last()
		return fmt.Sprintf("OnChange for %s: last report (-want +got):\n%s", resource, cmp.Diff(want, got, protocmp.Transform()))
	})
}

func TestListAndWatchUpdates(t *testing.T) {
	ctx := testContext(t)
	k, opts := startKubelet(t, ctx, nil)
	rec := newRecorder(k)
	p := startPlugin(t, ctx, opts.Dir, 4, nil)
	waitAllocatable(t, ctx, k, 4)
	rec.waitFor(t, ctx, testResource, kubeletsimtest.Devices("dev", 4))

	// A device turns unhealthy: capacity stays, allocatable drops.
	if err := p.SetHealth("dev-1", v1beta1.Unhealthy); err != nil {
		t.Fatal(err)
	}
	err := k.WaitForResource(waitContext(t, ctx), testResource, func(s kubeletsim.ResourceState) bool {
		return s.Capacity == 4 && s.Allocatable == 3
	})
	if err != nil {
		t.Fatal(err)
	}
	want := kubeletsimtest.Devices("dev", 4)
	want[1].Health = v1beta1.Unhealthy
	got, _ := k.Resource(testResource)
	if diff := cmp.Diff(want, got.Devices, protocmp.Transform()); diff != "" {
		t.Errorf("devices after dev-1 turned unhealthy (-want +got):\n%s", diff)
	}
	rec.waitFor(t, ctx, testResource, want)

	// The plugin drops devices: the list is replaced, not merged.
	p.SetDevices(kubeletsimtest.Devices("dev", 2))
	err = k.WaitForResource(waitContext(t, ctx), testResource, func(s kubeletsim.ResourceState) bool {
		return s.Capacity == 2 && s.Allocatable == 2
	})
	if err != nil {
		t.Fatal(err)
	}
	rec.waitFor(t, ctx, testResource, kubeletsimtest.Devices("dev", 2))
}

func TestPluginGoneGracePeriod(t *testing.T) {
	ctx := testContext(t)
	clk := testclock.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	const grace = time.Minute
	k, opts := startKubelet(t, ctx, func(o *kubeletsim.Options) {
		o.Clock = clk
		o.StopGracePeriod = grace
	})
	rec := newRecorder(k)
	p := startPlugin(t, ctx, opts.Dir, 2, nil)
	waitAllocatable(t, ctx, k, 2)

	// The plugin dies: all devices turn unhealthy at once, capacity stays.
	p.Stop()
	err := k.WaitForResource(waitContext(t, ctx), testResource, func(s kubeletsim.ResourceState) bool {
		return !s.Connected && s.Capacity == 2 && s.Allocatable == 0
	})
	if err != nil {
		t.Fatal(err)
	}
	allUnhealthy := kubeletsimtest.Devices("dev", 2)
	for _, d := range allUnhealthy {
		d.Health = v1beta1.Unhealthy
	}
	rec.waitFor(t, ctx, testResource, allUnhealthy)
	got, _ := k.Resource(testResource)
	if !got.StoppedAt.Equal(clk.Now()) {
		t.Errorf("StoppedAt = %v, want %v", got.StoppedAt, clk.Now())
	}
	if _, err := k.Allocate(ctx, pod("a"), "c", testResource, 1); !errors.Is(err, kubeletsim.ErrNoHealthyDevices) {
		t.Errorf("Allocate() on a stopped plugin error = %v, want %v", err, kubeletsim.ErrNoHealthyDevices)
	}

	// Just before the grace period ends the resource is still there.
	waitClockWaiters(t, ctx, clk, true)
	clk.Step(grace - time.Second)
	if _, ok := k.Resource(testResource); !ok {
		t.Fatalf("resource removed before the grace period ended")
	}
	clk.Step(time.Second)
	err = k.Wait(waitContext(t, ctx), func(res map[string]kubeletsim.ResourceState) bool {
		_, ok := res[testResource]
		return !ok
	})
	if err != nil {
		t.Fatal(err)
	}
	rec.waitFor(t, ctx, testResource, nil)
}

func TestReRegistrationCancelsRemoval(t *testing.T) {
	ctx := testContext(t)
	clk := testclock.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	k, opts := startKubelet(t, ctx, func(o *kubeletsim.Options) {
		o.Clock = clk
		o.StopGracePeriod = time.Minute
	})
	first := kubeletsimtest.New(kubeletsimtest.Options{
		Dir: opts.Dir, Endpoint: testEndpoint, Resource: testResource, Devices: kubeletsimtest.Devices("dev", 2),
	})
	if err := first.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitAllocatable(t, ctx, k, 2)
	first.Stop()
	err := k.WaitForResource(waitContext(t, ctx), testResource, func(s kubeletsim.ResourceState) bool { return !s.Connected })
	if err != nil {
		t.Fatal(err)
	}
	waitClockWaiters(t, ctx, clk, true)

	// The plugin comes back within the grace period.
	startPlugin(t, ctx, opts.Dir, 3, nil)
	waitAllocatable(t, ctx, k, 3)
	waitClockWaiters(t, ctx, clk, false)
	clk.Step(2 * time.Minute)
	got, ok := k.Resource(testResource)
	if !ok || !got.Connected || got.Registrations != 2 {
		t.Errorf("Resource() after re-registration and a long wait = %+v, %t; want connected with 2 registrations", got, ok)
	}
}

// waitClockWaiters polls until the fake clock has (or has no) pending timers.
func waitClockWaiters(t *testing.T, ctx context.Context, clk *testclock.FakeClock, want bool) {
	t.Helper()
	eventually(t, ctx, func() bool { return clk.HasWaiters() == want },
		func() string { return fmt.Sprintf("fake clock HasWaiters() never became %t", want) })
}

func TestNewRegistrationReplacesEndpoint(t *testing.T) {
	ctx := testContext(t)
	k, opts := startKubelet(t, ctx, nil)
	first := startPlugin(t, ctx, opts.Dir, 4, nil)
	waitAllocatable(t, ctx, k, 4)

	second := startPlugin(t, ctx, opts.Dir, 2, func(o *kubeletsimtest.Options) {
		o.Endpoint = "dev2.sock"
		o.Devices = kubeletsimtest.Devices("other", 2)
	})
	err := k.WaitForResource(waitContext(t, ctx), testResource, func(s kubeletsim.ResourceState) bool {
		return s.Endpoint == "dev2.sock" && s.Capacity == 2 && s.Connected
	})
	if err != nil {
		t.Fatal(err)
	}
	// The replaced plugin going away does not touch the resource.
	first.Stop()
	a, err := k.Allocate(ctx, pod("a"), "c", testResource, 1)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"other-0"}, a.DeviceIDs); diff != "" {
		t.Errorf("allocated devices (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([][]string{{"other-0"}}, second.Calls().Allocate); diff != "" {
		t.Errorf("second plugin's Allocate calls (-want +got):\n%s", diff)
	}
	if got := len(first.Calls().Allocate); got != 0 {
		t.Errorf("first plugin got %d Allocate calls, want 0", got)
	}
	if got := k.Registrations(testResource); got != 2 {
		t.Errorf("Registrations() = %d, want 2", got)
	}
}

func TestRestart(t *testing.T) {
	ctx := testContext(t)
	k, opts := startKubelet(t, ctx, nil)
	p := startPlugin(t, ctx, opts.Dir, 4, nil)
	waitAllocatable(t, ctx, k, 4)
	if _, err := k.Allocate(ctx, pod("a"), "c", testResource, 2); err != nil {
		t.Fatal(err)
	}
	if err := k.Restart(ctx); err != nil {
		t.Fatalf("Restart() error = %v", err)
	}
	// The plugin sees kubelet.sock created again and registers again.
	err := k.WaitForResource(waitContext(t, ctx), testResource, func(s kubeletsim.ResourceState) bool {
		return s.Registrations == 2 && s.Connected && s.Allocatable == 4
	})
	if err != nil {
		t.Fatal(err)
	}
	// The plugin counts its registration once the kubelet answered.
	eventually(t, ctx, func() bool { return p.Registrations() == 2 },
		func() string { return fmt.Sprintf("plugin Registrations() = %d, want 2", p.Registrations()) })

	// Allocations survive, like the kubelet's checkpoint: the held devices
	// stay held and PodResources still reports them.
	got, _ := k.Resource(testResource)
	if got.Allocated != 2 {
		t.Errorf("Allocated after restart = %d, want 2", got.Allocated)
	}
	b, err := k.Allocate(ctx, pod("b"), "c", testResource, 2)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"dev-2", "dev-3"}, b.DeviceIDs); diff != "" {
		t.Errorf("devices after restart (-want +got):\n%s", diff)
	}
	list, err := podResourcesClient(t, opts.PodResourcesSocket).List(waitContext(t, ctx), &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got := len(list.GetPodResources()); got != 2 {
		t.Errorf("PodResources List after restart has %d pods, want 2", got)
	}
}

func TestRestartWithoutReRegistration(t *testing.T) {
	ctx := testContext(t)
	k, opts := startKubelet(t, ctx, nil)
	p := startPlugin(t, ctx, opts.Dir, 4, func(o *kubeletsimtest.Options) { o.Manual = true })
	if err := p.Register(ctx); err != nil {
		t.Fatal(err)
	}
	waitAllocatable(t, ctx, k, 4)

	if err := k.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	// Until the plugin registers again the kubelet knows the resource but
	// no devices, and it removed the plugin's socket.
	got, ok := k.Resource(testResource)
	if !ok || got.Connected || got.Capacity != 0 || got.Allocatable != 0 {
		t.Errorf("Resource() after restart = %+v, %t; want known, disconnected, no devices", got, ok)
	}
	if _, err := os.Stat(p.Socket()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("plugin socket after restart: stat error = %v, want not exist", err)
	}
	if _, err := k.Allocate(ctx, pod("a"), "c", testResource, 1); !errors.Is(err, kubeletsim.ErrNoHealthyDevices) {
		t.Errorf("Allocate() before re-registration error = %v, want %v", err, kubeletsim.ErrNoHealthyDevices)
	}
}

func TestStartCleansPluginSockets(t *testing.T) {
	tests := []struct {
		name       string
		keep       bool
		wantSocket bool
	}{
		{name: "sockets removed like the kubelet does", keep: false, wantSocket: false},
		{name: "sockets kept on request", keep: true, wantSocket: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testContext(t)
			dir := shortDir(t)
			// The plugin serves before the kubelet starts.
			p := startPlugin(t, ctx, dir, 1, func(o *kubeletsimtest.Options) { o.Manual = true })
			k := kubeletsim.New(kubeletsim.Options{Dir: dir, KeepPluginSockets: tc.keep})
			if err := k.Start(ctx); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(k.Stop)
			_, statErr := os.Stat(p.Socket())
			if got := statErr == nil; got != tc.wantSocket {
				t.Fatalf("plugin socket exists after Start = %t (stat error %v), want %t", got, statErr, tc.wantSocket)
			}
			err := p.Register(ctx)
			if !tc.wantSocket {
				if err == nil || !strings.Contains(err.Error(), "failed to get device plugin options") {
					t.Fatalf("Register() with the socket removed error = %v, want a connection failure", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Register() with the plugin socket kept: %v", err)
			}
			waitAllocatable(t, ctx, k, 1)
		})
	}
}

func TestStartOptions(t *testing.T) {
	long := "/tmp/" + strings.Repeat("d", 110)
	tests := []struct {
		name    string
		opts    func(dir string) kubeletsim.Options
		wantErr string
	}{
		{name: "no directory", opts: func(string) kubeletsim.Options { return kubeletsim.Options{} }, wantErr: "Dir is required"},
		{name: "relative directory", opts: func(string) kubeletsim.Options { return kubeletsim.Options{Dir: "rel"} }, wantErr: "must be an absolute path"},
		{name: "socket path too long", opts: func(string) kubeletsim.Options { return kubeletsim.Options{Dir: long} }, wantErr: "a unix socket allows 107"},
		{
			name: "pod resources socket too long",
			opts: func(dir string) kubeletsim.Options {
				return kubeletsim.Options{Dir: dir, PodResourcesSocket: long + "/pr.sock"}
			},
			wantErr: "a unix socket allows 107",
		},
		{
			name: "pod resources socket on kubelet.sock",
			opts: func(dir string) kubeletsim.Options {
				return kubeletsim.Options{Dir: dir, PodResourcesSocket: filepath.Join(dir, kubeletsim.KubeletSocketName)}
			},
			wantErr: "must differ",
		},
		{name: "valid", opts: func(dir string) kubeletsim.Options { return kubeletsim.Options{Dir: filepath.Join(dir, "new")} }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			k := kubeletsim.New(tc.opts(shortDir(t)))
			err := k.Start(testContext(t))
			t.Cleanup(k.Stop)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Start() error = %v", err)
				}
				if _, err := os.Stat(k.SocketPath()); err != nil {
					t.Errorf("kubelet.sock not served: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Start() error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestLifecycle(t *testing.T) {
	ctx := testContext(t)
	k, opts := startKubelet(t, ctx, nil)
	startPlugin(t, ctx, opts.Dir, 1, nil)
	waitAllocatable(t, ctx, k, 1)

	if err := k.Start(ctx); !errors.Is(err, kubeletsim.ErrAlreadyStarted) {
		t.Errorf("second Start() error = %v, want %v", err, kubeletsim.ErrAlreadyStarted)
	}
	k.Stop()
	k.Stop()
	for _, p := range []string{k.SocketPath(), opts.PodResourcesSocket} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("socket %s after Stop: stat error = %v, want not exist", p, err)
		}
	}
	if err := k.Restart(ctx); !errors.Is(err, kubeletsim.ErrNotRunning) {
		t.Errorf("Restart() after Stop error = %v, want %v", err, kubeletsim.ErrNotRunning)
	}
	got, ok := k.Resource(testResource)
	if !ok || got.Connected {
		t.Errorf("Resource() after Stop = %+v, %t; want known and disconnected", got, ok)
	}

	kubeletsim.New(kubeletsim.Options{}).Stop() // Stop without Start is fine.
}

func TestContextCancelStopsServing(t *testing.T) {
	ctx, cancel := context.WithCancel(testContext(t))
	k, opts := startKubelet(t, ctx, nil)
	startPlugin(t, testContext(t), opts.Dir, 1, nil)
	waitAllocatable(t, testContext(t), k, 1)

	cancel()
	// Cancelling the context stops the servers, which removes the sockets,
	// and ends the plugin streams.
	err := k.Wait(waitContext(t, testContext(t)), func(res map[string]kubeletsim.ResourceState) bool {
		return !res[testResource].Connected
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{k.SocketPath(), opts.PodResourcesSocket} {
		eventually(t, testContext(t), func() bool {
			_, err := os.Stat(p)
			return errors.Is(err, os.ErrNotExist)
		}, func() string { return "socket " + p + " still exists after the context ended" })
	}
	k.Stop() // returns only once every goroutine ended
}
