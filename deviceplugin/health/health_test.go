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

	// Not yet recovered inside the quiet period.
	clk.Step(59 * time.Second)
	waitFor(t, "a probe tick", func() bool { return clk.HasWaiters() })
	time.Sleep(20 * time.Millisecond) // let the tick be processed; health must not flip
	if c.Healthy(uuids[2]) {
		t.Fatal("GPU recovered before the quiet period ended")
	}
	// Recovered after it.
	clk.Step(2 * time.Second)
	waitFor(t, "GPU 2 healthy again", func() bool { return c.Healthy(uuids[2]) })
	if changes.Load() != 2 {
		t.Errorf("changes = %d, want 2", changes.Load())
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
