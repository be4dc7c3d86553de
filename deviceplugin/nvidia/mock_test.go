package nvidia

import (
	"context"
	"errors"
	"regexp"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/google/go-cmp/cmp"
	testingclock "k8s.io/utils/clock/testing"
)

func TestMockInventory(t *testing.T) {
	tests := []struct {
		name   string
		model  string
		config gpus.Config // the GPU the go-nvml mock server is built from
		count  int
	}{
		{name: "dgx h100", model: "dgxh100", config: gpus.H100_SXM5_80GB, count: 8},
		{name: "dgx a100", model: "dgxa100", config: gpus.A100_SXM4_40GB, count: 8},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := newTestMock(t, tc.model)
			got, err := m.GPUs()
			if err != nil {
				t.Fatalf("GPUs: %v", err)
			}
			// The expectation comes from the mock server's own data, read
			// directly rather than through NVML calls.
			var want []GPU
			for i, d := range m.server.Devices {
				sd := d.(*server.Device)
				want = append(want, GPU{
					Index:       i,
					UUID:        sd.UUID,
					Name:        tc.config.Name,
					Minor:       sd.Minor,
					MemoryBytes: tc.config.MemoryMB << 20,
					PCIBusID:    sd.PciBusID,
					MIGCapable:  true,
				})
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("GPUs (-want +got):\n%s", diff)
			}
			if len(got) != tc.count {
				t.Errorf("len(GPUs) = %d, want %d", len(got), tc.count)
			}
			uuids, minors := map[string]bool{}, map[int]bool{}
			for _, g := range got {
				if uuids[g.UUID] || minors[g.Minor] {
					t.Errorf("GPU %d repeats UUID %s or minor %d", g.Index, g.UUID, g.Minor)
				}
				uuids[g.UUID], minors[g.Minor] = true, true
				if g.MemoryMiB() != tc.config.MemoryMB {
					t.Errorf("GPU %d MemoryMiB() = %d, want %d", g.Index, g.MemoryMiB(), tc.config.MemoryMB)
				}
			}
			v, err := m.DriverVersion()
			if err != nil || v != m.server.DriverVersion {
				t.Errorf("DriverVersion() = %q, %v; want %q", v, err, m.server.DriverVersion)
			}
		})
	}
}

func TestNewMockUnknownModel(t *testing.T) {
	if _, err := NewMock("dgx-1"); err == nil {
		t.Error("NewMock(dgx-1) succeeded, want an error")
	}
}

func TestMockMemoryAndProcesses(t *testing.T) {
	const gib = 1 << 30
	tests := []struct {
		name      string
		procs     []Process
		memUsed   *uint64
		wantProcs []Process
		wantUsed  uint64
	}{
		{name: "idle", wantProcs: []Process{}, wantUsed: 0},
		{
			name:      "used is the sum of processes",
			procs:     []Process{{PID: 300, UsedBytes: 3 * gib}, {PID: 100, UsedBytes: 1 * gib}},
			wantProcs: []Process{{PID: 100, UsedBytes: 1 * gib}, {PID: 300, UsedBytes: 3 * gib}},
			wantUsed:  4 * gib,
		},
		{
			name:      "explicit used memory wins",
			procs:     []Process{{PID: 100, UsedBytes: 1 * gib}},
			memUsed:   ptr(uint64(10 * gib)),
			wantProcs: []Process{{PID: 100, UsedBytes: 1 * gib}},
			wantUsed:  10 * gib,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := newTestMock(t, "dgxh100")
			all, err := m.GPUs()
			if err != nil {
				t.Fatalf("GPUs: %v", err)
			}
			g, other := all[2], all[3]
			if err := m.SetProcesses(g.UUID, tc.procs); err != nil {
				t.Fatalf("SetProcesses: %v", err)
			}
			if tc.memUsed != nil {
				if err := m.SetMemoryUsed(g.UUID, *tc.memUsed); err != nil {
					t.Fatalf("SetMemoryUsed: %v", err)
				}
			}
			gotProcs, err := m.Processes(g.UUID)
			if err != nil {
				t.Fatalf("Processes: %v", err)
			}
			if diff := cmp.Diff(tc.wantProcs, gotProcs); diff != "" {
				t.Errorf("Processes (-want +got):\n%s", diff)
			}
			mem, err := m.Memory(g.UUID)
			if err != nil {
				t.Fatalf("Memory: %v", err)
			}
			if diff := cmp.Diff(Memory{TotalBytes: g.MemoryBytes, UsedBytes: tc.wantUsed}, mem); diff != "" {
				t.Errorf("Memory (-want +got):\n%s", diff)
			}
			// Fakes are per GPU.
			if mem, err := m.Memory(other.UUID); err != nil || mem.UsedBytes != 0 {
				t.Errorf("Memory(other GPU) = %+v, %v; want 0 used", mem, err)
			}
		})
	}
}

func TestMockClearMemoryUsed(t *testing.T) {
	m := newTestMock(t, "dgxa100")
	uuid := m.uuids()[0]
	if err := m.SetProcesses(uuid, []Process{{PID: 1, UsedBytes: 7}}); err != nil {
		t.Fatal(err)
	}
	if err := m.SetMemoryUsed(uuid, 100); err != nil {
		t.Fatal(err)
	}
	if err := m.ClearMemoryUsed(uuid); err != nil {
		t.Fatal(err)
	}
	if mem, err := m.Memory(uuid); err != nil || mem.UsedBytes != 7 {
		t.Errorf("Memory after ClearMemoryUsed = %+v, %v; want the processes' 7 bytes", mem, err)
	}
}

func TestMockUtilization(t *testing.T) {
	m := newTestMock(t, "dgxh100")
	uuid := m.uuids()[5]
	if got, err := m.Utilization(uuid); err != nil || got != 0 {
		t.Errorf("Utilization before set = %d, %v; want 0", got, err)
	}
	if err := m.SetUtilization(uuid, 42); err != nil {
		t.Fatalf("SetUtilization: %v", err)
	}
	if got, err := m.Utilization(uuid); err != nil || got != 42 {
		t.Errorf("Utilization = %d, %v; want 42", got, err)
	}
	if err := m.SetUtilization(uuid, 101); err == nil {
		t.Error("SetUtilization(101) succeeded, want an error")
	}
}

func TestMockUnknownGPU(t *testing.T) {
	m := newTestMock(t, "dgxh100")
	const uuid = "GPU-00000000-0000-0000-0000-000000000000"
	calls := []struct {
		name string
		call func() error
	}{
		{name: "Memory", call: func() error { _, err := m.Memory(uuid); return err }},
		{name: "Utilization", call: func() error { _, err := m.Utilization(uuid); return err }},
		{name: "Processes", call: func() error { _, err := m.Processes(uuid); return err }},
		{name: "SetProcesses", call: func() error { return m.SetProcesses(uuid, nil) }},
		{name: "SetMemoryUsed", call: func() error { return m.SetMemoryUsed(uuid, 1) }},
		{name: "SetUtilization", call: func() error { return m.SetUtilization(uuid, 1) }},
		{name: "FailGPU", call: func() error { return m.FailGPU(uuid, errors.New("boom")) }},
		{name: "InjectXid", call: func() error { return m.InjectXid(uuid, 79) }},
	}
	for _, tc := range calls {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); !errors.Is(err, ErrNotFound) {
				t.Errorf("%s(unknown GPU) = %v, want ErrNotFound", tc.name, err)
			}
		})
	}
}

func TestMockFailGPU(t *testing.T) {
	errBoom := errors.New("boom")
	tests := []struct {
		name string
		fail error
	}{
		{name: "custom error", fail: errBoom},
		{name: "gpu lost", fail: nvmlError(nvml.ERROR_GPU_IS_LOST)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := newTestMock(t, "dgxh100")
			uuids := m.uuids()
			bad, good := uuids[1], uuids[2]
			if err := m.FailGPU(bad, tc.fail); err != nil {
				t.Fatalf("FailGPU: %v", err)
			}
			check := func(uuid string, want error) {
				t.Helper()
				_, errM := m.Memory(uuid)
				_, errU := m.Utilization(uuid)
				_, errP := m.Processes(uuid)
				for name, err := range map[string]error{"Memory": errM, "Utilization": errU, "Processes": errP} {
					if want == nil && err != nil {
						t.Errorf("%s(%s) = %v, want no error", name, uuid, err)
					}
					if want != nil && !errors.Is(err, want) {
						t.Errorf("%s(%s) = %v, want an error matching %v", name, uuid, err, want)
					}
				}
			}
			check(bad, tc.fail)
			check(good, nil)
			if _, err := m.GPUs(); err != nil {
				t.Errorf("GPUs with a failed GPU: %v, want the inventory", err)
			}
			if err := m.FailGPU(bad, nil); err != nil {
				t.Fatalf("FailGPU(nil): %v", err)
			}
			check(bad, nil)
		})
	}
}

func TestMockXidTwoSubscribers(t *testing.T) {
	m := newTestMock(t, "dgxh100")
	clk := testingclock.NewFakePassiveClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	m.clock = clk
	ctx, cancel := context.WithCancel(testContext(t))
	defer cancel()
	ch1, err := m.WatchXids(ctx)
	if err != nil {
		t.Fatalf("WatchXids 1: %v", err)
	}
	ch2, err := m.WatchXids(ctx)
	if err != nil {
		t.Fatalf("WatchXids 2: %v", err)
	}
	uuids := m.uuids()
	injected := []XidEvent{
		{UUID: uuids[3], Xid: 79, Time: clk.Now()},
		{UUID: uuids[0], Xid: 48, Time: clk.Now()},
	}
	for _, ev := range injected {
		if err := m.InjectXid(ev.UUID, ev.Xid); err != nil {
			t.Fatalf("InjectXid(%s, %d): %v", ev.UUID, ev.Xid, err)
		}
	}
	for i, ch := range []<-chan XidEvent{ch1, ch2} {
		var got []XidEvent
		for range injected {
			got = append(got, receive(t, ch))
		}
		if diff := cmp.Diff(injected, got); diff != "" {
			t.Errorf("subscriber %d events (-want +got):\n%s", i+1, diff)
		}
	}
	cancel()
	waitClosed(t, ch1)
	waitClosed(t, ch2)
	if n := m.subscribers(); n != 0 {
		t.Errorf("subscribers after ctx ended = %d, want 0 (event sets freed)", n)
	}
	if err := m.InjectXid(uuids[3], 79); err != nil {
		t.Errorf("InjectXid without subscribers = %v, want nil", err)
	}
}

func TestMockInjectXidNeverBlocks(t *testing.T) {
	m := newTestMock(t, "dgxh100")
	ctx, cancel := context.WithCancel(testContext(t))
	defer cancel()
	ch, err := m.WatchXids(ctx)
	if err != nil {
		t.Fatalf("WatchXids: %v", err)
	}
	uuid := m.uuids()[0]
	// Nobody reads ch: at most the event set, the channel and the event in
	// the watch goroutine's hand hold events; the rest must be dropped.
	const injected = 3 * (mockEventBuffer + xidBuffer)
	dropped := 0
	for i := range injected {
		err := m.InjectXid(uuid, uint64(i))
		switch {
		case errors.Is(err, ErrXidDropped):
			dropped++
		case err != nil:
			t.Fatalf("InjectXid: %v", err)
		}
	}
	if min := injected - (mockEventBuffer + xidBuffer + 1); dropped < min {
		t.Errorf("dropped %d of %d events, want at least %d", dropped, injected, min)
	}
	// What was not dropped arrives, in order.
	last := -1
	for range injected - dropped {
		ev := receive(t, ch)
		if int(ev.Xid) <= last {
			t.Fatalf("Xid %d after %d: out of order", ev.Xid, last)
		}
		last = int(ev.Xid)
	}
	cancel()
	waitClosed(t, ch)
}

func TestMockWatchXidsSkipsUnsupportedGPU(t *testing.T) {
	m := newTestMock(t, "dgxh100")
	uuids := m.uuids()
	m.gpus[0].dev.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
		return nvml.EventTypeSingleBitEccError, nvml.SUCCESS
	}
	m.gpus[1].dev.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
		return 0, nvml.ERROR_NOT_SUPPORTED
	}
	ctx, cancel := context.WithCancel(testContext(t))
	defer cancel()
	ch, err := m.WatchXids(ctx)
	if err != nil {
		t.Fatalf("WatchXids: %v", err)
	}
	// One event set serves the subscriber, so events arrive in injection
	// order: getting GPU 2's first shows GPUs 0 and 1 were not registered.
	for _, u := range uuids[:3] {
		if err := m.InjectXid(u, 79); err != nil {
			t.Fatalf("InjectXid(%s): %v", u, err)
		}
	}
	if got := receive(t, ch); got.UUID != uuids[2] {
		t.Errorf("first event from %s, want %s (GPUs 0 and 1 do not support Xid events)", got.UUID, uuids[2])
	}
	cancel()
	waitClosed(t, ch)
}

func TestMockWatchXidsNoGPUSupportsEvents(t *testing.T) {
	m := newTestMock(t, "dgxa100")
	for _, g := range m.gpus {
		g.dev.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return 0, nvml.SUCCESS }
	}
	ch, err := m.WatchXids(testContext(t))
	if !errors.Is(err, ErrNotSupported) || ch != nil {
		t.Errorf("WatchXids = %v, %v; want nil, ErrNotSupported", ch, err)
	}
	if n := m.subscribers(); n != 0 {
		t.Errorf("subscribers = %d, want 0", n)
	}
}

func TestMockLinkNVSwitch(t *testing.T) {
	tests := []struct {
		name  string
		model string
	}{
		{name: "dgx h100", model: "dgxh100"},
		{name: "dgx a100", model: "dgxa100"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := newTestMock(t, tc.model)
			want := NVLinks(m.model.nvlinks)
			n := len(m.gpus)
			for a := range n {
				for b := range n {
					if a == b {
						continue
					}
					got, err := m.Link(a, b)
					if err != nil || got != want {
						t.Errorf("Link(%d, %d) = %v, %v; want %v", a, b, got, err, want)
					}
				}
			}
			if _, err := m.Link(1, 1); err == nil {
				t.Error("Link(1, 1) succeeded, want an error")
			}
			if _, err := m.Link(0, n); !errors.Is(err, ErrNotFound) {
				t.Errorf("Link(0, %d) = %v, want ErrNotFound", n, err)
			}
		})
	}
}

// TestMockLinkDirectNVLink rewires the mock's NVLinks so that GPUs 0 and 1
// share 4 direct links and no GPU reaches an NVSwitch: other pairs then
// report their PCIe topology.
func TestMockLinkDirectNVLink(t *testing.T) {
	tests := []struct {
		name string
		// remoteTypeRet is what GetNvLinkRemoteDeviceType answers; old drivers
		// do not support it and the remote PCI bus ID decides alone.
		remoteTypeRet nvml.Return
	}{
		{name: "remote type known", remoteTypeRet: nvml.SUCCESS},
		{name: "remote type not supported", remoteTypeRet: nvml.ERROR_NOT_SUPPORTED},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := newTestMock(t, "dgxh100")
			for i, g := range m.gpus {
				var peer *server.Device
				switch i {
				case 0:
					peer = m.gpus[1].dev
				case 1:
					peer = m.gpus[0].dev
				}
				g.dev.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
					if link >= 18 {
						return 0, nvml.ERROR_INVALID_ARGUMENT
					}
					if peer != nil && link < 4 {
						return nvml.FEATURE_ENABLED, nvml.SUCCESS
					}
					return nvml.FEATURE_DISABLED, nvml.SUCCESS
				}
				g.dev.GetNvLinkRemoteDeviceTypeFunc = func(int) (nvml.IntNvLinkDeviceType, nvml.Return) {
					return nvml.NVLINK_DEVICE_TYPE_GPU, tc.remoteTypeRet
				}
				g.dev.GetNvLinkRemotePciInfoFunc = func(int) (nvml.PciInfo, nvml.Return) {
					return mockPciInfo(peer.PciBusID, peer.Config.PciDeviceId), nvml.SUCCESS
				}
			}
			want := map[[2]int]LinkType{
				{0, 1}: NVLinks(4),
				{1, 0}: NVLinks(4),
				{0, 2}: LinkSameCPU,  // same CPU socket in the fake topology
				{2, 3}: LinkSameCPU,  //
				{1, 5}: LinkCrossCPU, // other socket
				{4, 7}: LinkSameCPU,
			}
			got := map[[2]int]LinkType{}
			for pair := range want {
				l, err := m.Link(pair[0], pair[1])
				if err != nil {
					t.Fatalf("Link%v: %v", pair, err)
				}
				got[pair] = l
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("links (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMockLinkError(t *testing.T) {
	m := newTestMock(t, "dgxh100")
	m.gpus[2].dev.GetNvLinkStateFunc = func(int) (nvml.EnableState, nvml.Return) {
		return 0, nvml.ERROR_GPU_IS_LOST
	}
	_, err := m.Link(2, 3)
	if !errors.Is(err, ErrGPULost) {
		t.Errorf("Link(2, 3) = %v, want ErrGPULost", err)
	}
	if _, err := m.Link(3, 4); err != nil {
		t.Errorf("Link(3, 4) = %v, want no error", err)
	}
}

func ptr[T any](v T) *T { return &v }

// TestMockConcurrentUse drives every fake and the shared code from several
// goroutines at once (for go test -race).
func TestMockConcurrentUse(t *testing.T) {
	m := newTestMock(t, "dgxh100")
	uuids := m.uuids()
	ctx, cancel := context.WithCancel(testContext(t))
	defer cancel()
	ch, err := m.WatchXids(ctx)
	if err != nil {
		t.Fatalf("WatchXids: %v", err)
	}
	done := make(chan error, len(uuids))
	for i, u := range uuids {
		go func() {
			for j := range 50 {
				if err := m.SetProcesses(u, []Process{{PID: uint32(j + 1), UsedBytes: uint64(j)}}); err != nil {
					done <- err
					return
				}
				if _, err := m.Memory(u); err != nil {
					done <- err
					return
				}
				if _, err := m.Processes(u); err != nil {
					done <- err
					return
				}
				if _, err := m.GPUs(); err != nil {
					done <- err
					return
				}
				if _, err := m.Link(i, (i+1)%len(uuids)); err != nil {
					done <- err
					return
				}
			}
			done <- m.InjectXid(u, uint64(i))
		}()
	}
	for range uuids {
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("concurrent use: %v", err)
			}
		case <-time.After(testTimeout):
			t.Fatal("concurrent use did not finish")
		}
	}
	seen := map[string]bool{}
	for range uuids {
		seen[receive(t, ch).UUID] = true
	}
	if len(seen) != len(uuids) {
		t.Errorf("Xids from %d GPUs, want %d", len(seen), len(uuids))
	}
	cancel()
	waitClosed(t, ch)
}

func TestNewMockUUIDSeed(t *testing.T) {
	gpusOf := func(model string, opts ...MockOption) []GPU {
		t.Helper()
		m, err := NewMock(model, opts...)
		if err != nil {
			t.Fatalf("NewMock: %v", err)
		}
		gs, err := m.GPUs()
		if err != nil {
			t.Fatalf("GPUs: %v", err)
		}
		return gs
	}
	tests := []struct {
		name     string
		a, b     []GPU
		wantSame bool
	}{
		{name: "same seed, same UUIDs", a: gpusOf("dgxh100", WithUUIDSeed("node-1")), b: gpusOf("dgxh100", WithUUIDSeed("node-1")), wantSame: true},
		{name: "other seed, other UUIDs", a: gpusOf("dgxh100", WithUUIDSeed("node-1")), b: gpusOf("dgxh100", WithUUIDSeed("node-2"))},
		{name: "other model, other UUIDs", a: gpusOf("dgxh100", WithUUIDSeed("node-1")), b: gpusOf("dgxa100", WithUUIDSeed("node-1"))},
		{name: "no seed, random UUIDs", a: gpusOf("dgxh100"), b: gpusOf("dgxh100")},
	}
	uuidRE := regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			seen := map[string]bool{}
			for i := range tc.a {
				a, b := tc.a[i].UUID, tc.b[i].UUID
				if (a == b) != tc.wantSame {
					t.Errorf("GPU %d UUIDs %s and %s: same = %v, want %v", i, a, b, a == b, tc.wantSame)
				}
				if !uuidRE.MatchString(a) {
					t.Errorf("GPU %d UUID %q is not of the form GPU-<uuid>", i, a)
				}
				if seen[a] {
					t.Errorf("UUID %s repeated", a)
				}
				seen[a] = true
			}
		})
	}
}

func TestMockGPUCount(t *testing.T) {
	for _, model := range MockModels() {
		m, err := NewMock(model, WithGPUCount(1))
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Init(); err != nil {
			t.Fatal(err)
		}
		gs, err := m.GPUs()
		if err != nil || len(gs) != 1 {
			t.Errorf("%s with one GPU: %d GPUs, %v", model, len(gs), err)
		}
	}
}
