package enforcement

import (
	"errors"
	"io/fs"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpufrac/gpufrac/deviceplugin/enforcement/enforcementtest"
)

func TestParseStartTime(t *testing.T) {
	for _, tc := range []struct {
		name    string
		stat    string
		want    uint64
		wantErr bool
	}{
		{name: "plain", stat: enforcementtest.StatLine(42, "python", 123456), want: 123456},
		{name: "command with spaces", stat: enforcementtest.StatLine(42, "my worker", 77), want: 77},
		{name: "command with parentheses", stat: enforcementtest.StatLine(42, "a) (b) S 1 2", 99), want: 99},
		{name: "real kernel line", want: 8954,
			stat: "1234 (sleep) S 1200 1234 1200 34816 1234 4194304 95 0 0 0 0 0 0 0 20 0 1 0 8954 8564736 224 18446744073709551615 94046853955584 94046853971393 140735398580704 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 94046853987376 94046853988864 94046878388224 140735398588131 140735398588151 140735398588151 140735398592491 0\n"},
		{name: "no command", stat: "1234 sleep S 1", wantErr: true},
		{name: "too few fields", stat: "1234 (sleep) S 1 2 3", wantErr: true},
		{name: "start time not a number", stat: strings.Replace(enforcementtest.StatLine(1, "x", 987654), " 987654 ", " x987654 ", 1), wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseStartTime([]byte(tc.stat))
			if tc.wantErr {
				if err == nil {
					t.Fatalf("ParseStartTime() = %d, want an error", got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseStartTime() = %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}

func TestProcFS(t *testing.T) {
	root := t.TempDir()
	cg := enforcementtest.CgroupContainerdSystemd(testUID, testCID)
	if err := enforcementtest.WriteProc(root, enforcementtest.Proc{PID: 4242, StartTime: 1000, Cgroup: cg}); err != nil {
		t.Fatal(err)
	}
	if err := enforcementtest.WriteProc(root, enforcementtest.Proc{PID: 7, StartTime: 3, Cgroup: enforcementtest.CgroupHost}); err != nil {
		t.Fatal(err)
	}
	p := ProcFS{Root: root}
	for _, tc := range []struct {
		name    string
		pid     uint32
		want    ProcessInfo
		notExit bool
	}{
		{name: "container process", pid: 4242, want: ProcessInfo{StartTime: 1000, Container: ContainerRef{PodUID: testUID, ContainerID: testCID, Runtime: RuntimeContainerd}}},
		{name: "host process", pid: 7, want: ProcessInfo{StartTime: 3}},
		{name: "gone", pid: 99, notExit: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start, err := p.StartTime(tc.pid)
			var got ProcessInfo
			if err == nil {
				got.StartTime = start
				got.Container, err = p.Container(tc.pid)
			}
			if tc.notExit {
				if !errors.Is(err, fs.ErrNotExist) {
					t.Fatalf("ProcFS(%d) error = %v, want fs.ErrNotExist", tc.pid, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ProcFS(%d) (-want +got):\n%s", tc.pid, diff)
			}
		})
	}
}

// TestProcFSSelf reads the real /proc: this test process has a
// start time and a cgroup file the parser accepts.
func TestProcFSSelf(t *testing.T) {
	start, err := ProcFS{}.StartTime(uint32(os.Getpid()))
	if err != nil || start == 0 {
		t.Fatalf("StartTime(self) = %d, %v; want a start time", start, err)
	}
	if _, err := (ProcFS{}).Container(uint32(os.Getpid())); err != nil {
		t.Errorf("Container(self) error = %v", err)
	}
}
