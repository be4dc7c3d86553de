package e2e

import (
	"bufio"
	"bytes"
	"cmp"
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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
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
)

// BenchmarkBindThroughput binds 1,000 whole-GPU pods with kube-scheduler, then
// 1,000 with gpufrac-coordinator, then 1,000 fraction pods (10..60%) with the
// coordinator, without and with reservation pods, on one cluster of 130 nodes
// x 8 GPUs. Each sub-benchmark runs its scheduler alone: the coordinator is
// started for its own sub-benchmarks and stopped after them.
func BenchmarkBindThroughput(b *testing.B) {
	const nodes, pods = 130, 1000
	c := startBenchCluster(b)
	addBenchNodes(b, c, "node", "pool-a", nodes)
	applyBenchQueue(b, c, 2*nodes*benchGPUsPerNode)
	w := newBindWatch(b, c)

	whole := func(name string, scheduler string) *corev1.Pod {
		return builders.MakePod(name, benchNamespace).Queue(benchQueue).CPU("100m").Memory("128Mi").GPUs(1).SchedulerName(scheduler).Obj()
	}
	runs := []struct {
		name string
		// coordinator flags; nil runs kube-scheduler's pods.
		coordinator []string
		// agent plays gpufrac-node for reservation pods.
		agent bool
		pod   func(i int, name string) *corev1.Pod
	}{
		{
			name: "kube-scheduler/whole",
			pod:  func(_ int, name string) *corev1.Pod { return whole(name, corev1.DefaultSchedulerName) },
		},
		{
			name:        "coordinator/whole",
			coordinator: []string{},
			pod:         func(_ int, name string) *corev1.Pod { return whole(name, api.SchedulerName) },
		},
		{
			name:        "coordinator/fraction-no-reservations",
			coordinator: []string{"--reservations=false"},
			pod:         fractionPod,
		},
		{
			name:        "coordinator/fraction",
			coordinator: []string{},
			agent:       true,
			pod:         fractionPod,
		},
	}
	for _, r := range runs {
		b.Run(r.name, func(b *testing.B) {
			var co *benchCoordinator
			if r.coordinator != nil {
				co = startBenchCoordinator(b, c, r.coordinator...)
				defer co.stop()
			}
			if r.agent {
				stopAgent := reservationAgent(b, c)
				defer stopAgent()
			}
			var sum runFigures
			for i := 0; i < b.N; i++ {
				cpu := takeCPU(b, c, co)
				run := fmt.Sprintf("%s-%d", strings.NewReplacer("/", "-").Replace(r.name), i)
				f := w.run(b, c, run, pods, func(j int) *corev1.Pod {
					return r.pod(j, fmt.Sprintf("%s-%04d", run, j))
				})
				f.cpu = cpu.since(b)
				sum.add(f)
				b.StopTimer()
				deleteBenchPods(b, c)
				if r.agent {
					co.stop() // its reservations must not outlive the run
					deleteReservations(b, c)
					if i+1 < b.N {
						co = startBenchCoordinator(b, c, r.coordinator...)
					}
				}
				b.StartTimer()
			}
			sum.report(b)
		})
	}
}

// fractionPod is the i-th fraction pod: 10, 20, ... 60 percent in turn.
func fractionPod(i int, name string) *corev1.Pod {
	return builders.MakePod(name, benchNamespace).Queue(benchQueue).CPU("100m").Memory("128Mi").Fraction(10 * (1 + i%6)).Obj()
}

// BenchmarkGang256 creates a gang of 256 one-GPU pods (min-member 256) on 36
// nodes x 8 GPUs of one pool and measures the time from the last member's
// creation to all 256 bound.
func BenchmarkGang256(b *testing.B) {
	const nodes, members = 36, 256
	c := startBenchCluster(b)
	addBenchNodes(b, c, "node", "pool-a", nodes)
	applyBenchQueue(b, c, nodes*benchGPUsPerNode)
	w := newBindWatch(b, c)
	co := startBenchCoordinator(b, c)
	defer co.stop()
	var sum runFigures
	for i := 0; i < b.N; i++ {
		cpu := takeCPU(b, c, co)
		run := fmt.Sprintf("gang-%d", i)
		f := w.run(b, c, run, members, func(j int) *corev1.Pod {
			return builders.MakePod(fmt.Sprintf("%s-%03d", run, j), benchNamespace).Queue(benchQueue).CPU("100m").Memory("128Mi").
				GPUs(1).PodGroup(run).MinMember(members).Obj()
		})
		f.cpu = cpu.since(b)
		sum.add(f)
		b.StopTimer()
		deleteBenchPods(b, c)
		b.StartTimer()
	}
	sum.report(b)
}

// startBenchCluster starts the test bed without node agents, with gpufrac's
// namespace, priority classes and Queue CRD, and builds the coordinator.
func startBenchCluster(tb testing.TB) *cluster.Cluster {
	tb.Helper()
	if testing.Short() {
		tb.Skip("end-to-end benchmark: needs the local cluster (make tools)")
	}
	buildBinary(tb, "gpufrac-coordinator")
	c := cluster.StartForTest(tb, cluster.Options{})
	root := repoRoot(tb)
	for _, f := range []string{"crds/gpufrac.io_queues.yaml", "manifests/namespace.yaml", "manifests/priorityclasses.yaml"} {
		data, err := os.ReadFile(filepath.Join(root, "deployments", f))
		if err != nil {
			tb.Fatal(err)
		}
		applyYAMLTB(tb, c, data)
	}
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
	applyYAMLTB(tb, c, queuesYAML(map[string]string{benchQueue: strconv.Itoa(gpus)}))
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

// applyYAMLTB creates every object of a multi-document YAML (AlreadyExists
// is fine). It is applyYAML for benchmarks, which have no *testing.T.
func applyYAMLTB(tb testing.TB, c *cluster.Cluster, data []byte) {
	tb.Helper()
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if err == io.EOF {
			return
		}
		if err != nil {
			tb.Fatal(err)
		}
		u := &unstructured.Unstructured{}
		if err := utilyaml.Unmarshal(doc, &u.Object); err != nil {
			tb.Fatal(err)
		}
		if len(u.Object) == 0 {
			continue
		}
		m, err := restMapping(c, u.GroupVersionKind())
		if err != nil {
			tb.Fatal(err)
		}
		var ri dynamic.ResourceInterface = c.Dynamic.Resource(m.Resource)
		if m.Namespaced {
			ri = c.Dynamic.Resource(m.Resource).Namespace(cmp.Or(u.GetNamespace(), "default"))
		}
		if _, err := ri.Create(tb.Context(), u, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			tb.Fatalf("creating %s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
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
	logPath := filepath.Join("/tmp/bench12", fmt.Sprintf("coordinator-%d.log", time.Now().UnixNano())) // TEMP
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
	waitFor(tb, 30*time.Second, "the coordinator to sync its caches", func(ctx context.Context) (bool, error) {
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
	return co
}

func (co *benchCoordinator) stop() { co.coordinator.stop(syscall.SIGTERM) }

// bindWatch records when each benchmark pod was created and first seen bound.
type bindWatch struct {
	client kubernetes.Interface

	mu      sync.Mutex
	created map[string]time.Time // pod name -> just before its Create call
	bound   map[string]time.Time // pod name -> first watch event with spec.nodeName
	nodes   map[string]string    // pod name -> node
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
	w := &bindWatch{client: client, created: map[string]time.Time{}, bound: map[string]time.Time{}, nodes: map[string]string{}}
	factory := informers.NewSharedInformerFactoryWithOptions(c.Client, 0, informers.WithNamespace(benchNamespace))
	inf := factory.Core().V1().Pods().Informer()
	seen := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok || p.Spec.NodeName == "" {
			return
		}
		now := time.Now()
		w.mu.Lock()
		if _, ok := w.bound[p.Name]; !ok {
			w.bound[p.Name] = now
			w.nodes[p.Name] = p.Spec.NodeName
		}
		w.mu.Unlock()
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: seen, UpdateFunc: func(_, obj any) { seen(obj) }}); err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	factory.Start(ctx.Done())
	tb.Cleanup(func() {
		cancel()
		factory.Shutdown()
	})
	if !cache.WaitForCacheSync(tb.Context().Done(), inf.HasSynced) {
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
	cpu       cpuFigures
}

// run creates n pods named by mk (all labelled with run), waits until all are
// bound and returns the figures.
func (w *bindWatch) run(tb testing.TB, c *cluster.Cluster, run string, n int, mk func(i int) *corev1.Pod) runFigures {
	tb.Helper()
	pods := make([]*corev1.Pod, n)
	for i := range pods {
		pods[i] = mk(i)
		pods[i].Labels[benchLabel] = run
	}
	w.mu.Lock()
	clear(w.created)
	clear(w.bound)
	clear(w.nodes)
	w.mu.Unlock()

	next := make(chan *corev1.Pod)
	var wg sync.WaitGroup
	var lastCreated time.Time
	var errMu sync.Mutex
	var createErr error
	for range benchCreators {
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
	for _, p := range pods {
		next <- p
	}
	close(next)
	wg.Wait()
	if createErr != nil {
		tb.Fatal(createErr)
	}
	waitFor(tb, 5*time.Minute, fmt.Sprintf("%d pods of %s bound", n, run), func(context.Context) (bool, error) {
		w.mu.Lock()
		defer w.mu.Unlock()
		return len(w.bound) == n, nil
	})

	w.mu.Lock()
	defer w.mu.Unlock()
	f := runFigures{runs: 1, pods: n, creation: lastCreated.Sub(first)}
	lat := make([]time.Duration, 0, n)
	var lastBound time.Time
	nodes := map[string]bool{}
	for name, at := range w.bound {
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
	tb.Logf("%s: %d pods bound on %d nodes in %s (created in %s; last bound %s after the last creation), latency p50 %s p99 %s",
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
	f.cpu.scheduler += g.cpu.scheduler
	f.cpu.apiserver += g.cpu.apiserver
	f.cpu.rssMiB = max(f.cpu.rssMiB, g.cpu.rssMiB)
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
	b.ReportMetric(f.cpu.scheduler.Seconds()/n, "sched-cpu-s")
	b.ReportMetric(f.cpu.apiserver.Seconds()/n, "apiserver-cpu-s")
	if f.cpu.rssMiB > 0 {
		b.ReportMetric(f.cpu.rssMiB, "sched-peak-rss-MiB")
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

// takeCPU reads the CPU time so far of the coordinator (or kube-scheduler
// when co is nil) and of the API server.
func takeCPU(tb testing.TB, c *cluster.Cluster, co *benchCoordinator) cpuMark {
	tb.Helper()
	var m cpuMark
	for _, p := range c.Processes() {
		switch p.Name {
		case "kube-apiserver":
			m.apiPID = p.PID
		case "kube-scheduler":
			if co == nil {
				m.schedPID = p.PID
			}
		}
	}
	if co != nil {
		m.schedPID = co.cmd.Process.Pid
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
	if err := c.Client.CoreV1().Pods(api.SystemNamespace).DeleteCollection(tb.Context(), metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)},
		metav1.ListOptions{LabelSelector: sel}); err != nil {
		tb.Fatal(err)
	}
	waitFor(tb, 2*time.Minute, "reservation pods gone", func(ctx context.Context) (bool, error) {
		l, err := c.Client.CoreV1().Pods(api.SystemNamespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
		return err == nil && len(l.Items) == 0, nil
	})
}

// reservationAgent plays gpufrac-node for reservation pods: once the harness
// has admitted a reservation (the kubelet's step), it writes the GPU the
// coordinator asked for as gpufrac.io/reserved-gpu, as the node agent does
// after reading PodResources. It returns a func that stops it and waits.
func reservationAgent(tb testing.TB, c *cluster.Cluster) func() {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	factory := informers.NewSharedInformerFactoryWithOptions(c.Client, 0, informers.WithNamespace(api.SystemNamespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = api.LabelRole + "=" + api.RoleReservation }))
	inf := factory.Core().V1().Pods().Informer()
	todo := make(chan *corev1.Pod, 4096)
	offer := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok || p.Annotations[cluster.AnnotationAdmitted] != "true" || p.Annotations[api.AnnotationReservedGPU] != "" {
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
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case p := <-todo:
					patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
						api.AnnotationReservedGPU: p.Annotations[api.AnnotationGPU]}}})
					if _, err := c.Client.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil && ctx.Err() == nil {
						tb.Logf("writing reserved-gpu on %s: %v", p.Name, err)
					}
				}
			}
		})
	}
	factory.Start(ctx.Done())
	return func() {
		cancel()
		factory.Shutdown()
		wg.Wait()
	}
}
