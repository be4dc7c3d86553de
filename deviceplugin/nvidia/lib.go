package nvidia

import (
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/utils/clock"
)

// nvmlLib implements Lib over any nvml.Interface: the driver's library
// (NewReal) or a go-nvml mock server with gpufrac's fakes installed
// (NewMock). Everything here is shared by both backends; MIG support
// (mig.go) adds methods on the same type.
type nvmlLib struct {
	nvml  nvml.Interface
	clock clock.PassiveClock
	// xidWait bounds one NVML event wait, and so how long a WatchXids
	// goroutine takes to notice that its ctx ended.
	xidWait time.Duration

	// mu guards the caches below. NVML handles and topology are stable
	// between Init and Shutdown, so they are looked up once.
	mu sync.Mutex
	// handles: GPU UUID -> NVML device handle.
	handles map[string]nvml.Device
	// links: GPU index pair (low, high) -> link type.
	links map[[2]int]LinkType
	// remotes: GPU index -> where its NVLinks lead.
	remotes map[int]nvlinkRemotes
}

var _ Lib = (*nvmlLib)(nil)

func newNVMLLib(lib nvml.Interface, clk clock.PassiveClock) *nvmlLib {
	n := &nvmlLib{nvml: lib, clock: clk, xidWait: defaultXidWait}
	n.resetCachesLocked()
	return n
}

// resetCachesLocked drops cached handles and topology; the caller holds n.mu
// or owns n exclusively.
func (n *nvmlLib) resetCachesLocked() {
	n.handles = map[string]nvml.Device{}
	n.links = map[[2]int]LinkType{}
	n.remotes = map[int]nvlinkRemotes{}
}

// Init implements Lib.
func (n *nvmlLib) Init() error {
	if err := nvmlError(n.nvml.Init()); err != nil {
		return fmt.Errorf("initializing NVML: %w", err)
	}
	return nil
}

// Shutdown implements Lib.
func (n *nvmlLib) Shutdown() error {
	n.mu.Lock()
	n.resetCachesLocked()
	n.mu.Unlock()
	if err := nvmlError(n.nvml.Shutdown()); err != nil {
		return fmt.Errorf("shutting down NVML: %w", err)
	}
	return nil
}

// DriverVersion implements Lib.
func (n *nvmlLib) DriverVersion() (string, error) {
	v, ret := n.nvml.SystemGetDriverVersion()
	if err := nvmlError(ret); err != nil {
		return "", fmt.Errorf("getting driver version: %w", err)
	}
	return v, nil
}

// GPUs implements Lib.
func (n *nvmlLib) GPUs() ([]GPU, error) {
	count, ret := n.nvml.DeviceGetCount()
	if err := nvmlError(ret); err != nil {
		return nil, fmt.Errorf("counting GPUs: %w", err)
	}
	gpus := make([]GPU, 0, count)
	for i := range count {
		d, err := n.deviceByIndex(i)
		if err != nil {
			return nil, err
		}
		g, err := readGPU(i, d)
		if err != nil {
			return nil, err
		}
		n.mu.Lock()
		n.handles[g.UUID] = d
		n.mu.Unlock()
		gpus = append(gpus, g)
	}
	return gpus, nil
}

// readGPU reads the static description of the GPU at index i.
func readGPU(i int, d nvml.Device) (GPU, error) {
	g := GPU{Index: i}
	var ret nvml.Return
	if g.UUID, ret = d.GetUUID(); ret != nvml.SUCCESS {
		return g, fmt.Errorf("getting UUID of GPU %d: %w", i, nvmlError(ret))
	}
	if g.Name, ret = d.GetName(); ret != nvml.SUCCESS {
		return g, fmt.Errorf("getting name of %s: %w", g.UUID, nvmlError(ret))
	}
	if g.Minor, ret = d.GetMinorNumber(); ret != nvml.SUCCESS {
		return g, fmt.Errorf("getting minor number of %s: %w", g.UUID, nvmlError(ret))
	}
	mem, ret := d.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return g, fmt.Errorf("getting memory of %s: %w", g.UUID, nvmlError(ret))
	}
	g.MemoryBytes = mem.Total
	pci, ret := d.GetPciInfo()
	if ret != nvml.SUCCESS {
		return g, fmt.Errorf("getting PCI info of %s: %w", g.UUID, nvmlError(ret))
	}
	g.PCIBusID = busID(pci)
	// GPUs without MIG answer NOT_SUPPORTED; that is a "no", not a failure.
	switch _, _, ret := d.GetMigMode(); ret {
	case nvml.SUCCESS:
		g.MIGCapable = true
	case nvml.ERROR_NOT_SUPPORTED:
	default:
		return g, fmt.Errorf("getting MIG mode of %s: %w", g.UUID, nvmlError(ret))
	}
	return g, nil
}

// deviceByIndex returns the handle of the GPU at index i.
func (n *nvmlLib) deviceByIndex(i int) (nvml.Device, error) {
	d, ret := n.nvml.DeviceGetHandleByIndex(i)
	switch ret {
	case nvml.SUCCESS:
		return d, nil
	case nvml.ERROR_INVALID_ARGUMENT, nvml.ERROR_NOT_FOUND:
		return nil, fmt.Errorf("getting handle of GPU %d: %w: %w", i, ErrNotFound, nvmlError(ret))
	default:
		return nil, fmt.Errorf("getting handle of GPU %d: %w", i, nvmlError(ret))
	}
}

// device returns the (cached) handle of the GPU with the given UUID.
func (n *nvmlLib) device(uuid string) (nvml.Device, error) {
	n.mu.Lock()
	d, ok := n.handles[uuid]
	n.mu.Unlock()
	if ok {
		return d, nil
	}
	d, ret := n.nvml.DeviceGetHandleByUUID(uuid)
	switch ret {
	case nvml.SUCCESS:
	case nvml.ERROR_INVALID_ARGUMENT, nvml.ERROR_NOT_FOUND:
		// NVML answers INVALID_ARGUMENT for malformed UUIDs, NOT_FOUND for
		// well-formed unknown ones; either way the GPU is not here.
		return nil, fmt.Errorf("looking up %s: %w: %w", uuid, ErrNotFound, nvmlError(ret))
	default:
		return nil, fmt.Errorf("looking up %s: %w", uuid, nvmlError(ret))
	}
	n.mu.Lock()
	n.handles[uuid] = d
	n.mu.Unlock()
	return d, nil
}

// Memory implements Lib.
func (n *nvmlLib) Memory(uuid string) (Memory, error) {
	d, err := n.device(uuid)
	if err != nil {
		return Memory{}, fmt.Errorf("getting memory of %s: %w", uuid, err)
	}
	mem, ret := d.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return Memory{}, fmt.Errorf("getting memory of %s: %w", uuid, nvmlError(ret))
	}
	return Memory{TotalBytes: mem.Total, UsedBytes: mem.Used}, nil
}

// Utilization implements Lib.
func (n *nvmlLib) Utilization(uuid string) (uint32, error) {
	d, err := n.device(uuid)
	if err != nil {
		return 0, fmt.Errorf("getting utilization of %s: %w", uuid, err)
	}
	u, ret := d.GetUtilizationRates()
	if ret != nvml.SUCCESS {
		return 0, fmt.Errorf("getting utilization of %s: %w", uuid, nvmlError(ret))
	}
	return u.Gpu, nil
}

// Processes implements Lib.
func (n *nvmlLib) Processes(uuid string) ([]Process, error) {
	d, err := n.device(uuid)
	if err != nil {
		return nil, fmt.Errorf("listing processes on %s: %w", uuid, err)
	}
	compute, ret := d.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("listing compute processes on %s: %w", uuid, nvmlError(ret))
	}
	// Compute-only GPUs (H100, A100) may not support graphics contexts.
	graphics, ret := d.GetGraphicsRunningProcesses()
	if ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_SUPPORTED {
		return nil, fmt.Errorf("listing graphics processes on %s: %w", uuid, nvmlError(ret))
	}
	return mergeProcesses(compute, graphics), nil
}

// notAvailable is NVML_VALUE_NOT_AVAILABLE as an unsigned 64-bit value.
const notAvailable = ^uint64(0)

// mergeProcesses merges NVML's compute and graphics process lists by PID,
// sorted by PID. A process with both kinds of context appears in both lists
// with its memory counted in each, so the larger value is kept rather than
// the sum. Memory NVML cannot report (NVML_VALUE_NOT_AVAILABLE, e.g. without
// permission) becomes 0 so that it never looks like an over-limit process.
func mergeProcesses(lists ...[]nvml.ProcessInfo) []Process {
	byPID := map[uint32]uint64{}
	for _, list := range lists {
		for _, p := range list {
			used := p.UsedGpuMemory
			if used == notAvailable {
				used = 0
			}
			byPID[p.Pid] = max(byPID[p.Pid], used)
		}
	}
	procs := make([]Process, 0, len(byPID))
	for pid, used := range byPID {
		procs = append(procs, Process{PID: pid, UsedBytes: used})
	}
	sort.Slice(procs, func(i, j int) bool { return procs[i].PID < procs[j].PID })
	return procs
}

// Link implements Lib.
func (n *nvmlLib) Link(a, b int) (LinkType, error) {
	if a == b {
		return LinkUnknown, fmt.Errorf("getting link of GPU %d to itself: a link needs two GPUs", a)
	}
	key := [2]int{min(a, b), max(a, b)}
	n.mu.Lock()
	l, ok := n.links[key]
	n.mu.Unlock()
	if ok {
		return l, nil
	}
	l, err := n.readLink(a, b)
	if err != nil {
		return LinkUnknown, fmt.Errorf("getting link between GPUs %d and %d: %w", a, b, err)
	}
	n.mu.Lock()
	n.links[key] = l
	n.mu.Unlock()
	return l, nil
}

// readLink asks NVML how GPUs a and b are connected.
func (n *nvmlLib) readLink(a, b int) (LinkType, error) {
	da, err := n.deviceByIndex(a)
	if err != nil {
		return LinkUnknown, err
	}
	db, err := n.deviceByIndex(b)
	if err != nil {
		return LinkUnknown, err
	}
	level, ret := da.GetTopologyCommonAncestor(db)
	if ret != nvml.SUCCESS {
		return LinkUnknown, fmt.Errorf("getting common ancestor: %w", nvmlError(ret))
	}
	ra, err := n.nvlinkRemotes(a, da)
	if err != nil {
		return LinkUnknown, err
	}
	rb, err := n.nvlinkRemotes(b, db)
	if err != nil {
		return LinkUnknown, err
	}
	pciB, ret := db.GetPciInfo()
	if ret != nvml.SUCCESS {
		return LinkUnknown, fmt.Errorf("getting PCI info of GPU %d: %w", b, nvmlError(ret))
	}
	return linkType(level, linksBetween(ra, rb, busID(pciB))), nil
}

// nvlinkRemotes returns (and caches) where GPU i's NVLinks lead.
func (n *nvmlLib) nvlinkRemotes(i int, d nvml.Device) (nvlinkRemotes, error) {
	n.mu.Lock()
	r, ok := n.remotes[i]
	n.mu.Unlock()
	if ok {
		return r, nil
	}
	r, err := readNVLinkRemotes(d)
	if err != nil {
		return r, fmt.Errorf("reading NVLinks of GPU %d: %w", i, err)
	}
	n.mu.Lock()
	n.remotes[i] = r
	n.mu.Unlock()
	return r, nil
}
