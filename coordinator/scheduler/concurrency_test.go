package scheduler

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/coordinator/scheduler/schedulertest"
)

// TestRunUnderFailingBindingsBindsEachPodOnce runs the scheduler as the
// coordinator does - cycles on one goroutine, bindings on four, informer
// events on another - while every third binding fails and the informer
// shows successful ones late. Under -race (make test) it checks the
// scheduler's shared state (assumed pods, back-offs, gang errors); in any
// run it checks that every pod ends bound and none is bound twice.
func TestRunUnderFailingBindingsBindsEachPodOnce(t *testing.T) {
	var pods []*corev1.Pod
	for i := range 24 {
		pods = append(pods, gpuPod(fmt.Sprintf("p%d", i), "q", 1))
	}
	pods = append(pods, gangOf("g", 4)...)
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 16), h100Node("n2", "a", 16)}, []*v1alpha1.Queue{queueOf("q", "32")}, pods...)
	c.s.opts.BindWorkers = 4
	c.s.opts.Interval = 10 * time.Millisecond
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	c.s.clock = clk

	fb := &applyingBinder{Binder: c.b, bound: map[string]int{}, applied: make(chan *corev1.Pod, 1024)}
	c.s.deps.Binder = fb
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { c.s.Run(ctx) })
	wg.Go(func() { // the informer, a little behind
		for {
			select {
			case <-ctx.Done():
				return
			case p := <-fb.applied:
				time.Sleep(time.Millisecond)
				_ = c.pods.Update(p)
				c.s.OnPod(p)
			}
		}
	})
	wg.Go(func() { // time passes for back-offs
		for ctx.Err() == nil {
			clk.Step(500 * time.Millisecond)
			time.Sleep(5 * time.Millisecond)
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		fb.mu.Lock()
		n := len(fb.bound)
		fb.mu.Unlock()
		if n == len(pods) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	fb.mu.Lock()
	defer fb.mu.Unlock()
	if len(fb.bound) != len(pods) {
		var missing []string
		for _, p := range pods {
			if fb.bound[p.Name] == 0 {
				r, m := c.b.Reason(p.Name)
				missing = append(missing, fmt.Sprintf("%s (%s %q)", p.Name, r, m))
			}
		}
		t.Errorf("%d of %d pods bound; not: %v", len(fb.bound), len(pods), missing)
	}
	for name, n := range fb.bound {
		if n != 1 {
			t.Errorf("%s bound %d times", name, n)
		}
	}
}

// applyingBinder fails every third binding and sends the pods it binds, as
// the API server has them (node and the binding's annotations), to applied.
type applyingBinder struct {
	*schedulertest.Binder
	mu      sync.Mutex
	calls   int
	bound   map[string]int // pod -> successful bindings
	applied chan *corev1.Pod
}

func (b *applyingBinder) Bind(ctx context.Context, p *corev1.Pod, node string, ann map[string]string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls++
	if b.calls%3 == 0 {
		return apierrors.NewServiceUnavailable("etcd leader changed")
	}
	b.bound[p.Name]++
	q := p.DeepCopy()
	q.Spec.NodeName = node
	if q.Annotations == nil {
		q.Annotations = map[string]string{}
	}
	for k, v := range ann {
		q.Annotations[k] = v
	}
	b.applied <- q
	return nil
}
