package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/tests/cluster"
	"github.com/gpufrac/gpufrac/tests/invariants"
)

// The upgrade across versions (make upgrade-test): opt-in, as it builds a
// second tree and needs the repository's history (a shallow clone lacks it).
const (
	// envUpgrade turns TestUpgradeAcrossVersions on ("1").
	envUpgrade = "GPUFRAC_UPGRADE"
	// envUpgradeFrom is the version upgraded from: a commit or tag.
	envUpgradeFrom = "GPUFRAC_UPGRADE_FROM"
	// maxWatchdogGap fails a node whose GPU memory watchdog stopped for
	// longer across its roll: the old agent's stop (SIGTERM), the new one's
	// start and registration take seconds; 30 s only passes a regression.
	maxWatchdogGap = 30 * time.Second
	// watchdogPasses is the watchdog's poll counter (a histogram's count,
	// one observation per pass) on gpufrac-node's /metrics.
	watchdogPasses = "gpufrac_enforcement_poll_duration_seconds_count"
	// watchdogStarted is gpufrac-node's log line as its watchdog starts;
	// its first pass follows at once (enforcement.Watchdog.Run).
	watchdogStarted = `"GPU memory watchdog started"`
)

// codePaths are what makes a gpufrac version: its code and its chart.
var codePaths = []string{"api", "cmd", "coordinator", "deviceplugin", "mig", "timeslice", "deployments/helm", "go.mod", "go.sum"}

// fromVersion is an earlier gpufrac built from its own tree.
type fromVersion struct {
	ref, commit string
	// node and coordinator are its binaries, chart its chart directory.
	node, coordinator, chart string
}

// defaultUpgradeFrom is the version before the last change of gpufrac's
// code or chart: the first parent of the last commit on HEAD's first-parent
// line (main: a merge, or a commit made there) that touched codePaths.
// HEAD~1 would often be a docs commit, the same code.
func defaultUpgradeFrom(t *testing.T, root string) string {
	t.Helper()
	out, err := git(root, append([]string{"log", "-1", "--first-parent", "--format=%H", "HEAD", "--"}, codePaths...)...)
	if err != nil || out == "" {
		t.Fatalf("%s unset and no commit changing %v found (a shallow clone? git fetch --unshallow): %v", envUpgradeFrom, codePaths, err)
	}
	return out + "^"
}

func git(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

// buildFromVersion exports ref's tree (git archive) into
// bin/upgrade-from/<commit> and builds its gpufrac-node and
// gpufrac-coordinator there with its own Makefile (build-node,
// build-static), as its release was built; the Go build and module caches
// are shared. A tree built before is reused. Any failure fails the test:
// the upgrade was asked for.
func buildFromVersion(t *testing.T, root, ref string) fromVersion {
	t.Helper()
	commit, err := git(root, "rev-parse", "--verify", "--quiet", ref+"^{commit}")
	if err != nil {
		t.Fatalf("%s=%s is no commit of this clone (a shallow clone? git fetch --unshallow): %v", envUpgradeFrom, ref, err)
	}
	dir := filepath.Join(root, "bin", "upgrade-from", commit)
	v := fromVersion{
		ref: ref, commit: commit,
		node:        filepath.Join(dir, "bin", "gpufrac-node"),
		coordinator: filepath.Join(dir, "bin", "gpufrac-coordinator"),
		chart:       filepath.Join(dir, "deployments", "helm", "gpufrac"),
	}
	done := filepath.Join(dir, ".built")
	if _, err := os.Stat(done); err == nil {
		t.Logf("upgrade from %s (%s), built before in %s", ref, commit, dir)
		return v
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	archive := exec.Command("git", "archive", "--format=tar", commit)
	archive.Dir = root
	extract := exec.Command("tar", "-x", "-C", dir)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	extract.Stdin = pipe
	var archiveErr, extractErr bytes.Buffer
	archive.Stderr, extract.Stderr = &archiveErr, &extractErr
	if err := extract.Start(); err != nil {
		t.Fatal(err)
	}
	if err := archive.Run(); err != nil {
		t.Fatalf("git archive %s: %v: %s", commit, err, archiveErr.String())
	}
	if err := extract.Wait(); err != nil {
		t.Fatalf("extracting %s into %s: %v: %s", commit, dir, err, extractErr.String())
	}
	// Its own Makefile's commands: the binaries stamped with its version.
	build := exec.Command("make", "-C", dir, "build-node", "build-static", "STATIC_CMDS=gpufrac-coordinator")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building %s (%s) with its Makefile: %v\n%s", ref, commit, err, out)
	}
	for _, p := range []string{v.node, v.coordinator, filepath.Join(v.chart, "Chart.yaml")} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s (%s) built, but: %v", ref, commit, err)
		}
	}
	if err := os.WriteFile(done, []byte(commit+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("upgrade from %s (%s): exported and built in %s in %s", ref, commit, dir, time.Since(began).Round(time.Second))
	return v
}

// watchdogCount reads the watchdog's pass counter from a gpufrac-node's
// metrics address.
func watchdogCount(ctx context.Context, addr string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, watchdogPasses+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("%s: no %s", addr, watchdogPasses)
}

// lastPass follows an agent's watchdog counter every 50 ms until the
// process stops answering, and returns the time of the scrape before the
// last increase: the last pass came after it (an upper bound of the gap
// measured from it).
func lastPass(ctx context.Context, addr string) (time.Time, error) {
	var last float64
	var before, lastIncrease time.Time
	for {
		t := time.Now()
		n, err := watchdogCount(ctx, addr)
		if err != nil {
			if lastIncrease.IsZero() {
				return time.Time{}, fmt.Errorf("no watchdog pass seen on %s: %w", addr, err)
			}
			return lastIncrease, nil
		}
		if n < last {
			// Another process on the port (a new agent given it): the old one is gone.
			return lastIncrease, nil
		}
		if n > last {
			last, lastIncrease = n, before
			if lastIncrease.IsZero() {
				lastIncrease = t
			}
		}
		before = t
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// firstWatchdogStart reads the time of the first watchdog start logged
// after offset in a klog text log ("I1129 15:04:05.000000 ...").
func firstWatchdogStart(path string, offset int64) (time.Time, error) {
	f, err := os.Open(path)
	if err != nil {
		return time.Time{}, err
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return time.Time{}, err
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, watchdogStarted) || len(line) < 21 {
			continue
		}
		now := time.Now()
		ts, err := time.ParseInLocation("0102 15:04:05.000000", line[1:21], time.Local)
		if err != nil {
			return time.Time{}, fmt.Errorf("%s: the klog header of %q: %w", path, line, err)
		}
		return ts.AddDate(now.Year(), 0, 0), nil
	}
	if err := sc.Err(); err != nil {
		return time.Time{}, err
	}
	return time.Time{}, fmt.Errorf("%s: no %s line after byte %d", path, watchdogStarted, offset)
}

// processBinary is the executable a process runs.
func processBinary(pid int) string {
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return fmt.Sprintf("(pid %d: %v)", pid, err)
	}
	return exe
}

// TestUpgradeAcrossVersions upgrades gpufrac from an earlier version
// (GPUFRAC_UPGRADE_FROM, default defaultUpgradeFrom) to this tree while work
// runs, as `helm upgrade` to a new chart version does: the earlier chart,
// coordinator and node agents run fractions, whole GPUs and a gang on three
// GPU nodes; then this tree's chart is applied, the coordinator Deployment
// rolls (two replicas, one at a time, leader election handing over) and the
// node DaemonSet rolls one node at a time (its updateStrategy, maxUnavailable
// 1): each node's old agent stops, this tree's starts with the new chart's
// arguments and config, and the next node waits until it is registered and
// ready. After every node the invariants hold and the running work is what
// it was (no pod moved or restarted, no reservation recreated, the queues
// unchanged); new work is placed after. The time each node went without a
// GPU memory watchdog is measured and bounded (maxWatchdogGap). Opt-in
// (GPUFRAC_UPGRADE=1, make upgrade-test).
func TestUpgradeAcrossVersions(t *testing.T) {
	if os.Getenv(envUpgrade) != "1" {
		t.Skipf("opt-in: make upgrade-test (%s=1, %s=<commit or tag>)", envUpgrade, envUpgradeFrom)
	}
	if testing.Short() {
		t.Skip("end-to-end: needs the local cluster (make tools)")
	}
	root := repoRoot(t)
	ref := os.Getenv(envUpgradeFrom)
	if ref == "" {
		ref = defaultUpgradeFrom(t, root)
	}
	from := buildFromVersion(t, root, ref)
	newNode := buildBinary(t, "gpufrac-node")
	newCoordinator := buildBinary(t, "gpufrac-coordinator")

	// 1. The earlier version: its chart, its node agents, its coordinator.
	c := startCluster(t, cluster.Options{
		Chart:      cluster.ChartOptions{Dir: from.chart},
		NodeAgents: &cluster.NodeAgentOptions{Binary: from.node},
	})
	ctx := t.Context()
	nodes := addGPUNodes(t, c, "gpu", "pool-a", 3)
	for _, n := range nodes {
		a := c.NodeAgent(n)
		if p, _ := a.Process(); processBinary(p.PID) != from.node {
			t.Fatalf("%s's agent runs %s, want %s", n, processBinary(p.PID), from.node)
		}
	}
	applyYAML(t, c, queuesYAML(map[string]string{"team-a": "8", "team-b": "8"}))
	before := c.Installed()
	coordinators := map[string]*coordinator{}
	for _, id := range []string{"from-0", "from-1"} {
		coordinators[id] = startCoordinatorBin(t, c, from.coordinator, id, nil, "--leader-elect=true")
	}

	// 2. Work of every kind on every node: fractions sharing GPUs, a whole
	// GPU, a gang (each pinned to its node by a node selector, so every
	// roll has work under it).
	type fraction struct {
		units int
		node  string
	}
	fractions := map[string]fraction{
		"frac-30": {30, nodes[0]}, "frac-40": {40, nodes[0]}, "frac-50": {50, nodes[0]},
		"frac-20": {20, nodes[1]}, "frac-60": {60, nodes[1]}, "frac-25": {25, nodes[1]},
		"frac-35": {35, nodes[2]}, "frac-45": {45, nodes[2]},
	}
	const hostname = "kubernetes.io/hostname"
	var all []string
	fractionUnits := 0
	for _, name := range slices.Sorted(maps.Keys(fractions)) {
		f := fractions[name]
		create(t, c, pod(name, "team-b").Fraction(f.units).NodeSelector(hostname, f.node).Obj())
		all = append(all, name)
		fractionUnits += f.units
	}
	create(t, c,
		pod("whole", "team-a").GPUs(1).NodeSelector(hostname, nodes[0]).Obj(),
		pod("gang-0", "team-a").GPUs(2).PodGroup("train").MinMember(2).NodeSelector(hostname, nodes[2]).Obj(),
		pod("gang-1", "team-a").GPUs(2).PodGroup("train").MinMember(2).NodeSelector(hostname, nodes[2]).Obj(),
	)
	all = append(all, "whole", "gang-0", "gang-1")
	running(t, c, 120*time.Second, all...)
	var w0 world
	waitFor(t, 60*time.Second, "GPUs written back, reservations held and queue status settled", func(ctx context.Context) (bool, error) {
		w0 = snapshot(t, c)
		shared := map[string]bool{}
		for _, n := range all {
			if w0.Pods[n] == "" || strings.HasSuffix(w0.Pods[n], " given=") {
				return false, nil
			}
			if _, ok := fractions[n]; ok {
				f := strings.Fields(w0.Pods[n]) // uid phase node= gpu= given=
				shared[f[2]+" "+f[len(f)-1]] = true
			}
		}
		return len(w0.Reservations) == len(shared) && queueGPU(ctx, c, "team-a") == 5000 && queueGPU(ctx, c, "team-b") == int64(fractionUnits*10) &&
			strings.HasSuffix(w0.Queues["team-a"], "pending=0") && strings.HasSuffix(w0.Queues["team-b"], "pending=0"), nil
	})
	t.Logf("before the upgrade (from %s): pods %v, reservations %v, queues %v", from.commit, w0.Pods, w0.Reservations, w0.Queues)
	invariants.Eventually(t, c.Client, c.Dynamic, invariants.Options{AllowIdleReservations: true}, 60*time.Second)

	// 3. helm upgrade to this tree's chart.
	testbed, err := cluster.TestbedValues()
	if err != nil {
		t.Fatal(err)
	}
	after, err := c.InstallChart(ctx, cluster.ChartOptions{ValuesFiles: []string{testbed}})
	if err != nil {
		t.Fatalf("applying this tree's chart over %s's: %v", from.commit, err)
	}
	t.Logf("chart upgrade: gpufrac-node arguments (-from +to):\n%s\ngpufrac-coordinator arguments (-from +to):\n%s\nnode config changed: %v",
		cmp.Diff(before.Node.Args, after.Node.Args), cmp.Diff(before.Coordinator.Args, after.Coordinator.Args), before.NodeConfig != after.NodeConfig)

	// 4. The coordinator Deployment rolls (maxSurge 1, maxUnavailable 0 for
	// two replicas): a new replica starts, an old one stops, twice; the
	// Lease passes to a new replica.
	for i, id := range []string{"from-0", "from-1"} {
		next := fmt.Sprintf("to-%d", i)
		coordinators[next] = startCoordinatorBin(t, c, newCoordinator, next, nil, "--leader-elect=true")
		coordinators[id].stop(syscall.SIGTERM)
	}
	waitFor(t, 30*time.Second, "an upgraded coordinator to lead", func(ctx context.Context) (bool, error) {
		l, err := c.Client.CoordinationV1().Leases(after.Namespace).Get(ctx, "gpufrac-coordinator", metav1.GetOptions{})
		return err == nil && l.Spec.HolderIdentity != nil && strings.HasPrefix(*l.Spec.HolderIdentity, "to-"), nil
	})

	// 5. The node DaemonSet rolls one node at a time.
	gaps := map[string]time.Duration{}
	for _, n := range nodes {
		a := c.NodeAgent(n)
		old, oldAddr := a.Process()
		logInfo, err := os.Stat(old.LogPath)
		if err != nil {
			t.Fatal(err)
		}
		var (
			wg      sync.WaitGroup
			last    time.Time
			lastErr error
		)
		watchCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		wg.Go(func() { last, lastErr = lastPass(watchCtx, oldAddr) })
		// The follower sees at least one pass of the old agent first.
		time.Sleep(1500 * time.Millisecond)
		began := time.Now()
		err = a.Roll(ctx, newNode)
		wg.Wait()
		cancel()
		if err != nil {
			t.Fatalf("rolling %s: %v", n, err)
		}
		if lastErr != nil {
			t.Fatalf("%s's old agent: %v", n, lastErr)
		}
		cur, _ := a.Process()
		if got := processBinary(cur.PID); got != newNode {
			t.Fatalf("%s's agent runs %s after the roll, want %s", n, got, newNode)
		}
		first, err := firstWatchdogStart(cur.LogPath, logInfo.Size())
		if err != nil {
			t.Fatalf("%s's new agent: %v", n, err)
		}
		gap := first.Sub(last)
		gaps[n] = gap
		t.Logf("WATCHDOG GAP %s: %.2f s (old agent %d's last pass after %s, new agent %d's first pass %s; roll took %s)",
			n, gap.Seconds(), old.PID, last.Format("15:04:05.000"), cur.PID, first.Format("15:04:05.000"), time.Since(began).Round(time.Millisecond))
		if gap < -100*time.Millisecond {
			t.Errorf("%s: the new agent's watchdog started %s before the old one's last pass: both ran at once", n, -gap)
		}
		if gap > maxWatchdogGap {
			t.Errorf("%s went %s without a GPU memory watchdog across its roll (bound %s)", n, gap, maxWatchdogGap)
		}
		// The new agent enforces: its watchdog passes go on.
		_, addr := a.Process()
		var firstCount float64
		waitFor(t, 15*time.Second, n+"'s new watchdog passing", func(ctx context.Context) (bool, error) {
			v, err := watchdogCount(ctx, addr)
			if err != nil {
				return false, nil
			}
			if firstCount == 0 {
				firstCount = v
			}
			return v > firstCount, nil
		})
		waitFor(t, 30*time.Second, n+" serving its GPUs again", func(ctx context.Context) (bool, error) {
			node, err := c.Client.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			q := node.Status.Allocatable[api.ResourceFraction]
			return q.Value() == 800, nil
		})
		invariants.Eventually(t, c.Client, c.Dynamic, invariants.Options{AllowIdleReservations: true}, 60*time.Second)
		var w world
		settled := func(context.Context) (bool, error) { w = snapshot(t, c); return cmp.Equal(w0, w), nil }
		if ok, _ := settled(ctx); !ok {
			// A write-back may be in flight: give it a moment, then report.
			time.Sleep(5 * time.Second)
			if ok, _ := settled(ctx); !ok {
				t.Fatalf("running work changed after rolling %s (-before +after):\n%s", n, cmp.Diff(w0, w))
			}
		}
	}

	// 6. New work after the upgrade: placed by the new coordinator, served
	// (GPU written back) by a new agent.
	create(t, c, pod("frac-new", "team-b").Fraction(20).Obj())
	p := running(t, c, 60*time.Second, "frac-new")["frac-new"]
	waitFor(t, 30*time.Second, "frac-new's GPU written back", func(ctx context.Context) (bool, error) {
		got, err := c.Client.CoreV1().Pods("default").Get(ctx, "frac-new", metav1.GetOptions{})
		return err == nil && got.Annotations[api.AnnotationAllocatedGPU] != "", nil
	})
	t.Logf("frac-new placed on %s %s after the upgrade", p.Spec.NodeName, p.Annotations[api.AnnotationGPU])
	invariants.Eventually(t, c.Client, c.Dynamic, invariants.Options{AllowIdleReservations: true}, 60*time.Second)

	// 7. Nothing the old version ran changed.
	if err := c.Client.CoreV1().Pods("default").Delete(ctx, "frac-new", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	var w1 world
	waitFor(t, 30*time.Second, "frac-new gone and the queues settled", func(ctx context.Context) (bool, error) {
		w1 = snapshot(t, c)
		_, present := w1.Pods["frac-new"]
		return !present && cmp.Equal(w0.Queues, w1.Queues), nil
	})
	if diff := cmp.Diff(w0, w1); diff != "" {
		t.Errorf("the upgrade changed running work (-before +after):\n%s", diff)
	}
	evs, err := c.Client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "reason=Evicted"})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs.Items) > 0 {
		t.Errorf("%d pods evicted across the upgrade", len(evs.Items))
	}
	var summary []string
	for _, n := range nodes {
		summary = append(summary, fmt.Sprintf("%s %.2f s", n, gaps[n].Seconds()))
	}
	t.Logf("UPGRADE %s (%s) -> this tree: watchdog gap per node: %s", from.ref, from.commit, strings.Join(summary, ", "))
}
