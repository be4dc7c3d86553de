package scheduler

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// startWriter runs w with one worker until the test ends.
func startWriter(t *testing.T, w *writer) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.run(ctx, 1)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	// run makes do asynchronous before it starts the workers.
	deadline := time.Now().Add(5 * time.Second)
	for {
		w.mu.Lock()
		async := w.async
		w.mu.Unlock()
		if async {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("writer did not start")
		}
		time.Sleep(time.Millisecond)
	}
}

// blockWorker queues a task on key that runs until the returned function
// is called, and waits for it to start.
func blockWorker(t *testing.T, w *writer, key string) (release func()) {
	t.Helper()
	started, stop := make(chan struct{}), make(chan struct{})
	w.do(t.Context(), key, func(context.Context) {
		close(started)
		<-stop
	})
	select {
	case <-started:
	case <-time.After(5 * time.Second):
		t.Fatal("blocking task did not start")
	}
	release = sync.OnceFunc(func() { close(stop) })
	t.Cleanup(release) // before the writer stops (cleanups run last first)
	return release
}

// waitFor waits until cond holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestWriterInlineUntilRun(t *testing.T) {
	w := newWriter()
	ran := false
	w.do(t.Context(), "k", func(context.Context) { ran = true })
	if !ran {
		t.Fatal("a task queued before run was not run inline")
	}
}

// TestWriterNewestTaskWins: two tasks queued for one key while the worker
// is busy run as one, the newer.
func TestWriterNewestTaskWins(t *testing.T) {
	w := newWriter()
	startWriter(t, w)
	release := blockWorker(t, w, "other")
	var mu sync.Mutex
	var got []string
	for _, v := range []string{"old", "new"} {
		w.do(t.Context(), "k", func(context.Context) {
			mu.Lock()
			got = append(got, v)
			mu.Unlock()
		})
	}
	if !w.busy("k") {
		t.Error("busy(k) = false with a task waiting")
	}
	release()
	waitFor(t, "the task of k", func() bool { return !w.busy("k") })
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || got[0] != "new" {
		t.Errorf("ran %v, want [new]", got)
	}
}

// TestWriterCancel: cancel drops a waiting task and waits for a running
// one: after it returns, nothing queued before it is written.
func TestWriterCancel(t *testing.T) {
	w := newWriter()
	startWriter(t, w)
	release := blockWorker(t, w, "k")
	dropped := make(chan struct{}, 1)
	w.do(t.Context(), "k", func(context.Context) { dropped <- struct{}{} })
	returned := make(chan struct{})
	go func() {
		w.cancel("k")
		close(returned)
	}()
	select {
	case <-returned:
		t.Fatal("cancel returned while the key's task was running")
	case <-time.After(50 * time.Millisecond):
	}
	release()
	select {
	case <-returned:
	case <-time.After(5 * time.Second):
		t.Fatal("cancel did not return once the running task ended")
	}
	// The worker is free: a task on another key runs, the dropped one never.
	ran := make(chan struct{})
	w.do(t.Context(), "later", func(context.Context) { close(ran) })
	select {
	case <-ran:
	case <-time.After(5 * time.Second):
		t.Fatal("a later task did not run")
	}
	select {
	case <-dropped:
		t.Error("the task cancelled while waiting ran")
	default:
	}
}

// TestWriterBusyUnder: the keys under a prefix with a task running or
// waiting are listed (prefix cut off), and no longer once their tasks ended.
func TestWriterBusyUnder(t *testing.T) {
	w := newWriter()
	startWriter(t, w)
	release := blockWorker(t, w, "reserve/n1/GPU-a") // running
	w.do(t.Context(), "reserve/n2/GPU-b", func(context.Context) {})
	w.do(t.Context(), "pending/default/p", func(context.Context) {})
	got := w.busyUnder("reserve/")
	slices.Sort(got)
	if want := []string{"n1/GPU-a", "n2/GPU-b"}; !slices.Equal(got, want) {
		t.Errorf("busy under reserve/: %v, want %v", got, want)
	}
	release()
	waitFor(t, "the tasks to end", func() bool { return len(w.busyUnder("")) == 0 })
}

// TestOneTeamsPendingReasonsDoNotHoldUpOthersWrites (issue 25, item 6): a
// tenant's 50,000 invalid pods queue 50,000 pending reasons on the one
// writer; a reservation another team's fraction waits for, queued after
// them, ran after all 50,000 (and that team's own pending reason too).
// Reservations run first, and pending reasons take turns by namespace.
func TestOneTeamsPendingReasonsDoNotHoldUpOthersWrites(t *testing.T) {
	const flood = 50000
	w := newWriter()
	startWriter(t, w)
	release := blockWorker(t, w, "block")
	var mu sync.Mutex
	ran := map[string]int{} // key -> its place in the order the keys ran
	record := func(key string) func(context.Context) {
		return func(context.Context) {
			mu.Lock()
			ran[key] = len(ran)
			mu.Unlock()
		}
	}
	for i := range flood {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a-ns", Name: fmt.Sprintf("bad-%d", i), UID: types.UID(fmt.Sprintf("uid-a-%d", i))}}
		w.do(t.Context(), pendingKey(p), record(pendingKey(p)))
	}
	other := pendingKey(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b-ns", Name: "over-quota", UID: "uid-b"}})
	w.do(t.Context(), other, record(other))
	reservation := reserveKey + "n1/GPU-1"
	w.do(t.Context(), reservation, record(reservation))
	start := time.Now()
	release()

	deadline := time.Now().Add(60 * time.Second)
	for {
		mu.Lock()
		_, r := ran[reservation]
		_, o := ran[other]
		mu.Unlock()
		if r && o {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting for the other team's writes")
		}
		time.Sleep(time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("reservation ran %d-th, team-b's reason %d-th, %v after the worker was free", ran[reservation], ran[other], time.Since(start))
	if got := ran[reservation]; got > 0 {
		t.Errorf("the reservation ran after %d other writes, want first", got)
	}
	// One write of team-a's before it, at most, and the reservation.
	if got := ran[other]; got > 2 {
		t.Errorf("team-b's pending reason ran after %d other writes, want at most 2", got)
	}
}

// TestWriteOrder: reservations, then queue status, then pending reasons by
// namespace in turn, each class in arrival order.
func TestWriteOrder(t *testing.T) {
	o := newWriteOrder()
	key := func(ns, name string) string {
		return pendingKey(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(ns + name)}})
	}
	for _, k := range []string{key("a", "1"), key("a", "2"), key("a", "3"), queueStatusKey + "qa", key("b", "1"), reserveKey + "n/g1", key("c", "1"), reserveKey + "n/g2", key("b", "2"), "other"} {
		o.Push(k)
	}
	var got []string
	for o.Len() > 0 {
		got = append(got, o.Pop())
	}
	want := []string{reserveKey + "n/g1", reserveKey + "n/g2", queueStatusKey + "qa",
		key("a", "1"), key("b", "1"), key("c", "1"), "other", key("a", "2"), key("b", "2"), key("a", "3")}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("order (-want +got):\n%s", diff)
	}
}
