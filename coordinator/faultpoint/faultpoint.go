// Package faultpoint stops a process at a named moment so a test can hit it
// there - kill -9 mid-gang-bind, mid-reservation-creation - without sleeps
// that guess when the moment comes. It is wired only into binaries built
// with -tags faultinject (the chaos suite's); production builds never
// construct it, so nothing a user sets can pause a coordinator.
package faultpoint

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"

	"k8s.io/klog/v2"
)

// Pauser pauses at one point: the first time Reached is called with it,
// Pauser writes its marker file and blocks; from then on every Reached call
// blocks too, whatever its point, so none of the work the points guard goes
// on. Blocked calls return only when their ctx ends (the test kills the
// process long before).
type Pauser struct {
	at     string
	marker string

	mu     sync.Mutex
	paused bool
}

// New returns a Pauser that pauses at point and writes marker (a file path;
// "" writes none) when it does.
func New(point, marker string) *Pauser { return &Pauser{at: point, marker: marker} }

// Reached is called by the code at point; it blocks once the Pauser paused.
func (p *Pauser) Reached(ctx context.Context, point string) {
	p.mu.Lock()
	pause := p.paused || point == p.at
	first := !p.paused && pause
	p.paused = pause
	p.mu.Unlock()
	if !pause {
		return
	}
	if first {
		klog.FromContext(ctx).Info("Paused at fault point", "point", point)
		if p.marker != "" {
			if err := os.WriteFile(p.marker, []byte(point+"\n"), 0o644); err != nil {
				klog.FromContext(ctx).Error(err, "Writing the fault point marker", "marker", p.marker)
			}
		}
	}
	<-ctx.Done()
}

// Parse reads "point" or "point=marker-file" (the chaos suite's
// GPUFRAC_FAULT_PAUSE value); "" means no fault point (nil).
func Parse(spec string) (*Pauser, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return nil, nil
	}
	point, marker, _ := strings.Cut(spec, "=")
	if point == "" {
		return nil, fmt.Errorf("fault point %q: no point named", spec)
	}
	return New(point, marker), nil
}
