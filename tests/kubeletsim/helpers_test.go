package kubeletsim_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpufrac/gpufrac/tests/kubeletsim"
	"github.com/gpufrac/gpufrac/tests/kubeletsim/kubeletsimtest"
)

const (
	// testResource is the resource the fake plugin registers.
	testResource = "example.com/dev"
	// testEndpoint is the fake plugin's socket name.
	testEndpoint = "dev.sock"
	// waitTimeout bounds every poll in these tests.
	waitTimeout = 20 * time.Second
)

// testContext returns a context that logs to t and ends with the test.
func testContext(t *testing.T) context.Context {
	t.Helper()
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(4)))
	return klog.NewContext(t.Context(), logger)
}

// waitContext bounds a wait.
func waitContext(t *testing.T, ctx context.Context) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, waitTimeout)
	t.Cleanup(cancel)
	return ctx
}

// shortDir makes a temporary directory short enough for unix sockets.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "ks")
	if err != nil {
		t.Fatalf("creating temp dir: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// startKubelet starts a simulator in a new directory; opts may adjust the
// options. It is stopped when the test ends.
func startKubelet(t *testing.T, ctx context.Context, opts func(*kubeletsim.Options)) (*kubeletsim.Kubelet, kubeletsim.Options) {
	t.Helper()
	dir := shortDir(t)
	o := kubeletsim.Options{
		NodeName:           "node-" + t.Name(),
		Dir:                dir,
		PodResourcesSocket: filepath.Join(dir, "pr.sock"),
	}
	if opts != nil {
		opts(&o)
	}
	k := kubeletsim.New(o)
	if err := k.Start(ctx); err != nil {
		t.Fatalf("starting kubelet simulator: %v", err)
	}
	t.Cleanup(k.Stop)
	return k, o
}

// startPlugin starts a fake plugin in dir with n healthy devices "dev-<i>";
// adjust may change the options. It is stopped when the test ends.
func startPlugin(t *testing.T, ctx context.Context, dir string, n int, adjust func(*kubeletsimtest.Options)) *kubeletsimtest.Plugin {
	t.Helper()
	o := kubeletsimtest.Options{
		Dir:      dir,
		Endpoint: testEndpoint,
		Resource: testResource,
		Devices:  kubeletsimtest.Devices("dev", n),
	}
	if adjust != nil {
		adjust(&o)
	}
	p := kubeletsimtest.New(o)
	if err := p.Start(ctx); err != nil {
		t.Fatalf("starting fake plugin: %v", err)
	}
	t.Cleanup(p.Stop)
	return p
}

// waitAllocatable waits until the test resource is connected with want
// healthy devices.
func waitAllocatable(t *testing.T, ctx context.Context, k *kubeletsim.Kubelet, want int) {
	t.Helper()
	err := k.WaitForResource(waitContext(t, ctx), testResource, func(s kubeletsim.ResourceState) bool {
		return s.Connected && s.Allocatable == want
	})
	if err != nil {
		t.Fatal(err)
	}
}

// podResourcesClient dials the simulator's PodResources socket.
func podResourcesClient(t *testing.T, socket string) podresourcesv1.PodResourcesListerClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dialing PodResources: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return podresourcesv1.NewPodResourcesListerClient(conn)
}

// registrationClient dials the simulator's registration socket.
func registrationClient(t *testing.T, socket string) v1beta1.RegistrationClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dialing registration: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return v1beta1.NewRegistrationClient(conn)
}

// pod builds a pod reference in namespace "ns" whose UID derives from its name.
func pod(name string) kubeletsim.PodRef {
	return kubeletsim.PodRef{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)}
}

// eventually polls cond every few milliseconds until it holds, failing the
// test with what() after waitTimeout.
func eventually(t *testing.T, ctx context.Context, cond func() bool, what func() string) {
	t.Helper()
	ctx = waitContext(t, ctx)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("condition not met within %v: %s", waitTimeout, what())
		case <-tick.C:
		}
	}
}
