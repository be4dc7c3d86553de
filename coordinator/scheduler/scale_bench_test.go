package scheduler

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/reservation"
	"github.com/gpufrac/gpufrac/coordinator/scheduler/schedulertest"
	"github.com/gpufrac/gpufrac/coordinator/state"
	"github.com/gpufrac/gpufrac/tests/builders"
)

// BenchmarkCycle measures one scheduling cycle of the coordinator alone
// (no API server: listers over fixed objects, a binder that only records)
// at the size of the scale benchmark (tests/e2e TestScale): 5,000 nodes of
// 8 GPUs in 5 pools, two queue levels, and
//
//   - idle: 55,000 pods bound (per node 4 whole-GPU pods, 5 fractions on 2
//     shared GPUs and their 2 reservation pods: 75 % of the GPUs), none
//     pending - the cycle the coordinator runs every second once all is bound;
//   - busy: the same plus 5,000 pending pods (fractions, whole GPUs, gangs
//     of 8 to 256) that fit in the GPUs left - the cycles of a burst;
//   - backlog: nothing bound, 50,000 pending - the first cycle after a
//     restart, or a flood;
//   - waiting: 55,000 bound and 20,000 pending while the bind queue is full,
//     so nothing is placed - the cycles of a burst once the bind workers
//     (the API client's budget) are what binding waits for.
//
// Each iteration places the same pending pods again (the bindings of the
// last one are forgotten), after one cycle that is not timed
// (s-first-cycle): a running coordinator has had cycles before. Run with
//
//	go test ./coordinator/scheduler -run XXX -bench BenchmarkCycle -benchtime 5x -timeout 30m
func BenchmarkCycle(b *testing.B) {
	for _, sc := range []struct {
		name       string
		bound      bool
		pendingPer int  // pending pods per node
		full       bool // the bind queue is full
		gangs      bool // the bound whole-GPU pods are gangs' members
	}{{"idle", true, 0, false, false}, {"busy", true, 1, false, false}, {"backlog", false, 10, false, false},
		{"waiting", true, 4, true, false}, {"gangs", true, 1, false, true}} {
		b.Run(sc.name, func(b *testing.B) {
			pods := scaleBenchPods(5000, sc.bound, sc.pendingPer)
			if sc.gangs {
				boundGangs(pods)
			}
			s := newBenchScheduler(b, 5000, pods, !sc.full)
			ctx := b.Context()
			if testing.Verbose() {
				// Every cycle's line, with its stages' durations.
				ctx = klog.NewContext(ctx, ktesting.NewLogger(b, ktesting.NewConfig(ktesting.Verbosity(2))))
			}
			// forget undoes a cycle's placements: the next one places the
			// same pods again.
			forget := func() {
				drainBinds(s)
				s.mu.Lock()
				clear(s.assumed)
				s.mu.Unlock()
				s.plans = nil
				if sc.full {
					for len(s.binds) < cap(s.binds) {
						s.binds <- bindTask{}
					}
				}
			}
			forget()
			timeCycles(b, s, ctx, forget)
		})
	}
}

// boundGangs makes the bound whole-GPU pods of scaleBenchPods members of
// gangs of 8 (two nodes' four), admitted as such: 20,000 members that the
// gang census counts in every cycle.
func boundGangs(pods []*corev1.Pod) {
	k := 0
	for _, p := range pods {
		if p.Spec.NodeName == "" || !strings.HasPrefix(p.Name, "w-") {
			continue
		}
		g := fmt.Sprintf("bound-gang-%05d", k/8)
		k++
		p.Labels[api.LabelPodGroup] = g
		p.Annotations[api.AnnotationMinMember] = "8"
		p.Annotations[api.AnnotationAdmittedGang] = g
	}
}

// timeCycles runs one cycle that is not timed (a running coordinator has
// had cycles before: what cycles keep from one to the next is filled), then
// times a cycle per iteration, forget undoing each one's placements so the
// next places the same pods again. It reports the pods bound, the first
// cycle's time and the garbage collector's CPU per cycle (all its
// goroutines, to compare runs with and without a memory limit).
func timeCycles(b *testing.B, s *Scheduler, ctx context.Context, forget func()) {
	b.Helper()
	cold := time.Now()
	if _, err := s.Cycle(ctx); err != nil {
		b.Fatal(err)
	}
	first := time.Since(cold)
	forget()
	gcBefore := readCPUUse().gc
	var cpu time.Duration
	b.ResetTimer()
	for b.Loop() {
		cpuBefore := readCPUUse().process
		res, err := s.Cycle(ctx)
		if err != nil {
			b.Fatal(err)
		}
		cpu += readCPUUse().process - cpuBefore
		b.StopTimer()
		b.ReportMetric(float64(res.Bound), "bound/op")
		if testing.Verbose() {
			b.Logf("bound %d, pending %v", res.Bound, res.Pending)
		}
		forget()
		b.StartTimer()
	}
	b.ReportMetric(first.Seconds(), "s-first-cycle")
	b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/op")
	b.ReportMetric((readCPUUse().gc-gcBefore).Seconds()/float64(b.N), "gc-cpu-s/op")
	b.ReportMetric(liveHeapMiB(), "live-heap-MiB")
}

// liveHeapMiB is the heap a full collection leaves: what the scheduler and
// its caches hold, the figure GOMEMLIMIT's soft limit is measured against.
func liveHeapMiB() float64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	if path := os.Getenv("GPUFRAC_BENCH_HEAP_PROFILE"); path != "" {
		// What holds that heap, while the benchmark's scheduler is live.
		if f, err := os.Create(path); err == nil {
			_ = pprof.WriteHeapProfile(f)
			f.Close()
		}
	}
	return float64(m.HeapAlloc) / (1 << 20)
}

// BenchmarkIdleCycle measures a turn of Run's loop on the idle cluster of
// BenchmarkCycle (55,000 pods bound, none pending) when nothing happened
// since the last cycle: after one quiet cycle, not timed, Run skips the
// cycles until an event or IdleResync. Run with
//
//	go test ./coordinator/scheduler -run XXX -bench BenchmarkIdleCycle -benchtime 1000x
func BenchmarkIdleCycle(b *testing.B) {
	s := newBenchScheduler(b, 5000, scaleBenchPods(5000, true, 0), true)
	ctx := b.Context()
	s.cycleIfChanged(ctx)
	if !s.idle.quiet {
		b.Fatal("the idle cluster's cycle was not quiet: every cycle would run")
	}
	skipped := testutil.ToFloat64(s.metrics.idleSkipped)
	n := 0
	for b.Loop() {
		s.cycleIfChanged(ctx)
		n++
	}
	if got := testutil.ToFloat64(s.metrics.idleSkipped) - skipped; int(got) != n {
		b.Fatalf("%v of %d turns skipped their cycle, want all", got, n)
	}
}

// drainBinds empties the bind queue without binding.
func drainBinds(s *Scheduler) {
	for {
		select {
		case <-s.binds:
		default:
			return
		}
	}
}

// newBenchScheduler is a scheduler over n scale nodes and pods, with two
// queue levels and a Reserver that does nothing; with drain, bind workers
// take what the cycles queue and do nothing with it.
func newBenchScheduler(b *testing.B, n int, pods []*corev1.Pod, drain bool) *Scheduler {
	b.Helper()
	podIdx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	nodeIdx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for i := range n {
		node := h100Node(scaleNodeName(i), fmt.Sprintf("pool-%d", i/1000), 8)
		// As from an informer: a UID and a resourceVersion (the cycle's
		// caches key on them).
		node.UID, node.ResourceVersion = types.UID(node.Name), "1"
		if err := nodeIdx.Add(node); err != nil {
			b.Fatal(err)
		}
	}
	for _, p := range pods {
		p.ResourceVersion = "1"
		if err := podIdx.Add(p); err != nil {
			b.Fatal(err)
		}
	}
	gpus := n * 8
	queues := staticQueues{
		builders.MakeQueue("scale-a").GPUQuota(fmt.Sprint(gpus / 2)).Obj(),
		builders.MakeQueue("scale-b").GPUQuota(fmt.Sprint(gpus / 2)).Obj(),
	}
	for _, q := range scaleBenchQueues {
		queues = append(queues, builders.MakeQueue(q).Parent("scale-"+q[6:7]).GPUQuota(fmt.Sprint(gpus/4)).Namespaces("*").Obj())
	}
	s, err := New(Options{BindWorkers: 16}, Deps{
		Pods: corelisters.NewPodLister(podIdx), Nodes: corelisters.NewNodeLister(nodeIdx),
		Queues: queues, Binder: schedulertest.NewBinder(), Reserver: &benchReserver{},
	})
	if err != nil {
		b.Fatal(err)
	}
	for _, node := range nodeIdx.List() { // the informers' first lists
		s.OnNode(node)
	}
	for _, p := range pods {
		s.OnPod(p)
	}
	if !drain {
		return s
	}
	// Bind workers that only take the tasks: a cycle never waits for them.
	go func() {
		for {
			select {
			case <-b.Context().Done():
				return
			case <-s.binds:
			}
		}
	}()
	return s
}

// benchReserver creates and removes nothing.
type benchReserver struct{}

func (benchReserver) Ensure(context.Context, string, string, int) error { return nil }
func (benchReserver) Reconcile(context.Context, map[state.NodeGPU]*state.Reservation, map[state.NodeGPU]bool, map[types.UID]bool) int {
	return 0
}
func (benchReserver) RemoveFailed(context.Context, []*corev1.Pod) int { return 0 }
func (benchReserver) Removing() map[types.UID]bool                    { return nil }

var scaleBenchQueues = []string{"scale-a1", "scale-a2", "scale-b1", "scale-b2"}

func scaleNodeName(i int) string { return fmt.Sprintf("node-%05d", i) }

// scaleBenchPods makes the pods of BenchmarkCycle for n nodes: bound ones
// (with their reservations) and pendingPer pending ones per node.
func scaleBenchPods(n int, bound bool, pendingPer int) []*corev1.Pod {
	var pods []*corev1.Pod
	created := metav1.NewTime(time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC))
	k, w := 0, 0 // pods and workloads so far
	queue := func() string { w++; return scaleBenchQueues[w%len(scaleBenchQueues)] }
	// The API server's DefaultTolerationSeconds admission gives every pod
	// these two; the coordinator's informer transform makes equal lists one.
	tolerate := int64(300)
	tolerations := []corev1.Toleration{
		{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &tolerate},
		{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &tolerate},
	}
	podIn := func(name, q string) *builders.PodWrapper {
		k++
		return builders.MakePod(name, "bench").UID(name).Queue(q).CPU("100m").Memory("128Mi").
			Created(metav1.NewTime(created.Add(time.Duration(k) * time.Millisecond)))
	}
	pod := func(name string) *builders.PodWrapper { return podIn(name, queue()) }
	if bound {
		for i := range n {
			node := scaleNodeName(i)
			gpu := func(g int) string { return fmt.Sprintf("GPU-%s-%d", node, g) }
			for g := range 4 {
				pods = append(pods, admitted(pod(fmt.Sprintf("w-%s-%d", node, g)).GPUs(1).Obj(), node))
			}
			for f, share := range []struct{ gpu, pct int }{{4, 50}, {4, 30}, {4, 20}, {5, 40}, {5, 40}} {
				p := admitted(pod(fmt.Sprintf("f-%s-%d", node, f)).Fraction(share.pct).Obj(), node)
				p.Annotations[api.AnnotationGPU] = gpu(share.gpu)
				pods = append(pods, p)
			}
			for _, g := range []int{4, 5} {
				r := reservation.Pod(node, gpu(g), reservation.DefaultOptions())
				r.UID = types.UID(r.Name)
				r.Annotations[api.AnnotationReservedGPU] = gpu(g)
				r.Status.Phase = corev1.PodRunning
				pods = append(pods, r)
			}
		}
	}
	if pendingPer > 0 {
		count := pendingPer * n
		gangSizes := []int{8, 16, 32, 64, 128, 256}
		members, g := count/4, 0
		for members >= gangSizes[g%len(gangSizes)] {
			size, q := gangSizes[g%len(gangSizes)], queue()
			for m := range size {
				pods = append(pods, podIn(fmt.Sprintf("gang-%03d-%03d", g, m), q).GPUs(1).PodGroup(fmt.Sprintf("gang-%03d", g)).MinMember(size).Obj())
			}
			members -= size
			g++
		}
		for i := range count/4 + members {
			pods = append(pods, pod(fmt.Sprintf("whole-%05d", i)).GPUs([]int{1, 1, 1, 1, 2}[i%5]).Obj())
		}
		for i := range count / 2 {
			pods = append(pods, pod(fmt.Sprintf("frac-%05d", i)).Fraction(10*(1+i%5)).Obj())
		}
	}
	for _, p := range pods {
		if p.Namespace == "bench" {
			p.Spec.Tolerations = tolerations
		}
	}
	return pods
}
