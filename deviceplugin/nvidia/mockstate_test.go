package nvidia

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// mockSnapshot is what a Mock reports for one GPU.
type mockSnapshot struct {
	Procs []Process
	Used  uint64
	Util  uint32
}

func snapshot(t *testing.T, m *Mock, uuid string) mockSnapshot {
	t.Helper()
	procs, err := m.Processes(uuid)
	if err != nil {
		t.Fatalf("Processes(%s): %v", uuid, err)
	}
	mem, err := m.Memory(uuid)
	if err != nil {
		t.Fatalf("Memory(%s): %v", uuid, err)
	}
	util, err := m.Utilization(uuid)
	if err != nil {
		t.Fatalf("Utilization(%s): %v", uuid, err)
	}
	return mockSnapshot{Procs: procs, Used: mem.UsedBytes, Util: util}
}

// startSync runs SyncFromDir until the test ends and checks it returns nil.
func startSync(t *testing.T, m *Mock, dir string) {
	t.Helper()
	ctx, cancel := context.WithCancel(testContext(t))
	errc := make(chan error, 1)
	go func() { errc <- m.SyncFromDir(ctx, dir) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-errc:
			if err != nil {
				t.Errorf("SyncFromDir = %v, want nil after ctx ended", err)
			}
		case <-time.After(testTimeout):
			t.Errorf("SyncFromDir did not return after ctx ended")
		}
	})
}

// jsonFiles lists the *.json files in dir.
func jsonFiles(t *testing.T, dir string) []string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	return names
}

func TestSyncFromDirRoundTrip(t *testing.T) {
	m := newTestMock(t, "dgxh100")
	uuids := m.uuids()
	dir := t.TempDir()
	const gib = 1 << 30

	// State written before the sync starts is applied at start.
	if err := WriteMockProcesses(dir, map[string][]Process{
		"0":      {{PID: 200, UsedBytes: 2 * gib}, {PID: 100, UsedBytes: 1 * gib}},
		uuids[1]: {{PID: 300, UsedBytes: 3 * gib}},
	}); err != nil {
		t.Fatal(err)
	}
	watchCtx, cancelWatch := context.WithCancel(testContext(t))
	defer cancelWatch()
	xids, err := m.WatchXids(watchCtx)
	if err != nil {
		t.Fatalf("WatchXids: %v", err)
	}
	startSync(t, m, dir)

	waitFor := func(what string, uuid string, want mockSnapshot) {
		t.Helper()
		eventually(t, what, func() (bool, string) {
			got := snapshot(t, m, uuid)
			diff := cmp.Diff(want, got)
			return diff == "", fmt.Sprintf("GPU %s (-want +got):\n%s", uuid, diff)
		})
	}
	waitFor("initial processes on GPU 0", uuids[0], mockSnapshot{
		Procs: []Process{{PID: 100, UsedBytes: 1 * gib}, {PID: 200, UsedBytes: 2 * gib}}, Used: 3 * gib,
	})
	waitFor("initial processes on GPU 1", uuids[1], mockSnapshot{Procs: []Process{{PID: 300, UsedBytes: 3 * gib}}, Used: 3 * gib})

	// A new file replaces all fake processes.
	if err := WriteMockProcesses(dir, map[string][]Process{"1": {{PID: 400, UsedBytes: 4 * gib}}}); err != nil {
		t.Fatal(err)
	}
	waitFor("processes replaced on GPU 1", uuids[1], mockSnapshot{Procs: []Process{{PID: 400, UsedBytes: 4 * gib}}, Used: 4 * gib})
	waitFor("processes cleared on GPU 0", uuids[0], mockSnapshot{Procs: []Process{}})

	if err := WriteMockMemory(dir, map[string]uint64{uuids[2]: 5 * gib}); err != nil {
		t.Fatal(err)
	}
	if err := WriteMockUtilization(dir, map[string]uint32{"2": 42}); err != nil {
		t.Fatal(err)
	}
	waitFor("memory and utilization on GPU 2", uuids[2], mockSnapshot{Procs: []Process{}, Used: 5 * gib, Util: 42})

	// A malformed file in between is skipped without stopping the sync.
	if err := os.WriteFile(filepath.Join(dir, mockUtilizationFile), []byte("{oops"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteMockXid(dir, "2", 79); err != nil {
		t.Fatal(err)
	}
	if err := WriteMockXid(dir, uuids[5], 48); err != nil {
		t.Fatal(err)
	}
	var got []XidEvent
	for range 2 {
		ev := receive(t, xids)
		ev.Time = time.Time{}
		got = append(got, ev)
	}
	if diff := cmp.Diff([]XidEvent{{UUID: uuids[2], Xid: 79}, {UUID: uuids[5], Xid: 48}}, got); diff != "" {
		t.Errorf("Xid events (-want +got):\n%s", diff)
	}
	eventually(t, "Xid files consumed", func() (bool, string) {
		left := jsonFiles(t, filepath.Join(dir, mockXidDir))
		return len(left) == 0, fmt.Sprintf("left: %v", left)
	})
	if err := WriteMockUtilization(dir, map[string]uint32{"2": 43}); err != nil {
		t.Fatal(err)
	}
	waitFor("sync alive after a malformed file", uuids[2], mockSnapshot{Procs: []Process{}, Used: 5 * gib, Util: 43})
	cancelWatch()
	waitClosed(t, xids)
}

// TestSyncMalformedFiles runs single sync passes over bad state files: the
// fakes keep their state, nothing panics, bad Xid files are set aside.
func TestSyncMalformedFiles(t *testing.T) {
	tests := []struct {
		name    string
		file    string // relative to the state directory
		content string // "$UUID0" stands for GPU 0's UUID
		// setAside: the file is an Xid file to be renamed to <file>.bad.
		setAside bool
	}{
		{name: "processes not json", file: mockProcessesFile, content: "{not json"},
		{name: "processes unknown gpu index", file: mockProcessesFile, content: `{"8": []}`},
		{name: "processes unknown gpu uuid", file: mockProcessesFile, content: `{"GPU-nope": []}`},
		{name: "processes unknown field", file: mockProcessesFile, content: `{"0": [{"pid": 1, "used": 5}]}`},
		{name: "processes wrong type", file: mockProcessesFile, content: `{"0": {"pid": 1}}`},
		{name: "processes negative pid", file: mockProcessesFile, content: `{"0": [{"pid": -1}]}`},
		{name: "processes trailing data", file: mockProcessesFile, content: `{"0": []} {}`},
		{name: "processes gpu named twice", file: mockProcessesFile, content: `{"0": [], "$UUID0": []}`},
		{name: "memory negative", file: mockMemoryFile, content: `{"0": -1}`},
		{name: "memory empty file", file: mockMemoryFile, content: ``},
		{name: "utilization above 100", file: mockUtilizationFile, content: `{"0": 101}`},
		{name: "utilization array", file: mockUtilizationFile, content: `[1, 2]`},
		{name: "xid garbage", file: "xid/a.json", content: "\x00\x01garbage", setAside: true},
		{name: "xid unknown gpu", file: "xid/b.json", content: `{"gpu": "GPU-nope", "xid": 79}`, setAside: true},
		{name: "xid index out of range", file: "xid/c.json", content: `{"gpu": 99, "xid": 79}`, setAside: true},
		{name: "xid missing xid", file: "xid/d.json", content: `{"gpu": "0"}`, setAside: true},
		{name: "xid missing gpu", file: "xid/e.json", content: `{"xid": 79}`, setAside: true},
		{name: "xid gpu is an object", file: "xid/f.json", content: `{"gpu": {}, "xid": 79}`, setAside: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := newTestMock(t, "dgxh100")
			uuid := m.uuids()[0]
			content := strings.ReplaceAll(tc.content, "$UUID0", uuid)
			want := mockSnapshot{Procs: []Process{{PID: 1, UsedBytes: 10}}, Used: 20, Util: 30}
			if err := m.SetProcesses(uuid, want.Procs); err != nil {
				t.Fatal(err)
			}
			if err := m.SetMemoryUsed(uuid, want.Used); err != nil {
				t.Fatal(err)
			}
			if err := m.SetUtilization(uuid, want.Util); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(testContext(t))
			defer cancel()
			xids, err := m.WatchXids(ctx)
			if err != nil {
				t.Fatalf("WatchXids: %v", err)
			}

			dir := t.TempDir()
			path := filepath.Join(dir, tc.file)
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			s := &stateSyncer{m: m, dir: dir, seen: map[string][]byte{}}
			s.sync(ctx)
			s.sync(ctx) // and again: a rejected file stays rejected

			if diff := cmp.Diff(want, snapshot(t, m, uuid)); diff != "" {
				t.Errorf("fakes changed by a malformed file (-want +got):\n%s", diff)
			}
			_, statErr := os.Stat(path + ".bad")
			if tc.setAside {
				if statErr != nil {
					t.Errorf("malformed Xid file not set aside: %v", statErr)
				}
				if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("malformed Xid file still in place: %v", err)
				}
			} else if statErr == nil {
				t.Errorf("state file renamed to .bad, want it left in place")
			}
			// Proof that nothing was injected: a good Xid is the first event.
			if err := m.InjectXid(uuid, 13); err != nil {
				t.Fatal(err)
			}
			if ev := receive(t, xids); ev.Xid != 13 {
				t.Errorf("first Xid = %d, want 13 (a malformed file injected something)", ev.Xid)
			}
			cancel()
			waitClosed(t, xids)
		})
	}
}

// TestSyncFileChangesOnly checks an unchanged state file is not re-applied
// over later SetX calls, and a changed one is.
func TestSyncFileChangesOnly(t *testing.T) {
	m := newTestMock(t, "dgxa100")
	uuid := m.uuids()[3]
	dir := t.TempDir()
	ctx := testContext(t)
	s := &stateSyncer{m: m, dir: dir, seen: map[string][]byte{}}

	if err := WriteMockUtilization(dir, map[string]uint32{"3": 10}); err != nil {
		t.Fatal(err)
	}
	s.sync(ctx)
	if err := m.SetUtilization(uuid, 77); err != nil {
		t.Fatal(err)
	}
	s.sync(ctx)
	if got, _ := m.Utilization(uuid); got != 77 {
		t.Errorf("Utilization after an unchanged file = %d, want 77 (SetUtilization kept)", got)
	}
	if err := WriteMockUtilization(dir, map[string]uint32{"3": 11}); err != nil {
		t.Fatal(err)
	}
	s.sync(ctx)
	if got, _ := m.Utilization(uuid); got != 11 {
		t.Errorf("Utilization after a changed file = %d, want 11", got)
	}
	// Removing the file leaves the fakes alone.
	if err := os.Remove(filepath.Join(dir, mockUtilizationFile)); err != nil {
		t.Fatal(err)
	}
	s.sync(ctx)
	if got, _ := m.Utilization(uuid); got != 11 {
		t.Errorf("Utilization after the file was removed = %d, want 11", got)
	}
}

func TestWriteMockXidOrderAndAtomicity(t *testing.T) {
	dir := t.TempDir()
	for i := range 20 {
		if err := WriteMockXid(dir, strconv.Itoa(i%8), uint64(i)); err != nil {
			t.Fatal(err)
		}
	}
	entries, err := os.ReadDir(filepath.Join(dir, mockXidDir))
	if err != nil {
		t.Fatal(err)
	}
	m := newTestMock(t, "dgxh100")
	var xids []uint64
	for _, e := range entries {
		if filepath.Ext(e.Name()) != ".json" || e.Name()[0] == '.' {
			t.Errorf("unexpected file %s (temp file left behind?)", e.Name())
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, mockXidDir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		_, xid, err := m.parseXidFile(data)
		if err != nil {
			t.Fatalf("parsing %s: %v", e.Name(), err)
		}
		xids = append(xids, xid)
	}
	if len(xids) != 20 || !slices.IsSorted(xids) {
		t.Errorf("Xids in file name order = %v, want 0..19 in order", xids)
	}
}
