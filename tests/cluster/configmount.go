package cluster

import (
	"context"
	"fmt"
	"maps"
	"os"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

const (
	// NodeConfigMap is the chart's ConfigMap of the admin's node config,
	// which the DaemonSet mounts at /etc/gpufrac.
	NodeConfigMap = "gpufrac-node-config"
	// DefaultConfigMapSyncDelay is how long after a ConfigMap edit the test
	// bed updates each node agent's mount. The kubelet updates a mounted
	// ConfigMap at the pod's next periodic sync: up to its sync period (1 min)
	// plus the ConfigMap cache's TTL or watch delay, ~60-90 s by default. The
	// test bed is quicker so tests and the demo stay short; the agent sees the
	// same symlink swap either way.
	DefaultConfigMapSyncDelay = time.Second
)

// configMount plays the kubelet's part for the ConfigMap volume of the node
// agents: it watches one ConfigMap with an informer and projects its data,
// with atomicWriter, into each agent's config directory, at start (the
// kubelet mounts the volume before the container starts) and after each
// edit (DefaultConfigMapSyncDelay, or NodeAgentOptions.ConfigMapSyncDelay,
// per mount). A deleted ConfigMap leaves the mounts as they are, as the
// kubelet does.
type configMount struct {
	namespace, name string
	delay           time.Duration
	factory         informers.SharedInformerFactory
	lister          corelisters.ConfigMapNamespaceLister

	// mu guards mounts: directory -> the channel that wakes its projection
	// after an edit (buffered, one pending wake-up is enough).
	mu     sync.Mutex
	mounts map[string]chan struct{}
	wg     sync.WaitGroup
	// writeMu serialises the writes into the mounts (atomicWriter is one
	// writer per directory; NodeAgent.WriteConfig writes too).
	writeMu sync.Mutex
}

// newConfigMount starts the informer of namespace/name and waits for its
// cache; the informer runs until stop.
func newConfigMount(ctx context.Context, cs kubernetes.Interface, namespace, name string, delay time.Duration) (*configMount, error) {
	if delay <= 0 {
		delay = DefaultConfigMapSyncDelay
	}
	m := &configMount{namespace: namespace, name: name, delay: delay, mounts: map[string]chan struct{}{}}
	m.factory = informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		}))
	inf := m.factory.Core().V1().ConfigMaps()
	m.lister = inf.Lister().ConfigMaps(namespace)
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { m.wake() },
		UpdateFunc: func(any, any) { m.wake() },
	}); err != nil {
		return nil, fmt.Errorf("watching ConfigMap %s/%s: %w", namespace, name, err)
	}
	m.factory.Start(ctx.Done())
	for typ, ok := range m.factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return nil, fmt.Errorf("syncing the %v informer: %w", typ, ctx.Err())
		}
	}
	return m, nil
}

// stop ends the informer and waits for every mount's goroutine (their
// contexts must be done).
func (m *configMount) stop() {
	m.factory.Shutdown()
	m.wg.Wait()
}

// wake schedules a projection on every mount.
func (m *configMount) wake() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, ch := range m.mounts {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// mount projects the ConfigMap into dir (created if missing) once it exists,
// waiting for it as the kubelet holds a pod whose ConfigMap volume has no
// ConfigMap yet, then follows its edits until ctx ends.
func (m *configMount) mount(ctx context.Context, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating the config mount %s: %w", dir, err)
	}
	w := atomicWriter{dir: dir}
	var cm *corev1.ConfigMap
	if err := wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(context.Context) (bool, error) {
		var err error
		cm, err = m.lister.Get(m.name)
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	}); err != nil {
		return fmt.Errorf("waiting for ConfigMap %s/%s to mount it: %w", m.namespace, m.name, err)
	}
	if err := m.write(w, payloadOf(cm)); err != nil {
		return err
	}
	ch := make(chan struct{}, 1)
	m.mu.Lock()
	m.mounts[dir] = ch
	m.mu.Unlock()
	logger := klog.FromContext(ctx).WithValues("configMap", klog.KObj(cm), "dir", dir)
	m.wg.Go(func() {
		defer func() {
			m.mu.Lock()
			if m.mounts[dir] == ch { // not a later mount of the same directory
				delete(m.mounts, dir)
			}
			m.mu.Unlock()
		}()
		for {
			select {
			case <-ctx.Done():
				return
			case <-ch:
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(m.delay):
			}
			cm, err := m.lister.Get(m.name)
			if err != nil {
				continue // deleted: the volume keeps its content
			}
			if err := m.write(w, payloadOf(cm)); err != nil {
				logger.Error(err, "Updating the mounted ConfigMap")
				continue
			}
			logger.V(2).Info("Mounted ConfigMap synced", "resourceVersion", cm.ResourceVersion)
		}
	})
	return nil
}

// write projects payload into one mount.
func (m *configMount) write(w atomicWriter, payload map[string][]byte) error {
	m.writeMu.Lock()
	defer m.writeMu.Unlock()
	return w.write(payload)
}

// payloadOf is what a ConfigMap volume holds: every key of data and binaryData.
func payloadOf(cm *corev1.ConfigMap) map[string][]byte {
	out := make(map[string][]byte, len(cm.Data)+len(cm.BinaryData))
	for k, v := range cm.Data {
		out[k] = []byte(v)
	}
	maps.Copy(out, cm.BinaryData)
	return out
}
