package draplugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"google.golang.org/grpc"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drapbv1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// ClaimGetter reads a ResourceClaim.
type ClaimGetter interface {
	GetResourceClaim(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaim, error)
}

// ServerOptions configures a Server.
type ServerOptions struct {
	// Driver is the DRA driver's name. Required.
	Driver string
	// RegistryDir is where the registration socket goes (the kubelet's
	// plugin registry; "" is KubeletRegistryDir). It must exist.
	RegistryDir string
	// PluginDir is where the DRA socket goes ("" is
	// <KubeletPluginsDir>/<Driver>). It must exist, and be the same path
	// inside and outside the driver's container: the kubelet dials it.
	PluginDir string
	// Claims reads the claims the kubelet asks to prepare. Required.
	Claims ClaimGetter
}

// Server serves the kubelet: plugin registration on one socket and the DRA
// service, v1 and v1beta1, on another. Prepare and unprepare calls reach the
// Plugin one at a time (claims are read before, outside that lock), as the
// kubeletplugin helper serializes them.
type Server struct {
	plugin Plugin
	claims ClaimGetter
	logger klog.Logger
	// serial serializes the calls into the plugin.
	serial sync.Mutex

	reg, dra *grpc.Server
	wg       sync.WaitGroup

	mu sync.Mutex
	// status is the kubelet's last NotifyRegistrationStatus (nil before).
	status *registerapi.RegistrationStatus
}

// StartServer listens on both sockets (replacing stale socket files) and
// serves until Stop. A server that stops serving on its own reports it to
// plugin.HandleError as a fatal error.
func StartServer(ctx context.Context, plugin Plugin, o ServerOptions) (*Server, error) {
	if o.Driver == "" {
		return nil, errors.New("DRA kubelet plugin: the driver name is required")
	}
	if o.Claims == nil {
		return nil, errors.New("DRA kubelet plugin: a claim reader is required")
	}
	if o.RegistryDir == "" {
		o.RegistryDir = KubeletRegistryDir
	}
	if o.PluginDir == "" {
		o.PluginDir = filepath.Join(KubeletPluginsDir, o.Driver)
	}
	logger := klog.LoggerWithName(klog.FromContext(ctx), "draplugin")
	s := &Server{plugin: plugin, claims: o.Claims, logger: logger}
	draPath := filepath.Join(o.PluginDir, DRASocket)
	// The DRA service first, so it answers once the kubelet learns of it.
	draLis, err := listen(draPath)
	if err != nil {
		return nil, err
	}
	s.dra = grpc.NewServer()
	drapbv1.RegisterDRAPluginServer(s.dra, v1Service{s: s})
	drapbv1beta1.RegisterDRAPluginServer(s.dra, drapbv1beta1.V1ServerWrapper{DRAPluginServer: v1Service{s: s}})
	s.serve(ctx, s.dra, draLis, "DRA gRPC server failed")

	regLis, err := listen(filepath.Join(o.RegistryDir, RegistrationSocket(o.Driver)))
	if err != nil {
		s.Stop()
		return nil, err
	}
	s.reg = grpc.NewServer()
	registerapi.RegisterRegistrationServer(s.reg, &registration{s: s, info: &registerapi.PluginInfo{
		Type:     registerapi.DRAPlugin,
		Name:     o.Driver,
		Endpoint: draPath,
		// For DRA plugins the kubelet reads the services here.
		SupportedVersions: []string{drapbv1.DRAPluginService, drapbv1beta1.DRAPluginService},
	}})
	s.serve(ctx, s.reg, regLis, "registrar gRPC server failed")
	logger.V(3).Info("Serving the kubelet", "driver", o.Driver, "endpoint", draPath, "registryDir", o.RegistryDir)
	return s, nil
}

// listen removes a stale socket at path and listens there.
func listen(path string) (net.Listener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("removing stale socket %s: %w", path, err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", path, err)
	}
	return l, nil
}

func (s *Server) serve(ctx context.Context, g *grpc.Server, l net.Listener, failed string) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		// Serve returns nil after Stop (ErrServerStopped when Stop came
		// first); anything else means the kubelet can no longer reach the
		// driver.
		if err := g.Serve(l); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.plugin.HandleError(klog.NewContext(ctx, s.logger), err, failed)
		}
	}()
}

// Stop stops both servers (their sockets are removed) and waits for them.
// Safe on a nil Server and more than once.
func (s *Server) Stop() {
	if s == nil {
		return
	}
	for _, g := range []*grpc.Server{s.reg, s.dra} {
		if g != nil {
			g.Stop()
		}
	}
	s.wg.Wait()
}

// RegistrationStatus returns the kubelet's last word on the registration,
// nil before it said any.
func (s *Server) RegistrationStatus() *registerapi.RegistrationStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.status == nil {
		return nil
	}
	return &registerapi.RegistrationStatus{PluginRegistered: s.status.PluginRegistered, Error: s.status.Error}
}

// registration is the plugin registration service. The kubelet calls
// GetInfo whenever it finds the socket (at its own start too, so a
// restarted kubelet registers the driver again) and then
// NotifyRegistrationStatus.
type registration struct {
	registerapi.UnsafeRegistrationServer
	s    *Server
	info *registerapi.PluginInfo
}

func (r *registration) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return r.info, nil
}

func (r *registration) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	r.s.mu.Lock()
	r.s.status = &registerapi.RegistrationStatus{PluginRegistered: st.GetPluginRegistered(), Error: st.GetError()}
	r.s.mu.Unlock()
	if !st.GetPluginRegistered() {
		r.s.logger.Error(nil, "The kubelet refused the DRA driver's registration", "reason", st.GetError())
		return nil, fmt.Errorf("failed registration process: %s", st.GetError())
	}
	r.s.logger.V(2).Info("Registered with the kubelet")
	return &registerapi.RegistrationStatusResponse{}, nil
}

// v1Service is the DRA gRPC service v1 (v1beta1 through its wrapper).
type v1Service struct {
	drapbv1.UnsafeDRAPluginServer
	s *Server
}

func (v v1Service) NodePrepareResources(ctx context.Context, req *drapbv1.NodePrepareResourcesRequest) (*drapbv1.NodePrepareResourcesResponse, error) {
	s := v.s
	ctx = klog.NewContext(ctx, klog.LoggerWithValues(s.logger, "method", "NodePrepareResources"))
	// Read the claims before taking the lock: API calls are the slow part.
	claims, err := s.getClaims(ctx, req.GetClaims())
	if err != nil {
		return nil, err
	}
	s.serial.Lock()
	result, err := s.plugin.PrepareResourceClaims(ctx, claims)
	s.serial.Unlock()
	if err != nil {
		return nil, fmt.Errorf("prepare resource claims: %w", err)
	}
	resp := &drapbv1.NodePrepareResourcesResponse{Claims: make(map[string]*drapbv1.NodePrepareResourceResponse, len(result))}
	for uid, r := range result {
		out := &drapbv1.NodePrepareResourceResponse{Error: errorString(r.Err)}
		for _, d := range r.Devices {
			out.Devices = append(out.Devices, &drapbv1.Device{
				RequestNames: baseRequestNames(d.Requests),
				PoolName:     d.PoolName,
				DeviceName:   d.DeviceName,
				CdiDeviceIds: d.CDIDeviceIDs,
				ShareId:      (*string)(d.ShareID),
			})
		}
		resp.Claims[string(uid)] = out
	}
	return resp, nil
}

// getClaims reads the claims the kubelet names; each must be allocated and
// still the claim the kubelet knows (same UID): otherwise the call fails and
// the kubelet retries later, as with the kubeletplugin helper.
func (s *Server) getClaims(ctx context.Context, reqs []*drapbv1.Claim) ([]*resourceapi.ResourceClaim, error) {
	out := make([]*resourceapi.ResourceClaim, 0, len(reqs))
	for _, r := range reqs {
		c, err := s.claims.GetResourceClaim(ctx, r.GetNamespace(), r.GetName())
		if err != nil {
			return nil, fmt.Errorf("retrieve claim %s/%s: %w", r.GetNamespace(), r.GetName(), err)
		}
		if c.Status.Allocation == nil {
			return nil, fmt.Errorf("claim %s/%s not allocated", r.GetNamespace(), r.GetName())
		}
		if c.UID != types.UID(r.GetUid()) {
			return nil, fmt.Errorf("claim %s/%s got replaced", r.GetNamespace(), r.GetName())
		}
		out = append(out, c)
	}
	return out, nil
}

func (v v1Service) NodeUnprepareResources(ctx context.Context, req *drapbv1.NodeUnprepareResourcesRequest) (*drapbv1.NodeUnprepareResourcesResponse, error) {
	s := v.s
	ctx = klog.NewContext(ctx, klog.LoggerWithValues(s.logger, "method", "NodeUnprepareResources"))
	claims := make([]NamespacedObject, 0, len(req.GetClaims()))
	for _, c := range req.GetClaims() {
		claims = append(claims, NamespacedObject{UID: types.UID(c.GetUid()), NamespacedName: types.NamespacedName{Namespace: c.GetNamespace(), Name: c.GetName()}})
	}
	s.serial.Lock()
	result, err := s.plugin.UnprepareResourceClaims(ctx, claims)
	s.serial.Unlock()
	if err != nil {
		return nil, fmt.Errorf("unprepare resource claims: %w", err)
	}
	resp := &drapbv1.NodeUnprepareResourcesResponse{Claims: make(map[string]*drapbv1.NodeUnprepareResourceResponse, len(result))}
	for uid, err := range result {
		resp.Claims[string(uid)] = &drapbv1.NodeUnprepareResourceResponse{Error: errorString(err)}
	}
	return resp, nil
}

func errorString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// baseRequestNames reduces "request/subrequest" to "request": the kubelet
// matches devices to a container's claim requests by request name.
func baseRequestNames(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i], _, _ = strings.Cut(n, "/")
	}
	return out
}
