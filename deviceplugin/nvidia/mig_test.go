package nvidia

import (
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/go-cmp/cmp"

	"github.com/gpufrac/gpufrac/mig"
)

func TestProfileName(t *testing.T) {
	const a100, h100 = 40960 << 20, 81920 << 20
	tests := []struct {
		name      string
		profileID int
		slices    int
		memoryMB  uint64
		total     uint64
		want      string
	}{
		{name: "a100 1g", profileID: nvml.GPU_INSTANCE_PROFILE_1_SLICE, slices: 1, memoryMB: 4864, total: a100, want: "1g.5gb"},
		{name: "a100 1g+me", profileID: nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, slices: 1, memoryMB: 4864, total: a100, want: "1g.5gb+me"},
		{name: "a100 1g double memory", profileID: nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, slices: 1, memoryMB: 9856, total: a100, want: "1g.10gb"},
		{name: "a100 7g", profileID: nvml.GPU_INSTANCE_PROFILE_7_SLICE, slices: 7, memoryMB: 40192, total: a100, want: "7g.40gb"},
		{name: "h100 3g", profileID: nvml.GPU_INSTANCE_PROFILE_3_SLICE, slices: 3, memoryMB: 40960, total: h100, want: "3g.40gb"},
		{name: "h100 no media extensions", profileID: nvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME, slices: 1, memoryMB: 10240, total: h100, want: "1g.10gb-me"},
		{name: "all media extensions", profileID: nvml.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME, slices: 1, memoryMB: 20480, total: h100, want: "1g.20gb+me.all"},
		{name: "graphics", profileID: nvml.GPU_INSTANCE_PROFILE_2_SLICE_GFX, slices: 2, memoryMB: 20480, total: h100, want: "2g.20gb+gfx"},
		// H100 94GB: 11008 MiB is 1/8 of the GPU rounded up, times 94 GB.
		{name: "h100 nvl 1g", profileID: nvml.GPU_INSTANCE_PROFILE_1_SLICE, slices: 1, memoryMB: 11008, total: 95830 << 20, want: "1g.12gb"},
		{name: "unknown total", profileID: nvml.GPU_INSTANCE_PROFILE_1_SLICE, slices: 1, memoryMB: 10240, total: 0, want: "1g.10gb"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := ProfileName(tc.profileID, tc.slices, tc.memoryMB, tc.total); got != tc.want {
				t.Errorf("ProfileName() = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestMockMIGProfiles(t *testing.T) {
	tests := []struct {
		name  string
		model string
		want  []string // profile names by ID order
	}{
		{name: "a100 40gb", model: "dgxa100", want: []string{"1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb", "1g.5gb+me", "1g.10gb"}},
		{name: "h100 80gb", model: "dgxh100", want: []string{"1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "1g.10gb+me", "1g.20gb"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := newTestMock(t, tc.model)
			g := mustGPUs(t, m)[0]
			profs, err := m.MIGProfiles(g.UUID)
			if err != nil {
				t.Fatalf("MIGProfiles: %v", err)
			}
			var got []string
			for _, p := range profs {
				got = append(got, p.Name)
				if len(p.Placements) == 0 || p.MaxInstances == 0 || p.Slices == 0 {
					t.Errorf("profile %s: no placements, instances or slices: %+v", p.Name, p)
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("profile names (-want +got):\n%s", diff)
			}
		})
	}
	if _, err := newTestMock(t, "dgxh100").MIGProfiles("GPU-nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("MIGProfiles(unknown GPU) error = %v, want ErrNotFound", err)
	}
}

func TestMockMIGInstanceLifecycle(t *testing.T) {
	m := newTestMock(t, "dgxh100")
	g := mustGPUs(t, m)[2]
	if err := m.SetMIGMode(g.UUID, true); err != nil {
		t.Fatalf("SetMIGMode(true) on an idle GPU: %v", err)
	}
	if mode, err := m.MIGMode(g.UUID); err != nil || mode != (MIGMode{Current: true, Pending: true}) {
		t.Fatalf("MIGMode() = %+v, %v; want enabled", mode, err)
	}
	// 3g.40gb (profile 2) at slices 4-6, 1g.10gb (profile 0) at slice 0.
	big, err := m.CreateMIGInstance(g.UUID, nvml.GPU_INSTANCE_PROFILE_3_SLICE, mig.Placement{Start: 4, Size: 3})
	if err != nil {
		t.Fatalf("CreateMIGInstance(3g): %v", err)
	}
	small, err := m.CreateMIGInstance(g.UUID, nvml.GPU_INSTANCE_PROFILE_1_SLICE, mig.Placement{Start: 0, Size: 1})
	if err != nil {
		t.Fatalf("CreateMIGInstance(1g): %v", err)
	}
	got, err := m.MIGInstances(g.UUID)
	if err != nil {
		t.Fatalf("MIGInstances: %v", err)
	}
	want := []mig.GPUInstance{
		{GPU: g.UUID, ID: big.ID, ProfileID: 2, Profile: "3g.40gb", Placement: mig.Placement{Start: 4, Size: 3}, MemoryBytes: 40960 << 20,
			Devices: []mig.Device{{UUID: MockMIGUUID(g.UUID, big.ID, 0), GPU: g.UUID, GI: big.ID, CI: 0, CIProfileID: nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, Profile: "3g.40gb", Full: true, MemoryBytes: 40960 << 20}}},
		{GPU: g.UUID, ID: small.ID, ProfileID: 0, Profile: "1g.10gb", Placement: mig.Placement{Start: 0, Size: 1}, MemoryBytes: 10240 << 20,
			Devices: []mig.Device{{UUID: MockMIGUUID(g.UUID, small.ID, 0), GPU: g.UUID, GI: small.ID, CI: 0, CIProfileID: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, Profile: "1g.10gb", Full: true, MemoryBytes: 10240 << 20}}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("MIGInstances (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want[0], big); diff != "" {
		t.Errorf("CreateMIGInstance returned (-want +got):\n%s", diff)
	}
	if !strings.HasPrefix(got[0].Devices[0].UUID, "MIG-") || got[0].Devices[0].UUID == got[1].Devices[0].UUID {
		t.Errorf("MIG UUIDs %q and %q: want distinct MIG- UUIDs", got[0].Devices[0].UUID, got[1].Devices[0].UUID)
	}

	// MIG mode cannot be disabled while instances exist.
	if err := m.SetMIGMode(g.UUID, false); !errors.Is(err, ErrInUse) {
		t.Fatalf("SetMIGMode(false) with instances: error = %v, want ErrInUse", err)
	}
	if err := m.SetMIGMode(g.UUID, true); err != nil { // asking for the current mode clears the pending one
		t.Fatalf("SetMIGMode(true) again: %v", err)
	}
	for _, gi := range []int{big.ID, small.ID} {
		if err := m.DestroyMIGInstance(g.UUID, gi); err != nil {
			t.Fatalf("DestroyMIGInstance(%d): %v", gi, err)
		}
	}
	if err := m.DestroyMIGInstance(g.UUID, big.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("destroying a destroyed instance: error = %v, want ErrNotFound", err)
	}
	if left, err := m.MIGInstances(g.UUID); err != nil || len(left) != 0 {
		t.Errorf("MIGInstances after destroying all = %v, %v; want none", left, err)
	}
	if err := m.SetMIGMode(g.UUID, false); err != nil {
		t.Fatalf("SetMIGMode(false) on an empty GPU: %v", err)
	}
	if mode, _ := m.MIGMode(g.UUID); mode.Current || mode.Pending {
		t.Errorf("MIGMode() after disabling = %+v", mode)
	}
}

func TestMockMIGModeChangeThatCannotBeActivated(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(m *Mock, uuid string) error
		wantErr error
	}{
		{name: "needs a reset", setup: func(m *Mock, u string) error { return m.RequireMIGModeReset(u, true) }, wantErr: ErrResetRequired},
		{name: "processes on the GPU", setup: func(m *Mock, u string) error { return m.SetProcesses(u, []Process{{PID: 42, UsedBytes: 1 << 30}}) }, wantErr: ErrInUse},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := newTestMock(t, "dgxa100")
			g := mustGPUs(t, m)[1]
			if err := tc.setup(m, g.UUID); err != nil {
				t.Fatal(err)
			}
			err := m.SetMIGMode(g.UUID, true)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("SetMIGMode(true) error = %v, want %v", err, tc.wantErr)
			}
			if mode, _ := m.MIGMode(g.UUID); mode != (MIGMode{Current: false, Pending: true}) {
				t.Errorf("MIGMode() after the failed activation = %+v, want pending enable", mode)
			}
			// Asking for the current mode again restores the mode as found.
			if err := m.SetMIGMode(g.UUID, false); err != nil {
				t.Fatalf("SetMIGMode(false) to restore: %v", err)
			}
			if mode, _ := m.MIGMode(g.UUID); mode != (MIGMode{}) {
				t.Errorf("MIGMode() after restoring = %+v, want disabled", mode)
			}
			// A reset applies a pending change.
			_ = m.SetMIGMode(g.UUID, true)
			if err := m.ResetGPU(g.UUID); err != nil {
				t.Fatalf("ResetGPU: %v", err)
			}
			if mode, _ := m.MIGMode(g.UUID); mode != (MIGMode{Current: true, Pending: true}) {
				t.Errorf("MIGMode() after the reset = %+v, want enabled", mode)
			}
		})
	}
}

// fakeMIGParent is a GPU whose MIG device handles are fakes; every other
// call panics through the nil embedded interface.
type fakeMIGParent struct {
	nvml.Device
	slots []nvml.Device // nil: empty slot
}

func (f fakeMIGParent) GetMaxMigDeviceCount() (int, nvml.Return) { return len(f.slots), nvml.SUCCESS }
func (f fakeMIGParent) GetMigDeviceHandleByIndex(i int) (nvml.Device, nvml.Return) {
	if i < 0 || i >= len(f.slots) {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	if f.slots[i] == nil {
		return nil, nvml.ERROR_NOT_FOUND
	}
	return f.slots[i], nvml.SUCCESS
}

type fakeMIGHandle struct {
	nvml.Device
	gi, ci int
	uuid   string
}

func (f fakeMIGHandle) GetGpuInstanceId() (int, nvml.Return)     { return f.gi, nvml.SUCCESS }
func (f fakeMIGHandle) GetComputeInstanceId() (int, nvml.Return) { return f.ci, nvml.SUCCESS }
func (f fakeMIGHandle) GetUUID() (string, nvml.Return)           { return f.uuid, nvml.SUCCESS }

func TestReadMIGUUIDs(t *testing.T) {
	parent := fakeMIGParent{slots: []nvml.Device{
		fakeMIGHandle{gi: 1, ci: 0, uuid: "MIG-a"},
		nil,
		fakeMIGHandle{gi: 5, ci: 2, uuid: "MIG-b"},
	}}
	got, err := readMIGUUIDs(parent, "GPU-x")
	if err != nil {
		t.Fatalf("readMIGUUIDs: %v", err)
	}
	want := map[[2]int]string{{1, 0}: "MIG-a", {5, 2}: "MIG-b"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("readMIGUUIDs (-want +got):\n%s", diff)
	}
}

func TestMockMIGUUIDIsStable(t *testing.T) {
	a, b := MockMIGUUID("GPU-1", 3, 0), MockMIGUUID("GPU-1", 3, 0)
	if a != b {
		t.Errorf("MockMIGUUID differs for the same input: %s, %s", a, b)
	}
	for _, other := range []string{MockMIGUUID("GPU-2", 3, 0), MockMIGUUID("GPU-1", 4, 0), MockMIGUUID("GPU-1", 3, 1)} {
		if other == a {
			t.Errorf("MockMIGUUID collides: %s", a)
		}
	}
}

func mustGPUs(t *testing.T, m *Mock) []GPU {
	t.Helper()
	gs, err := m.GPUs()
	if err != nil {
		t.Fatalf("GPUs: %v", err)
	}
	return gs
}
