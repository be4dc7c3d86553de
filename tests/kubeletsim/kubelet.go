package kubeletsim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/utils/clock"
)

const (
	// KubeletSocketName is the registration socket's file name inside Options.Dir.
	KubeletSocketName = "kubelet.sock"
	// DefaultStopGracePeriod is how long a resource whose plugin went away keeps
	// its (unhealthy) devices before it is removed; the kubelet's
	// endpointStopGracePeriod.
	DefaultStopGracePeriod = 5 * time.Minute
	// DefaultRPCTimeout bounds each call to a plugin; the kubelet uses the same
	// bound for PreStartContainer (KubeletPreStartContainerRPCTimeoutInSecs).
	DefaultRPCTimeout = v1beta1.KubeletPreStartContainerRPCTimeoutInSecs * time.Second
	// DefaultDialTimeout bounds connecting to a registering plugin and reading
	// its options; the kubelet's dial timeout.
	DefaultDialTimeout = 10 * time.Second

	// maxSocketPath is the longest path a unix socket accepts (sun_path is 108
	// bytes including the terminating NUL).
	maxSocketPath = 107
)

var (
	// ErrAlreadyStarted is returned by Start when the simulator was started before.
	ErrAlreadyStarted = errors.New("kubelet simulator already started")
	// ErrNotRunning is returned by Restart when the simulator is not serving.
	ErrNotRunning = errors.New("kubelet simulator is not running")
)

// Options configures a Kubelet. Only Dir is required.
type Options struct {
	// NodeName names the simulated node in logs.
	NodeName string
	// Dir is the device-plugin directory (the kubelet's
	// /var/lib/kubelet/device-plugins). kubelet.sock is served here and
	// plugins' endpoints are resolved against it. Created when missing.
	Dir string
	// PodResourcesSocket is the path of the PodResources v1 socket. Empty
	// means the PodResources service is not served.
	PodResourcesSocket string
	// KeepPluginSockets keeps other sockets in Dir on Start and Restart. By
	// default they are removed, as the kubelet's device manager does.
	KeepPluginSockets bool
	// StopGracePeriod is how long a resource keeps its devices (all unhealthy)
	// after its plugin's ListAndWatch stream ended or the simulator restarted.
	// Zero means DefaultStopGracePeriod.
	StopGracePeriod time.Duration
	// RPCTimeout bounds each GetPreferredAllocation, Allocate and
	// PreStartContainer call. Zero means DefaultRPCTimeout.
	RPCTimeout time.Duration
	// DialTimeout bounds connecting back to a registering plugin. Zero means
	// DefaultDialTimeout.
	DialTimeout time.Duration
	// Strict rejects plugin answers the kubelet silently tolerates: options
	// in the registration request that differ from GetDevicePluginOptions, a
	// preferred allocation of the wrong size, with duplicates or outside the
	// available devices, and an Allocate response with other than exactly one
	// container response. Use it to catch plugin bugs; leave it off to behave
	// like the kubelet, which falls back to its own pick.
	Strict bool
	// Rand, when set, shuffles the devices the simulator picks on its own (no
	// preferred allocation, or to complete one), as the kubelet's unordered
	// sets do. Nil picks in device-ID order, which keeps tests reproducible.
	// Only used under the admission lock, so it need not be goroutine-safe.
	Rand *rand.Rand
	// PodSyncDelay is how long after a Restart PodResources List and Get
	// know no pod, as a restarted kubelet lists none until its pod sources
	// (the API server) have synced; allocations are kept all along. The real
	// kubelet v1.36 took 0.9 s on the test bed's real node (issue 26). Zero
	// serves the allocations at once.
	PodSyncDelay time.Duration
	// Clock drives the stop grace period and PodSyncDelay. Nil means the
	// real clock.
	Clock clock.Clock
	// BeforeAllocate, when set, is called by Allocate once the devices are
	// chosen and before the plugin's Allocate is called, with the admission
	// lock held: a test hook to act mid-Allocate (restart the simulator, say).
	// It may block; ctx is Allocate's.
	BeforeAllocate func(ctx context.Context, pod PodRef, resource string, devices []string)
	// PluginRegistryDir is the kubelet's plugin registration directory
	// (/var/lib/kubelet/plugins_registry): DRA drivers put their registration
	// socket there and the simulator registers them (see PrepareClaims).
	// Empty: the simulator speaks no DRA.
	PluginRegistryDir string
	// Claims reads resource claims for PrepareClaims.
	Claims ClaimGetter
}

// Kubelet simulates one node's kubelet device manager. Create it with New.
// All methods are safe for concurrent use. Start, Restart and Stop are
// serialized with each other.
type Kubelet struct {
	opts   Options
	clock  clock.Clock
	socket string // absolute path of kubelet.sock

	// lifeMu serializes Start, Restart and Stop and guards the fields below it.
	lifeMu  sync.Mutex
	started bool
	stopped bool
	cancel  context.CancelFunc // ends the simulator's lifetime context
	gen     *generation        // the current serving generation; nil when not serving
	life    *group             // notifier and grace-period goroutines

	// admitMu serializes Allocate and Release: the kubelet admits one pod at
	// a time, and the device pick must not race another admission.
	admitMu sync.Mutex

	// mu guards the state below.
	mu sync.Mutex
	// closing is set by Stop; no new grace-period goroutines start after it.
	closing bool
	// lifeCtx is the simulator's lifetime context (nil before Start).
	lifeCtx context.Context
	// logger is set by Start (also under lifeMu) and read by goroutines
	// started after it.
	logger logr.Logger
	// resources: resource name -> what the kubelet knows about it.
	resources map[string]*resourceEntry
	// allocs: (pod UID, container, resource) -> admitted allocation.
	allocs map[allocKey]*allocRecord
	// pods: pod UID -> the pod's identity, for pods holding allocations.
	pods map[types.UID]PodRef
	// inUse: resource name -> device ID -> pod UID holding it.
	inUse map[string]map[string]types.UID
	// podsUnknownUntil is when a restarted simulator's PodResources lists
	// pods again (Options.PodSyncDelay).
	podsUnknownUntil time.Time
	// reuse: pod UID -> resource -> device IDs the pod's regular init
	// containers hold that its later containers may take (AllocateInit).
	reuse map[types.UID]map[string]map[string]bool
	// changed is closed and replaced on every state change (waiters' wake-up).
	changed chan struct{}
	// dirty: resource name -> {} for resources whose device list changed and
	// whose OnChange callbacks have not run yet.
	dirty map[string]struct{}
	// dirtySignal wakes the notifier goroutine (capacity 1, never blocks).
	dirtySignal chan struct{}
	// callbacks registered with OnChange, called in registration order.
	callbacks []func(resource string, devs []*v1beta1.Device)
	// dra is the DRA side: registered drivers and prepared claims.
	dra draState
}

// New returns a simulator configured by opts. It does nothing until Start.
func New(opts Options) *Kubelet {
	if opts.StopGracePeriod == 0 {
		opts.StopGracePeriod = DefaultStopGracePeriod
	}
	if opts.RPCTimeout == 0 {
		opts.RPCTimeout = DefaultRPCTimeout
	}
	if opts.DialTimeout == 0 {
		opts.DialTimeout = DefaultDialTimeout
	}
	clk := opts.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Kubelet{
		opts:        opts,
		clock:       clk,
		socket:      filepath.Join(opts.Dir, KubeletSocketName),
		resources:   make(map[string]*resourceEntry),
		allocs:      make(map[allocKey]*allocRecord),
		pods:        make(map[types.UID]PodRef),
		inUse:       make(map[string]map[string]types.UID),
		reuse:       make(map[types.UID]map[string]map[string]bool),
		changed:     make(chan struct{}),
		dirty:       make(map[string]struct{}),
		dirtySignal: make(chan struct{}, 1),
		dra: draState{
			drivers: map[string]*draDriver{},
			claims:  map[types.UID]*PreparedClaim{},
			pods:    map[types.UID]*draPod{},
		},
	}
}

// SocketPath returns the path of the registration socket (Dir/kubelet.sock).
func (k *Kubelet) SocketPath() string { return k.socket }

// Start validates the options, cleans Dir of sockets (unless
// KeepPluginSockets), and serves Registration on Dir/kubelet.sock and
// PodResources on Options.PodResourcesSocket. The simulator runs until ctx is
// cancelled or Stop is called; either way every goroutine it started ends.
// ctx also carries the logger. Start can be called once.
func (k *Kubelet) Start(ctx context.Context) error {
	k.lifeMu.Lock()
	defer k.lifeMu.Unlock()
	if k.started {
		return ErrAlreadyStarted
	}
	if err := k.validate(); err != nil {
		return fmt.Errorf("starting kubelet simulator: %w", err)
	}
	if err := os.MkdirAll(k.opts.Dir, 0o750); err != nil {
		return fmt.Errorf("creating device-plugin directory %s: %w", k.opts.Dir, err)
	}
	logger := klog.FromContext(ctx).WithValues("node", k.opts.NodeName)
	lifeCtx, cancel := context.WithCancel(klog.NewContext(ctx, logger))
	k.started = true
	k.cancel = cancel
	k.life = &group{}
	k.mu.Lock()
	k.logger = logger
	k.lifeCtx = lifeCtx
	k.mu.Unlock()
	k.life.Go(func() { k.notify(lifeCtx) })

	if err := k.startServingLocked(lifeCtx); err != nil {
		k.stopLocked()
		return err
	}
	if err := k.startDRA(lifeCtx); err != nil {
		k.stopLocked()
		return err
	}
	k.logger.V(2).Info("Kubelet simulator started", "socket", k.socket, "podResourcesSocket", k.opts.PodResourcesSocket)
	return nil
}

// Restart simulates a kubelet restart: it stops serving (plugin connections
// close), forgets every device (resources stay, with no devices, until their
// plugin registers again or the grace period ends), removes the sockets in
// Dir as a starting kubelet does, and serves again on a new kubelet.sock.
// Allocations are kept. ctx carries the logger; the restarted simulator
// still lives as long as the ctx given to Start.
func (k *Kubelet) Restart(ctx context.Context) error {
	k.lifeMu.Lock()
	defer k.lifeMu.Unlock()
	if !k.started || k.stopped || k.gen == nil {
		return ErrNotRunning
	}
	logger := klog.FromContext(ctx).WithValues("node", k.opts.NodeName)
	logger.V(2).Info("Restarting kubelet simulator")
	k.stopServingLocked()

	k.mu.Lock()
	lifeCtx := k.lifeCtx
	k.podsUnknownUntil = k.clock.Now().Add(k.opts.PodSyncDelay)
	for _, e := range k.resources {
		// As the kubelet reads its checkpoint: the resource is known, its
		// endpoint is stopped and its device lists are empty.
		e.devices = map[string]*v1beta1.Device{}
		k.stopEndpointLocked(e)
	}
	k.mu.Unlock()

	if err := lifeCtx.Err(); err != nil {
		return fmt.Errorf("restarting kubelet simulator: %w", err)
	}
	// A restarted kubelet's plugin watcher finds the DRA drivers' sockets
	// again and registers them anew; prepared claims are kept, as in the
	// kubelet's checkpoint.
	k.closeDrivers()
	if err := k.startServingLocked(lifeCtx); err != nil {
		return fmt.Errorf("restarting kubelet simulator: %w", err)
	}
	return nil
}

// Stop stops serving, closes plugin connections, waits for every goroutine
// the simulator started and removes its sockets. The state (resources and
// allocations) stays readable. Stop can be called without Start, more than
// once and concurrently.
func (k *Kubelet) Stop() {
	k.lifeMu.Lock()
	defer k.lifeMu.Unlock()
	k.stopLocked()
}

// stopLocked is Stop with lifeMu held.
func (k *Kubelet) stopLocked() {
	if k.stopped {
		return
	}
	k.stopped = true
	if !k.started {
		return
	}
	k.stopServingLocked()
	k.mu.Lock()
	k.closing = true
	// Streams ended with the generation, so endpoints are normally stopped
	// already; a registration that raced the shutdown may have left one.
	for _, e := range k.resources {
		if e.ep != nil {
			k.stopEndpointLocked(e)
		}
	}
	k.mu.Unlock()
	k.cancel()
	k.life.CloseAndWait()
	k.logger.V(2).Info("Kubelet simulator stopped")
}

func (k *Kubelet) validate() error {
	if k.opts.Dir == "" {
		return errors.New("options: Dir is required")
	}
	if !filepath.IsAbs(k.opts.Dir) {
		return fmt.Errorf("options: Dir %q must be an absolute path", k.opts.Dir)
	}
	if len(k.socket) > maxSocketPath {
		return fmt.Errorf("options: socket path %q is %d bytes, a unix socket allows %d", k.socket, len(k.socket), maxSocketPath)
	}
	if p := k.opts.PodResourcesSocket; p != "" {
		if !filepath.IsAbs(p) {
			return fmt.Errorf("options: PodResourcesSocket %q must be an absolute path", p)
		}
		if len(p) > maxSocketPath {
			return fmt.Errorf("options: socket path %q is %d bytes, a unix socket allows %d", p, len(p), maxSocketPath)
		}
		if p == k.socket {
			return fmt.Errorf("options: PodResourcesSocket must differ from %s", k.socket)
		}
	}
	return nil
}

// generation is one period of serving, from Start or Restart to the next
// Restart or Stop. Its context ends plugin streams and RPC servers.
type generation struct {
	ctx    context.Context
	cancel context.CancelFunc
	group  group
}

// startServingLocked cleans Dir and serves both gRPC services in a new
// generation. lifeMu must be held.
func (k *Kubelet) startServingLocked(lifeCtx context.Context) error {
	if err := k.cleanDir(); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(lifeCtx)
	gen := &generation{ctx: ctx, cancel: cancel}

	regLis, err := net.Listen("unix", k.socket)
	if err != nil {
		cancel()
		return fmt.Errorf("listening on %s: %w", k.socket, err)
	}
	regServer := grpc.NewServer()
	v1beta1.RegisterRegistrationServer(regServer, &registrar{k: k, gen: gen})
	k.serve(gen, regServer, regLis)

	if p := k.opts.PodResourcesSocket; p != "" {
		if err := removeIfExists(p); err != nil {
			k.gen = gen
			k.stopServingLocked()
			return err
		}
		prLis, err := net.Listen("unix", p)
		if err != nil {
			k.gen = gen
			k.stopServingLocked()
			return fmt.Errorf("listening on %s: %w", p, err)
		}
		prServer := grpc.NewServer()
		podresourcesv1.RegisterPodResourcesListerServer(prServer, &podResourcesServer{k: k})
		k.serve(gen, prServer, prLis)
	}
	k.gen = gen
	return nil
}

// serve runs srv on lis in gen until gen's context ends.
func (k *Kubelet) serve(gen *generation, srv *grpc.Server, lis net.Listener) {
	started := gen.group.Go(func() {
		// Serve returns once Stop below closes the listener.
		if err := srv.Serve(lis); err != nil {
			k.logger.Error(err, "Serving gRPC failed", "socket", lis.Addr().String())
		}
	})
	if !started {
		_ = lis.Close()
		return
	}
	gen.group.Go(func() {
		<-gen.ctx.Done()
		// Stop closes the listener, which removes its socket file, and
		// cancels open streams.
		srv.Stop()
	})
}

// stopServingLocked ends the current generation and waits for its
// goroutines: servers, plugin streams. lifeMu must be held.
func (k *Kubelet) stopServingLocked() {
	gen := k.gen
	if gen == nil {
		return
	}
	k.gen = nil
	gen.cancel()
	gen.group.CloseAndWait()
	// The listeners removed their files when closed; make sure nothing stale
	// is left for plugins to dial.
	for _, p := range []string{k.socket, k.opts.PodResourcesSocket} {
		if p == "" {
			continue
		}
		if err := removeIfExists(p); err != nil {
			k.logger.Error(err, "Removing socket failed", "socket", p)
		}
	}
}

// cleanDir removes kubelet.sock and, unless KeepPluginSockets, every other
// socket in Dir, as the kubelet's CleanupPluginDirectory does on start.
// Directories and regular files are left alone.
func (k *Kubelet) cleanDir() error {
	if err := removeIfExists(k.socket); err != nil {
		return err
	}
	if k.opts.KeepPluginSockets {
		return nil
	}
	entries, err := os.ReadDir(k.opts.Dir)
	if err != nil {
		return fmt.Errorf("cleaning device-plugin directory %s: %w", k.opts.Dir, err)
	}
	var errs []error
	for _, de := range entries {
		if de.Type()&os.ModeSocket == 0 {
			continue
		}
		if err := removeIfExists(filepath.Join(k.opts.Dir, de.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cleaning device-plugin directory %s: %w", k.opts.Dir, err)
	}
	return nil
}

func removeIfExists(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", path, err)
	}
	return nil
}

// group tracks goroutines that must end before their owner stops. Once
// closed it refuses new goroutines, so Go never races CloseAndWait.
type group struct {
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

// Go runs f in a new goroutine unless the group is closed. It reports
// whether f was started.
func (g *group) Go(f func()) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		f()
	}()
	return true
}

// CloseAndWait refuses new goroutines and waits for the running ones.
func (g *group) CloseAndWait() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	g.wg.Wait()
}
