package cluster

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gpufrac/gpufrac/deviceplugin/config"
)

// volume lists a projected directory: name -> link target, or the content
// of a plain file (the timestamped directory's files, under its name).
func volume(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if e.Type()&os.ModeSymlink != 0 {
			target, err := os.Readlink(p)
			if err != nil {
				t.Fatal(err)
			}
			if strings.HasPrefix(target, "..2") {
				target = "..<timestamp>"
			}
			out[e.Name()] = "-> " + target
			continue
		}
		if e.IsDir() {
			files, err := readFlatDir(p)
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range files {
				out["..<timestamp>/"+k] = string(v)
			}
			continue
		}
		b, _ := os.ReadFile(p)
		out[e.Name()] = string(b)
	}
	return out
}

func tsDirs(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), "..2") {
			out = append(out, e.Name())
		}
	}
	return out
}

func TestAtomicWriterProjectsAsTheKubelet(t *testing.T) {
	dir := t.TempDir()
	w := atomicWriter{dir: dir}

	// 1. The first projection: a timestamped directory, ..data and one link per key.
	if err := w.write(map[string][]byte{"config.yaml": []byte("a"), "extra": []byte("x")}); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"..data":                    "-> ..<timestamp>",
		"..<timestamp>/config.yaml": "a",
		"..<timestamp>/extra":       "x",
		"config.yaml":               "-> ..data/config.yaml",
		"extra":                     "-> ..data/extra",
	}
	if diff := cmp.Diff(want, volume(t, dir)); diff != "" {
		t.Fatalf("after the first write (-want +got):\n%s", diff)
	}
	first := tsDirs(t, dir)

	// 2. The same content again writes nothing.
	if err := w.write(map[string][]byte{"config.yaml": []byte("a"), "extra": []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(first, tsDirs(t, dir)); diff != "" {
		t.Fatalf("an unchanged payload replaced the timestamped directory (-want +got):\n%s", diff)
	}

	// 3. An edit that drops a key: a new directory, the old one and the
	// dropped key's link gone.
	if err := w.write(map[string][]byte{"config.yaml": []byte("b")}); err != nil {
		t.Fatal(err)
	}
	want = map[string]string{
		"..data":                    "-> ..<timestamp>",
		"..<timestamp>/config.yaml": "b",
		"config.yaml":               "-> ..data/config.yaml",
	}
	if diff := cmp.Diff(want, volume(t, dir)); diff != "" {
		t.Fatalf("after the edit (-want +got):\n%s", diff)
	}
	if now := tsDirs(t, dir); len(now) != 1 || slices.Equal(now, first) {
		t.Fatalf("timestamped directories %v after the edit, %v before: want one new one", now, first)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "config.yaml")); err != nil || string(b) != "b" {
		t.Fatalf("config.yaml reads %q, %v; want b", b, err)
	}

	// 4. Keys a ConfigMap volume cannot hold.
	for _, k := range []string{"..data", "a/b", ""} {
		if err := w.write(map[string][]byte{k: nil}); err == nil {
			t.Errorf("key %q was projected", k)
		}
	}
}

// TestConfigWatcherFollowsTheProjection checks that gpufrac-node's config
// watcher, on the path the DaemonSet gives it (config.yaml of the mount),
// takes every edit the kubelet's ..data swap delivers, refuses a bad one
// and keeps the last good config.
func TestConfigWatcherFollowsTheProjection(t *testing.T) {
	dir := t.TempDir()
	w := atomicWriter{dir: dir}
	project := func(content string) {
		t.Helper()
		if err := w.write(map[string][]byte{"config.yaml": []byte(content)}); err != nil {
			t.Fatal(err)
		}
	}
	project("version: v1\ndefault:\n  mode: fraction\n")

	changes := make(chan config.Mode, 10)
	rejects := make(chan error, 10)
	watcher, err := config.NewWatcher(filepath.Join(dir, "config.yaml"),
		config.WithDebounce(10*time.Millisecond),
		config.WithOnChange(func(_, f *config.File) { changes <- f.Default.Mode }),
		config.WithOnReject(func(err error) { rejects <- err }))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := watcher.Load(t.Context()); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- watcher.Run(t.Context()) }()
	t.Cleanup(func() {
		if err := <-done; err != nil {
			t.Error(err)
		}
	})

	wantChange := func(mode config.Mode) {
		t.Helper()
		for {
			select {
			case got := <-changes:
				if got == mode {
					return
				}
			case err := <-rejects:
				t.Fatalf("rejected while waiting for mode %s: %v", mode, err)
			case <-time.After(10 * time.Second):
				t.Fatalf("the watcher did not take mode %s within 10s", mode)
			}
		}
	}
	// Two swaps in a row: the watch follows ..data each time (the first
	// timestamped directory, which it watched as the link's target, is gone).
	project("version: v1\ndefault:\n  mode: mig\n  mig: {layout: all-1g.10gb}\n")
	wantChange(config.ModeMIG)
	project("version: v1\ndefault:\n  mode: exclusive\n")
	wantChange(config.ModeExclusive)

	project("version: v1\ndefault:\n  mode: halves\n")
	select {
	case err := <-rejects:
		var verr *config.ValidationError
		if !errors.As(err, &verr) {
			t.Errorf("rejection %v is not a validation error", err)
		}
	case m := <-changes:
		t.Fatalf("the bad edit was taken as mode %s", m)
	case <-time.After(10 * time.Second):
		t.Fatal("the bad edit was neither taken nor refused within 10s")
	}
	if got := watcher.Current().Default.Mode; got != config.ModeExclusive {
		t.Errorf("mode %s in force after the bad edit, want the last good exclusive", got)
	}
	project("version: v1\ndefault:\n  mode: fraction\n")
	wantChange(config.ModeFraction)
}
