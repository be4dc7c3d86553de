package e2e

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/tests/cluster"
)

// The taint-eviction race (kubernetes#119862, #139992): kube-controller-manager's
// taint-eviction controller keeps the NoExecute taints of every node from its node
// informer. A pod bound to a node it still thinks tainted, and not tolerating the
// taint, is deleted at once with a DisruptionTarget condition of reason
// DeletionByTaintManager. Karpenter removes a new node's karpenter.sh/unregistered
// NoExecute taint when the node registers; a scheduler that binds the moment its own
// informer shows the taint gone can be ahead of the controller. The coordinator waits
// NewNodeSettle (--new-node-settle, 100 ms; it was 300 ms) for that reason. TestTaintEvictionRace measures how often a
// bind d after the binder's informer saw the taint go loses the pod.
const (
	raceTaintKey     = "gpufrac.io/race-test"
	raceNodeLabel    = "gpufrac.io/race-test"
	raceNamespace    = "taint-race"
	raceLoadNS       = "taint-race-load"
	raceScheduler    = "gpufrac-race-binder" // no scheduler answers to it: only the test binds
	raceTaintedFor   = time.Second           // how long a node carries the taint first (Karpenter's registration takes ~1 s)
	raceWatchFor     = 3 * time.Second       // how long a bound pod is watched
	raceReasonTaintM = "DeletionByTaintManager"
)

// raceDelays are the waits measured, in the order of the table.
var raceDelays = []time.Duration{0, 25 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 300 * time.Millisecond}

// raceTrial is one node and one pod.
type raceTrial struct {
	node    string // also the pod's name
	control bool   // bind while the node is still tainted: the pod must be lost
	delay   time.Duration
	removed time.Time // the taint removal's update returned
	seen    time.Time // the binder's informer showed the node without the taint
	bound   time.Time // the binding's POST returned
	lost    string    // why the pod was lost within raceWatchFor, "" when it was not
}

// raceWatch is the binder's view: a node informer, as the coordinator has, and a
// pod informer on the trials' pods.
type raceWatch struct {
	mu        sync.Mutex
	untainted map[string]chan time.Time // node -> who waits for its taint to go
	lost      map[string]string         // pod -> how it was lost
}

func hasRaceTaint(n *corev1.Node) bool {
	return slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == raceTaintKey })
}

func (w *raceWatch) node(obj any) {
	n, ok := obj.(*corev1.Node)
	if !ok || hasRaceTaint(n) {
		return
	}
	at := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if ch, ok := w.untainted[n.Name]; ok {
		ch <- at
		delete(w.untainted, n.Name)
	}
}

// expect registers a wait for node's taint to go; call it before removing the taint.
func (w *raceWatch) expect(node string) <-chan time.Time {
	ch := make(chan time.Time, 1)
	w.mu.Lock()
	w.untainted[node] = ch
	w.mu.Unlock()
	return ch
}

func (w *raceWatch) pod(obj any) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	why := ""
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
			why = c.Reason
		}
	}
	if why == "" && p.DeletionTimestamp != nil {
		why = "deleted"
	}
	if why != "" {
		w.mark(p.Name, why)
	}
}

func (w *raceWatch) podGone(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	if p, ok := obj.(*corev1.Pod); ok {
		w.mark(p.Name, "gone")
	}
}

// mark keeps the first reason a pod was seen lost, but a DisruptionTarget reason
// seen later (the informer may deliver the deletion first) replaces "deleted".
func (w *raceWatch) mark(pod, why string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if prev := w.lost[pod]; prev == "" || (prev == "deleted" && why != "gone") {
		w.lost[pod] = why
	}
}

func (w *raceWatch) verdict(pod string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lost[pod]
}

// TestTaintEvictionRace is a measurement (GPUFRAC_TAINT_RACE=1): many kwok nodes at
// a time, each created with a NoExecute taint, the taint removed after raceTaintedFor,
// and a pod without tolerations bound (pods/binding, as the coordinator binds) d after
// the binder's own node informer showed the taint gone; a pod deleted by the taint
// manager within raceWatchFor is a race lost. Control trials bind while the taint is
// still there: every one of them must be lost, or the detector is broken.
//
// GPUFRAC_TAINT_RACE_TRIALS (per d, default 200), GPUFRAC_TAINT_RACE_PARALLEL (trials
// at a time, default 40), GPUFRAC_TAINT_RACE_LOAD (background API writes per second:
// pods created, bound to 4 untainted kwok nodes and deleted; default 0).
func TestTaintEvictionRace(t *testing.T) {
	if os.Getenv("GPUFRAC_TAINT_RACE") == "" {
		t.Skip("measurement: set GPUFRAC_TAINT_RACE=1 to run (see docs/benchmarks.md, The taint-eviction race, measured)")
	}
	if testing.Short() {
		t.Skip("end-to-end: needs the local cluster")
	}
	perDelay := raceEnvInt(t, "GPUFRAC_TAINT_RACE_TRIALS", 200)
	workers := raceEnvInt(t, "GPUFRAC_TAINT_RACE_PARALLEL", 40)
	loadQPS := raceEnvInt(t, "GPUFRAC_TAINT_RACE_LOAD", 0)
	const controls = 20

	c := cluster.StartForTest(t, cluster.Options{
		Bare: true,
		// -v=4 logs the taint-eviction controller's "Updating known taints on node".
		ExtraArgs: map[string][]string{"kube-controller-manager": {"-v=4"}},
	})
	ctx := t.Context()
	client := fastClient(t, c)
	for _, ns := range []string{raceNamespace, raceLoadNS} {
		if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			_, err := client.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
			return err == nil, nil
		}); err != nil {
			t.Fatalf("no default ServiceAccount in %s: %v", ns, err)
		}
	}

	watch := &raceWatch{untainted: map[string]chan time.Time{}, lost: map[string]string{}}
	nodeFactory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = raceNodeLabel + "=true" }))
	if _, err := nodeFactory.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: watch.node, UpdateFunc: func(_, obj any) { watch.node(obj) },
	}); err != nil {
		t.Fatal(err)
	}
	podFactory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(raceNamespace))
	if _, err := podFactory.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: watch.pod, UpdateFunc: func(_, obj any) { watch.pod(obj) }, DeleteFunc: watch.podGone,
	}); err != nil {
		t.Fatal(err)
	}
	// Their own context: t.Context ends only after the test returns, and
	// Shutdown waits for the informers to stop.
	infCtx, stopInformers := context.WithCancel(ctx)
	defer func() {
		stopInformers()
		nodeFactory.Shutdown()
		podFactory.Shutdown()
	}()
	nodeFactory.Start(infCtx.Done())
	podFactory.Start(infCtx.Done())
	nodeFactory.WaitForCacheSync(infCtx.Done())
	podFactory.WaitForCacheSync(infCtx.Done())

	var trials []*raceTrial
	for _, d := range raceDelays {
		for range perDelay {
			trials = append(trials, &raceTrial{delay: d})
		}
	}
	for range controls {
		trials = append(trials, &raceTrial{control: true})
	}
	// Mixed, so that every d meets the same load over the run.
	rand.New(rand.NewPCG(16, 119862)).Shuffle(len(trials), func(i, j int) { trials[i], trials[j] = trials[j], trials[i] })
	for i, tr := range trials {
		tr.node = fmt.Sprintf("race-%04d", i)
	}

	var load *raceLoadStats
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var loadDone sync.WaitGroup
	if loadQPS > 0 {
		load = startRaceLoad(t, loadCtx, &loadDone, client, loadQPS)
	}

	loadBefore := loadavg()
	began := time.Now()
	err := parallel(ctx, len(trials), workers, func(ctx context.Context, i int) error {
		return runRaceTrial(ctx, client, watch, trials[i])
	})
	elapsed := time.Since(began)
	loadAfter := loadavg()
	stopLoad()
	loadDone.Wait()
	if err != nil {
		t.Fatal(err)
	}

	kcm := readTaintManagerLog(t, c)
	t.Logf("%d trials (%d per d, %d controls), %d at a time, in %s; load average %s before, %s after",
		len(trials), perDelay, controls, workers, elapsed.Round(time.Second), loadBefore, loadAfter)
	if load != nil {
		secs := load.elapsed().Seconds()
		t.Logf("background load: target %d writes/s; achieved %.0f writes/s (%d pods created+bound+deleted, %d errors) over %.0f s",
			loadQPS, float64(load.writes.Load())/secs, load.pods.Load(), load.errors.Load(), secs)
	}
	var out strings.Builder
	fmt.Fprintf(&out, "\n| d | trials | races lost | rate | 95%% upper bound | binder informer lag p50 / p99 / max | controller lag p50 / p99 / max | controller behind binder p50 / p99 / max | controller saw the taint first | controller behind the bind |\n|---|---|---|---|---|---|---|---|---|---|\n")
	rows := append([]time.Duration{-1}, raceDelays...)
	for _, d := range rows {
		var n, lost, sawFirst, inLog, exposed int
		var binderLag, kcmLag, kcmBehind []time.Duration
		reasons := map[string]int{}
		for _, tr := range trials {
			if tr.control != (d < 0) || (!tr.control && tr.delay != d) {
				continue
			}
			n++
			if tr.lost != "" {
				lost++
				reasons[tr.lost]++
			}
			if tr.control {
				continue
			}
			if tr.lost != "" {
				e := kcm[tr.node]
				if e == nil {
					e = &taintManagerSeen{}
				}
				t.Logf("race lost: %s d=%s (%s): taint removed %s, binder saw it %s, bound %s, controller saw it %s",
					tr.node, tr.delay, tr.lost, tr.removed.Format(time.StampMicro), tr.seen.Format(time.StampMicro),
					tr.bound.Format(time.StampMicro), e.untainted.Format(time.StampMicro))
			}
			binderLag = append(binderLag, tr.seen.Sub(tr.removed))
			if e, ok := kcm[tr.node]; ok && !e.tainted.IsZero() {
				inLog++
				if e.tainted.Before(tr.removed) {
					sawFirst++
				}
				if !e.untainted.IsZero() {
					kcmLag = append(kcmLag, e.untainted.Sub(tr.removed))
					kcmBehind = append(kcmBehind, e.untainted.Sub(tr.seen))
					if e.untainted.After(tr.bound) {
						exposed++
					}
				}
			}
		}
		label, first, behind := d.String(), fmt.Sprintf("%d/%d", sawFirst, inLog), fmt.Sprintf("%d/%d", exposed, len(kcmLag))
		if d < 0 {
			label, first, behind = "control: bound while tainted", "-", "-"
		}
		fmt.Fprintf(&out, "| %s | %d | %d %v | %.1f%% | %.1f%% | %s | %s | %s | %s | %s |\n", label, n, lost, reasons,
			100*float64(lost)/float64(n), 100*clopperPearsonUpper(lost, n, 0.05),
			lagFigures(binderLag), lagFigures(kcmLag), lagFigures(kcmBehind), first, behind)
		if d < 0 && lost != n {
			t.Errorf("%d of %d control pods (bound to a node still tainted) were not deleted by the taint manager within %s: the measurement cannot see the race", n-lost, n, raceWatchFor)
		}
	}
	t.Log(out.String())
	t.Log("binder informer lag: from the taint removal's update returning to the binder's informer showing the node untainted " +
		"(negative: the watch event came before the update's response); controller lag: from the same return to " +
		"kube-controller-manager's taint-eviction controller logging the node's taints without it (the count of nodes found in its log " +
		"in brackets); controller behind binder: from the binder's informer showing it to the controller's log line; " +
		"controller saw the taint first: its log showed the taint before the removal; " +
		"controller behind the bind: trials whose binding POST returned before the controller logged the taint gone")
}

// runRaceTrial runs one trial and cleans up after it.
func runRaceTrial(ctx context.Context, client kubernetes.Interface, watch *raceWatch, tr *raceTrial) error {
	pods := client.CoreV1().Pods(raceNamespace)
	if _, err := pods.Create(ctx, racePod(tr.node, raceNamespace), metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating pod %s: %w", tr.node, err)
	}
	node := cluster.NewNode(cluster.NodeSpec{
		Name:   tr.node,
		Labels: map[string]string{raceNodeLabel: "true"},
		Taints: []corev1.Taint{{Key: raceTaintKey, Effect: corev1.TaintEffectNoExecute}},
	})
	if _, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating node %s: %w", tr.node, err)
	}
	defer func() {
		// Not ctx: clean up even when the test is ending.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = pods.Delete(cctx, tr.node, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		_ = client.CoreV1().Nodes().Delete(cctx, tr.node, metav1.DeleteOptions{})
	}()
	if err := sleepCtx(ctx, raceTaintedFor); err != nil {
		return err
	}
	if !tr.control {
		untainted := watch.expect(tr.node)
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			n, err := client.CoreV1().Nodes().Get(ctx, tr.node, metav1.GetOptions{})
			if err != nil {
				return err
			}
			n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == raceTaintKey })
			_, err = client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
			return err
		}); err != nil {
			return fmt.Errorf("removing the taint of %s: %w", tr.node, err)
		}
		tr.removed = time.Now()
		select {
		case tr.seen = <-untainted:
		case <-time.After(30 * time.Second):
			return fmt.Errorf("the binder's informer never showed %s untainted", tr.node)
		case <-ctx.Done():
			return ctx.Err()
		}
		if err := sleepCtx(ctx, time.Until(tr.seen.Add(tr.delay))); err != nil {
			return err
		}
	}
	binding := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: tr.node, Namespace: raceNamespace},
		Target:     corev1.ObjectReference{Kind: "Node", Name: tr.node},
	}
	if err := pods.Bind(ctx, binding, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("binding %s: %w", tr.node, err)
	}
	tr.bound = time.Now()
	if err := sleepCtx(ctx, raceWatchFor); err != nil {
		return err
	}
	tr.lost = watch.verdict(tr.node)
	return nil
}

// racePod is an unbound pod no scheduler takes and with no tolerations of its own
// (the API server's DefaultTolerationSeconds adds the usual not-ready and
// unreachable ones, not raceTaintKey).
func racePod(name, ns string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			SchedulerName:                 raceScheduler,
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			Containers:                    []corev1.Container{{Name: "c", Image: "registry.invalid/race:1"}},
		},
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// raceLoadStats counts the background load's writes.
type raceLoadStats struct {
	began                time.Time
	ended                atomic.Int64 // unix nanos, once stopped
	writes, pods, errors atomic.Int64
}

func (s *raceLoadStats) elapsed() time.Duration {
	if e := s.ended.Load(); e != 0 {
		return time.Unix(0, e).Sub(s.began)
	}
	return time.Since(s.began)
}

// startRaceLoad writes about qps times a second until ctx ends: pods created in
// raceLoadNS, bound to one of 4 untainted kwok nodes (the harness admits them and
// kwok runs them, as kubelets would) and deleted, so that kube-controller-manager's
// pod and node informers are as busy as in a scale-up.
func startRaceLoad(t *testing.T, ctx context.Context, done *sync.WaitGroup, client kubernetes.Interface, qps int) *raceLoadStats {
	t.Helper()
	const loadNodes, loadWorkers = 4, 32
	var nodes []string
	for i := range loadNodes {
		name := fmt.Sprintf("race-load-%d", i)
		if _, err := client.CoreV1().Nodes().Create(ctx, cluster.NewNode(cluster.NodeSpec{Name: name}), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, name)
	}
	limiter := flowcontrol.NewTokenBucketRateLimiter(float32(qps), max(1, qps/20))
	stats := &raceLoadStats{began: time.Now()}
	var seq atomic.Int64
	write := func(f func() error) bool {
		if limiter.Wait(ctx) != nil {
			return false
		}
		err := f()
		if ctx.Err() != nil {
			return false
		}
		stats.writes.Add(1)
		if err != nil && !apierrors.IsNotFound(err) {
			stats.errors.Add(1)
		}
		return true
	}
	pods := client.CoreV1().Pods(raceLoadNS)
	for range loadWorkers {
		done.Go(func() {
			for ctx.Err() == nil {
				i := seq.Add(1)
				name := fmt.Sprintf("load-%d", i)
				ok := write(func() error {
					_, err := pods.Create(ctx, racePod(name, raceLoadNS), metav1.CreateOptions{})
					return err
				}) &&
					write(func() error {
						return pods.Bind(ctx, &corev1.Binding{
							ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: raceLoadNS},
							Target:     corev1.ObjectReference{Kind: "Node", Name: nodes[int(i)%len(nodes)]},
						}, metav1.CreateOptions{})
					}) &&
					write(func() error {
						return pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
					})
				if ok {
					stats.pods.Add(1)
				}
			}
		})
	}
	done.Go(func() {
		<-ctx.Done()
		stats.ended.Store(time.Now().UnixNano())
	})
	return stats
}

// taintManagerSeen is what kube-controller-manager's taint-eviction controller
// logged of one node: when it first knew the node tainted with raceTaintKey, and
// when it next knew it without.
type taintManagerSeen struct {
	tainted, untainted time.Time
}

// taintsLine matches the controller's V(4) line for every node update it handles.
var taintsLine = regexp.MustCompile(`^I(\d{4} \d{2}:\d{2}:\d{2}\.\d{6})\s+\d+ \S+\] "Updating known taints on node".* node="([^"]+)" taints=(.*)$`)

// readTaintManagerLog reads the taint-eviction controller's view of every node from
// kube-controller-manager's log (klog's header times are local, to the microsecond).
func readTaintManagerLog(t *testing.T, c *cluster.Cluster) map[string]*taintManagerSeen {
	t.Helper()
	var path string
	for _, p := range c.Processes() {
		if p.Name == "kube-controller-manager" {
			path = p.LogPath
		}
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("kube-controller-manager's log: %v", err)
	}
	defer f.Close()
	year := time.Now().Year()
	seen := map[string]*taintManagerSeen{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		m := taintsLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		at, err := time.ParseInLocation("2006 0102 15:04:05.000000", strconv.Itoa(year)+" "+m[1], time.Local)
		if err != nil {
			continue
		}
		e := seen[m[2]]
		if e == nil {
			e = &taintManagerSeen{}
			seen[m[2]] = e
		}
		switch tainted := strings.Contains(m[3], raceTaintKey); {
		case tainted && e.tainted.IsZero():
			e.tainted = at
		case !tainted && !e.tainted.IsZero() && e.untainted.IsZero():
			e.untainted = at
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	if len(seen) == 0 {
		t.Errorf("no \"Updating known taints on node\" line in %s: is kube-controller-manager at -v=4?", path)
	}
	return seen
}

// lagFigures renders p50 / p99 / max of ds, with their count.
func lagFigures(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	return fmt.Sprintf("%s / %s / %s (%d)", pctl(ds, 50), pctl(ds, 99), pctl(ds, 100), len(ds))
}

// pctl is the p-th percentile of ds (nearest rank), rounded to 0.1 ms.
func pctl(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := max(0, (len(s)*p+99)/100-1)
	return s[i].Round(100 * time.Microsecond)
}

// clopperPearsonUpper is the exact (Clopper-Pearson) one-sided upper confidence
// bound, at level 1-alpha, of a rate seen k times in n trials.
func clopperPearsonUpper(k, n int, alpha float64) float64 {
	if n == 0 || k >= n {
		return 1
	}
	// P(X <= k | n, p) falls as p rises: find p where it is alpha.
	lo, hi := float64(k)/float64(n), 1.0
	for range 60 {
		mid := (lo + hi) / 2
		if binomCDF(k, n, mid) > alpha {
			lo = mid
		} else {
			hi = mid
		}
	}
	return hi
}

func binomCDF(k, n int, p float64) float64 {
	var sum float64
	for i := 0; i <= k; i++ {
		lg, _ := math.Lgamma(float64(n + 1))
		li, _ := math.Lgamma(float64(i + 1))
		lni, _ := math.Lgamma(float64(n - i + 1))
		sum += math.Exp(lg - li - lni + float64(i)*math.Log(p) + float64(n-i)*math.Log1p(-p))
	}
	return sum
}

func raceEnvInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: want a whole number", name, v)
	}
	return n
}

func TestClopperPearsonUpper(t *testing.T) {
	for _, tc := range []struct {
		k, n int
		want float64
	}{
		{0, 200, 1 - math.Pow(0.05, 1.0/200)}, // no event in 200: about 3/200
		{0, 20, 1 - math.Pow(0.05, 1.0/20)},
		{20, 20, 1},
		{1, 1000, 0.004735}, // the exact bound for 1 in 1000 (one-sided, 95%)
	} {
		if got := clopperPearsonUpper(tc.k, tc.n, 0.05); math.Abs(got-tc.want) > 1e-5 {
			t.Errorf("clopperPearsonUpper(%d, %d) = %.6f, want %.6f", tc.k, tc.n, got, tc.want)
		}
	}
}
