package draplugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/conversion"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
)

// Defaults of PublisherOptions.
const (
	DefaultSyncDelay  = 5 * time.Second
	DefaultMinBackoff = 500 * time.Millisecond
	DefaultMaxBackoff = time.Minute
)

// PublisherOptions configures a Publisher.
type PublisherOptions struct {
	// Driver and Node are the driver's name and the node it runs on: the
	// publisher owns the ResourceSlices of that driver on that node (field
	// selectors spec.driver and spec.nodeName), and no others. Required.
	Driver, Node string
	// API reads and writes the slices. Required.
	API SliceAPI
	// NodeUID returns the Node's UID, for the owner reference of the slices
	// it creates (so they go when the Node goes). Required; asked before
	// each batch of creates, not cached: a Node deleted and registered
	// again under its name has a new UID, and slices owned by the old one
	// are deleted by the garbage collector (and would be re-created with
	// it, forever).
	NodeUID func(ctx context.Context) (types.UID, error)
	// OnError sees each failed attempt (retried with backoff) and each
	// DroppedFieldsError, wrapped so that errors.Is(err, ErrRecoverable).
	OnError func(ctx context.Context, err error, msg string)
	// Clock times the delays (default the real clock).
	Clock clock.Clock
	// SyncDelay is how long after a change to its slices by someone else
	// (seen by its watch) the publisher checks them again (default
	// DefaultSyncDelay): a burst of changes costs one check.
	SyncDelay time.Duration
	// MinBackoff and MaxBackoff bound the retry delay after a failure,
	// doubled from one to the other (defaults DefaultMinBackoff,
	// DefaultMaxBackoff).
	MinBackoff, MaxBackoff time.Duration
}

// Publisher keeps the node's ResourceSlices of one driver equal to the last
// DriverResources published, as the resourceslice controller of
// k8s.io/dynamic-resource-allocation does for a node-local driver:
//
//   - each pool's slices are named "<index, 5 hex digits>-<driver>-<node>-"
//     plus the API server's random suffix, so name order is the driver's
//     order (allocators try slices first fit), and slices published by that
//     controller before are taken over, not published twice;
//   - the pool's generation is kept when one slice write does the change
//     and bumped otherwise (new slices, or several changed), so allocators
//     never mix an old and a new set; slices of an older generation, with
//     an index beyond the pool, a duplicate index or a foreign name, and
//     whole pools no longer published are deleted (with UID and
//     resourceVersion preconditions) before anything is written;
//   - slices it creates are owned by the Node (controller reference);
//   - server-set taint times are kept; fields the API server drops are
//     reported (DroppedFieldsError) and accepted, not written again forever;
//   - it reads the slices from the API server at each check (never from a
//     cache, so it cannot create a slice twice) and watches them between
//     checks: a slice deleted or changed by someone else (the kubelet wipes
//     a driver's slices when it is gone) is put back after SyncDelay.
//
// Publish may be called at any time; Run does the work.
type Publisher struct {
	o        PublisherOptions
	selector string

	mu sync.Mutex
	// desired is what was last published (nil: nothing yet).
	desired *DriverResources
	// kick wakes Run after Publish (buffered, one pending wake is enough).
	kick chan struct{}
}

// NewPublisher checks o and fills in its defaults.
func NewPublisher(o PublisherOptions) (*Publisher, error) {
	if o.Driver == "" || o.Node == "" || o.API == nil || o.NodeUID == nil {
		return nil, errors.New("ResourceSlice publisher: Driver, Node, API and NodeUID are required")
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.OnError == nil {
		o.OnError = func(ctx context.Context, err error, msg string) { klog.FromContext(ctx).Error(err, msg) }
	}
	if o.SyncDelay <= 0 {
		o.SyncDelay = DefaultSyncDelay
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = DefaultMinBackoff
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = max(DefaultMaxBackoff, o.MinBackoff)
	}
	sel := fields.Set{resourceapi.ResourceSliceSelectorDriver: o.Driver, resourceapi.ResourceSliceSelectorNodeName: o.Node}
	return &Publisher{o: o, selector: sel.String(), kick: make(chan struct{}, 1)}, nil
}

// Publish sets what the node's slices must say (a deep copy is kept: the
// caller may change r afterwards). It does not wait for the writes.
func (p *Publisher) Publish(r DriverResources) {
	c := DriverResources{Pools: make(map[string]Pool, len(r.Pools))}
	for name, pool := range r.Pools {
		cp := Pool{Slices: make([]Slice, len(pool.Slices))}
		for i, s := range pool.Slices {
			for _, d := range s.Devices {
				cp.Slices[i].Devices = append(cp.Slices[i].Devices, *d.DeepCopy())
			}
			for _, cs := range s.SharedCounters {
				cp.Slices[i].SharedCounters = append(cp.Slices[i].SharedCounters, *cs.DeepCopy())
			}
		}
		c.Pools[name] = cp
	}
	p.mu.Lock()
	p.desired = &c
	p.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// Run publishes until ctx ends: nothing before the first Publish, then a
// check after every Publish, after changes seen by the watch, and when the
// watch ends; failed checks are retried with backoff. Published slices stay
// when it returns (the kubelet removes a gone driver's slices).
func (p *Publisher) Run(ctx context.Context) {
	logger := klog.FromContext(ctx)
	backoff := time.Duration(0)
	for p.current() == nil {
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		}
	}
	for {
		rv, err := p.sync(ctx)
		var w watch.Interface
		if err == nil {
			w, err = p.o.API.WatchResourceSlices(ctx, metav1.ListOptions{FieldSelector: p.selector, ResourceVersion: rv, AllowWatchBookmarks: true})
			if err != nil {
				err = fmt.Errorf("watching ResourceSlices: %w", err)
			}
		}
		if ctx.Err() != nil {
			if w != nil {
				w.Stop()
			}
			return
		}
		var wait time.Duration
		if err != nil {
			backoff = min(max(2*backoff, p.o.MinBackoff), p.o.MaxBackoff)
			p.o.OnError(ctx, recoverable{err}, "publishing ResourceSlices")
			wait = backoff
		} else {
			backoff = 0
			reason := p.watch(ctx, w)
			w.Stop()
			if reason == "" { // ctx ended
				return
			}
			logger.V(4).Info("Checking ResourceSlices again", "reason", reason)
			if reason != "published" {
				wait = p.o.SyncDelay
			}
		}
		if wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-p.kick:
			case <-p.o.Clock.After(wait):
			}
		}
	}
}

// watch waits for a reason to check the slices again: a Publish, a change
// seen by w, or w ending. It returns "" when ctx ends.
func (p *Publisher) watch(ctx context.Context, w watch.Interface) string {
	for {
		select {
		case <-ctx.Done():
			return ""
		case <-p.kick:
			return "published"
		case ev, ok := <-w.ResultChan():
			switch {
			case !ok:
				return "watch ended"
			case ev.Type == watch.Bookmark:
				continue
			case ev.Type == watch.Error:
				return "watch failed: " + apierrors.FromObject(ev.Object).Error()
			default:
				return "slice " + strings.ToLower(string(ev.Type))
			}
		}
	}
}

func (p *Publisher) current() *DriverResources {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.desired
}

// sync makes one check: it lists the node's slices of the driver, and
// deletes, updates and creates what plan says, pool by pool (every pool,
// even after one failed). It returns the list's resourceVersion, for the
// watch, or the pools' errors joined.
func (p *Publisher) sync(ctx context.Context) (string, error) {
	logger := klog.FromContext(ctx)
	desired := p.current()
	list, err := p.o.API.ListResourceSlices(ctx, metav1.ListOptions{FieldSelector: p.selector})
	if err != nil {
		return "", fmt.Errorf("listing ResourceSlices: %w", err)
	}
	existing := map[string][]resourceapi.ResourceSlice{}
	for _, s := range list.Items {
		// The field selector chose them; a fake or an old server may not.
		if s.Spec.Driver != p.o.Driver || ptr.Deref(s.Spec.NodeName, "") != p.o.Node {
			continue
		}
		existing[s.Spec.Pool.Name] = append(existing[s.Spec.Pool.Name], s)
	}
	names := make([]string, 0, len(existing)+len(desired.Pools))
	for name := range existing {
		names = append(names, name)
	}
	for name := range desired.Pools {
		if _, ok := existing[name]; !ok {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	// Each pool on its own, as the resourceslice controller syncs them: a
	// pool that cannot be written (a stray pool whose slices an admission
	// policy keeps it from deleting, say) must not keep the others from
	// being published. The check fails, and is retried, if any failed.
	var errs []error
	for _, name := range names {
		pool, ok := desired.Pools[name]
		var pl poolPlan
		if ok {
			pl = planPool(p.o.Driver, p.o.Node, name, pool, existing[name])
		} else {
			pl = poolPlan{deletes: existing[name]}
		}
		if pl.empty() {
			continue
		}
		logger.V(3).Info("Writing ResourceSlices", "pool", name, "delete", len(pl.deletes), "update", len(pl.updates), "create", len(pl.creates))
		if err := p.apply(ctx, desired, name, pl); err != nil {
			errs = append(errs, fmt.Errorf("pool %s: %w", name, err))
		}
	}
	if len(errs) > 0 {
		return "", errors.Join(errs...)
	}
	return list.ResourceVersion, nil
}

// apply makes a pool's writes: deletes first (a driver that cannot publish
// what it has should at least stop offering what it no longer has), then
// updates, then creates.
func (p *Publisher) apply(ctx context.Context, desired *DriverResources, pool string, pl poolPlan) error {
	for _, s := range pl.deletes {
		err := p.o.API.DeleteResourceSlice(ctx, s.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &s.UID, ResourceVersion: &s.ResourceVersion}})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting ResourceSlice %s: %w", s.Name, err)
		}
	}
	for _, u := range pl.updates {
		got, err := p.o.API.UpdateResourceSlice(ctx, u.slice)
		if err != nil {
			return fmt.Errorf("updating ResourceSlice %s: %w", u.slice.Name, err)
		}
		p.stored(ctx, desired, pool, u.index, u.slice, got)
	}
	if len(pl.creates) == 0 {
		return nil
	}
	owner, err := p.o.NodeUID(ctx)
	if err != nil {
		return fmt.Errorf("reading node %s for the owner of its ResourceSlices: %w", p.o.Node, err)
	}
	for _, c := range pl.creates {
		c.slice.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: p.o.Node, UID: owner, Controller: ptr.To(true)}}
		got, err := p.o.API.CreateResourceSlice(ctx, c.slice)
		if err != nil {
			return fmt.Errorf("creating ResourceSlice %s: %w", c.slice.GenerateName, err)
		}
		p.stored(ctx, desired, pool, c.index, c.slice, got)
	}
	return nil
}

// stored compares what the API server stored with what was written. A
// difference means it dropped fields of a feature it has off: reported, and
// what was stored becomes what is wanted for that slice (until the next
// Publish), so the slice is not written again and again.
func (p *Publisher) stored(ctx context.Context, desired *DriverResources, pool string, index int, want, got *resourceapi.ResourceSlice) {
	if got == nil || (devicesEqual(want.Spec.Devices, got.Spec.Devices) && apiequality.Semantic.DeepEqual(want.Spec.SharedCounters, got.Spec.SharedCounters)) {
		return
	}
	p.mu.Lock()
	if p.desired == desired {
		pl := desired.Pools[pool]
		if index < len(pl.Slices) {
			pl.Slices[index] = Slice{Devices: got.Spec.Devices, SharedCounters: got.Spec.SharedCounters}
		}
	}
	p.mu.Unlock()
	p.o.OnError(ctx, recoverable{&DroppedFieldsError{PoolName: pool, SliceIndex: index, DesiredSlice: want.DeepCopy(), ActualSlice: got.DeepCopy()}}, "publishing ResourceSlices")
}

// poolPlan is the writes that bring one pool's slices to what is wanted.
type poolPlan struct {
	deletes []resourceapi.ResourceSlice
	updates []sliceWrite
	creates []sliceWrite
}

// sliceWrite is the slice to write for index index of the pool.
type sliceWrite struct {
	index int
	slice *resourceapi.ResourceSlice
}

func (pl poolPlan) empty() bool {
	return len(pl.deletes) == 0 && len(pl.updates) == 0 && len(pl.creates) == 0
}

// planPool compares the existing slices of one pool with the wanted ones,
// as the resourceslice controller does (see Publisher). It is pure: the
// creates carry no owner reference yet.
func planPool(driver, node, name string, want Pool, existing []resourceapi.ResourceSlice) poolPlan {
	existing = slices.Clone(existing)
	slices.SortFunc(existing, func(a, b resourceapi.ResourceSlice) int { return strings.Compare(a.Name, b.Name) })
	var gen int64
	for _, s := range existing {
		gen = max(gen, s.Spec.Pool.Generation)
	}
	idxLen := indexLength(len(want.Slices))
	var pl poolPlan
	current := map[int]resourceapi.ResourceSlice{}
	for _, s := range existing {
		i, ok := decodeIndex(s.Name, idxLen)
		_, taken := current[i]
		if s.Spec.Pool.Generation < gen || !ok || i >= len(want.Slices) || taken {
			pl.deletes = append(pl.deletes, s)
			continue
		}
		current[i] = s
	}
	pool := resourceapi.ResourcePool{Name: name, Generation: gen, ResourceSliceCount: int64(len(want.Slices))}
	var changed []int
	for i, s := range current {
		w := want.Slices[i]
		if !apiequality.Semantic.DeepEqual(s.Spec.Pool, pool) || !devicesEqual(s.Spec.Devices, w.Devices) ||
			!apiequality.Semantic.DeepEqual(s.Spec.SharedCounters, w.SharedCounters) {
			changed = append(changed, i)
		}
	}
	bump := len(current) < len(want.Slices) || len(changed) > 1
	if bump {
		pool.Generation++
	}
	for i := range want.Slices {
		w := want.Slices[i]
		s, ok := current[i]
		switch {
		case !ok:
			pl.creates = append(pl.creates, sliceWrite{index: i, slice: &resourceapi.ResourceSlice{
				ObjectMeta: metav1.ObjectMeta{GenerateName: encodeIndex(i, idxLen) + "-" + driver + "-" + node + "-"},
				Spec: resourceapi.ResourceSliceSpec{Driver: driver, Pool: pool, NodeName: ptr.To(node),
					Devices: w.Devices, SharedCounters: w.SharedCounters},
			}})
		case bump || slices.Contains(changed, i):
			u := s.DeepCopy()
			u.Spec.Pool = pool
			u.Spec.Devices = keepTaintTimes(s.Spec.Devices, w.Devices)
			u.Spec.SharedCounters = w.SharedCounters
			pl.updates = append(pl.updates, sliceWrite{index: i, slice: u})
		}
	}
	return pl
}

// indexLength is the number of hex digits of a slice index: 5, or more when
// a pool has more than 16^5 slices, so name order stays index order.
func indexLength(n int) int {
	return max(5, len(strconv.FormatInt(int64(n-1), 16)))
}

func encodeIndex(i, length int) string { return fmt.Sprintf("%0*x", length, i) }

// decodeIndex reads the index at the start of a slice's name.
func decodeIndex(name string, length int) (int, bool) {
	prefix, _, ok := strings.Cut(name, "-")
	if !ok || len(prefix) != length {
		return -1, false
	}
	i, err := strconv.ParseInt(prefix, 16, 0)
	if err != nil {
		return -1, false
	}
	return int(i), true
}

// devicesEqual is semantic equality of device lists where a taint's
// TimeAdded counts only when both sides have one (the API server fills it
// in) and then to the second (it stores seconds).
func devicesEqual(a, b []resourceapi.Device) bool { return deviceEqualities.DeepEqual(a, b) }

// deviceEqualities is apimachinery's semantic equality plus that taint rule
// (read-only after init).
var deviceEqualities = func() conversion.Equalities {
	e := apiequality.Semantic.Copy()
	if err := e.AddFunc(func(a, b resourceapi.DeviceTaint) bool {
		if a.TimeAdded != nil && b.TimeAdded != nil {
			if d := a.TimeAdded.Sub(b.TimeAdded.Time); d < -time.Second || d > time.Second {
				return false
			}
		}
		return a.Key == b.Key && a.Value == b.Value && a.Effect == b.Effect
	}); err != nil {
		panic(err)
	}
	return e
}()

// keepTaintTimes returns to with the TimeAdded of from's equal taints of
// the same device where to has none, so an update does not restart a
// taint's clock.
func keepTaintTimes(from, to []resourceapi.Device) []resourceapi.Device {
	out := make([]resourceapi.Device, len(to))
	for i, d := range to {
		out[i] = *d.DeepCopy()
		j := slices.IndexFunc(from, func(f resourceapi.Device) bool { return f.Name == d.Name })
		if j < 0 {
			continue
		}
		for k, t := range out[i].Taints {
			if t.TimeAdded != nil {
				continue
			}
			m := slices.IndexFunc(from[j].Taints, func(f resourceapi.DeviceTaint) bool {
				return f.Key == t.Key && f.Value == t.Value && f.Effect == t.Effect
			})
			if m >= 0 {
				out[i].Taints[k].TimeAdded = from[j].Taints[m].TimeAdded
			}
		}
	}
	return out
}
