package faultpoint

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestPauserPausesAtItsPointAndThenEverywhere(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "paused")
	p, err := Parse("gang-member-bound=" + marker)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	p.Reached(ctx, "bind") // another point: passes
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("marker written before the point was reached")
	}
	done := make(chan struct{})
	go func() { defer close(done); p.Reached(ctx, "gang-member-bound") }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(marker); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no marker after the point was reached")
		}
		time.Sleep(5 * time.Millisecond)
	}
	other := make(chan struct{})
	go func() { defer close(other); p.Reached(ctx, "bind") }()
	select {
	case <-done:
		t.Fatal("Reached returned at the pause point before ctx ended")
	case <-other:
		t.Fatal("another point went on after the pause")
	case <-time.After(50 * time.Millisecond):
	}
	cancel()
	<-done
	<-other
	if p, err := Parse(""); p != nil || err != nil {
		t.Errorf("Parse(\"\") = %v, %v; want no pauser", p, err)
	}
	if _, err := Parse("=x"); err == nil {
		t.Error("Parse(\"=x\") accepted a spec without a point")
	}
}
