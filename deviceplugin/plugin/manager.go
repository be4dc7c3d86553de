package plugin

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpufrac/gpufrac/deviceplugin/resource"
)

// Manager keeps one Server per resource, registered with the kubelet:
// Apply sets the resources to serve, Run keeps them registered when the
// kubelet restarts (it recreates kubelet.sock and wipes plugin sockets).
type Manager struct {
	dir           string
	observer      Observer
	retryInterval time.Duration

	mu      sync.Mutex
	ctx     context.Context    // Run's context; servers live as long as it
	servers map[string]*Server // resource name -> endpoint
	pending map[string]bool    // resource name -> registration still to do
	done    chan struct{}      // closed when the loop started by Start ends
}

// NewManager returns a manager for the kubelet device-plugin directory dir.
func NewManager(dir string, obs Observer) *Manager {
	return &Manager{
		dir:           dir,
		observer:      obs,
		retryInterval: 2 * time.Second,
		servers:       map[string]*Server{},
		pending:       map[string]bool{},
	}
}

// Resources returns the names of the resources served, sorted.
func (m *Manager) Resources() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	names := make([]string, 0, len(m.servers))
	for n := range m.servers {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Registered tells whether every served resource is registered with the kubelet.
func (m *Manager) Registered() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.pending) == 0 && len(m.servers) > 0
}

// Apply makes the served set equal to resources: new resources get an
// endpoint and a registration; kept ones get their device list replaced in
// place (ListAndWatch pushes it, no re-registration needed); resources no
// longer wanted first advertise zero devices, so the kubelet drops their
// capacity at once, then stop. Apply must be called after Start.
func (m *Manager) Apply(ctx context.Context, resources []resource.Resource) error {
	logger := klog.FromContext(ctx)
	want := map[string]resource.Resource{}
	for _, r := range resources {
		if _, dup := want[r.Name()]; dup {
			return fmt.Errorf("applying resources: %s listed twice", r.Name())
		}
		want[r.Name()] = r
	}
	m.mu.Lock()
	runCtx := m.ctx
	var gone []*Server
	for name, srv := range m.servers {
		if _, ok := want[name]; !ok {
			gone = append(gone, srv)
			delete(m.servers, name)
			delete(m.pending, name)
		}
	}
	var started []string
	var errs []error
	for name, r := range want {
		if srv, ok := m.servers[name]; ok {
			srv.SetResource(r)
			continue
		}
		srv := NewServer(m.dir, r, m.observer)
		if runCtx == nil {
			errs = append(errs, fmt.Errorf("starting %s: manager is not started", name))
			continue
		}
		if err := srv.Start(runCtx); err != nil {
			errs = append(errs, err)
			continue
		}
		m.servers[name] = srv
		m.pending[name] = true
		started = append(started, name)
	}
	m.mu.Unlock()

	for _, srv := range gone {
		logger.Info("Withdrawing resource", "resource", srv.ResourceName())
		srv.SetResource(emptyResource{name: srv.ResourceName()})
		waitFlushed(ctx, srv, time.Second)
		srv.Stop()
	}
	if len(started) > 0 {
		m.registerPending(ctx)
	}
	if len(errs) > 0 {
		return fmt.Errorf("applying resources: %v", errs)
	}
	return nil
}

// UpdateAll makes every endpoint resend its device list (health changed).
func (m *Manager) UpdateAll() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, srv := range m.servers {
		srv.Update()
	}
}

// Start begins serving: it watches the kubelet directory until ctx ends,
// restarting and re-registering every endpoint when kubelet.sock is created
// again and retrying failed registrations. When ctx ends every endpoint
// stops; Wait returns after that.
func (m *Manager) Start(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching %s: %w", m.dir, err)
	}
	if err := w.Add(m.dir); err != nil {
		w.Close()
		return fmt.Errorf("watching %s: %w", m.dir, err)
	}
	m.mu.Lock()
	m.ctx = ctx
	m.done = make(chan struct{})
	m.mu.Unlock()
	go m.loop(ctx, w)
	return nil
}

// Wait blocks until the manager started by Start has stopped.
func (m *Manager) Wait() {
	m.mu.Lock()
	done := m.done
	m.mu.Unlock()
	if done != nil {
		<-done
	}
}

func (m *Manager) loop(ctx context.Context, w *fsnotify.Watcher) {
	logger := klog.FromContext(ctx)
	defer close(m.done)
	defer m.stopAll()
	defer w.Close()
	kubeletSock := filepath.Join(m.dir, filepath.Base(pluginapi.KubeletSocket))
	// Registration retries every retryInterval, up to 10 % longer at
	// random so a fleet's agents do not knock on their kubelets in step.
	backoff := wait.Backoff{Duration: m.retryInterval, Jitter: 0.1}
	retry := time.NewTimer(backoff.Step())
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.Events:
			if !ok {
				logger.Error(nil, "Kubelet directory watch closed; restarts are detected by registration retries only")
				w.Events = nil
				continue
			}
			if ev.Name == kubeletSock && ev.Has(fsnotify.Create) {
				logger.Info("Kubelet restarted; re-registering device plugins")
				if ro, ok := m.observer.(RestartObserver); ok {
					ro.KubeletRestarted()
				}
				m.restartAll(ctx)
			}
		case err, ok := <-w.Errors:
			if ok {
				logger.Error(err, "Watching the kubelet directory")
			}
		case <-retry.C:
			m.registerPending(ctx)
			retry.Reset(backoff.Step())
		}
	}
}

// restartAll gives every endpoint a fresh socket (the kubelet removed the
// old ones) and registers it again.
func (m *Manager) restartAll(ctx context.Context) {
	m.mu.Lock()
	for name, srv := range m.servers {
		srv.Stop()
		if err := srv.Start(ctx); err != nil {
			klog.FromContext(ctx).Error(err, "Restarting device plugin endpoint", "resource", name)
		}
		m.pending[name] = true
	}
	m.mu.Unlock()
	m.registerPending(ctx)
}

// registerPending registers every endpoint not yet registered. Without
// kubelet.sock there is no kubelet to register with, and trying would block
// for the whole registration timeout per endpoint (gRPC waits for the
// socket to accept), delaying Apply and the loop's reaction to the kubelet
// starting. The kubelet creates kubelet.sock when it starts; the watch then
// registers everything, and the retry tick covers a missed event.
func (m *Manager) registerPending(ctx context.Context) {
	if _, err := os.Stat(filepath.Join(m.dir, filepath.Base(pluginapi.KubeletSocket))); err != nil {
		klog.FromContext(ctx).V(4).Info("No kubelet socket yet; registration waits for it", "err", err)
		return
	}
	m.mu.Lock()
	var todo []*Server
	for name := range m.pending {
		todo = append(todo, m.servers[name])
	}
	m.mu.Unlock()
	for _, srv := range todo {
		if err := srv.Register(ctx); err != nil {
			klog.FromContext(ctx).V(2).Info("Registration failed; will retry", "resource", srv.ResourceName(), "err", err)
			continue
		}
		m.mu.Lock()
		if m.servers[srv.ResourceName()] == srv {
			delete(m.pending, srv.ResourceName())
		}
		m.mu.Unlock()
	}
}

func (m *Manager) stopAll() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for name, srv := range m.servers {
		srv.Stop()
		delete(m.servers, name)
	}
	m.pending = map[string]bool{}
	m.ctx = nil
}

// waitFlushed waits up to limit (or until ctx ends) for srv to have sent
// its last device list.
func waitFlushed(ctx context.Context, srv *Server, limit time.Duration) {
	_ = wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, limit, true, func(context.Context) (bool, error) {
		return srv.Flushed(), nil
	})
}

// emptyResource advertises no devices; a withdrawn resource sends it last.
type emptyResource struct{ name string }

func (e emptyResource) Name() string                 { return e.name }
func (e emptyResource) Devices() []*pluginapi.Device { return nil }
func (e emptyResource) Preferred(context.Context, []string, []string, int) ([]string, error) {
	return nil, fmt.Errorf("resource %s is withdrawn", e.name)
}
func (e emptyResource) Allocate(context.Context, []string) (*pluginapi.ContainerAllocateResponse, error) {
	return nil, fmt.Errorf("resource %s is withdrawn", e.name)
}
