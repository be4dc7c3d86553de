package draplugin

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/testing/protocmp"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drapbv1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/utils/ptr"
)

// fakePlugin answers prepare with one device per claim (or the error set
// for its name) and records the calls; block, when set, holds each call
// until closed. It tracks how many calls run at once.
type fakePlugin struct {
	mu        sync.Mutex
	prepared  [][]string // claim names per call
	unprep    [][]NamespacedObject
	claimErr  map[string]error
	callErr   error
	block     chan struct{}
	running   int
	maxAtOnce int
	handled   []error
}

func (p *fakePlugin) enter() {
	p.mu.Lock()
	p.running++
	p.maxAtOnce = max(p.maxAtOnce, p.running)
	block := p.block
	p.mu.Unlock()
	if block != nil {
		<-block
	}
}

func (p *fakePlugin) leave() {
	p.mu.Lock()
	p.running--
	p.mu.Unlock()
}

func (p *fakePlugin) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]PrepareResult, error) {
	p.enter()
	defer p.leave()
	p.mu.Lock()
	defer p.mu.Unlock()
	var names []string
	out := map[types.UID]PrepareResult{}
	for _, c := range claims {
		names = append(names, c.Name)
		if err := p.claimErr[c.Name]; err != nil {
			out[c.UID] = PrepareResult{Err: err}
			continue
		}
		r := c.Status.Allocation.Devices.Results[0]
		out[c.UID] = PrepareResult{Devices: []Device{{Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device,
			CDIDeviceIDs: []string{"example.com/gpu=" + string(c.UID)}, ShareID: r.ShareID}}}
	}
	p.prepared = append(p.prepared, names)
	if p.callErr != nil {
		return nil, p.callErr
	}
	return out, nil
}

func (p *fakePlugin) UnprepareResourceClaims(_ context.Context, claims []NamespacedObject) (map[types.UID]error, error) {
	p.enter()
	defer p.leave()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.unprep = append(p.unprep, claims)
	out := map[types.UID]error{}
	for _, c := range claims {
		out[c.UID] = p.claimErr[c.Name]
	}
	return out, nil
}

func (p *fakePlugin) HandleError(_ context.Context, err error, _ string) {
	p.mu.Lock()
	p.handled = append(p.handled, err)
	p.mu.Unlock()
}

// allocated is a claim allocated one device (a share of it with share).
func allocated(name string, share bool) *resourceapi.ResourceClaim {
	r := resourceapi.DeviceRequestAllocationResult{Request: "gpu/small", Driver: testDriver, Pool: testNode, Device: "gpu-0"}
	if share {
		r.ShareID = ptr.To(types.UID("share-" + name))
	}
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: name, UID: types.UID("uid-" + name)},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{r}}}},
	}
}

type serverFixture struct {
	plugin               *fakePlugin
	api                  *fakeAPI
	srv                  *Server
	regDir, pluginDir    string
	reg                  registerapi.RegistrationClient
	v1                   drapbv1.DRAPluginClient
	v1beta1              drapbv1beta1.DRAPluginClient
	regSocket, draSocket string
}

// startServer starts a server in short temporary directories (unix socket
// paths are limited to 108 bytes) and dials both sockets as the kubelet.
func startServer(t *testing.T) *serverFixture {
	t.Helper()
	dir, err := os.MkdirTemp("", "draplugin")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	f := &serverFixture{plugin: &fakePlugin{claimErr: map[string]error{}}, api: newFakeAPI(),
		regDir: filepath.Join(dir, "reg"), pluginDir: filepath.Join(dir, "plugin")}
	for _, d := range []string{f.regDir, f.pluginDir} {
		if err := os.Mkdir(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	f.regSocket = filepath.Join(f.regDir, testDriver+"-reg.sock")
	f.draSocket = filepath.Join(f.pluginDir, "dra.sock")
	// A stale socket of an earlier process is replaced.
	if err := os.WriteFile(f.draSocket, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, ctx := ktesting.NewTestContext(t)
	f.srv, err = StartServer(ctx, f.plugin, ServerOptions{Driver: testDriver, RegistryDir: f.regDir, PluginDir: f.pluginDir, Claims: f.api})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.srv.Stop)
	dial := func(path string) *grpc.ClientConn {
		c, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	f.reg = registerapi.NewRegistrationClient(dial(f.regSocket))
	dra := dial(f.draSocket)
	f.v1, f.v1beta1 = drapbv1.NewDRAPluginClient(dra), drapbv1beta1.NewDRAPluginClient(dra)
	f.api.mu.Lock()
	for _, c := range []string{"a", "b", "c"} {
		f.api.claims["team/"+c] = allocated(c, c == "b")
	}
	f.api.mu.Unlock()
	return f
}

func rpcCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func claimRef(name string) *drapbv1.Claim {
	return &drapbv1.Claim{Namespace: "team", Name: name, Uid: "uid-" + name}
}

// TestServerRegistersWithTheKubelet: GetInfo says what the kubelet needs
// (type, name, the DRA socket, v1 and v1beta1), again for a restarted
// kubelet; the kubelet's verdict is kept for readiness.
func TestServerRegistersWithTheKubelet(t *testing.T) {
	f := startServer(t)
	ctx := rpcCtx(t)
	if st := f.srv.RegistrationStatus(); st != nil {
		t.Fatalf("status %v before the kubelet said anything", st)
	}
	want := &registerapi.PluginInfo{Type: registerapi.DRAPlugin, Name: testDriver, Endpoint: f.draSocket,
		SupportedVersions: []string{"v1.DRAPlugin", "v1beta1.DRAPlugin"}}
	for range 2 { // the kubelet, then the kubelet restarted
		info, err := f.reg.GetInfo(ctx, &registerapi.InfoRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, info, protocmp.Transform()); diff != "" {
			t.Errorf("GetInfo (-want,+got):\n%s", diff)
		}
		if _, err := f.reg.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
			t.Fatal(err)
		}
		if st := f.srv.RegistrationStatus(); st == nil || !st.PluginRegistered {
			t.Errorf("status %v after the kubelet accepted", st)
		}
	}
	_, err := f.reg.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: false, Error: "version mismatch"})
	if err == nil {
		t.Error("a refused registration was answered without error")
	}
	if st := f.srv.RegistrationStatus(); st == nil || st.PluginRegistered || st.Error != "version mismatch" {
		t.Errorf("status %v after the kubelet refused", st)
	}
	f.srv.Stop()
	for _, s := range []string{f.regSocket, f.draSocket} {
		if _, err := os.Stat(s); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("socket %s left after Stop: %v", s, err)
		}
	}
	f.srv.Stop() // twice is fine
}

func TestServerPreparesAndUnprepares(t *testing.T) {
	f := startServer(t)
	ctx := rpcCtx(t)
	resp, err := f.v1.NodePrepareResources(ctx, &drapbv1.NodePrepareResourcesRequest{Claims: []*drapbv1.Claim{claimRef("a"), claimRef("b")}})
	if err != nil {
		t.Fatal(err)
	}
	want := &drapbv1.NodePrepareResourcesResponse{Claims: map[string]*drapbv1.NodePrepareResourceResponse{
		"uid-a": {Devices: []*drapbv1.Device{{RequestNames: []string{"gpu"}, PoolName: testNode, DeviceName: "gpu-0", CdiDeviceIds: []string{"example.com/gpu=uid-a"}}}},
		"uid-b": {Devices: []*drapbv1.Device{{RequestNames: []string{"gpu"}, PoolName: testNode, DeviceName: "gpu-0", CdiDeviceIds: []string{"example.com/gpu=uid-b"}, ShareId: ptr.To("share-b")}}},
	}}
	if diff := cmp.Diff(want, resp, protocmp.Transform()); diff != "" {
		t.Errorf("NodePrepareResources v1 (-want,+got):\n%s", diff)
	}
	// v1beta1, which kubelets that do not speak v1 use, gets the same.
	f.plugin.mu.Lock()
	f.plugin.claimErr["c"] = errors.New("allocation exceeds what the device has left")
	f.plugin.mu.Unlock()
	beta, err := f.v1beta1.NodePrepareResources(ctx, &drapbv1beta1.NodePrepareResourcesRequest{Claims: []*drapbv1beta1.Claim{{Namespace: "team", Name: "c", Uid: "uid-c"}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := beta.GetClaims()["uid-c"].GetError(); got != "allocation exceeds what the device has left" {
		t.Errorf("v1beta1 claim error %q", got)
	}
	un, err := f.v1.NodeUnprepareResources(ctx, &drapbv1.NodeUnprepareResourcesRequest{Claims: []*drapbv1.Claim{claimRef("a"), claimRef("c")}})
	if err != nil {
		t.Fatal(err)
	}
	wantUn := &drapbv1.NodeUnprepareResourcesResponse{Claims: map[string]*drapbv1.NodeUnprepareResourceResponse{
		"uid-a": {}, "uid-c": {Error: "allocation exceeds what the device has left"},
	}}
	if diff := cmp.Diff(wantUn, un, protocmp.Transform()); diff != "" {
		t.Errorf("NodeUnprepareResources (-want,+got):\n%s", diff)
	}
	wantCalls := []NamespacedObject{
		{NamespacedName: types.NamespacedName{Namespace: "team", Name: "a"}, UID: "uid-a"},
		{NamespacedName: types.NamespacedName{Namespace: "team", Name: "c"}, UID: "uid-c"},
	}
	f.plugin.mu.Lock()
	defer f.plugin.mu.Unlock()
	if diff := cmp.Diff([][]NamespacedObject{wantCalls}, f.plugin.unprep); diff != "" {
		t.Errorf("plugin's unprepare calls (-want,+got):\n%s", diff)
	}
}

// TestServerRefusesClaimsItCannotRead: the whole call fails, the plugin is
// not called, and the kubelet retries later.
func TestServerRefusesClaimsItCannotRead(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(f *serverFixture)
	}{
		{"claim unreadable", func(f *serverFixture) { f.api.fail["get"] = apierrors.NewServiceUnavailable("injected") }},
		{"claim gone", func(f *serverFixture) { delete(f.api.claims, "team/a") }},
		{"claim not allocated", func(f *serverFixture) { f.api.claims["team/a"].Status.Allocation = nil }},
		{"claim replaced (another UID)", func(f *serverFixture) { f.api.claims["team/a"].UID = "uid-new" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := startServer(t)
			f.api.mu.Lock()
			tc.setup(f)
			f.api.mu.Unlock()
			if _, err := f.v1.NodePrepareResources(rpcCtx(t), &drapbv1.NodePrepareResourcesRequest{Claims: []*drapbv1.Claim{claimRef("b"), claimRef("a")}}); err == nil {
				t.Error("prepared")
			}
			f.plugin.mu.Lock()
			defer f.plugin.mu.Unlock()
			if len(f.plugin.prepared) != 0 {
				t.Errorf("plugin called with %v", f.plugin.prepared)
			}
		})
	}
	t.Run("plugin fails the call", func(t *testing.T) {
		f := startServer(t)
		f.plugin.mu.Lock()
		f.plugin.callErr = errors.New("record unwritable")
		f.plugin.mu.Unlock()
		if _, err := f.v1.NodePrepareResources(rpcCtx(t), &drapbv1.NodePrepareResourcesRequest{Claims: []*drapbv1.Claim{claimRef("a")}}); err == nil {
			t.Error("prepared")
		}
	})
}

// TestServerSerializesCalls: prepare and unprepare calls reach the plugin
// one at a time, as the kubeletplugin helper serializes them.
func TestServerSerializesCalls(t *testing.T) {
	f := startServer(t)
	block := make(chan struct{})
	f.plugin.mu.Lock()
	f.plugin.block = block
	f.plugin.mu.Unlock()
	ctx := rpcCtx(t)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i, c := range []string{"a", "b", "c", "a"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if i%2 == 0 {
				_, err = f.v1.NodePrepareResources(ctx, &drapbv1.NodePrepareResourcesRequest{Claims: []*drapbv1.Claim{claimRef(c)}})
			} else {
				_, err = f.v1.NodeUnprepareResources(ctx, &drapbv1.NodeUnprepareResourcesRequest{Claims: []*drapbv1.Claim{claimRef(c)}})
			}
			errs <- err
		}()
	}
	eventually(t, "a call in the plugin", func() bool {
		f.plugin.mu.Lock()
		defer f.plugin.mu.Unlock()
		return f.plugin.running > 0
	})
	time.Sleep(50 * time.Millisecond) // time for the others to (wrongly) enter
	close(block)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	f.plugin.mu.Lock()
	defer f.plugin.mu.Unlock()
	if f.plugin.maxAtOnce != 1 {
		t.Errorf("%d calls in the plugin at once, want 1", f.plugin.maxAtOnce)
	}
	if n := len(f.plugin.prepared) + len(f.plugin.unprep); n != 4 {
		t.Errorf("%d calls reached the plugin, want 4", n)
	}
}

func TestStartServerFails(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	p := &fakePlugin{}
	for _, tc := range []struct {
		name string
		o    ServerOptions
	}{
		{"no driver", ServerOptions{Claims: newFakeAPI()}},
		{"no claim reader", ServerOptions{Driver: testDriver}},
		{"no plugin directory", ServerOptions{Driver: testDriver, Claims: newFakeAPI(), PluginDir: filepath.Join(t.TempDir(), "missing"), RegistryDir: t.TempDir()}},
		{"no registry directory", ServerOptions{Driver: testDriver, Claims: newFakeAPI(), PluginDir: t.TempDir(), RegistryDir: filepath.Join(t.TempDir(), "missing")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := StartServer(ctx, p, tc.o)
			if err == nil {
				s.Stop()
				t.Fatal("started")
			}
			// What was started before the failure is stopped.
			if entries, _ := os.ReadDir(tc.o.PluginDir); tc.o.PluginDir != "" && len(entries) != 0 {
				t.Errorf("left in the plugin directory: %v", entries)
			}
		})
	}
	if len(p.handled) != 0 {
		t.Errorf("errors reported as fatal: %v", p.handled)
	}
}

func TestBaseRequestNames(t *testing.T) {
	got := baseRequestNames([]string{"gpu", "gpu/small", "a/b/c"})
	if want := []string{"gpu", "gpu", "a"}; !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

// TestServerStopDuringCall: Stop does not wait for a call stuck in the
// plugin (the kubelet's call fails and is retried by the next process),
// reports no fatal error, and leaves no socket.
func TestServerStopDuringCall(t *testing.T) {
	f := startServer(t)
	block := make(chan struct{})
	defer close(block)
	f.plugin.mu.Lock()
	f.plugin.block = block
	f.plugin.mu.Unlock()
	errc := make(chan error, 1)
	go func() {
		_, err := f.v1.NodePrepareResources(rpcCtx(t), &drapbv1.NodePrepareResourcesRequest{Claims: []*drapbv1.Claim{claimRef("a")}})
		errc <- err
	}()
	eventually(t, "the call in the plugin", func() bool {
		f.plugin.mu.Lock()
		defer f.plugin.mu.Unlock()
		return f.plugin.running > 0
	})
	stopped := make(chan struct{})
	go func() { f.srv.Stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("Stop waits for the call stuck in the plugin")
	}
	select {
	case err := <-errc:
		if err == nil {
			t.Error("the call cut by Stop succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the kubelet's call did not end with Stop")
	}
	for _, s := range []string{f.regSocket, f.draSocket} {
		if _, err := os.Stat(s); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("socket %s left after Stop: %v", s, err)
		}
	}
	f.plugin.mu.Lock()
	defer f.plugin.mu.Unlock()
	if len(f.plugin.handled) != 0 {
		t.Errorf("errors reported by Stop: %v", f.plugin.handled)
	}
}
