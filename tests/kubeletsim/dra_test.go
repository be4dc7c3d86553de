package kubeletsim_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/tests/kubeletsim"
	"github.com/gpufrac/gpufrac/tests/kubeletsim/kubeletsimtest"
)

const (
	testDriver = "dev.example.com"
	testVendor = "example.com/dev"
)

// fakeClaims serves claims from a fake clientset (the ClaimGetter).
type fakeClaims struct{ cs *fake.Clientset }

func (f fakeClaims) GetClaim(ctx context.Context, ns, name string) (*resourceapi.ResourceClaim, error) {
	return f.cs.ResourceV1().ResourceClaims(ns).Get(ctx, name, metav1.GetOptions{})
}

// allocatedClaim is a claim of ns with one device per request, reserved for pods.
func allocatedClaim(name string, devices map[string]string, pods ...*corev1.Pod) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("claim-" + name)}}
	c.Status.Allocation = &resourceapi.AllocationResult{}
	for req, dev := range devices {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results,
			resourceapi.DeviceRequestAllocationResult{Request: req, Driver: testDriver, Pool: "node-a", Device: dev})
	}
	for _, p := range pods {
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: p.Name, UID: p.UID})
	}
	return c
}

// claimPod is a pod of ns whose container main uses the named claims.
func claimPod(name string, claims ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)}}
	main := corev1.Container{Name: "main"}
	for _, c := range claims {
		p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, corev1.PodResourceClaim{Name: "pc-" + c, ResourceClaimName: ptr.To(c)})
		main.Resources.Claims = append(main.Resources.Claims, corev1.ResourceClaim{Name: "pc-" + c})
	}
	p.Spec.Containers = []corev1.Container{main, {Name: "sidecar"}}
	return p
}

// startDRA starts a simulator with a plugin registry and a real kubeletplugin
// helper in front of a fake DRA plugin.
func startDRA(t *testing.T, ctx context.Context, claims ...*resourceapi.ResourceClaim) (*kubeletsim.Kubelet, kubeletsim.Options, *kubeletsimtest.DRAPlugin, func() *kubeletplugin.Helper) {
	t.Helper()
	cs := fake.NewClientset()
	for _, c := range claims {
		if _, err := cs.ResourceV1().ResourceClaims(c.Namespace).Create(ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	regDir := shortDir(t)
	k, o := startKubelet(t, ctx, func(o *kubeletsim.Options) {
		o.PluginRegistryDir = regDir
		o.Claims = fakeClaims{cs}
	})
	plugin := &kubeletsimtest.DRAPlugin{Driver: testDriver, Vendor: testVendor}
	pluginDir := shortDir(t)
	start := func() *kubeletplugin.Helper {
		h, err := kubeletplugin.Start(ctx, plugin, kubeletplugin.DriverName(testDriver), kubeletplugin.KubeClient(cs),
			kubeletplugin.NodeName("node-a"), kubeletplugin.RegistrarDirectoryPath(regDir), kubeletplugin.PluginDataDirectoryPath(pluginDir))
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	h := start()
	t.Cleanup(func() { h.Stop() })
	if err := k.WaitForDRADriver(waitContext(t, ctx), testDriver); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, func() bool { st := h.RegistrationStatus(); return st != nil && st.PluginRegistered },
		func() string { return "the helper never heard it was registered" })
	return k, o, plugin, start
}

func TestDRAPrepareUnprepare(t *testing.T) {
	ctx := testContext(t)
	a, b := claimPod("a", "gpu"), claimPod("b", "gpu")
	shared := allocatedClaim("gpu", map[string]string{"r": "dev-0"}, a, b)
	k, o, plugin, _ := startDRA(t, ctx, shared)

	if err := k.PrepareClaims(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := k.PrepareClaims(ctx, b); err != nil {
		t.Fatal(err)
	}
	// A claim shared by two pods is prepared once.
	if diff := cmp.Diff([]string{"prepare ns/gpu"}, plugin.Calls()); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
	want := []string{testVendor + "/claim=claim-gpu-dev-0"}
	if diff := cmp.Diff(want, k.ContainerCDIDevices(a.UID, "main")); diff != "" {
		t.Errorf("CDI devices of a/main (-want +got):\n%s", diff)
	}
	if got := k.ContainerCDIDevices(a.UID, "sidecar"); len(got) != 0 {
		t.Errorf("a sidecar without claims got %v", got)
	}

	// PodResources reports the claim's devices as dynamic resources.
	resp, err := podResourcesClient(t, o.PodResourcesSocket).List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(resp.GetPodResources()); n != 2 {
		t.Fatalf("%d pods listed, want 2", n)
	}
	c := resp.GetPodResources()[0].GetContainers()[0]
	dr := c.GetDynamicResources()
	if c.GetName() != "main" || len(dr) != 1 || dr[0].GetClaimName() != "gpu" || dr[0].GetClaimNamespace() != "ns" ||
		dr[0].GetClaimResources()[0].GetDriverName() != testDriver || dr[0].GetClaimResources()[0].GetDeviceName() != "dev-0" ||
		dr[0].GetClaimResources()[0].GetCdiDevices()[0].GetName() != want[0] {
		t.Errorf("dynamic resources of a/main: %v", c)
	}

	// The claim is unprepared when its last pod goes.
	if err := k.UnprepareClaims(ctx, a.UID); err != nil {
		t.Fatal(err)
	}
	if !plugin.Prepared(shared.UID) {
		t.Error("unprepared while pod b still uses the claim")
	}
	if err := k.UnprepareClaims(ctx, b.UID); err != nil {
		t.Fatal(err)
	}
	if plugin.Prepared(shared.UID) || len(k.PreparedClaims()) != 0 {
		t.Error("the claim is still prepared after its pods went")
	}
	if diff := cmp.Diff([]string{"prepare ns/gpu", "unprepare ns/gpu"}, plugin.Calls()); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
}

func TestDRAPrepareWaitsAndRetries(t *testing.T) {
	ctx := testContext(t)
	p := claimPod("p", "gpu")
	notReserved := allocatedClaim("gpu", map[string]string{"r": "dev-0"}) // reservedFor is empty
	k, _, plugin, _ := startDRA(t, ctx, notReserved)
	err := k.PrepareClaims(ctx, p)
	if !errors.Is(err, kubeletsim.ErrClaimsNotReady) || !strings.Contains(err.Error(), "not allowed to use ResourceClaim gpu") {
		t.Fatalf("prepare of a claim not reserved for the pod: %v, want ErrClaimsNotReady", err)
	}
	if len(plugin.Calls()) != 0 {
		t.Errorf("the driver was called for a claim not reserved for the pod: %v", plugin.Calls())
	}

	// The driver refuses once; the next attempt prepares.
	k2, _, plugin2, _ := startDRA(t, ctx, allocatedClaim("gpu", map[string]string{"r": "dev-0"}, p))
	plugin2.FailNextPrepare("gpu", kubeletsimtest.ErrInjected)
	var perr *kubeletsim.DRAPluginError
	if err := k2.PrepareClaims(ctx, p); !errors.As(err, &perr) || !strings.Contains(perr.Msg, "injected failure") {
		t.Fatalf("prepare with a failing driver: %v, want a DRAPluginError with its message", err)
	}
	if err := k2.PrepareClaims(ctx, p); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if len(k2.ContainerCDIDevices(p.UID, "main")) != 1 {
		t.Error("no CDI device after the retry")
	}

	// A template claim not created yet: wait.
	tp := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "t", UID: "uid-t"}}
	tp.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("tmpl")}}
	if err := k2.PrepareClaims(ctx, tp); !errors.Is(err, kubeletsim.ErrClaimsNotReady) {
		t.Errorf("template claim not created: %v, want ErrClaimsNotReady", err)
	}
}

func TestDRADriverRestartRegistersAgain(t *testing.T) {
	ctx := testContext(t)
	p := claimPod("p", "gpu")
	k, o, _, start := startDRA(t, ctx, allocatedClaim("gpu", map[string]string{"r": "dev-0"}, p))
	var h *kubeletplugin.Helper
	// The driver goes away: its registration socket is removed and the
	// simulator forgets it; preparing waits for it.
	eventually(t, ctx, func() bool { return len(k.DRADrivers()) == 1 }, func() string { return "driver not registered" })
	entries, _ := os.ReadDir(o.PluginRegistryDir)
	for _, e := range entries {
		_ = os.Remove(filepath.Join(o.PluginRegistryDir, e.Name()))
	}
	eventually(t, ctx, func() bool { return len(k.DRADrivers()) == 0 }, func() string { return "driver still registered after its socket went" })
	if err := k.PrepareClaims(ctx, p); !errors.Is(err, kubeletsim.ErrClaimsNotReady) || !strings.Contains(err.Error(), "is not registered") {
		t.Fatalf("prepare without the driver: %v", err)
	}
	// A new instance of the driver registers and prepares.
	h = start()
	t.Cleanup(func() { h.Stop() })
	if err := k.WaitForDRADriver(waitContext(t, ctx), testDriver); err != nil {
		t.Fatal(err)
	}
	if err := k.PrepareClaims(ctx, p); err != nil {
		t.Fatal(err)
	}
	// After a kubelet restart the driver registers again and prepared
	// claims are kept.
	if err := k.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if err := k.WaitForDRADriver(waitContext(t, ctx), testDriver); err != nil {
		t.Fatal(err)
	}
	if len(k.PreparedClaims()) != 1 {
		t.Errorf("prepared claims after a kubelet restart: %v", k.PreparedClaims())
	}
}

// nopDriver is a kubeletplugin.DRAPlugin that prepares nothing: enough to
// register.
type nopDriver struct{}

func (nopDriver) PrepareResourceClaims(context.Context, []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	return nil, errors.New("not implemented")
}

func (nopDriver) UnprepareResourceClaims(context.Context, []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	return nil, errors.New("not implemented")
}

func (nopDriver) HandleError(context.Context, error, string) {}

// notified records whether the kubelet told a helper instance it is
// registered, through a gRPC interceptor: the helper's RegistrationStatus
// reads a field its handler writes without a lock, not safe to poll under
// the race detector.
type notified struct{ registered atomic.Bool }

func (n *notified) intercept(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if st, ok := req.(*registerapi.RegistrationStatus); ok {
		n.registered.Store(st.GetPluginRegistered())
	}
	return handler(ctx, req)
}

// TestDRADriverReplacedSocketRegistersAgain: a restarted driver replaces its
// registration socket at the same path, faster than the simulator scans;
// the kubelet's plugin watcher sees the new socket's create event and
// registers it again, so must the simulator (the new process waits for
// NotifyRegistrationStatus, and its readiness with it).
func TestDRADriverReplacedSocketRegistersAgain(t *testing.T) {
	ctx := testContext(t)
	regDir := shortDir(t)
	cs := fake.NewClientset()
	k, _ := startKubelet(t, ctx, func(o *kubeletsim.Options) {
		o.PluginRegistryDir = regDir
		o.Claims = fakeClaims{cs}
	})
	pluginDir := shortDir(t)
	start := func() *notified {
		n := &notified{}
		h, err := kubeletplugin.Start(ctx, nopDriver{}, kubeletplugin.DriverName(testDriver), kubeletplugin.KubeClient(cs),
			kubeletplugin.NodeName("node-a"), kubeletplugin.RegistrarDirectoryPath(regDir), kubeletplugin.PluginDataDirectoryPath(pluginDir),
			kubeletplugin.GRPCInterceptor(n.intercept))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(h.Stop)
		return n
	}
	registered := func(n *notified) func() bool { return n.registered.Load }
	first := start()
	eventually(t, ctx, registered(first), func() string { return "the driver was never told it is registered" })
	if err := k.WaitForDRADriver(waitContext(t, ctx), testDriver); err != nil {
		t.Fatal(err)
	}
	// The new instance removes the old one's socket and listens at once.
	second := start()
	eventually(t, ctx, registered(second), func() string { return "the driver's new instance was never told it is registered" })
}
