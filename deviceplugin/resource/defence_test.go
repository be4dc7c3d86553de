package resource

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/timeslice"
)

// TestSpoofedHintOntoAWholeHeldGPU reproduces issue 12's attack at the
// fraction resource: a pod's own gpufrac.io/gpu names GPU-1, which another
// pod holds whole, and asks 10 units. Neither the preferred allocation nor
// Allocate may put the fraction there.
func TestSpoofedHintOntoAWholeHeldGPU(t *testing.T) {
	usage := fakeUsage{"GPU-1": {WholeHolder: "victims/trainer"}}
	f := NewFraction(FractionOptions{GPUs: gpus(2), Usage: usage, Hint: &fakeHint{gpu: "GPU-1"}})
	ids, err := f.Preferred(t.Context(), allUnits(2, nil), nil, 10)
	if err != nil {
		t.Fatalf("Preferred: %v", err)
	}
	if gpu, _ := GPUOfUnits(ids); gpu != "GPU-0" {
		t.Errorf("Preferred() put the fraction on %s, want GPU-0 (GPU-1 is held whole by victims/trainer)", gpu)
	}
	_, err = f.Allocate(t.Context(), units("GPU-1", 0, 10))
	if err == nil || !strings.Contains(err.Error(), "victims/trainer") {
		t.Errorf("Allocate(10 units of GPU-1) error = %v, want a refusal naming the whole holder", err)
	}
}

// TestEveryAllocateSetsVisibleDevicesVoid: the responses of all four kinds
// of resources (whole, fraction, replica, MIG), with either device list
// strategy, set NVIDIA_VISIBLE_DEVICES=void, so an image's own ENV cannot
// select GPUs; the GPUs come only as device specs or CDI devices.
func TestEveryAllocateSetsVisibleDevicesVoid(t *testing.T) {
	gs := gpus(2)
	caps := filepath.Join(t.TempDir(), "mig-minors")
	if err := os.WriteFile(caps, []byte("gpu1/gi1/access 30\ngpu1/gi1/ci0/access 31\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	migDev := migDevs(gs, 2)[2] // MIG-1-0: GPU 1, GI 1, CI 0
	for _, strategy := range []DeviceListStrategy{StrategyDeviceSpecs, StrategyCDI} {
		mr, err := NewMIG(MIGOptions{Name: "nvidia.com/mig-1g.10gb", Devices: migDevs(gs, 2), GPUs: gs, Strategy: strategy, CapsFile: caps})
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			kind string
			res  Resource
			ids  []string
		}{
			{"whole", NewWhole(WholeOptions{GPUs: gs, Usage: fakeUsage{}, Strategy: strategy}), []string{"GPU-0"}},
			{"fraction", NewFraction(FractionOptions{GPUs: gs, Usage: fakeUsage{}, Strategy: strategy}), units("GPU-1", 0, 20)},
			{"replica", NewTimeslice(TimesliceOptions{Sharing: timeslice.Sharing{Replicas: 4}, GPUs: gs, Strategy: strategy}), []string{"GPU-0::1"}},
			{"MIG", mr, []string{migDev.UUID}},
		} {
			t.Run(tc.kind+"/"+string(strategy), func(t *testing.T) {
				resp, err := tc.res.Allocate(t.Context(), tc.ids)
				if err != nil {
					t.Fatalf("Allocate(%v): %v", tc.ids, err)
				}
				if got := resp.Envs[api.EnvVisibleDevices]; got != "void" {
					t.Errorf("%s = %q, want \"void\"", api.EnvVisibleDevices, got)
				}
				if len(resp.Devices) == 0 && len(resp.CdiDevices) == 0 {
					t.Errorf("no device specs and no CDI devices: %v", resp)
				}
				if strategy == StrategyDeviceSpecs && len(resp.CdiDevices) > 0 {
					t.Errorf("device-specs strategy returned CDI devices %v", resp.CdiDevices)
				}
			})
		}
	}
}
