package cluster

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/util/wait"
)

// TestProcessStopKillsTheGroup starts a shell that leaves a background child behind,
// and checks that stop ends both, the child included, even when the shell ignores
// SIGTERM (so the SIGKILL fallback is what ends it).
func TestProcessStopKillsTheGroup(t *testing.T) {
	tests := []struct {
		name   string
		script string
		grace  time.Duration
	}{
		{name: "exits on SIGTERM", script: "sleep 300 & echo child $!; wait", grace: 5 * time.Second},
		{name: "ignores SIGTERM", script: "trap '' TERM; sleep 300 & echo child $!; while :; do wait; done", grace: 200 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			logPath := filepath.Join(t.TempDir(), "sh.log")
			p, err := startProcess("sh", "/bin/sh", []string{"-c", tt.script}, nil, logPath)
			if err != nil {
				t.Fatal(err)
			}
			// The child's PID is in the log once the shell has forked it.
			var child int
			err = wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
				data, err := os.ReadFile(logPath)
				if err != nil {
					return false, err
				}
				for line := range strings.SplitSeq(string(data), "\n") {
					if rest, ok := strings.CutPrefix(line, "child "); ok {
						child, err = strconv.Atoi(strings.TrimSpace(rest))
						return err == nil, err
					}
				}
				return false, nil
			})
			if err != nil {
				t.Fatalf("waiting for the child's pid: %v", err)
			}
			if err := syscall.Kill(child, 0); err != nil {
				t.Fatalf("child %d not running before stop: %v", child, err)
			}
			if err := p.stop(tt.grace); err != nil {
				t.Fatal(err)
			}
			if !p.exited() {
				t.Error("shell not reaped after stop")
			}
			// SIGKILL is delivered before kill(2) returns, but the reparented child may
			// linger as a zombie until init reaps it: count only live members.
			// A SIGKILLed process can still look alive for a moment while the
			// kernel tears it down: poll, bounded.
			var live []int
			_ = wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 2*time.Second, true, func(context.Context) (bool, error) {
				var err error
				live, err = liveGroupMembers(p.PID)
				if err != nil {
					return false, err
				}
				return len(live) == 0, nil
			})
			if diff := cmp.Diff([]int(nil), live); diff != "" {
				t.Errorf("live members of process group %d after stop (-want +got):\n%s", p.PID, diff)
			}
			if err := p.stop(tt.grace); err != nil {
				t.Errorf("second stop: %v", err)
			}
		})
	}
}

func TestFreePorts(t *testing.T) {
	ports, err := freePorts(5)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if p <= 0 || p > 65535 || seen[p] {
			t.Errorf("bad or repeated port %d in %v", p, ports)
		}
		seen[p] = true
	}
}

func TestDeclaresModule(t *testing.T) {
	tests := []struct {
		name  string
		gomod string
		want  bool
	}{
		{name: "project", gomod: "module github.com/gpufrac/gpufrac\n\ngo 1.25.0\n", want: true},
		{name: "quoted", gomod: "module \"github.com/gpufrac/gpufrac\"\n", want: true},
		{name: "wrapper module", gomod: "module github.com/gpufrac/gpufrac/tests/tools/etcd\n", want: false},
		{name: "comment only", gomod: "// module github.com/gpufrac/gpufrac\n", want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := declaresModule([]byte(tt.gomod), modulePath); got != tt.want {
				t.Errorf("declaresModule(%q) = %v, want %v", tt.gomod, got, tt.want)
			}
		})
	}
}

func TestRepoRootFindsTheProject(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	// The test runs in tests/cluster.
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(filepath.Join(root, "tests", "cluster"), wd); diff != "" {
		t.Errorf("root %s is not two levels above the test dir (-want +got):\n%s", root, diff)
	}
}

func TestVMHWM(t *testing.T) {
	hwm, err := vmHWM(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if hwm < 1<<20 {
		t.Errorf("peak RSS of the test process = %d bytes, want at least 1 MiB", hwm)
	}
}
