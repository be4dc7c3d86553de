package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpufrac/gpufrac/tests/kubeletsim"
)

const (
	// statusRetryMin and statusRetryMax bound the backoff of a failed status patch.
	statusRetryMin = 200 * time.Millisecond
	statusRetryMax = 5 * time.Second
)

// deviceCounts is what the kubelet reports for one device-plugin resource.
type deviceCounts struct {
	capacity    int // all devices
	allocatable int // healthy devices
}

// statusSync keeps a node's status.capacity and status.allocatable in line with
// its kubelet simulator's device lists, as the kubelet's node status setter does
// for device-plugin resources: counts for every listed resource, and the resource
// gone once its plugin is gone (after the simulator's grace period).
type statusSync struct {
	c    *Cluster
	node string
	kick chan struct{} // capacity 1: a change waits to be written

	// mu guards want.
	mu sync.Mutex
	// want: resource -> counts to publish; nil counts mean remove the resource.
	want map[string]*deviceCounts
}

func newStatusSync(c *Cluster, node string) *statusSync {
	return &statusSync{c: c, node: node, kick: make(chan struct{}, 1), want: map[string]*deviceCounts{}}
}

// update is the kubelet simulator's OnChange callback: it records the latest list
// and wakes run. It never blocks.
func (s *statusSync) update(resource string, devs []*v1beta1.Device) {
	s.mu.Lock()
	if devs == nil {
		s.want[resource] = nil
	} else {
		capacity, allocatable := kubeletsim.Counts(devs)
		s.want[resource] = &deviceCounts{capacity: capacity, allocatable: allocatable}
	}
	s.mu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// run writes the wanted counts to the node until ctx ends. It first waits for kwok
// to initialise the node (Ready), whose status patch carries the allocatable it
// read: writing before it could race. Failed writes are retried with backoff.
func (s *statusSync) run(ctx context.Context) {
	logger := klog.FromContext(ctx)
	if !s.waitReady(ctx) {
		return
	}
	written := map[string]deviceCounts{}
	backoff := statusRetryMin
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
		case <-retry:
		}
		retry = nil
		s.mu.Lock()
		want := maps.Clone(s.want)
		s.mu.Unlock()
		patch, pending, err := statusPatch(want, written)
		if err != nil {
			logger.Error(err, "Building node status patch failed")
			continue
		}
		if len(pending) == 0 {
			continue
		}
		_, err = s.c.Client.CoreV1().Nodes().Patch(ctx, s.node, types.MergePatchType, patch,
			metav1.PatchOptions{FieldManager: fieldManager}, "status")
		if apierrors.IsNotFound(err) {
			return
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			logger.V(2).Info("Patching node status failed; retrying", "err", err, "backoff", backoff)
			retry = time.After(backoff)
			backoff = min(2*backoff, statusRetryMax)
			continue
		}
		backoff = statusRetryMin
		for _, name := range pending {
			if want[name] == nil {
				delete(written, name)
				s.mu.Lock()
				if s.want[name] == nil {
					delete(s.want, name)
				}
				s.mu.Unlock()
			} else {
				written[name] = *want[name]
			}
		}
		logger.V(4).Info("Node status updated", "resources", pending)
	}
}

// waitReady polls the node until kwok has marked it Ready; false when ctx ended
// or the node went.
func (s *statusSync) waitReady(ctx context.Context) bool {
	ticker := time.NewTicker(100 * time.Millisecond)
	defer ticker.Stop()
	for {
		node, err := s.c.Client.CoreV1().Nodes().Get(ctx, s.node, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false
		}
		if err == nil && IsNodeReady(node) {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-ticker.C:
		}
	}
}

// statusPatch builds the merge patch that takes a node status from written to
// want, and lists the resources it changes, sorted. A nil entry in want removes
// the resource from capacity and allocatable.
func statusPatch(want map[string]*deviceCounts, written map[string]deviceCounts) ([]byte, []string, error) {
	capacity := map[string]any{}
	allocatable := map[string]any{}
	var pending []string
	for _, name := range slices.Sorted(maps.Keys(want)) {
		w := want[name]
		old, known := written[name]
		switch {
		case w == nil:
			// Remove even when never written: kwok or Karpenter may have set it.
			capacity[name] = nil
			allocatable[name] = nil
		case known && old == *w:
			continue
		default:
			capacity[name] = strconv.Itoa(w.capacity)
			allocatable[name] = strconv.Itoa(w.allocatable)
		}
		pending = append(pending, name)
	}
	if len(pending) == 0 {
		return nil, nil, nil
	}
	body, err := json.Marshal(map[string]any{"status": map[string]any{"capacity": capacity, "allocatable": allocatable}})
	if err != nil {
		return nil, nil, fmt.Errorf("encoding node status patch: %w", err)
	}
	return body, pending, nil
}
