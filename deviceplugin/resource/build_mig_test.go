package resource

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/config"
	"github.com/gpufrac/gpufrac/deviceplugin/miglayout"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/mig"
)

// mockNode is a mock GPU node whose MIG layouts are applied by the real
// layout manager.
type mockNode struct {
	t    *testing.T
	lib  *nvidia.Mock
	gpus []nvidia.GPU
	ctx  context.Context
}

func newMockNode(t *testing.T, model string) *mockNode {
	t.Helper()
	lib, err := nvidia.NewMock(model, nvidia.WithUUIDSeed(t.Name()))
	if err != nil {
		t.Fatal(err)
	}
	if err := lib.Init(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lib.Shutdown() })
	gs, err := lib.GPUs()
	if err != nil {
		t.Fatal(err)
	}
	_, ctx := ktesting.NewTestContext(t)
	return &mockNode{t: t, lib: lib, gpus: gs, ctx: ctx}
}

// policy builds a node policy: modes by GPU index, layouts for mig GPUs.
func (n *mockNode) policy(strategy string, modes []config.Mode, layouts map[int]string) *config.NodePolicy {
	np := &config.NodePolicy{GPUModes: modes, GPUMIGLayouts: make([]string, len(modes))}
	np.Policy.MIG.Strategy = strategy
	for i, l := range layouts {
		np.GPUMIGLayouts[i] = l
	}
	return np
}

// apply runs the layout manager on np, failing unless every GPU is Applied.
func (n *mockNode) apply(np *config.NodePolicy) {
	n.t.Helper()
	noPods := func(context.Context) (map[string][]string, error) { return map[string][]string{}, nil }
	for _, s := range miglayout.NewManager(n.lib, n.gpus, miglayout.Options{Allocations: noPods}).Apply(n.ctx, *np) {
		if s.State != miglayout.StateApplied {
			n.t.Fatalf("layout manager: GPU %d %s %s: %s", s.Index, s.State, s.Reason, s.Message)
		}
	}
}

func (n *mockNode) build(np *config.NodePolicy) ([]Resource, error) {
	return Build(np.GPUModes, n.gpus, Deps{Policy: np, MIG: n.lib})
}

func modes(spec ...any) []config.Mode {
	var out []config.Mode
	for i := 0; i < len(spec); i += 2 {
		for range spec[i].(int) {
			out = append(out, spec[i+1].(config.Mode))
		}
	}
	return out
}

func counts(res []Resource) map[string]int {
	out := map[string]int{}
	for _, r := range res {
		out[r.Name()] = len(r.Devices())
	}
	return out
}

func TestBuildMixedNodeMIGAndFraction(t *testing.T) {
	n := newMockNode(t, "dgxh100")
	np := n.policy(config.MIGStrategyMixed, modes(4, config.ModeMIG, 4, config.ModeFraction), map[int]string{
		0: "all-3g.40gb", 1: "all-3g.40gb", 2: "3g.40gb,2g.20gb,1g.10gb+me,1g.10gb", 3: "3g.40gb,2g.20gb,1g.10gb+me,1g.10gb",
	})
	n.apply(np)
	res, err := n.build(np)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{
		api.ResourceGPU:             4,
		api.ResourceFraction:        400,
		"nvidia.com/mig-3g.40gb":    6,
		"nvidia.com/mig-2g.20gb":    2,
		"nvidia.com/mig-1g.10gb":    2,
		"nvidia.com/mig-1g.10gb.me": 2,
	}
	if diff := cmp.Diff(want, counts(res)); diff != "" {
		t.Errorf("resources (-want +got):\n%s", diff)
	}
	// GPU 3 moves to another layout, not applied yet (pods hold it): it
	// serves nothing meanwhile, so it can drain.
	np.GPUMIGLayouts[3] = "all-1g.10gb"
	pendingRes, err := n.build(np)
	if err != nil {
		t.Fatal(err)
	}
	want = map[string]int{api.ResourceGPU: 4, api.ResourceFraction: 400, "nvidia.com/mig-3g.40gb": 5, "nvidia.com/mig-2g.20gb": 1, "nvidia.com/mig-1g.10gb": 1, "nvidia.com/mig-1g.10gb.me": 1}
	if diff := cmp.Diff(want, counts(pendingRes)); diff != "" {
		t.Errorf("resources with GPU 3 waiting for its layout (-want +got):\n%s", diff)
	}
	for _, r := range res {
		for _, d := range r.Devices() {
			switch {
			case r.Name() == api.ResourceGPU:
				for _, g := range n.gpus[:4] {
					if d.ID == g.UUID {
						t.Errorf("GPU %d is in MIG mode but served whole", g.Index)
					}
				}
			case strings.HasPrefix(r.Name(), api.MIGResourcePrefix) && !strings.HasPrefix(d.ID, "MIG-"):
				t.Errorf("%s device %q is not a MIG UUID", r.Name(), d.ID)
			}
		}
	}
}

func TestBuildSingleStrategy(t *testing.T) {
	n := newMockNode(t, "dgxa100")
	all := modes(8, config.ModeMIG)
	same := map[int]string{}
	for i := range 8 {
		same[i] = "all-1g.10gb"
	}
	np := n.policy(config.MIGStrategySingle, all, same)
	n.apply(np)
	res, err := n.build(np)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]int{api.ResourceGPU: 32}, counts(res)); diff != "" {
		t.Errorf("resources (-want +got):\n%s", diff)
	}
	for _, d := range res[0].Devices() {
		if !strings.HasPrefix(d.ID, "MIG-") {
			t.Fatalf("single strategy serves %q as nvidia.com/gpu, want MIG UUIDs", d.ID)
		}
	}

	// Keeping the layouts (no layout declared) needs the same devices everywhere.
	keep := n.policy(config.MIGStrategySingle, all, nil)
	if res, err := n.build(keep); err != nil || counts(res)[api.ResourceGPU] != 32 {
		t.Errorf("single strategy keeping equal layouts: %v, %v", counts(res), err)
	}
	// GPU 6 loses a device: keeping layouts now fails, and with the declared
	// layout GPU 6 serves nothing until the layout manager restores it.
	gis, err := n.lib.MIGInstances(n.gpus[6].UUID)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.lib.DestroyMIGInstance(n.gpus[6].UUID, gis[0].ID); err != nil {
		t.Fatal(err)
	}
	_, err = n.build(keep)
	if err == nil || !strings.Contains(err.Error(), `mig.strategy single needs the same MIG layout on every GPU, but GPU 0 has "1g.10gb,1g.10gb,1g.10gb,1g.10gb" and GPU 6 has "1g.10gb,1g.10gb,1g.10gb"`) {
		t.Errorf("single strategy with unequal layouts: error = %v", err)
	}
	res, err = n.build(np)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]int{api.ResourceGPU: 28}, counts(res)); diff != "" {
		t.Errorf("resources with GPU 6 off its layout (-want +got):\n%s", diff)
	}
}

func TestBuildRefusesMIGTheGPUsCannotServe(t *testing.T) {
	n := newMockNode(t, "dgxh100")
	noMIG := append([]nvidia.GPU(nil), n.gpus...)
	noMIG[1].MIGCapable = false
	tests := []struct {
		name    string
		gpus    []nvidia.GPU
		layouts map[int]string
		noLib   bool
		wantErr string
		wantIs  error
	}{
		{name: "unknown profile for the model", layouts: map[int]string{0: "all-2g.10gb", 1: "all-1g.10gb"},
			wantErr: `GPU 0 (NVIDIA H100 80GB HBM3): layout "all-2g.10gb": unknown profile 2g.10gb for this GPU model (it offers 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb)`},
		{name: "layout does not fit", layouts: map[int]string{0: "all-1g.10gb", 1: "4g.40gb,4g.40gb"},
			wantErr: `GPU 1 (NVIDIA H100 80GB HBM3): layout "4g.40gb,4g.40gb": 2 instances of 4g.40gb, but the GPU allows at most 1`},
		{name: "no layout while MIG is off", layouts: map[int]string{0: "all-1g.10gb"},
			wantErr: "GPU 1 is in mode mig without a layout, which keeps the GPU's MIG devices, but its MIG mode is disabled"},
		{name: "every problem at once", layouts: map[int]string{0: "7g.80gb,1g.10gb", 1: "all-9g.90gb"},
			wantErr: `MIG: GPU 0 (NVIDIA H100 80GB HBM3): layout "7g.80gb,1g.10gb": does not fit the GPU: it needs 8 compute slices, the GPU has 7; GPU 1 (NVIDIA H100 80GB HBM3): layout "all-9g.90gb": unknown profile 9g.90gb`},
		{name: "GPU without MIG", gpus: noMIG, layouts: map[int]string{0: "all-1g.10gb", 1: "all-1g.10gb"}, wantErr: "GPU 1 (NVIDIA H100 80GB HBM3) does not support MIG"},
		{name: "no MIG inventory", noLib: true, layouts: map[int]string{0: "all-1g.10gb", 1: "all-1g.10gb"}, wantIs: ErrModeNotSupported},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			gs := n.gpus
			if tc.gpus != nil {
				gs = tc.gpus
			}
			np := n.policy(config.MIGStrategyMixed, modes(2, config.ModeMIG, 6, config.ModeFraction), tc.layouts)
			d := Deps{Policy: np, MIG: n.lib}
			if tc.noLib {
				d.MIG = nil
			}
			_, err := Build(np.GPUModes, gs, d)
			if err == nil {
				t.Fatal("Build() succeeded")
			}
			if tc.wantIs != nil && !errors.Is(err, tc.wantIs) {
				t.Errorf("Build() error = %v, want %v", err, tc.wantIs)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Build() error = %q, want it to contain %q", err, tc.wantErr)
			}
		})
	}
}

func TestBuildSkipsGPUsWithMIGOnOutsideModeMIG(t *testing.T) {
	n := newMockNode(t, "dgxh100")
	if err := n.lib.SetMIGMode(n.gpus[2].UUID, true); err != nil {
		t.Fatal(err)
	}
	np := n.policy(config.MIGStrategyMixed, modes(6, config.ModeFraction, 2, config.ModeTimeslice), nil)
	res, err := n.build(np)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{api.ResourceGPU: 5, api.ResourceFraction: 500, api.DefaultTimesliceResource: 8}
	if diff := cmp.Diff(want, counts(res)); diff != "" {
		t.Errorf("resources with GPU 2 in MIG mode (-want +got):\n%s", diff)
	}
}

// unreadableMIG fails the MIG profile or instance reads of chosen GPUs.
type unreadableMIG struct {
	*nvidia.Mock
	profiles, instances map[string]error
}

func (u unreadableMIG) MIGProfiles(uuid string) ([]mig.Profile, error) {
	if err := u.profiles[uuid]; err != nil {
		return nil, err
	}
	return u.Mock.MIGProfiles(uuid)
}

func (u unreadableMIG) MIGInstances(uuid string) ([]mig.GPUInstance, error) {
	if err := u.instances[uuid]; err != nil {
		return nil, err
	}
	return u.Mock.MIGInstances(uuid)
}

func TestBuildLeavesOutGPUsNVMLCannotRead(t *testing.T) {
	n := newMockNode(t, "dgxh100")
	np := n.policy(config.MIGStrategyMixed, modes(3, config.ModeMIG, 5, config.ModeFraction),
		map[int]string{0: "all-3g.40gb", 1: "all-3g.40gb", 2: "all-3g.40gb"})
	n.apply(np)
	lost := errors.New("GPU is lost")
	// GPU 0's profiles cannot be read (its layout is checked against
	// another H100's: served), GPU 1's instances, and GPU 2's and GPU 4's
	// (a fraction GPU) MIG mode.
	n.lib.FailMIGReads(n.gpus[2].UUID, lost)
	n.lib.FailMIGReads(n.gpus[4].UUID, lost)
	inv := unreadableMIG{Mock: n.lib, profiles: map[string]error{n.gpus[0].UUID: lost}, instances: map[string]error{n.gpus[1].UUID: lost}}
	var told []int
	unread := func(g nvidia.GPU, err error) {
		if !errors.Is(err, lost) {
			t.Errorf("GPU %d left out for %v, want the read's error", g.Index, err)
		}
		told = append(told, g.Index)
	}
	res, err := Build(np.GPUModes, n.gpus, Deps{Policy: np, MIG: inv, Unread: unread})
	if err != nil {
		t.Fatalf("Build() with unreadable GPUs: %v, want the others served", err)
	}
	want := map[string]int{api.ResourceGPU: 4, api.ResourceFraction: 400, "nvidia.com/mig-3g.40gb": 2}
	if diff := cmp.Diff(want, counts(res)); diff != "" {
		t.Errorf("resources with GPUs 1, 2 and 4 unreadable (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int{1, 2, 4}, told); diff != "" {
		t.Errorf("GPUs Unread was told of (-want +got):\n%s", diff)
	}
	for _, d := range res[0].Devices() {
		if d.ID == n.gpus[4].UUID {
			t.Error("GPU 4, whose MIG mode cannot be read, is served whole")
		}
	}
	// Readable again: every GPU is back.
	n.lib.FailMIGReads(n.gpus[2].UUID, nil)
	n.lib.FailMIGReads(n.gpus[4].UUID, nil)
	told = nil
	if res, err = Build(np.GPUModes, n.gpus, Deps{Policy: np, MIG: n.lib, Unread: unread}); err != nil {
		t.Fatal(err)
	}
	want = map[string]int{api.ResourceGPU: 5, api.ResourceFraction: 500, "nvidia.com/mig-3g.40gb": 6}
	if diff := cmp.Diff(want, counts(res)); diff != "" || told != nil {
		t.Errorf("resources once readable (-want +got):\n%s; told of %v", diff, told)
	}
}

// A GPU NVML cannot read is left out, but a layout declared for it is still
// checked, against another GPU of its model: a config that cannot work is
// refused now, not accepted until the GPU can be read and then failing
// every rebuild. With no GPU of the model to check against, the GPU is left
// out unchecked: refusing would keep the whole node on its last config.
func TestBuildChecksTheLayoutOfAGPUItCannotRead(t *testing.T) {
	lost := errors.New("GPU is lost")
	// profilesFail: GPU 0's profiles fail with lost, the others' with others.
	profilesFail := func(n *mockNode, others error) map[string]error {
		m := map[string]error{n.gpus[0].UUID: lost}
		if others != nil {
			for _, g := range n.gpus[1:] {
				m[g.UUID] = others
			}
		}
		return m
	}
	tests := []struct {
		name string
		// layout is GPU 0's; GPUs 1-7 are in mode fraction.
		layout string
		fail   func(n *mockNode) (MIGInventory, []nvidia.GPU)
		// wantErr: the config refused; else wantUnread: GPU 0 left out, told
		// this error.
		wantErr, wantUnread string
	}{
		{name: "a layout that does not fit, checked against another H100's profiles", layout: "all-9g.90gb",
			fail: func(n *mockNode) (MIGInventory, []nvidia.GPU) {
				n.lib.FailMIGReads(n.gpus[0].UUID, lost)
				return n.lib, n.gpus
			},
			wantErr: `GPU 0 (NVIDIA H100 80GB HBM3): layout "all-9g.90gb": unknown profile 9g.90gb`},
		{name: "a layout that fits: left out until it can be read", layout: "all-3g.40gb",
			fail: func(n *mockNode) (MIGInventory, []nvidia.GPU) {
				n.lib.FailMIGReads(n.gpus[0].UUID, lost)
				return n.lib, n.gpus
			},
			wantUnread: "GPU 0: reading MIG state of"},
		{name: "no other GPU of the model lists its profiles: left out unchecked", layout: "all-9g.90gb",
			fail: func(n *mockNode) (MIGInventory, []nvidia.GPU) {
				return unreadableMIG{Mock: n.lib, profiles: profilesFail(n, lost)}, n.gpus
			},
			wantUnread: `GPU 0: layout "all-9g.90gb" not checked: NVML cannot read the MIG profiles of the GPU or of another GPU of its model: GPU is lost`},
		{name: "the other GPUs list profiles only with MIG on: the check waits, as for a readable GPU", layout: "all-9g.90gb",
			fail: func(n *mockNode) (MIGInventory, []nvidia.GPU) {
				n.lib.FailMIGReads(n.gpus[0].UUID, lost)
				return unreadableMIG{Mock: n.lib, profiles: profilesFail(n, nvidia.ErrNotSupported)}, n.gpus
			},
			wantUnread: "GPU 0: reading MIG state of"},
		{name: "a GPU of the same name but other memory is not of the model", layout: "all-9g.90gb",
			fail: func(n *mockNode) (MIGInventory, []nvidia.GPU) {
				gs := append([]nvidia.GPU(nil), n.gpus...)
				for i := range gs[1:] {
					gs[i+1].MemoryBytes += 1 << 30
				}
				return unreadableMIG{Mock: n.lib, profiles: profilesFail(n, nil)}, gs
			},
			wantUnread: `GPU 0: layout "all-9g.90gb" not checked`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := newMockNode(t, "dgxh100")
			np := n.policy(config.MIGStrategyMixed, modes(1, config.ModeMIG, 7, config.ModeFraction), map[int]string{0: tc.layout})
			inv, gs := tc.fail(n)
			var told []string
			unread := func(g nvidia.GPU, err error) { told = append(told, fmt.Sprintf("GPU %d: %v", g.Index, err)) }
			res, err := Build(np.GPUModes, gs, Deps{Policy: np, MIG: inv, Unread: unread})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("Build() error = %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Build() error = %v, want GPU 0 left out and the others served", err)
			}
			if len(told) != 1 || !strings.Contains(told[0], tc.wantUnread) {
				t.Errorf("Unread told %q, want GPU 0 for %q", told, tc.wantUnread)
			}
			if diff := cmp.Diff(map[string]int{api.ResourceGPU: 7, api.ResourceFraction: 700}, counts(res)); diff != "" {
				t.Errorf("resources (-want +got):\n%s", diff)
			}
		})
	}
}

func TestBuildTimeslice(t *testing.T) {
	tests := []struct {
		name string
		ts   config.TimesliceConfig
		want map[string]int
	}{
		{name: "defaults: 4 replicas as nvidia.com/gpu.shared", want: map[string]int{api.DefaultTimesliceResource: 32}},
		{name: "named resource, 3 replicas", ts: config.TimesliceConfig{Replicas: 3, ResourceName: "example.com/gpu-slice"}, want: map[string]int{"example.com/gpu-slice": 24}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			np := &config.NodePolicy{GPUModes: modes(8, config.ModeTimeslice)}
			np.Policy.Timeslice = tc.ts
			res, err := Build(np.GPUModes, gpus(8), Deps{Policy: np})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, counts(res)); diff != "" {
				t.Errorf("resources (-want +got):\n%s", diff)
			}
		})
	}
}

// profilesOnlyWithMIG is a driver that lists MIG profiles only while MIG is on.
type profilesOnlyWithMIG struct{ *nvidia.Mock }

func (p profilesOnlyWithMIG) MIGProfiles(uuid string) ([]mig.Profile, error) {
	if mode, err := p.MIGMode(uuid); err != nil || !mode.Current {
		return nil, nvidia.ErrNotSupported
	}
	return p.Mock.MIGProfiles(uuid)
}

func TestBuildLeavesLayoutCheckToTheManagerWhileProfilesNeedMIG(t *testing.T) {
	n := newMockNode(t, "dgxa100")
	np := n.policy(config.MIGStrategyMixed, modes(1, config.ModeMIG, 7, config.ModeFraction), map[int]string{0: "all-1g.10gb"})
	res, err := Build(np.GPUModes, n.gpus, Deps{Policy: np, MIG: profilesOnlyWithMIG{n.lib}})
	if err != nil {
		t.Fatalf("Build() with MIG off and unlistable profiles: %v", err)
	}
	if diff := cmp.Diff(map[string]int{api.ResourceGPU: 7, api.ResourceFraction: 700}, counts(res)); diff != "" {
		t.Errorf("resources (-want +got):\n%s", diff)
	}
}

// recordingHint is a PodHint and AllocationRecorder that records the
// devices it is told of.
type recordingHint struct {
	fakeHint
	devices [][]string
}

func (h *recordingHint) DevicesAllocated(_ context.Context, ids []string) {
	h.devices = append(h.devices, ids)
}

// TestBuildTellsAllocationsToTheRecorder checks that the resources whose
// allocations gpufrac-node writes back on pods (whole GPUs, MIG devices in
// the single strategy) tell the hint of each allocation given, so the
// write-back runs at once, and that MIG profiles of the mixed strategy
// (not written back) and refused allocations do not.
func TestBuildTellsAllocationsToTheRecorder(t *testing.T) {
	tests := []struct {
		name     string
		strategy string
		mode     config.Mode
		usage    fakeUsage
		resource string
		want     int // allocations told
		wantErr  error
	}{
		{name: "whole GPU", strategy: config.MIGStrategySingle, mode: config.ModeFraction, resource: api.ResourceGPU, want: 1},
		{name: "whole GPU refused: it carries fractions", strategy: config.MIGStrategySingle, mode: config.ModeFraction,
			usage: fakeUsage{}, resource: api.ResourceGPU, wantErr: ErrShared},
		{name: "MIG device, single strategy", strategy: config.MIGStrategySingle, mode: config.ModeMIG, resource: api.ResourceGPU, want: 1},
		{name: "MIG device, mixed strategy", strategy: config.MIGStrategyMixed, mode: config.ModeMIG, resource: mig.ResourceName("1g.10gb")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := newMockNode(t, "dgxa100")
			layouts := map[int]string{}
			if tt.mode == config.ModeMIG {
				for i := range n.gpus {
					layouts[i] = "all-1g.10gb"
				}
			}
			np := n.policy(tt.strategy, modes(len(n.gpus), tt.mode), layouts)
			n.apply(np)
			usage := tt.usage
			if usage != nil {
				usage[n.gpus[0].UUID] = GPUUsage{Units: 30}
			}
			h := &recordingHint{}
			res, err := Build(np.GPUModes, n.gpus, Deps{Policy: np, MIG: n.lib, Usage: usage, Hint: h, Strategy: StrategyCDI})
			if err != nil {
				t.Fatal(err)
			}
			var r Resource
			for _, x := range res {
				if x.Name() == tt.resource {
					r = x
				}
			}
			if r == nil {
				t.Fatalf("no resource %s among %v", tt.resource, counts(res))
			}
			id := r.Devices()[0].ID
			if _, err := r.Allocate(n.ctx, []string{id}); !errors.Is(err, tt.wantErr) {
				t.Fatalf("Allocate(%s) error = %v, want %v", id, err, tt.wantErr)
			}
			if len(h.devices) != tt.want {
				t.Errorf("allocations told = %v, want %d", h.devices, tt.want)
			}
			if len(h.devices) > 0 && !cmp.Equal(h.devices[0], []string{id}) {
				t.Errorf("devices told = %v, want [%s]", h.devices[0], id)
			}
		})
	}
}

func TestBuildWithAnExternalMIGOwnerServesWhatItFinds(t *testing.T) {
	n := newMockNode(t, "dgxh100")
	// The other MIG manager has partitioned GPU 0; GPU 1 is in mode mig but
	// its owner has not enabled MIG yet.
	n.apply(n.policy(config.MIGStrategyMixed, modes(1, config.ModeMIG, 7, config.ModeFraction), map[int]string{0: "all-3g.40gb"}))
	np := n.policy(config.MIGStrategyMixed, modes(2, config.ModeMIG, 6, config.ModeFraction), nil)
	np.Policy.MIG.Owner = config.MIGOwnerExternal
	res, err := n.build(np)
	if err != nil {
		t.Fatalf("Build() = %v, want GPU 1 served nothing until its owner enables MIG", err)
	}
	want := map[string]int{"nvidia.com/mig-3g.40gb": 2, api.ResourceGPU: 6, api.ResourceFraction: 600}
	if diff := cmp.Diff(want, counts(res)); diff != "" {
		t.Errorf("resources (-want +got):\n%s", diff)
	}
}

func TestBuildSingleStrategyWithAnExternalMIGOwner(t *testing.T) {
	n := newMockNode(t, "dgxh100")
	// The other MIG manager has partitioned GPU 0 only, so far.
	n.apply(n.policy(config.MIGStrategyMixed, modes(1, config.ModeMIG, 7, config.ModeFraction), map[int]string{0: "all-3g.40gb"}))
	np := n.policy(config.MIGStrategySingle, modes(8, config.ModeMIG), nil)
	np.Policy.MIG.Owner = config.MIGOwnerExternal
	res, err := n.build(np)
	if err != nil {
		t.Fatalf("Build() = %v, want the GPUs without MIG devices left out of the single strategy's comparison", err)
	}
	if diff := cmp.Diff(map[string]int{api.ResourceGPU: 2}, counts(res)); diff != "" {
		t.Errorf("resources (-want +got):\n%s", diff)
	}
}
