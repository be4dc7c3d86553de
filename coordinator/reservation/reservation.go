// Package reservation creates and removes reservation pods. A reservation
// pod is bound to a node, asks for one whole nvidia.com/gpu and carries
// karpenter.sh/do-not-disrupt: it holds a shared GPU against whole-GPU pods
// (the kubelet counts it) and keeps Karpenter from consolidating the node
// while fractions run there. gpufrac-node writes the GPU the kubelet gave it
// (gpufrac.io/reserved-gpu); only then does the coordinator bind fractions.
package reservation

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/restricted"
	"github.com/gpufrac/gpufrac/coordinator/state"
)

// Options configure reservations.
type Options struct {
	// Image is the reservation container's image (it only sleeps).
	Image string
	// PriorityClassName is the reservation pods' priority class.
	PriorityClassName string
	// Grace is how long a reservation outlives the last fraction on its GPU.
	Grace time.Duration
	// EmptyNodeGrace replaces Grace, when shorter, for a reservation whose
	// node is Karpenter's and whose GPUs run nothing else
	// (state.Reservation.NodeIdle): there the
	// reservation is all that keeps the node from Karpenter's
	// consolidation, whose consolidateAfter already waits for new work. A
	// fraction that arrives later gets a new reservation. Negative: Grace
	// everywhere.
	EmptyNodeGrace time.Duration
	// AdmitTimeout is how long a reservation may wait for its GPU before it
	// is removed (and the fractions placed again, elsewhere if need be).
	AdmitTimeout time.Duration
}

// DefaultOptions are the defaults of the coordinator's flags.
func DefaultOptions() Options {
	return Options{Image: "registry.k8s.io/pause:3.10", PriorityClassName: "gpufrac-reservation", Grace: 60 * time.Second, EmptyNodeGrace: 5 * time.Second, AdmitTimeout: 2 * time.Minute}
}

// Name is the reservation pod's name for a GPU of a node: deterministic, so
// two coordinators racing collide on AlreadyExists instead of reserving twice.
func Name(node, gpu string) string { return NameAt(node, gpu, 0) }

// NameAt is the name of the attempt-th reservation for a GPU. A reservation
// the kubelet gave another GPU than asked (another one-GPU pod was admitted
// first and took it) keeps its name while it serves that other GPU; the next
// reservation for the GPU asked for uses the next attempt, again the same for
// every coordinator that sees the same pods.
func NameAt(node, gpu string, attempt int) string {
	key := node + "/" + gpu
	if attempt > 0 {
		key += "/" + strconv.Itoa(attempt)
	}
	sum := sha256.Sum256([]byte(key))
	n := strings.ToLower(node)
	if len(n) > 200 {
		n = n[:200]
	}
	return api.ReservationNamePrefix + n + "-" + hex.EncodeToString(sum[:5])
}

// Pod builds the first reservation pod of a GPU of a node.
func Pod(node, gpu string, o Options) *corev1.Pod { return PodAt(node, gpu, 0, o) }

// PodAt builds the attempt-th reservation pod of a GPU of a node.
func PodAt(node, gpu string, attempt int, o Options) *corev1.Pod {
	one := resource.MustParse("1")
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      NameAt(node, gpu, attempt),
			Namespace: api.ReservationNamespace,
			Labels: map[string]string{
				api.LabelRole:         api.RoleReservation,
				api.LabelReservedNode: node,
			},
			Annotations: map[string]string{
				api.AnnotationGPU:          gpu,
				api.AnnotationDoNotDisrupt: "true",
			},
		},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			PriorityClassName:             o.PriorityClassName,
			TerminationGracePeriodSeconds: new(int64),
			// Whatever the node's taints, the reservation must stay with its GPU.
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers: []corev1.Container{{
				Name:  "reserve",
				Image: o.Image,
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{api.ResourceGPU: one, corev1.ResourceCPU: resource.MustParse("1m"), corev1.ResourceMemory: resource.MustParse("4Mi")},
					Limits:   corev1.ResourceList{api.ResourceGPU: one},
				},
			}},
		},
	}
	// The reservation namespace enforces Pod Security "restricted".
	restricted.Apply(&p.Spec)
	return p
}

// Manager creates and removes reservation pods.
type Manager struct {
	client   kubernetes.Interface
	recorder record.EventRecorder
	opts     Options
	clock    clock.PassiveClock

	idleSince map[state.NodeGPU]time.Time // reservation -> when it was first seen without fractions
	// removing: reservation pod UID -> true once Reconcile deleted it, until
	// a Reconcile no longer sees it (guarded by mu: Removing is read by the
	// cycle, Reconcile writes).
	mu       sync.Mutex
	removing map[types.UID]bool
	metrics  *metrics
	// background, when set (RemoveInBackground), holds a slot per deletion
	// running on a goroutine of its own; nil: deletions are made before
	// Reconcile and RemoveFailed return. inflight names the pods being
	// deleted in the background (guarded by mu).
	background chan struct{}
	inflight   map[types.UID]bool
	wg         sync.WaitGroup // deletions in the background
	// retryIdle: GPU -> when its reservation went idle, for idle
	// reservations whose deletion failed in the background (guarded by mu):
	// the next Reconcile decides again from that time, as after a failed
	// inline deletion, not from a fresh grace period.
	retryIdle map[state.NodeGPU]time.Time
}

// RemoveInBackground makes Reconcile and RemoveFailed delete reservation
// pods on goroutines of their own, at most n at once, and return without
// waiting for the API server. At 5,000 nodes a cycle removed a thousand idle
// reservations one request at a time, behind the bindings on the same client
// budget: the scheduling cycle waited minutes in Reconcile
// (docs/benchmarks-history.md, "Scale"). A reservation handed to a deletion is in
// Removing at once, so no fraction is placed on its GPU meanwhile; one whose
// deletion fails leaves Removing and is decided again by the next Reconcile.
// Call it before the first Reconcile.
func (m *Manager) RemoveInBackground(n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.background = make(chan struct{}, max(n, 1))
	m.inflight = map[types.UID]bool{}
	m.retryIdle = map[state.NodeGPU]time.Time{}
}

// Wait waits for the deletions running in the background.
func (m *Manager) Wait() { m.wg.Wait() }

// remove deletes reservation p: inline, or in the background when
// RemoveInBackground was called. It returns false when the deletion failed
// (inline) or p is already being deleted in the background. p is in
// Removing from the hand-over (background) or the deletion (inline) on,
// until the deletion fails or Reconcile no longer sees p. done runs once
// the pod is deleted (or was gone), failed (when not nil) once a deletion in
// the background failed, on whichever goroutine deleted it.
func (m *Manager) remove(ctx context.Context, p *corev1.Pod, opts metav1.DeleteOptions, what string, done, failed func()) bool {
	del := func() bool {
		err := m.client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, opts)
		if err != nil && !apierrors.IsNotFound(err) {
			klog.FromContext(ctx).Error(err, what, "pod", klog.KObj(p))
			return false
		}
		done()
		return true
	}
	m.mu.Lock()
	if m.background == nil {
		m.mu.Unlock()
		if !del() {
			return false
		}
		if p.UID != "" {
			m.mu.Lock()
			m.removing[p.UID] = true
			m.mu.Unlock()
		}
		return true
	}
	if p.UID != "" {
		if m.inflight[p.UID] {
			m.mu.Unlock()
			return false
		}
		m.inflight[p.UID] = true
		m.removing[p.UID] = true // no fraction on its GPU from the next cycle on
	}
	m.mu.Unlock()
	m.wg.Go(func() {
		m.background <- struct{}{}
		ok := del()
		<-m.background
		if p.UID == "" {
			return
		}
		m.mu.Lock()
		delete(m.inflight, p.UID)
		if !ok {
			delete(m.removing, p.UID) // decided again by the next Reconcile
			if failed != nil {
				failed()
			}
		}
		m.mu.Unlock()
	})
	return true
}

// NewManager returns a manager.
func NewManager(client kubernetes.Interface, recorder record.EventRecorder, o Options, clk clock.PassiveClock) *Manager {
	if clk == nil {
		clk = clock.RealClock{}
	}
	if recorder == nil {
		recorder = &record.FakeRecorder{}
	}
	return &Manager{client: client, recorder: recorder, opts: o, clock: clk, idleSince: map[state.NodeGPU]time.Time{},
		removing: map[types.UID]bool{}, metrics: newMetrics()}
}

// Removing returns the reservation pods Reconcile deleted that the last
// Reconcile still saw: the informer may show them as they were for a
// moment, and no fraction may be bound on their GPU meanwhile.
func (m *Manager) Removing() map[types.UID]bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[types.UID]bool, len(m.removing))
	for uid := range m.removing {
		out[uid] = true
	}
	return out
}

// Ensure creates the attempt-th reservation of a GPU unless it exists.
func (m *Manager) Ensure(ctx context.Context, node, gpu string, attempt int) error {
	p := PodAt(node, gpu, attempt, m.opts)
	_, err := m.client.CoreV1().Pods(api.ReservationNamespace).Create(ctx, p, metav1.CreateOptions{FieldManager: "gpufrac-coordinator"})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("creating reservation %s for GPU %s on %s: %w", p.Name, gpu, node, err)
	}
	klog.FromContext(ctx).Info("Reserved GPU for fractions", "node", node, "gpu", gpu, "pod", klog.KObj(p))
	return nil
}

// graceFor is how long reservation r may stay without fractions.
func (m *Manager) graceFor(r *state.Reservation) time.Duration {
	if r.NodeIdle && m.opts.EmptyNodeGrace >= 0 && m.opts.EmptyNodeGrace < m.opts.Grace {
		return m.opts.EmptyNodeGrace
	}
	return m.opts.Grace
}

// Reconcile removes reservations that no fraction needs any more (after the
// grace period, or EmptyNodeGrace when nothing else uses the node's GPUs), reservations that never got their GPU within
// AdmitTimeout, and orphaned reservations (state.Reservation.Orphaned: the
// node gone, cordoned or not Ready, the GPU unhealthy or out of fraction
// mode) as soon as no fraction runs on their GPU - at once, whatever runs
// there, when the node is gone. wanted lists GPUs with fractions being
// placed this cycle. shown names the pods deleted before that the
// informer still shows (state.Snapshot.RemovingShown), besides those in rs:
// a deletion is forgotten (Removing) only once its pod is in neither. It
// returns the number of reservations removed.
func (m *Manager) Reconcile(ctx context.Context, rs map[state.NodeGPU]*state.Reservation, wanted map[state.NodeGPU]bool, shown map[types.UID]bool) int {
	now := m.clock.Now()
	removed := 0
	defer func() { m.metrics.observe(rs, m.idleSince, now) }()
	m.mu.Lock()
	for key, since := range m.retryIdle {
		if _, ok := m.idleSince[key]; !ok {
			m.idleSince[key] = since // its deletion failed: decided again from then
		}
	}
	clear(m.retryIdle)
	m.mu.Unlock()
	for key := range m.idleSince {
		if rs[key] == nil {
			delete(m.idleSince, key)
		}
	}
	seen := make(map[types.UID]bool, len(rs))
	for _, r := range rs {
		if r.Pod != nil {
			seen[r.Pod.UID] = true
		}
	}
	m.mu.Lock()
	for uid := range m.removing {
		if !seen[uid] && !shown[uid] {
			delete(m.removing, uid) // gone from the informer's cache
		}
	}
	removing := make(map[types.UID]bool, len(m.removing))
	for uid := range m.removing {
		removing[uid] = true
	}
	m.mu.Unlock()
	for key, r := range rs {
		p := r.Pod
		if p == nil || p.DeletionTimestamp != nil || (p.UID != "" && removing[p.UID]) {
			continue // created this cycle, or already going
		}
		reason := ""
		switch {
		case r.Orphaned != "" && (r.Fractions == 0 || r.NodeGone):
			reason = "orphaned: " + r.Orphaned
		case r.Orphaned != "":
			delete(m.idleSince, key) // its fractions still run: it goes when they have
			continue
		case !r.Ready && r.Fractions == 0 && now.Sub(p.CreationTimestamp.Time) > m.opts.AdmitTimeout:
			reason = fmt.Sprintf("reservation did not get GPU %s on %s within %s", key.GPU, key.Node, m.opts.AdmitTimeout)
		case r.Fractions == 0 && !wanted[key]:
			since, ok := m.idleSince[key]
			if !ok {
				since = now
				m.idleSince[key] = now
			}
			if grace := m.graceFor(r); now.Sub(since) >= grace {
				reason = fmt.Sprintf("no fraction used GPU %s on %s for %s", key.GPU, key.Node, grace)
				if grace < m.opts.Grace {
					reason += ", and nothing else uses the node's GPUs"
				}
			}
		default:
			delete(m.idleSince, key)
		}
		if reason == "" {
			continue
		}
		var opts metav1.DeleteOptions
		if p.UID != "" {
			// Not a reservation of the same name made since.
			opts.Preconditions = &metav1.Preconditions{UID: &p.UID}
		}
		if r.NodeLost {
			// No kubelet will confirm a graceful deletion: remove it now. A
			// node that comes back kills the orphaned container itself.
			opts.GracePeriodSeconds = new(int64)
		}
		var failed func() // called with mu held
		if since, idle := m.idleSince[key]; idle {
			failed = func() { m.retryIdle[key] = since }
		}
		if !m.remove(ctx, p, opts, "Removing reservation", func() {
			m.recorder.Event(p, corev1.EventTypeNormal, "ReservationRemoved", reason)
			klog.FromContext(ctx).Info("Removed reservation", "pod", klog.KObj(p), "reason", reason)
		}, failed) {
			continue
		}
		// In Removing already (remove): marked here again, it would stay
		// there over a deletion in the background that failed meanwhile.
		delete(m.idleSince, key)
		removed++
	}
	return removed
}

// RemoveFailed removes reservation pods that ended Failed (the kubelet
// rejected them: their GPU was taken) with an event saying why. They hold
// nothing, but their name stays taken until they are gone. It returns the
// number removed.
func (m *Manager) RemoveFailed(ctx context.Context, pods []*corev1.Pod) int {
	removed := 0
	for _, p := range pods {
		opts := metav1.DeleteOptions{}
		if p.UID != "" {
			opts.Preconditions = &metav1.Preconditions{UID: &p.UID}
		}
		reason := fmt.Sprintf("reservation failed on %s: %s", p.Spec.NodeName, p.Status.Message)
		if !m.remove(ctx, p, opts, "Removing failed reservation", func() {
			m.recorder.Event(p, corev1.EventTypeNormal, "ReservationRemoved", reason)
			klog.FromContext(ctx).Info("Removed reservation", "pod", klog.KObj(p), "reason", reason)
		}, nil) {
			continue
		}
		removed++
	}
	return removed
}
