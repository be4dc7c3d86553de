// Package nvidia is gpufrac's narrow view of NVML. The device plugin, the
// health checker, the metrics collector and the memory watchdog see only the
// Lib interface; two backends implement it:
//
//   - NewReal: github.com/NVIDIA/go-nvml against the driver's libnvidia-ml.so.
//   - NewMock: go-nvml's mock servers (dgxh100, dgxa100) for inventory and
//     memory, plus gpufrac's own fakes for what those mocks panic on: running
//     processes, Xid events and NVLink topology. Tests and the demo drive
//     the fakes through the *Mock methods or a state directory (see
//     (*Mock).SyncFromDir).
//
// Both backends run the same code (nvmlLib) over an nvml.Interface; the mock
// differs only in the interface it wraps: a go-nvml mock server whose
// panicking calls are replaced by gpufrac's fakes.
//
// NVML return codes are turned into errors at this boundary (see Error);
// nothing above it imports go-nvml.
package nvidia

import (
	"context"
	"time"
)

// GPU is the static description of one physical GPU.
type GPU struct {
	// Index is NVML's device index.
	Index int
	// UUID is the GPU's UUID ("GPU-...").
	UUID string
	// Name is the product name as NVML reports it ("NVIDIA H100 80GB HBM3").
	Name string
	// Minor is the device minor number: the GPU is /dev/nvidia<Minor>.
	Minor int
	// MemoryBytes is the GPU's total framebuffer memory.
	MemoryBytes uint64
	// PCIBusID is the GPU's PCI bus ID ("0000:07:00.0").
	PCIBusID string
	// MIGCapable tells whether the GPU supports MIG.
	MIGCapable bool
}

// MemoryMiB returns the GPU's total memory in MiB.
func (g GPU) MemoryMiB() uint64 { return g.MemoryBytes / (1 << 20) }

// Memory is a GPU's framebuffer use.
type Memory struct {
	// TotalBytes is the GPU's total framebuffer memory.
	TotalBytes uint64
	// UsedBytes is the memory allocated by processes and the driver.
	UsedBytes uint64
}

// Process is one process holding memory on a GPU, as NVML reports it
// (compute and graphics processes merged; PIDs are host PIDs).
type Process struct {
	// PID is the host PID.
	PID uint32
	// UsedBytes is the GPU memory the process holds; 0 when NVML cannot
	// tell (NVML_VALUE_NOT_AVAILABLE).
	UsedBytes uint64
}

// XidEvent is one Xid error NVML reported for a GPU.
type XidEvent struct {
	// UUID is the GPU that reported the error; empty when NVML could not
	// tell which GPU it was.
	UUID string
	// Xid is the Xid code (79: fallen off the bus, 48: double-bit ECC, ...).
	// Which codes are fatal is the consumer's policy; all are delivered.
	Xid uint64
	// Time is when gpufrac received the event.
	Time time.Time
}

// Lib is the part of NVML gpufrac uses. Implementations are safe for
// concurrent use.
type Lib interface {
	// Init opens the library. The other calls are valid between Init and
	// Shutdown only.
	Init() error
	// Shutdown closes the library and drops cached device handles.
	Shutdown() error
	// DriverVersion is the kernel driver version ("550.54.15").
	DriverVersion() (string, error)
	// GPUs lists the physical GPUs in index order.
	GPUs() ([]GPU, error)
	// Memory reports a GPU's framebuffer use. Unknown UUIDs give
	// ErrNotFound; a GPU that fell off the bus gives ErrGPULost.
	Memory(uuid string) (Memory, error)
	// Utilization reports a GPU's compute utilization in percent over NVML's
	// last sample period.
	Utilization(uuid string) (uint32, error)
	// Processes lists the processes holding memory on a GPU, sorted by PID.
	Processes(uuid string) ([]Process, error)
	// Link reports how GPUs with indices a and b are connected: the NVLink
	// type when they share NVLinks (directly or through NVSwitch), else
	// their PCIe topology. Results are cached until Shutdown.
	Link(a, b int) (LinkType, error)
	// WatchXids streams critical Xid events for all GPUs until ctx ends; the
	// channel is closed then. A backend that cannot deliver events returns an
	// error, and the caller treats GPUs as healthy unless other checks fail.
	WatchXids(ctx context.Context) (<-chan XidEvent, error)
}
