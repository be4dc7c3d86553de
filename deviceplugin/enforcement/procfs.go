package enforcement

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// DefaultProcRoot is the procfs the watchdog reads: the host's, since
// gpufrac-node runs with hostPID and NVML reports host PIDs.
const DefaultProcRoot = "/proc"

// ProcessInfo is what the watchdog learns about one PID at sample time.
type ProcessInfo struct {
	// StartTime is the process's start time in clock ticks after boot
	// (field 22 of /proc/<pid>/stat). With the PID it identifies the process:
	// a reused PID has a later start time.
	StartTime uint64
	// Container is the pod container the process runs in; zero for a host process.
	Container ContainerRef
}

// ProcFS reads processes from a procfs tree: the host's /proc, or a fixture
// tree with the same layout (<root>/<pid>/stat and <root>/<pid>/cgroup).
type ProcFS struct {
	// Root is the procfs mount point (DefaultProcRoot when empty).
	Root string
}

var _ ContainerResolver = ProcFS{}

func (p ProcFS) root() string {
	if p.Root == "" {
		return DefaultProcRoot
	}
	return p.Root
}

// StartTime implements ContainerResolver.
func (p ProcFS) StartTime(pid uint32) (uint64, error) { return ReadStartTime(p.root(), pid) }

// Container implements ContainerResolver from <root>/<pid>/cgroup. A
// process that is gone gives an error matching fs.ErrNotExist.
func (p ProcFS) Container(pid uint32) (ContainerRef, error) {
	path := filepath.Join(p.root(), strconv.FormatUint(uint64(pid), 10), "cgroup")
	data, err := os.ReadFile(path)
	if err != nil {
		return ContainerRef{}, fmt.Errorf("reading cgroup of process %d: %w", pid, err)
	}
	return ParseCgroup(string(data)), nil
}

// ReadStartTime returns the start time of pid from <procRoot>/<pid>/stat.
// A process that is gone gives an error matching fs.ErrNotExist.
func ReadStartTime(procRoot string, pid uint32) (uint64, error) {
	path := filepath.Join(procRoot, strconv.FormatUint(uint64(pid), 10), "stat")
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("reading stat of process %d: %w", pid, err)
	}
	start, err := ParseStartTime(data)
	if err != nil {
		return 0, fmt.Errorf("reading stat of process %d: %w", pid, err)
	}
	return start, nil
}

// errMalformedStat is returned for a /proc/<pid>/stat without a start time.
var errMalformedStat = errors.New("malformed /proc/<pid>/stat")

// statStartField is the index of starttime (field 22 in proc(5)) among the
// fields after the command name: the first of those is field 3 (state).
const statStartField = 22 - 3

// ParseStartTime returns starttime, field 22 of a /proc/<pid>/stat line.
// The command name (field 2) is in parentheses and may itself contain
// spaces and parentheses, so fields are counted from the last ')'.
func ParseStartTime(stat []byte) (uint64, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("%w: no command name", errMalformedStat)
	}
	fields := bytes.Fields(stat[i+1:])
	if len(fields) <= statStartField {
		return 0, fmt.Errorf("%w: %d fields after the command name, want at least %d", errMalformedStat, len(fields), statStartField+1)
	}
	v, err := strconv.ParseUint(string(fields[statStartField]), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: starttime %q is not a number", errMalformedStat, fields[statStartField])
	}
	return v, nil
}
