package scheduler

import (
	"context"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

// A cycle decides; the API writes it decides besides bindings - pending
// reasons, reservation pods, queue status - used to be made inside it, one
// by one. They share the client's rate limit with the bindings, so at
// 50,000 pods a cycle waited for thousands of them and took up to a minute
// (docs/benchmarks-history.md, "Scale"), while new pods waited for the next cycle.
// Now Run hands them to writer goroutines, as it hands bindings to the bind
// workers: the cycle only queues them. A cycle run on its own (tests, and
// anything else that drives cycles itself) still writes inline, so what it
// decided is written when it returns.

// writer runs a cycle's API writes, one task per key (a pod, a GPU's
// reservation, a queue): a task queued for a key that already has one
// waiting replaces it - the newer decision wins, and a pod whose reason
// changed twice is written once. A key's tasks never run concurrently.
// Keys are handed out in writeOrder's order, not first come first served.
type writer struct {
	// queue holds the keys with a task to run (workqueue: one entry per
	// key, and a key being run is not handed out again until it is done).
	queue workqueue.TypedInterface[string]

	mu      sync.Mutex
	idle    *sync.Cond                           // on mu: a key's task ended
	async   bool                                 // Run's workers take the tasks; false: inline
	tasks   map[string]func(ctx context.Context) // key -> task waiting to run
	running map[string]bool                      // keys whose task runs now
	// done, when set, is called after each task that ran on a worker.
	done func()
}

func newWriter() *writer {
	w := &writer{
		queue:   workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[string]{Name: "gpufrac-writes", Queue: newWriteOrder()}),
		tasks:   map[string]func(context.Context){},
		running: map[string]bool{},
	}
	w.idle = sync.NewCond(&w.mu)
	return w
}

// do runs task for key: inline until run starts, then on a worker.
func (w *writer) do(ctx context.Context, key string, task func(ctx context.Context)) {
	w.mu.Lock()
	if !w.async {
		w.mu.Unlock()
		task(ctx)
		return
	}
	w.tasks[key] = task
	w.mu.Unlock()
	w.queue.Add(key)
}

// busy tells whether key has a task waiting or running.
func (w *writer) busy(key string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, waiting := w.tasks[key]
	return waiting || w.running[key]
}

// busyUnder lists the keys with prefix that have a task waiting or
// running, the prefix cut off.
func (w *writer) busyUnder(prefix string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for k := range w.tasks {
		if rest, ok := strings.CutPrefix(k, prefix); ok {
			out = append(out, rest)
		}
	}
	for k, on := range w.running {
		if rest, ok := strings.CutPrefix(k, prefix); ok && on {
			out = append(out, rest)
		}
	}
	return out
}

// cancel drops key's waiting task and waits for its running one to end:
// after it, no write queued for key before it is made.
func (w *writer) cancel(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.tasks, key)
	for w.running[key] {
		w.idle.Wait()
	}
}

// run makes do asynchronous and runs tasks on workers goroutines until ctx
// ends; tasks still waiting then are dropped (the next leader's cycles
// decide again from what the API server says).
func (w *writer) run(ctx context.Context, workers int) {
	w.mu.Lock()
	w.async = true
	w.mu.Unlock()
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for w.next(ctx) {
			}
		})
	}
	<-ctx.Done()
	w.queue.ShutDown()
	wg.Wait()
}

// next runs the task of the next key; false once the queue is shut down.
func (w *writer) next(ctx context.Context) bool {
	key, quit := w.queue.Get()
	if quit {
		return false
	}
	defer w.queue.Done(key)
	if ctx.Err() != nil {
		return false
	}
	w.mu.Lock()
	task := w.tasks[key]
	delete(w.tasks, key)
	if task != nil {
		w.running[key] = true
	}
	w.mu.Unlock()
	if task == nil {
		return true
	}
	task(ctx)
	if w.done != nil {
		w.done()
	}
	w.mu.Lock()
	delete(w.running, key)
	w.idle.Broadcast()
	w.mu.Unlock()
	return true
}

// markPending gives p, of queue, the PodScheduled reason and message (through the
// writer) and counts it in res. A pod told a reason is not told the same
// reason again within the binder's MessageRefresh, whatever the message:
// the binder's rule (it reads the pod's condition), applied here from
// memory because with writes off the cycle the next cycles run before the
// informer shows the last write, and would write it again.
func (s *Scheduler) markPending(ctx context.Context, p *corev1.Pod, queue, reason, msg string, res *Result) {
	res.pending(queue, reason, p)
	if !s.said.say(p.UID, reason, msg, s.clock.Now()) {
		return
	}
	s.writes.do(ctx, pendingKey(p), func(ctx context.Context) {
		if err := s.deps.Binder.MarkPending(ctx, p, reason, msg); err != nil {
			klog.FromContext(ctx).V(2).Info("Writing pending reason failed", "pod", klog.KObj(p), "reason", reason, "err", err)
			s.said.failed(p.UID, reason, msg) // the next cycle tries again
		}
	})
}

// pendingKey is the writer's key of p's pending reason.
func pendingKey(p *corev1.Pod) string {
	return "pending/" + string(p.UID) + "/" + p.Namespace + "/" + p.Name
}

// unsay cancels a pending reason queued for p and forgets it: p is about to
// be bound, and a reason written after its binding would say PodScheduled
// False on a bound pod. Should the binding fail, the next cycle says the
// reason again.
func (s *Scheduler) unsay(p *corev1.Pod) {
	s.writes.cancel(pendingKey(p))
	s.said.unsay(p.UID)
}

// forgetSaid drops what markPending remembers once the message refresh
// has passed: by then the informer shows the write, and the binder's own
// check (binder.Pending, MessageRefresh) reads the pod.
func (s *Scheduler) forgetSaid() {
	s.said.forgetOld(s.clock.Now())
}

// writeOrder is the order the writer runs its keys in (a workqueue.Queue;
// the workqueue calls it under its own lock). With one first-come queue, a
// tenant's 50,000 invalid or incomplete-gang pods queued 50,000 pending
// reasons ahead of another team's reservation, and the fractions waiting
// for it waited for all of them (issue 25, item 6). So:
//
//  1. reservation creations first, in arrival order: admitted work waits
//     for them (its pods bind once the reservation holds the GPU), and
//     there are at most as many as GPUs asked for, which quota bounds;
//  2. then queue status writes (one key per Queue);
//  3. then everything else - pending reasons - taking turns between
//     namespaces, one key each, in arrival order within a namespace.
//
// Bindings do not go through the writer (bind workers); one namespace's
// pending pods can delay only its own reasons by more than one write per
// namespace.
type writeOrder struct {
	reserve []string            // reservation keys, oldest first
	queues  []string            // queue status keys, oldest first
	byNS    map[string][]string // namespace -> its other keys, oldest first
	turns   []string            // namespaces with keys in byNS, next turn first
	n       int
}

func newWriteOrder() *writeOrder { return &writeOrder{byNS: map[string][]string{}} }

// writeNamespace is the namespace a pending key is for ("" for other keys).
func writeNamespace(key string) string {
	rest, ok := strings.CutPrefix(key, "pending/")
	if !ok {
		return ""
	}
	parts := strings.SplitN(rest, "/", 3) // uid/namespace/name
	if len(parts) < 3 {
		return ""
	}
	return parts[1]
}

// Touch leaves a key queued again where it is.
func (o *writeOrder) Touch(string) {}

// Push queues key in its class.
func (o *writeOrder) Push(key string) {
	o.n++
	switch {
	case strings.HasPrefix(key, reserveKey):
		o.reserve = append(o.reserve, key)
	case strings.HasPrefix(key, queueStatusKey):
		o.queues = append(o.queues, key)
	default:
		ns := writeNamespace(key)
		if len(o.byNS[ns]) == 0 {
			o.turns = append(o.turns, ns)
		}
		o.byNS[ns] = append(o.byNS[ns], key)
	}
}

// Len is the number of keys queued.
func (o *writeOrder) Len() int { return o.n }

// Pop takes the next key (see writeOrder); the workqueue calls it only
// when Len is above zero.
func (o *writeOrder) Pop() string {
	o.n--
	switch {
	case len(o.reserve) > 0:
		return popFront(&o.reserve)
	case len(o.queues) > 0:
		return popFront(&o.queues)
	}
	ns := popFront(&o.turns)
	keys := o.byNS[ns]
	key := popFront(&keys)
	if len(keys) == 0 {
		delete(o.byNS, ns)
	} else {
		o.byNS[ns] = keys
		o.turns = append(o.turns, ns)
	}
	return key
}

func popFront(q *[]string) string {
	k := (*q)[0]
	(*q)[0] = ""
	*q = (*q)[1:]
	return k
}
