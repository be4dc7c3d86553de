package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
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

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/tests/builders"
	"github.com/gpufrac/gpufrac/tests/cluster"
)

// The end-to-end benchmarks run on the local cluster test bed (make tools)
// and take minutes; run them one iteration at a time:
//
//	go test ./tests/e2e -run XXX -bench . -benchtime=1x -timeout 30m
//
// Nodes are plain kwok nodes without node agents: they advertise 8 whole GPUs
// and 800 fraction units and carry the gpufrac.io/gpus inventory a node agent
// would publish, so both schedulers see the same capacity and no gpufrac-node
// process competes for the two cores. The harness admits pods on such nodes
// without devices; binding latency is pod creation (just before the Create
// call) to the first watch event that shows spec.nodeName.

const (
	// benchNamespace holds the benchmark pods.
	benchNamespace = "bench"
	// benchQueue is the coordinator's queue of every benchmark pod.
	benchQueue = "bench"
	// benchLabel marks benchmark pods; its value names the run.
	benchLabel = "gpufrac.test/bench"
	// benchGPUsPerNode is each fake node's GPU count.
	benchGPUsPerNode = 8
	// benchCreators create pods in parallel, as a Job controller bursting would.
	benchCreators = 16
	// benchKubeScheduler is the schedulerName of the second kube-scheduler.
	benchKubeScheduler = "bench-kube-scheduler"
)

// BenchmarkBindThroughput binds 1,000 pods at a time on one cluster of 130
// nodes x 8 GPUs, each scenario's scheduler working alone (the test bed's
// kube-scheduler always runs; every other scheduler runs only for its own
// iterations):
//
//   - kube-scheduler as the test bed runs it (client 50 QPS, burst 100: its
//     defaults) and a second kube-scheduler whose client may do what the
//     coordinator's does (200 QPS, burst 400), 1,000 whole-GPU pods;
//   - gpufrac-coordinator, 1,000 whole-GPU pods, then 1,000 fraction pods
//     (10..60%) without reservation pods (--reservations=false) and with them
//     (the benchmark plays the node agent: see resAgent).
//
// "stream" scenarios create the pods while the scheduler runs (16 creators,
// as fast as the API server takes them): binding keeps up with creation or
// not. "backlog" scenarios create the pods first and then start the
// scheduler: the time to drain 1,000 pending pods, its start included.
func BenchmarkBindThroughput(b *testing.B) {
	const nodes, pods = 130, 1000
	c := startBenchCluster(b)
	addBenchNodes(b, c, "node", "pool-a", nodes)
	applyBenchQueue(b, c, 2*nodes*benchGPUsPerNode)
	w := newBindWatch(b, c)

	whole := func(scheduler string) func(int, string) *corev1.Pod {
		return func(_ int, name string) *corev1.Pod {
			return builders.MakePod(name, benchNamespace).Queue(benchQueue).CPU("100m").Memory("128Mi").GPUs(1).SchedulerName(scheduler).Obj()
		}
	}
	coordinator := func(args ...string) func(testing.TB) *benchScheduler {
		return func(tb testing.TB) *benchScheduler {
			co := startBenchCoordinator(tb, c, args...)
			return &benchScheduler{proc: co.coordinator, co: co}
		}
	}
	kubeScheduler200 := func(tb testing.TB) *benchScheduler { return &benchScheduler{proc: startKubeScheduler(tb, c, true)} }
	kubeScheduler200Backlog := func(tb testing.TB) *benchScheduler { return &benchScheduler{proc: startKubeScheduler(tb, c, false)} }
	scenarios := []struct {
		name string
		// scheduler starts the scheduler under test; nil is the test bed's kube-scheduler.
		scheduler func(testing.TB) *benchScheduler
		// backlog creates the pods before the scheduler starts.
		backlog bool
		// agent plays gpufrac-node for reservation pods.
		agent bool
		pod   func(i int, name string) *corev1.Pod
	}{
		{name: "stream/kube-scheduler/whole", pod: whole(corev1.DefaultSchedulerName)},
		{name: "stream/kube-scheduler-200qps/whole", scheduler: kubeScheduler200, pod: whole(benchKubeScheduler)},
		{name: "stream/coordinator/whole", scheduler: coordinator(), pod: whole(api.SchedulerName)},
		{name: "stream/coordinator/fraction-no-reservations", scheduler: coordinator("--reservations=false"), pod: fractionPod},
		{name: "stream/coordinator/fraction", scheduler: coordinator(), agent: true, pod: fractionPod},
		{name: "backlog/kube-scheduler-200qps/whole", scheduler: kubeScheduler200Backlog, backlog: true, pod: whole(benchKubeScheduler)},
		{name: "backlog/coordinator/whole", scheduler: coordinator(), backlog: true, pod: whole(api.SchedulerName)},
		{name: "backlog/coordinator/fraction-no-reservations", scheduler: coordinator("--reservations=false"), backlog: true, pod: fractionPod},
		{name: "backlog/coordinator/fraction", scheduler: coordinator(), backlog: true, agent: true, pod: fractionPod},
	}
	for _, sc := range scenarios {
		b.Run(sc.name, func(b *testing.B) {
			var agent *resAgent
			if sc.agent {
				agent = startReservationAgent(b, c)
				defer agent.stop()
			}
			var sum runFigures
			for i := 0; i < b.N; i++ {
				run := fmt.Sprintf("%s-%d", strings.NewReplacer("/", "-").Replace(sc.name), i)
				b.StopTimer()
				settle(b, c, nodes)
				b.StartTimer()
				var sched *benchScheduler
				var mark cpuMark
				var before cycleStats
				start := func() {
					// A scheduler started here is charged all its CPU, its start included.
					mark = takeCPU(b, c, 0)
					if sc.scheduler != nil {
						sched = sc.scheduler(b)
						mark.schedPID, mark.sched = sched.pid(), 0
					}
					before = sched.scrape(b)
				}
				var created func() // the backlog's scheduler starts once the pods exist
				if sc.backlog {
					created = start
				} else {
					start()
				}
				f := w.run(b, run, pods, func(j int) *corev1.Pod { return sc.pod(j, fmt.Sprintf("%s-%04d", run, j)) }, created)
				f.cpu = mark.since(b)
				f.cycles = sched.scrape(b).minus(before)
				f.reservations, f.resP50, f.resMax = agent.take()
				if f.reservations > 0 {
					b.Logf("%s: %d reservations, from creation to reserved-gpu p50 %s, longest %s", run, f.reservations,
						f.resP50.Round(time.Millisecond), f.resMax.Round(time.Millisecond))
				}
				sum.add(f)
				b.StopTimer()
				sched.stop()
				deleteBenchPods(b, c)
				deleteReservations(b, c) // none unless the coordinator made them
				b.StartTimer()
			}
			sum.report(b)
		})
	}
}

// benchScheduler is a scheduler process a benchmark started: the coordinator
// (co set) or a kube-scheduler. A nil *benchScheduler is the test bed's
// kube-scheduler.
type benchScheduler struct {
	proc *coordinator
	co   *benchCoordinator
}

// pid is the process to charge CPU time to; 0 means the test bed's kube-scheduler.
func (s *benchScheduler) pid() int {
	if s == nil {
		return 0
	}
	return s.proc.cmd.Process.Pid
}

func (s *benchScheduler) scrape(tb testing.TB) cycleStats {
	if s == nil {
		return cycleStats{}
	}
	return s.co.scrape(tb)
}

func (s *benchScheduler) stop() {
	if s != nil {
		s.proc.stop(syscall.SIGTERM)
	}
}

// fractionPod is the i-th fraction pod: 10, 20, ... 60 percent in turn.
func fractionPod(i int, name string) *corev1.Pod {
	return builders.MakePod(name, benchNamespace).Queue(benchQueue).CPU("100m").Memory("128Mi").Fraction(10 * (1 + i%6)).Obj()
}

// BenchmarkGang256 creates a gang of 256 one-GPU pods (min-member 256) on 36
// nodes x 8 GPUs of one pool and measures the time from the last member's
// creation to all 256 bound (s-after-last-create). The members come as fast
// as the API server takes them ("burst"), or one every 20 ms ("paced", about
// 5 s for the gang, as a Job controller creating them would), so the
// coordinator sees the gang incomplete for many cycles.
func BenchmarkGang256(b *testing.B) {
	const nodes, members = 36, 256
	c := startBenchCluster(b)
	addBenchNodes(b, c, "node", "pool-a", nodes)
	applyBenchQueue(b, c, nodes*benchGPUsPerNode)
	w := newBindWatch(b, c)
	for _, pace := range []struct {
		name  string
		every time.Duration
	}{{"burst", 0}, {"paced", 20 * time.Millisecond}} {
		b.Run(pace.name, func(b *testing.B) {
			co := startBenchCoordinator(b, c)
			defer co.stop()
			w.every = pace.every
			defer func() { w.every = 0 }()
			var sum runFigures
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				settle(b, c, nodes)
				b.StartTimer()
				cpu := takeCPU(b, c, co.cmd.Process.Pid)
				cycles := co.scrape(b)
				run := fmt.Sprintf("gang-%s-%d", pace.name, i)
				f := w.run(b, run, members, func(j int) *corev1.Pod {
					return builders.MakePod(fmt.Sprintf("%s-%03d", run, j), benchNamespace).Queue(benchQueue).CPU("100m").Memory("128Mi").
						GPUs(1).PodGroup(run).MinMember(members).Obj()
				}, nil)
				f.cpu = cpu.since(b)
				f.cycles = co.scrape(b).minus(cycles)
				sum.add(f)
				b.StopTimer()
				deleteBenchPods(b, c)
				b.StartTimer()
			}
			sum.report(b)
		})
	}
}

// startBenchCluster starts the test bed without node agents, with gpufrac's
// cluster objects, and builds the coordinator. Without the admission
// policies: the benchmark plays gpufrac-node itself, as admin (resAgent
// writes gpufrac.io/reserved-gpu, which the policies keep for the node
// agent), and gives kube-scheduler's pods the same queue label as the
// coordinator's so both runs create the same objects.
func startBenchCluster(tb testing.TB) *cluster.Cluster {
	tb.Helper()
	if testing.Short() {
		tb.Skip("end-to-end benchmark: needs the local cluster (make tools)")
	}
	buildBinary(tb, "gpufrac-coordinator")
	c := cluster.StartForTest(tb, cluster.Options{NoAdmissionPolicies: true})
	if _, err := c.Client.CoreV1().Namespaces().Create(tb.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: benchNamespace}}, metav1.CreateOptions{}); err != nil {
		tb.Fatal(err)
	}
	waitFor(tb, 30*time.Second, "the Queue CRD to be served", func(ctx context.Context) (bool, error) {
		_, err := c.Dynamic.Resource(queueGVR).List(ctx, metav1.ListOptions{})
		return err == nil, nil
	})
	return c
}

// applyBenchQueue creates the benchmark queue with a quota of gpus GPUs.
func applyBenchQueue(tb testing.TB, c *cluster.Cluster, gpus int) {
	tb.Helper()
	applyYAML(tb, c, queuesYAML(map[string]string{benchQueue: strconv.Itoa(gpus)}))
}

// addBenchNodes adds n kwok nodes of 8 H100s in a pool, with the fraction
// capacity and the inventory a node agent in fraction mode publishes, and
// waits until all are Ready and untainted.
func addBenchNodes(tb testing.TB, c *cluster.Cluster, prefix, pool string, n int) {
	tb.Helper()
	ctx := tb.Context()
	capacity := cluster.ResourceList(map[corev1.ResourceName]string{
		corev1.ResourceCPU: "192", corev1.ResourceMemory: "2Ti", corev1.ResourcePods: "250",
		api.ResourceGPU: strconv.Itoa(benchGPUsPerNode), api.ResourceFraction: strconv.Itoa(benchGPUsPerNode * api.UnitsPerGPU),
	})
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			name := fmt.Sprintf("%s-%03d", prefix, i)
			if _, err := c.AddNode(ctx, cluster.NodeSpec{Name: name, Capacity: capacity, Labels: map[string]string{
				api.LabelGPUProduct: cluster.H100Product, api.LabelNodePool: pool,
			}}); err != nil {
				errs[i] = err
				return
			}
			gpus := make([]api.GPUInfo, benchGPUsPerNode)
			for g := range gpus {
				gpus[g] = api.GPUInfo{UUID: fmt.Sprintf("GPU-%s-%d", name, g), Index: g, Model: cluster.H100Product, MemoryMiB: 81559, Mode: "fraction", Healthy: true}
			}
			inv, err := api.EncodeInventory(gpus)
			if err != nil {
				errs[i] = err
				return
			}
			patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{api.AnnotationGPUInventory: inv}}})
			if err != nil {
				errs[i] = err
				return
			}
			if _, err := c.Client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
				errs[i] = fmt.Errorf("publishing the inventory of %s: %w", name, err)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			tb.Fatal(err)
		}
	}
	waitFor(tb, 120*time.Second, fmt.Sprintf("%d nodes Ready", n), func(ctx context.Context) (bool, error) {
		l, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: api.LabelNodePool + "=" + pool})
		if err != nil {
			return false, nil
		}
		ready := 0
		for i := range l.Items {
			if cluster.IsNodeReady(&l.Items[i]) && len(l.Items[i].Spec.Taints) == 0 {
				ready++
			}
		}
		return ready == n, nil
	})
}

// benchCoordinator is a gpufrac-coordinator process started for a benchmark.
type benchCoordinator struct {
	*coordinator
	metrics string // host:port of /metrics and /readyz
}

// startBenchCoordinator runs the coordinator (no leader election) and waits
// for /readyz, which answers OK once its caches are synced.
func startBenchCoordinator(tb testing.TB, c *cluster.Cluster, args ...string) *benchCoordinator {
	tb.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	bin := filepath.Join(repoRoot(tb), "bin", "gpufrac-coordinator")
	logPath := filepath.Join(c.LogDir(), fmt.Sprintf("coordinator-%d.log", time.Now().UnixNano()))
	f, err := os.Create(logPath)
	if err != nil {
		tb.Fatal(err)
	}
	all := append([]string{"--kubeconfig=" + c.KubeconfigPath, "--metrics-addr=" + addr, "--leader-elect=false", "-v=2"}, args...)
	cmd := exec.Command(bin, all...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	co := &benchCoordinator{coordinator: &coordinator{cmd: cmd, log: logPath}, metrics: addr}
	tb.Cleanup(func() {
		co.stop()
		f.Close()
		if tb.Failed() {
			tb.Logf("coordinator log: %s", logPath)
		}
	})
	waitReady(tb, addr, 30*time.Second)
	return co
}

// waitReady waits up to limit until the coordinator serving metrics on addr
// says it is ready (leading, informers synced).
func waitReady(tb testing.TB, addr string, limit time.Duration) {
	tb.Helper()
	waitFor(tb, limit, "the coordinator to be ready", func(ctx context.Context) (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", nil)
		if err != nil {
			return false, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

func (co *benchCoordinator) stop() { co.coordinator.stop(syscall.SIGTERM) }

// bindWatch records when each benchmark pod was created and first seen bound.
type bindWatch struct {
	client kubernetes.Interface
	// every paces creation: one pod per interval from one creator; zero
	// creates with benchCreators in parallel, as fast as the API server goes.
	every time.Duration

	mu      sync.Mutex
	current string               // the run being measured (label benchLabel)
	created map[string]time.Time // pod name -> just before its Create call
	bound   map[string]time.Time // pod name -> first watch event with spec.nodeName
	nodes   map[string]string    // pod name -> node
	// notReady: node -> seen not Ready (or tainted by the node lifecycle
	// controller) during the run. kwok renews node heartbeats late when the
	// machine is overloaded, and then nothing can be scheduled for a while.
	notReady map[string]bool
}

// newBindWatch starts a pod informer on the benchmark namespace; it stops with tb.
func newBindWatch(tb testing.TB, c *cluster.Cluster) *bindWatch {
	tb.Helper()
	rc := rest.CopyConfig(c.RESTConfig)
	// Creation must not be paced by the client: the API server is the limit.
	rc.QPS, rc.Burst = 2000, 2000
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		tb.Fatal(err)
	}
	w := &bindWatch{client: client, created: map[string]time.Time{}, bound: map[string]time.Time{}, nodes: map[string]string{}, notReady: map[string]bool{}}
	factory := informers.NewSharedInformerFactoryWithOptions(c.Client, 0, informers.WithNamespace(benchNamespace))
	inf := factory.Core().V1().Pods().Informer()
	seen := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok || p.Spec.NodeName == "" {
			return
		}
		now := time.Now()
		w.mu.Lock()
		if _, ok := w.bound[p.Name]; !ok && p.Labels[benchLabel] == w.current && w.current != "" {
			w.bound[p.Name] = now
			w.nodes[p.Name] = p.Spec.NodeName
		}
		w.mu.Unlock()
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: seen, UpdateFunc: func(_, obj any) { seen(obj) }}); err != nil {
		tb.Fatal(err)
	}
	nodeSeen := func(obj any) {
		n, ok := obj.(*corev1.Node)
		if !ok || (cluster.IsNodeReady(n) && len(n.Spec.Taints) == 0) {
			return
		}
		w.mu.Lock()
		if w.current != "" {
			w.notReady[n.Name] = true
		}
		w.mu.Unlock()
	}
	if _, err := factory.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: nodeSeen, UpdateFunc: func(_, obj any) { nodeSeen(obj) },
	}); err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	factory.Start(ctx.Done())
	tb.Cleanup(func() {
		cancel()
		factory.Shutdown()
	})
	if !cache.WaitForCacheSync(tb.Context().Done(), inf.HasSynced, factory.Core().V1().Nodes().Informer().HasSynced) {
		tb.Fatal("pod informer did not sync")
	}
	return w
}

// runFigures are one run's measurements.
type runFigures struct {
	runs      int
	pods      int
	makespan  time.Duration // first creation -> last bound
	tail      time.Duration // last creation -> last bound
	creation  time.Duration // first creation -> last Create returned
	p50, p99  time.Duration // per-pod creation -> bound
	nodesUsed int
	notReady  int // nodes seen not Ready during the run
	// reservations made ready by the agent, and their creation-to-ready times
	reservations   int
	resP50, resMax time.Duration
	cpu            cpuFigures
	cycles         cycleStats
}

// run creates n pods named by mk (all labelled with run), calls created (when
// not nil) once they all exist, waits until all are bound and returns the
// figures. Latencies and the makespan count from each pod's creation, or
// from the call of created when there is one (a backlog handed to a
// scheduler that starts then).
func (w *bindWatch) run(tb testing.TB, run string, n int, mk func(i int) *corev1.Pod, created func()) runFigures {
	tb.Helper()
	pods := make([]*corev1.Pod, n)
	for i := range pods {
		pods[i] = mk(i)
		pods[i].Labels[benchLabel] = run
	}
	w.mu.Lock()
	w.current = run
	clear(w.created)
	clear(w.bound)
	clear(w.nodes)
	clear(w.notReady)
	w.mu.Unlock()

	next := make(chan *corev1.Pod)
	var wg sync.WaitGroup
	var lastCreated time.Time
	var errMu sync.Mutex
	var createErr error
	creators := benchCreators
	if w.every > 0 {
		creators = 1
	}
	for range creators {
		wg.Go(func() {
			for p := range next {
				start := time.Now()
				w.mu.Lock()
				w.created[p.Name] = start
				w.mu.Unlock()
				_, err := w.client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{})
				done := time.Now()
				errMu.Lock()
				if err != nil && createErr == nil {
					createErr = fmt.Errorf("creating pod %s: %w", p.Name, err)
				}
				if done.After(lastCreated) {
					lastCreated = done
				}
				errMu.Unlock()
			}
		})
	}
	first := time.Now()
	var tick <-chan time.Time
	if w.every > 0 {
		t := time.NewTicker(w.every)
		defer t.Stop()
		tick = t.C
	}
	for i, p := range pods {
		if tick != nil && i > 0 {
			<-tick
		}
		next <- p
	}
	close(next)
	wg.Wait()
	if createErr != nil {
		tb.Fatal(createErr)
	}
	f := runFigures{runs: 1, pods: n, creation: lastCreated.Sub(first)}
	if created != nil {
		// Creating ran with no scheduler: the clock starts now, for every pod.
		first = time.Now()
		lastCreated = first
		w.mu.Lock()
		for name := range w.created {
			w.created[name] = first
		}
		w.mu.Unlock()
		created()
	}
	waitFor(tb, 5*time.Minute, fmt.Sprintf("%d pods of %s bound", n, run), func(context.Context) (bool, error) {
		w.mu.Lock()
		defer w.mu.Unlock()
		return len(w.bound) == n, nil
	})

	w.mu.Lock()
	defer w.mu.Unlock()
	lat := make([]time.Duration, 0, n)
	var lastBound time.Time
	nodes := map[string]bool{}
	for name, at := range w.bound {
		if at.Before(first) {
			tb.Fatalf("%s was bound before the scheduler started", name)
		}
		lat = append(lat, at.Sub(w.created[name]))
		if at.After(lastBound) {
			lastBound = at
		}
		nodes[w.nodes[name]] = true
	}
	slices.Sort(lat)
	f.makespan = lastBound.Sub(first)
	f.tail = lastBound.Sub(lastCreated)
	f.p50 = lat[len(lat)/2]
	f.p99 = lat[len(lat)*99/100]
	f.nodesUsed = len(nodes)
	f.notReady = len(w.notReady)
	w.current = ""
	if f.notReady > 0 {
		tb.Logf("%s: %d nodes were not Ready or tainted during the run: the machine was too loaded for kwok's heartbeats", run, f.notReady)
	}
	tb.Logf("%s: %d pods bound on %d nodes in %s (created in %s; last bound %s after the last creation or the scheduler's start), latency p50 %s p99 %s",
		run, n, f.nodesUsed, f.makespan.Round(time.Millisecond), f.creation.Round(time.Millisecond), f.tail.Round(time.Millisecond),
		f.p50.Round(time.Millisecond), f.p99.Round(time.Millisecond))
	return f
}

func (f *runFigures) add(g runFigures) {
	f.runs += g.runs
	f.pods += g.pods
	f.makespan += g.makespan
	f.tail += g.tail
	f.creation += g.creation
	f.p50 += g.p50
	f.p99 += g.p99
	f.nodesUsed += g.nodesUsed
	f.notReady += g.notReady
	f.reservations += g.reservations
	f.resP50 += g.resP50
	f.resMax += g.resMax
	f.cpu.scheduler += g.cpu.scheduler
	f.cpu.apiserver += g.cpu.apiserver
	f.cpu.rssMiB = max(f.cpu.rssMiB, g.cpu.rssMiB)
	f.cycles.count += g.cycles.count
	f.cycles.seconds += g.cycles.seconds
	f.cycles.bindErrors += g.cycles.bindErrors
}

// report publishes the mean of the runs.
func (f *runFigures) report(b *testing.B) {
	if f.runs == 0 {
		return
	}
	n := float64(f.runs)
	b.ReportMetric(float64(f.pods)/f.makespan.Seconds(), "pods/s")
	b.ReportMetric(f.makespan.Seconds()/n, "s/run")
	b.ReportMetric(f.tail.Seconds()/n, "s-after-last-create")
	b.ReportMetric(f.creation.Seconds()/n, "s-creating")
	b.ReportMetric(f.p50.Seconds()/n, "s-p50")
	b.ReportMetric(f.p99.Seconds()/n, "s-p99")
	b.ReportMetric(float64(f.nodesUsed)/n, "nodes")
	b.ReportMetric(float64(f.notReady)/n, "nodes-not-ready")
	if f.reservations > 0 {
		b.ReportMetric(float64(f.reservations)/n, "reservations")
		b.ReportMetric(f.resP50.Seconds()/n, "s-reservation-ready-p50")
		b.ReportMetric(f.resMax.Seconds()/n, "s-reservation-ready-max")
	}
	b.ReportMetric(f.cpu.scheduler.Seconds()/n, "sched-cpu-s")
	b.ReportMetric(f.cpu.apiserver.Seconds()/n, "apiserver-cpu-s")
	if f.cpu.rssMiB > 0 {
		b.ReportMetric(f.cpu.rssMiB, "sched-peak-rss-MiB")
	}
	if f.cycles.count > 0 {
		b.ReportMetric(f.cycles.count/n, "cycles")
		b.ReportMetric(1000*f.cycles.seconds/f.cycles.count, "ms/cycle")
		b.ReportMetric(f.cycles.bindErrors/n, "bind-errors")
	}
}

// cpuFigures are the CPU time the scheduler at work (kube-scheduler or the
// coordinator) and the API server spent in a run, and the scheduler's peak RSS.
type cpuFigures struct {
	scheduler, apiserver time.Duration
	rssMiB               float64
}

// cpuMark is the CPU time of the scheduler and the API server at a moment.
type cpuMark struct {
	schedPID, apiPID int
	sched, api       time.Duration
}

// takeCPU reads the CPU time so far of the scheduler at work (pid; 0 is the
// test bed's kube-scheduler) and of the API server.
func takeCPU(tb testing.TB, c *cluster.Cluster, pid int) cpuMark {
	tb.Helper()
	m := cpuMark{schedPID: pid}
	for _, p := range c.Processes() {
		switch {
		case p.Name == "kube-apiserver":
			m.apiPID = p.PID
		case p.Name == "kube-scheduler" && pid == 0:
			m.schedPID = p.PID
		}
	}
	m.sched = procCPU(tb, m.schedPID)
	m.api = procCPU(tb, m.apiPID)
	return m
}

// since is the CPU spent since the mark, with the scheduler's peak RSS.
func (m cpuMark) since(tb testing.TB) cpuFigures {
	tb.Helper()
	return cpuFigures{
		scheduler: procCPU(tb, m.schedPID) - m.sched,
		apiserver: procCPU(tb, m.apiPID) - m.api,
		rssMiB:    float64(procHWM(tb, m.schedPID)) / (1 << 20),
	}
}

// procCPU is a process's user+system CPU time from /proc/<pid>/stat (Linux
// clock ticks are 1/100 s).
func procCPU(tb testing.TB, pid int) time.Duration {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatalf("reading CPU time of pid %d: %v", pid, err)
	}
	// Fields after the command (which may hold spaces) start at state, field 3.
	rest := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	utime, err1 := strconv.ParseInt(rest[11], 10, 64)
	stime, err2 := strconv.ParseInt(rest[12], 10, 64)
	if err1 != nil || err2 != nil {
		tb.Fatalf("parsing /proc/%d/stat: %v %v", pid, err1, err2)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// procHWM is a process's peak resident set size in bytes (VmHWM).
func procHWM(tb testing.TB, pid int) int64 {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatalf("reading memory of pid %d: %v", pid, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				tb.Fatalf("parsing VmHWM of pid %d: %v", pid, err)
			}
			return kb << 10
		}
	}
	tb.Fatalf("no VmHWM for pid %d", pid)
	return 0
}

// settle readies the cluster for a run: no benchmark or reservation pods
// left (a failed run leaves its pods), and all n nodes Ready and untainted.
func settle(tb testing.TB, c *cluster.Cluster, n int) {
	tb.Helper()
	deleteBenchPods(tb, c)
	deleteReservations(tb, c)
	waitFor(tb, 3*time.Minute, fmt.Sprintf("%d nodes Ready", n), func(ctx context.Context) (bool, error) {
		l, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		ready := 0
		for i := range l.Items {
			if cluster.IsNodeReady(&l.Items[i]) && len(l.Items[i].Spec.Taints) == 0 {
				ready++
			}
		}
		return ready == n, nil
	})
}

// deleteBenchPods removes every benchmark pod at once and waits until they are gone.
func deleteBenchPods(tb testing.TB, c *cluster.Cluster) {
	tb.Helper()
	ctx := tb.Context()
	if err := c.Client.CoreV1().Pods(benchNamespace).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)},
		metav1.ListOptions{LabelSelector: benchLabel}); err != nil {
		tb.Fatal(err)
	}
	waitFor(tb, 2*time.Minute, "benchmark pods gone", func(ctx context.Context) (bool, error) {
		l, err := c.Client.CoreV1().Pods(benchNamespace).List(ctx, metav1.ListOptions{LabelSelector: benchLabel})
		return err == nil && len(l.Items) == 0, nil
	})
}

// deleteReservations removes gpufrac's reservation pods and waits until they are gone.
func deleteReservations(tb testing.TB, c *cluster.Cluster) {
	tb.Helper()
	sel := api.LabelRole + "=" + api.RoleReservation
	if err := c.Client.CoreV1().Pods(api.ReservationNamespace).DeleteCollection(tb.Context(), metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)},
		metav1.ListOptions{LabelSelector: sel}); err != nil {
		tb.Fatal(err)
	}
	waitFor(tb, 2*time.Minute, "reservation pods gone", func(ctx context.Context) (bool, error) {
		l, err := c.Client.CoreV1().Pods(api.ReservationNamespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
		return err == nil && len(l.Items) == 0, nil
	})
}

// resAgent plays gpufrac-node for reservation pods: once the harness has
// admitted a reservation (the kubelet's step), it writes the GPU the
// coordinator asked for as gpufrac.io/reserved-gpu, as the node agent does
// after reading PodResources. It records how long each reservation took from
// its first sighting to that write.
type resAgent struct {
	cancel context.CancelFunc
	stopFn func()

	mu    sync.Mutex
	seen  map[string]time.Time // reservation -> first seen
	ready map[string]time.Time // reservation -> reserved-gpu written
}

// resAgentWorkers is how many reservations the agent writes at once.
const resAgentWorkers = 32

// startReservationAgent starts the agent; stop it with stop.
func startReservationAgent(tb testing.TB, c *cluster.Cluster) *resAgent {
	tb.Helper()
	return newResAgent(tb, c.Client, true)
}

// newResAgent starts an agent that writes through client, once the harness
// admitted a reservation (afterAdmission) or as soon as it exists.
func newResAgent(tb testing.TB, client kubernetes.Interface, afterAdmission bool) *resAgent {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	a := &resAgent{cancel: cancel, seen: map[string]time.Time{}, ready: map[string]time.Time{}}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(api.ReservationNamespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = api.LabelRole + "=" + api.RoleReservation }))
	inf := factory.Core().V1().Pods().Informer()
	todo := make(chan *corev1.Pod, 4096)
	offer := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok {
			return
		}
		a.mu.Lock()
		if _, ok := a.seen[p.Name]; !ok {
			a.seen[p.Name] = time.Now()
		}
		a.mu.Unlock()
		if (afterAdmission && p.Annotations[cluster.AnnotationAdmitted] != "true") || p.Annotations[api.AnnotationReservedGPU] != "" {
			return
		}
		select {
		case todo <- p:
		case <-ctx.Done():
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: offer, UpdateFunc: func(_, obj any) { offer(obj) }}); err != nil {
		tb.Fatal(err)
	}
	var wg sync.WaitGroup
	// The agent stands in for every node's gpufrac-node at once. With 4
	// workers it admitted the scale benchmark's reservations 37 s (p50) and
	// up to 76 s after their creation (5,000 nodes, 7,588 reservations,
	// docs/benchmarks-history.md "Scale"), where a node agent takes a second or two.
	for range resAgentWorkers {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case p := <-todo:
					patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
						api.AnnotationReservedGPU: p.Annotations[api.AnnotationGPU]}}})
					_, err := client.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{})
					if err != nil {
						if ctx.Err() == nil {
							tb.Logf("writing reserved-gpu on %s: %v", p.Name, err)
						}
						continue
					}
					a.mu.Lock()
					if _, ok := a.ready[p.Name]; !ok {
						a.ready[p.Name] = time.Now()
					}
					a.mu.Unlock()
				}
			}
		})
	}
	factory.Start(ctx.Done())
	a.stopFn = func() {
		cancel()
		factory.Shutdown()
		wg.Wait()
	}
	return a
}

// stop stops the agent and waits for its goroutines.
func (a *resAgent) stop() { a.stopFn() }

// take returns how many reservations became ready since the last take and
// their median and largest time from first sighting to ready, and forgets them.
func (a *resAgent) take() (n int, p50, longest time.Duration) {
	if a == nil {
		return 0, 0, 0
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	var lags []time.Duration
	for name, at := range a.ready {
		lags = append(lags, at.Sub(a.seen[name]))
	}
	clear(a.seen)
	clear(a.ready)
	if len(lags) == 0 {
		return 0, 0, 0
	}
	slices.Sort(lags)
	return len(lags), lags[len(lags)/2], lags[len(lags)-1]
}

// cycleStats are the coordinator's scheduling-cycle counters.
type cycleStats struct {
	count, seconds, bindErrors float64
}

func (a cycleStats) minus(b cycleStats) cycleStats {
	return cycleStats{count: a.count - b.count, seconds: a.seconds - b.seconds, bindErrors: a.bindErrors - b.bindErrors}
}

// scrape reads the cycle counters from the coordinator's /metrics; a nil
// coordinator (kube-scheduler's runs) has none.
func (co *benchCoordinator) scrape(tb testing.TB) cycleStats {
	tb.Helper()
	if co == nil {
		return cycleStats{}
	}
	req, err := http.NewRequestWithContext(tb.Context(), http.MethodGet, "http://"+co.metrics+"/metrics", nil)
	if err != nil {
		tb.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("scraping the coordinator: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("scraping the coordinator: %v", err)
	}
	var st cycleStats
	for _, line := range strings.Split(string(body), "\n") {
		name, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			continue
		}
		switch name {
		case "gpufrac_scheduling_cycle_duration_seconds_count":
			st.count = v
		case "gpufrac_scheduling_cycle_duration_seconds_sum":
			st.seconds = v
		case `gpufrac_bindings_total{result="error"}`:
			st.bindErrors = v
		}
	}
	return st
}

// startKubeScheduler runs a second kube-scheduler, profile benchKubeScheduler,
// whose client may do what the coordinator's does (200 QPS, burst 400), and
// with wait waits until it binds a probe pod (without, the probe would queue
// behind a backlog).
func startKubeScheduler(tb testing.TB, c *cluster.Cluster, wait bool) *coordinator {
	tb.Helper()
	ks := kubeSchedulerProcess(tb, c, c.KubeconfigPath, benchKubeScheduler, 200, 400)
	if !wait {
		return ks
	}
	probe := probeKubeScheduler(tb, c, benchKubeScheduler, 60*time.Second)
	if err := c.Client.CoreV1().Pods(benchNamespace).Delete(tb.Context(), probe.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		tb.Fatal(err)
	}
	return ks
}

// kubeSchedulerProcess runs bin/kube-scheduler with one profile,
// schedulerName, and a client (kubeconfig) of qps and burst, logging to
// <schedulerName>.log in the test bed's log folder, until the test ends.
func kubeSchedulerProcess(tb testing.TB, c *cluster.Cluster, kubeconfig, schedulerName string, qps, burst int) *coordinator {
	tb.Helper()
	conf := fmt.Sprintf(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection: {kubeconfig: %q, qps: %d, burst: %d}
leaderElection: {leaderElect: false}
profiles:
- schedulerName: %s
`, kubeconfig, qps, burst, schedulerName)
	confPath := filepath.Join(tb.TempDir(), "config.yaml")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		tb.Fatal(err)
	}
	f, err := os.Create(filepath.Join(c.LogDir(), schedulerName+".log"))
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(repoRoot(tb), "bin", "kube-scheduler"), "--config="+confPath, "--secure-port=0")
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	ks := &coordinator{cmd: cmd, log: f.Name()}
	tb.Cleanup(func() {
		ks.stop(syscall.SIGTERM)
		f.Close()
	})
	return ks
}

// probeKubeScheduler creates a probe pod for schedulerName and waits up to
// limit until it is bound (without, a probe would queue behind a backlog).
func probeKubeScheduler(tb testing.TB, c *cluster.Cluster, schedulerName string, limit time.Duration) *corev1.Pod {
	tb.Helper()
	probe := builders.MakePod("probe-kube-scheduler", benchNamespace).CPU("10m").SchedulerName(schedulerName).Obj()
	if _, err := c.Client.CoreV1().Pods(benchNamespace).Create(tb.Context(), probe, metav1.CreateOptions{}); err != nil {
		tb.Fatal(err)
	}
	waitFor(tb, limit, "kube-scheduler "+schedulerName+" to bind its probe pod", func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods(benchNamespace).Get(ctx, probe.Name, metav1.GetOptions{})
		return err == nil && p.Spec.NodeName != "", nil
	})
	return probe
}
