package cdi

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpufrac/gpufrac/deviceplugin/cdi/cditest"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
	"github.com/gpufrac/gpufrac/mig"
)

// inventory is the mock dgxh100's GPUs, with three MIG devices on GPU 0.
func inventory(t *testing.T) ([]nvidia.GPU, []mig.Device) {
	t.Helper()
	lib, err := nvidia.NewMock("dgxh100", nvidia.WithUUIDSeed("node-a"), nvidia.WithGPUCount(2))
	if err != nil {
		t.Fatal(err)
	}
	if err := lib.Init(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lib.Shutdown() })
	gpus, err := lib.GPUs()
	if err != nil {
		t.Fatal(err)
	}
	var migs []mig.Device
	for gi := 1; gi <= 3; gi++ {
		migs = append(migs, mig.Device{UUID: nvidia.MockMIGUUID(gpus[0].UUID, gi, 0), GPU: gpus[0].UUID, GI: gi})
	}
	return gpus, migs
}

func served(gpus []nvidia.GPU, migs []mig.Device) []string {
	var names []string
	for _, g := range gpus {
		names = append(names, Name(g.UUID))
	}
	for _, m := range migs {
		names = append(names, Name(m.UUID))
	}
	return names
}

func TestCheckerFindsMissingAndStaleSpecs(t *testing.T) {
	gpus, migs := inventory(t)
	dirs := []string{filepath.Join(t.TempDir(), "etc-cdi"), filepath.Join(t.TempDir(), "run-cdi")}
	reg := prometheus.NewRegistry()
	c, err := New(Options{SpecDirs: dirs, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	c.SetWanted(served(gpus, migs))

	// 1. No spec at all (the toolkit never ran): every device is missing.
	st := c.Check()
	if len(st.Missing) != 5 {
		t.Fatalf("missing %v, want all 5 devices", st.Missing)
	}
	if got := testutil.ToFloat64(c.metrics.unresolved); got != 5 {
		t.Errorf("gpufrac_cdi_devices_unresolved = %v, want 5", got)
	}

	// 2. A spec that names devices by index only (older nvidia-ctk default)
	// resolves none of gpufrac's UUID names.
	if _, err := cditest.Write(dirs[1], cditest.Spec(cditest.FromGPUs(gpus, migs), cditest.ByIndex)); err != nil {
		t.Fatal(err)
	}
	if st := c.Check(); len(st.Missing) != 5 {
		t.Errorf("with an index-only spec, missing %v, want all 5", st.Missing)
	}

	// 3. The spec nvidia-ctk writes by default (index and UUID names): all resolve.
	if _, err := cditest.Write(dirs[1], cditest.Spec(cditest.FromGPUs(gpus, migs))); err != nil {
		t.Fatal(err)
	}
	if st := c.Check(); !st.OK() || len(st.SpecErrors) > 0 {
		t.Fatalf("with the toolkit's spec: %+v", st)
	}
	if err := c.Ready(); err != nil {
		t.Errorf("Ready() before Run = %v, want nil", err)
	}

	// 4. A MIG layout change: the node serves a new MIG device the spec,
	// generated before the change, does not have.
	newMIG := mig.Device{UUID: nvidia.MockMIGUUID(gpus[0].UUID, 9, 0), GPU: gpus[0].UUID, GI: 9}
	c.SetWanted(served(gpus, append(migs[:1:1], newMIG)))
	st = c.Check()
	if diff := cmp.Diff([]string{Name(newMIG.UUID)}, st.Missing); diff != "" {
		t.Errorf("after a MIG layout change, missing (-want +got):\n%s", diff)
	}
	if msg := c.Describe(st); !strings.Contains(msg, "nvidia-ctk cdi generate") || !strings.Contains(msg, newMIG.UUID) {
		t.Errorf("Describe = %q, want the device and how to fix it", msg)
	}

	// 5. A broken spec file is reported, the good one still counts.
	if err := os.MkdirAll(dirs[0], 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dirs[0], "broken.yaml"), []byte("cdiVersion: 0.5.0\nkind: [\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	st = c.Check()
	if len(st.SpecErrors) != 1 || !strings.Contains(st.SpecErrors[0], "broken.yaml") {
		t.Errorf("spec errors %v, want broken.yaml", st.SpecErrors)
	}
	if got := testutil.ToFloat64(c.metrics.specErrors); got != 1 {
		t.Errorf("gpufrac_cdi_spec_error_files = %v, want 1", got)
	}
}

func TestRunReportsChangesAndFollowsTheSpecFiles(t *testing.T) {
	gpus, migs := inventory(t)
	dir := t.TempDir()
	var mu sync.Mutex
	var changes []Status
	c, err := New(Options{SpecDirs: []string{dir}, Interval: time.Hour, OnChange: func(st Status) {
		mu.Lock()
		defer mu.Unlock()
		changes = append(changes, st)
	}})
	if err != nil {
		t.Fatal(err)
	}
	c.SetWanted(served(gpus, migs))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitChanges := func(n int) Status {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			mu.Lock()
			got := len(changes)
			var last Status
			if got > 0 {
				last = changes[got-1]
			}
			mu.Unlock()
			if got >= n {
				return last
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d status changes after 5s, want %d", got, n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if st := waitChanges(1); st.OK() {
		t.Fatal("first check without a spec is OK")
	}
	if err := c.Ready(); !errors.Is(err, ErrUnresolved) {
		t.Errorf("Ready() = %v, want ErrUnresolved", err)
	}
	// The spec appears: Run sees it through the directory watch (the
	// interval is an hour).
	if _, err := cditest.Write(dir, cditest.Spec(cditest.FromGPUs(gpus, migs))); err != nil {
		t.Fatal(err)
	}
	if st := waitChanges(2); !st.OK() {
		t.Fatalf("after the spec appeared: %+v", st)
	}
	if err := c.Ready(); err != nil {
		t.Errorf("Ready() = %v, want nil", err)
	}
	// The spec is removed (toolkit uninstalled): reported again.
	if err := os.Remove(filepath.Join(dir, "nvidia.yaml")); err != nil {
		t.Fatal(err)
	}
	if st := waitChanges(3); st.OK() {
		t.Fatal("after the spec was removed, still OK")
	}
}

// fakeResource hands out one CDI device per ID, counting its allocations.
type fakeResource struct {
	ids   []string
	calls *int
}

func (f fakeResource) Name() string { return "nvidia.com/gpu" }
func (f fakeResource) Devices() []*pluginapi.Device {
	var out []*pluginapi.Device
	for _, id := range f.ids {
		out = append(out, &pluginapi.Device{ID: id, Health: pluginapi.Healthy})
	}
	return out
}
func (f fakeResource) Preferred(context.Context, []string, []string, int) ([]string, error) {
	return nil, nil
}
func (f fakeResource) Allocate(_ context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	if f.calls != nil {
		*f.calls++
	}
	resp := &pluginapi.ContainerAllocateResponse{}
	for _, id := range ids {
		uuid, _, err := resource.ParseUnitID(id)
		if err != nil {
			uuid = id
		}
		resp.CdiDevices = append(resp.CdiDevices, &pluginapi.CDIDevice{Name: Name(uuid)})
	}
	return resp, nil
}

func TestCheckedAllocateRefusesUnresolvedDevices(t *testing.T) {
	gpus, _ := inventory(t)
	dir := t.TempDir()
	c, err := New(Options{SpecDirs: []string{dir}})
	if err != nil {
		t.Fatal(err)
	}
	// Fraction units of GPU 0, and GPU 1 whole.
	var calls int
	res := c.Checked([]resource.Resource{fakeResource{ids: []string{resource.UnitID(gpus[0].UUID, 0), resource.UnitID(gpus[0].UUID, 1), gpus[1].UUID}, calls: &calls}})
	if st := c.Check(); len(st.Missing) != 2 {
		t.Fatalf("wanted names from the devices served: missing %v, want the 2 GPUs", st.Missing)
	}
	_, err = res[0].Allocate(t.Context(), []string{gpus[1].UUID})
	if !errors.Is(err, ErrUnresolved) || !strings.Contains(err.Error(), Name(gpus[1].UUID)) {
		t.Fatalf("Allocate without a spec = %v, want ErrUnresolved naming the device", err)
	}
	if got := testutil.ToFloat64(c.metrics.refused.WithLabelValues("nvidia.com/gpu")); got != 1 {
		t.Errorf("gpufrac_cdi_allocations_refused_total = %v, want 1", got)
	}
	// The refusal comes before the resource allocates anything: the
	// fraction resource records every answer it gives as placed (its pod
	// hint, for the next admissions) until the kubelet says otherwise.
	if calls != 0 {
		t.Errorf("the resource allocated %d times for a refused container, want 0", calls)
	}
	if _, err := cditest.Write(dir, cditest.Spec(cditest.FromGPUs(gpus, nil))); err != nil {
		t.Fatal(err)
	}
	resp, err := res[0].Allocate(t.Context(), []string{resource.UnitID(gpus[0].UUID, 1)})
	if err != nil {
		t.Fatalf("Allocate with the spec: %v", err)
	}
	if len(resp.CdiDevices) != 1 || resp.CdiDevices[0].Name != Name(gpus[0].UUID) {
		t.Errorf("CDI devices %v", resp.CdiDevices)
	}
}
