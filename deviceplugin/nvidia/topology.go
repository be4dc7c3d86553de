package nvidia

import (
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// LinkType is the kind of connection between two GPUs. The values equal
// go-gpuallocator's P2PLinkType constants (its internal/links package), so a
// LinkType converts to gpuallocator.P2PLink.Type unchanged; its best-effort
// policy scores higher values higher (PCIe 10..60, NVLink 100 per link).
type LinkType int

// Link types, in go-gpuallocator's order.
const (
	// LinkUnknown means no information (or no connection).
	LinkUnknown LinkType = iota
	// LinkCrossCPU is a PCIe path across the CPU interconnect (NVML_TOPOLOGY_SYSTEM).
	LinkCrossCPU
	// LinkSameCPU is a PCIe path within one NUMA node (NVML_TOPOLOGY_NODE).
	LinkSameCPU
	// LinkHostBridge is a path through one PCIe host bridge (NVML_TOPOLOGY_HOSTBRIDGE).
	LinkHostBridge
	// LinkMultiSwitch is a path through several PCIe switches (NVML_TOPOLOGY_MULTIPLE).
	LinkMultiSwitch
	// LinkSingleSwitch is a path through one PCIe switch (NVML_TOPOLOGY_SINGLE).
	LinkSingleSwitch
	// LinkSameBoard connects GPUs on one board (NVML_TOPOLOGY_INTERNAL).
	LinkSameBoard
	// LinkNVLink1 is one NVLink; LinkNVLink1+n-1 is n NVLinks (see NVLinks).
	LinkNVLink1
)

// MaxNVLinks is the most NVLinks go-gpuallocator scores (EighteenNVLINKLinks).
const MaxNVLinks = 18

// NVLinks is the link type of n NVLinks between two GPUs: LinkUnknown for
// n <= 0, capped at MaxNVLinks.
func NVLinks(n int) LinkType {
	if n <= 0 {
		return LinkUnknown
	}
	return LinkNVLink1 + LinkType(min(n, MaxNVLinks)-1)
}

// NVLinkCount is the number of NVLinks l stands for (0 for PCIe types).
func (l LinkType) NVLinkCount() int {
	if l < LinkNVLink1 {
		return 0
	}
	return int(l-LinkNVLink1) + 1
}

// String names the link type ("NVLinkx18", "SameCPU").
func (l LinkType) String() string {
	switch {
	case l == LinkUnknown:
		return "Unknown"
	case l == LinkCrossCPU:
		return "CrossCPU"
	case l == LinkSameCPU:
		return "SameCPU"
	case l == LinkHostBridge:
		return "HostBridge"
	case l == LinkMultiSwitch:
		return "MultiSwitch"
	case l == LinkSingleSwitch:
		return "SingleSwitch"
	case l == LinkSameBoard:
		return "SameBoard"
	case l >= LinkNVLink1 && l <= NVLinks(MaxNVLinks):
		return fmt.Sprintf("NVLinkx%d", l.NVLinkCount())
	default:
		return fmt.Sprintf("LinkType(%d)", int(l))
	}
}

// pcieLinkType maps NVML's common-ancestor level to a link type, as
// go-gpuallocator's links.GetP2PLink does. Unknown levels give LinkUnknown.
func pcieLinkType(level nvml.GpuTopologyLevel) LinkType {
	switch level {
	case nvml.TOPOLOGY_INTERNAL:
		return LinkSameBoard
	case nvml.TOPOLOGY_SINGLE:
		return LinkSingleSwitch
	case nvml.TOPOLOGY_MULTIPLE:
		return LinkMultiSwitch
	case nvml.TOPOLOGY_HOSTBRIDGE:
		return LinkHostBridge
	case nvml.TOPOLOGY_NODE:
		return LinkSameCPU
	case nvml.TOPOLOGY_SYSTEM:
		return LinkCrossCPU
	default:
		return LinkUnknown
	}
}

// linkType is the single link type Lib.Link reports: NVLink beats any PCIe
// path (go-gpuallocator scores one NVLink above the best PCIe level).
func linkType(level nvml.GpuTopologyLevel, nvlinks int) LinkType {
	if nvlinks > 0 {
		return NVLinks(nvlinks)
	}
	return pcieLinkType(level)
}

// nvlinkRemotes is where one GPU's active NVLinks lead.
type nvlinkRemotes struct {
	// gpus: normalized PCI bus ID -> number of direct links to that GPU.
	gpus map[string]int
	// switchLinks counts links to an NVSwitch.
	switchLinks int
}

// linksBetween is the number of NVLinks between GPUs a and b (with b's bus
// ID busB): direct links from a to b, plus, when both reach the NVSwitch
// fabric, the smaller of their switch link counts (an NVSwitch connects
// every GPU on it at the full bandwidth of its links; go-gpuallocator leaves
// this case as a TODO and would report no NVLink on DGX H100/A100).
func linksBetween(a, b nvlinkRemotes, busB string) int {
	n := a.gpus[busB]
	if a.switchLinks > 0 && b.switchLinks > 0 {
		n += min(a.switchLinks, b.switchLinks)
	}
	return n
}

// readNVLinkRemotes walks a GPU's NVLinks like go-gpuallocator's
// links.GetNVLink: links NVML does not know or does not support are skipped,
// inactive links ignored.
func readNVLinkRemotes(d nvml.Device) (nvlinkRemotes, error) {
	r := nvlinkRemotes{gpus: map[string]int{}}
	for link := 0; link < nvml.NVLINK_MAX_LINKS; link++ {
		state, ret := d.GetNvLinkState(link)
		if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if ret != nvml.SUCCESS {
			return r, fmt.Errorf("getting state of NVLink %d: %w", link, nvmlError(ret))
		}
		if state != nvml.FEATURE_ENABLED {
			continue
		}
		kind, ret := d.GetNvLinkRemoteDeviceType(link)
		if ret == nvml.SUCCESS && kind == nvml.NVLINK_DEVICE_TYPE_SWITCH {
			r.switchLinks++
			continue
		}
		// Older drivers do not know the remote type; then the remote PCI
		// info decides (a non-GPU bus ID simply matches no GPU).
		pci, ret := d.GetNvLinkRemotePciInfo(link)
		if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if ret != nvml.SUCCESS {
			return r, fmt.Errorf("getting remote PCI info of NVLink %d: %w", link, nvmlError(ret))
		}
		r.gpus[busID(pci)]++
	}
	return r, nil
}

// busID is the PCI bus ID of pci in the kernel's form ("0000:07:00.0"): NVML
// gives an 8-digit domain ("00000000:07:00.0"), sysfs and go-gpuallocator use 4.
func busID(pci nvml.PciInfo) string {
	return normalizeBusID(cString(pci.BusId[:]))
}

// normalizeBusID lowercases a PCI bus ID and shortens an all-zero-padded
// 8-digit domain to 4 digits.
func normalizeBusID(id string) string {
	id = strings.ToLower(id)
	domain, rest, ok := strings.Cut(id, ":")
	if ok && len(domain) == 8 && strings.HasPrefix(domain, "0000") {
		return domain[4:] + ":" + rest
	}
	return id
}

// cString converts a NUL-terminated C char array.
func cString(b []int8) string {
	var sb strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		sb.WriteByte(byte(c))
	}
	return sb.String()
}
