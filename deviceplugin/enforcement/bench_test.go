package enforcement

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/config"
	"github.com/gpufrac/gpufrac/deviceplugin/enforcement/enforcementtest"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/deviceplugin/pods"
)

// benchNode is a mock DGX H100 with perGPU containers on each GPU, each
// holding 100/perGPU fraction units and running one process, in a fixture
// /proc tree, with pods in an informer over a fake clientset.
type benchNode struct {
	lib     *nvidia.Mock
	gpus    []nvidia.GPU
	root    string
	devices *fakeDevices
	lookup  PodLookup
	procs   map[string][]nvidia.Process // GPU UUID -> its processes
}

func newBenchNode(tb testing.TB, perGPU int) *benchNode {
	tb.Helper()
	lib, err := nvidia.NewMock("dgxh100", nvidia.WithUUIDSeed("bench"))
	if err != nil {
		tb.Fatal(err)
	}
	if err := lib.Init(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = lib.Shutdown() })
	gpus, err := lib.GPUs()
	if err != nil {
		tb.Fatal(err)
	}
	n := &benchNode{lib: lib, gpus: gpus, root: tb.TempDir(), devices: &fakeDevices{}, procs: map[string][]nvidia.Process{}}
	units := api.UnitsPerGPU / perGPU
	var objs []*corev1.Pod
	var as []pods.Assignment
	for gi, g := range gpus {
		for c := range perGPU {
			i := gi*perGPU + c
			uid := types.UID(fmt.Sprintf("%08x-0000-4000-8000-%012x", i, i))
			p := testPod(fmt.Sprintf("job-%d", i), uid, "main")
			p.Spec.NodeName = "node-a"
			objs = append(objs, p)
			ids := unitIDs(g.UUID, api.UnitsPerGPU)[c*units : (c+1)*units]
			as = append(as, pods.Assignment{Namespace: p.Namespace, Pod: p.Name, Container: "main", Resource: api.ResourceFraction, DeviceIDs: ids})
			pid := uint32(100000 + i)
			if err := enforcementtest.WriteProc(n.root, enforcementtest.Proc{PID: pid, StartTime: uint64(1000 + i),
				Cgroup: enforcementtest.CgroupContainerdSystemd(uid, enforcementtest.ContainerID(p.Name+"/main"))}); err != nil {
				tb.Fatal(err)
			}
			// Each uses 90% of its share: all under the limit.
			n.procs[g.UUID] = append(n.procs[g.UUID], nvidia.Process{PID: pid, UsedBytes: g.MemoryBytes / uint64(perGPU) * 9 / 10})
		}
		if err := lib.SetProcesses(g.UUID, n.procs[g.UUID]); err != nil {
			tb.Fatal(err)
		}
	}
	n.devices.set(as...)
	client := fake.NewClientset()
	for _, p := range objs {
		if err := client.Tracker().Add(p); err != nil {
			tb.Fatal(err)
		}
	}
	inf, err := NewPodInformer(client, "node-a")
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = inf.Run(ctx) }()
	tb.Cleanup(func() { cancel(); <-done })
	deadline := time.Now().Add(10 * time.Second)
	for !inf.HasSynced() {
		if time.Now().After(deadline) {
			tb.Fatal("the pod informer did not sync")
		}
		time.Sleep(5 * time.Millisecond)
	}
	n.lookup = inf
	return n
}

func (n *benchNode) watchdog(k Killer) *Watchdog {
	return New(Options{GPUs: n.gpus, Processes: n.lib, Resolver: ProcFS{Root: n.root}, Devices: n.devices,
		Pods: n.lookup, Killer: k, Registerer: prometheus.NewRegistry()})
}

// BenchmarkPoll measures one poll of 8 GPUs x 50 processes (400 containers,
// each under its limit): NVML process lists from the mock, 800 fixture
// /proc reads, pod and limit lookups, metric updates.
func BenchmarkPoll(b *testing.B) {
	for _, perGPU := range []int{10, 50} {
		b.Run(fmt.Sprintf("8x%d", perGPU), func(b *testing.B) {
			n := newBenchNode(b, perGPU)
			w := n.watchdog(nil)
			w.SetPolicy(Policy{Enforcement: config.EnforcementKill})
			ctx := klog.NewContext(context.Background(), klog.Background().V(10))
			if st := w.Poll(ctx); st.Processes != 8*perGPU || st.Unknown != 0 || st.OverLimit != 0 {
				b.Fatalf("poll = %+v, want %d managed processes under their limits", st, 8*perGPU)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				w.Poll(ctx)
			}
		})
	}
}

// timedKiller records when it is called.
type timedKiller struct {
	calls chan time.Time
}

func (k *timedKiller) Kill(context.Context, uint32, uint64) error {
	k.calls <- time.Now()
	return nil
}

// pollEnd is when a poll ended and whether it found a container over its limit.
type pollEnd struct {
	at   time.Time
	over bool
}

// BenchmarkDetectionToAction measures, with the real clock and a 100ms poll
// interval, kill after 3 samples, on 8 GPUs x 50 processes: the time from
// the end of the poll that first saw a container over its limit to the kill
// ("detect-ms", target <= 2 poll intervals) and from the memory crossing the
// limit to the kill ("cross-ms", at most 3 intervals plus a poll). Run with
// -benchtime=Nx.
func BenchmarkDetectionToAction(b *testing.B) {
	const interval = 100 * time.Millisecond
	n := newBenchNode(b, 50)
	k := &timedKiller{calls: make(chan time.Time, 100)}
	w := n.watchdog(k)
	w.SetPolicy(Policy{Enforcement: config.EnforcementKill, Samples: 3, PollInterval: interval})
	polls := make(chan pollEnd, 1000)
	w.onPoll = func(st Stats) { polls <- pollEnd{at: time.Now(), over: st.OverLimit > 0} }
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), klog.Background().V(10)))
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(ctx) }()
	defer func() { cancel(); <-done }()

	next := func(what string) pollEnd {
		select {
		case p := <-polls:
			return p
		case <-time.After(10 * interval):
			b.Fatalf("no poll within 10 intervals while waiting for %s", what)
			return pollEnd{}
		}
	}
	g := n.gpus[3]
	var detect, cross time.Duration
	runs := 0
	for b.Loop() {
		runs++
		// 1. Steady state: a poll that started after the last reset sees
		// nothing over its limit.
		settled := time.Now()
		for p := next("the steady state"); p.over || p.at.Before(settled.Add(interval/2)); p = next("the steady state") {
		}
		// 2. One container's process grows to 50% of the GPU against a 2% share.
		procs := append([]nvidia.Process(nil), n.procs[g.UUID]...)
		procs[7].UsedBytes = g.MemoryBytes / 2
		crossed := time.Now()
		if err := n.lib.SetProcesses(g.UUID, procs); err != nil {
			b.Fatal(err)
		}
		// 3. The first poll that sees it, then the kill.
		p := next("the first over-limit poll")
		for !p.over {
			p = next("the first over-limit poll")
		}
		var killed time.Time
		select {
		case killed = <-k.calls:
		case <-time.After(10 * interval):
			b.Fatal("no kill within 10 poll intervals")
		}
		detect += killed.Sub(p.at)
		cross += killed.Sub(crossed)
		// 4. The process is gone.
		if err := n.lib.SetProcesses(g.UUID, n.procs[g.UUID]); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(detect.Microseconds())/1000/float64(runs), "detect-ms")
	b.ReportMetric(float64(cross.Microseconds())/1000/float64(runs), "cross-ms")
	b.ReportMetric(0, "ns/op")
}
