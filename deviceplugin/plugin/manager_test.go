package plugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
	"github.com/gpufrac/gpufrac/tests/kubeletsim"
)

// managerContext carries a test logger and ends with the test (bounded).
func managerContext(t *testing.T) context.Context {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// startManager starts a manager on dir until the test ends; the returned
// stop cancels it and waits for it.
func startManager(t *testing.T, ctx context.Context, dir string, adjust func(*Manager)) (*Manager, func()) {
	t.Helper()
	m := NewManager(dir, nil)
	if adjust != nil {
		adjust(m)
	}
	ctx, cancel := context.WithCancel(ctx)
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); m.Wait() }) }
	t.Cleanup(stop)
	return m, stop
}

// poll checks cond every 10ms until it holds, failing the test after 15s.
func poll(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-tick.C:
		}
	}
}

func startKubelet(t *testing.T, ctx context.Context, dir string) *kubeletsim.Kubelet {
	t.Helper()
	k := kubeletsim.New(kubeletsim.Options{NodeName: "node-a", Dir: dir, Strict: true})
	if err := k.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Stop)
	return k
}

// seen is what a test checks of one resource in the kubelet simulator.
type seen struct {
	Capacity, Healthy int
	Connected         bool
	Registrations     int
}

func seenOf(res map[string]kubeletsim.ResourceState) map[string]seen {
	out := map[string]seen{}
	for name, s := range res {
		out[name] = seen{Capacity: s.Capacity, Healthy: s.Allocatable, Connected: s.Connected, Registrations: s.Registrations}
	}
	return out
}

// waitSeen waits until the simulator's resources are exactly want.
func waitSeen(t *testing.T, ctx context.Context, k *kubeletsim.Kubelet, want map[string]seen) {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := k.Wait(wctx, func(res map[string]kubeletsim.ResourceState) bool { return cmp.Equal(want, seenOf(res)) }); err != nil {
		t.Fatalf("%v\nkubelet resources (-want +got):\n%s", err, cmp.Diff(want, seenOf(k.Resources())))
	}
}

func whole(n int) resource.Resource {
	return resource.NewWhole(resource.WholeOptions{GPUs: h100s(n)})
}

func fraction(n int) resource.Resource {
	return resource.NewFraction(resource.FractionOptions{GPUs: h100s(n)})
}

// TestApply walks one manager through resource sets: new resources register,
// kept ones change their devices in place, withdrawn ones advertise zero
// devices before their endpoint goes (so the kubelet drops the capacity at
// once instead of keeping unhealthy devices for its grace period).
func TestApply(t *testing.T) {
	ctx := managerContext(t)
	dir, err := filepathTemp(t)
	if err != nil {
		t.Fatal(err)
	}
	k := startKubelet(t, ctx, dir)
	m, stop := startManager(t, ctx, dir, nil)
	fracSock := filepath.Join(dir, EndpointName(api.ResourceFraction))

	steps := []struct {
		name       string
		resources  []resource.Resource
		wantServed []string
		want       map[string]seen
		wantSocket bool // the fraction endpoint's socket exists
	}{
		{
			name:       "new resources register",
			resources:  []resource.Resource{whole(8), fraction(8)},
			wantServed: []string{api.ResourceFraction, api.ResourceGPU},
			want: map[string]seen{
				api.ResourceGPU:      {Capacity: 8, Healthy: 8, Connected: true, Registrations: 1},
				api.ResourceFraction: {Capacity: 800, Healthy: 800, Connected: true, Registrations: 1},
			},
			wantSocket: true,
		},
		{
			name:       "kept resources change their devices without registering again",
			resources:  []resource.Resource{whole(4), fraction(2)},
			wantServed: []string{api.ResourceFraction, api.ResourceGPU},
			want: map[string]seen{
				api.ResourceGPU:      {Capacity: 4, Healthy: 4, Connected: true, Registrations: 1},
				api.ResourceFraction: {Capacity: 200, Healthy: 200, Connected: true, Registrations: 1},
			},
			wantSocket: true,
		},
		{
			name:       "a withdrawn resource advertises zero devices, then its endpoint goes",
			resources:  []resource.Resource{whole(4)},
			wantServed: []string{api.ResourceGPU},
			want: map[string]seen{
				api.ResourceGPU:      {Capacity: 4, Healthy: 4, Connected: true, Registrations: 1},
				api.ResourceFraction: {Capacity: 0, Healthy: 0, Connected: false, Registrations: 1},
			},
		},
		{
			name:       "a withdrawn resource can come back",
			resources:  []resource.Resource{whole(4), fraction(1)},
			wantServed: []string{api.ResourceFraction, api.ResourceGPU},
			want: map[string]seen{
				api.ResourceGPU:      {Capacity: 4, Healthy: 4, Connected: true, Registrations: 1},
				api.ResourceFraction: {Capacity: 100, Healthy: 100, Connected: true, Registrations: 2},
			},
			wantSocket: true,
		},
		{
			name:       "withdrawing everything",
			resources:  nil,
			wantServed: []string{},
			want: map[string]seen{
				api.ResourceGPU:      {Capacity: 0, Healthy: 0, Connected: false, Registrations: 1},
				api.ResourceFraction: {Capacity: 0, Healthy: 0, Connected: false, Registrations: 2},
			},
		},
	}
	for _, s := range steps {
		if err := m.Apply(ctx, s.resources); err != nil {
			t.Fatalf("%s: Apply: %v", s.name, err)
		}
		if diff := cmp.Diff(s.wantServed, m.Resources()); diff != "" {
			t.Errorf("%s: served resources (-want +got):\n%s", s.name, diff)
		}
		waitSeen(t, ctx, k, s.want)
		_, err := os.Stat(fracSock)
		if got := err == nil; got != s.wantSocket {
			t.Errorf("%s: fraction socket exists = %t, want %t (stat: %v)", s.name, got, s.wantSocket, err)
		}
		if len(s.wantServed) > 0 {
			// The manager learns of a registration when Register returns,
			// a moment after the kubelet shows it.
			poll(t, ctx, s.name+": Registered()", m.Registered)
		}
	}
	if m.Registered() {
		t.Error("Registered() = true while serving nothing")
	}

	// A duplicate name is refused and changes nothing.
	if err := m.Apply(ctx, []resource.Resource{whole(1), whole(2)}); err == nil {
		t.Error("Apply with a resource listed twice succeeded")
	}
	if got := m.Resources(); len(got) != 0 {
		t.Errorf("after a refused Apply the manager serves %v", got)
	}

	// When the context ends every endpoint stops and removes its socket.
	if err := m.Apply(ctx, []resource.Resource{fraction(1)}); err != nil {
		t.Fatal(err)
	}
	waitSeen(t, ctx, k, map[string]seen{
		api.ResourceGPU:      {Capacity: 0, Healthy: 0, Connected: false, Registrations: 1},
		api.ResourceFraction: {Capacity: 100, Healthy: 100, Connected: true, Registrations: 3},
	})
	stop()
	if _, err := os.Stat(fracSock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("fraction socket after stop: %v, want it removed", err)
	}
	if got := m.Resources(); len(got) != 0 {
		t.Errorf("after stop the manager serves %v", got)
	}
}

// TestReRegistersAfterKubeletRestart checks a kubelet restart (sockets
// wiped, kubelet.sock created again) brings every endpoint back.
func TestReRegistersAfterKubeletRestart(t *testing.T) {
	ctx := managerContext(t)
	dir, err := filepathTemp(t)
	if err != nil {
		t.Fatal(err)
	}
	k := startKubelet(t, ctx, dir)
	m, _ := startManager(t, ctx, dir, func(m *Manager) { m.retryInterval = time.Hour }) // only the watch may re-register
	if err := m.Apply(ctx, []resource.Resource{whole(8), fraction(8)}); err != nil {
		t.Fatal(err)
	}
	waitSeen(t, ctx, k, map[string]seen{
		api.ResourceGPU:      {Capacity: 8, Healthy: 8, Connected: true, Registrations: 1},
		api.ResourceFraction: {Capacity: 800, Healthy: 800, Connected: true, Registrations: 1},
	})
	for restart := 2; restart <= 3; restart++ {
		if err := k.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		waitSeen(t, ctx, k, map[string]seen{
			api.ResourceGPU:      {Capacity: 8, Healthy: 8, Connected: true, Registrations: restart},
			api.ResourceFraction: {Capacity: 800, Healthy: 800, Connected: true, Registrations: restart},
		})
	}
	poll(t, ctx, "Registered()", m.Registered)
}

// TestRegistersWhenKubeletStartsLater starts the plugin before the
// kubelet: Apply must not fail, and the endpoints register once the
// kubelet is up (it wipes their sockets as it starts).
func TestRegistersWhenKubeletStartsLater(t *testing.T) {
	ctx := managerContext(t)
	dir, err := filepathTemp(t)
	if err != nil {
		t.Fatal(err)
	}
	m, _ := startManager(t, ctx, dir, nil)
	start := time.Now()
	if err := m.Apply(ctx, []resource.Resource{whole(2), fraction(2)}); err != nil {
		t.Fatalf("Apply without a kubelet: %v", err)
	}
	// Registration's own timeout is 5s per endpoint; Apply must not wait for it.
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Apply without a kubelet took %v, want it not to wait for one", took)
	}
	if m.Registered() {
		t.Fatal("Registered() = true without a kubelet")
	}
	start = time.Now()
	k := startKubelet(t, ctx, dir)
	waitSeen(t, ctx, k, map[string]seen{
		api.ResourceGPU:      {Capacity: 2, Healthy: 2, Connected: true, Registrations: 1},
		api.ResourceFraction: {Capacity: 200, Healthy: 200, Connected: true, Registrations: 1},
	})
	poll(t, ctx, "Registered()", m.Registered)
	t.Logf("registered %v after the kubelet started", time.Since(start))
}

// flakyRegistration is a kubelet Registration service that refuses the
// first calls, as a kubelet still starting up does.
type flakyRegistration struct {
	pluginapi.UnimplementedRegistrationServer
	mu      sync.Mutex
	refuse  int      // calls still to refuse
	calls   []string // resource of every call
	refused int
}

func (f *flakyRegistration) Register(_ context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, req.ResourceName)
	if f.refuse > 0 {
		f.refuse--
		f.refused++
		return nil, fmt.Errorf("kubelet not ready")
	}
	return &pluginapi.Empty{}, nil
}

func (f *flakyRegistration) count() (calls, refused int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls), f.refused
}

// TestRetriesRefusedRegistration checks a refused registration is retried
// on the retry period, without any kubelet.sock event.
func TestRetriesRefusedRegistration(t *testing.T) {
	ctx := managerContext(t)
	dir, err := filepathTemp(t)
	if err != nil {
		t.Fatal(err)
	}
	reg := &flakyRegistration{refuse: 2}
	lis, err := net.Listen("unix", filepath.Join(dir, filepath.Base(pluginapi.KubeletSocket)))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, reg)
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-served })

	m, _ := startManager(t, ctx, dir, func(m *Manager) { m.retryInterval = 20 * time.Millisecond })
	if err := m.Apply(ctx, []resource.Resource{whole(1)}); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, "Registered() after refusals", m.Registered)
	calls, refused := reg.count()
	if refused != 2 || calls != 3 {
		t.Errorf("registration calls = %d (%d refused), want 3 (2 refused)", calls, refused)
	}
	// Registered resources are not registered again by the retry loop.
	before, _ := reg.count()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for range 5 { // five retry periods
		<-tick.C
	}
	if after, _ := reg.count(); after != before {
		t.Errorf("%d more registrations after success", after-before)
	}
}

// TestEndpointSurvivesQuickRestart stops and restarts an endpoint right
// after starting it, as the manager does when kubelet.sock appears just
// after Apply. gRPC's Serve, when it runs only after Stop, closes the
// listener it was given; that must not unlink the socket the restarted
// endpoint now listens on.
func TestEndpointSurvivesQuickRestart(t *testing.T) {
	// One P: the Serve goroutine of the first Start runs only after this
	// goroutine blocks, i.e. after the restart, which is the race to check.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	ctx := managerContext(t)
	dir, err := filepathTemp(t)
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(dir, whole(1), nil)
	defer srv.Stop()
	for i := range 20 {
		if err := srv.Start(ctx); err != nil {
			t.Fatal(err)
		}
		srv.Stop()
		if err := srv.Start(ctx); err != nil {
			t.Fatal(err)
		}
		conn, err := grpc.NewClient("unix://"+srv.SocketPath(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err = pluginapi.NewDevicePluginClient(conn).GetDevicePluginOptions(cctx, &pluginapi.Empty{})
		cancel()
		conn.Close()
		if err != nil {
			t.Fatalf("round %d: endpoint unreachable after a quick restart: %v", i, err)
		}
		if _, err := os.Stat(srv.SocketPath()); err != nil {
			t.Fatalf("round %d: socket after a quick restart: %v", i, err)
		}
		srv.Stop()
	}
}
