package kubeletsim

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/klog/v2"
	"k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// resourceEntry is what the simulator knows about one resource. Guarded by
// Kubelet.mu.
type resourceEntry struct {
	name string
	// devices: device ID -> the device as last reported (health included).
	// The simulator owns these copies.
	devices map[string]*v1beta1.Device
	// ep is the registered endpoint; nil once it stopped (stream ended,
	// restart, Stop).
	ep *endpoint
	// opts are the options the current or last endpoint answered.
	opts *v1beta1.DevicePluginOptions
	// endpointName is the socket file name of the current or last endpoint.
	endpointName string
	// stoppedAt is when the endpoint stopped; zero while connected.
	stoppedAt time.Time
	// epoch changes whenever the endpoint changes, so a grace-period timer
	// armed for an older endpoint does nothing.
	epoch uint64
	// cancelRemoval stops the pending grace-period timer, if any.
	cancelRemoval context.CancelFunc
	// registrations counts successful registrations for this resource.
	registrations int
}

// endpoint is one connection to a registered plugin.
type endpoint struct {
	resource string
	socket   string
	conn     *grpc.ClientConn
	client   v1beta1.DevicePluginClient
	opts     *v1beta1.DevicePluginOptions
	// cancel ends the endpoint's ListAndWatch stream; its goroutine then
	// closes conn.
	cancel context.CancelFunc
}

// registrar serves the Registration service for one generation.
type registrar struct {
	v1beta1.UnimplementedRegistrationServer
	k   *Kubelet
	gen *generation
}

// Register validates a plugin's registration, connects back to it and starts
// following its ListAndWatch stream. It answers only once the plugin's
// options were read, as the kubelet does.
func (r *registrar) Register(ctx context.Context, req *v1beta1.RegisterRequest) (*v1beta1.Empty, error) {
	k := r.k
	logger := k.logger.WithValues("resource", req.GetResourceName(), "endpoint", req.GetEndpoint())
	logger.V(2).Info("Got registration request from device plugin")
	if err := validateRegistration(req); err != nil {
		logger.Info("Rejected device plugin registration", "err", err)
		return nil, err
	}

	ep, err := k.connect(ctx, req)
	if err != nil {
		logger.Info("Connecting to device plugin failed", "err", err)
		return nil, err
	}
	// The kubelet uses the options GetDevicePluginOptions answers and ignores
	// the ones in the request; a plugin sending different ones has a bug.
	if k.opts.Strict && !proto.Equal(optionsOrEmpty(req.GetOptions()), optionsOrEmpty(ep.opts)) {
		_ = ep.conn.Close()
		err := fmt.Errorf("registration options {%v} differ from GetDevicePluginOptions {%v}", req.GetOptions(), ep.opts)
		logger.Info("Rejected device plugin registration", "err", err)
		return nil, err
	}

	// The stream's cancel must be in place before ep is published: a
	// later registration or a restart cancels it.
	streamCtx, cancel := context.WithCancel(r.gen.ctx)
	ep.cancel = cancel

	k.mu.Lock()
	e := k.resources[req.ResourceName]
	if e == nil {
		e = &resourceEntry{name: req.ResourceName, devices: map[string]*v1beta1.Device{}}
		k.resources[req.ResourceName] = e
	}
	old := e.ep
	e.ep = ep
	e.opts = ep.opts
	e.endpointName = req.Endpoint
	e.stoppedAt = time.Time{}
	e.epoch++
	e.registrations++
	if e.cancelRemoval != nil {
		e.cancelRemoval()
		e.cancelRemoval = nil
	}
	k.broadcastLocked()
	k.mu.Unlock()

	// The kubelet keeps one endpoint per resource: the newest registration
	// wins and the previous connection is closed.
	if old != nil {
		old.cancel()
	}
	if !r.gen.group.Go(func() { k.watch(streamCtx, ep) }) {
		cancel()
		_ = ep.conn.Close()
		k.endpointEnded(ep)
		return nil, errors.New("kubelet is shutting down")
	}
	logger.V(2).Info("Registered device plugin", "preStartRequired", ep.opts.GetPreStartRequired(),
		"getPreferredAllocationAvailable", ep.opts.GetGetPreferredAllocationAvailable())
	return &v1beta1.Empty{}, nil
}

func optionsOrEmpty(o *v1beta1.DevicePluginOptions) *v1beta1.DevicePluginOptions {
	if o == nil {
		return &v1beta1.DevicePluginOptions{}
	}
	return o
}

// validateRegistration applies the kubelet's checks: supported version,
// extended resource name, and an endpoint that names a file in Dir.
func validateRegistration(req *v1beta1.RegisterRequest) error {
	if !slices.Contains(v1beta1.SupportedVersions[:], req.Version) {
		return fmt.Errorf("requested API version %q is not supported by kubelet. Supported version is %q", req.Version, v1beta1.SupportedVersions)
	}
	if !isExtendedResourceName(req.ResourceName) {
		return fmt.Errorf("the ResourceName %q is invalid", req.ResourceName)
	}
	ep := req.Endpoint
	if ep == "" || ep == "." || ep == ".." || strings.ContainsRune(ep, filepath.Separator) || ep == KubeletSocketName {
		return fmt.Errorf("the endpoint %q is invalid: want the plugin socket's file name inside the device-plugin directory", ep)
	}
	return nil
}

// isExtendedResourceName mirrors the kubelet's v1helper.IsExtendedResourceName:
// a domain-prefixed name outside *kubernetes.io/ that, prefixed with
// "requests.", is a qualified name.
func isExtendedResourceName(name string) bool {
	if !strings.Contains(name, "/") || strings.Contains(name, "kubernetes.io/") || strings.HasPrefix(name, "requests.") {
		return false
	}
	return len(validation.IsQualifiedName("requests."+name)) == 0
}

// connect dials the plugin's socket and reads its options.
func (k *Kubelet) connect(ctx context.Context, req *v1beta1.RegisterRequest) (*endpoint, error) {
	socket := filepath.Join(k.opts.Dir, req.Endpoint)
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("failed to dial device plugin: %w", err)
	}
	client := v1beta1.NewDevicePluginClient(conn)
	ctx, cancel := context.WithTimeout(ctx, k.opts.DialTimeout)
	defer cancel()
	opts, err := client.GetDevicePluginOptions(ctx, &v1beta1.Empty{})
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("failed to get device plugin options from %s: %w", socket, err)
	}
	return &endpoint{resource: req.ResourceName, socket: socket, conn: conn, client: client, opts: opts}, nil
}

// watch follows ep's ListAndWatch stream until it ends, then stops the
// endpoint (if it is still the resource's current one) and closes the
// connection.
func (k *Kubelet) watch(ctx context.Context, ep *endpoint) {
	logger := klog.FromContext(ctx).WithValues("resource", ep.resource, "socket", ep.socket)
	defer func() {
		_ = ep.conn.Close()
	}()
	defer k.endpointEnded(ep)
	stream, err := ep.client.ListAndWatch(ctx, &v1beta1.Empty{})
	if err != nil {
		logger.Info("ListAndWatch could not start", "err", err)
		return
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			if ctx.Err() == nil {
				logger.Info("ListAndWatch ended", "err", err)
			}
			return
		}
		logger.V(4).Info("Device plugin pushed devices", "devices", len(resp.GetDevices()))
		k.updateDevices(ep, resp.GetDevices())
	}
}

// updateDevices replaces the resource's device list with a ListAndWatch
// response, when ep is still the resource's endpoint.
func (k *Kubelet) updateDevices(ep *endpoint, devs []*v1beta1.Device) {
	k.mu.Lock()
	defer k.mu.Unlock()
	e := k.resources[ep.resource]
	if e == nil || e.ep != ep {
		return
	}
	e.devices = make(map[string]*v1beta1.Device, len(devs))
	for _, d := range devs {
		e.devices[d.GetID()] = proto.Clone(d).(*v1beta1.Device)
	}
	k.markDirtyLocked(e.name)
}

// endpointEnded stops ep when it is still its resource's endpoint: the
// plugin went away.
func (k *Kubelet) endpointEnded(ep *endpoint) {
	k.mu.Lock()
	defer k.mu.Unlock()
	e := k.resources[ep.resource]
	if e == nil || e.ep != ep {
		return
	}
	k.logger.V(2).Info("Device plugin endpoint stopped, devices are unhealthy", "resource", ep.resource)
	k.stopEndpointLocked(e)
}

// stopEndpointLocked disconnects e's endpoint, marks all its devices
// unhealthy (as the kubelet's markResourceUnhealthy) and arms the removal
// after the grace period. k.mu must be held.
func (k *Kubelet) stopEndpointLocked(e *resourceEntry) {
	if e.ep != nil {
		if e.ep.cancel != nil {
			e.ep.cancel()
		}
		e.ep = nil
	}
	for id, d := range e.devices {
		if d.GetHealth() != v1beta1.Unhealthy {
			u := proto.Clone(d).(*v1beta1.Device)
			u.Health = v1beta1.Unhealthy
			e.devices[id] = u
		}
	}
	e.stoppedAt = k.clock.Now()
	e.epoch++
	if e.cancelRemoval != nil {
		e.cancelRemoval()
		e.cancelRemoval = nil
	}
	k.markDirtyLocked(e.name)
	if k.closing || k.lifeCtx == nil {
		return
	}
	ctx, cancel := context.WithCancel(k.lifeCtx)
	e.cancelRemoval = cancel
	name, epoch, grace := e.name, e.epoch, k.opts.StopGracePeriod
	started := k.life.Go(func() {
		t := k.clock.NewTimer(grace)
		defer t.Stop()
		select {
		case <-t.C():
			k.expire(name, epoch)
		case <-ctx.Done():
		}
	})
	if !started {
		cancel()
	}
}

// expire removes a resource whose endpoint stayed stopped for the grace
// period.
func (k *Kubelet) expire(name string, epoch uint64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	e := k.resources[name]
	if e == nil || e.epoch != epoch || e.ep != nil {
		return
	}
	k.logger.V(2).Info("Removed resource after its device plugin stayed away", "resource", name, "grace", k.opts.StopGracePeriod)
	if e.cancelRemoval != nil {
		e.cancelRemoval()
	}
	delete(k.resources, name)
	k.markDirtyLocked(name)
}
