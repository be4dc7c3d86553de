package nvidia

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"k8s.io/utils/clock"
)

// mockEventBuffer is how many undelivered events one fake NVML event set
// holds; InjectXid drops (and reports) events beyond it instead of blocking.
const mockEventBuffer = 64

// mockModel is a go-nvml mock server plus the topology gpufrac fakes for it.
type mockModel struct {
	// newServer builds the server with n GPUs (n <= 0: the DGX's eight).
	newServer func(n int) *server.Server
	// nvlinks is the number of NVLinks per GPU, all to NVSwitches.
	nvlinks int
	// switches is the number of NVSwitch chips on the baseboard.
	switches int
	// switchPCIDeviceID is the NVSwitch's PCI device ID (device<<16 | vendor).
	switchPCIDeviceID uint32
}

// lookupMockModel returns the model NewMock builds for name.
func lookupMockModel(name string) (mockModel, bool) {
	switch name {
	case "dgxh100":
		// DGX H100: 8x H100 SXM5, 18 NVLink4 links each to 4 NVSwitch chips.
		return mockModel{newServer: func(n int) *server.Server {
			if n <= 0 {
				return dgxh100.New()
			}
			return dgxh100.NewWithGPUs(gpus.Multiple(n, gpus.H100_SXM5_80GB)...)
		}, nvlinks: 18, switches: 4, switchPCIDeviceID: 0x22a310de}, true
	case "dgxa100":
		// DGX A100: 8x A100 SXM4, 12 NVLink3 links each to 6 NVSwitch chips.
		return mockModel{newServer: func(n int) *server.Server {
			if n <= 0 {
				return dgxa100.New()
			}
			return dgxa100.NewWithGPUs(gpus.Multiple(n, gpus.A100_SXM4_40GB)...)
		}, nvlinks: 12, switches: 6, switchPCIDeviceID: 0x1af110de}, true
	default:
		return mockModel{}, false
	}
}

// MockModels lists the model names NewMock accepts.
func MockModels() []string { return []string{"dgxa100", "dgxh100"} }

// Mock is a Lib over one of go-nvml's mock servers. Inventory (UUIDs, names,
// minors, memory, PCI, MIG) comes from the server through the same code as
// the real backend. The calls the server would panic on (running processes,
// utilization, event sets, topology and NVLink) are replaced by fakes that
// tests and the demo set through the methods below or a state directory
// (SyncFromDir). A Mock is safe for concurrent use.
type Mock struct {
	*nvmlLib
	server *server.Server
	model  mockModel

	// mu guards the fake state in every fakeGPU and the event sets.
	mu sync.Mutex
	// gpus in index order; fixed after NewMock.
	gpus []*fakeGPU
	// byUUID: GPU UUID -> its fake state; fixed after NewMock.
	byUUID map[string]*fakeGPU
	// mig holds the pending MIG modes the mock server lacks (mockmig.go).
	mig *mockMIG
}

var _ Lib = (*Mock)(nil)

// fakeGPU is the fake state of one mock GPU. dev, index and uuid are fixed;
// the fields after them are guarded by Mock.mu.
type fakeGPU struct {
	dev   *server.Device
	index int
	uuid  string

	procs []Process
	// memUsed is the explicit used memory when memUsedSet, else the sum of procs.
	memUsed    uint64
	memUsedSet bool
	util       uint32
	// fail, when set, is returned by Memory, Utilization and Processes.
	fail error
	// sets: registered event set -> registered event type mask.
	sets map[*fakeEventSet]uint64
}

// MockOption configures NewMock.
type MockOption func(*mockOptions)

type mockOptions struct {
	uuidSeed string
	gpuCount int
}

// WithUUIDSeed derives the GPU UUIDs from seed and the GPU index instead of
// drawing random ones: the same seed gives the same UUIDs, so a restarted
// gpufrac-node on mock GPUs keeps its device IDs (the kubelet checkpoints
// them). Use the node name as the seed so nodes differ.
func WithUUIDSeed(seed string) MockOption {
	return func(o *mockOptions) { o.uuidSeed = seed }
}

// WithGPUCount builds the mock with n GPUs of the model instead of the
// DGX's eight, e.g. to match a cloud instance type with one GPU.
func WithGPUCount(n int) MockOption {
	return func(o *mockOptions) { o.gpuCount = n }
}

// NewMock builds a Mock of the named model: "dgxh100" (8x H100 80GB) or
// "dgxa100" (8x A100 40GB). Each call creates a fresh server, with random
// UUIDs unless WithUUIDSeed is given.
func NewMock(model string, opts ...MockOption) (*Mock, error) {
	var o mockOptions
	for _, opt := range opts {
		opt(&o)
	}
	mm, ok := lookupMockModel(model)
	if !ok {
		return nil, fmt.Errorf("creating mock NVML: unknown model %q (known: %v)", model, MockModels())
	}
	srv := mm.newServer(o.gpuCount)
	m := &Mock{server: srv, model: mm, byUUID: map[string]*fakeGPU{}, mig: newMockMIG()}
	for i, d := range srv.Devices {
		dev, ok := d.(*server.Device)
		if !ok {
			return nil, fmt.Errorf("creating mock NVML: device %d is a %T, not a *server.Device", i, d)
		}
		if o.uuidSeed != "" {
			// The server reads Device.UUID on every call; nothing has
			// called it yet.
			dev.UUID = seededUUID(o.uuidSeed, model, i)
		}
		g := &fakeGPU{dev: dev, index: i, uuid: dev.UUID, sets: map[*fakeEventSet]uint64{}}
		m.gpus = append(m.gpus, g)
		m.byUUID[g.uuid] = g
	}
	for _, g := range m.gpus {
		m.installDeviceFakes(g)
	}
	srv.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		return &fakeEventSet{m: m, events: make(chan nvml.EventData, mockEventBuffer)}, nvml.SUCCESS
	}
	m.nvmlLib = newNVMLLib(srv, clock.RealClock{})
	return m, nil
}

// installDeviceFakes replaces the device calls the mock server would panic
// on, and completes GetPciInfo (the server leaves the bus ID empty).
// It runs before the Mock is shared, so setting the func fields is race-free.
func (m *Mock) installDeviceFakes(g *fakeGPU) {
	d := g.dev
	total := d.MemoryInfo.Total
	pci := mockPciInfo(d.PciBusID, d.Config.PciDeviceId)
	d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) { return pci, nvml.SUCCESS }

	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		m.mu.Lock()
		used := g.usedLocked()
		m.mu.Unlock()
		return nvml.Memory{Total: total, Used: used, Free: total - min(used, total)}, nvml.SUCCESS
	}
	d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
		m.mu.Lock()
		defer m.mu.Unlock()
		return nvml.Utilization{Gpu: g.util}, nvml.SUCCESS
	}
	d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		m.mu.Lock()
		defer m.mu.Unlock()
		infos := make([]nvml.ProcessInfo, len(g.procs))
		for i, p := range g.procs {
			infos[i] = nvml.ProcessInfo{Pid: p.PID, UsedGpuMemory: p.UsedBytes}
		}
		return infos, nvml.SUCCESS
	}
	d.GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return nil, nvml.SUCCESS
	}

	// Topology of a DGX: GPUs on two CPU sockets, half on each, every GPU
	// on the NVSwitch fabric with all its NVLinks.
	perSocket := max(1, len(m.gpus)/2)
	d.GetTopologyCommonAncestorFunc = func(other nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
		o, ok := other.(*server.Device)
		switch {
		case !ok:
			return 0, nvml.ERROR_INVALID_ARGUMENT
		case o == d:
			return nvml.TOPOLOGY_INTERNAL, nvml.SUCCESS
		case o.Index/perSocket == d.Index/perSocket:
			return nvml.TOPOLOGY_NODE, nvml.SUCCESS
		default:
			return nvml.TOPOLOGY_SYSTEM, nvml.SUCCESS
		}
	}
	validLink := func(link int) bool { return link >= 0 && link < m.model.nvlinks }
	d.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
		if !validLink(link) {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		return nvml.FEATURE_ENABLED, nvml.SUCCESS
	}
	d.GetNvLinkRemoteDeviceTypeFunc = func(link int) (nvml.IntNvLinkDeviceType, nvml.Return) {
		if !validLink(link) {
			return nvml.NVLINK_DEVICE_TYPE_UNKNOWN, nvml.ERROR_INVALID_ARGUMENT
		}
		return nvml.NVLINK_DEVICE_TYPE_SWITCH, nvml.SUCCESS
	}
	d.GetNvLinkRemotePciInfoFunc = func(link int) (nvml.PciInfo, nvml.Return) {
		if !validLink(link) {
			return nvml.PciInfo{}, nvml.ERROR_INVALID_ARGUMENT
		}
		sw := link % m.model.switches
		return mockPciInfo(fmt.Sprintf("0000:%02x:00.0", 0xa0+sw), m.model.switchPCIDeviceID), nvml.SUCCESS
	}

	const supportedEvents = nvml.EventTypeXidCriticalError | nvml.EventTypeSingleBitEccError | nvml.EventTypeDoubleBitEccError
	d.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return supportedEvents, nvml.SUCCESS }
	d.RegisterEventsFunc = func(types uint64, set nvml.EventSet) nvml.Return {
		s, ok := set.(*fakeEventSet)
		if !ok {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		if types&^uint64(supportedEvents) != 0 {
			return nvml.ERROR_NOT_SUPPORTED
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		if s.freed {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		g.sets[s] |= types
		return nvml.SUCCESS
	}
}

// seededUUID is a GPU UUID ("GPU-xxxxxxxx-xxxx-5xxx-yxxx-xxxxxxxxxxxx", an
// RFC 4122 version-5-style layout) derived from seed, model and index.
func seededUUID(seed, model string, index int) string {
	sum := sha256.Sum256([]byte(fmt.Sprintf("gpufrac-mock\x00%s\x00%s\x00%d", seed, model, index)))
	b := sum[:16]
	b[6] = b[6]&0x0f | 0x50
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// mockPciInfo is the nvml.PciInfo of a device at bus ID legacy
// ("0000:07:00.0"), with BusId in NVML's 8-digit-domain form.
func mockPciInfo(legacy string, deviceID uint32) nvml.PciInfo {
	p := nvml.PciInfo{PciDeviceId: deviceID}
	var fn uint32
	_, _ = fmt.Sscanf(legacy, "%x:%x:%x.%x", &p.Domain, &p.Bus, &p.Device, &fn)
	copyCString(p.BusIdLegacy[:], legacy)
	copyCString(p.BusId[:], "0000"+legacy)
	return p
}

// copyCString copies s into a NUL-terminated C char array, truncating.
func copyCString(dst []int8, s string) {
	n := min(len(s), len(dst)-1)
	for i := range n {
		dst[i] = int8(s[i])
	}
	dst[n] = 0
}

// usedLocked is the fake used memory; the caller holds Mock.mu.
func (g *fakeGPU) usedLocked() uint64 {
	if g.memUsedSet {
		return g.memUsed
	}
	var sum uint64
	for _, p := range g.procs {
		sum += p.UsedBytes
	}
	return sum
}

// gpu returns the fake state of the GPU with the given UUID.
func (m *Mock) gpu(uuid string) (*fakeGPU, error) {
	g, ok := m.byUUID[uuid]
	if !ok {
		return nil, fmt.Errorf("mock GPU %q: %w", uuid, ErrNotFound)
	}
	return g, nil
}

// resolve returns the GPU a state-file key names: a UUID or a decimal index.
func (m *Mock) resolve(key string) (*fakeGPU, error) {
	if g, ok := m.byUUID[key]; ok {
		return g, nil
	}
	if i, err := strconv.Atoi(key); err == nil && i >= 0 && i < len(m.gpus) {
		return m.gpus[i], nil
	}
	return nil, fmt.Errorf("mock GPU %q (neither a UUID nor an index below %d): %w", key, len(m.gpus), ErrNotFound)
}

// failure returns the error FailGPU set for uuid, if any.
func (m *Mock) failure(uuid string) error {
	g, ok := m.byUUID[uuid]
	if !ok {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return g.fail
}

// Memory implements Lib: total from the mock server, used from the fakes
// (SetMemoryUsed, else the sum of the fake processes).
func (m *Mock) Memory(uuid string) (Memory, error) {
	if err := m.failure(uuid); err != nil {
		return Memory{}, fmt.Errorf("getting memory of %s: %w", uuid, err)
	}
	return m.nvmlLib.Memory(uuid)
}

// Utilization implements Lib with the value SetUtilization set (0 by default).
func (m *Mock) Utilization(uuid string) (uint32, error) {
	if err := m.failure(uuid); err != nil {
		return 0, fmt.Errorf("getting utilization of %s: %w", uuid, err)
	}
	return m.nvmlLib.Utilization(uuid)
}

// Processes implements Lib with the processes SetProcesses set.
func (m *Mock) Processes(uuid string) ([]Process, error) {
	if err := m.failure(uuid); err != nil {
		return nil, fmt.Errorf("listing processes on %s: %w", uuid, err)
	}
	return m.nvmlLib.Processes(uuid)
}

// SetProcesses replaces the fake processes on a GPU (nil clears them).
func (m *Mock) SetProcesses(uuid string, procs []Process) error {
	g, err := m.gpu(uuid)
	if err != nil {
		return fmt.Errorf("setting processes: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	g.procs = append([]Process(nil), procs...)
	return nil
}

// SetMemoryUsed fixes a GPU's used memory, overriding the sum of its fake
// processes.
func (m *Mock) SetMemoryUsed(uuid string, bytes uint64) error {
	g, err := m.gpu(uuid)
	if err != nil {
		return fmt.Errorf("setting used memory: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	g.memUsed, g.memUsedSet = bytes, true
	return nil
}

// ClearMemoryUsed undoes SetMemoryUsed: used memory is again the sum of the
// GPU's fake processes.
func (m *Mock) ClearMemoryUsed(uuid string) error {
	g, err := m.gpu(uuid)
	if err != nil {
		return fmt.Errorf("clearing used memory: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	g.memUsed, g.memUsedSet = 0, false
	return nil
}

// SetUtilization sets a GPU's compute utilization in percent (0..100).
func (m *Mock) SetUtilization(uuid string, pct uint32) error {
	g, err := m.gpu(uuid)
	if err != nil {
		return fmt.Errorf("setting utilization: %w", err)
	}
	if pct > 100 {
		return fmt.Errorf("setting utilization of %s to %d%%: above 100%%", uuid, pct)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	g.util = pct
	return nil
}

// FailGPU makes Memory, Utilization and Processes of a GPU return err
// (wrapped); FailGPU(uuid, nil) heals the GPU.
func (m *Mock) FailGPU(uuid string, err error) error {
	g, gerr := m.gpu(uuid)
	if gerr != nil {
		return fmt.Errorf("failing GPU: %w", gerr)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	g.fail = err
	return nil
}

// InjectXid delivers a critical Xid event for a GPU to every active
// WatchXids subscriber. It never blocks: a subscriber whose buffer is full
// loses the event, and InjectXid then returns an error saying so (the other
// subscribers still get it). Unknown UUIDs are an error.
func (m *Mock) InjectXid(uuid string, xid uint64) error {
	g, err := m.gpu(uuid)
	if err != nil {
		return fmt.Errorf("injecting Xid %d: %w", xid, err)
	}
	data := nvml.EventData{Device: g.dev, EventType: nvml.EventTypeXidCriticalError, EventData: xid}
	m.mu.Lock()
	defer m.mu.Unlock()
	subscribers, dropped := 0, 0
	for s, types := range g.sets {
		if types&nvml.EventTypeXidCriticalError == 0 {
			continue
		}
		subscribers++
		select {
		case s.events <- data:
		default:
			dropped++
		}
	}
	if dropped > 0 {
		return fmt.Errorf("injecting Xid %d on %s: %d of %d subscribers have a full buffer: %w", xid, uuid, dropped, subscribers, ErrXidDropped)
	}
	return nil
}

// ErrXidDropped is returned (wrapped) by InjectXid when a subscriber's
// buffer was full and it lost the event.
var ErrXidDropped = errors.New("xid event dropped")

// subscribers is the number of live event sets registered for Xids on any
// GPU (for tests: WatchXids cleans up after ctx ends).
func (m *Mock) subscribers() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	sets := map[*fakeEventSet]bool{}
	for _, g := range m.gpus {
		for s := range g.sets {
			sets[s] = true
		}
	}
	return len(sets)
}

// uuids lists the mock's GPU UUIDs in index order.
func (m *Mock) uuids() []string {
	out := make([]string, len(m.gpus))
	for i, g := range m.gpus {
		out[i] = g.uuid
	}
	return out
}

// fakeEventSet is an NVML event set fed by InjectXid.
type fakeEventSet struct {
	m      *Mock
	events chan nvml.EventData
	// freed is guarded by m.mu.
	freed bool
}

var _ nvml.EventSet = (*fakeEventSet)(nil)

// Wait returns the next event, or ERROR_TIMEOUT after timeoutms
// milliseconds, like nvmlEventSetWait.
func (s *fakeEventSet) Wait(timeoutms uint32) (nvml.EventData, nvml.Return) {
	s.m.mu.Lock()
	freed := s.freed
	s.m.mu.Unlock()
	if freed {
		return nvml.EventData{}, nvml.ERROR_UNINITIALIZED
	}
	timer := time.NewTimer(time.Duration(timeoutms) * time.Millisecond)
	defer timer.Stop()
	select {
	case e := <-s.events:
		return e, nvml.SUCCESS
	case <-timer.C:
		return nvml.EventData{}, nvml.ERROR_TIMEOUT
	}
}

// Free unregisters the set from every GPU.
func (s *fakeEventSet) Free() nvml.Return {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if s.freed {
		return nvml.ERROR_UNINITIALIZED
	}
	s.freed = true
	for _, g := range s.m.gpus {
		delete(g.sets, s)
	}
	return nvml.SUCCESS
}
