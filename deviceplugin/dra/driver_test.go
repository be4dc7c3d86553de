package dra

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	k8sresource "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/config"
	"github.com/gpufrac/gpufrac/deviceplugin/enforcement"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/deviceplugin/pods"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
	"github.com/gpufrac/gpufrac/mig"
)

// result is one allocated device of a claim.
type result struct {
	device   string
	share    string // share ID, for shared views
	capacity map[string]string
}

// claimWith builds an allocated claim of namespace "team".
func claimWith(name string, rs ...result) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: name, UID: types.UID("uid-" + name)}}
	c.Status.Allocation = &resourceapi.AllocationResult{}
	for _, r := range rs {
		res := resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: api.DRADriver, Pool: "node-a", Device: r.device}
		if r.share != "" {
			id := types.UID(r.share)
			res.ShareID = &id
		}
		for k, v := range r.capacity {
			if res.ConsumedCapacity == nil {
				res.ConsumedCapacity = map[resourceapi.QualifiedName]k8sresource.Quantity{}
			}
			res.ConsumedCapacity[resourceapi.QualifiedName(k)] = k8sresource.MustParse(v)
		}
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results, res)
	}
	return c
}

func shares(device, share string, n int) result {
	return result{device: device, share: share, capacity: map[string]string{api.DRACapacityShares: strconv.Itoa(n)}}
}

func memory(device, share, q string) result {
	return result{device: device, share: share, capacity: map[string]string{api.DRACapacityMemory: q}}
}

type fixture struct {
	d        *Driver
	stateDir string
	cdiDir   string
	gpu0     nvidia.GPU
}

func newFixture(t *testing.T, strategy resource.DeviceListStrategy) *fixture {
	t.Helper()
	f := &fixture{stateDir: t.TempDir(), cdiDir: t.TempDir(), gpu0: h100(0)}
	f.d = f.restart(t, strategy)
	return f
}

// restart builds a new driver on the same state (a gpufrac-node restart).
func (f *fixture) restart(t *testing.T, strategy resource.DeviceListStrategy) *Driver {
	t.Helper()
	d, err := NewDriver(Options{NodeName: "node-a", StateDir: f.stateDir, CDIDir: f.cdiDir, Strategy: strategy})
	if err != nil {
		t.Fatal(err)
	}
	g3 := h100(3)
	p, err := Build("node-a", []GPU{
		{GPU: f.gpu0, Mode: config.ModeFraction, Healthy: true},
		{GPU: h100(1), Mode: config.ModeExclusive, Healthy: true},
		{GPU: g3, Mode: config.ModeMIG, Healthy: true, MIG: []mig.GPUInstance{migInstance(g3.UUID, 5, 19, "1g.10gb", 0, 1, 10<<30)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	d.SetTargets(p.Targets)
	return d
}

func (f *fixture) prepare(t *testing.T, claims ...*resourceapi.ResourceClaim) map[types.UID]kubeletplugin.PrepareResult {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	out, err := f.d.PrepareResourceClaims(ctx, claims)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != len(claims) {
		t.Fatalf("%d results for %d claims", len(out), len(claims))
	}
	return out
}

func (f *fixture) unprepare(t *testing.T, names ...string) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	var objs []kubeletplugin.NamespacedObject
	for _, n := range names {
		objs = append(objs, kubeletplugin.NamespacedObject{UID: types.UID("uid-" + n), NamespacedName: types.NamespacedName{Namespace: "team", Name: n}})
	}
	out, err := f.d.UnprepareResourceClaims(ctx, objs)
	if err != nil {
		t.Fatal(err)
	}
	for uid, err := range out {
		if err != nil {
			t.Errorf("unpreparing %s: %v", uid, err)
		}
	}
}

// env is what a container given the devices of a prepared claim sees from
// gpufrac's CDI specs.
func (f *fixture) env(t *testing.T, r kubeletplugin.PrepareResult) map[string]string {
	t.Helper()
	var ids []string
	for _, d := range r.Devices {
		ids = append(ids, d.CDIDeviceIDs...)
	}
	env, err := ResolveCDIEnv(f.cdiDir, ids)
	if err != nil {
		t.Fatal(err)
	}
	return env
}

func TestPrepareGivesClaimsTheEnvOfAFraction(t *testing.T) {
	f := newFixture(t, resource.StrategyCDI)
	res := f.prepare(t,
		claimWith("s30", shares("gpu-0-shares", "share-1", 30)),
		claimWith("s50", shares("gpu-0-shares", "share-2", 50)))
	for _, c := range []struct {
		name  string
		units int
	}{{"s30", 30}, {"s50", 50}} {
		r := res[types.UID("uid-"+c.name)]
		if r.Err != nil {
			t.Fatalf("%s: %v", c.name, r.Err)
		}
		// Exactly what the fraction resource answers for the same units.
		frac := resource.SharedResponse(resource.StrategyCDI, f.gpu0, resource.MemoryLimitMiB(f.gpu0, c.units))
		if diff := cmp.Diff(frac.Envs, f.env(t, r)); diff != "" {
			t.Errorf("%s env (-fraction +claim):\n%s", c.name, diff)
		}
		want := []string{"nvidia.com/gpu=" + f.gpu0.UUID, api.DRACDIKind + "=uid-" + c.name + "-gpu-0-shares-share-" + map[string]string{"s30": "1", "s50": "2"}[c.name]}
		if diff := cmp.Diff(want, r.Devices[0].CDIDeviceIDs); diff != "" {
			t.Errorf("%s CDI device IDs (-want +got):\n%s", c.name, diff)
		}
		if r.Devices[0].ShareID == nil || r.Devices[0].PoolName != "node-a" || r.Devices[0].DeviceName != "gpu-0-shares" {
			t.Errorf("%s device %+v", c.name, r.Devices[0])
		}
	}
	if got := f.env(t, res["uid-s30"])[api.EnvMemoryLimitMiB]; got != "24467" { // 81559 MiB * 30 %
		t.Errorf("30 %% of an H100: %s MiB, want 24467", got)
	}
}

func TestPrepareMemoryView(t *testing.T) {
	f := newFixture(t, resource.StrategyDeviceSpecs)
	r := f.prepare(t, claimWith("m20", memory("gpu-0-memory", "s", "20Gi")))["uid-m20"]
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	env := f.env(t, r)
	// No CUDA_MPS_* variables: no MPS daemon applies them (issue 25).
	want := map[string]string{
		api.EnvMemoryLimitMiB: "20480",
		api.EnvVisibleDevices: "void",
	}
	if diff := cmp.Diff(want, env); diff != "" {
		t.Errorf("env (-want +got):\n%s", diff)
	}
	// With device specs the GPU's device nodes are in gpufrac's own spec.
	spec, err := ReadCDISpec(f.cdiDir, "uid-m20")
	if err != nil {
		t.Fatal(err)
	}
	var nodes []string
	for _, n := range spec.Devices[0].ContainerEdits.DeviceNodes {
		nodes = append(nodes, n.Path)
	}
	if diff := cmp.Diff([]string{"/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}, nodes); diff != "" {
		t.Errorf("device nodes (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{api.DRACDIKind + "=uid-m20-gpu-0-memory-s"}, r.Devices[0].CDIDeviceIDs); diff != "" {
		t.Errorf("CDI IDs (-want +got):\n%s", diff)
	}
}

func TestPrepareRefusesOverCapacity(t *testing.T) {
	tests := []struct {
		name    string
		before  []*resourceapi.ResourceClaim
		claim   *resourceapi.ResourceClaim
		wantErr string
	}{
		{name: "shares beyond 100",
			before:  []*resourceapi.ResourceClaim{claimWith("a", shares("gpu-0-shares", "1", 50)), claimWith("b", shares("gpu-0-shares", "2", 30))},
			claim:   claimWith("c", shares("gpu-0-shares", "3", 30)),
			wantErr: "30 shares of GPU GPU-a (gpu-0-shares) asked, 80 of 100 are held by team/a (50 shares), team/b (30 shares)"},
		{name: "bytes beyond the GPU",
			before:  []*resourceapi.ResourceClaim{claimWith("a", memory("gpu-0-memory", "1", "60Gi"))},
			claim:   claimWith("c", memory("gpu-0-memory", "2", "20Gi")),
			wantErr: "20480 MiB of GPU GPU-a (gpu-0-memory) asked, 61440 of 81559 MiB are held by team/a (61440 MiB)"},
		{name: "whole GPU while shared",
			before:  []*resourceapi.ResourceClaim{claimWith("a", shares("gpu-0-shares", "1", 10))},
			claim:   claimWith("c", result{device: "gpu-0"}),
			wantErr: "whole GPU GPU-a (gpu-0) is in use by team/a (10 shares)"},
		{name: "shares while held whole",
			before:  []*resourceapi.ResourceClaim{claimWith("a", result{device: "gpu-0"})},
			claim:   claimWith("c", shares("gpu-0-shares", "1", 10)),
			wantErr: "GPU GPU-a cannot be shared by percent (gpu-0-shares) while team/a (gpu-0)"},
		{name: "bytes while shared by percent",
			before:  []*resourceapi.ResourceClaim{claimWith("a", shares("gpu-0-shares", "1", 10))},
			claim:   claimWith("c", memory("gpu-0-memory", "2", "1Gi")),
			wantErr: "GPU GPU-a cannot be shared by memory (gpu-0-memory) while team/a (10 shares)"},
		{name: "a MIG device twice",
			before:  []*resourceapi.ResourceClaim{claimWith("a", result{device: "gpu-3-mig-1g10gb-19-0"})},
			claim:   claimWith("c", result{device: "gpu-3-mig-1g10gb-19-0"}),
			wantErr: "is in use by team/a (gpu-3-mig-1g10gb-19-0)"},
		{name: "two results of one claim count together",
			claim:   claimWith("c", shares("gpu-0-shares", "1", 60), shares("gpu-0-shares", "2", 60)),
			wantErr: "60 shares of GPU GPU-a (gpu-0-shares) asked, 60 of 100 are held by this claim (60 shares)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, resource.StrategyCDI)
			for uid, r := range f.prepare(t, tc.before...) {
				if r.Err != nil {
					t.Fatalf("preparing %s: %v", uid, r.Err)
				}
			}
			err := f.prepare(t, tc.claim)[tc.claim.UID].Err
			if !errors.Is(err, ErrOverCapacity) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error = %v, want ErrOverCapacity saying %q", err, tc.wantErr)
			}
			if _, statErr := os.Stat(cdiSpecPath(f.cdiDir, tc.claim.UID)); !os.IsNotExist(statErr) {
				t.Errorf("a refused claim left a CDI spec (%v)", statErr)
			}
			// Once the holders are unprepared, the same claim is prepared.
			var names []string
			for _, c := range tc.before {
				names = append(names, c.Name)
			}
			f.unprepare(t, names...)
			err = f.prepare(t, tc.claim)[tc.claim.UID].Err
			if tc.name == "two results of one claim count together" {
				if err == nil {
					t.Error("a claim over a GPU by itself was prepared")
				}
				return
			}
			if err != nil {
				t.Errorf("after the holders went: %v", err)
			}
		})
	}
}

func TestPrepareRefusesUnknownDevicesAndOtherNodes(t *testing.T) {
	f := newFixture(t, resource.StrategyCDI)
	if err := f.prepare(t, claimWith("x", result{device: "gpu-9"}))["uid-x"].Err; !errors.Is(err, ErrUnknownDevice) {
		t.Errorf("unknown device: %v, want ErrUnknownDevice", err)
	}
	other := claimWith("o", result{device: "gpu-1"})
	other.Status.Allocation.Devices.Results[0].Pool = "node-b"
	if err := f.prepare(t, other)["uid-o"].Err; err == nil || !strings.Contains(err.Error(), "no device of driver gpu.gpufrac.io in pool node-a") {
		t.Errorf("another node's device: %v", err)
	}
	unalloc := claimWith("u")
	unalloc.Status.Allocation = nil
	if err := f.prepare(t, unalloc)["uid-u"].Err; err == nil || !strings.Contains(err.Error(), "not allocated") {
		t.Errorf("unallocated claim: %v", err)
	}
}

// TestPrepareRefusesUnresolvedCDI: with the cdi strategy, a claim whose GPU's
// CDI name the node's specs do not resolve is refused at prepare, naming it,
// as Allocate refuses it on the device-plugin path; resolvable ones pass.
func TestPrepareRefusesUnresolvedCDI(t *testing.T) {
	f := newFixture(t, resource.StrategyCDI)
	missing := "nvidia.com/gpu=" + h100(1).UUID
	f.d.o.Unresolved = func(names []string) []string {
		var out []string
		for _, n := range names {
			if n == missing {
				out = append(out, n)
			}
		}
		return out
	}
	got := f.prepare(t, claimWith("w", result{device: "gpu-1"}), claimWith("s", shares("gpu-0-shares", "1", 30)))
	if err := got["uid-w"].Err; !errors.Is(err, ErrUnresolvedCDI) || !strings.Contains(err.Error(), missing) {
		t.Errorf("a GPU missing from the CDI specs: %v, want ErrUnresolvedCDI naming %s", err, missing)
	}
	if err := got["uid-s"].Err; err != nil {
		t.Errorf("a GPU the specs resolve: %v", err)
	}
	if ps := f.d.Prepared(); len(ps) != 1 || ps[0].Name != "s" {
		t.Errorf("prepared: %+v, want only the resolvable claim", ps)
	}
}

func TestPreparedClaimsSurviveARestart(t *testing.T) {
	f := newFixture(t, resource.StrategyCDI)
	first := f.prepare(t, claimWith("s30", shares("gpu-0-shares", "1", 30)), claimWith("w", result{device: "gpu-1"}))
	// A new driver on the same state: the same answer again (idempotent),
	// and the 30 shares still count.
	f.d = f.restart(t, resource.StrategyCDI)
	again := f.prepare(t, claimWith("s30", shares("gpu-0-shares", "1", 30)))
	if diff := cmp.Diff(first["uid-s30"], again["uid-s30"]); diff != "" {
		t.Errorf("prepare after restart (-before +after):\n%s", diff)
	}
	if err := f.prepare(t, claimWith("s80", shares("gpu-0-shares", "2", 80)))["uid-s80"].Err; !errors.Is(err, ErrOverCapacity) {
		t.Errorf("80 more shares after a restart: %v, want ErrOverCapacity", err)
	}
	if err := f.prepare(t, claimWith("w2", result{device: "gpu-1"}))["uid-w2"].Err; !errors.Is(err, ErrOverCapacity) {
		t.Errorf("the whole GPU again after a restart: %v, want ErrOverCapacity", err)
	}
	// Unprepare after the restart removes the spec; unknown claims are fine.
	f.unprepare(t, "s30", "never-prepared")
	if _, err := os.Stat(cdiSpecPath(f.cdiDir, "uid-s30")); !os.IsNotExist(err) {
		t.Errorf("CDI spec of an unprepared claim: %v", err)
	}
	got := f.d.Prepared()
	if len(got) != 1 || got[0].Name != "w" {
		t.Errorf("prepared after unprepare: %+v, want only team/w", got)
	}
}

func TestCorruptRecordStopsTheDriver(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, RecordFile)
	if err := os.WriteFile(path, []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := NewDriver(Options{NodeName: "node-a", StateDir: dir, CDIDir: t.TempDir()})
	if !errors.Is(err, ErrCorruptRecord) || !strings.Contains(err.Error(), path) {
		t.Fatalf("NewDriver error = %v, want ErrCorruptRecord naming %s", err, path)
	}
	if b, _ := os.ReadFile(path); string(b) != "{not json" {
		t.Error("the unreadable record was changed")
	}
}

func TestRecordWriteFailureKeepsNothingHalfDone(t *testing.T) {
	f := newFixture(t, resource.StrategyCDI)
	// The state directory becomes a file: the record cannot be saved.
	if err := os.RemoveAll(f.stateDir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.stateDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err := f.prepare(t, claimWith("s30", shares("gpu-0-shares", "1", 30)))["uid-s30"].Err
	if err == nil {
		t.Fatal("prepared without saving the record")
	}
	if len(f.d.Prepared()) != 0 {
		t.Error("a claim whose record was not saved counts as prepared")
	}
	if _, statErr := os.Stat(cdiSpecPath(f.cdiDir, "uid-s30")); !os.IsNotExist(statErr) {
		t.Errorf("CDI spec left behind: %v", statErr)
	}
}

func TestClaimAllowance(t *testing.T) {
	f := newFixture(t, resource.StrategyCDI)
	f.prepare(t,
		claimWith("s30", shares("gpu-0-shares", "1", 30)),
		claimWith("w", result{device: "gpu-1"}),
		claimWith("mig", result{device: "gpu-3-mig-1g10gb-19-0"}))
	cd := func(name, device, share string) pods.ClaimDevice {
		return pods.ClaimDevice{ClaimNamespace: "team", ClaimName: name, Pool: "node-a", Device: device, ShareID: share}
	}
	tests := []struct {
		dev     pods.ClaimDevice
		wantGPU string
		want    enforcement.Allowance
		wantOK  bool
	}{
		{cd("s30", "gpu-0-shares", "1"), "GPU-a", enforcement.Allowance{LimitBytes: 24467 << 20}, true},
		{cd("w", "gpu-1", ""), "GPU-b", enforcement.Allowance{Unlimited: true}, true},
		{cd("mig", "gpu-3-mig-1g10gb-19-0", ""), "", enforcement.Allowance{Unlimited: true}, true},
		{cd("s30", "gpu-0-shares", "other-share"), "", enforcement.Allowance{}, false},
		{cd("nope", "gpu-0", ""), "", enforcement.Allowance{}, false},
	}
	for _, tc := range tests {
		gpu, a, ok := f.d.ClaimAllowance(tc.dev)
		if gpu != tc.wantGPU || a != tc.want || ok != tc.wantOK {
			t.Errorf("ClaimAllowance(%+v) = %q, %+v, %v; want %q, %+v, %v", tc.dev, gpu, a, ok, tc.wantGPU, tc.want, tc.wantOK)
		}
	}
}

// TestPrepareRefusesMIGOnAGPUHeldAnotherWay: GPU 0 is held through a shared
// view when the node's config turns it to mode mig and its MIG devices are
// published (the layout manager waits for the GPU to be free; a layout
// made by hand does not). A MIG claim on it is refused as a whole or shared
// claim on a GPU with MIG claims is: one GPU is used one way at a time.
func TestPrepareRefusesMIGOnAGPUHeldAnotherWay(t *testing.T) {
	f := newFixture(t, resource.StrategyCDI)
	if err := f.prepare(t, claimWith("a", shares("gpu-0-shares", "1", 30)))["uid-a"].Err; err != nil {
		t.Fatal(err)
	}
	p, err := Build("node-a", []GPU{{GPU: f.gpu0, Mode: config.ModeMIG, Healthy: true,
		MIG: []mig.GPUInstance{migInstance(f.gpu0.UUID, 5, 19, "1g.10gb", 0, 1, 10<<30)}}})
	if err != nil {
		t.Fatal(err)
	}
	f.d.SetTargets(p.Targets)
	c := claimWith("m", result{device: api.DRAMIGDeviceName(0, "1g.10gb", 19, 0)})
	if err := f.prepare(t, c)[c.UID].Err; !errors.Is(err, ErrOverCapacity) || !strings.Contains(err.Error(), "team/a (30 shares)") {
		t.Fatalf("MIG device of a GPU shared by percent: %v, want ErrOverCapacity naming team/a", err)
	}
}

// TestFatalBackgroundErrorsStopTheDriver: the kubeletplugin helper reports
// the failure of its DRA or registration gRPC server to HandleError as a
// fatal error (not ErrRecoverable): the kubelet can no longer prepare any
// claim on the node, so the driver must not just log it and run on (every
// claim pod stuck); OnFatal hears it, once. Recoverable errors (publishing
// slices) are only logged.
func TestFatalBackgroundErrorsStopTheDriver(t *testing.T) {
	f := newFixture(t, resource.StrategyCDI)
	fatal := make(chan error, 4)
	f.d.OnFatal(func(err error) { fatal <- err })
	_, ctx := ktesting.NewTestContext(t)
	f.d.HandleError(ctx, fmt.Errorf("%w: the API server refused a slice", kubeletplugin.ErrRecoverable), "publishing slices")
	f.d.HandleError(ctx, errors.New("accept unix /var/lib/kubelet/plugins/gpu.gpufrac.io/dra.sock: use of closed network connection"), "DRA gRPC server failed")
	f.d.HandleError(ctx, errors.New("again"), "registrar gRPC server failed")
	select {
	case err := <-fatal:
		if !strings.Contains(err.Error(), "DRA gRPC server failed") {
			t.Errorf("fatal error %q does not say what failed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a fatal background error did not reach OnFatal")
	}
	select {
	case err := <-fatal:
		t.Errorf("OnFatal called again (or for a recoverable error): %v", err)
	case <-time.After(100 * time.Millisecond):
	}
}
