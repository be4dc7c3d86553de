// Package enforcementtest builds /proc fixture trees for the GPU memory
// watchdog, so tests and the cluster test bed can run gpufrac-node with
// --proc-root pointing at processes of their choosing, beside the mock NVML
// state directory (nvidia.WriteMockProcesses) that makes NVML report them.
package enforcementtest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// Proc is one process of a fixture tree.
type Proc struct {
	// PID is the process ID (the directory name).
	PID uint32
	// Comm is the command name in stat ("python" when empty).
	Comm string
	// StartTime is field 22 of stat, the start time in clock ticks.
	StartTime uint64
	// Cgroup is the content of the cgroup file (see the Cgroup* helpers).
	Cgroup string
}

// StatLine returns a /proc/<pid>/stat line with the given command name and
// start time and plausible values elsewhere.
func StatLine(pid uint32, comm string, startTime uint64) string {
	// Fields 3-21, then starttime (22), then the rest up to field 52.
	pre := "S 1 1 1 0 -1 4194560 1000 0 0 0 10 5 0 0 20 0 4 0"
	post := "1000000 1000 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0"
	return fmt.Sprintf("%d (%s) %s %d %s\n", pid, comm, pre, startTime, post)
}

// WriteProc writes <root>/<pid>/stat and <root>/<pid>/cgroup, replacing a
// previous process with the same PID (a reused PID, when the start time
// differs). Each file is written atomically.
func WriteProc(root string, p Proc) error {
	if p.Comm == "" {
		p.Comm = "python"
	}
	dir := filepath.Join(root, strconv.FormatUint(uint64(p.PID), 10))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("writing fixture process %d: %w", p.PID, err)
	}
	for name, content := range map[string]string{
		"stat":   StatLine(p.PID, p.Comm, p.StartTime),
		"cgroup": p.Cgroup,
	} {
		if err := writeAtomic(filepath.Join(dir, name), content); err != nil {
			return fmt.Errorf("writing fixture process %d: %w", p.PID, err)
		}
	}
	return nil
}

// CopyProc writes a fixture entry for a real process: its stat copied from
// the kernel's /proc (so its start time is the real one, and a kill through
// the fixture reaches it) and the given cgroup content.
func CopyProc(root string, pid uint32, cgroup string) error {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.FormatUint(uint64(pid), 10), "stat"))
	if err != nil {
		return fmt.Errorf("copying process %d into a fixture: %w", pid, err)
	}
	dir := filepath.Join(root, strconv.FormatUint(uint64(pid), 10))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("copying process %d into a fixture: %w", pid, err)
	}
	if err := writeAtomic(filepath.Join(dir, "stat"), string(stat)); err != nil {
		return fmt.Errorf("copying process %d into a fixture: %w", pid, err)
	}
	if err := writeAtomic(filepath.Join(dir, "cgroup"), cgroup); err != nil {
		return fmt.Errorf("copying process %d into a fixture: %w", pid, err)
	}
	return nil
}

// RemoveProc removes a process from the tree (it exited).
func RemoveProc(root string, pid uint32) error {
	if err := os.RemoveAll(filepath.Join(root, strconv.FormatUint(uint64(pid), 10))); err != nil {
		return fmt.Errorf("removing fixture process %d: %w", pid, err)
	}
	return nil
}

// CgroupContainerdSystemd is the cgroup v2 file of a process in a burstable
// pod's container under containerd with the systemd cgroup driver, the
// common layout of current nodes.
func CgroupContainerdSystemd(podUID types.UID, containerID string) string {
	uid := strings.ReplaceAll(string(podUID), "-", "_")
	return fmt.Sprintf("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod%s.slice/cri-containerd-%s.scope\n", uid, containerID)
}

// CgroupHost is the cgroup v2 file of a host process (a systemd service).
const CgroupHost = "0::/system.slice/nvidia-persistenced.service\n"

// ContainerID returns a deterministic 64-hex container ID for a name, for
// pod statuses ("containerd://" + ContainerID(name)) and cgroup paths.
func ContainerID(name string) string {
	sum := sha256.Sum256([]byte(name))
	return hex.EncodeToString(sum[:])
}

func writeAtomic(path, content string) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	if _, err := tmp.WriteString(content); err != nil {
		_ = tmp.Close()
		_ = os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		_ = os.Remove(tmp.Name())
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		_ = os.Remove(tmp.Name())
		return err
	}
	return nil
}
