package health

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
)

func startMock(t *testing.T) (*nvidia.Mock, []string) {
	t.Helper()
	m, err := nvidia.NewMock("dgxh100")
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Init(); err != nil {
		t.Fatal(err)
	}
	gs, err := m.GPUs()
	if err != nil {
		t.Fatal(err)
	}
	uuids := make([]string, len(gs))
	for i, g := range gs {
		uuids[i] = g.UUID
	}
	return m, uuids
}

// waitFor polls cond until it holds or 5 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestXidQuietPeriodRecovery(t *testing.T) {
	m, uuids := startMock(t)
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	var changes, xids, critical atomic.Int32
	c := NewChecker(m, uuids, Options{
		QuietPeriod:   time.Minute,
		ProbeInterval: time.Second,
		Clock:         clk,
		OnChange:      func() { changes.Add(1) },
		OnXid: func(_ nvidia.XidEvent, crit bool) {
			xids.Add(1)
			if crit {
				critical.Add(1)
			}
		},
	})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitFor(t, "the checker to subscribe", func() bool { return clk.HasWaiters() })

	// An application Xid (31) is counted and ignored.
	if err := m.InjectXid(uuids[2], 31); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "Xid 31 to be seen", func() bool { return xids.Load() == 1 })
	if !c.Healthy(uuids[2]) {
		t.Fatal("application Xid 31 marked the GPU unhealthy")
	}

	// A critical Xid (79, fallen off the bus) marks the GPU unhealthy.
	if err := m.InjectXid(uuids[2], 79); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "GPU 2 unhealthy", func() bool { return !c.Healthy(uuids[2]) })
	if diff := cmp.Diff([]string{uuids[2]}, c.Unhealthy()); diff != "" {
		t.Errorf("Unhealthy() (-want +got):\n%s", diff)
	}
	if critical.Load() != 1 || changes.Load() != 1 {
		t.Errorf("critical=%d changes=%d, want 1 and 1", critical.Load(), changes.Load())
	}

	// Not yet recovered inside the quiet period. The probe a tick runs is
	// called here directly, so the assertion follows a probe that did run at
	// this time (Run's own ticks may run it too: the result is the same).
	clk.Step(59 * time.Second)
	c.probe(ctx)
	if c.Healthy(uuids[2]) {
		t.Fatal("GPU recovered 59 s after a critical Xid, inside the 60 s quiet period")
	}
	if got := changes.Load(); got != 1 {
		t.Errorf("changes = %d after a probe inside the quiet period, want still 1", got)
	}
	// Recovered after it, by Run's own tick.
	clk.Step(2 * time.Second)
	waitFor(t, "GPU 2 healthy again", func() bool { return c.Healthy(uuids[2]) })
	if changes.Load() != 2 {
		t.Errorf("changes = %d, want 2", changes.Load())
	}
}

// TestQuietPeriodBoundary checks the quiet period itself, probe by probe on
// a fake clock: unhealthy up to the last instant of the period, healthy from
// its end, and a second critical Xid inside it starts the period again.
func TestQuietPeriodBoundary(t *testing.T) {
	m, uuids := startMock(t)
	t0 := time.Unix(1_700_000_000, 0)
	clk := clocktesting.NewFakeClock(t0)
	c := NewChecker(m, uuids, Options{QuietPeriod: time.Minute, Clock: clk})
	ctx := t.Context()
	xid := func() { c.record(ctx, nvidia.XidEvent{UUID: uuids[3], Xid: 79}) }
	healthyAt := func(d time.Duration) bool {
		clk.SetTime(t0.Add(d))
		c.probe(ctx)
		return c.Healthy(uuids[3])
	}
	xid()
	steps := []struct {
		at      time.Duration
		healthy bool
		xid     bool // a new critical Xid right after the probe
	}{
		{at: 0, healthy: false},
		{at: 59*time.Second + 999*time.Millisecond, healthy: false},
		{at: time.Minute, healthy: true},
		{at: 61 * time.Second, healthy: true, xid: true},
		{at: 120 * time.Second, healthy: false}, // 59 s after the second Xid
		{at: 121 * time.Second, healthy: true},
	}
	for _, s := range steps {
		if got := healthyAt(s.at); got != s.healthy {
			t.Errorf("at %s: healthy = %v, want %v", s.at, got, s.healthy)
		}
		if s.xid {
			xid()
		}
	}
}

func TestProbeFailureDegradesAndRecovers(t *testing.T) {
	m, uuids := startMock(t)
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	c := NewChecker(m, uuids, Options{QuietPeriod: time.Minute, ProbeInterval: time.Second, Clock: clk})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitFor(t, "the checker to start", func() bool { return clk.HasWaiters() })

	if err := m.FailGPU(uuids[5], errors.New("GPU is lost")); err != nil {
		t.Fatal(err)
	}
	clk.Step(time.Second)
	waitFor(t, "GPU 5 unhealthy", func() bool { return !c.Healthy(uuids[5]) })
	for i, u := range uuids {
		if i != 5 && !c.Healthy(u) {
			t.Errorf("GPU %d unhealthy, only 5 failed", i)
		}
	}
	if err := m.FailGPU(uuids[5], nil); err != nil {
		t.Fatal(err)
	}
	clk.Step(time.Second)
	waitFor(t, "GPU 5 healthy", func() bool { return c.Healthy(uuids[5]) })
}

func TestCustomIgnoreList(t *testing.T) {
	c := NewChecker(nil, []string{"GPU-a"}, Options{IgnoredXids: []uint64{79}})
	if !c.ignored[79] || c.ignored[31] {
		t.Errorf("ignored = %v, want only 79", c.ignored)
	}
}
