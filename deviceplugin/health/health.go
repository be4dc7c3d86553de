// Package health decides which GPUs are healthy: a critical Xid error
// reported by NVML makes a GPU unhealthy, and - unlike NVIDIA's plugin - the
// GPU comes back once a quiet period passes with no new critical Xid. A GPU
// whose NVML queries fail is unhealthy until they succeed again.
package health

import (
	"context"
	"sort"
	"sync"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
)

// DefaultIgnoredXids are Xids caused by applications, not by the GPU: they
// show in the application's own errors and leave the GPU usable, so they
// never mark it unhealthy. 13 graphics engine exception, 31 GPU memory page
// fault, 43 GPU stopped processing (the app's context), 45 preemptive
// cleanup after an app error, 68 video decoder exception, 109 context
// switch timeout. The same list NVIDIA's device plugin uses.
var DefaultIgnoredXids = []uint64{13, 31, 43, 45, 68, 109}

// Options configures a Checker.
type Options struct {
	// IgnoredXids never mark a GPU unhealthy (default DefaultIgnoredXids).
	IgnoredXids []uint64
	// QuietPeriod is how long a GPU stays unhealthy after its last critical Xid.
	QuietPeriod time.Duration
	// ProbeInterval is how often GPUs are probed through NVML and quiet
	// periods re-checked (default 1s).
	ProbeInterval time.Duration
	// OnChange is called (from Run's goroutine) whenever the set of healthy GPUs changes.
	OnChange func()
	// OnXid is called for every Xid event, critical or not.
	OnXid func(ev nvidia.XidEvent, critical bool)
	Clock clock.WithTicker
}

// Checker tracks GPU health. Healthy is safe for concurrent use.
type Checker struct {
	lib     nvidia.Lib
	gpus    []string
	ignored map[uint64]bool
	opts    Options

	mu        sync.Mutex
	lastXid   map[string]time.Time // GPU UUID -> time of last critical Xid
	probeErr  map[string]error     // GPU UUID -> last NVML probe error
	unhealthy map[string]bool      // GPU UUID -> unhealthy, as last published
}

// NewChecker returns a checker for the GPUs with the given UUIDs.
func NewChecker(lib nvidia.Lib, gpus []string, o Options) *Checker {
	if o.IgnoredXids == nil {
		o.IgnoredXids = DefaultIgnoredXids
	}
	if o.ProbeInterval <= 0 {
		o.ProbeInterval = time.Second
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	c := &Checker{
		lib:       lib,
		gpus:      append([]string(nil), gpus...),
		ignored:   map[uint64]bool{},
		opts:      o,
		lastXid:   map[string]time.Time{},
		probeErr:  map[string]error{},
		unhealthy: map[string]bool{},
	}
	for _, x := range o.IgnoredXids {
		c.ignored[x] = true
	}
	return c
}

// Healthy tells whether the GPU is healthy as last published.
func (c *Checker) Healthy(uuid string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.unhealthy[uuid]
}

// Unhealthy lists the unhealthy GPUs, sorted.
func (c *Checker) Unhealthy() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for u, bad := range c.unhealthy {
		if bad {
			out = append(out, u)
		}
	}
	sort.Strings(out)
	return out
}

// Run watches Xid events and probes GPUs until ctx ends. Without an event
// source (WatchXids fails) it keeps probing and logs why.
func (c *Checker) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	events, err := c.lib.WatchXids(ctx)
	if err != nil {
		logger.Error(err, "Xid events unavailable; health relies on NVML probes only")
	}
	tick := c.opts.Clock.NewTicker(c.opts.ProbeInterval)
	defer tick.Stop()
	c.probe(ctx)
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-events:
			if !ok {
				events = nil // the source ended with ctx; keep probing until ctx is done
				continue
			}
			c.record(ctx, ev)
		case <-tick.C():
			c.probe(ctx)
		}
	}
}

func (c *Checker) record(ctx context.Context, ev nvidia.XidEvent) {
	critical := !c.ignored[ev.Xid]
	logger := klog.FromContext(ctx)
	if c.opts.OnXid != nil {
		c.opts.OnXid(ev, critical)
	}
	if !critical {
		logger.V(2).Info("Ignoring application Xid", "gpu", ev.UUID, "xid", ev.Xid)
		return
	}
	logger.Info("Critical Xid; marking GPU unhealthy", "gpu", ev.UUID, "xid", ev.Xid, "quietPeriod", c.opts.QuietPeriod)
	c.mu.Lock()
	c.lastXid[ev.UUID] = c.opts.Clock.Now()
	c.mu.Unlock()
	c.publish(ctx)
}

// probe queries every GPU's memory through NVML; a failing query marks the
// GPU unhealthy until a later probe succeeds.
func (c *Checker) probe(ctx context.Context) {
	for _, u := range c.gpus {
		_, err := c.lib.Memory(u)
		c.mu.Lock()
		prev := c.probeErr[u]
		if err != nil {
			c.probeErr[u] = err
		} else {
			delete(c.probeErr, u)
		}
		c.mu.Unlock()
		if err != nil && prev == nil {
			klog.FromContext(ctx).Error(err, "NVML probe failed; marking GPU unhealthy", "gpu", u)
		} else if err == nil && prev != nil {
			klog.FromContext(ctx).Info("NVML probe succeeds again", "gpu", u)
		}
	}
	c.publish(ctx)
}

// publish recomputes health and calls OnChange if it changed.
func (c *Checker) publish(ctx context.Context) {
	now := c.opts.Clock.Now()
	changed := false
	c.mu.Lock()
	for _, u := range c.gpus {
		t, hadXid := c.lastXid[u]
		bad := c.probeErr[u] != nil || (hadXid && now.Sub(t) < c.opts.QuietPeriod)
		if bad != c.unhealthy[u] {
			changed = true
			c.unhealthy[u] = bad
			if !bad && hadXid {
				klog.FromContext(ctx).Info("GPU healthy again after quiet period", "gpu", u)
			}
		}
	}
	c.mu.Unlock()
	if changed && c.opts.OnChange != nil {
		c.opts.OnChange()
	}
}
