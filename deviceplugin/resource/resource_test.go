package resource

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/config"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
)

// gpus builds n H100-like GPUs with 80 GiB each.
func gpus(n int) []nvidia.GPU {
	out := make([]nvidia.GPU, n)
	for i := range out {
		out[i] = nvidia.GPU{Index: i, UUID: fmt.Sprintf("GPU-%d", i), Minor: i, MemoryBytes: 80 << 30}
	}
	return out
}

// units lists unit IDs k in [from, to) of a GPU.
func units(gpu string, from, to int) []string {
	var out []string
	for k := from; k < to; k++ {
		out = append(out, UnitID(gpu, k))
	}
	return out
}

// allUnits lists every unit of the GPUs, minus the used ones per GPU index.
func allUnits(n int, used map[int]int) []string {
	var out []string
	for i := 0; i < n; i++ {
		out = append(out, units(fmt.Sprintf("GPU-%d", i), used[i], api.UnitsPerGPU)...)
	}
	return out
}

// fakeUsage is a UsageSource that always answers.
type fakeUsage map[string]GPUUsage

func (f fakeUsage) Usage(context.Context) (map[string]GPUUsage, error) { return f, nil }

// failingUsage is a UsageSource whose next call fails with nextErr (once),
// as the kubelet's PodResources does while the kubelet restarts.
type failingUsage struct {
	fakeUsage
	nextErr error
}

func (f *failingUsage) Usage(ctx context.Context) (map[string]GPUUsage, error) {
	if err := f.nextErr; err != nil {
		f.nextErr = nil
		return nil, err
	}
	return f.fakeUsage.Usage(ctx)
}

type fakeHint struct {
	gpu       string
	refusal   error
	allocated []string
}

func (h *fakeHint) GPUFor(int) (string, bool) { return h.gpu, h.gpu != "" }
func (h *fakeHint) Refusal(int) error         { return h.refusal }
func (h *fakeHint) Allocated(_ context.Context, uuid string, units int) {
	h.allocated = append(h.allocated, fmt.Sprintf("%s:%d", uuid, units))
}

// fakeReservations is a ReservationHint: a reservation waits for gpu, and
// only is what ReservationOnly answers.
type fakeReservations struct {
	gpu   string
	only  bool
	taken []string
}

func (r *fakeReservations) ReservationGPU() (string, bool) { return r.gpu, r.gpu != "" }
func (r *fakeReservations) ReservationTaken(uuid string)   { r.taken = append(r.taken, uuid) }
func (r *fakeReservations) ReservationOnly(_ context.Context, u string) bool {
	return r.only && u == r.gpu
}

func TestUnitIDRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		id      string
		gpu     string
		k       int
		wantErr bool
	}{
		{id: "GPU-abc::0", gpu: "GPU-abc", k: 0},
		{id: "GPU-a-b-c::99", gpu: "GPU-a-b-c", k: 99},
		{id: "MIG-x::7", gpu: "MIG-x", k: 7},
		{id: "GPU-abc", wantErr: true},
		{id: "::3", wantErr: true},
		{id: "GPU-abc::", wantErr: true},
		{id: "GPU-abc::-1", wantErr: true},
		{id: "GPU-abc::x", wantErr: true},
	} {
		t.Run(tc.id, func(t *testing.T) {
			gpu, k, err := ParseUnitID(tc.id)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("ParseUnitID(%q) = %q, %d; want an error", tc.id, gpu, k)
				}
				return
			}
			if err != nil || gpu != tc.gpu || k != tc.k {
				t.Fatalf("ParseUnitID(%q) = %q, %d, %v; want %q, %d", tc.id, gpu, k, err, tc.gpu, tc.k)
			}
			if got := UnitID(gpu, k); got != tc.id {
				t.Errorf("UnitID(%q, %d) = %q, want %q", gpu, k, got, tc.id)
			}
		})
	}
}

func TestGPUOfUnits(t *testing.T) {
	if g, err := GPUOfUnits(units("GPU-1", 0, 30)); err != nil || g != "GPU-1" {
		t.Errorf("GPUOfUnits(30 units of GPU-1) = %q, %v", g, err)
	}
	_, err := GPUOfUnits(append(units("GPU-1", 0, 2), units("GPU-2", 0, 2)...))
	if err == nil || !strings.Contains(err.Error(), "must stay on one GPU") {
		t.Errorf("GPUOfUnits(two GPUs) error = %v, want one naming the one-GPU rule", err)
	}
	if _, err := GPUOfUnits(nil); err == nil {
		t.Error("GPUOfUnits(nil) gave no error")
	}
}

func TestFractionPreferred(t *testing.T) {
	for _, tc := range []struct {
		name        string
		available   []string
		mustInclude []string
		size        int
		usage       UsageSource
		hint        string
		refusal     string
		unhealthy   string
		wantGPU     string
		wantErr     string
	}{
		{name: "empty node takes the first GPU", available: allUnits(8, nil), size: 30, wantGPU: "GPU-0"},
		{name: "best fit picks the fullest GPU that fits", available: allUnits(4, map[int]int{0: 80, 1: 50, 2: 65}), size: 30, wantGPU: "GPU-2"},
		{name: "a 60 does not fit beside a 60", available: allUnits(2, map[int]int{0: 60}), size: 60, wantGPU: "GPU-1"},
		{name: "coordinator's GPU, held by a reservation, wins over best fit", available: allUnits(4, map[int]int{1: 50}), size: 30, hint: "GPU-3",
			usage: fakeUsage{"GPU-3": {WholeHolder: "gpufrac-system/gpufrac-reservation-3", WholeHolderIsReservation: true}}, wantGPU: "GPU-3"},
		{name: "coordinator's GPU without a reservation is not honoured", available: allUnits(4, map[int]int{1: 50}), size: 30, hint: "GPU-3", wantGPU: "GPU-1"},
		{name: "coordinator's GPU without room falls back", available: allUnits(2, map[int]int{1: 90}), size: 30, hint: "GPU-1",
			usage: fakeUsage{"GPU-1": {WholeHolder: "gpufrac-system/gpufrac-reservation-1", WholeHolderIsReservation: true}}, wantGPU: "GPU-0"},
		{name: "coordinator's GPU held whole by another pod is not honoured", available: allUnits(2, nil), size: 10, hint: "GPU-1",
			usage: fakeUsage{"GPU-1": {WholeHolder: "victims/trainer"}}, wantGPU: "GPU-0"},
		{name: "unhealthy coordinator's GPU is not honoured", available: allUnits(2, nil), size: 10, hint: "GPU-1", unhealthy: "GPU-1",
			usage: fakeUsage{"GPU-1": {WholeHolder: "gpufrac-system/gpufrac-reservation-1", WholeHolderIsReservation: true}}, wantGPU: "GPU-0"},
		{name: "every GPU held whole by other pods: refused", available: allUnits(2, nil), size: 10,
			usage:   fakeUsage{"GPU-0": {WholeHolder: "a/x"}, "GPU-1": {WholeHolder: "a/y"}, "GPU-2": {WholeHolder: "a/z"}},
			wantErr: "no GPU on this node has 10 free fraction units and is not held whole by another pod"},
		{name: "GPU held whole by a pod is skipped", available: allUnits(2, nil), size: 10,
			usage: fakeUsage{"GPU-0": {WholeHolder: "default/trainer"}}, wantGPU: "GPU-1"},
		{name: "GPU held by a reservation is used", available: allUnits(2, map[int]int{1: 20}), size: 10,
			usage: fakeUsage{"GPU-0": {WholeHolder: "gpufrac-reservations/gpufrac-reservation-x", WholeHolderIsReservation: true}}, wantGPU: "GPU-1"},
		{name: "an empty reserved GPU wins over an empty free one", available: allUnits(3, nil), size: 10,
			usage: fakeUsage{"GPU-2": {WholeHolder: "gpufrac-reservations/gpufrac-reservation-y", WholeHolderIsReservation: true}}, wantGPU: "GPU-2"},
		{name: "unhealthy GPU is skipped", available: allUnits(2, nil), size: 10, unhealthy: "GPU-0", wantGPU: "GPU-1"},
		{name: "must-include pins the GPU", available: allUnits(3, nil), mustInclude: units("GPU-2", 5, 6), size: 10, wantGPU: "GPU-2"},
		{name: "must-include across GPUs fails", available: allUnits(3, nil), mustInclude: []string{UnitID("GPU-0", 1), UnitID("GPU-1", 1)}, size: 10, wantErr: "one GPU"},
		{name: "over 100 units fails", available: allUnits(2, nil), size: 101, wantErr: "at most 100 units"},
		{name: "nothing fits on one GPU", available: allUnits(2, map[int]int{0: 50, 1: 50}), size: 60, wantErr: "no GPU on this node has 60 free fraction units"},
		{name: "the kubelet's allocations unknown: refused", available: allUnits(2, nil), size: 10,
			usage: &failingUsage{nextErr: errors.New("connection refused")}, wantErr: "cannot tell which GPUs are held whole"},
		{name: "init-container fraction: refused", available: allUnits(2, nil), size: 10, refusal: "only init containers ask", wantErr: "only init containers ask"},
		{name: "unknown device", available: []string{"GPU-9::1"}, size: 1, wantErr: "unknown device"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := FractionOptions{GPUs: gpus(8), Health: func(u string) bool { return u != tc.unhealthy }, Usage: fakeUsage{}}
			if tc.usage != nil {
				o.Usage = tc.usage
			}
			if tc.hint != "" || tc.refusal != "" {
				h := &fakeHint{gpu: tc.hint}
				if tc.refusal != "" {
					h.refusal = errors.New(tc.refusal)
				}
				o.Hint = h
			}
			ids, err := NewFraction(o).Preferred(t.Context(), tc.available, tc.mustInclude, tc.size)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Preferred() error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Preferred() error = %v", err)
			}
			if len(ids) != tc.size {
				t.Fatalf("Preferred() gave %d IDs, want %d", len(ids), tc.size)
			}
			gpu, err := GPUOfUnits(ids)
			if err != nil {
				t.Fatalf("Preferred() spread units: %v", err)
			}
			if gpu != tc.wantGPU {
				t.Errorf("Preferred() chose %s, want %s", gpu, tc.wantGPU)
			}
			for _, m := range tc.mustInclude {
				if !contains(ids, m) {
					t.Errorf("Preferred() dropped must-include %s", m)
				}
			}
			seen := map[string]bool{}
			for _, id := range ids {
				if seen[id] || !contains(tc.available, id) {
					t.Errorf("Preferred() returned %s twice or not available", id)
				}
				seen[id] = true
			}
		})
	}
}

func TestFractionAllocate(t *testing.T) {
	h := &fakeHint{}
	usage := &failingUsage{fakeUsage: fakeUsage{"GPU-3": {WholeHolder: "gpufrac-system/gpufrac-reservation-3", WholeHolderIsReservation: true}}}
	f := NewFraction(FractionOptions{GPUs: gpus(8), Hint: h, Usage: usage})
	resp, err := f.Allocate(t.Context(), units("GPU-3", 0, 30))
	if err != nil {
		t.Fatalf("Allocate(30 units) error = %v", err)
	}
	// No CUDA_MPS_* variables: no MPS daemon applies them (issue 25).
	wantEnv := map[string]string{
		api.EnvMemoryLimitMiB: "24576",
		api.EnvVisibleDevices: "void",
	}
	if diff := cmp.Diff(wantEnv, resp.Envs); diff != "" {
		t.Errorf("Allocate() envs (-want +got):\n%s", diff)
	}
	var paths []string
	for _, d := range resp.Devices {
		paths = append(paths, d.HostPath)
	}
	if diff := cmp.Diff([]string{"/dev/nvidia3", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}, paths); diff != "" {
		t.Errorf("Allocate() device specs (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"GPU-3:30"}, h.allocated); diff != "" {
		t.Errorf("hint told (-want +got):\n%s", diff)
	}

	if _, err := f.Allocate(t.Context(), append(units("GPU-0", 0, 5), units("GPU-1", 0, 5)...)); err == nil {
		t.Error("Allocate() across two GPUs succeeded")
	}
	if _, err := f.Allocate(t.Context(), allUnits(2, nil)[:101]); !errors.Is(err, ErrTooManyUnits) {
		t.Errorf("Allocate(101 units) error = %v, want ErrTooManyUnits", err)
	}

	// Failure paths: the kubelet's allocations unreadable, a GPU held
	// whole by another pod, a size only init containers ask for. None of
	// them is recorded as allocated.
	usage.nextErr = errors.New("connection refused")
	if _, err := f.Allocate(t.Context(), units("GPU-2", 0, 10)); !errors.Is(err, ErrUsageUnknown) {
		t.Errorf("Allocate with PodResources failing: error = %v, want ErrUsageUnknown", err)
	}
	usage.fakeUsage["GPU-1"] = GPUUsage{WholeHolder: "victims/trainer"}
	if _, err := f.Allocate(t.Context(), units("GPU-1", 0, 10)); !errors.Is(err, ErrHeldWhole) || !strings.Contains(err.Error(), "victims/trainer") {
		t.Errorf("Allocate on a GPU held whole: error = %v, want ErrHeldWhole naming victims/trainer", err)
	}
	h.refusal = errors.New("only init containers ask 10 units")
	if _, err := f.Allocate(t.Context(), units("GPU-2", 0, 10)); err == nil || !strings.Contains(err.Error(), "only init containers") {
		t.Errorf("Allocate refused by the hint: error = %v", err)
	}
	if diff := cmp.Diff([]string{"GPU-3:30"}, h.allocated); diff != "" {
		t.Errorf("hint told after refusals (-want +got):\n%s", diff)
	}
	if _, err := NewFraction(FractionOptions{GPUs: gpus(1)}).Allocate(t.Context(), units("GPU-0", 0, 10)); !errors.Is(err, ErrUsageUnknown) {
		t.Errorf("Allocate without PodResources: error = %v, want ErrUsageUnknown", err)
	}
}

func TestCDIStrategy(t *testing.T) {
	f := NewFraction(FractionOptions{GPUs: gpus(2), Strategy: StrategyCDI, Usage: fakeUsage{}})
	resp, err := f.Allocate(t.Context(), units("GPU-1", 0, 50))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Devices) != 0 {
		t.Errorf("CDI strategy also mounted device specs: %v", resp.Devices)
	}
	if diff := cmp.Diff([]*pluginapi.CDIDevice{{Name: "nvidia.com/gpu=GPU-1"}}, resp.CdiDevices, cmpProto()); diff != "" {
		t.Errorf("CDI devices (-want +got):\n%s", diff)
	}
	w := NewWhole(WholeOptions{GPUs: gpus(2), Strategy: StrategyCDI, Usage: fakeUsage{}})
	resp, err = w.Allocate(t.Context(), []string{"GPU-0", "GPU-1"})
	if err != nil || len(resp.CdiDevices) != 2 {
		t.Errorf("whole CDI allocate = %v, %v", resp, err)
	}
	if _, err := ParseDeviceListStrategy("envvar"); err == nil {
		t.Error("ParseDeviceListStrategy accepted envvar")
	}
}

func TestWholePreferred(t *testing.T) {
	all := []string{"GPU-0", "GPU-1", "GPU-2", "GPU-3"}
	reserved := GPUUsage{WholeHolder: "gpufrac-system/gpufrac-reservation-x", WholeHolderIsReservation: true}
	for _, tc := range []struct {
		name        string
		available   []string
		mustInclude []string
		size        int
		usage       UsageSource
		reserve     *fakeReservations
		want        []string
		wantTaken   []string
		wantErr     string
	}{
		{name: "index order without topology", available: all, size: 2, want: []string{"GPU-0", "GPU-1"}},
		{name: "skips GPUs carrying fractions", available: all, size: 2, usage: fakeUsage{"GPU-0": {Units: 30}}, want: []string{"GPU-1", "GPU-2"}},
		{name: "skips GPUs carrying replicas", available: all, size: 2, usage: fakeUsage{"GPU-1": {Replicas: 1}}, want: []string{"GPU-0", "GPU-2"}},
		{name: "never shares when clean GPUs run out", available: all, size: 4, usage: fakeUsage{"GPU-0": {Units: 30}},
			wantErr: "only 3 of the 4 GPUs free for it carry no fractions or time-sliced replicas"},
		{name: "a must-include GPU carrying fractions fails", available: all, mustInclude: []string{"GPU-0"}, size: 2, usage: fakeUsage{"GPU-0": {Replicas: 2}},
			wantErr: "must-include GPU GPU-0: it carries 0 fraction units and 2 time-sliced replicas"},
		{name: "must include", available: all, mustInclude: []string{"GPU-3"}, size: 2, want: []string{"GPU-3", "GPU-0"}},
		{name: "too few", available: all[:1], size: 2, wantErr: "only 1 of the 1 GPUs"},
		{name: "the kubelet's allocations unknown: refused", available: all, size: 1, usage: &failingUsage{nextErr: errors.New("EOF")},
			wantErr: "cannot tell which GPUs are held whole or shared"},
		{name: "a reservation gets the coordinator's clean GPU", available: all, size: 1, reserve: &fakeReservations{gpu: "GPU-2"},
			want: []string{"GPU-2"}, wantTaken: []string{"GPU-2"}},
		{name: "a reservation gets its GPU carrying fractions when only it can be asking", available: all, size: 1,
			usage: fakeUsage{"GPU-2": {Units: 40}}, reserve: &fakeReservations{gpu: "GPU-2", only: true},
			want: []string{"GPU-2"}, wantTaken: []string{"GPU-2"}},
		{name: "a GPU carrying fractions is not handed to whoever comes while a reservation waits for it", available: all, size: 1,
			usage: fakeUsage{"GPU-2": {Units: 40}, "GPU-0": reserved}, reserve: &fakeReservations{gpu: "GPU-2"},
			want: []string{"GPU-0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := WholeOptions{GPUs: gpus(4), Usage: fakeUsage{}}
			if tc.usage != nil {
				o.Usage = tc.usage
			}
			if tc.reserve != nil {
				o.Reservations = tc.reserve
			}
			got, err := NewWhole(o).Preferred(t.Context(), tc.available, tc.mustInclude, tc.size)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Preferred() = %v, %v; want an error containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Preferred() (-want +got):\n%s", diff)
			}
			if tc.reserve != nil {
				if diff := cmp.Diff(tc.wantTaken, tc.reserve.taken); diff != "" {
					t.Errorf("GPUs marked taken by a reservation (-want +got):\n%s", diff)
				}
			}
		})
	}
}

// TestWholeAllocateIsExclusive: whole-GPU Allocate never hands out a GPU
// that carries fractions or replicas, whatever chose it (the kubelet calls
// Allocate with its own choice when it skips the preferred allocation),
// except to the reservation pod that can only be asking for it.
func TestWholeAllocateIsExclusive(t *testing.T) {
	usage := &failingUsage{fakeUsage: fakeUsage{"GPU-1": {Units: 30}, "GPU-2": {Replicas: 1}}}
	res := &fakeReservations{gpu: "GPU-1"}
	w := NewWhole(WholeOptions{GPUs: gpus(4), Usage: usage, Reservations: res})
	for _, tc := range []struct {
		name    string
		ids     []string
		only    bool
		nextErr error
		wantErr error
		want    string // in the message
	}{
		{name: "clean GPUs", ids: []string{"GPU-0", "GPU-3"}},
		{name: "a GPU carrying fractions", ids: []string{"GPU-1"}, wantErr: ErrShared, want: "GPU-1: it carries 30 fraction units"},
		{name: "a GPU carrying replicas among clean ones", ids: []string{"GPU-0", "GPU-2"}, wantErr: ErrShared, want: "GPU-2: it carries 0 fraction units and 1 time-sliced replicas"},
		{name: "the reservation waiting for its shared GPU", ids: []string{"GPU-1"}, only: true},
		{name: "a shared GPU in a larger request even while its reservation waits", ids: []string{"GPU-1", "GPU-0"}, only: true, wantErr: ErrShared},
		{name: "PodResources failing", ids: []string{"GPU-0"}, nextErr: errors.New("kubelet restarting"), wantErr: ErrUsageUnknown, want: "kubelet restarting"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res.only, usage.nextErr = tc.only, tc.nextErr
			resp, err := w.Allocate(t.Context(), tc.ids)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("Allocate(%v) = %v, %v; want %v containing %q", tc.ids, resp, err, tc.wantErr, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatalf("Allocate(%v): %v", tc.ids, err)
			}
			if got := len(resp.Devices); got != len(tc.ids)+len(controlDevices) {
				t.Errorf("Allocate(%v) gave %d device specs", tc.ids, got)
			}
		})
	}
	if _, err := NewWhole(WholeOptions{GPUs: gpus(1)}).Allocate(t.Context(), []string{"GPU-0"}); !errors.Is(err, ErrUsageUnknown) {
		t.Errorf("Allocate without PodResources: error = %v, want ErrUsageUnknown", err)
	}
}

func TestDevicesCarryHealth(t *testing.T) {
	health := func(u string) bool { return u != "GPU-1" }
	f := NewFraction(FractionOptions{GPUs: gpus(2), Health: health})
	devs := f.Devices()
	if len(devs) != 200 {
		t.Fatalf("fraction devices = %d, want 200", len(devs))
	}
	for _, d := range devs {
		g, _, _ := ParseUnitID(d.ID)
		want := pluginapi.Healthy
		if g == "GPU-1" {
			want = pluginapi.Unhealthy
		}
		if d.Health != want {
			t.Fatalf("device %s health %s, want %s", d.ID, d.Health, want)
		}
	}
	w := NewWhole(WholeOptions{GPUs: gpus(2), Health: health}).Devices()
	if w[0].Health != pluginapi.Healthy || w[1].Health != pluginapi.Unhealthy {
		t.Errorf("whole devices health = %v", w)
	}
}

func TestBuild(t *testing.T) {
	f, x := config.ModeFraction, config.ModeExclusive
	res, err := Build([]config.Mode{f, f, x, x}, gpus(4), Deps{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, r := range res {
		got[r.Name()] = len(r.Devices())
	}
	if diff := cmp.Diff(map[string]int{api.ResourceGPU: 4, api.ResourceFraction: 200}, got); diff != "" {
		t.Errorf("Build() resources (-want +got):\n%s", diff)
	}
	if _, err := Build([]config.Mode{config.ModeMIG}, gpus(1), Deps{}); !errors.Is(err, ErrModeNotSupported) {
		t.Errorf("Build(mig) error = %v, want ErrModeNotSupported", err)
	}
	if _, err := Build([]config.Mode{f}, gpus(2), Deps{}); err == nil {
		t.Error("Build() with too few modes succeeded")
	}
}

func TestMemoryLimitRoundsDown(t *testing.T) {
	g := nvidia.GPU{MemoryBytes: 81559 << 20}
	if got := MemoryLimitMiB(g, 33); got != 26914 { // 81559*33/100 = 26914.47
		t.Errorf("MemoryLimitMiB(81559 MiB, 33) = %d, want 26914", got)
	}
}
