package enforcement

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpufrac/gpufrac/deviceplugin/enforcement/enforcementtest"
)

// child is a real process for the killer to aim at.
type child struct {
	t     *testing.T
	cmd   *exec.Cmd
	pid   uint32
	start uint64
	done  chan syscall.Signal // the signal that ended it, -1 for a normal exit
}

func startChild(t *testing.T) *child {
	t.Helper()
	cmd := exec.Command("sleep", "300")
	if err := cmd.Start(); err != nil {
		t.Skipf("cannot start a child process: %v", err)
	}
	c := &child{t: t, cmd: cmd, pid: uint32(cmd.Process.Pid), done: make(chan syscall.Signal, 1)}
	start, err := ReadStartTime(DefaultProcRoot, c.pid)
	if err != nil {
		_ = cmd.Process.Kill()
		t.Fatal(err)
	}
	c.start = start
	go func() {
		_ = cmd.Wait()
		sig := syscall.Signal(-1)
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			sig = ws.Signal()
		}
		c.done <- sig
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	return c
}

// endedBy terminates the child with SIGTERM if still running and returns
// the signal that ended it: SIGKILL means the killer got it first.
func (c *child) endedBy() syscall.Signal {
	c.t.Helper()
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	return <-c.done
}

func TestPIDFDKillerRealProcess(t *testing.T) {
	t.Run("matching start time kills", func(t *testing.T) {
		c := startChild(t)
		if err := NewKiller("").Kill(t.Context(), c.pid, c.start); err != nil {
			t.Fatalf("Kill() error = %v", err)
		}
		if sig := <-c.done; sig != syscall.SIGKILL {
			t.Errorf("child ended by %v, want SIGKILL", sig)
		}
	})
	t.Run("other start time (PID reused) kills nothing", func(t *testing.T) {
		c := startChild(t)
		err := NewKiller("").Kill(t.Context(), c.pid, c.start-1)
		if !errors.Is(err, ErrProcessChanged) {
			t.Fatalf("Kill() error = %v, want ErrProcessChanged", err)
		}
		if sig := c.endedBy(); sig != syscall.SIGTERM {
			t.Errorf("child ended by %v, want our SIGTERM: the killer signalled it", sig)
		}
	})
	t.Run("fixture tree agrees, kernel disagrees: nothing is killed", func(t *testing.T) {
		c := startChild(t)
		root := t.TempDir()
		// The fixture claims the PID started at a time the real process did not.
		if err := enforcementtest.WriteProc(root, enforcementtest.Proc{PID: c.pid, StartTime: c.start + 1000, Cgroup: enforcementtest.CgroupHost}); err != nil {
			t.Fatal(err)
		}
		err := NewKiller(root).Kill(t.Context(), c.pid, c.start+1000)
		if !errors.Is(err, ErrProcessChanged) {
			t.Fatalf("Kill() error = %v, want ErrProcessChanged", err)
		}
		if sig := c.endedBy(); sig != syscall.SIGTERM {
			t.Errorf("child ended by %v, want our SIGTERM", sig)
		}
	})
	t.Run("fixture copied from the real process kills", func(t *testing.T) {
		c := startChild(t)
		root := t.TempDir()
		if err := enforcementtest.CopyProc(root, c.pid, enforcementtest.CgroupHost); err != nil {
			t.Fatal(err)
		}
		if err := NewKiller(root).Kill(t.Context(), c.pid, c.start); err != nil {
			t.Fatalf("Kill() error = %v", err)
		}
		if sig := <-c.done; sig != syscall.SIGKILL {
			t.Errorf("child ended by %v, want SIGKILL", sig)
		}
	})
	t.Run("exited process", func(t *testing.T) {
		c := startChild(t)
		c.endedBy()
		if err := NewKiller("").Kill(t.Context(), c.pid, c.start); !errors.Is(err, ErrProcessChanged) {
			t.Fatalf("Kill() of a reaped process error = %v, want ErrProcessChanged", err)
		}
	})
	t.Run("init and self are protected", func(t *testing.T) {
		for _, pid := range []uint32{0, 1, uint32(os.Getpid())} {
			if err := NewKiller("").Kill(t.Context(), pid, 0); !errors.Is(err, ErrProtectedProcess) {
				t.Errorf("Kill(%d) error = %v, want ErrProtectedProcess", pid, err)
			}
		}
	})
}

// fakeKillOps records signals; beforeCheck runs right after the pidfd is
// opened (or, without pidfds, before the start-time check).
type fakeKillOps struct {
	openErr     error
	signalErr   error
	beforeCheck func()
	opened      []int
	pidfdKills  []int
	kills       []int
	closed      int
}

func (f *fakeKillOps) pidfdOpen(pid int) (int, error) {
	if f.beforeCheck != nil {
		f.beforeCheck()
	}
	if f.openErr != nil {
		return -1, f.openErr
	}
	f.opened = append(f.opened, pid)
	return 1000 + pid, nil
}

func (f *fakeKillOps) pidfdKill(fd int) error {
	if f.signalErr != nil {
		return f.signalErr
	}
	f.pidfdKills = append(f.pidfdKills, fd-1000)
	return nil
}

func (f *fakeKillOps) kill(pid int) error {
	if f.signalErr != nil {
		return f.signalErr
	}
	f.kills = append(f.kills, pid)
	return nil
}

func (f *fakeKillOps) close(int) error { f.closed++; return nil }

func TestPIDFDKillerSequence(t *testing.T) {
	const pid, start = 4242, 1000
	reuse := func(root string) func() {
		return func() {
			// Another process takes the PID after the sample.
			if err := enforcementtest.WriteProc(root, enforcementtest.Proc{PID: pid, StartTime: start + 1, Cgroup: enforcementtest.CgroupHost}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tc := range []struct {
		name           string
		ops            func(root string) *fakeKillOps
		wantErr        error
		wantPidfdKills int
		wantKills      int
	}{
		{name: "same process: signalled through the pidfd",
			ops: func(string) *fakeKillOps { return &fakeKillOps{} }, wantPidfdKills: 1},
		{name: "PID reused before the check: nothing signalled",
			ops: func(root string) *fakeKillOps { return &fakeKillOps{beforeCheck: reuse(root)} }, wantErr: ErrProcessChanged},
		{name: "process gone at pidfd_open",
			ops: func(string) *fakeKillOps { return &fakeKillOps{openErr: unix.ESRCH} }, wantErr: ErrProcessChanged},
		{name: "process exits between check and signal",
			ops: func(string) *fakeKillOps { return &fakeKillOps{signalErr: unix.ESRCH} }, wantErr: ErrProcessChanged},
		{name: "no pidfds: start time checked, then kill(2)",
			ops: func(string) *fakeKillOps { return &fakeKillOps{openErr: unix.ENOSYS} }, wantKills: 1},
		{name: "no pidfds and PID reused: nothing signalled",
			ops: func(root string) *fakeKillOps {
				return &fakeKillOps{openErr: unix.ENOSYS, beforeCheck: reuse(root)}
			}, wantErr: ErrProcessChanged},
		{name: "pidfd_open fails otherwise",
			ops: func(string) *fakeKillOps { return &fakeKillOps{openErr: unix.EPERM} }, wantErr: unix.EPERM},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			if err := enforcementtest.WriteProc(root, enforcementtest.Proc{PID: pid, StartTime: start, Cgroup: enforcementtest.CgroupHost}); err != nil {
				t.Fatal(err)
			}
			ops := tc.ops(root)
			k := &PIDFDKiller{procRoot: root, ops: ops, self: os.Getpid()}
			err := k.Kill(t.Context(), pid, start)
			if tc.wantErr == nil && err != nil || tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Fatalf("Kill() error = %v, want %v", err, tc.wantErr)
			}
			if len(ops.pidfdKills) != tc.wantPidfdKills || len(ops.kills) != tc.wantKills {
				t.Errorf("signals: pidfd %v, kill(2) %v; want %d and %d", ops.pidfdKills, ops.kills, tc.wantPidfdKills, tc.wantKills)
			}
			if len(ops.opened) != ops.closed {
				t.Errorf("opened %d pidfds, closed %d", len(ops.opened), ops.closed)
			}
		})
	}
}
