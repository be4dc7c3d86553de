package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// The names the kubelet's atomic writer reserves in a ConfigMap volume
// (k8s.io/kubernetes/pkg/volume/util, atomic_writer.go).
const (
	dataDirName    = "..data"
	newDataDirName = "..data_tmp"
)

// atomicWriter projects a ConfigMap's keys into a directory as the kubelet
// does for a ConfigMap volume, so a program reading the mount sees exactly
// what it sees on a node:
//
//	<dir>/config.yaml -> ..data/config.yaml
//	<dir>/..data      -> ..2026_11_28_16_20_43.1234567890
//	<dir>/..2026_11_28_16_20_43.1234567890/config.yaml
//
// An update writes a new timestamped directory, points ..data_tmp at it,
// renames ..data_tmp over ..data (the one atomic step: a reader sees the old
// files or the new ones, never a mix), adds the links of new keys, removes
// those of deleted keys and then the old timestamped directory.
//
// It is the kubelet's AtomicWriter.Write for flat keys (a ConfigMap's keys
// have no '/'), without its Windows and ownership branches. The kubelet's
// code lives in k8s.io/kubernetes/pkg/volume/util, which imports the
// kubelet's volume, controller and feature-gate packages: all of
// k8s.io/kubernetes with a replace directive per staging module, too much
// for the test bed's go.mod for ~100 lines. Not safe for concurrent use:
// one writer per directory.
type atomicWriter struct {
	dir string
	now func() time.Time
}

// write projects payload (key -> content, mode 0644) into the directory. It
// writes nothing when the content in force is already payload, but still
// makes sure every key's link exists, as the kubelet does
// (kubernetes/kubernetes#121472).
func (w atomicWriter) write(payload map[string][]byte) error {
	// 1. Keys as a ConfigMap volume may hold them.
	for k := range payload {
		if k == "" || strings.HasPrefix(k, "..") || strings.ContainsRune(k, '/') {
			return fmt.Errorf("projecting into %s: invalid key %q", w.dir, k)
		}
	}
	// 2. The timestamped directory in force.
	dataDir := filepath.Join(w.dir, dataDirName)
	oldTS, err := os.Readlink(dataDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("projecting into %s: reading %s: %w", w.dir, dataDirName, err)
	}
	// 3./4. What the old version had that the new one drops, and whether
	// anything changed at all.
	var removed []string
	changed := oldTS == ""
	if oldTS != "" {
		old, err := readFlatDir(filepath.Join(w.dir, oldTS))
		if err != nil {
			return fmt.Errorf("projecting into %s: %w", w.dir, err)
		}
		for k := range old {
			if _, ok := payload[k]; !ok {
				removed = append(removed, k)
			}
		}
		changed = len(removed) > 0 || len(old) != len(payload)
		for k, v := range payload {
			if !bytes.Equal(old[k], v) {
				changed = true
			}
		}
		if !changed {
			oldTS = "" // keep it: it is still in force
		}
	}
	if changed {
		// 5./6. The new timestamped directory with the payload.
		now := time.Now
		if w.now != nil {
			now = w.now
		}
		ts, err := os.MkdirTemp(w.dir, now().UTC().Format("..2006_01_02_15_04_05."))
		if err != nil {
			return fmt.Errorf("projecting into %s: %w", w.dir, err)
		}
		if err := os.Chmod(ts, 0o755); err != nil {
			return fmt.Errorf("projecting into %s: %w", w.dir, err)
		}
		for k, v := range payload {
			if err := os.WriteFile(filepath.Join(ts, k), v, 0o644); err != nil {
				_ = os.RemoveAll(ts)
				return fmt.Errorf("projecting into %s: %w", w.dir, err)
			}
		}
		// 8./9. ..data_tmp -> the new directory, renamed over ..data.
		tmp := filepath.Join(w.dir, newDataDirName)
		if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
			_ = os.RemoveAll(ts)
			return fmt.Errorf("projecting into %s: %w", w.dir, err)
		}
		if err := os.Rename(tmp, dataDir); err != nil {
			_ = os.Remove(tmp)
			_ = os.RemoveAll(ts)
			return fmt.Errorf("projecting into %s: swapping %s: %w", w.dir, dataDirName, err)
		}
	}
	// 10. The user-visible links of the keys, where missing.
	for _, k := range slices.Sorted(maps.Keys(payload)) {
		link := filepath.Join(w.dir, k)
		if _, err := os.Lstat(link); err == nil {
			continue
		}
		if err := os.Symlink(filepath.Join(dataDirName, k), link); err != nil {
			return fmt.Errorf("projecting into %s: %w", w.dir, err)
		}
	}
	// 11. The links of deleted keys.
	for _, k := range removed {
		if err := os.Remove(filepath.Join(w.dir, k)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("projecting into %s: %w", w.dir, err)
		}
	}
	// 12. The old timestamped directory.
	if oldTS != "" {
		if err := os.RemoveAll(filepath.Join(w.dir, oldTS)); err != nil {
			return fmt.Errorf("projecting into %s: %w", w.dir, err)
		}
	}
	return nil
}

// readFlatDir reads every file of a timestamped directory.
func readFlatDir(dir string) (map[string][]byte, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := make(map[string][]byte, len(entries))
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		out[e.Name()] = b
	}
	return out, nil
}
