package cluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

const (
	// clusterDirPrefix names the temporary directories of clusters started
	// without Options.Dir.
	clusterDirPrefix = "gpufrac-cluster-"
	// clusterDirLock is the file in a cluster's directory that its process
	// holds an exclusive flock on for as long as it lives (not past Stop:
	// the directory of a failed test is kept for its logs). The kernel
	// releases the flock when the process exits, however it exits.
	clusterDirLock = ".owner.lock"
	// staleClusterDirAge is how old a directory whose owner is gone must be
	// before a new cluster removes it: a failed test's kept logs stay an
	// hour for whoever reads them.
	staleClusterDirAge = time.Hour
)

// lockClusterDir creates dir's owner lock and takes it. The Cluster keeps
// the file (an *os.File that is collected closes its descriptor, which
// releases the flock), so the lock lasts while the Cluster is in use and
// at most until the process exits.
func lockClusterDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, clusterDirLock), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("creating the cluster dir's lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("locking the cluster dir %s: %w", dir, err)
	}
	return f, nil
}

// reapStaleClusterDirs removes the directories under tmp that clusters of
// processes gone left behind (a test binary killed at its timeout, a demo
// killed with -9): those named gpufrac-cluster-*, with an owner lock nobody
// holds, older than minAge. Directories without the lock file (made by an
// older harness, or by Options.Dir elsewhere) and symlinks are left alone.
// It returns the directories removed; failures are logged and skipped, as
// a cluster starts whether or not an old one could be removed.
func reapStaleClusterDirs(logger klog.Logger, tmp string, minAge time.Duration, now time.Time) []string {
	entries, err := os.ReadDir(tmp)
	if err != nil {
		logger.V(2).Info("Not looking for stale cluster dirs", "dir", tmp, "err", err)
		return nil
	}
	var removed []string
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), clusterDirPrefix) { // a symlink is not a dir here
			continue
		}
		dir := filepath.Join(tmp, e.Name())
		stale, err := ownerGone(dir, minAge, now)
		if err != nil {
			logger.V(2).Info("Leaving a cluster dir", "dir", dir, "err", err)
			continue
		}
		if !stale {
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			logger.Info("Could not remove a stale cluster dir", "dir", dir, "err", err)
			continue
		}
		logger.Info("Removed the dir of a cluster whose process is gone", "dir", dir)
		removed = append(removed, dir)
	}
	return removed
}

// ownerGone says whether dir's owner lock exists, is older than minAge and
// is free (its process exited). It takes the lock to find out and lets it
// go at once.
func ownerGone(dir string, minAge time.Duration, now time.Time) (bool, error) {
	path := filepath.Join(dir, clusterDirLock)
	st, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if !st.Mode().IsRegular() || now.Sub(st.ModTime()) < minAge {
		return false, nil
	}
	// Only this user's: root's harness leaves other users' runs alone.
	if sys, ok := st.Sys().(*syscall.Stat_t); !ok || int(sys.Uid) != os.Getuid() {
		return false, nil
	}
	f, err := os.OpenFile(path, os.O_RDWR|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return false, err
	}
	defer f.Close()
	switch err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); {
	case err == nil:
		return true, nil // closing f releases it
	case errors.Is(err, syscall.EWOULDBLOCK):
		return false, nil
	default:
		return false, err
	}
}
