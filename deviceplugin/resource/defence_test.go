package resource

import (
	"errors"
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
			{"replica", NewTimeslice(TimesliceOptions{Sharing: timeslice.Sharing{Replicas: 4}, GPUs: gs, Strategy: strategy, Usage: fakeUsage{}}), []string{"GPU-0::1"}},
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

// TestModeChangeNeverSharesAHeldGPU: an admin's config change moves GPUs
// between modes while pods still hold them (the kubelet keeps their
// devices until they end). Time-sliced replicas must not go to a GPU a pod
// holds whole or that carries fraction units, and fraction units must not
// go to a GPU that carries replicas: each would put a second tenant on a
// GPU beyond what the first was promised.
func TestModeChangeNeverSharesAHeldGPU(t *testing.T) {
	for _, tc := range []struct {
		name  string
		usage GPUUsage // of GPU-0; GPU-1 is free
	}{
		{"held whole (exclusive before)", GPUUsage{WholeHolder: "victims/trainer"}},
		{"held by a reservation for fractions (fraction before)", GPUUsage{WholeHolder: api.ReservationNamespace + "/" + api.ReservationNamePrefix + "n-0", WholeHolderIsReservation: true, Units: 60}},
		{"fraction units without a reservation", GPUUsage{Units: 60}},
	} {
		t.Run("replicas on a GPU "+tc.name, func(t *testing.T) {
			r := NewTimeslice(TimesliceOptions{Sharing: timeslice.Sharing{Replicas: 4}, GPUs: gpus(2), Usage: fakeUsage{"GPU-0": tc.usage}})
			all := []string{"GPU-0::0", "GPU-0::1", "GPU-0::2", "GPU-0::3", "GPU-1::0", "GPU-1::1", "GPU-1::2", "GPU-1::3"}
			for range 2 { // the least loaded GPU first: GPU-0 would be chosen on a tie
				ids, err := r.Preferred(t.Context(), all, nil, 1)
				if err != nil {
					t.Fatalf("Preferred: %v", err)
				}
				if gpu, _, _ := ParseUnitID(ids[0]); gpu != "GPU-1" {
					t.Errorf("Preferred() = %v, want a replica of GPU-1 (GPU-0 is %s)", ids, tc.name)
				}
				all = all[1:] // GPU-0 loses a replica: it is now the less loaded
			}
			if _, err := r.Allocate(t.Context(), []string{"GPU-0::3"}); err == nil || !errors.Is(err, ErrHeldOrShared) {
				t.Errorf("Allocate(GPU-0::3) error = %v, want %v", err, ErrHeldOrShared)
			}
		})
	}
	t.Run("fraction units on a GPU carrying replicas (timeslice before)", func(t *testing.T) {
		f := NewFraction(FractionOptions{GPUs: gpus(2), Usage: fakeUsage{"GPU-1": {Replicas: 3}}, Hint: &fakeHint{gpu: "GPU-1"}})
		ids, err := f.Preferred(t.Context(), allUnits(2, map[int]int{0: 50}), nil, 10)
		if err != nil {
			t.Fatalf("Preferred: %v", err)
		}
		if gpu, _ := GPUOfUnits(ids); gpu != "GPU-0" {
			t.Errorf("Preferred() put the fraction on %s, want GPU-0 (GPU-1 carries time-sliced replicas)", gpu)
		}
		if _, err := f.Allocate(t.Context(), units("GPU-1", 0, 10)); err == nil || !errors.Is(err, ErrHeldOrShared) {
			t.Errorf("Allocate(10 units of GPU-1) error = %v, want %v", err, ErrHeldOrShared)
		}
	})
	t.Run("replicas without the kubelet's allocations", func(t *testing.T) {
		r := NewTimeslice(TimesliceOptions{Sharing: timeslice.Sharing{Replicas: 4}, GPUs: gpus(1)})
		if _, err := r.Allocate(t.Context(), []string{"GPU-0::0"}); !errors.Is(err, ErrUsageUnknown) {
			t.Errorf("Allocate without usage: %v, want %v", err, ErrUsageUnknown)
		}
	})
}
