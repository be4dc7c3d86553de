package miglayout

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/config"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/mig"
)

// newMock builds an initialized mock of model with seeded UUIDs.
func newMock(t *testing.T, model string) (*nvidia.Mock, []nvidia.GPU) {
	t.Helper()
	m, err := nvidia.NewMock(model, nvidia.WithUUIDSeed(t.Name()))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Init(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Shutdown() })
	gs, err := m.GPUs()
	if err != nil {
		t.Fatal(err)
	}
	return m, gs
}

// fakeAllocations is a settable AllocationsFunc.
type fakeAllocations struct {
	mu  sync.Mutex
	ids map[string][]string
	err error
}

func (f *fakeAllocations) set(ids map[string][]string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ids, f.err = ids, err
}

func (f *fakeAllocations) get(context.Context) (map[string][]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ids, f.err
}

// events records the manager's events as "Warning Reason" / "Normal Reason".
type events struct {
	mu   sync.Mutex
	list []string
}

func (e *events) record(warning bool, reason, _ string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	typ := "Normal"
	if warning {
		typ = "Warning"
	}
	e.list = append(e.list, typ+" "+reason)
}

func (e *events) get() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.list...)
}

type fixture struct {
	mock   *nvidia.Mock
	gpus   []nvidia.GPU
	allocs *fakeAllocations
	events *events
	reg    *prometheus.Registry
	clock  *testingclock.FakeClock
	mgr    *Manager
	ctx    context.Context
}

func newFixture(t *testing.T, model string) *fixture {
	t.Helper()
	m, gs := newMock(t, model)
	_, ctx := ktesting.NewTestContext(t)
	f := &fixture{mock: m, gpus: gs, allocs: &fakeAllocations{ids: map[string][]string{}}, events: &events{},
		reg: prometheus.NewRegistry(), clock: testingclock.NewFakeClock(time.Unix(1_700_000_000, 0)), ctx: ctx}
	f.mgr = NewManager(m, gs, Options{Allocations: f.allocs.get, Registerer: f.reg, Event: f.events.record, Clock: f.clock})
	return f
}

// policy puts the GPUs in layouts (index -> layout) in mode mig, the rest in fraction.
func (f *fixture) policy(layouts map[int]string) config.NodePolicy {
	np := config.NodePolicy{GPUModes: make([]config.Mode, len(f.gpus)), GPUMIGLayouts: make([]string, len(f.gpus))}
	for i := range f.gpus {
		np.GPUModes[i] = config.ModeFraction
		if l, ok := layouts[i]; ok {
			np.GPUModes[i], np.GPUMIGLayouts[i] = config.ModeMIG, l
		}
	}
	return np
}

func (f *fixture) instances(t *testing.T, i int) []mig.GPUInstance {
	t.Helper()
	mode, err := f.mock.MIGMode(f.gpus[i].UUID)
	if err != nil {
		t.Fatal(err)
	}
	if !mode.Current {
		return nil
	}
	gis, err := f.mock.MIGInstances(f.gpus[i].UUID)
	if err != nil {
		t.Fatal(err)
	}
	return gis
}

func (f *fixture) operations() float64 {
	var sum float64
	for _, op := range []string{"create_instance", "destroy_instance", "enable_mig", "disable_mig"} {
		for _, r := range []string{"success", "error"} {
			sum += testutil.ToFloat64(f.mgr.metrics.operations.WithLabelValues(op, r))
		}
	}
	return sum
}

func statusOf(ss []Status, i int) Status {
	for _, s := range ss {
		if s.Index == i {
			return s
		}
	}
	return Status{}
}

func uuidsOf(gis []mig.GPUInstance) []string {
	var out []string
	for _, d := range devicesOf(gis) {
		out = append(out, d.UUID)
	}
	return out
}

func TestApplyLayoutFromEmptyGPU(t *testing.T) {
	tests := []struct {
		name   string
		model  string
		gpu    int
		layout string
		want   string // Describe of the result
	}{
		{name: "a100 all-1g.10gb", model: "dgxa100", gpu: 0, layout: "all-1g.10gb", want: "1g.10gb,1g.10gb,1g.10gb,1g.10gb"},
		{name: "h100 mixed list", model: "dgxh100", gpu: 3, layout: "3g.40gb,2g.20gb,1g.10gb+me,1g.10gb", want: "3g.40gb,2g.20gb,1g.10gb,1g.10gb+me"},
		{name: "h100 balanced", model: "dgxh100", gpu: 7, layout: "all-balanced", want: "3g.40gb,2g.20gb,1g.10gb,1g.10gb"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.model)
			np := f.policy(map[int]string{tc.gpu: tc.layout})
			got := statusOf(f.mgr.Apply(f.ctx, np), tc.gpu)
			if got.State != StateApplied || !got.Changed {
				t.Fatalf("status = %+v, want Applied and Changed", got)
			}
			gis := f.instances(t, tc.gpu)
			if d := mig.Describe(gis); d != tc.want {
				t.Errorf("layout = %q, want %q", d, tc.want)
			}
			for i := range gis {
				if !gis[i].Clean() {
					t.Errorf("instance %d is not one full compute instance: %+v", gis[i].ID, gis[i])
				}
				for j := range i {
					if gis[i].Placement.Overlaps(gis[j].Placement) {
						t.Errorf("instances %d and %d overlap", gis[i].ID, gis[j].ID)
					}
				}
			}
			for i := range f.gpus {
				if i != tc.gpu && len(f.instances(t, i)) != 0 {
					t.Errorf("GPU %d was touched", i)
				}
			}
			if diff := cmp.Diff([]string{"Normal MIGLayoutApplied"}, f.events.get()); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}

			// The same layout again changes nothing: no NVML operation, same devices.
			before, uuids := f.operations(), uuidsOf(gis)
			for _, s := range f.mgr.Apply(f.ctx, np) {
				if s.State != StateApplied || s.Changed {
					t.Errorf("second Apply: GPU %d status %+v, want Applied and unchanged", s.Index, s)
				}
			}
			if after := f.operations(); after != before {
				t.Errorf("second Apply made %v NVML operations, want 0", after-before)
			}
			if diff := cmp.Diff(uuids, uuidsOf(f.instances(t, tc.gpu))); diff != "" {
				t.Errorf("MIG devices changed on the second Apply (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLayoutChangeKeepsMatchingInstances(t *testing.T) {
	f := newFixture(t, "dgxh100")
	f.mgr.Apply(f.ctx, f.policy(map[int]string{0: "all-1g.10gb"}))
	before := f.instances(t, 0)
	f.mgr.Apply(f.ctx, f.policy(map[int]string{0: "3g.40gb,1g.10gb,1g.10gb,1g.10gb,1g.10gb"}))
	after := f.instances(t, 0)
	if d := mig.Describe(after); d != "3g.40gb,1g.10gb,1g.10gb,1g.10gb,1g.10gb" {
		t.Fatalf("layout = %q", d)
	}
	kept := 0
	for _, u := range uuidsOf(after) {
		for _, b := range uuidsOf(before) {
			if u == b {
				kept++
			}
		}
	}
	if kept != 4 {
		t.Errorf("%d of the 1g.10gb devices survived the change, want 4 (only the 3 in the 3g's way destroyed)", kept)
	}
}

func TestChangeDeferredWhileGPUHasAllocatedDevices(t *testing.T) {
	f := newFixture(t, "dgxh100")
	f.mgr.Apply(f.ctx, f.policy(map[int]string{1: "all-3g.40gb"}))
	gis := f.instances(t, 1)
	g := f.gpus[1]
	tests := []struct {
		name   string
		allocs map[string][]string
	}{
		{name: "MIG device", allocs: map[string][]string{api.MIGResourcePrefix + "3g.40gb": {gis[0].Devices[0].UUID}}},
		{name: "MIG device in the single strategy", allocs: map[string][]string{api.ResourceGPU: {gis[1].Devices[0].UUID}}},
		{name: "whole GPU", allocs: map[string][]string{api.ResourceGPU: {g.UUID}}},
		{name: "fraction units", allocs: map[string][]string{api.ResourceFraction: {g.UUID + "::0", g.UUID + "::1"}}},
		{name: "time-sliced replica", allocs: map[string][]string{"example.com/shared": {g.UUID + "::3"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f.allocs.set(tc.allocs, nil)
			s := statusOf(f.mgr.Apply(f.ctx, f.policy(map[int]string{1: "all-1g.10gb"})), 1)
			if s.State != StatePending || s.Reason != ReasonDevicesAllocated || s.Changed {
				t.Errorf("status = %+v, want Pending DevicesAllocated", s)
			}
			if diff := cmp.Diff(uuidsOf(gis), uuidsOf(f.instances(t, 1))); diff != "" {
				t.Errorf("a GPU with allocated devices was changed (-want +got):\n%s", diff)
			}
			if v := testutil.ToFloat64(f.mgr.metrics.pending.WithLabelValues(g.UUID, ReasonDevicesAllocated)); v != 1 {
				t.Errorf("gpufrac_mig_layout_pending{reason=DevicesAllocated} = %v, want 1", v)
			}
		})
	}
	// A device on another GPU does not block GPU 1.
	f.allocs.set(map[string][]string{api.ResourceGPU: {f.gpus[5].UUID}}, nil)
	if s := statusOf(f.mgr.Apply(f.ctx, f.policy(map[int]string{1: "all-1g.10gb"})), 1); s.State != StateApplied || !s.Changed {
		t.Errorf("status after the GPU drained = %+v, want Applied and Changed", s)
	}
	if d := mig.Describe(f.instances(t, 1)); d != "1g.10gb,1g.10gb,1g.10gb,1g.10gb,1g.10gb,1g.10gb,1g.10gb" {
		t.Errorf("layout after draining = %q", d)
	}
	if v := testutil.ToFloat64(f.mgr.metrics.pending.WithLabelValues(g.UUID, ReasonDevicesAllocated)); v != 0 {
		t.Errorf("pending gauge still %v after the change was applied", v)
	}
}

func TestRunRetriesWhenTheGPUDrains(t *testing.T) {
	f := newFixture(t, "dgxa100")
	f.mgr.Apply(f.ctx, f.policy(map[int]string{2: "all-3g.20gb"}))
	dev := f.instances(t, 2)[0].Devices[0].UUID
	f.allocs.set(map[string][]string{api.MIGResourcePrefix + "3g.20gb": {dev}}, nil)
	want := f.policy(map[int]string{2: "all-1g.10gb"})
	if s := statusOf(f.mgr.Apply(f.ctx, want), 2); s.Reason != ReasonDevicesAllocated {
		t.Fatalf("status = %+v, want deferred", s)
	}

	retried := make(chan []Status, 1)
	f.mgr.opts.Retry = func(ctx context.Context) error { retried <- f.mgr.Apply(ctx, want); return nil }
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan error, 1)
	go func() { done <- f.mgr.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	step := func() {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !f.clock.HasWaiters() {
			if time.Now().After(deadline) {
				t.Fatal("Run never started its ticker")
			}
			time.Sleep(time.Millisecond)
		}
		f.clock.Step(5 * time.Second)
	}

	// Still allocated: nothing to retry.
	if f.mgr.retryDue(f.ctx) {
		t.Fatal("retryDue while the MIG device is still allocated")
	}
	// Freed: the next tick retries, and the layout goes through.
	f.allocs.set(map[string][]string{}, nil)
	step()
	select {
	case ss := <-retried:
		if s := statusOf(ss, 2); s.State != StateApplied || !s.Changed {
			t.Errorf("retried status = %+v, want Applied", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not retry after the GPU drained")
	}
	if d := mig.Describe(f.instances(t, 2)); d != "1g.10gb,1g.10gb,1g.10gb,1g.10gb" {
		t.Errorf("layout = %q after the retry", d)
	}
}

func TestModeChangeThatCannotBeActivatedIsLeftAsFound(t *testing.T) {
	f := newFixture(t, "dgxa100")
	g := f.gpus[4]
	if err := f.mock.RequireMIGModeReset(g.UUID, true); err != nil {
		t.Fatal(err)
	}
	np := f.policy(map[int]string{4: "all-1g.10gb"})
	s := statusOf(f.mgr.Apply(f.ctx, np), 4)
	if s.State != StatePending || s.Reason != ReasonResetRequired || !strings.Contains(s.Message, "nvidia-smi -i 4 -mig 1") {
		t.Fatalf("status = %+v, want Pending ResetRequired telling how to enable MIG", s)
	}
	if mode, _ := f.mock.MIGMode(g.UUID); mode != (nvidia.MIGMode{}) {
		t.Errorf("MIG mode = %+v after the refused change, want disabled and nothing pending", mode)
	}
	if diff := cmp.Diff([]string{"Warning MIGLayoutPending"}, f.events.get()); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if v := testutil.ToFloat64(f.mgr.metrics.pending.WithLabelValues(g.UUID, ReasonResetRequired)); v != 1 {
		t.Errorf("gpufrac_mig_layout_pending{reason=ResetRequired} = %v, want 1", v)
	}
	// Reconciling again neither retries the change nor repeats the event.
	ops := f.operations()
	f.mgr.Apply(f.ctx, np)
	if f.operations() != ops || len(f.events.get()) != 1 {
		t.Errorf("second Apply retried the mode change (%v operations) or repeated the event (%v)", f.operations()-ops, f.events.get())
	}
	if f.mgr.retryDue(f.ctx) {
		t.Error("retryDue is true while MIG mode is still off")
	}
	// An admin enables MIG (and resets the GPU): the layout goes through.
	if err := f.mock.RequireMIGModeReset(g.UUID, false); err != nil {
		t.Fatal(err)
	}
	if err := f.mock.SetMIGMode(g.UUID, true); err != nil {
		t.Fatal(err)
	}
	if !f.mgr.retryDue(f.ctx) {
		t.Error("retryDue is false after MIG mode was enabled")
	}
	if s := statusOf(f.mgr.Apply(f.ctx, np), 4); s.State != StateApplied {
		t.Errorf("status after enabling = %+v", s)
	}
	if d := mig.Describe(f.instances(t, 4)); d != "1g.10gb,1g.10gb,1g.10gb,1g.10gb" {
		t.Errorf("layout = %q", d)
	}
}

func TestModeChangeOnAGPUInUseIsRetriedLater(t *testing.T) {
	f := newFixture(t, "dgxh100")
	g := f.gpus[0]
	if err := f.mock.SetProcesses(g.UUID, []nvidia.Process{{PID: 7, UsedBytes: 1 << 30}}); err != nil {
		t.Fatal(err)
	}
	np := f.policy(map[int]string{0: "all-7g.80gb"})
	if s := statusOf(f.mgr.Apply(f.ctx, np), 0); s.Reason != ReasonInUse {
		t.Fatalf("status = %+v, want Pending InUse", s)
	}
	if mode, _ := f.mock.MIGMode(g.UUID); mode != (nvidia.MIGMode{}) {
		t.Errorf("MIG mode = %+v, want left as found", mode)
	}
	if f.mgr.retryDue(f.ctx) {
		t.Error("retryDue right after the refusal")
	}
	f.clock.Step(time.Minute)
	if !f.mgr.retryDue(f.ctx) {
		t.Error("retryDue false after RetryInUse")
	}
	if err := f.mock.SetProcesses(g.UUID, nil); err != nil {
		t.Fatal(err)
	}
	if s := statusOf(f.mgr.Apply(f.ctx, np), 0); s.State != StateApplied {
		t.Errorf("status once idle = %+v", s)
	}
	if d := mig.Describe(f.instances(t, 0)); d != "7g.80gb" {
		t.Errorf("layout = %q", d)
	}
}

func TestLeavingMIGDestroysInstancesAndDisablesMIG(t *testing.T) {
	f := newFixture(t, "dgxh100")
	f.mgr.Apply(f.ctx, f.policy(map[int]string{0: "all-1g.10gb", 1: "all-3g.40gb"}))
	ss := f.mgr.Apply(f.ctx, f.policy(map[int]string{1: "all-3g.40gb"}))
	if s := statusOf(ss, 0); s.State != StateApplied || !s.Changed || s.MIG {
		t.Errorf("GPU 0 status = %+v, want Applied (MIG off)", s)
	}
	if mode, _ := f.mock.MIGMode(f.gpus[0].UUID); mode.Current || mode.Pending {
		t.Errorf("GPU 0 MIG mode = %+v, want disabled", mode)
	}
	if len(f.instances(t, 1)) != 2 {
		t.Error("GPU 1 lost its instances")
	}
	if len(f.mgr.Devices()[f.gpus[0].UUID]) != 0 || len(f.mgr.Devices()[f.gpus[1].UUID]) != 2 {
		t.Errorf("Devices() = %v", f.mgr.Devices())
	}
}

func TestUnknownAllocationsTouchNothing(t *testing.T) {
	f := newFixture(t, "dgxh100")
	f.allocs.set(nil, errors.New("kubelet unreachable"))
	ss := f.mgr.Apply(f.ctx, f.policy(map[int]string{0: "all-1g.10gb"}))
	if s := statusOf(ss, 0); s.Reason != ReasonAllocationsUnknown {
		t.Errorf("status = %+v, want Pending AllocationsUnknown", s)
	}
	if s := statusOf(ss, 1); s.State != StateApplied || s.Changed {
		t.Errorf("GPU 1 (nothing to change) status = %+v, want Applied", s)
	}
	if mode, _ := f.mock.MIGMode(f.gpus[0].UUID); mode.Current {
		t.Error("MIG was enabled without knowing the GPU's allocations")
	}
	f.allocs.set(map[string][]string{}, nil)
	if !f.mgr.retryDue(f.ctx) {
		t.Error("retryDue false once allocations are known")
	}
}

func TestGPUsThatCannotServeTheDeclaredMIG(t *testing.T) {
	f := newFixture(t, "dgxh100")
	noMIG := f.gpus[6]
	noMIG.MIGCapable = false
	f.mgr = NewManager(f.mock, []nvidia.GPU{f.gpus[0], noMIG}, Options{Allocations: f.allocs.get, Clock: f.clock})
	np := config.NodePolicy{GPUModes: []config.Mode{config.ModeMIG, config.ModeMIG}, GPUMIGLayouts: []string{"", "all-1g.10gb"}}
	ss := f.mgr.Apply(f.ctx, np)
	want := []string{
		fmt.Sprintf("%d %s %s", 0, StateFailed, ReasonNoLayout),
		fmt.Sprintf("%d %s %s", 6, StateFailed, ReasonNotSupported),
	}
	var got []string
	for _, s := range ss {
		got = append(got, fmt.Sprintf("%d %s %s", s.Index, s.State, s.Reason))
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("statuses (-want +got):\n%s", diff)
	}
}

func TestDeviceMetrics(t *testing.T) {
	f := newFixture(t, "dgxh100")
	f.mgr.Apply(f.ctx, f.policy(map[int]string{2: "3g.40gb,2g.20gb"}))
	gis := f.instances(t, 2)
	f.allocs.set(map[string][]string{api.MIGResourcePrefix + "3g.40gb": {gis[0].Devices[0].UUID}}, nil)
	g := f.gpus[2].UUID
	want := fmt.Sprintf(`
# HELP gpufrac_mig_device_allocated 1 when the kubelet has allocated the MIG device to a container, 0 when it is free. Absent when PodResources cannot be read.
# TYPE gpufrac_mig_device_allocated gauge
gpufrac_mig_device_allocated{gpu_uuid=%[1]q,mig_uuid=%[2]q,profile="3g.40gb"} 1
gpufrac_mig_device_allocated{gpu_uuid=%[1]q,mig_uuid=%[3]q,profile="2g.20gb"} 0
`, g, gis[0].Devices[0].UUID, gis[1].Devices[0].UUID)
	if err := testutil.GatherAndCompare(f.reg, strings.NewReader(want), "gpufrac_mig_device_allocated"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(f.mgr.metrics, "gpufrac_mig_device_memory_total_bytes"); n != 2 {
		t.Errorf("gpufrac_mig_device_memory_total_bytes series = %d, want 2", n)
	}
	if v := testutil.ToFloat64(f.mgr.metrics.operations.WithLabelValues("create_instance", "success")); v != 2 {
		t.Errorf("create_instance successes = %v, want 2", v)
	}
}

// BenchmarkApplyUnchanged measures a reconciliation that finds every GPU of
// a mock DGX H100 already at its layout (the Run loop's retries and every
// config reload pay it).
func BenchmarkApplyUnchanged(b *testing.B) {
	m, err := nvidia.NewMock("dgxh100", nvidia.WithUUIDSeed("bench"))
	if err != nil {
		b.Fatal(err)
	}
	if err := m.Init(); err != nil {
		b.Fatal(err)
	}
	defer m.Shutdown()
	gs, err := m.GPUs()
	if err != nil {
		b.Fatal(err)
	}
	noPods := func(context.Context) (map[string][]string, error) { return map[string][]string{}, nil }
	mgr := NewManager(m, gs, Options{Allocations: noPods})
	np := config.NodePolicy{GPUModes: make([]config.Mode, len(gs)), GPUMIGLayouts: make([]string, len(gs))}
	for i := range gs {
		np.GPUModes[i], np.GPUMIGLayouts[i] = config.ModeMIG, "3g.40gb,2g.20gb,1g.10gb,1g.10gb"
	}
	ctx := klog.NewContext(context.Background(), logr.Discard())
	for _, s := range mgr.Apply(ctx, np) {
		if s.State != StateApplied {
			b.Fatalf("setup: %+v", s)
		}
	}
	b.ResetTimer()
	for range b.N {
		for _, s := range mgr.Apply(ctx, np) {
			if s.Changed {
				b.Fatalf("unchanged layout changed: %+v", s)
			}
		}
	}
}

// profilesOnlyWithMIG is a driver that lists MIG profiles only while MIG is on.
type profilesOnlyWithMIG struct{ *nvidia.Mock }

func (p profilesOnlyWithMIG) MIGProfiles(uuid string) ([]mig.Profile, error) {
	if mode, err := p.MIGMode(uuid); err != nil || !mode.Current {
		return nil, fmt.Errorf("listing MIG profiles of %s: %w", uuid, nvidia.ErrNotSupported)
	}
	return p.Mock.MIGProfiles(uuid)
}

func TestLayoutExpandedAfterEnablingWhenProfilesNeedMIG(t *testing.T) {
	f := newFixture(t, "dgxa100")
	mgr := NewManager(profilesOnlyWithMIG{f.mock}, f.gpus, Options{Allocations: f.allocs.get, Clock: f.clock})
	if s := statusOf(mgr.Apply(f.ctx, f.policy(map[int]string{5: "all-balanced"})), 5); s.State != StateApplied || !s.Changed {
		t.Fatalf("status = %+v, want Applied", s)
	}
	if d := mig.Describe(f.instances(t, 5)); d != "3g.20gb,2g.10gb,1g.5gb,1g.5gb" {
		t.Errorf("layout = %q", d)
	}
}

// writes is a MIGLib that counts the calls that change a GPU and fails them
// with err when err is set; reads go to the mock.
type writes struct {
	nvidia.MIGLib
	mu    sync.Mutex
	calls int
	err   error
}

func (w *writes) do(f func() error) error {
	w.mu.Lock()
	w.calls++
	err := w.err
	w.mu.Unlock()
	if err != nil {
		return err
	}
	return f()
}

func (w *writes) SetMIGMode(uuid string, enabled bool) error {
	return w.do(func() error { return w.MIGLib.SetMIGMode(uuid, enabled) })
}

func (w *writes) CreateMIGInstance(uuid string, profileID int, at mig.Placement) (mig.GPUInstance, error) {
	var gi mig.GPUInstance
	err := w.do(func() (err error) { gi, err = w.MIGLib.CreateMIGInstance(uuid, profileID, at); return err })
	return gi, err
}

func (w *writes) DestroyMIGInstance(uuid string, gi int) error {
	return w.do(func() error { return w.MIGLib.DestroyMIGInstance(uuid, gi) })
}

func (w *writes) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.calls
}

func (w *writes) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.err = err
}

// withWrites puts a writes wrapper between the fixture's manager and the mock.
func (f *fixture) withWrites() *writes {
	w := &writes{MIGLib: f.mock}
	f.mgr = NewManager(w, f.gpus, Options{Allocations: f.allocs.get, Registerer: prometheus.NewRegistry(), Event: f.events.record, Clock: f.clock})
	return w
}

// owner applies layouts to the mock as another MIG manager would.
func (f *fixture) owner(t *testing.T, layouts map[int]string) {
	t.Helper()
	op := NewManager(f.mock, f.gpus, Options{Allocations: f.allocs.get, Clock: f.clock})
	for _, s := range op.Apply(f.ctx, f.policy(layouts)) {
		if s.State != StateApplied {
			t.Fatalf("the other MIG manager could not apply its layout: %+v", s)
		}
	}
}

func TestExternalOwnerChangesNothing(t *testing.T) {
	f := newFixture(t, "dgxh100")
	// The other MIG manager (the GPU operator's) partitions GPUs 0 and 1.
	f.owner(t, map[int]string{0: "all-1g.10gb", 1: "all-3g.40gb"})
	w := f.withWrites()
	// gpufrac's config: GPU 0 and 2 in mode mig (no layout), GPU 1 in mode fraction.
	np := f.policy(nil)
	np.GPUModes[0], np.GPUModes[2] = config.ModeMIG, config.ModeMIG
	np.Policy.MIG.Owner = config.MIGOwnerExternal
	ss := f.mgr.Apply(f.ctx, np)
	if n := w.count(); n != 0 {
		t.Errorf("%d NVML calls changed a GPU whose MIG another manager owns, want none", n)
	}
	want := []string{"0 Applied ", "1 Pending ExternalOwner", "2 Pending ExternalOwner", "3 Applied "}
	var got []string
	for _, s := range ss[:4] {
		got = append(got, fmt.Sprintf("%d %s %s", s.Index, s.State, s.Reason))
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("statuses (-want +got):\n%s", diff)
	}
	if s := statusOf(ss, 1); !strings.Contains(s.Message, "mode fraction, but its MIG mode is enabled") {
		t.Errorf("GPU 1 message = %q, want it to say why it is not served", s.Message)
	}
	if f.mgr.retryDue(f.ctx) {
		t.Error("retryDue with nothing changed")
	}
	// The owner changes GPU 0's layout and turns MIG off on GPU 1: each is
	// noticed, so that the resources are rebuilt.
	f.owner(t, map[int]string{0: "all-3g.40gb"})
	if !f.mgr.retryDue(f.ctx) {
		t.Error("retryDue false after the owner changed the GPUs")
	}
	ss = f.mgr.Apply(f.ctx, np)
	if s := statusOf(ss, 1); s.State != StateApplied {
		t.Errorf("GPU 1 once its owner disabled MIG = %+v, want Applied", s)
	}
	if got := len(f.mgr.Devices()[f.gpus[0].UUID]); got != 2 {
		t.Errorf("GPU 0 has %d MIG devices after the owner's change, want 2", got)
	}
	if f.mgr.retryDue(f.ctx) {
		t.Error("retryDue after the change was applied")
	}
	if n := w.count(); n != 0 {
		t.Errorf("%d NVML calls changed a GPU, want none", n)
	}
}

func TestNoPermissionIsReportedOnceAndNotRetried(t *testing.T) {
	f := newFixture(t, "dgxh100")
	w := f.withWrites()
	w.fail(fmt.Errorf("setting MIG mode: %w", nvidia.ErrNoPermission))
	np := f.policy(map[int]string{0: "all-1g.10gb"})
	s := statusOf(f.mgr.Apply(f.ctx, np), 0)
	if s.State != StateFailed || s.Reason != ReasonNoPermission || !strings.Contains(s.Message, "SYS_ADMIN") || !strings.Contains(s.Message, "mig.owner: external") {
		t.Fatalf("status = %+v, want Failed NoPermission naming SYS_ADMIN and mig.owner", s)
	}
	for range 3 {
		f.clock.Step(10 * time.Minute)
		if f.mgr.retryDue(f.ctx) {
			t.Error("retryDue for a change NVML refuses for lack of privilege")
		}
		if s := statusOf(f.mgr.Apply(f.ctx, np), 0); s.Reason != ReasonNoPermission || s.Changed {
			t.Errorf("status on a later apply = %+v", s)
		}
	}
	if n := w.count(); n != 1 {
		t.Errorf("%d MIG changes tried, want 1", n)
	}
	if got := f.events.get(); !cmp.Equal(got, []string{"Warning MIGLayoutFailed"}) {
		t.Errorf("events = %v, want one warning", got)
	}
	// An admin enables MIG by hand: the GPU is looked at again.
	if err := f.mock.SetMIGMode(f.gpus[0].UUID, true); err != nil {
		t.Fatal(err)
	}
	if !f.mgr.retryDue(f.ctx) {
		t.Error("retryDue false after the GPU's MIG mode changed")
	}
	if s := statusOf(f.mgr.Apply(f.ctx, np), 0); s.Reason != ReasonNoPermission {
		t.Errorf("status after the admin's change = %+v, want NoPermission again (the instances)", s)
	}
	if n := w.count(); n != 2 {
		t.Errorf("%d MIG changes tried, want 2 (once more in the GPU's new state)", n)
	}
}

func TestNVMLErrorRetriesBackOff(t *testing.T) {
	f := newFixture(t, "dgxh100")
	w := f.withWrites()
	w.fail(errors.New("NVML: unknown error"))
	np := f.policy(map[int]string{0: "all-1g.10gb"})
	if s := statusOf(f.mgr.Apply(f.ctx, np), 0); s.Reason != ReasonNVMLError {
		t.Fatalf("status = %+v, want Failed NVMLError", s)
	}
	for _, wait := range []time.Duration{10 * time.Second, 20 * time.Second, 40 * time.Second} {
		f.clock.Step(wait - time.Second)
		if f.mgr.retryDue(f.ctx) {
			t.Errorf("retryDue %s before the back-off of %s ended", wait-time.Second, wait)
		}
		f.mgr.Apply(f.ctx, np) // a config write in between tries nothing either
		f.clock.Step(time.Second)
		if !f.mgr.retryDue(f.ctx) {
			t.Errorf("retryDue false after the back-off of %s", wait)
		}
		f.mgr.Apply(f.ctx, np)
	}
	if n := w.count(); n != 4 {
		t.Errorf("%d MIG changes tried, want 4 (the first and three retries)", n)
	}
	if got := f.events.get(); !cmp.Equal(got, []string{"Warning MIGLayoutFailed"}) {
		t.Errorf("events = %v, want one warning for the same failure", got)
	}
	w.fail(nil)
	f.clock.Step(80 * time.Second)
	if s := statusOf(f.mgr.Apply(f.ctx, np), 0); s.State != StateApplied {
		t.Fatalf("status once NVML works = %+v", s)
	}
	if f.mgr.backoff.IsInBackOffSinceUpdate(f.gpus[0].UUID, f.clock.Now()) {
		t.Error("the back-off was not reset by the success")
	}
}

func TestAFailedRebuildIsRetriedUntilItSucceeds(t *testing.T) {
	f := newFixture(t, "dgxh100")
	np := f.policy(nil) // every GPU in mode fraction, gpufrac owns MIG
	f.mgr.Apply(f.ctx, np)
	var calls int
	var fail error = errors.New("the API server is down")
	f.mgr.opts.Retry = func(context.Context) error { calls++; return fail }
	if f.mgr.tick(f.ctx) {
		t.Fatal("a retry with nothing changed")
	}
	// Someone turns MIG on for GPU 3 (an admin's nvidia-smi): noticed once,
	// whatever the config says; the rebuild fails and is owed.
	if err := f.mock.SetMIGMode(f.gpus[3].UUID, true); err != nil {
		t.Fatal(err)
	}
	if !f.mgr.tick(f.ctx) || calls != 1 {
		t.Fatalf("no retry after the GPU's MIG mode changed (calls %d)", calls)
	}
	f.clock.Step(5 * time.Second)
	if f.mgr.tick(f.ctx) {
		t.Error("retried within the back-off of the failed rebuild")
	}
	f.clock.Step(5 * time.Second)
	fail = nil
	if !f.mgr.tick(f.ctx) || calls != 2 {
		t.Errorf("the failed rebuild was not retried after its back-off (calls %d)", calls)
	}
	f.clock.Step(time.Minute)
	if f.mgr.tick(f.ctx) {
		t.Error("retried again after the rebuild succeeded")
	}
}

func TestForgetStopsRetriesNobodyAsksFor(t *testing.T) {
	f := newFixture(t, "dgxh100")
	w := f.withWrites()
	w.fail(errors.New("NVML: unknown error"))
	f.mgr.Apply(f.ctx, f.policy(map[int]string{0: "all-1g.10gb"}))
	f.clock.Step(time.Hour)
	if !f.mgr.retryDue(f.ctx) {
		t.Fatal("retryDue false after the back-off of an NVML error")
	}
	// The node falls back to its built-in config: nothing to retry.
	f.mgr.Forget()
	if f.mgr.retryDue(f.ctx) {
		t.Error("retryDue after Forget")
	}
	if got := testutil.CollectAndCount(f.mgr.metrics.pending); got != 0 {
		t.Errorf("%d pending series after Forget, want 0", got)
	}
}

// unreadable fails MIGMode reads of one GPU while set.
type unreadable struct {
	nvidia.MIGLib
	mu   sync.Mutex
	uuid string
}

func (u *unreadable) set(uuid string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.uuid = uuid
}

func (u *unreadable) MIGMode(uuid string) (nvidia.MIGMode, error) {
	u.mu.Lock()
	bad := u.uuid == uuid
	u.mu.Unlock()
	if bad {
		return nvidia.MIGMode{}, errors.New("NVML: GPU is lost")
	}
	return u.MIGLib.MIGMode(uuid)
}

func TestAnUnreadableGPUIsAChangeAndSoIsItsRecovery(t *testing.T) {
	f := newFixture(t, "dgxh100")
	u := &unreadable{MIGLib: f.mock}
	f.mgr = NewManager(u, f.gpus, Options{Allocations: f.allocs.get, Clock: f.clock})
	f.mgr.Apply(f.ctx, f.policy(nil))
	// A read that fails on alternate checks is no change.
	for range 3 {
		u.set(f.gpus[2].UUID)
		if f.mgr.retryDue(f.ctx) {
			t.Error("retryDue after one failed read")
		}
		u.set("")
		if f.mgr.retryDue(f.ctx) {
			t.Error("retryDue when a read worked again after one failure")
		}
	}
	// Two in a row are.
	u.set(f.gpus[2].UUID)
	f.mgr.retryDue(f.ctx)
	if !f.mgr.retryDue(f.ctx) {
		t.Error("retryDue false after two failed reads in a row")
	}
	if f.mgr.retryDue(f.ctx) {
		t.Error("retryDue again for the same unreadable GPU")
	}
	u.set("")
	if !f.mgr.retryDue(f.ctx) {
		t.Error("retryDue false when the GPU could be read again")
	}
}

func TestOneFailedReadDuringApplyIsNoChange(t *testing.T) {
	f := newFixture(t, "dgxh100")
	u := &unreadable{MIGLib: f.mock}
	f.mgr = NewManager(u, f.gpus, Options{Allocations: f.allocs.get, Clock: f.clock})
	// GPU 2's read fails during an apply, and works at the next check: no
	// change to rebuild for (a GPU whose reads fail now and then would
	// otherwise be rebuilt, its devices withdrawn and back, at nearly every
	// check).
	u.set(f.gpus[2].UUID)
	f.mgr.Apply(f.ctx, f.policy(nil))
	u.set("")
	if f.mgr.retryDue(f.ctx) {
		t.Error("retryDue after one failed read during Apply")
	}
}

func TestInstanceInUseIsRetriedAfterRetryInUse(t *testing.T) {
	f := newFixture(t, "dgxh100")
	f.mgr.Apply(f.ctx, f.policy(map[int]string{0: "all-1g.10gb"}))
	w := f.withWrites()
	w.fail(fmt.Errorf("destroying GPU instance: %w", nvidia.ErrInUse))
	// Back to fraction: the instances must go first, and a process holds one.
	np := f.policy(nil)
	if s := statusOf(f.mgr.Apply(f.ctx, np), 0); s.Reason != ReasonInUse {
		t.Fatalf("status = %+v, want InUse", s)
	}
	if f.mgr.retryDue(f.ctx) {
		t.Error("retryDue right after an instance in use, want after RetryInUse")
	}
	f.clock.Step(time.Minute)
	if !f.mgr.retryDue(f.ctx) {
		t.Error("retryDue false after RetryInUse")
	}
}

func TestAGPUPutInMIGModeIsNoticedWithoutAnApply(t *testing.T) {
	// The node agent's built-in config never applies a MIG policy, but a GPU
	// put in MIG mode must still stop being served whole.
	f := newFixture(t, "dgxh100")
	if f.mgr.retryDue(f.ctx) {
		t.Fatal("retryDue with nothing changed")
	}
	if err := f.mock.SetMIGMode(f.gpus[5].UUID, true); err != nil {
		t.Fatal(err)
	}
	if !f.mgr.retryDue(f.ctx) {
		t.Error("retryDue false after a GPU was put in MIG mode")
	}
}

func TestOweRetriesAtTheNextCheck(t *testing.T) {
	f := newFixture(t, "dgxh100")
	f.mgr.Apply(f.ctx, f.policy(nil))
	calls := 0
	f.mgr.opts.Retry = func(context.Context) error { calls++; return nil }
	if f.mgr.tick(f.ctx) {
		t.Fatal("a retry with nothing owed or changed")
	}
	// An apply failed after Apply recorded the GPUs' states.
	f.mgr.Owe()
	if !f.mgr.tick(f.ctx) || calls != 1 {
		t.Errorf("no retry at the check after Owe (calls %d)", calls)
	}
	if f.mgr.tick(f.ctx) {
		t.Error("retried again after the owed retry succeeded")
	}
}

func TestAnOweDuringARetryOutlivesItsSuccess(t *testing.T) {
	f := newFixture(t, "dgxh100")
	f.mgr.Apply(f.ctx, f.policy(nil))
	calls := 0
	// The first retry's apply succeeds but leaves out a GPU it could not
	// read, and owes another; the second reads it.
	f.mgr.opts.Retry = func(context.Context) error {
		calls++
		if calls == 1 {
			f.mgr.Owe()
		}
		return nil
	}
	f.mgr.Owe()
	if !f.mgr.tick(f.ctx) || calls != 1 {
		t.Fatalf("no retry at the check after Owe (calls %d)", calls)
	}
	f.clock.Step(5 * time.Second) // the next check, within the back-off
	if f.mgr.tick(f.ctx) {
		t.Error("the owed retry did not back off")
	}
	f.clock.Step(time.Minute) // past the back-off
	if !f.mgr.tick(f.ctx) || calls != 2 {
		t.Errorf("the Owe made during the first retry was lost (calls %d)", calls)
	}
	f.clock.Step(time.Minute)
	if f.mgr.tick(f.ctx) {
		t.Error("retried again after a retry that owed nothing")
	}
}

func TestRetryDueReadsAllocationsOnlyForTheReasonsThatNeedThem(t *testing.T) {
	f := newFixture(t, "dgxh100")
	reads := 0
	allocs := func(ctx context.Context) (map[string][]string, error) { reads++; return f.allocs.get(ctx) }
	f.mgr = NewManager(f.mock, f.gpus, Options{Allocations: allocs, Clock: f.clock})
	// GPU 0 in mode mig without a layout while MIG is off: Failed NoLayout,
	// which no allocation moves.
	np := f.policy(nil)
	np.GPUModes[0] = config.ModeMIG
	f.mgr.Apply(f.ctx, np)
	reads = 0
	f.mgr.retryDue(f.ctx)
	if reads != 0 {
		t.Errorf("PodResources read %d times for a status that does not wait on it", reads)
	}
}
