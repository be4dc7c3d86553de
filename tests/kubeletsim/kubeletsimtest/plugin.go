// Package kubeletsimtest provides a small fake device plugin that serves the
// real DevicePlugin gRPC API, registers with a kubelet (real or simulated)
// and re-registers when kubelet.sock is re-created, the way production
// plugins detect a kubelet restart. Its answers are swappable and its calls
// recorded, like the kubelet's own device-plugin stub.
package kubeletsimtest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"k8s.io/klog/v2"
	"k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// kubeletSocket is the registration socket's name in the plugin directory.
const kubeletSocket = "kubelet.sock"

// registerTimeout bounds one registration call.
const registerTimeout = 10 * time.Second

// Options configures a Plugin.
type Options struct {
	// Dir is the device-plugin directory holding kubelet.sock.
	Dir string
	// Endpoint is the plugin's socket file name inside Dir.
	Endpoint string
	// Resource is the resource name to register, e.g. "example.com/dev".
	Resource string
	// Devices are the initial devices.
	Devices []*v1beta1.Device
	// PreferredAllocation makes the plugin offer GetPreferredAllocation.
	PreferredAllocation bool
	// PreStartRequired makes the plugin ask for PreStartContainer.
	PreStartRequired bool
	// Manual makes Start only serve: the plugin neither registers nor
	// watches for kubelet restarts; the test calls Register itself.
	Manual bool
}

// AllocateFunc answers one container's Allocate request.
type AllocateFunc func(req *v1beta1.ContainerAllocateRequest) (*v1beta1.ContainerAllocateResponse, error)

// PreferredFunc answers one container's GetPreferredAllocation request.
type PreferredFunc func(req *v1beta1.ContainerPreferredAllocationRequest) ([]string, error)

// PreStartFunc answers PreStartContainer.
type PreStartFunc func(req *v1beta1.PreStartContainerRequest) error

// Calls records the requests the plugin received.
type Calls struct {
	// Allocate holds the device IDs of each container request, in order.
	Allocate [][]string
	// Preferred holds each container's preferred-allocation request.
	Preferred []*v1beta1.ContainerPreferredAllocationRequest
	// PreStart holds the device IDs of each PreStartContainer call.
	PreStart [][]string
}

// Plugin is a fake device plugin. Create it with New, then Start it.
type Plugin struct {
	opts   Options
	socket string

	// mu guards everything below.
	mu        sync.Mutex
	devices   []*v1beta1.Device
	changed   chan struct{} // closed and replaced when devices change
	allocate  AllocateFunc
	preferred PreferredFunc
	preStart  PreStartFunc
	calls     Calls
	// registrations counts successful Register calls.
	registrations int
	// lastErr is the last registration or serving error.
	lastErr error
	// server is the running gRPC server; nil when not serving.
	server *grpc.Server
	// serveDone is closed when the current server's Serve returned.
	serveDone chan struct{}
	started   bool
	stopped   bool
	cancel    context.CancelFunc
	wg        sync.WaitGroup
}

// New returns a plugin configured by opts; it does nothing until Start.
// Unset functions get defaults: Allocate answers an env var, a device spec and
// a CDI device per device and fails for unknown or unhealthy IDs; preferred
// allocation picks the must-include devices, then the highest available IDs
// (so a preferred answer differs from the simulator's own lowest-ID pick);
// PreStartContainer succeeds.
func New(opts Options) *Plugin {
	return &Plugin{
		opts:      opts,
		socket:    filepath.Join(opts.Dir, opts.Endpoint),
		devices:   cloneDevices(opts.Devices),
		changed:   make(chan struct{}),
		preferred: highestIDs,
		preStart:  func(*v1beta1.PreStartContainerRequest) error { return nil },
	}
}

// Devices returns n healthy devices named "<prefix>-0" .. "<prefix>-<n-1>".
func Devices(prefix string, n int) []*v1beta1.Device {
	out := make([]*v1beta1.Device, n)
	for i := range out {
		out[i] = &v1beta1.Device{ID: fmt.Sprintf("%s-%d", prefix, i), Health: v1beta1.Healthy}
	}
	return out
}

// Socket returns the plugin's socket path.
func (p *Plugin) Socket() string { return p.socket }

// Start serves the plugin on Dir/Endpoint and watches Dir. If kubelet.sock
// exists it registers now and returns the registration error; otherwise it
// registers when kubelet.sock appears. Every time kubelet.sock is created
// again the plugin re-creates its socket and registers again. Everything
// ends when ctx is cancelled or Stop is called.
func (p *Plugin) Start(ctx context.Context) error {
	p.mu.Lock()
	if p.started {
		p.mu.Unlock()
		return errors.New("plugin already started")
	}
	p.started = true
	ctx, cancel := context.WithCancel(ctx)
	p.cancel = cancel
	p.mu.Unlock()

	if p.opts.Manual {
		return p.serve(ctx)
	}
	watcher, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("creating watcher for %s: %w", p.opts.Dir, err)
	}
	// Watch before looking for kubelet.sock so its creation cannot be missed.
	if err := watcher.Add(p.opts.Dir); err != nil {
		_ = watcher.Close()
		return fmt.Errorf("watching %s: %w", p.opts.Dir, err)
	}
	if err := p.serve(ctx); err != nil {
		_ = watcher.Close()
		return err
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.watch(ctx, watcher)
	}()
	if _, err := os.Stat(filepath.Join(p.opts.Dir, kubeletSocket)); err == nil {
		if err := p.Register(ctx); err != nil {
			return err
		}
	}
	return nil
}

// Stop stops serving (ListAndWatch streams end, so the kubelet marks the
// devices unhealthy), stops watching and removes the socket. It can be
// called without Start and more than once.
func (p *Plugin) Stop() {
	p.mu.Lock()
	if !p.started || p.stopped {
		p.stopped = true
		p.mu.Unlock()
		return
	}
	p.stopped = true
	p.cancel()
	p.mu.Unlock()
	p.wg.Wait()
	p.stopServing()
	_ = removeIfExists(p.socket)
}

// watch re-serves and re-registers whenever kubelet.sock is created, until
// ctx ends.
func (p *Plugin) watch(ctx context.Context, watcher *fsnotify.Watcher) {
	logger := klog.FromContext(ctx).WithValues("resource", p.opts.Resource)
	defer func() {
		_ = watcher.Close()
	}()
	kubelet := filepath.Join(p.opts.Dir, kubeletSocket)
	for {
		select {
		case <-ctx.Done():
			return
		case err, ok := <-watcher.Errors:
			if !ok {
				return
			}
			logger.Error(err, "Watching the device-plugin directory failed")
		case ev, ok := <-watcher.Events:
			if !ok {
				return
			}
			if ev.Name != kubelet || !ev.Has(fsnotify.Create) {
				continue
			}
			logger.V(2).Info("Kubelet socket created, registering again")
			// The kubelet removed our socket when it started: serve anew.
			p.stopServing()
			if err := p.serve(ctx); err != nil {
				logger.Error(err, "Serving again failed")
				continue
			}
			if err := p.Register(ctx); err != nil {
				logger.Error(err, "Registering again failed")
			}
		}
	}
}

// serve listens on the plugin socket and serves until stopServing or ctx ends.
func (p *Plugin) serve(ctx context.Context) error {
	if err := removeIfExists(p.socket); err != nil {
		return err
	}
	lis, err := net.Listen("unix", p.socket)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", p.socket, err)
	}
	srv := grpc.NewServer()
	v1beta1.RegisterDevicePluginServer(srv, &service{p: p})
	done := make(chan struct{})
	p.mu.Lock()
	p.server = srv
	p.serveDone = done
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer close(done)
		if err := srv.Serve(lis); err != nil {
			p.setErr(fmt.Errorf("serving %s: %w", p.socket, err))
		}
	}()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		select {
		case <-ctx.Done():
			srv.Stop()
		case <-done:
		}
	}()
	return nil
}

// stopServing stops the current server, if any, and waits for Serve to return.
func (p *Plugin) stopServing() {
	p.mu.Lock()
	srv, done := p.server, p.serveDone
	p.server, p.serveDone = nil, nil
	p.mu.Unlock()
	if srv == nil {
		return
	}
	srv.Stop()
	<-done
}

// Register calls the kubelet's Register once, with the plugin's resource,
// endpoint and options.
func (p *Plugin) Register(ctx context.Context) error {
	// kubelet.sock appears at bind time, a moment before the kubelet
	// listens: wait for the connection (retrying quickly) instead of
	// failing on "connection refused", as plugins dialing with WithBlock do.
	conn, err := grpc.NewClient("unix://"+filepath.Join(p.opts.Dir, kubeletSocket),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: time.Second,
		}))
	if err != nil {
		return p.setErr(fmt.Errorf("dialing kubelet: %w", err))
	}
	defer func() {
		_ = conn.Close()
	}()
	ctx, cancel := context.WithTimeout(ctx, registerTimeout)
	defer cancel()
	_, err = v1beta1.NewRegistrationClient(conn).Register(ctx, &v1beta1.RegisterRequest{
		Version:      v1beta1.Version,
		Endpoint:     p.opts.Endpoint,
		ResourceName: p.opts.Resource,
		Options:      p.options(),
	}, grpc.WaitForReady(true))
	if err != nil {
		return p.setErr(fmt.Errorf("registering %s: %w", p.opts.Resource, err))
	}
	p.mu.Lock()
	p.registrations++
	p.mu.Unlock()
	return nil
}

func (p *Plugin) options() *v1beta1.DevicePluginOptions {
	return &v1beta1.DevicePluginOptions{
		PreStartRequired:                p.opts.PreStartRequired,
		GetPreferredAllocationAvailable: p.opts.PreferredAllocation,
	}
}

func (p *Plugin) setErr(err error) error {
	p.mu.Lock()
	p.lastErr = err
	p.mu.Unlock()
	return err
}

// Registrations returns how many times the plugin registered successfully.
func (p *Plugin) Registrations() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.registrations
}

// LastError returns the last registration or serving error, if any.
func (p *Plugin) LastError() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastErr
}

// Calls returns a copy of the recorded requests.
func (p *Plugin) Calls() Calls {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := Calls{}
	for _, ids := range p.calls.Allocate {
		c.Allocate = append(c.Allocate, slices.Clone(ids))
	}
	for _, r := range p.calls.Preferred {
		c.Preferred = append(c.Preferred, proto.Clone(r).(*v1beta1.ContainerPreferredAllocationRequest))
	}
	for _, ids := range p.calls.PreStart {
		c.PreStart = append(c.PreStart, slices.Clone(ids))
	}
	return c
}

// SetDevices replaces the device list and pushes it to ListAndWatch streams.
func (p *Plugin) SetDevices(devs []*v1beta1.Device) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.devices = cloneDevices(devs)
	close(p.changed)
	p.changed = make(chan struct{})
}

// SetHealth sets one device's health (v1beta1.Healthy or v1beta1.Unhealthy)
// and pushes the list to ListAndWatch streams.
func (p *Plugin) SetHealth(id, health string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, d := range p.devices {
		if d.ID == id {
			d.Health = health
			close(p.changed)
			p.changed = make(chan struct{})
			return nil
		}
	}
	return fmt.Errorf("setting health of %s: no such device", id)
}

// SetAllocateFunc replaces the Allocate answer.
func (p *Plugin) SetAllocateFunc(f AllocateFunc) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.allocate = f
}

// SetPreferredFunc replaces the GetPreferredAllocation answer.
func (p *Plugin) SetPreferredFunc(f PreferredFunc) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.preferred = f
}

// SetPreStartFunc replaces the PreStartContainer answer.
func (p *Plugin) SetPreStartFunc(f PreStartFunc) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.preStart = f
}

// service implements the DevicePlugin gRPC service for a Plugin.
type service struct {
	v1beta1.UnimplementedDevicePluginServer
	p *Plugin
}

// GetDevicePluginOptions returns the configured options.
func (s *service) GetDevicePluginOptions(context.Context, *v1beta1.Empty) (*v1beta1.DevicePluginOptions, error) {
	return s.p.options(), nil
}

// ListAndWatch sends the device list now and after every change until the
// stream ends.
func (s *service) ListAndWatch(_ *v1beta1.Empty, stream v1beta1.DevicePlugin_ListAndWatchServer) error {
	p := s.p
	for {
		p.mu.Lock()
		devs := cloneDevices(p.devices)
		changed := p.changed
		p.mu.Unlock()
		if err := stream.Send(&v1beta1.ListAndWatchResponse{Devices: devs}); err != nil {
			return fmt.Errorf("sending devices: %w", err)
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-changed:
		}
	}
}

// GetPreferredAllocation answers each container request with the preferred func.
func (s *service) GetPreferredAllocation(_ context.Context, req *v1beta1.PreferredAllocationRequest) (*v1beta1.PreferredAllocationResponse, error) {
	p := s.p
	p.mu.Lock()
	f := p.preferred
	for _, r := range req.GetContainerRequests() {
		p.calls.Preferred = append(p.calls.Preferred, proto.Clone(r).(*v1beta1.ContainerPreferredAllocationRequest))
	}
	p.mu.Unlock()
	resp := &v1beta1.PreferredAllocationResponse{}
	for _, r := range req.GetContainerRequests() {
		ids, err := f(r)
		if err != nil {
			return nil, err
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &v1beta1.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// Allocate answers each container request with the allocate func, or the
// default answer.
func (s *service) Allocate(_ context.Context, req *v1beta1.AllocateRequest) (*v1beta1.AllocateResponse, error) {
	p := s.p
	p.mu.Lock()
	f := p.allocate
	health := make(map[string]string, len(p.devices))
	for _, d := range p.devices {
		health[d.ID] = d.Health
	}
	for _, r := range req.GetContainerRequests() {
		p.calls.Allocate = append(p.calls.Allocate, slices.Clone(r.GetDevicesIds()))
	}
	p.mu.Unlock()
	if f == nil {
		f = func(r *v1beta1.ContainerAllocateRequest) (*v1beta1.ContainerAllocateResponse, error) {
			return defaultAllocate(r, health)
		}
	}
	resp := &v1beta1.AllocateResponse{}
	for _, r := range req.GetContainerRequests() {
		cr, err := f(r)
		if err != nil {
			return nil, err
		}
		resp.ContainerResponses = append(resp.ContainerResponses, cr)
	}
	return resp, nil
}

// PreStartContainer records the call and answers with the pre-start func.
func (s *service) PreStartContainer(_ context.Context, req *v1beta1.PreStartContainerRequest) (*v1beta1.PreStartContainerResponse, error) {
	p := s.p
	p.mu.Lock()
	f := p.preStart
	p.calls.PreStart = append(p.calls.PreStart, slices.Clone(req.GetDevicesIds()))
	p.mu.Unlock()
	if err := f(req); err != nil {
		return nil, err
	}
	return &v1beta1.PreStartContainerResponse{}, nil
}

// EnvDevices is the variable the default Allocate answer sets to the
// comma-separated device IDs.
const EnvDevices = "FAKE_DEVICES"

// CDIKind is the CDI kind of the default Allocate answer's devices.
const CDIKind = "example.com/fake"

// defaultAllocate answers like a simple real plugin: one device node and
// one CDI device per device, plus an env var; unknown or unhealthy devices
// are refused.
func defaultAllocate(r *v1beta1.ContainerAllocateRequest, health map[string]string) (*v1beta1.ContainerAllocateResponse, error) {
	resp := &v1beta1.ContainerAllocateResponse{
		Envs:        map[string]string{EnvDevices: strings.Join(r.GetDevicesIds(), ",")},
		Annotations: map[string]string{CDIKind + "/devices": strings.Join(r.GetDevicesIds(), ",")},
	}
	for _, id := range r.GetDevicesIds() {
		h, ok := health[id]
		if !ok {
			return nil, fmt.Errorf("unknown device %s", id)
		}
		if h != v1beta1.Healthy {
			return nil, fmt.Errorf("device %s is unhealthy", id)
		}
		resp.Devices = append(resp.Devices, &v1beta1.DeviceSpec{ContainerPath: "/dev/" + id, HostPath: "/dev/" + id, Permissions: "rw"})
		resp.CdiDevices = append(resp.CdiDevices, &v1beta1.CDIDevice{Name: CDIKind + "=" + id})
	}
	return resp, nil
}

// highestIDs prefers the must-include devices, then the highest available IDs.
func highestIDs(r *v1beta1.ContainerPreferredAllocationRequest) ([]string, error) {
	size := int(r.GetAllocationSize())
	out := slices.Clone(r.GetMustIncludeDeviceIDs())
	avail := slices.Clone(r.GetAvailableDeviceIDs())
	slices.SortFunc(avail, func(a, b string) int { return cmp.Compare(b, a) })
	for _, id := range avail {
		if len(out) >= size {
			break
		}
		if !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out, nil
}

func cloneDevices(devs []*v1beta1.Device) []*v1beta1.Device {
	out := make([]*v1beta1.Device, len(devs))
	for i, d := range devs {
		out[i] = proto.Clone(d).(*v1beta1.Device)
	}
	return out
}

func removeIfExists(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", path, err)
	}
	return nil
}
