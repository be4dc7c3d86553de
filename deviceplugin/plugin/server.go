// Package plugin serves kubelet device-plugin endpoints (API v1beta1), one
// unix socket per resource, and keeps them registered across kubelet
// restarts. A Server turns kubelet RPCs into calls on one resource.Resource;
// it knows nothing of NVML.
package plugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpufrac/gpufrac/deviceplugin/resource"
)

// Observer is told about every allocation outcome (for metrics, and so
// the node agent counts devices it just gave until the kubelet lists them).
type Observer interface {
	Allocated(resource string, devices []string, d time.Duration, err error)
}

// RestartObserver is an Observer that is told when the kubelet restarted,
// before the endpoints register with it again.
type RestartObserver interface {
	KubeletRestarted()
}

type nopObserver struct{}

func (nopObserver) Allocated(string, []string, time.Duration, error) {}

// Server is the device-plugin endpoint of one resource.
//
// Lifecycle: Start, then Register; Stop ends both and may be called twice.
// Start after Stop starts a fresh endpoint (used on kubelet restarts).
type Server struct {
	pluginapi.UnimplementedDevicePluginServer

	dir      string // kubelet device-plugin directory
	endpoint string // socket file name inside dir
	observer Observer

	mu      sync.Mutex
	res     resource.Resource
	subs    map[chan struct{}]uint64 // ListAndWatch stream wake-up -> generation last sent
	gen     uint64                   // bumped by every Update
	grpc    *grpc.Server
	cancel  context.CancelFunc // ends the current Start's goroutines
	stopped bool
}

// NewServer returns the endpoint for res in the kubelet directory dir.
func NewServer(dir string, res resource.Resource, obs Observer) *Server {
	if obs == nil {
		obs = nopObserver{}
	}
	return &Server{
		dir:      dir,
		endpoint: EndpointName(res.Name()),
		observer: obs,
		res:      res,
		subs:     map[chan struct{}]uint64{},
	}
}

// EndpointName is the socket file name for a resource ("gpufrac-nvidia.com_gpu.sock").
func EndpointName(resourceName string) string {
	return "gpufrac-" + strings.NewReplacer("/", "_").Replace(resourceName) + ".sock"
}

// ResourceName is the name of the resource served.
func (s *Server) ResourceName() string { return s.resource().Name() }

// SocketPath is the path of the endpoint's unix socket.
func (s *Server) SocketPath() string { return filepath.Join(s.dir, s.endpoint) }

func (s *Server) resource() resource.Resource {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.res
}

// SetResource swaps the resource served (same name, new devices or
// options) and pushes the new device list to the kubelet.
func (s *Server) SetResource(res resource.Resource) {
	s.mu.Lock()
	s.res = res
	s.mu.Unlock()
	s.Update()
}

// Update wakes every ListAndWatch stream to resend the device list, e.g.
// after a health change.
func (s *Server) Update() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gen++
	for ch := range s.subs {
		select {
		case ch <- struct{}{}:
		default: // a resend is already pending
		}
	}
}

// Start listens on the endpoint socket and serves until Stop or ctx ends.
func (s *Server) Start(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithValues("resource", s.ResourceName())
	sock := s.SocketPath()
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing stale socket %s: %w", sock, err)
	}
	lis, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", sock, err)
	}
	// Stop removes the socket file. The listener must not unlink it on
	// close: gRPC closes a listener whose Serve starts only after Stop,
	// which happens when Stop and Start follow Start at once (kubelet.sock
	// created just after Apply), and by then the path is the socket of the
	// restarted endpoint.
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	g := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(g, s)
	ctx, cancel := context.WithCancel(ctx)
	s.mu.Lock()
	s.grpc, s.cancel, s.stopped = g, cancel, false
	s.mu.Unlock()
	go func() {
		if err := g.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			logger.Error(err, "Device plugin endpoint stopped serving")
		}
	}()
	go func() {
		<-ctx.Done()
		g.Stop()
	}()
	logger.V(2).Info("Device plugin endpoint serving", "socket", sock)
	return nil
}

// kubeletConnect retries a refused connection to kubelet.sock after 50 ms,
// then 80, 128, ... up to 1 s. The manager registers the moment kubelet.sock
// appears, which is a moment before the kubelet accepts on it; with gRPC's
// default backoff (a first retry after 1 s, jittered) a restarted kubelet
// saw its device plugins again only a second later
// (TestRegisterRetriesSoonWhileTheKubeletIsNotYetAccepting).
var kubeletConnect = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
	MinConnectTimeout: 5 * time.Second,
}

// Register announces the endpoint to the kubelet's Registration service.
func (s *Server) Register(ctx context.Context) error {
	kubeletSock := filepath.Join(s.dir, filepath.Base(pluginapi.KubeletSocket))
	conn, err := grpc.NewClient("unix://"+kubeletSock, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(kubeletConnect))
	if err != nil {
		return fmt.Errorf("dialing kubelet at %s: %w", kubeletSock, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     s.endpoint,
		ResourceName: s.ResourceName(),
		Options:      &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
	}, grpc.WaitForReady(true)) // kubelet.sock appears a moment before it accepts connections
	if err != nil {
		return fmt.Errorf("registering %s with the kubelet: %w", s.ResourceName(), err)
	}
	klog.FromContext(ctx).Info("Registered with the kubelet", "resource", s.ResourceName(), "endpoint", s.endpoint)
	return nil
}

// Flushed tells whether every ListAndWatch stream has sent the device list
// of the latest Update.
func (s *Server) Flushed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sent := range s.subs {
		if sent < s.gen {
			return false
		}
	}
	return true
}

// Stop ends the endpoint and removes its socket. Safe to call twice.
func (s *Server) Stop() {
	s.mu.Lock()
	g, cancel := s.grpc, s.cancel
	s.grpc, s.cancel, s.stopped = nil, nil, true
	for ch := range s.subs {
		close(ch)
		delete(s.subs, ch)
	}
	s.mu.Unlock()
	if g != nil {
		// The streams end after what they sent (their channels are closed
		// above). A graceful stop lets the last device list reach the
		// kubelet (a withdrawn resource's zero devices); a hard stop closes
		// the connection at once and may drop it.
		done := make(chan struct{})
		go func() {
			g.GracefulStop()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(gracefulStopLimit):
			g.Stop() // a stream the kubelet does not read
		}
	}
	if cancel != nil {
		cancel()
	}
	_ = os.Remove(s.SocketPath())
}

// gracefulStopLimit bounds how long Stop waits for the endpoint's calls to end.
const gracefulStopLimit = 2 * time.Second

// GetDevicePluginOptions implements pluginapi.DevicePluginServer.
func (s *Server) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

// ListAndWatch implements pluginapi.DevicePluginServer: it sends the device
// list now and again after every Update until the stream or server ends.
func (s *Server) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	wake := make(chan struct{}, 1)
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return errors.New("device plugin endpoint stopped")
	}
	s.subs[wake] = 0
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		if _, ok := s.subs[wake]; ok {
			delete(s.subs, wake)
		}
		s.mu.Unlock()
	}()
	for {
		s.mu.Lock()
		gen, res := s.gen, s.res
		s.mu.Unlock()
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: res.Devices()}); err != nil {
			return fmt.Errorf("sending device list: %w", err)
		}
		s.mu.Lock()
		if _, ok := s.subs[wake]; ok {
			s.subs[wake] = gen
		}
		s.mu.Unlock()
		select {
		case _, ok := <-wake:
			if !ok {
				return nil
			}
		case <-stream.Context().Done():
			return nil
		}
	}
}

// GetPreferredAllocation implements pluginapi.DevicePluginServer.
func (s *Server) GetPreferredAllocation(ctx context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	res := s.resource()
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, cr := range req.ContainerRequests {
		ids, err := res.Preferred(ctx, cr.AvailableDeviceIDs, cr.MustIncludeDeviceIDs, int(cr.AllocationSize))
		if err != nil {
			klog.FromContext(ctx).V(2).Info("No preferred allocation", "resource", res.Name(), "size", cr.AllocationSize, "err", err)
			return nil, fmt.Errorf("%s: %w", res.Name(), err)
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// Allocate implements pluginapi.DevicePluginServer.
func (s *Server) Allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	res := s.resource()
	resp := &pluginapi.AllocateResponse{}
	for _, cr := range req.ContainerRequests {
		start := time.Now()
		c, err := res.Allocate(ctx, cr.DevicesIds)
		s.observer.Allocated(res.Name(), cr.DevicesIds, time.Since(start), err)
		if err != nil {
			klog.FromContext(ctx).Info("Allocation refused", "resource", res.Name(), "devices", len(cr.DevicesIds), "err", err)
			return nil, fmt.Errorf("%s: %w", res.Name(), err)
		}
		resp.ContainerResponses = append(resp.ContainerResponses, c)
	}
	return resp, nil
}

// PreStartContainer implements pluginapi.DevicePluginServer; gpufrac needs no pre-start work.
func (s *Server) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}
