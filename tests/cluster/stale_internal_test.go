package cluster

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"
)

// TestReapStaleClusterDirs: a new cluster removes the directories of clusters
// whose process is gone, and nothing else.
func TestReapStaleClusterDirs(t *testing.T) {
	logger, _ := ktesting.NewTestContext(t)
	tmp := t.TempDir()
	now := time.Now()
	old := now.Add(-2 * staleClusterDirAge)
	mk := func(name string, lock bool, age time.Time) string {
		t.Helper()
		dir := filepath.Join(tmp, name)
		if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o755); err != nil {
			t.Fatal(err)
		}
		if lock {
			p := filepath.Join(dir, clusterDirLock)
			if err := os.WriteFile(p, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chtimes(p, age, age); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	gone := mk(clusterDirPrefix+"gone", true, old)
	// Another user's (as root, the harness sees every user's): not this
	// harness's to remove. Only root can make a file another user's.
	keep := []string{}
	if os.Getuid() == 0 {
		others := mk(clusterDirPrefix+"others", true, old)
		if err := os.Lchown(filepath.Join(others, clusterDirLock), 65534, 65534); err != nil {
			t.Fatal(err)
		}
		keep = append(keep, others)
	}
	recent := mk(clusterDirPrefix+"recent", true, now.Add(-time.Minute)) // a failed test's logs, kept a while
	noLock := mk(clusterDirPrefix+"nolock", false, old)                  // an older harness's, or not ours
	other := mk("someone-else", true, old)
	live := mk(clusterDirPrefix+"live", true, old)
	// A live owner: another process holds the lock (flock locks belong to
	// the open file, so a second open in this process would conflict too,
	// but a child shows the real case).
	holder := exec.Command("flock", filepath.Join(live, clusterDirLock), "sleep", "30")
	if err := holder.Start(); err != nil {
		t.Fatalf("flock(1) (util-linux) holds the lock from another process: %v", err)
	}
	t.Cleanup(func() { _ = holder.Process.Kill(); _ = holder.Wait() })
	// Wait until the child holds it.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if gone, err := ownerGone(live, staleClusterDirAge, now); err == nil && !gone {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("flock(1) never took the lock")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A symlink to a stale dir is not followed.
	target := mk("target", true, old)
	if err := os.Symlink(target, filepath.Join(tmp, clusterDirPrefix+"link")); err != nil {
		t.Fatal(err)
	}

	removed := reapStaleClusterDirs(logger, tmp, staleClusterDirAge, now)
	if !slices.Equal(removed, []string{gone}) {
		t.Errorf("removed %q, want only %q", removed, gone)
	}
	for _, d := range append(keep, recent, noLock, other, live, target) {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s: %v, want it kept", d, err)
		}
	}
	if _, err := os.Stat(gone); !os.IsNotExist(err) {
		t.Errorf("%s: %v, want it removed", gone, err)
	}

	// A cluster's own lock: taken, it makes its dir live to others.
	mine := mk(clusterDirPrefix+"mine", false, old)
	f, err := lockClusterDir(mine)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := os.Chtimes(f.Name(), old, old); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("flock", "-n", f.Name(), "true").CombinedOutput(); err == nil {
		t.Errorf("another process took a live cluster's lock (%s)", strings.TrimSpace(string(out)))
	}
}

// TestIPForwardRestored: the forwarding switch goes back to the machine's
// value after the real nodes, also after a holder that crashed.
func TestIPForwardRestored(t *testing.T) {
	dir := t.TempDir()
	proc, saved := filepath.Join(dir, "ip_forward"), filepath.Join(dir, "saved")
	set := func(v string) {
		t.Helper()
		if err := os.WriteFile(proc, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	get := func() string {
		t.Helper()
		b, err := os.ReadFile(proc)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	for _, tc := range []struct {
		name           string
		machine        string
		crashedHolders int // holders that saved, turned forwarding on and never restored
		want           string
	}{
		{name: "off before", machine: "0", want: "0"},
		{name: "on before", machine: "1", want: "1"},
		{name: "off before, a holder crashed", machine: "0", crashedHolders: 1, want: "0"},
		{name: "off before, two holders crashed", machine: "0", crashedHolders: 2, want: "0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			os.Remove(saved)
			set(tc.machine)
			for range tc.crashedHolders {
				if err := saveIPForward(proc, saved); err != nil {
					t.Fatal(err)
				}
				set("1")
			}
			if err := saveIPForward(proc, saved); err != nil {
				t.Fatal(err)
			}
			set("1") // the bridge plugin
			if err := restoreIPForward(proc, saved); err != nil {
				t.Fatal(err)
			}
			if got := get(); got != tc.want {
				t.Errorf("ip_forward %s after the real nodes, want %s", got, tc.want)
			}
			if _, err := os.Stat(saved); !os.IsNotExist(err) {
				t.Errorf("the saved value is kept after the restore: %v", err)
			}
			// Nothing saved: nothing to do.
			if err := restoreIPForward(proc, saved); err != nil {
				t.Errorf("a restore with nothing saved: %v", err)
			}
		})
	}
}
