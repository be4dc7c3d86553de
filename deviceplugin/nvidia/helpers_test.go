package nvidia

import (
	"context"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"
)

// testTimeout bounds every wait in these tests.
const testTimeout = 10 * time.Second

// eventually polls cond every 10ms until it holds, failing the test with
// cond's last message after testTimeout.
func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, msg := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not true after %v: %s", what, testTimeout, msg)
		}
		<-tick.C
	}
}

// testContext returns a context logging to t, cancelled when the test ends.
func testContext(t *testing.T) context.Context {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	return ctx
}

// newTestMock builds a Mock of model and initializes it.
func newTestMock(t *testing.T, model string) *Mock {
	t.Helper()
	m, err := NewMock(model)
	if err != nil {
		t.Fatalf("NewMock(%q): %v", model, err)
	}
	if err := m.Init(); err != nil {
		t.Fatalf("Init: %v", err)
	}
	// WatchXids goroutines end within one wait after their ctx; keep that
	// short so each test does not idle for a second.
	m.xidWait = 20 * time.Millisecond
	t.Cleanup(func() {
		if err := m.Shutdown(); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return m
}

// receive returns the next event on ch, failing after testTimeout.
func receive(t *testing.T, ch <-chan XidEvent) XidEvent {
	t.Helper()
	select {
	case ev, ok := <-ch:
		if !ok {
			t.Fatal("Xid channel closed, want an event")
		}
		return ev
	case <-time.After(testTimeout):
		t.Fatalf("no Xid event after %v", testTimeout)
		return XidEvent{}
	}
}

// waitClosed drains ch until it is closed, failing after testTimeout.
func waitClosed(t *testing.T, ch <-chan XidEvent) {
	t.Helper()
	deadline := time.After(testTimeout)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatalf("Xid channel not closed after %v", testTimeout)
		}
	}
}
