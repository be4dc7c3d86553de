package kubeletsim_test

import (
	"context"
	"testing"

	"github.com/gpufrac/gpufrac/tests/kubeletsim"
)

// TestRestartMidAllocate: the simulator restarts while an Allocate is
// between choosing its devices and calling the plugin (BeforeAllocate): the
// call fails, nothing is held, and once the plugin registered again the
// same pod is admitted.
func TestRestartMidAllocate(t *testing.T) {
	ctx := testContext(t)
	reached, release := make(chan struct{}), make(chan struct{})
	first := true
	k, opts := startKubelet(t, ctx, func(o *kubeletsim.Options) {
		o.BeforeAllocate = func(_ context.Context, _ kubeletsim.PodRef, _ string, _ []string) {
			if first { // called under the admission lock: no race on first
				first = false
				close(reached)
				<-release
			}
		}
	})
	startPlugin(t, ctx, opts.Dir, 4, nil)
	waitAllocatable(t, ctx, k, 4)

	done := make(chan error, 1)
	go func() {
		_, err := k.Allocate(ctx, pod("a"), "c", testResource, 2)
		done <- err
	}()
	<-reached
	if err := k.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	close(release)
	if err := <-done; err == nil {
		t.Fatal("an Allocate interrupted by a restart succeeded")
	}
	if got, _ := k.Resource(testResource); got.Allocated != 0 {
		t.Errorf("%d devices held after the interrupted Allocate, want 0", got.Allocated)
	}
	err := k.WaitForResource(waitContext(t, ctx), testResource, func(s kubeletsim.ResourceState) bool {
		return s.Registrations == 2 && s.Connected && s.Allocatable == 4
	})
	if err != nil {
		t.Fatal(err)
	}
	if a, err := k.Allocate(ctx, pod("a"), "c", testResource, 2); err != nil || len(a.DeviceIDs) != 2 {
		t.Fatalf("Allocate after re-registration: %+v, %v", a, err)
	}
}
