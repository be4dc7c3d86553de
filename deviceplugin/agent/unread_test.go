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

// TestAReadThatFailsOnlyInTheAgentOwesARebuild: a MIG read that fails only
// while the agent builds what it serves (the MIG layout manager's own
// checks read the GPU fine, before and after) leaves the GPU out, and the
// agent owes the manager a rebuild, so that the GPU is served again at the
// manager's next check instead of staying out until some other change: on
// the device-plugin path (resource.Build) and in mode dra (a GPU in mode
// mig, migInstances).
func TestAReadThatFailsOnlyInTheAgentOwesARebuild(t *testing.T) {
	tests := []struct {
		name string
		// leaveOut runs the agent's read of GPU 3 while it fails, and checks
		// that the GPU was left out.
		leaveOut func(t *testing.T, ctx context.Context, a *Agent, mock *nvidia.Mock, gpus []nvidia.GPU)
	}{
		{name: "device plugin", leaveOut: func(t *testing.T, ctx context.Context, a *Agent, mock *nvidia.Mock, gpus []nvidia.GPU) {
			f, err := config.Parse([]byte("version: v1\ndefault:\n  mode: fraction\n"))
			if err != nil {
				t.Fatal(err)
			}
			res, err := a.build(ctx, f, resource.Deps{MIG: mock})
			if err != nil {
				t.Fatal(err)
			}
			whole := -1
			for _, r := range res {
				if r.Name() == "nvidia.com/gpu" {
					whole = len(r.Devices())
				}
			}
			if whole != len(gpus)-1 {
				t.Fatalf("%d whole GPUs served, want %d (GPU 3 left out)", whole, len(gpus)-1)
			}
		}},
		{name: "dra, a GPU in mode mig", leaveOut: func(t *testing.T, ctx context.Context, a *Agent, mock *nvidia.Mock, gpus []nvidia.GPU) {
			if gis := a.migInstances(ctx, gpus[3]); gis != nil {
				t.Fatalf("MIG instances %v of a GPU NVML cannot read", gis)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
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
			clk := testingclock.NewFakeClock(time.Unix(1_700_000_000, 0))
			retried := make(chan struct{}, 1)
			none := func(context.Context) (map[string][]string, error) { return map[string][]string{}, nil }
			a := &Agent{gpus: gpus, lib: mock}
			a.migLayout = miglayout.NewManager(mock, gpus, miglayout.Options{Allocations: none, Clock: clk,
				Retry: func(context.Context) error {
					select {
					case retried <- struct{}{}:
					default:
					}
					return nil
				}})

			mock.FailMIGReads(gpus[3].UUID, errors.New("GPU is lost"))
			tc.leaveOut(t, ctx, a, mock, gpus)
			mock.FailMIGReads(gpus[3].UUID, nil)

			go func() { _ = a.migLayout.Run(ctx) }()
			deadline := time.After(30 * time.Second) // generous: a loaded CI machine under -race
			for {
				if clk.HasWaiters() {
					clk.Step(5 * time.Second)
				}
				select {
				case <-retried:
					return
				case <-deadline:
					t.Fatal("no rebuild at the manager's checks after the agent left a GPU out")
				case <-time.After(20 * time.Millisecond):
				}
			}
		})
	}
}
