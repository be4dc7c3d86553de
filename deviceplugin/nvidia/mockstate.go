package nvidia

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	"k8s.io/klog/v2"
)

// The mock state directory lets another process (tests, the demo) drive the
// fakes of a Mock running inside gpufrac-node. GPUs are named by UUID or by
// decimal index.
//
//	processes.json    {"<gpu>": [{"pid": 123, "usedBytes": N}, ...]}  replaces all fake processes
//	memory.json       {"<gpu>": N}                                      replaces all explicit used bytes
//	utilization.json  {"<gpu>": P}                                      replaces all utilizations (0..100)
//	xid/*.json        {"gpu": "<gpu>", "xid": 79}                       injected once, then deleted
//
// Files must be written atomically (temp file + rename, as the Write*
// functions do). A malformed file is logged and skipped: the previous state
// stays, and a malformed Xid file is renamed to "<name>.bad".
const (
	mockProcessesFile   = "processes.json"
	mockMemoryFile      = "memory.json"
	mockUtilizationFile = "utilization.json"
	mockXidDir          = "xid"
	// mockResyncInterval is the fallback re-read period, for changes
	// fsnotify misses (network filesystems, a re-created xid directory).
	mockResyncInterval = 200 * time.Millisecond
)

// mockProcess is one process in processes.json.
type mockProcess struct {
	PID       uint32 `json:"pid"`
	UsedBytes uint64 `json:"usedBytes"`
}

// mockXid is one xid/*.json file. GPU may be a JSON string or number.
type mockXid struct {
	GPU json.RawMessage `json:"gpu"`
	Xid *uint64         `json:"xid"`
}

// SyncFromDir applies the state files in dir (see the format above) now and
// whenever they change, until ctx ends; then it returns nil. It creates dir
// and dir/xid if needed, and returns an error only if it cannot watch them.
// Run one SyncFromDir per Mock.
func (m *Mock) SyncFromDir(ctx context.Context, dir string) error {
	logger := klog.FromContext(ctx).WithValues("stateDir", dir)
	ctx = klog.NewContext(ctx, logger)
	xidDir := filepath.Join(dir, mockXidDir)
	if err := os.MkdirAll(xidDir, 0o755); err != nil {
		return fmt.Errorf("creating mock state directory: %w", err)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching mock state directory: %w", err)
	}
	defer func() {
		if err := w.Close(); err != nil {
			logger.Error(err, "Cannot close mock state watcher")
		}
	}()
	for _, d := range []string{dir, xidDir} {
		if err := w.Add(d); err != nil {
			return fmt.Errorf("watching mock state directory %s: %w", d, err)
		}
	}
	s := &stateSyncer{m: m, dir: dir, seen: map[string][]byte{}}
	s.sync(ctx)
	ticker := time.NewTicker(mockResyncInterval)
	defer ticker.Stop()
	events, errs := w.Events, w.Errors
	for {
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			s.sync(ctx)
		case err, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			logger.Error(err, "Watching mock state directory failed; the resync ticker still runs")
		case <-ticker.C:
			s.sync(ctx)
		}
	}
}

// stateSyncer applies one state directory to a Mock. It is used by one
// goroutine only.
type stateSyncer struct {
	m   *Mock
	dir string
	// seen: state file name -> content last applied (or rejected), so an
	// unchanged file is neither re-applied over SetX calls nor re-logged.
	seen map[string][]byte
}

// sync applies every state file that changed and consumes pending Xid files.
func (s *stateSyncer) sync(ctx context.Context) {
	s.syncFile(ctx, mockProcessesFile, s.m.applyProcessesFile)
	s.syncFile(ctx, mockMemoryFile, s.m.applyMemoryFile)
	s.syncFile(ctx, mockUtilizationFile, s.m.applyUtilizationFile)
	s.consumeXids(ctx)
}

// syncFile applies dir/name with apply if its content changed since the
// last pass. A missing file leaves the fakes as they are.
func (s *stateSyncer) syncFile(ctx context.Context, name string, apply func([]byte) error) {
	logger := klog.FromContext(ctx)
	path := filepath.Join(s.dir, name)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		delete(s.seen, name)
		return
	}
	if err != nil {
		logger.Error(err, "Cannot read mock state file", "file", path)
		return
	}
	if prev, ok := s.seen[name]; ok && bytes.Equal(prev, data) {
		return
	}
	s.seen[name] = data
	if err := apply(data); err != nil {
		logger.Error(err, "Skipping malformed mock state file", "file", path)
		return
	}
	logger.V(2).Info("Applied mock state file", "file", path)
}

// consumeXids injects and deletes every xid/*.json file, in name order.
func (s *stateSyncer) consumeXids(ctx context.Context) {
	logger := klog.FromContext(ctx)
	xidDir := filepath.Join(s.dir, mockXidDir)
	entries, err := os.ReadDir(xidDir)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			logger.Error(err, "Cannot list mock Xid directory", "dir", xidDir)
		}
		return
	}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || strings.HasPrefix(name, ".") || !strings.HasSuffix(name, ".json") {
			continue
		}
		path := filepath.Join(xidDir, name)
		data, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			logger.Error(err, "Cannot read mock Xid file", "file", path)
			continue
		}
		uuid, xid, err := s.m.parseXidFile(data)
		if err != nil {
			logger.Error(err, "Skipping malformed mock Xid file", "file", path)
			if err := os.Rename(path, path+".bad"); err != nil {
				logger.Error(err, "Cannot set aside malformed mock Xid file", "file", path)
			}
			continue
		}
		if err := s.m.InjectXid(uuid, xid); err != nil {
			logger.Error(err, "Cannot deliver mock Xid", "file", path)
		} else {
			logger.V(2).Info("Injected mock Xid", "gpu", uuid, "xid", xid)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			logger.Error(err, "Cannot delete consumed mock Xid file", "file", path)
		}
	}
}

// decodeStrict decodes exactly one JSON value with no unknown fields.
func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("decoding JSON: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("decoding JSON: data after the first value")
	}
	return nil
}

// resolveKeys maps the GPU keys of a state file to GPUs; a file naming an
// unknown GPU, or one GPU twice (by UUID and index), is rejected whole.
func resolveKeys[V any](m *Mock, in map[string]V) (map[*fakeGPU]V, error) {
	out := make(map[*fakeGPU]V, len(in))
	for key, v := range in {
		g, err := m.resolve(key)
		if err != nil {
			return nil, err
		}
		if _, dup := out[g]; dup {
			return nil, fmt.Errorf("GPU %d (%s) is named twice", g.index, g.uuid)
		}
		out[g] = v
	}
	return out, nil
}

// applyProcessesFile replaces all fake processes with processes.json's.
func (m *Mock) applyProcessesFile(data []byte) error {
	var raw map[string][]mockProcess
	if err := decodeStrict(data, &raw); err != nil {
		return err
	}
	byGPU, err := resolveKeys(m, raw)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, g := range m.gpus {
		g.procs = nil
		for _, p := range byGPU[g] {
			g.procs = append(g.procs, Process(p))
		}
	}
	return nil
}

// applyMemoryFile replaces all explicit used-memory values with memory.json's.
func (m *Mock) applyMemoryFile(data []byte) error {
	var raw map[string]uint64
	if err := decodeStrict(data, &raw); err != nil {
		return err
	}
	byGPU, err := resolveKeys(m, raw)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, g := range m.gpus {
		g.memUsed, g.memUsedSet = byGPU[g]
	}
	return nil
}

// applyUtilizationFile replaces all utilizations with utilization.json's.
func (m *Mock) applyUtilizationFile(data []byte) error {
	var raw map[string]uint32
	if err := decodeStrict(data, &raw); err != nil {
		return err
	}
	byGPU, err := resolveKeys(m, raw)
	if err != nil {
		return err
	}
	for g, pct := range byGPU {
		if pct > 100 {
			return fmt.Errorf("utilization of GPU %d is %d%%: above 100%%", g.index, pct)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, g := range m.gpus {
		g.util = byGPU[g]
	}
	return nil
}

// parseXidFile returns the GPU UUID and Xid an xid/*.json file names.
func (m *Mock) parseXidFile(data []byte) (string, uint64, error) {
	var raw mockXid
	if err := decodeStrict(data, &raw); err != nil {
		return "", 0, err
	}
	if len(raw.GPU) == 0 || raw.Xid == nil {
		return "", 0, errors.New(`an Xid file needs "gpu" and "xid"`)
	}
	var key string
	if err := json.Unmarshal(raw.GPU, &key); err != nil {
		var index int
		if err := json.Unmarshal(raw.GPU, &index); err != nil {
			return "", 0, fmt.Errorf(`"gpu" is %s: neither a string nor an index`, raw.GPU)
		}
		key = strconv.Itoa(index)
	}
	g, err := m.resolve(key)
	if err != nil {
		return "", 0, err
	}
	return g.uuid, *raw.Xid, nil
}

// WriteMockProcesses atomically writes dir/processes.json: the fake
// processes per GPU (key: UUID or decimal index), replacing all others.
func WriteMockProcesses(dir string, procs map[string][]Process) error {
	raw := make(map[string][]mockProcess, len(procs))
	for gpu, ps := range procs {
		raw[gpu] = make([]mockProcess, 0, len(ps))
		for _, p := range ps {
			raw[gpu] = append(raw[gpu], mockProcess(p))
		}
	}
	if err := writeJSONAtomic(dir, mockProcessesFile, raw); err != nil {
		return fmt.Errorf("writing mock processes: %w", err)
	}
	return nil
}

// WriteMockMemory atomically writes dir/memory.json: explicit used bytes per
// GPU (key: UUID or decimal index); other GPUs report their processes' sum.
func WriteMockMemory(dir string, usedBytes map[string]uint64) error {
	if err := writeJSONAtomic(dir, mockMemoryFile, usedBytes); err != nil {
		return fmt.Errorf("writing mock memory: %w", err)
	}
	return nil
}

// WriteMockUtilization atomically writes dir/utilization.json: percent per
// GPU (key: UUID or decimal index); other GPUs report 0.
func WriteMockUtilization(dir string, pct map[string]uint32) error {
	if err := writeJSONAtomic(dir, mockUtilizationFile, pct); err != nil {
		return fmt.Errorf("writing mock utilization: %w", err)
	}
	return nil
}

// WriteMockXid atomically adds an Xid file for gpu (UUID or decimal index)
// to dir/xid; a syncing Mock injects it once and deletes it. Files sort, and
// are injected, in the order they were written.
func WriteMockXid(dir, gpu string, xid uint64) error {
	xidDir := filepath.Join(dir, mockXidDir)
	v := struct {
		GPU string `json:"gpu"`
		Xid uint64 `json:"xid"`
	}{GPU: gpu, Xid: xid}
	name := fmt.Sprintf("%020d", time.Now().UnixNano())
	if err := writeJSONAtomic(xidDir, name+"-*.json", v); err != nil {
		return fmt.Errorf("writing mock Xid %d for GPU %s: %w", xid, gpu, err)
	}
	return nil
}

// writeJSONAtomic writes v as JSON to dir/name through a hidden temp file
// and a rename, so readers never see a partial file. A name containing "*"
// is a pattern: the "*" becomes the temp file's random suffix, making the
// name unique.
func writeJSONAtomic(dir, name string, v any) (err error) {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding JSON: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	f, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return fmt.Errorf("creating temp file: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.Remove(f.Name())
		}
	}()
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return fmt.Errorf("writing %s: %w", f.Name(), err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("closing %s: %w", f.Name(), err)
	}
	final := strings.Replace(name, "*", strings.TrimPrefix(filepath.Base(f.Name()), ".tmp-"), 1)
	if err := os.Rename(f.Name(), filepath.Join(dir, final)); err != nil {
		return fmt.Errorf("renaming %s to %s: %w", f.Name(), final, err)
	}
	return nil
}
