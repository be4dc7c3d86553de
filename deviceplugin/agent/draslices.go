package agent

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/gpufrac/gpufrac/api"
)

// Defaults of DRAConfig's publishing intervals.
const (
	// DefaultSliceSyncDelay is how long after someone else changed or
	// deleted the node's slices (the kubelet wipes a driver's slices when it
	// takes the driver for gone) the resourceslice controller checks them
	// again; its own default is 30 s.
	DefaultSliceSyncDelay = 5 * time.Second
	// DefaultNodeCheckInterval is how often the Node's UID is read again.
	DefaultNodeCheckInterval = 30 * time.Second
	// sliceRetryMin and sliceRetryMax bound the wait before a failed sync
	// of the slices is tried again (doubled from one to the other; the
	// controller's default goes up to 1000 s, too long after an API server
	// outage), and before starting the controller again after a failure.
	sliceRetryMin = 500 * time.Millisecond
	sliceRetryMax = time.Minute
)

// slicePublisher publishes the node's ResourceSlices through a
// k8s.io/dynamic-resource-allocation/resourceslice controller: one pool,
// slices named by index, owned by the Node, generations bumped, slices of
// others put back after the sync delay, dropped fields reported.
//
// It starts the controller itself instead of through
// kubeletplugin.Helper.PublishResources, which starts one controller for
// the helper's lifetime with the Node's UID read once and a fixed 30 s sync
// delay. Here:
//
//   - the Node's UID is read again every NodeCheckInterval; when the Node was
//     deleted and registered again (a new UID) the controller is started
//     again, owned by the new Node: with the old UID the garbage collector
//     would delete the slices, and the controller create them again, forever;
//     while the Node is gone, nothing is published;
//   - the sync delay is DRAConfig.SliceSyncDelay (5 s by default), and failed
//     syncs are retried after 0.5 s doubling up to 1 min (the controller's
//     default queue doubles from 5 ms up to 1000 s);
//   - Publish never blocks: starting a controller waits until its informer
//     has listed the slices, which, with the API server away, is a long
//     time, and publishDRA runs under the agent's config lock.
//
// Every error the controller reports goes to onError wrapped so that
// errors.Is(err, kubeletplugin.ErrRecoverable), as the helper does.
type slicePublisher struct {
	client     kubernetes.Interface
	node       string
	syncDelay  time.Duration
	checkEvery time.Duration
	onError    func(ctx context.Context, err error, msg string)

	mu sync.Mutex
	// desired is what was last published (nil: nothing yet).
	desired *resourceslice.DriverResources
	// kick wakes Run after Publish (one pending wake is enough).
	kick chan struct{}
}

func newSlicePublisher(c DRAConfig, node string, onError func(ctx context.Context, err error, msg string)) *slicePublisher {
	p := &slicePublisher{client: c.Client, node: node, syncDelay: c.SliceSyncDelay, checkEvery: c.NodeCheckInterval,
		onError: onError, kick: make(chan struct{}, 1)}
	if p.syncDelay <= 0 {
		p.syncDelay = DefaultSliceSyncDelay
	}
	if p.checkEvery <= 0 {
		p.checkEvery = DefaultNodeCheckInterval
	}
	return p
}

// recoverable marks an error of publishing as kubeletplugin.ErrRecoverable.
type recoverable struct{ error }

func (recoverable) Is(target error) bool { return target == kubeletplugin.ErrRecoverable }
func (e recoverable) Unwrap() error      { return e.error }

// Publish sets what the node's slices must say (a deep copy is kept). It
// does not wait for the writes.
func (p *slicePublisher) Publish(r resourceslice.DriverResources) {
	c := r.DeepCopy()
	p.mu.Lock()
	p.desired = c
	p.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

func (p *slicePublisher) current() *resourceslice.DriverResources {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.desired
}

// Run publishes until ctx ends: nothing before the first Publish, then a
// controller that follows every Publish, started again when the Node's UID
// changes and after failures (with backoff). Published slices stay when it
// returns (the kubelet removes a gone driver's slices).
func (p *slicePublisher) Run(ctx context.Context) {
	logger := klog.FromContext(ctx)
	var ctrl *resourceslice.Controller
	var owner types.UID
	defer func() { ctrl.Stop() }() // nil-safe
	check := time.NewTicker(p.checkEvery)
	defer check.Stop()
	// Restarts after a failed start back off 1 s doubling to sliceRetryMax,
	// jittered.
	retry := wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.1, Steps: math.MaxInt32, Cap: sliceRetryMax}
	backoff := retry.DelayFunc()
	for {
		if ctrl == nil && p.current() != nil {
			var err error
			ctrl, owner, err = p.start(ctx)
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				p.onError(ctx, recoverable{err}, "publishing ResourceSlices")
				select {
				case <-ctx.Done():
					return
				case <-time.After(backoff()):
				}
				continue
			}
			backoff = retry.DelayFunc()
		}
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
			if ctrl != nil {
				ctrl.Update(p.current())
			}
		case <-check.C:
			if ctrl == nil {
				continue
			}
			// From the API server's cache (resourceVersion 0): cheap, and
			// a UID a moment late is fine.
			uid, err := p.nodeUID(ctx, "0")
			switch {
			case apierrors.IsNotFound(err):
				// The garbage collector deletes the slices, and the
				// controller would create them again every sync delay,
				// owned by a Node that is not there. Start again (and
				// fail, with backoff) until it is registered again.
				logger.Info("The Node is gone: not publishing its ResourceSlices until it is registered again", "node", p.node, "oldUID", owner)
				ctrl.Stop()
				ctrl = nil
			case err != nil:
				logger.V(2).Info("Reading the Node for the owner of its ResourceSlices failed; will retry", "node", p.node, "err", err)
			case uid != owner:
				logger.Info("The Node was registered again: publishing its ResourceSlices owned by the new one", "node", p.node, "oldUID", owner, "uid", uid)
				ctrl.Stop()
				ctrl = nil
			}
		}
	}
}

// start reads the Node's UID and starts a controller owned by it with what
// is published now. It blocks until the controller's informer has listed
// the slices (or ctx ends).
func (p *slicePublisher) start(ctx context.Context) (*resourceslice.Controller, types.UID, error) {
	uid, err := p.nodeUID(ctx, "")
	if err != nil {
		return nil, "", fmt.Errorf("reading node %s for the owner of its ResourceSlices: %w", p.node, err)
	}
	ctrl, err := resourceslice.StartController(ctx, resourceslice.Options{
		DriverName: api.DRADriver,
		KubeClient: p.client,
		Owner:      &resourceslice.Owner{APIVersion: "v1", Kind: "Node", Name: p.node, UID: uid},
		Resources:  p.current(),
		SyncDelay:  &p.syncDelay,
		// A queue per controller: a stopped controller shuts its queue down.
		Queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](sliceRetryMin, sliceRetryMax),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "node_resource_slices"}),
		ErrorHandler: func(ctx context.Context, err error, msg string) {
			p.onError(ctx, recoverable{err}, msg)
		},
	})
	if err != nil {
		return nil, "", fmt.Errorf("starting the ResourceSlice controller: %w", err)
	}
	return ctrl, uid, nil
}

func (p *slicePublisher) nodeUID(ctx context.Context, resourceVersion string) (types.UID, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	n, err := p.client.CoreV1().Nodes().Get(ctx, p.node, metav1.GetOptions{ResourceVersion: resourceVersion})
	if err != nil {
		return "", err
	}
	return n.UID, nil
}
