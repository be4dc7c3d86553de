package pods

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/config"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/deviceplugin/plugin"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
	"github.com/gpufrac/gpufrac/tests/kubeletsim"
)

// BenchmarkReservationWrittenBack measures how long a reservation pod
// waits, after the kubelet admits it, for gpufrac.io/reserved-gpu: the
// coordinator binds fractions to a new GPU only once it is there. The node
// agent's pieces run as in gpufrac-node: the hint's write-back loop (real
// clock, 2 s period) and the resources resource.Build makes for a GPU in
// mode fraction, behind a real device-plugin endpoint of the kubelet
// simulator, which records an allocation after the Allocate RPC returns as
// the kubelet does. Each iteration admits a new reservation pod at a
// different phase of the 2 s period (spread evenly, untimed), then polls
// the fake API server every millisecond until the annotation is there.
// Reported: the mean, median and largest wait from the end of admission
// (kubelet's Allocate returned) to the annotation in the API, in ms.
//
//	go test ./deviceplugin/pods -run '^$' -bench BenchmarkReservationWrittenBack -benchtime 20x -timeout 10m
func BenchmarkReservationWrittenBack(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	gpu := nvidia.GPU{Index: 0, Minor: 0, UUID: wholeUUID(0), MemoryBytes: 80 << 30}
	n := startSimNode(b, ctx)
	c := newFakeClient()
	h := NewHint(c, node, n.podRes)
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	res, err := resource.Build([]config.Mode{config.ModeFraction}, []nvidia.GPU{gpu}, resource.Deps{Usage: n.podRes, Hint: h})
	if err != nil {
		b.Fatal(err)
	}
	for _, r := range res {
		if r.Name() != api.ResourceGPU {
			continue
		}
		srv := plugin.NewServer(n.dir, r, nil)
		if err := srv.Start(ctx); err != nil {
			b.Fatal(err)
		}
		defer srv.Stop()
		if err := srv.Register(ctx); err != nil {
			b.Fatal(err)
		}
	}
	n.waitAllocatable(b, ctx, api.ResourceGPU, 1)
	waitFor(b, "the pod informer to sync", h.HasSynced)

	var waits []time.Duration
	b.ResetTimer()
	for i := range b.N {
		p := makePod(api.ReservationNamespace, fmt.Sprintf("%sb-%d", api.ReservationNamePrefix, i)).whole("hold", 1).gpu(gpu.UUID).obj()
		if _, err := c.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		waitFor(b, "the informer to show the pod", func() bool { _, ok := h.Pod(p.Namespace, p.Name); return ok })
		// Admit at an even spread of phases of the write-back period.
		time.Sleep(time.Duration(i*2000/b.N) * time.Millisecond % (2 * time.Second))
		if _, err := n.kubelet.Allocate(ctx, kubeletsim.PodRef{Namespace: p.Namespace, Name: p.Name, UID: p.UID}, "hold", api.ResourceGPU, 1); err != nil {
			b.Fatal(err)
		}
		admitted := time.Now()
		for {
			cur, err := c.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				b.Fatal(err)
			}
			if cur.Annotations[api.AnnotationReservedGPU] == gpu.UUID {
				break
			}
			if time.Since(admitted) > 10*time.Second {
				b.Fatalf("reserved-gpu not written 10s after admission")
			}
			time.Sleep(time.Millisecond)
		}
		waits = append(waits, time.Since(admitted))
		n.kubelet.Release(p.UID)
		if err := c.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	slices.Sort(waits)
	var sum time.Duration
	for _, w := range waits {
		sum += w
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(sum)/float64(len(waits)), "mean-ms")
	b.ReportMetric(ms(waits[len(waits)/2]), "p50-ms")
	b.ReportMetric(ms(waits[len(waits)-1]), "max-ms")
	b.ReportMetric(0, "ns/op") // the wall time includes the untimed phase spread
}

// waitFor polls cond every millisecond for up to 10 s.
func waitFor(b *testing.B, what string, cond func() bool) {
	b.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatalf("waiting for %s", what)
		}
	}
}
