package config

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// DefaultDebounce is how long the Watcher waits after the last file event
// before it reads the file: editors and the kubelet touch several names per
// update.
const DefaultDebounce = 100 * time.Millisecond

// MaxFileSize is the largest config file the Watcher reads; a ConfigMap
// cannot be larger than 1 MiB.
const MaxFileSize = 4 << 20

// configMapDataDir is the symlink the kubelet swaps atomically to update a
// ConfigMap volume (config.yaml -> ..data/config.yaml, ..data -> ..<timestamp>).
const configMapDataDir = "..data"

// Option configures a [Watcher].
type Option func(*watcherOptions)

type watcherOptions struct {
	onChange func(old, new *File)
	onReject func(err error)
	check    func(*File) error
	reg      prometheus.Registerer
	debounce time.Duration
	clock    clock.Clock
}

// WithOnChange sets the function called, from Run's goroutine, when a new
// valid config is in force. old is nil if no config was in force before.
func WithOnChange(fn func(old, new *File)) Option {
	return func(o *watcherOptions) {
		if fn != nil {
			o.onChange = fn
		}
	}
}

// WithOnReject sets the function called, from Run's goroutine, when the file
// cannot be read or its content is invalid; the last good config stays in
// force. A file that went missing gives an error matching fs.ErrNotExist; an
// invalid one wraps a [*ValidationError] or a YAML error.
func WithOnReject(fn func(err error)) Option {
	return func(o *watcherOptions) {
		if fn != nil {
			o.onReject = fn
		}
	}
}

// WithCheck adds a check a parsed, valid config must also pass to be taken,
// such as resolving it for this node: func(f *File) error { _, err :=
// f.Resolve(labels, gpus); return err }. A failed check is a rejection.
func WithCheck(fn func(*File) error) Option {
	return func(o *watcherOptions) { o.check = fn }
}

// WithRegisterer registers the Watcher's metrics on reg:
// gpufrac_config_reloads_total{result="success|rejected"} and
// gpufrac_config_last_reload_success_timestamp_seconds. Without it the
// metrics are kept but not exported.
func WithRegisterer(reg prometheus.Registerer) Option {
	return func(o *watcherOptions) { o.reg = reg }
}

// WithDebounce sets how long to wait after the last file event before
// reading the file (default [DefaultDebounce]).
func WithDebounce(d time.Duration) Option {
	return func(o *watcherOptions) {
		if d > 0 {
			o.debounce = d
		}
	}
}

// WithClock sets the clock used for debouncing and for the last-success
// timestamp (default the real clock).
func WithClock(c clock.Clock) Option {
	return func(o *watcherOptions) {
		if c != nil {
			o.clock = c
		}
	}
}

// Watcher keeps the config from one file in force and hot-reloads it.
//
// It watches the file's directory rather than the file, so it follows both
// editors that replace the file (remove or rename, then create) and the
// kubelet's ConfigMap volume updates, which swap the "..data" symlink the
// file points through. Events are debounced, and content that hashes the
// same as the last read is ignored. Invalid content never replaces the
// config in force: it is reported through OnReject instead.
//
// Call Load once, then Run; they must not run concurrently. Current may be
// called from any goroutine.
type Watcher struct {
	path     string // absolute and clean
	dir      string // filepath.Dir(path), the directory watched
	debounce time.Duration
	clock    clock.Clock
	onChange func(old, new *File)
	onReject func(err error)
	check    func(*File) error
	metrics  *metrics

	// mu guards current, which Current reads from any goroutine.
	mu      sync.Mutex
	current *File

	// The fields below belong to the goroutine in Load or Run.
	currentHash [sha256.Size]byte // hash of the bytes current was parsed from
	seen        bool              // seenHash and seenErr describe the last bytes read
	seenHash    [sha256.Size]byte
	seenErr     error  // what the last bytes read gave; nil when they are in force
	readErr     error  // the last failure to read the file; nil after a read
	realPath    string // path with symlinks resolved, as of the last watchTarget
}

// NewWatcher returns a Watcher of the config file at path. It fails only if
// path cannot be made absolute or the metrics cannot be registered.
func NewWatcher(path string, opts ...Option) (*Watcher, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("resolving config file path %s: %w", path, err)
	}
	o := watcherOptions{
		onChange: func(_, _ *File) {},
		onReject: func(error) {},
		debounce: DefaultDebounce,
		clock:    clock.RealClock{},
	}
	for _, opt := range opts {
		opt(&o)
	}
	m, err := newMetrics(o.reg)
	if err != nil {
		return nil, fmt.Errorf("creating config watcher: %w", err)
	}
	return &Watcher{
		path:     abs,
		dir:      filepath.Dir(abs),
		debounce: o.debounce,
		clock:    o.clock,
		onChange: o.onChange,
		onReject: o.onReject,
		check:    o.check,
		metrics:  m,
	}, nil
}

// Current returns the config in force, or nil if none was ever valid. The
// File is shared: callers must not modify it.
func (w *Watcher) Current() *File {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.current
}

// Load reads the file and, if it is valid, puts it in force and returns it.
// A missing or invalid file is an error for the caller to judge; the Watcher
// stays usable, and Run will take the first valid content that appears.
// Load does not call OnChange or OnReject.
func (w *Watcher) Load(ctx context.Context) (*File, error) {
	logger := klog.FromContext(ctx).WithValues("path", w.path)
	_, f, out, err := w.read()
	w.count(out)
	switch out {
	case outcomeRejected:
		return nil, err
	case outcomeUnchanged, outcomeRestored:
		if err != nil {
			return nil, err
		}
		return w.Current(), nil
	}
	logger.Info("Config loaded", "groups", len(f.Groups), "mode", f.Default.Mode)
	return f, nil
}

// Run watches the file until ctx is done, then returns nil. It first reads
// the file once, to catch any change since Load (or, without Load, to load
// it), then re-reads it after every burst of events. It returns an error only
// if the watch cannot be set up or breaks, e.g. when the directory is missing.
func (w *Watcher) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithValues("path", w.path)
	ctx = klog.NewContext(ctx, logger)

	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("starting config file watch: %w", err)
	}
	defer func() {
		if err := fw.Close(); err != nil {
			logger.Error(err, "Closing config file watch")
		}
	}()
	// The directory, not the file: a watch on the file would follow the old
	// inode when the file is replaced or the ..data symlink swapped.
	if err := fw.Add(w.dir); err != nil {
		return fmt.Errorf("watching config directory %s: %w", w.dir, err)
	}

	// 1. Catch up with anything that changed before the watch was set.
	targetDir := ""
	reload := func() {
		// Watch the target before reading it: a change after the read then
		// always raises an event.
		targetDir = w.watchTarget(ctx, fw, targetDir)
		w.reload(ctx)
	}
	reload()
	logger.V(2).Info("Watching config file", "dir", w.dir, "targetDir", targetDir)

	// 2. Debounce events; read the file once they stop.
	var timer clock.Timer
	var fire <-chan time.Time
	schedule := func() {
		if timer != nil {
			timer.Stop()
		}
		timer = w.clock.NewTimer(w.debounce)
		fire = timer.C()
	}
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			logger.V(2).Info("Config watch stopped")
			return nil
		case ev, ok := <-fw.Events:
			if !ok {
				return errors.New("watching config file: event channel closed")
			}
			if w.relevant(ev) {
				logger.V(5).Info("Config file event", "event", ev.String())
				schedule()
			}
		case err, ok := <-fw.Errors:
			if !ok {
				return errors.New("watching config file: error channel closed")
			}
			// Events may have been lost (inotify queue overflow): read again.
			logger.Error(err, "Config file watch error; reading the file again")
			schedule()
		case <-fire:
			timer, fire = nil, nil
			reload()
		}
	}
}

// relevant reports whether ev may have changed what path reads: the file
// itself, the ConfigMap ..data symlink, or the file the path resolved to.
// Chmod alone cannot change content.
func (w *Watcher) relevant(ev fsnotify.Event) bool {
	if ev.Op == fsnotify.Chmod {
		return false
	}
	switch filepath.Clean(ev.Name) {
	case w.path, filepath.Join(w.dir, configMapDataDir), w.realPath:
		return true
	}
	return false
}

// watchTarget resolves the path's symlinks and also watches the directory of
// the file it resolves to when that is not the watched directory, so edits of
// a symlink's target in its own directory are seen. A change of the link
// itself (the path or ..data) is an event in the watched directory, after
// which watchTarget runs again. It returns the target directory now watched,
// "" for none.
func (w *Watcher) watchTarget(ctx context.Context, fw *fsnotify.Watcher, watched string) string {
	if real, err := filepath.EvalSymlinks(w.path); err == nil {
		w.realPath = real
	}
	want := ""
	if w.realPath != "" && filepath.Dir(w.realPath) != w.dir {
		want = filepath.Dir(w.realPath)
	}
	if want == watched {
		return watched
	}
	if watched != "" {
		// The directory may be gone already (an old ConfigMap timestamp
		// directory), which also ends its watch; nothing to report.
		_ = fw.Remove(watched)
	}
	if want == "" {
		return ""
	}
	if err := fw.Add(want); err != nil {
		klog.FromContext(ctx).V(2).Info("Cannot watch the config file's target directory", "dir", want, "err", err)
		return ""
	}
	return want
}

// reload reads the file and reports the outcome through logs, metrics and
// the callbacks.
func (w *Watcher) reload(ctx context.Context) {
	logger := klog.FromContext(ctx)
	old, f, out, err := w.read()
	w.count(out)
	switch out {
	case outcomeUnchanged:
		logger.V(4).Info("Config file unchanged")
	case outcomeRestored:
		logger.Info("Config file is back to the config in force")
	case outcomeRejected:
		logger.Error(err, "Config rejected; keeping the last good config", "haveConfig", w.Current() != nil)
		w.onReject(err)
	case outcomeChanged:
		logger.Info("Config changed", "groups", len(f.Groups), "mode", f.Default.Mode, "first", old == nil)
		w.onChange(old, f)
	}
}

// outcome is the result of one read of the file.
type outcome int

const (
	// outcomeUnchanged: the same bytes, or the same read error, as last time.
	outcomeUnchanged outcome = iota
	// outcomeChanged: new valid content is now in force.
	outcomeChanged
	// outcomeRestored: the bytes of the config in force, after other content.
	outcomeRestored
	// outcomeRejected: unreadable or invalid; the last good config stays.
	outcomeRejected
)

// read reads and parses the file. For outcomeUnchanged err is what those
// bytes gave last time (nil if they are in force).
func (w *Watcher) read() (old, f *File, out outcome, err error) {
	data, err := readLimited(w.path)
	if err != nil {
		err = fmt.Errorf("reading config file %s: %w", w.path, err)
		if w.readErr != nil && w.readErr.Error() == err.Error() {
			return nil, nil, outcomeUnchanged, err
		}
		// Forget the last bytes, so whatever comes back is looked at again.
		w.seen, w.readErr = false, err
		return nil, nil, outcomeRejected, err
	}
	w.readErr = nil
	sum := sha256.Sum256(data)
	if w.seen && sum == w.seenHash {
		return nil, nil, outcomeUnchanged, w.seenErr
	}
	w.seen, w.seenHash, w.seenErr = true, sum, nil
	if cur := w.Current(); cur != nil && sum == w.currentHash {
		return nil, cur, outcomeRestored, nil
	}
	f, err = Parse(data)
	if err == nil && w.check != nil {
		if cerr := w.check(f); cerr != nil {
			err = fmt.Errorf("checking config: %w", cerr)
		}
	}
	if err != nil {
		w.seenErr = fmt.Errorf("loading config file %s: %w", w.path, err)
		return nil, nil, outcomeRejected, w.seenErr
	}
	w.mu.Lock()
	old, w.current = w.current, f
	w.mu.Unlock()
	w.currentHash = sum
	return old, f, outcomeChanged, nil
}

func (w *Watcher) count(out outcome) {
	switch out {
	case outcomeChanged, outcomeRestored:
		w.metrics.reloads.WithLabelValues(reloadSuccess).Inc()
		w.metrics.lastSuccess.Set(float64(w.clock.Now().UnixNano()) / 1e9)
		w.metrics.lastOK.Set(1)
	case outcomeRejected:
		w.metrics.reloads.WithLabelValues(reloadRejected).Inc()
		w.metrics.lastOK.Set(0)
	}
}

// readLimited reads at most MaxFileSize bytes of path.
func readLimited(path string) ([]byte, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	data, err := io.ReadAll(io.LimitReader(file, MaxFileSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxFileSize {
		return nil, fmt.Errorf("larger than %d bytes", MaxFileSize)
	}
	return data, nil
}
