// Package nvidia is gpufrac's narrow view of NVML. The device plugin, the
// health checker, the metrics collector and the memory watchdog see only the
// Lib interface; two backends implement it:
//
//   - NewReal: github.com/NVIDIA/go-nvml against the driver's libnvidia-ml.so.
//   - NewMock: go-nvml's mock servers (dgxh100, dgxa100) for inventory and
//     memory, plus gpufrac's own fakes for what those mocks panic on: running
//     processes, Xid events and NVLink topology. Tests and the demo drive
//     the fakes through the *Mock methods or a state directory (see MockState).
//
// NVML return codes are turned into errors at this boundary; nothing above it
// imports go-nvml.
package nvidia

import (
	"context"
	"errors"
	"time"
)

// ErrNotFound is returned for a GPU UUID the library does not know.
var ErrNotFound = errors.New("gpu not found")

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
	TotalBytes uint64
	UsedBytes  uint64
}

// Process is one process holding memory on a GPU, as NVML reports it
// (compute and graphics processes merged; PIDs are host PIDs).
type Process struct {
	PID       uint32
	UsedBytes uint64
}

// XidEvent is one Xid error NVML reported for a GPU.
type XidEvent struct {
	UUID string
	Xid  uint64
	Time time.Time
}

// LinkType is the kind of connection between two GPUs. Values match the
// ordering go-gpuallocator scores (higher is better); see topology.go.
type LinkType int

// Lib is the part of NVML gpufrac uses. Implementations are safe for
// concurrent use.
type Lib interface {
	// Init opens the library; Shutdown closes it. Calls in between only.
	Init() error
	Shutdown() error
	// DriverVersion is the kernel driver version ("550.54.15").
	DriverVersion() (string, error)
	// GPUs lists the physical GPUs in index order.
	GPUs() ([]GPU, error)
	// Memory reports a GPU's framebuffer use.
	Memory(uuid string) (Memory, error)
	// Utilization reports a GPU's compute utilization in percent over NVML's
	// last sample period.
	Utilization(uuid string) (uint32, error)
	// Processes lists the processes holding memory on a GPU.
	Processes(uuid string) ([]Process, error)
	// Link reports how GPUs with indices a and b are connected.
	Link(a, b int) (LinkType, error)
	// WatchXids streams critical Xid events for all GPUs until ctx ends; the
	// channel is closed then. A backend that cannot deliver events returns an
	// error, and the caller treats GPUs as healthy unless other checks fail.
	WatchXids(ctx context.Context) (<-chan XidEvent, error)
}
