// Package cdi checks, with the CDI project's own library
// (tags.cncf.io/container-device-interface), that every CDI device name
// gpufrac-node hands out with --device-list-strategy=cdi
// ("nvidia.com/gpu=<GPU or MIG UUID>") resolves in the node's CDI specs, the
// ones the NVIDIA container toolkit writes (nvidia-ctk cdi generate
// --device-name-strategy=uuid). Without the check a missing toolkit spec, or
// one left stale by a MIG layout change, shows only when the container
// runtime fails to create a pod's container; with it the node says so at
// once: a log line, gpufrac_cdi_devices_unresolved, a CDISpecMissing Node
// event, /readyz failing, and Allocate refusing the pod with the reason.
//
// The specs are watched (the library's fsnotify auto-refresh) and checked
// again every interval and whenever the devices served change.
package cdi

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
)

// Kind is the CDI vendor/class of gpufrac's devices (resource.CDIKind).
const Kind = "nvidia.com/gpu"

// DefaultSpecDirs are the CDI spec directories container runtimes read.
var DefaultSpecDirs = []string{"/etc/cdi", "/var/run/cdi"}

// DefaultInterval is how often the specs are checked without a change.
const DefaultInterval = 10 * time.Second

// ErrUnresolved is returned (wrapped, with the names) by Allocate when a
// device name resolves in no CDI spec.
var ErrUnresolved = errors.New("CDI devices not in the node's CDI specs")

// Status is the outcome of a check.
type Status struct {
	// Missing are the device names served that no spec resolves, sorted.
	Missing []string
	// SpecErrors are the spec files that could not be used, with why.
	SpecErrors []string
}

// OK tells whether every device served resolves.
func (s Status) OK() bool { return len(s.Missing) == 0 }

// Options configure a Checker.
type Options struct {
	// SpecDirs are the CDI spec directories; nil is DefaultSpecDirs.
	SpecDirs []string
	// Interval is the period of the check; zero is DefaultInterval.
	Interval time.Duration
	// OnChange is called (from Run's goroutine) when the status changes:
	// after the first check, and whenever the set of missing devices does.
	OnChange func(Status)
	// Registerer receives the metrics (nil: not exported).
	Registerer prometheus.Registerer
}

// Checker resolves device names in the node's CDI specs.
type Checker struct {
	opts    Options
	cache   *cdiapi.Cache
	metrics *metrics
	wake    chan struct{}

	mu     sync.Mutex
	wanted []string // CDI device names gpufrac-node serves now
	status Status
	seen   bool // a check has run
}

// New returns a Checker on the spec directories, watching them for changes
// until Run returns.
func New(o Options) (*Checker, error) {
	if o.SpecDirs == nil {
		o.SpecDirs = DefaultSpecDirs
	}
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(o.SpecDirs...), cdiapi.WithAutoRefresh(true))
	if err != nil {
		return nil, fmt.Errorf("reading CDI specs in %s: %w", strings.Join(o.SpecDirs, ", "), err)
	}
	m := newMetrics()
	if o.Registerer != nil {
		if err := m.register(o.Registerer); err != nil {
			return nil, fmt.Errorf("registering CDI metrics: %w", err)
		}
	}
	return &Checker{opts: o, cache: cache, metrics: m, wake: make(chan struct{}, 1)}, nil
}

// Name is the CDI device name of a GPU or MIG device UUID.
func Name(uuid string) string { return Kind + "=" + uuid }

// SetWanted sets the device names gpufrac-node serves (after a config or
// MIG layout change) and has Run check them at once.
func (c *Checker) SetWanted(names []string) {
	names = slices.Compact(slices.Sorted(slices.Values(names)))
	c.mu.Lock()
	c.wanted = names
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// Unresolved returns the names, among names, that no spec resolves now.
func (c *Checker) Unresolved(names []string) []string {
	// In auto-refresh mode this rescans only when a watched directory
	// changed, and re-adds watches on directories created since.
	_ = c.cache.Refresh()
	missing := c.missing(names)
	if len(missing) > 0 {
		// The watch reloads asynchronously: before saying no, rescan (this
		// also restarts the watch, so directories created since are watched).
		_ = c.cache.Configure(cdiapi.WithAutoRefresh(true))
		missing = c.missing(names)
	}
	return missing
}

func (c *Checker) missing(names []string) []string {
	var missing []string
	for _, n := range names {
		if c.cache.GetDevice(n) == nil {
			missing = append(missing, n)
		}
	}
	return missing
}

// Check checks the wanted names now and returns the status.
func (c *Checker) Check() Status {
	c.mu.Lock()
	wanted := c.wanted
	c.mu.Unlock()
	st := Status{Missing: c.Unresolved(wanted)}
	errsByPath := c.cache.GetErrors()
	for _, path := range slices.Sorted(maps.Keys(errsByPath)) {
		// A spec directory that does not exist is normal (runtimes read
		// both, toolkits write one); only spec files count.
		if errs := errsByPath[path]; len(errs) > 0 && !slices.Contains(c.opts.SpecDirs, path) {
			st.SpecErrors = append(st.SpecErrors, fmt.Sprintf("%s: %v", path, errors.Join(errs...)))
		}
	}
	c.metrics.observe(len(wanted), st)
	return st
}

// Ready returns nil when every served device resolves (or no check has run
// yet), else why not, for /readyz.
func (c *Checker) Ready() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.status.OK() {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrUnresolved, c.describeLocked(c.status))
}

// Describe says what is missing and what to do.
func (c *Checker) Describe(st Status) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.describeLocked(st)
}

func (c *Checker) describeLocked(st Status) string {
	const maxNames = 4
	names := st.Missing
	more := ""
	if len(names) > maxNames {
		more = fmt.Sprintf(" and %d more", len(names)-maxNames)
		names = names[:maxNames]
	}
	msg := fmt.Sprintf("%d of %d devices served have no CDI spec in %s (%s%s); generate the spec with the NVIDIA container toolkit (nvidia-ctk cdi generate --device-name-strategy=uuid --output=/var/run/cdi/nvidia.yaml), again after every MIG layout change",
		len(st.Missing), len(c.wanted), strings.Join(c.opts.SpecDirs, ", "), strings.Join(names, ", "), more)
	if len(st.SpecErrors) > 0 {
		msg += "; spec errors: " + strings.Join(st.SpecErrors, "; ")
	}
	return msg
}

// concerns tells whether a changed path is a spec directory or in one.
func (c *Checker) concerns(path string) bool {
	for _, d := range c.opts.SpecDirs {
		if path == d || filepath.Dir(path) == d {
			return true
		}
	}
	return false
}

// Run checks the specs every interval, on SetWanted and when a file in a
// spec directory changes, until ctx ends, calling OnChange when the status
// changes; then it stops watching the specs.
func (c *Checker) Run(ctx context.Context) error {
	defer func() { _ = c.cache.Configure(cdiapi.WithAutoRefresh(false)) }()
	logger := klog.FromContext(ctx)
	t := time.NewTicker(c.opts.Interval)
	defer t.Stop()
	// The library's cache reloads changed specs itself but tells no one:
	// watch the directories too, to check at once. A directory that does not
	// exist yet is watched through its parent until it appears.
	var changes <-chan fsnotify.Event
	watch := func() {}
	if w, err := fsnotify.NewWatcher(); err == nil {
		defer w.Close()
		changes = w.Events
		watched := map[string]bool{}
		watch = func() {
			for _, d := range c.opts.SpecDirs {
				if watched[d] {
					continue
				}
				if err := w.Add(d); err == nil {
					watched[d] = true
					_ = w.Remove(filepath.Dir(d))
					continue
				}
				_ = w.Add(filepath.Dir(d))
			}
		}
	}
	for {
		watch()
		st := c.Check()
		c.mu.Lock()
		changed := !c.seen || !slices.Equal(st.Missing, c.status.Missing) || !slices.Equal(st.SpecErrors, c.status.SpecErrors)
		c.seen = true
		c.status = st
		c.mu.Unlock()
		if changed {
			if st.OK() {
				logger.Info("Every device served resolves in the node's CDI specs", "dirs", c.opts.SpecDirs, "specErrors", st.SpecErrors)
			} else {
				logger.Error(ErrUnresolved, "Devices served have no CDI spec; pods given them cannot start", "missing", st.Missing, "dirs", c.opts.SpecDirs, "specErrors", st.SpecErrors)
			}
			if c.opts.OnChange != nil {
				c.opts.OnChange(st)
			}
		}
	wait:
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
				break wait
			case <-c.wake:
				break wait
			case ev := <-changes:
				if c.concerns(ev.Name) {
					// Let a burst of events (write, rename) settle.
					time.Sleep(50 * time.Millisecond)
					break wait
				}
			}
		}
	}
}
