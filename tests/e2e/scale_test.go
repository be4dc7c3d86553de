package e2e

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/app"
	"github.com/gpufrac/gpufrac/tests/builders"
	"github.com/gpufrac/gpufrac/tests/cluster"
	"github.com/gpufrac/gpufrac/tests/invariants"
)

// The scale benchmark (issue 13): thousands of kwok GPU nodes without node
// agents (capacity and GPU inventory set directly), tens of thousands of
// pods of a mixed workload - fractions, whole GPUs, gangs of 8 to 256, four
// leaf queues under two parents - scheduled by gpufrac-coordinator and by
// kube-scheduler on the same API client budget, one after the other, each on
// a fresh control plane. It reports per run: the pods bound per second, the
// coordinator's scheduling-cycle durations (from its log, every cycle), the
// API requests each scheduler made per bound pod (counted by a proxy
// between it and the API server, countingProxy; the API server's audit log
// of its user is read for comparison) and each scheduler's memory (/proc).
//
// It is a benchmark, not a test of a target: it asserts only what makes the
// figures trustworthy (every pod bound, gpufrac's invariants hold after the
// coordinator's runs, the figures were read). At its default size it is a
// smoke test that runs in make test (50 nodes, 500 pods, one run each);
// GPUFRAC_SCALE=1 runs the size, alone on the machine:
//
//	GPUFRAC_SCALE=1 nice -n 5 go test ./tests/e2e -run '^TestScale$' -v -count=1 -timeout 120m
//
// GPUFRAC_SCALE=<nodes>x<pods> picks another size; GPUFRAC_SCALE_RUNS the
// runs per scheduler (default 2 at full size: coordinator, kube-scheduler,
// coordinator, kube-scheduler); GPUFRAC_SCALE_QPS the client budget of both
// (default 200 QPS, burst twice that: the coordinator's default);
// GPUFRAC_SCALE_SPREAD=1 gives every tenth pod that is not a gang member an
// app label and a hard zone spread constraint over it (100 apps, nodes in
// 5 zones), which kube-scheduler's checks (coordinator/kubecheck) and
// kube-scheduler itself then enforce; GPUFRAC_SCALE_SCHEDULERS a
// comma-separated subset of
// coordinator,kube-scheduler; GPUFRAC_SCALE_PPROF a directory for the
// coordinator's CPU profile (its first GPUFRAC_SCALE_PPROF_SECONDS, default
// 60, after the pods start to arrive), heap profile (once all are bound) and
// the coordinator's cycle log lines (<run>-cycles.log).
//
// How a run goes:
//
//  1. A fresh test bed without admission policies (as BindThroughput: the
//     benchmark plays gpufrac-node for reservations as admin, and
//     kube-scheduler gets the same pods, fractions and queue labels included,
//     which the policies keep for the coordinator). kwok renews node leases
//     every 150 s instead of 10 s and kube-controller-manager waits 20 min
//     for a heartbeat before it calls a node lost: 5,000 nodes' kubelet
//     heartbeats would otherwise be the largest load on the two cores. The
//     API server writes an audit log of the two schedulers' users only; each
//     scheduler talks to it through a proxy of the benchmark that counts its
//     requests.
//  2. The nodes: 8 H100s each (nvidia.com/gpu 8, gpufrac.io/gpu-fraction
//     800, the inventory of 8 GPUs in fraction mode), in pools of up to
//     1,000 nodes (karpenter.sh/nodepool; a gang stays in one pool). All
//     Ready and untainted before anything else.
//  3. The scheduler starts and, for the coordinator, reports ready (its
//     informers synced): informers are warm before the first pod.
//  4. The pods are created as fast as the API server takes them (32
//     creators). The clock of a pod runs from just before its Create to the
//     first watch event with spec.nodeName.
//  5. A run ends when every pod is bound. For the coordinator, gpufrac's
//     invariants are checked on the result (tests/invariants).
//
// Fractions use reservation pods, as the coordinator runs by default. With
// no gpufrac-node on the nodes, the benchmark writes each reservation's GPU
// (gpufrac.io/reserved-gpu) as soon as the reservation pod exists: the
// kubelet's admission and the node agent's write-back (about a second on a
// real node) cost nothing here.

const (
	// scaleQueueParents and scaleQueues are the two queue levels: each parent
	// has two leaves, and workloads go to the leaves in turn.
	scaleCreators = 32
	// scaleGPUsPerNode is each node's GPU count.
	scaleGPUsPerNode = 8
	// scalePoolNodes is the most nodes per node pool.
	scalePoolNodes = 1000
	// scaleKubeScheduler is the benchmark kube-scheduler's schedulerName,
	// ServiceAccount (namespace benchNamespace) and log name.
	scaleKubeScheduler = "bench-kube-scheduler"
	// Scheduler names in figures.
	schedCoordinator   = "coordinator"
	schedKubeScheduler = "kube-scheduler"
)

// scaleQueues are the leaf queues, each a child of the parent in scaleQueueParent.
var (
	scaleQueues      = []string{"scale-a1", "scale-a2", "scale-b1", "scale-b2"}
	scaleQueueParent = map[string]string{"scale-a1": "scale-a", "scale-a2": "scale-a", "scale-b1": "scale-b", "scale-b2": "scale-b"}
	// scaleGangSizes are the gang sizes, in turn.
	scaleGangSizes = []int{8, 16, 32, 64, 128, 256}
	// scaleWholeSizes are the GPU counts of whole-GPU pods, in turn.
	scaleWholeSizes = []int{1, 1, 1, 1, 2}
	// scaleFractions are the fraction pods' percentages, in turn.
	scaleFractions = []int{10, 20, 30, 40, 50}
)

// scaleConfig is one invocation's size and budget.
type scaleConfig struct {
	nodes, pods  int
	runs         int      // runs per scheduler
	qps, burst   int      // both schedulers' client budget
	schedulers   []string // in the order of each round
	pprofDir     string   // "" for no profiles
	pprofSeconds int
	full         bool // sized by GPUFRAC_SCALE: run alone, not in parallel
}

func scaleConfigFromEnv(t *testing.T) scaleConfig {
	t.Helper()
	cfg := scaleConfig{nodes: 50, pods: 500, runs: 1, qps: 200, schedulers: []string{schedCoordinator, schedKubeScheduler}, pprofSeconds: 60}
	atoi := func(name, v string) int {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("%s=%q: want a positive number", name, v)
		}
		return n
	}
	switch v := os.Getenv("GPUFRAC_SCALE"); {
	case v == "":
	case v == "1":
		cfg.nodes, cfg.pods, cfg.runs, cfg.full = 5000, 50000, 2, true
	default:
		n, p, ok := strings.Cut(v, "x")
		if !ok {
			t.Fatalf("GPUFRAC_SCALE=%q: want 1 or <nodes>x<pods>", v)
		}
		cfg.nodes, cfg.pods, cfg.runs, cfg.full = atoi("GPUFRAC_SCALE", n), atoi("GPUFRAC_SCALE", p), 2, true
	}
	if v := os.Getenv("GPUFRAC_SCALE_RUNS"); v != "" {
		cfg.runs = atoi("GPUFRAC_SCALE_RUNS", v)
	}
	if v := os.Getenv("GPUFRAC_SCALE_QPS"); v != "" {
		cfg.qps = atoi("GPUFRAC_SCALE_QPS", v)
	}
	cfg.burst = 2 * cfg.qps
	if v := os.Getenv("GPUFRAC_SCALE_SCHEDULERS"); v != "" {
		cfg.schedulers = strings.Split(v, ",")
		for _, s := range cfg.schedulers {
			if s != schedCoordinator && s != schedKubeScheduler {
				t.Fatalf("GPUFRAC_SCALE_SCHEDULERS=%q: %q is neither %s nor %s", v, s, schedCoordinator, schedKubeScheduler)
			}
		}
	}
	cfg.pprofDir = os.Getenv("GPUFRAC_SCALE_PPROF")
	if v := os.Getenv("GPUFRAC_SCALE_PPROF_SECONDS"); v != "" {
		cfg.pprofSeconds = atoi("GPUFRAC_SCALE_PPROF_SECONDS", v)
	}
	return cfg
}

// TestScale runs the scale benchmark; see the comment above.
func TestScale(t *testing.T) {
	cfg := scaleConfigFromEnv(t)
	if testing.Short() {
		t.Skip("end-to-end benchmark: needs the local cluster (make tools)")
	}
	if !cfg.full {
		t.Parallel() // the smoke test shares the machine like the other cluster tests
	}
	buildBinary(t, "gpufrac-coordinator")
	wl := newScaleWorkload(cfg.nodes, cfg.pods)
	if os.Getenv("GPUFRAC_SCALE_SPREAD") != "" {
		spreadEveryTenth(wl)
		t.Logf("%d pods with a hard zone spread constraint over %d apps (GPUFRAC_SCALE_SPREAD)", wl.spread, scaleSpreadApps)
	}
	t.Logf("scale: %d nodes x %d GPUs in %d pools, %d pods: %d fractions, %d whole-GPU pods, %d gangs (%d members); %.0f of %d GPUs asked for; client budget %d QPS, burst %d",
		cfg.nodes, scaleGPUsPerNode, wl.pools, len(wl.pods), wl.fractions, wl.whole, wl.gangs, wl.members, wl.gpus, cfg.nodes*scaleGPUsPerNode, cfg.qps, cfg.burst)

	var results []scaleResult
	for round := 1; round <= cfg.runs; round++ {
		for _, sched := range cfg.schedulers {
			name := fmt.Sprintf("%s-%d", sched, round)
			t.Run(name, func(t *testing.T) {
				results = append(results, runScale(t, cfg, wl, sched, name))
			})
			if t.Failed() {
				return
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nSCALE FIGURES: %d nodes, %d pods, %d QPS / burst %d\n", cfg.nodes, len(wl.pods), cfg.qps, cfg.burst)
	fmt.Fprintf(&b, "| run | pods/s | last bind after first create | create | p50 / p99 bind latency | busy cycles | cycle p50 / p99 / max | idle cycle p50 | API requests / bound pod | peak RSS | RSS at end | uptime before -> after |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		b.WriteString(r.row())
	}
	for _, r := range results {
		fmt.Fprintf(&b, "%s requests: %s\n", r.name, r.requests)
	}
	t.Log(b.String())
}

// scalePod is one pod of the workload, without its scheduler name.
type scalePod struct {
	name  string
	queue string
	// gpus whole GPUs, or percent of one GPU; gang and min-member for gang members.
	gpus, percent int
	gang          string
	minMember     int
	// app, when set, is the pod's app label, and the pod carries a hard
	// zone spread constraint over it (GPUFRAC_SCALE_SPREAD).
	app string
}

// scaleZones is the number of zones the nodes are labelled with, in turn.
const scaleZones = 5

// scaleSpreadApps is the number of apps the spread pods belong to.
const scaleSpreadApps = 100

// spreadEveryTenth gives every tenth whole-GPU and fraction pod an app and
// its zone spread constraint (issue 28: "a tenth of them with PVCs or
// spread"): those pods go through kube-scheduler's checks.
func spreadEveryTenth(w *scaleWorkload) {
	k := 0
	for i := range w.pods {
		if w.pods[i].gang != "" {
			continue
		}
		if k%10 == 0 {
			w.pods[i].app = fmt.Sprintf("spread-%02d", (k/10)%scaleSpreadApps)
			w.spread++
		}
		k++
	}
}

// scaleWorkload is the pods of a run, in creation order, and what they ask for.
type scaleWorkload struct {
	spread                           int // pods with a zone spread constraint
	pods                             []scalePod
	pools                            int
	fractions, whole, gangs, members int
	gpus                             float64
	gangSizes                        []int
	nodes                            int
}

// newScaleWorkload makes the pod mix for n nodes: half fractions (10..50 %),
// a quarter whole-GPU pods (1 or 2 GPUs), a quarter gang members (one GPU
// each; gangs of 8..256, none larger than a quarter of a pool's GPUs), the
// three kinds interleaved and the workloads spread over the leaf queues in
// turn. About 87 % of the GPUs are asked for.
func newScaleWorkload(nodes, pods int) *scaleWorkload {
	w := &scaleWorkload{nodes: nodes, pools: (nodes + scalePoolNodes - 1) / scalePoolNodes}
	poolGPUs := nodes / w.pools * scaleGPUsPerNode
	for _, s := range scaleGangSizes {
		if s <= poolGPUs/4 {
			w.gangSizes = append(w.gangSizes, s)
		}
	}
	var fracs, whole, gangs []scalePod
	queue := 0
	nextQueue := func() string {
		q := scaleQueues[queue%len(scaleQueues)]
		queue++
		return q
	}
	members := pods / 4
	for g := 0; len(w.gangSizes) > 0 && members > 0; g++ {
		size := w.gangSizes[g%len(w.gangSizes)]
		if size > members {
			break
		}
		q, name := nextQueue(), fmt.Sprintf("gang-%03d", g)
		for m := range size {
			gangs = append(gangs, scalePod{name: fmt.Sprintf("%s-%03d", name, m), queue: q, gpus: 1, gang: name, minMember: size})
		}
		members -= size
		w.gangs++
	}
	for i := range pods/4 + members {
		whole = append(whole, scalePod{name: fmt.Sprintf("whole-%05d", i), queue: nextQueue(), gpus: scaleWholeSizes[i%len(scaleWholeSizes)]})
	}
	for i := range pods - len(gangs) - len(whole) {
		fracs = append(fracs, scalePod{name: fmt.Sprintf("frac-%05d", i), queue: nextQueue(), percent: scaleFractions[i%len(scaleFractions)]})
	}
	// Interleave: fractions, whole pods and gangs (members together) in
	// proportion, so every part of the run sees every kind.
	for len(fracs)+len(whole)+len(gangs) > 0 {
		take := func(from *[]scalePod, n int) {
			n = min(n, len(*from))
			w.pods = append(w.pods, (*from)[:n]...)
			*from = (*from)[n:]
		}
		take(&fracs, 2)
		take(&whole, 1)
		if len(gangs) > 0 && (len(fracs)+len(whole) == 0 || len(gangs)*3 > len(fracs)+len(whole)) {
			take(&gangs, gangs[0].minMember)
		}
	}
	for _, p := range w.pods {
		switch {
		case p.gang != "":
			w.members++
			w.gpus++
		case p.percent > 0:
			w.fractions++
			w.gpus += float64(p.percent) / 100
		default:
			w.whole++
			w.gpus += float64(p.gpus)
		}
	}
	return w
}

// obj builds the pod for a scheduler.
func (p scalePod) obj(schedulerName string) *corev1.Pod {
	b := builders.MakePod(p.name, benchNamespace).Queue(p.queue).CPU("100m").Memory("128Mi").SchedulerName(schedulerName).Label(benchLabel, "scale")
	if p.percent > 0 {
		b = b.Fraction(p.percent)
	} else {
		b = b.GPUs(p.gpus)
	}
	if p.gang != "" {
		b = b.PodGroup(p.gang).MinMember(p.minMember)
	}
	pod := b.Obj()
	if p.app != "" {
		pod.Labels["app"] = p.app
		pod.Spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: corev1.LabelTopologyZone,
			WhenUnsatisfiable: corev1.DoNotSchedule, LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": p.app}}}}
	}
	return pod
}

// scaleResult is one run's figures.
type scaleResult struct {
	name      string
	scheduler string
	pods      int
	// first create -> last bound, first create -> last create
	makespan, creation time.Duration
	p50, p99           time.Duration // per pod, create -> bound
	cycles             cycleFigures
	requests           requestCounts
	peakRSS, endRSS    int64
	loadBefore         string
	loadAfter          string
}

func (r scaleResult) row() string {
	ms := func(d time.Duration) string {
		return strconv.FormatFloat(float64(d.Microseconds())/1000, 'f', 0, 64) + " ms"
	}
	cyc, idle := "-", "-"
	if r.cycles.busy > 0 {
		cyc = fmt.Sprintf("%s / %s / %s", ms(r.cycles.p50), ms(r.cycles.p99), ms(r.cycles.max))
	}
	if r.cycles.idle > 0 {
		idle = ms(r.cycles.idleP50)
	}
	busy := "-"
	if r.scheduler == schedCoordinator {
		busy = strconv.Itoa(r.cycles.busy)
	}
	return fmt.Sprintf("| %s | %.0f | %.1f s | %.1f s | %.1f / %.1f s | %s | %s | %s | %.2f | %d MiB | %d MiB | %s -> %s |\n",
		r.name, float64(r.pods)/r.makespan.Seconds(), r.makespan.Seconds(), r.creation.Seconds(), r.p50.Seconds(), r.p99.Seconds(),
		busy, cyc, idle, float64(r.requests.total)/float64(r.pods), r.peakRSS>>20, r.endRSS>>20, r.loadBefore, r.loadAfter)
}

// runScale runs one scheduler on a fresh cluster and returns its figures.
func runScale(t *testing.T, cfg scaleConfig, wl *scaleWorkload, sched, name string) scaleResult {
	res := scaleResult{name: name, scheduler: sched, pods: len(wl.pods), loadBefore: loadAverage(t)}
	auditDir := t.TempDir()
	policy := filepath.Join(auditDir, "policy.yaml")
	auditLog := filepath.Join(auditDir, "audit.log")
	coordinatorUser := "system:serviceaccount:" + api.ComponentNamespace + ":gpufrac-coordinator"
	kubeSchedulerUser := "system:serviceaccount:" + benchNamespace + ":" + scaleKubeScheduler
	if err := os.WriteFile(policy, []byte(auditPolicy(coordinatorUser, kubeSchedulerUser)), 0o644); err != nil {
		t.Fatal(err)
	}
	c := cluster.StartForTest(t, cluster.Options{
		NoAdmissionPolicies: true,
		StartTimeout:        3 * time.Minute,
		ExtraArgs: map[string][]string{
			// -v=1 logs each watcher the watch cache closes for not keeping
			// up (counted by unresponsiveWatchers).
			"kube-apiserver": {"--audit-policy-file=" + policy, "--audit-log-path=" + auditLog, "--audit-log-format=json", "--audit-log-maxsize=0", "-v=1"},
			// A lease renewed every 150 s; the node lifecycle controller
			// waits 20 min for one. Its client gets more than the default
			// 20 QPS: it removes the not-ready taint of every new node, a
			// request or two each, and at 5,000 nodes that took longer
			// than the 10 min addScaleNodes waits (docs/benchmarks-history.md).
			"kwok":                    {"--node-lease-duration-seconds=600"},
			"kube-controller-manager": {"--node-monitor-grace-period=20m", "--kube-api-qps=500", "--kube-api-burst=1000"},
		},
	})
	fast := fastClient(t, c)
	ctx := t.Context()
	if _, err := fast.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: benchNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	applyYAML(t, c, scaleQueuesYAML(cfg.nodes*scaleGPUsPerNode))
	addScaleNodes(t, c, fast, wl)

	// The scheduler, warm before the first pod.
	var proc *coordinator
	var co *benchCoordinator
	var profile *scaleProfile
	var agent *resAgent
	var proxy *countingProxy
	switch sched {
	case schedCoordinator:
		// Reservations are made ready as soon as they exist: the harness
		// admits tens of thousands of pods one at a time, and a
		// reservation would wait its turn behind them, which no kubelet does.
		agent = newResAgent(t, fast, false)
		defer agent.stop()
		co, profile, proxy = startScaleCoordinator(t, c, cfg, name)
		proc = co.coordinator
	case schedKubeScheduler:
		proc, proxy = startScaleKubeScheduler(t, c, cfg)
	}
	pid := proc.cmd.Process.Pid

	w := newScaleWatch(t, c)
	schedulerName := api.SchedulerName
	if sched == schedKubeScheduler {
		schedulerName = scaleKubeScheduler
	}
	if profile != nil {
		profile.startCPU(t)
	}
	first, lastCreated := w.create(t, fast, wl, schedulerName)
	res.creation = lastCreated.Sub(first)
	limit := max(5*time.Minute, time.Duration(len(wl.pods))*time.Second/20)
	lastBound := w.waitBound(t, len(wl.pods), limit, pid)
	res.requests = proxy.take() // the scheduler's requests until every pod was bound
	res.makespan = lastBound.Sub(first)
	res.p50, res.p99 = w.latencies(t)
	res.endRSS, res.peakRSS = procRSS(t, pid)
	t.Logf("%s: %d pods bound in %s (created in %s), latency p50 %s p99 %s; scheduler RSS %d MiB, peak %d MiB",
		name, len(wl.pods), res.makespan.Round(time.Millisecond), res.creation.Round(time.Millisecond),
		res.p50.Round(time.Millisecond), res.p99.Round(time.Millisecond), res.endRSS>>20, res.peakRSS>>20)

	// Requests first: they are read even when a check below fails.
	user := coordinatorUser
	if sched == schedKubeScheduler {
		user = kubeSchedulerUser
	}
	if res.requests.bindings < len(wl.pods) {
		t.Errorf("%s: %s made %d bindings for %d bound pods (counted on the wire)", name, sched, res.requests.bindings, len(wl.pods))
	}
	// The audit log, for comparison: at full size it lost events
	// (docs/benchmarks-history.md, "Scale").
	audited := countRequests(t, auditLog, user, lastBound)
	t.Logf("%s: the audit log holds %d requests (%d bindings) by %s, the proxy counted %d (%d bindings): %s",
		name, audited.total, audited.bindings, user, res.requests.total, res.requests.bindings, res.requests)
	t.Logf("%s: the API server's watch cache closed %s for not keeping up (every client's)",
		name, unresponsiveWatchers(t, filepath.Join(c.LogDir(), "kube-apiserver.log")))
	if sched == schedCoordinator {
		if profile != nil {
			profile.heap(t)
			profile.wait(t)
		}
		// A few idle cycles (nothing pending: the steady state with every
		// pod bound), then the cycle log.
		time.Sleep(5 * time.Second)
		res.cycles = readCycles(t, co.log)
		if cfg.pprofDir != "" {
			// Every cycle's line, with its stages, beside the profiles.
			saveCycleLines(t, co.log, filepath.Join(cfg.pprofDir, name+"-cycles.log"))
		}
		st := co.scrape(t)
		if st.bindErrors > 0 {
			t.Logf("%s: %.0f bindings failed (and were retried)", name, st.bindErrors)
		}
		if res.cycles.busy == 0 {
			t.Errorf("%s: no scheduling cycle with pending pods in the coordinator's log %s", name, co.log)
		}
		n, p50, longest := agent.take()
		t.Logf("%s: %d reservations made ready, %s p50 / %s longest from creation to reserved-gpu; cycles: %d busy (p50 %s, p99 %s, max %s), %d idle (p50 %s)",
			name, n, p50.Round(time.Millisecond), longest.Round(time.Millisecond), res.cycles.busy, res.cycles.p50, res.cycles.p99, res.cycles.max, res.cycles.idle, res.cycles.idleP50)
		invariants.Eventually(t, c.Client, c.Dynamic, invariants.Options{AllowIdleReservations: true, NoWriteBack: true}, max(2*time.Minute, limit/4))
	}
	if wl.spread > 0 {
		checkZoneSpread(t, c, name)
	}
	proc.stop(syscall.SIGTERM)
	res.loadAfter = loadAverage(t)
	return res
}

// checkZoneSpread fails when an app's pods (GPUFRAC_SCALE_SPREAD) are
// spread over the zones with a skew above 1, which their hard spread
// constraint forbids at every placement.
func checkZoneSpread(t *testing.T, c *cluster.Cluster, name string) {
	t.Helper()
	pods, err := c.Client.CoreV1().Pods(benchNamespace).List(t.Context(), metav1.ListOptions{LabelSelector: "app"})
	if err != nil {
		t.Errorf("%s: listing the spread pods: %v", name, err)
		return
	}
	nodes, err := c.Client.CoreV1().Nodes().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Errorf("%s: listing nodes: %v", name, err)
		return
	}
	zoneOf := map[string]string{}
	for _, n := range nodes.Items {
		zoneOf[n.Name] = n.Labels[corev1.LabelTopologyZone]
	}
	counts := map[string]map[string]int{} // app -> zone -> pods
	for _, p := range pods.Items {
		app := p.Labels["app"]
		if counts[app] == nil {
			counts[app] = map[string]int{}
			for z := range scaleZones {
				counts[app][fmt.Sprintf("zone-%d", z)] = 0
			}
		}
		if p.Spec.NodeName != "" {
			counts[app][zoneOf[p.Spec.NodeName]]++
		}
	}
	worst := 0
	for app, zones := range counts {
		lo, hi := -1, 0
		for _, n := range zones {
			if lo < 0 || n < lo {
				lo = n
			}
			hi = max(hi, n)
		}
		worst = max(worst, hi-lo)
		if hi-lo > 1 {
			t.Errorf("%s: app %s is spread %v over the zones: skew %d, its constraint allows 1", name, app, zones, hi-lo)
		}
	}
	t.Logf("%s: %d spread pods of %d apps, largest zone skew %d", name, len(pods.Items), len(counts), worst)
}

// auditPolicy logs the metadata of the two schedulers' requests, once per
// request (at ResponseComplete; a watch at ResponseStarted), and nothing else.
func auditPolicy(users ...string) string {
	q := make([]string, len(users))
	for i, u := range users {
		q[i] = strconv.Quote(u)
	}
	return fmt.Sprintf(`apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  users: [%s]
- level: None
`, strings.Join(q, ", "))
}

// scaleQueuesYAML is two parent queues with two leaves each; every leaf's
// quota is a quarter of the cluster's GPUs, each parent's half.
func scaleQueuesYAML(gpus int) []byte {
	var b strings.Builder
	for _, parent := range []string{"scale-a", "scale-b"} {
		fmt.Fprintf(&b, "---\napiVersion: gpufrac.io/v1alpha1\nkind: Queue\nmetadata: {name: %s}\nspec:\n  resources:\n    gpu: {quota: %q}\n", parent, strconv.Itoa(gpus/2))
	}
	for _, q := range scaleQueues {
		fmt.Fprintf(&b, "---\napiVersion: gpufrac.io/v1alpha1\nkind: Queue\nmetadata: {name: %s}\nspec:\n  parent: %s\n  namespaces: [\"*\"]\n  resources:\n    gpu: {quota: %q}\n",
			q, scaleQueueParent[q], strconv.Itoa(gpus/4))
	}
	return []byte(b.String())
}

// fastClient is an admin client whose rate limit never paces the
// benchmark itself (the harness's client allows 200 QPS).
func fastClient(t *testing.T, c *cluster.Cluster) kubernetes.Interface {
	t.Helper()
	rc := rest.CopyConfig(c.RESTConfig)
	rc.QPS, rc.Burst = 5000, 5000
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return client
}

// addScaleNodes creates the workload's nodes and waits until every one is
// Ready and untainted.
func addScaleNodes(t *testing.T, c *cluster.Cluster, client kubernetes.Interface, wl *scaleWorkload) {
	t.Helper()
	ctx := t.Context()
	capacity := cluster.ResourceList(map[corev1.ResourceName]string{
		corev1.ResourceCPU: "192", corev1.ResourceMemory: "2Ti", corev1.ResourcePods: "250",
		api.ResourceGPU: strconv.Itoa(scaleGPUsPerNode), api.ResourceFraction: strconv.Itoa(scaleGPUsPerNode * api.UnitsPerGPU),
	})
	perPool := (wl.nodes + wl.pools - 1) / wl.pools
	began := time.Now()
	err := parallel(ctx, wl.nodes, scaleCreators, func(ctx context.Context, i int) error {
		name := fmt.Sprintf("node-%05d", i)
		gpus := make([]api.GPUInfo, scaleGPUsPerNode)
		for g := range gpus {
			gpus[g] = api.GPUInfo{UUID: fmt.Sprintf("GPU-%s-%d", name, g), Index: g, Model: cluster.H100Product, MemoryMiB: 81559, Mode: "fraction", Healthy: true}
		}
		inv, err := api.EncodeInventory(gpus)
		if err != nil {
			return err
		}
		node := cluster.NewNode(cluster.NodeSpec{Name: name, Capacity: capacity,
			Labels: map[string]string{api.LabelGPUProduct: cluster.H100Product, api.LabelNodePool: fmt.Sprintf("pool-%d", i/perPool),
				corev1.LabelTopologyZone: fmt.Sprintf("zone-%d", i%scaleZones), corev1.LabelHostname: name},
			Annotations: map[string]string{api.AnnotationGPUInventory: inv}})
		if _, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating node %s: %w", name, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	created := time.Since(began)
	waitFor(t, 10*time.Minute, fmt.Sprintf("%d nodes Ready and untainted", wl.nodes), func(ctx context.Context) (bool, error) {
		l, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return false, nil
		}
		ready := 0
		for i := range l.Items {
			if cluster.IsNodeReady(&l.Items[i]) && len(l.Items[i].Spec.Taints) == 0 {
				ready++
			}
		}
		return ready == wl.nodes, nil
	})
	t.Logf("%d nodes created in %s, all Ready and untainted after %s", wl.nodes, created.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
}

// parallel runs fn(0..n-1) on workers goroutines and returns the first error.
func parallel(ctx context.Context, n, workers int, fn func(ctx context.Context, i int) error) error {
	next := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for range workers {
		wg.Go(func() {
			for i := range next {
				if err := fn(ctx, i); err != nil {
					mu.Lock()
					first = cmp.Or(first, err)
					mu.Unlock()
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return first
}

// scaleProfile fetches the coordinator's profiles (GPUFRAC_SCALE_PPROF).
type scaleProfile struct {
	dir, name, addr string
	seconds         int
	wg              sync.WaitGroup
	err             error
}

// startScaleCoordinator runs the coordinator as the chart does (arguments,
// ServiceAccount), with the benchmark's client budget and its metrics on
// loopback, and waits until it is ready: leading, informers synced.
func startScaleCoordinator(t *testing.T, c *cluster.Cluster, cfg scaleConfig, name string) (*benchCoordinator, *scaleProfile, *countingProxy) {
	t.Helper()
	metrics := freeAddr(t)
	in := c.Installed()
	kubeconfig, err := c.ServiceAccountKubeconfig(t.Context(), in.Namespace, in.Coordinator.ServiceAccount, nil)
	if err != nil {
		t.Fatal(err)
	}
	proxy := startCountingProxy(t, kubeconfig)
	// The last --kubeconfig wins: the coordinator's own, through the proxy.
	// Leader election as the chart runs it (the binary's defaults), not the
	// 3 s renew deadline the other tests use to fail over quickly: with the
	// suite's other clusters on the same 2 cores, a renewal during the
	// burst can take longer than 3 s, and a coordinator that loses its
	// lease stops scheduling (CI, 2026-11-29: TestScale timed out with
	// pods unbound).
	args := []string{"--metrics-addr=" + metrics, fmt.Sprintf("--kube-api-qps=%d", cfg.qps), fmt.Sprintf("--kube-api-burst=%d", cfg.burst), "--kubeconfig=" + proxy.kubeconfig,
		"--lease-duration=15s", "--renew-deadline=10s", "--retry-period=2s"}
	var prof *scaleProfile
	if cfg.pprofDir != "" {
		prof = &scaleProfile{dir: cfg.pprofDir, name: name, addr: freeAddr(t), seconds: cfg.pprofSeconds}
		args = append(args, "--pprof-addr="+prof.addr)
	}
	// The chart tells the coordinator its container's memory limit through
	// the downward API, in bytes (app.MemoryLimit).
	var env []string
	if in.Coordinator.MemoryLimit != "" {
		q, err := resource.ParseQuantity(in.Coordinator.MemoryLimit)
		if err != nil {
			t.Fatalf("the chart's coordinator memory limit %q: %v", in.Coordinator.MemoryLimit, err)
		}
		env = append(env, fmt.Sprintf("%s=%d", app.EnvMemoryLimit, q.Value()))
		t.Logf("coordinator memory limit %s as the chart sets it (%s)", in.Coordinator.MemoryLimit, env[0])
	}
	co := &benchCoordinator{coordinator: startCoordinatorBin(t, c, filepath.Join(repoRoot(t), "bin", "gpufrac-coordinator"), name, env, args...), metrics: metrics}
	began := time.Now()
	waitReady(t, metrics, 2*time.Minute)
	t.Logf("coordinator ready (leading, informers synced) %s after its start", time.Since(began).Round(time.Millisecond))
	return co, prof, proxy
}

// freeAddr is a free loopback address.
func freeAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	return lis.Addr().String()
}

// startCPU fetches a CPU profile of the next seconds in the background.
func (p *scaleProfile) startCPU(t *testing.T) {
	p.wg.Go(func() {
		p.err = p.fetch(fmt.Sprintf("/debug/pprof/profile?seconds=%d", p.seconds), p.name+"-cpu.pprof", time.Duration(p.seconds+60)*time.Second)
	})
}

// heap fetches a heap profile now.
func (p *scaleProfile) heap(t *testing.T) {
	t.Helper()
	if err := p.fetch("/debug/pprof/heap", p.name+"-heap.pprof", time.Minute); err != nil {
		t.Error(err)
	}
}

// wait waits for the CPU profile.
func (p *scaleProfile) wait(t *testing.T) {
	t.Helper()
	p.wg.Wait()
	if p.err != nil {
		t.Error(p.err)
	}
}

func (p *scaleProfile) fetch(path, file string, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.addr+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("fetching %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("fetching %s: %s", path, resp.Status)
	}
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(p.dir, file))
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}

// startScaleKubeScheduler runs kube-scheduler v1.34 with a profile for the
// benchmark's pods, the benchmark's client budget, and the identity a
// kube-scheduler has (the system:kube-scheduler and system:volume-scheduler
// roles) through a ServiceAccount of its own, so the audit log tells its
// requests apart from the test bed's kube-scheduler. It waits until it has
// bound a probe pod.
func startScaleKubeScheduler(t *testing.T, c *cluster.Cluster, cfg scaleConfig) (*coordinator, *countingProxy) {
	t.Helper()
	ctx := t.Context()
	if _, err := c.Client.CoreV1().ServiceAccounts(benchNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: scaleKubeScheduler}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, role := range []string{"system:kube-scheduler", "system:volume-scheduler"} {
		crb := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: scaleKubeScheduler + "-" + strings.TrimPrefix(role, "system:")},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: benchNamespace, Name: scaleKubeScheduler}},
		}
		if _, err := c.Client.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	kubeconfig, err := c.ServiceAccountKubeconfig(ctx, benchNamespace, scaleKubeScheduler, nil)
	if err != nil {
		t.Fatal(err)
	}
	proxy := startCountingProxy(t, kubeconfig)
	ks := kubeSchedulerProcess(t, c, proxy.kubeconfig, scaleKubeScheduler, cfg.qps, cfg.burst)
	began := time.Now()
	probeKubeScheduler(t, c, scaleKubeScheduler, 2*time.Minute)
	t.Logf("kube-scheduler bound its probe pod %s after its start", time.Since(began).Round(time.Millisecond))
	return ks, proxy
}

// scaleWatch records when each benchmark pod was created and bound.
type scaleWatch struct {
	mu      sync.Mutex
	created map[string]time.Time // pod -> just before its Create
	bound   map[string]time.Time // pod -> first watch event with spec.nodeName
}

// newScaleWatch watches the benchmark pods; it keeps only their names and
// nodes, not the objects.
func newScaleWatch(t *testing.T, c *cluster.Cluster) *scaleWatch {
	t.Helper()
	w := &scaleWatch{created: map[string]time.Time{}, bound: map[string]time.Time{}}
	factory := informers.NewSharedInformerFactoryWithOptions(c.Client, 0, informers.WithNamespace(benchNamespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = benchLabel }))
	inf := factory.Core().V1().Pods().Informer()
	if err := inf.SetTransform(func(obj any) (any, error) {
		if p, ok := obj.(*corev1.Pod); ok {
			return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, ResourceVersion: p.ResourceVersion}, Spec: corev1.PodSpec{NodeName: p.Spec.NodeName}}, nil
		}
		return obj, nil
	}); err != nil {
		t.Fatal(err)
	}
	seen := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok || p.Spec.NodeName == "" {
			return
		}
		now := time.Now()
		w.mu.Lock()
		if _, ok := w.bound[p.Name]; !ok {
			w.bound[p.Name] = now
		}
		w.mu.Unlock()
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: seen, UpdateFunc: func(_, obj any) { seen(obj) }}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	factory.Start(ctx.Done())
	t.Cleanup(func() {
		cancel()
		factory.Shutdown()
	})
	if !cache.WaitForCacheSync(t.Context().Done(), inf.HasSynced) {
		t.Fatal("pod informer did not sync")
	}
	return w
}

// create creates the workload's pods for schedulerName, scaleCreators at a
// time, and returns when the first Create began and the last one returned.
func (w *scaleWatch) create(t *testing.T, client kubernetes.Interface, wl *scaleWorkload, schedulerName string) (first, last time.Time) {
	t.Helper()
	var mu sync.Mutex
	first = time.Now()
	err := parallel(t.Context(), len(wl.pods), scaleCreators, func(ctx context.Context, i int) error {
		p := wl.pods[i].obj(schedulerName)
		start := time.Now()
		w.mu.Lock()
		w.created[p.Name] = start
		w.mu.Unlock()
		if _, err := client.CoreV1().Pods(benchNamespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating pod %s: %w", p.Name, err)
		}
		done := time.Now()
		mu.Lock()
		if done.After(last) {
			last = done
		}
		mu.Unlock()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return first, last
}

// waitBound waits until n pods are bound and returns when the last one was.
// The scheduler's process (pid) must live until then: one that exits (a
// coordinator that lost its lease stops) fails the wait at once, with how
// many pods it left unbound.
func (w *scaleWatch) waitBound(t *testing.T, n int, limit time.Duration, pid int) time.Time {
	t.Helper()
	began := time.Now()
	lastLog := began
	waitFor(t, limit, fmt.Sprintf("%d pods bound", n), func(context.Context) (bool, error) {
		w.mu.Lock()
		bound := len(w.bound)
		w.mu.Unlock()
		if bound < n && processGone(pid) {
			return false, fmt.Errorf("the scheduler (pid %d) exited after %s with %d of %d pods bound (its log is below)", pid, time.Since(began).Round(time.Second), bound, n)
		}
		if time.Since(lastLog) > 30*time.Second {
			lastLog = time.Now()
			t.Logf("%d of %d pods bound after %s", bound, n, time.Since(began).Round(time.Second))
		}
		return bound == n, nil
	})
	w.mu.Lock()
	defer w.mu.Unlock()
	var last time.Time
	for _, at := range w.bound {
		if at.After(last) {
			last = at
		}
	}
	return last
}

// latencies are the median and 99th percentile of creation to binding.
func (w *scaleWatch) latencies(t *testing.T) (p50, p99 time.Duration) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	lat := make([]time.Duration, 0, len(w.bound))
	for name, at := range w.bound {
		created, ok := w.created[name]
		if !ok {
			t.Fatalf("pod %s bound but never created by the benchmark", name)
		}
		lat = append(lat, at.Sub(created))
	}
	slices.Sort(lat)
	return lat[len(lat)/2], lat[len(lat)*99/100]
}

// cycleFigures are the coordinator's scheduling cycles: busy ones (some pod
// pending or bound) and idle ones.
type cycleFigures struct {
	busy, idle    int
	p50, p99, max time.Duration
	idleP50       time.Duration
	busyTotal     time.Duration
}

// cycleLine matches the coordinator's V(2) log line of one cycle.
var cycleLine = regexp.MustCompile(`"Scheduling cycle" pending=(\d+) bound=(\d+) .*duration="([^"]+)"`)

// readCycles reads every cycle from the coordinator's log.
func readCycles(t *testing.T, logPath string) cycleFigures {
	t.Helper()
	f, err := os.Open(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var busy, idle []time.Duration
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		m := cycleLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		d, err := time.ParseDuration(m[3])
		if err != nil {
			t.Fatalf("cycle duration %q in %s: %v", m[3], logPath, err)
		}
		if m[1] == "0" && m[2] == "0" {
			idle = append(idle, d)
		} else {
			busy = append(busy, d)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	var out cycleFigures
	out.busy, out.idle = len(busy), len(idle)
	if len(busy) > 0 {
		slices.Sort(busy)
		out.p50, out.p99, out.max = busy[len(busy)/2], busy[min(len(busy)-1, len(busy)*99/100)], busy[len(busy)-1]
		for _, d := range busy {
			out.busyTotal += d
		}
	}
	if len(idle) > 0 {
		slices.Sort(idle)
		out.idleP50 = idle[len(idle)/2]
	}
	return out
}

// saveCycleLines copies the cycle lines of the coordinator's log to path.
func saveCycleLines(t *testing.T, logPath, path string) {
	t.Helper()
	in, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	for line := range bytes.Lines(in) {
		if cycleLine.Match(line) {
			out.Write(line)
		}
	}
	if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
		t.Error(err)
	}
}

// requestCounts are one user's API requests up to a moment, from the audit log.
type requestCounts struct {
	total    int
	bindings int
	byKind   map[string]int // "verb resource[/subresource]" -> requests
	// failed counts the answers that were not a success, by kind and
	// status code ("create pods 409"); the proxy's count only.
	failed map[string]int
	// reasons counts the status patches by the reason they write
	// ("patch pods/status NoCapacity"); the proxy's count only.
	reasons map[string]int
}

func (r requestCounts) String() string {
	kinds := make([]string, 0, len(r.byKind))
	for k := range r.byKind {
		kinds = append(kinds, k)
	}
	slices.SortFunc(kinds, func(a, b string) int { return cmp.Or(cmp.Compare(r.byKind[b], r.byKind[a]), cmp.Compare(a, b)) })
	parts := make([]string, len(kinds))
	for i, k := range kinds {
		parts[i] = fmt.Sprintf("%s %d", k, r.byKind[k])
	}
	out := fmt.Sprintf("%d in all: %s", r.total, strings.Join(parts, ", "))
	if len(r.failed) > 0 {
		failed := slices.Sorted(maps.Keys(r.failed))
		for i, k := range failed {
			failed[i] = fmt.Sprintf("%s: %d", k, r.failed[k])
		}
		out += "; not a success: " + strings.Join(failed, ", ")
	}
	if len(r.reasons) > 0 {
		reasons := slices.Sorted(maps.Keys(r.reasons))
		for i, k := range reasons {
			reasons[i] = fmt.Sprintf("%s: %d", k, r.reasons[k])
		}
		out += "; status patches by reason: " + strings.Join(reasons, ", ")
	}
	return out
}

// auditEvent is what countRequests reads of an audit event.
type auditEvent struct {
	Stage string `json:"stage"`
	Verb  string `json:"verb"`
	User  struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
	} `json:"objectRef"`
	RequestReceived time.Time `json:"requestReceivedTimestamp"`
}

// countRequests counts user's requests received until (inclusive) from
// the audit log: one per request (a watch when it started, anything else
// when it completed).
func countRequests(t *testing.T, logPath, user string, until time.Time) requestCounts {
	t.Helper()
	f, err := os.Open(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := requestCounts{byKind: map[string]int{}}
	dec := json.NewDecoder(bufio.NewReader(f))
	for {
		var ev auditEvent
		if err := dec.Decode(&ev); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("reading the audit log %s: %v", logPath, err)
		}
		if ev.User.Username != user || ev.RequestReceived.After(until) {
			continue
		}
		if (ev.Verb == "watch") != (ev.Stage == "ResponseStarted") || (ev.Stage != "ResponseStarted" && ev.Stage != "ResponseComplete") {
			continue
		}
		kind := ev.Verb
		if ev.ObjectRef != nil {
			kind += " " + ev.ObjectRef.Resource
			if ev.ObjectRef.Subresource != "" {
				kind += "/" + ev.ObjectRef.Subresource
			}
		}
		out.byKind[kind]++
		out.total++
		if kind == "create pods/binding" {
			out.bindings++
		}
	}
	return out
}

// procRSS is a process's resident set size now and at its peak (VmRSS, VmHWM).
func procRSS(t *testing.T, pid int) (now, peak int64) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("reading memory of pid %d: %v", pid, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		for key, dst := range map[string]*int64{"VmRSS:": &now, "VmHWM:": &peak} {
			if v, ok := strings.CutPrefix(line, key); ok {
				kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				if err != nil {
					t.Fatalf("parsing %s of pid %d: %v", key, pid, err)
				}
				*dst = kb << 10
			}
		}
	}
	return now, peak
}

// processGone tells whether process pid has exited: it is gone, or a
// zombie its parent has not waited for.
func processGone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// The state follows the command name in parentheses, which may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] == 'Z'
}

// loadAverage is the machine's 1-minute load average (uptime's first figure).
func loadAverage(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(b))[0]
}

// unresponsiveWatchers counts, by resource, the watchers the API server's
// watch cache closed because their client did not take events fast enough
// (kube-apiserver -v=1: "Forcing <resource> watcher close due to
// unresponsiveness"). Such a client's informer watches again, and re-lists
// when the version it had is gone.
func unresponsiveWatchers(t *testing.T, log string) string {
	t.Helper()
	data, err := os.ReadFile(log)
	if err != nil {
		return fmt.Sprintf("? (%v)", err)
	}
	by := map[string]int{}
	for _, line := range strings.Split(string(data), "\n") {
		_, rest, ok := strings.Cut(line, "Forcing ")
		if !ok {
			continue
		}
		if res, _, ok := strings.Cut(rest, " watcher close due to unresponsiveness"); ok {
			by[res]++
		}
	}
	if len(by) == 0 {
		return "no watcher"
	}
	var parts []string
	for _, res := range slices.Sorted(maps.Keys(by)) {
		parts = append(parts, fmt.Sprintf("%s %d", res, by[res]))
	}
	return strings.Join(parts, ", ")
}
