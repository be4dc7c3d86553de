package agent

import (
	"context"
	"errors"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/gpufrac/gpufrac/deviceplugin/config"
	"github.com/gpufrac/gpufrac/deviceplugin/miglayout"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
)

// TestABuildThatCannotReadAGPUOwesARebuild: a read that fails only in the
// agent's build (the MIG layout manager's own checks read the GPU fine,
// before and after) leaves the GPU out, and the agent owes the manager a
// rebuild, so the GPU is served again at its next check instead of staying
// out until some other change.
func TestABuildThatCannotReadAGPUOwesARebuild(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	mock, err := nvidia.NewMock("dgxh100", nvidia.WithUUIDSeed(t.Name()))
	if err != nil {
		t.Fatal(err)
	}
	if err := mock.Init(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mock.Shutdown() })
	gpus, err := mock.GPUs()
	if err != nil {
		t.Fatal(err)
	}
	f, err := config.Parse([]byte("version: v1\ndefault:\n  mode: fraction\n"))
	if err != nil {
		t.Fatal(err)
	}
	clk := testingclock.NewFakeClock(time.Unix(1_700_000_000, 0))
	retried := make(chan struct{}, 1)
	none := func(context.Context) (map[string][]string, error) { return map[string][]string{}, nil }
	a := &Agent{gpus: gpus}
	a.migLayout = miglayout.NewManager(mock, gpus, miglayout.Options{Allocations: none, Clock: clk,
		Retry: func(context.Context) error {
			select {
			case retried <- struct{}{}:
			default:
			}
			return nil
		}})

	mock.FailMIGReads(gpus[3].UUID, errors.New("GPU is lost"))
	res, err := a.build(ctx, f, resource.Deps{MIG: mock})
	mock.FailMIGReads(gpus[3].UUID, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Name() == "nvidia.com/gpu" && len(r.Devices()) != len(gpus)-1 {
			t.Fatalf("%d whole GPUs served, want GPU 3 left out", len(r.Devices()))
		}
	}

	go a.migLayout.Run(ctx)
	deadline := time.After(10 * time.Second)
	for {
		if clk.HasWaiters() {
			clk.Step(5 * time.Second)
		}
		select {
		case <-retried:
			return
		case <-deadline:
			t.Fatal("no rebuild at the manager's checks after a build left a GPU out")
		case <-time.After(20 * time.Millisecond):
		}
	}
}
