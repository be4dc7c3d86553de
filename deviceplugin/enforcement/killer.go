package enforcement

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// ErrProcessChanged is returned by a Killer when the PID no longer belongs
// to the sampled process: it exited, or its PID was reused by another one.
// Nothing was signalled.
var ErrProcessChanged = errors.New("process exited or its PID now belongs to another process")

// ErrProtectedProcess is returned by a Killer asked to kill PID 0, PID 1 or
// gpufrac-node itself.
var ErrProtectedProcess = errors.New("refusing to kill init or gpufrac-node itself")

// PIDFDKiller kills processes with SIGKILL through a pidfd, never a reused
// PID. Kill opens a pidfd first, then compares the PID's start time with the
// one sampled: if they match, the PID has belonged to the sampled process
// without a break since the sample, so the pidfd refers to it, and
// pidfd_send_signal can only reach that process (or fail if it has exited
// since).
//
// The start time is read from ProcRoot. When ProcRoot is not the kernel's
// /proc (a fixture tree in tests and demos, or a mis-set flag), the
// kernel's /proc/<pid>/stat must match as well, so a fixture cannot aim the
// kill at an unrelated host process that happens to have the PID.
type PIDFDKiller struct {
	procRoot string
	// kernelProc is the kernel's procfs, also checked when it differs from
	// procRoot; "" skips the second check (tests with fake PIDs).
	kernelProc string
	ops        killOps
	self       int
}

var _ Killer = (*PIDFDKiller)(nil)

// NewKiller returns a PIDFDKiller reading start times from procRoot
// (DefaultProcRoot when empty).
func NewKiller(procRoot string) *PIDFDKiller {
	if procRoot == "" {
		procRoot = DefaultProcRoot
	}
	k := &PIDFDKiller{procRoot: procRoot, ops: sysKillOps{}, self: os.Getpid()}
	if filepath.Clean(procRoot) != DefaultProcRoot {
		k.kernelProc = DefaultProcRoot
	}
	return k
}

// killOps is the system-call seam of PIDFDKiller.
type killOps interface {
	// pidfdOpen opens a pidfd for pid (unix.ENOSYS before Linux 5.3).
	pidfdOpen(pid int) (int, error)
	// pidfdKill sends SIGKILL through a pidfd.
	pidfdKill(fd int) error
	// kill sends SIGKILL to a PID (the fallback without pidfds).
	kill(pid int) error
	close(fd int) error
}

type sysKillOps struct{}

func (sysKillOps) pidfdOpen(pid int) (int, error) { return unix.PidfdOpen(pid, 0) }
func (sysKillOps) pidfdKill(fd int) error         { return unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0) }
func (sysKillOps) kill(pid int) error             { return unix.Kill(pid, unix.SIGKILL) }
func (sysKillOps) close(fd int) error             { return unix.Close(fd) }

// Kill implements Killer. It returns ErrProcessChanged (wrapped) when pid
// is no longer the process that started at startTime, ErrProtectedProcess
// for init and gpufrac-node, and other errors when signalling failed.
//
// Kernels without pidfd_open (before 5.3) fall back to checking the start
// time right before kill(2); the PID could then, in theory, be reused in the
// microseconds between the two.
func (k *PIDFDKiller) Kill(_ context.Context, pid uint32, startTime uint64) error {
	p := int(pid)
	if p <= 1 || p == k.self {
		return fmt.Errorf("killing process %d: %w", pid, ErrProtectedProcess)
	}
	fd, err := k.ops.pidfdOpen(p)
	switch {
	case errors.Is(err, unix.ESRCH):
		return fmt.Errorf("killing process %d: %w", pid, ErrProcessChanged)
	case errors.Is(err, unix.ENOSYS):
		if err := k.sameProcess(pid, startTime); err != nil {
			return err
		}
		if err := k.ops.kill(p); err != nil {
			if errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("killing process %d: %w", pid, ErrProcessChanged)
			}
			return fmt.Errorf("killing process %d: %w", pid, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("opening a pidfd for process %d: %w", pid, err)
	}
	defer func() { _ = k.ops.close(fd) }()
	if err := k.sameProcess(pid, startTime); err != nil {
		return err
	}
	if err := k.ops.pidfdKill(fd); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("killing process %d: %w", pid, ErrProcessChanged)
		}
		return fmt.Errorf("killing process %d through its pidfd: %w", pid, err)
	}
	return nil
}

// sameProcess checks that pid still started at startTime, in procRoot and,
// when set, in the kernel's /proc.
func (k *PIDFDKiller) sameProcess(pid uint32, startTime uint64) error {
	for _, root := range []string{k.procRoot, k.kernelProc} {
		if root == "" {
			continue
		}
		got, err := ReadStartTime(root, pid)
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("killing process %d: %w", pid, ErrProcessChanged)
		}
		if err != nil {
			return fmt.Errorf("checking process %d before killing it: %w", pid, err)
		}
		if got != startTime {
			return fmt.Errorf("killing process %d: started at tick %d in %s, sampled at %d: %w", pid, got, root, startTime, ErrProcessChanged)
		}
	}
	return nil
}
