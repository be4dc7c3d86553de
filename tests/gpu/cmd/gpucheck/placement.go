package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	"github.com/gpufrac/gpufrac/deviceplugin/enforcement"
	"github.com/gpufrac/gpufrac/deviceplugin/enforcement/enforcementtest"
)

// cgroupTop is the directory gpucheck creates its pod cgroups under, so that
// it never writes into a real node's kubepods tree.
const cgroupTop = "gpufrac-gpucheck"

// placement is where the watchdog finds the holder's container: the real
// /proc with the holder moved into a cgroup named like a pod container's,
// or a fixture /proc tree (the tests' way) when cgroups cannot be written.
type placement struct {
	// ProcRoot is the procfs the watchdog reads (and its killer checks).
	ProcRoot string
	// How says which placement it is, for the report.
	How string
	// cleanup removes what the placement created.
	cleanup func() error
}

// Cleanup removes the cgroups or the fixture; call it after the holder exited.
func (p *placement) Cleanup() error {
	if p == nil || p.cleanup == nil {
		return nil
	}
	return p.cleanup()
}

// podCgroupRel is the cgroup path (below a hierarchy's root) of a burstable
// pod's container, cgroupfs driver layout.
func podCgroupRel(uid types.UID, containerID string) string {
	return filepath.Join(cgroupTop, "kubepods", "burstable", "pod"+string(uid), containerID)
}

// fixtureCgroupLine is the cgroup file the fixture placement writes: the same
// path as the real placement, cgroup v2.
func fixtureCgroupLine(uid types.UID, containerID string) string {
	return "0::/" + podCgroupRel(uid, containerID) + "\n"
}

// placeCgroup moves pid into <hierarchy>/<podCgroupRel>, on cgroup v2 at
// cgroupRoot, on v1 in the first writable of the pids, cpu,cpuacct and
// memory hierarchies, and checks that /proc/<pid>/cgroup then names the pod
// container. cgroupRoot is /sys/fs/cgroup outside tests. On failure the
// placement returned holds what must be cleaned up once the process exited.
func placeCgroup(cgroupRoot string, pid uint32, uid types.UID, containerID string) (*placement, error) {
	var hierarchies []string
	if _, err := os.Stat(filepath.Join(cgroupRoot, "cgroup.controllers")); err == nil {
		hierarchies = []string{cgroupRoot}
	} else {
		for _, h := range []string{"pids", "cpu,cpuacct", "memory"} {
			hierarchies = append(hierarchies, filepath.Join(cgroupRoot, h))
		}
	}
	var errs []error
	// leftovers: cgroups a failed attempt created that still hold the
	// process; they go when it has exited.
	var leftovers []*placement
	for _, h := range hierarchies {
		if _, err := os.Stat(filepath.Join(h, "cgroup.procs")); err != nil {
			errs = append(errs, err)
			continue
		}
		p, err := placeIn(h, pid, uid, containerID)
		if err == nil {
			return p, nil
		}
		if p != nil {
			leftovers = append(leftovers, p)
		}
		errs = append(errs, err)
	}
	failed := &placement{cleanup: func() error {
		var errs []error
		for _, p := range leftovers {
			errs = append(errs, p.Cleanup())
		}
		return errors.Join(errs...)
	}}
	return failed, fmt.Errorf("placing process %d in a pod cgroup: %w", pid, errors.Join(errs...))
}

func placeIn(hierarchy string, pid uint32, uid types.UID, containerID string) (*placement, error) {
	rel := podCgroupRel(uid, containerID)
	// The directories to remove afterwards, deepest first; only those
	// gpucheck created.
	var created []string
	dir := hierarchy
	for _, seg := range strings.Split(rel, "/") {
		dir = filepath.Join(dir, seg)
		err := os.Mkdir(dir, 0o755)
		switch {
		case err == nil:
			created = append([]string{dir}, created...)
		case errors.Is(err, os.ErrExist):
		default:
			removeDirs(created)
			return nil, err
		}
	}
	cleanup := func() error { return removeDirs(created) }
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.FormatUint(uint64(pid), 10)), 0o644); err != nil {
		_ = cleanup()
		return nil, fmt.Errorf("moving process %d into %s: %w", pid, dir, err)
	}
	ref, err := enforcement.ProcFS{}.Container(pid)
	if err != nil {
		return &placement{cleanup: cleanup}, err
	}
	if ref.PodUID != uid || ref.ContainerID != containerID {
		return &placement{cleanup: cleanup}, fmt.Errorf("process %d moved into %s, but its /proc/%d/cgroup names pod %q container %q", pid, dir, pid, ref.PodUID, ref.ContainerID)
	}
	return &placement{ProcRoot: enforcement.DefaultProcRoot, How: "real cgroup " + dir, cleanup: cleanup}, nil
}

// removeDirs removes empty cgroup directories in order; a directory still
// holding a process stays, and the error says so.
func removeDirs(dirs []string) error {
	var errs []error
	for _, d := range dirs {
		if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// placeFixture writes a fixture /proc tree under dir with pid's real stat
// (so the killer's start-time check and pidfd reach the real process) and a
// cgroup file naming the pod container.
func placeFixture(dir string, pid uint32, uid types.UID, containerID string) (*placement, error) {
	root := filepath.Join(dir, "proc")
	if err := enforcementtest.CopyProc(root, pid, fixtureCgroupLine(uid, containerID)); err != nil {
		return nil, err
	}
	return &placement{
		ProcRoot: root,
		How:      "fixture /proc tree " + root + " (the real process's stat, cgroup file " + strings.TrimSpace(fixtureCgroupLine(uid, containerID)) + ")",
		cleanup:  func() error { return os.RemoveAll(root) },
	}, nil
}
