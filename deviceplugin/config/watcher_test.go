package config

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	clocktesting "k8s.io/utils/clock/testing"
)

// waitBound bounds every wait for the watcher; it is generous because the
// test machine's cores are shared.
const waitBound = 10 * time.Second

// cfg is a valid config told apart by its replica count.
func cfg(replicas int) string {
	return fmt.Sprintf("version: v1\ndefault:\n  timeslice: {replicas: %d}\n", replicas)
}

const badConfig = "version: v1\ndefault: {mode: frac}\n"

type change struct{ old, new *File }

// harness runs a Watcher and collects what its callbacks report.
type harness struct {
	t       *testing.T
	ctx     context.Context
	w       *Watcher
	reg     *prometheus.Registry
	changes chan change
	rejects chan error
	stop    func()
}

func newHarness(t *testing.T, path string, opts ...Option) *harness {
	t.Helper()
	ctx, cancel := context.WithCancel(klog.NewContext(t.Context(), ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(5)))))
	h := &harness{
		t:       t,
		ctx:     ctx,
		reg:     prometheus.NewRegistry(),
		changes: make(chan change, 16),
		rejects: make(chan error, 16),
	}
	opts = append([]Option{
		WithRegisterer(h.reg),
		WithDebounce(20 * time.Millisecond),
		WithOnChange(func(old, new *File) {
			select {
			case h.changes <- change{old, new}:
			case <-ctx.Done():
			}
		}),
		WithOnReject(func(err error) {
			select {
			case h.rejects <- err:
			case <-ctx.Done():
			}
		}),
	}, opts...)
	w, err := NewWatcher(path, opts...)
	if err != nil {
		t.Fatalf("NewWatcher: %v", err)
	}
	h.w = w
	h.stop = cancel
	t.Cleanup(cancel)
	return h
}

// run starts Run and makes the test wait, bounded, for it to return.
func (h *harness) run() {
	done := make(chan error, 1)
	go func() { done <- h.w.Run(h.ctx) }()
	cancel := h.stop
	var once sync.Once
	h.stop = func() {
		h.t.Helper()
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					h.t.Errorf("Run: %v", err)
				}
			case <-time.After(waitBound):
				h.t.Errorf("Run did not return within %v of cancel", waitBound)
			}
		})
	}
	h.t.Cleanup(h.stop)
}

func (h *harness) load(wantReplicas int) *File {
	h.t.Helper()
	f, err := h.w.Load(h.ctx)
	if err != nil {
		h.t.Fatalf("Load: %v", err)
	}
	if got := f.Default.Timeslice.Replicas; got != wantReplicas {
		h.t.Fatalf("Load gave replicas %d, want %d", got, wantReplicas)
	}
	return f
}

// waitChange waits for OnChange to a config with wantReplicas. Rejections on
// the way are tolerated only if allowRejects: a plain write can be read
// half-done (truncated, not yet written).
func (h *harness) waitChange(wantReplicas int, allowRejects bool) change {
	h.t.Helper()
	deadline := time.After(waitBound)
	for {
		select {
		case c := <-h.changes:
			if got := c.new.Default.Timeslice.Replicas; got != wantReplicas {
				h.t.Fatalf("OnChange to replicas %d, want %d", got, wantReplicas)
			}
			if cur := h.w.Current(); cur != c.new {
				h.t.Errorf("Current() = %p, want the new config %p", cur, c.new)
			}
			return c
		case err := <-h.rejects:
			if !allowRejects {
				h.t.Fatalf("OnReject(%v), want OnChange to replicas %d", err, wantReplicas)
			}
			h.t.Logf("tolerated a transient rejection: %v", err)
		case <-deadline:
			h.t.Fatalf("no OnChange to replicas %d within %v", wantReplicas, waitBound)
		}
	}
}

func (h *harness) waitReject() error {
	h.t.Helper()
	select {
	case err := <-h.rejects:
		return err
	case c := <-h.changes:
		h.t.Fatalf("OnChange to replicas %d, want OnReject", c.new.Default.Timeslice.Replicas)
	case <-time.After(waitBound):
		h.t.Fatalf("no OnReject within %v", waitBound)
	}
	return nil
}

// stopAndExpectQuiet stops Run and checks no callback is left unread.
func (h *harness) stopAndExpectQuiet() {
	h.t.Helper()
	h.stop()
	if n := len(h.changes); n > 0 {
		c := <-h.changes
		h.t.Errorf("%d unexpected OnChange calls, first to replicas %d", n, c.new.Default.Timeslice.Replicas)
	}
	if n := len(h.rejects); n > 0 {
		h.t.Errorf("%d unexpected OnReject calls, first: %v", n, <-h.rejects)
	}
}

func (h *harness) reloads(result string) float64 {
	return testutil.ToFloat64(h.w.metrics.reloads.WithLabelValues(result))
}

// waitReloads polls, bounded, until the reload counter for result reaches want.
func (h *harness) waitReloads(result string, want float64) {
	h.t.Helper()
	deadline := time.Now().Add(waitBound)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for h.reloads(result) < want {
		if time.Now().After(deadline) {
			h.t.Fatalf("gpufrac_config_reloads_total{result=%q} = %v, want %v within %v", result, h.reloads(result), want, waitBound)
		}
		<-tick.C
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatalf("writing %s: %v", path, err)
	}
}

// replaceFile writes content beside path and renames it over path, as
// editors and config tools do to replace a file atomically.
func replaceFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	writeFile(t, tmp, content)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatalf("renaming %s over %s: %v", tmp, path, err)
	}
}

// configMapVolume builds and updates a directory the way the kubelet's
// atomic writer does for a ConfigMap volume:
//
//	config.yaml -> ..data/config.yaml
//	..data -> ..2024_01_01_00_00_00.000000001
//	..2024_01_01_00_00_00.000000001/config.yaml
//
// An update writes a new timestamped directory, points a ..data_tmp symlink
// at it, renames ..data_tmp over ..data and removes the old directory.
type configMapVolume struct {
	t   *testing.T
	dir string
	gen int
	ts  string // current timestamped directory
}

func newConfigMapVolume(t *testing.T, content string) *configMapVolume {
	v := &configMapVolume{t: t, dir: t.TempDir()}
	v.update(content)
	if err := os.Symlink(filepath.Join(configMapDataDir, "config.yaml"), v.path()); err != nil {
		t.Fatalf("linking config.yaml: %v", err)
	}
	return v
}

func (v *configMapVolume) path() string { return filepath.Join(v.dir, "config.yaml") }

func (v *configMapVolume) update(content string) {
	t := v.t
	t.Helper()
	v.gen++
	ts := fmt.Sprintf("..2024_01_01_00_00_%02d.%09d", v.gen%60, v.gen)
	if err := os.Mkdir(filepath.Join(v.dir, ts), 0o755); err != nil {
		t.Fatalf("creating %s: %v", ts, err)
	}
	writeFile(t, filepath.Join(v.dir, ts, "config.yaml"), content)
	tmp := filepath.Join(v.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		t.Fatalf("linking ..data_tmp: %v", err)
	}
	if err := os.Rename(tmp, filepath.Join(v.dir, configMapDataDir)); err != nil {
		t.Fatalf("swapping ..data: %v", err)
	}
	if v.ts != "" {
		if err := os.RemoveAll(filepath.Join(v.dir, v.ts)); err != nil {
			t.Fatalf("removing %s: %v", v.ts, err)
		}
	}
	v.ts = ts
}

func TestWatcherPlainFileEdit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	writeFile(t, path, cfg(2))
	h := newHarness(t, path)
	first := h.load(2)
	h.run()

	writeFile(t, path, cfg(3))
	c := h.waitChange(3, true)
	if c.old != first {
		t.Errorf("OnChange old = %+v, want the loaded config", c.old)
	}

	// A write of the same bytes is no change; the next real edit is the
	// next OnChange, from the config in force.
	writeFile(t, path, cfg(3))
	writeFile(t, path, cfg(4))
	c2 := h.waitChange(4, true)
	if c2.old != c.new {
		t.Errorf("OnChange old has replicas %d, want the config with 3", c2.old.Default.Timeslice.Replicas)
	}
}

func TestWatcherConfigMapSymlinkSwap(t *testing.T) {
	v := newConfigMapVolume(t, cfg(2))
	h := newHarness(t, v.path())
	first := h.load(2)
	h.run()

	v.update(cfg(3))
	c := h.waitChange(3, false)
	if c.old != first {
		t.Errorf("OnChange old = %+v, want the loaded config", c.old)
	}
	v.update(cfg(5))
	c2 := h.waitChange(5, false)
	if c2.old != c.new {
		t.Errorf("second OnChange old has replicas %d, want 3", c2.old.Default.Timeslice.Replicas)
	}
	h.stopAndExpectQuiet()

	if got := h.reloads(reloadSuccess); got != 3 {
		t.Errorf("successful reloads = %v, want 3 (load + 2 updates, each counted once)", got)
	}
	if got := h.reloads(reloadRejected); got != 0 {
		t.Errorf("rejected reloads = %v, want 0", got)
	}
	entries, err := os.ReadDir(v.dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if diff := cmp.Diff([]string{"..2024_01_01_00_00_03.000000003", "..data", "config.yaml"}, names); diff != "" {
		t.Errorf("volume layout (-want +got):\n%s", diff)
	}
}

func TestWatcherBadFileKeepsLastGood(t *testing.T) {
	v := newConfigMapVolume(t, cfg(2))
	h := newHarness(t, v.path())
	first := h.load(2)
	h.run()

	v.update(badConfig)
	err := h.waitReject()
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("OnReject(%v), want an error matching ErrInvalid", err)
	}
	if want := `default.mode: unsupported mode "frac" (want exclusive, fraction, timeslice, mig or dra)`; !strings.Contains(err.Error(), want) {
		t.Errorf("OnReject(%v), want it to say %q", err, want)
	}
	if !strings.Contains(err.Error(), v.path()) {
		t.Errorf("OnReject(%v), want it to name the file %s", err, v.path())
	}
	if cur := h.w.Current(); cur != first {
		t.Errorf("Current() after a bad file = %+v, want the last good config", cur)
	}
	h.waitReloads(reloadRejected, 1)

	// Going back to the bytes in force is a success without OnChange.
	v.update(cfg(2))
	h.waitReloads(reloadSuccess, 2)
	if cur := h.w.Current(); cur != first {
		t.Errorf("Current() after restoring = %+v, want the same config", cur)
	}

	// The bad file again is rejected again; then a fix is taken.
	v.update(badConfig)
	if err := h.waitReject(); !errors.Is(err, ErrInvalid) {
		t.Errorf("second OnReject(%v), want ErrInvalid", err)
	}
	v.update(cfg(6))
	c := h.waitChange(6, false)
	if c.old != first {
		t.Errorf("OnChange old = %+v, want the last good config", c.old)
	}
	h.stopAndExpectQuiet()
	if got, want := h.reloads(reloadRejected), 2.0; got != want {
		t.Errorf("rejected reloads = %v, want %v", got, want)
	}
}

func TestWatcherRemoveAndRecreate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	writeFile(t, path, cfg(2))
	h := newHarness(t, path)
	first := h.load(2)
	h.run()

	// Gone: reported, last good kept.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := h.waitReject(); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("OnReject(%v), want fs.ErrNotExist", err)
	}
	if cur := h.w.Current(); cur != first {
		t.Errorf("Current() with the file gone = %+v, want the last good config", cur)
	}
	// Back with new content.
	writeFile(t, path, cfg(3))
	h.waitChange(3, true)

	// An editor's remove and recreate in quick succession.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	writeFile(t, path, cfg(4))
	h.waitChange(4, true)

	// An editor's write-and-rename.
	replaceFile(t, path, cfg(5))
	h.waitChange(5, false)
	h.stopAndExpectQuiet()
}

func TestWatcherFollowsSymlinkTarget(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"etc", "a", "b"} {
		if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(root, "a", "real.yaml"), cfg(2))
	writeFile(t, filepath.Join(root, "b", "other.yaml"), cfg(7))
	path := filepath.Join(root, "etc", "config.yaml")
	if err := os.Symlink(filepath.Join("..", "a", "real.yaml"), path); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, path)
	h.load(2)
	h.run()

	// The target is replaced in its own directory.
	replaceFile(t, filepath.Join(root, "a", "real.yaml"), cfg(3))
	h.waitChange(3, false)

	// The link is repointed to another directory, then that target edited.
	tmp := filepath.Join(root, "etc", "config.yaml.new")
	if err := os.Symlink(filepath.Join("..", "b", "other.yaml"), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	h.waitChange(7, false)
	replaceFile(t, filepath.Join(root, "b", "other.yaml"), cfg(8))
	h.waitChange(8, false)

	// The old target is no longer the config.
	replaceFile(t, filepath.Join(root, "a", "real.yaml"), cfg(9))
	replaceFile(t, filepath.Join(root, "b", "other.yaml"), cfg(10))
	h.waitChange(10, false)
	h.stopAndExpectQuiet()
}

func TestWatcherStartsWithoutValidFile(t *testing.T) {
	tests := []struct {
		name    string
		initial string // "" for no file
		wantErr error
	}{
		{name: "missing file", wantErr: fs.ErrNotExist},
		{name: "invalid file", initial: badConfig, wantErr: ErrInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := newConfigMapVolume(t, cfg(2))
			if tc.initial == "" {
				if err := os.Remove(v.path()); err != nil {
					t.Fatal(err)
				}
			} else {
				v.update(tc.initial)
			}
			h := newHarness(t, v.path())
			f, err := h.w.Load(h.ctx)
			if !errors.Is(err, tc.wantErr) || f != nil {
				t.Fatalf("Load = %v, %v; want nil, an error matching %v", f, err, tc.wantErr)
			}
			// The caller chose to go on: Run does not report the same
			// problem again, and takes the first valid config.
			h.run()
			v.update(cfg(3))
			if tc.initial == "" {
				// As when the kubelet first mounts the volume.
				if err := os.Symlink(filepath.Join(configMapDataDir, "config.yaml"), v.path()); err != nil {
					t.Fatal(err)
				}
			}
			c := h.waitChange(3, false)
			if c.old != nil {
				t.Errorf("OnChange old = %+v, want nil", c.old)
			}
			h.stopAndExpectQuiet()
		})
	}
}

func TestWatcherCheck(t *testing.T) {
	v := newConfigMapVolume(t, cfg(2))
	// This node has 4 GPUs: a file naming GPUs 4-7 does not fit it.
	h := newHarness(t, v.path(), WithCheck(func(f *File) error {
		_, err := f.Resolve(map[string]string{"gpufrac.io/pool": "a"}, 4)
		return err
	}))
	first := h.load(2)
	h.run()

	v.update("version: v1\ndefault: {gpus: [{indices: '4-7', mode: exclusive}]}\n")
	err := h.waitReject()
	if want := `checking config: resolving config for a node with 4 GPUs: default.gpus[0].indices: "4-7" names GPUs 4-7, but the node has 4 GPUs (0-3)`; !strings.Contains(err.Error(), want) {
		t.Errorf("OnReject(%v), want it to say %q", err, want)
	}
	if cur := h.w.Current(); cur != first {
		t.Errorf("Current() = %+v, want the last good config", cur)
	}
	h.stopAndExpectQuiet()
}

func TestWatcherLoadAndMetrics(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	writeFile(t, path, cfg(2))
	clk := clocktesting.NewFakeClock(time.Unix(1700000000, 500_000_000))
	h := newHarness(t, path, WithClock(clk))

	first := h.load(2)
	if got := testutil.ToFloat64(h.w.metrics.lastSuccess); got != 1700000000.5 {
		t.Errorf("last success timestamp = %v, want 1700000000.5", got)
	}
	// Same bytes: the same *File, no new reload counted.
	clk.Step(time.Minute)
	writeFile(t, path, cfg(2))
	if again := h.load(2); again != first {
		t.Errorf("Load of unchanged bytes gave a new *File")
	}
	// Bad bytes: an error, and the config in force stays.
	writeFile(t, path, badConfig)
	if _, err := h.w.Load(h.ctx); !errors.Is(err, ErrInvalid) {
		t.Errorf("Load(bad) error = %v, want ErrInvalid", err)
	}
	if h.w.Current() != first {
		t.Errorf("Current() after a bad Load is not the last good config")
	}
	// The same bad bytes again: the same error, not counted twice.
	if _, err := h.w.Load(h.ctx); !errors.Is(err, ErrInvalid) {
		t.Errorf("second Load(bad) error = %v, want ErrInvalid", err)
	}
	if got := testutil.ToFloat64(h.w.metrics.lastOK); got != 0 {
		t.Errorf("gpufrac_config_last_reload_successful after a rejected load = %v, want 0", got)
	}
	// Back to the good bytes.
	writeFile(t, path, cfg(2))
	if again := h.load(2); again != first {
		t.Errorf("Load of the restored bytes gave a new *File")
	}

	want := `
# HELP gpufrac_config_last_reload_success_timestamp_seconds Unix time of the last successful config load; 0 before the first.
# TYPE gpufrac_config_last_reload_success_timestamp_seconds gauge
gpufrac_config_last_reload_success_timestamp_seconds 1.7000000605e+09
# HELP gpufrac_config_last_reload_successful 1 when the last config load succeeded, 0 when it was rejected (the node keeps its last good config, or its defaults, until a valid one appears).
# TYPE gpufrac_config_last_reload_successful gauge
gpufrac_config_last_reload_successful 1
# HELP gpufrac_config_reloads_total Config file loads by result: success (the file was read and is now in force, including a return to the config already in force) or rejected (the file could not be read or is invalid; the last good config stays in force).
# TYPE gpufrac_config_reloads_total counter
gpufrac_config_reloads_total{result="rejected"} 1
gpufrac_config_reloads_total{result="success"} 2
`
	if err := testutil.GatherAndCompare(h.reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}

	// A second watcher cannot register the same metrics on the registry.
	if _, err := NewWatcher(path, WithRegisterer(h.reg)); err == nil {
		t.Error("NewWatcher with already registered metrics succeeded")
	}
}

func TestWatcherRunFailsWithoutDirectory(t *testing.T) {
	h := newHarness(t, filepath.Join(t.TempDir(), "missing", "config.yaml"))
	done := make(chan error, 1)
	go func() { done <- h.w.Run(h.ctx) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "watching config directory") {
			t.Errorf("Run = %v, want a watch error", err)
		}
	case <-time.After(waitBound):
		t.Fatalf("Run did not fail within %v", waitBound)
	}
}
