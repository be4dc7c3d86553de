package nvidia

import (
	"fmt"

	"github.com/NVIDIA/go-gpuallocator/gpuallocator"
)

// AllocatorDevices builds go-gpuallocator devices (index, UUID, PCI bus ID
// and links) from lib, for gpuallocator policies such as
// NewBestEffortPolicy. It does not call gpuallocator.NewDevices, which
// would query NVML itself (and trip the mock servers' topology panics).
// Each GPU pair is asked once and linked both ways, as the best-effort
// policy requires symmetric links; pairs with LinkUnknown get no link.
// The devices' embedded go-nvlib handles and CPU affinity are left nil:
// the policies do not use them, but Device.Details does, so do not call it.
func AllocatorDevices(lib Lib) ([]*gpuallocator.Device, error) {
	gpus, err := lib.GPUs()
	if err != nil {
		return nil, fmt.Errorf("building allocator devices: %w", err)
	}
	devs := make([]*gpuallocator.Device, len(gpus))
	for i, g := range gpus {
		d := &gpuallocator.Device{Index: g.Index, Links: map[int][]gpuallocator.P2PLink{}}
		d.UUID = g.UUID
		d.PCI.BusID = g.PCIBusID
		devs[i] = d
	}
	for i, a := range devs {
		for _, b := range devs[i+1:] {
			l, err := lib.Link(a.Index, b.Index)
			if err != nil {
				return nil, fmt.Errorf("building allocator devices: %w", err)
			}
			if l == LinkUnknown {
				continue
			}
			a.Links[b.Index] = append(a.Links[b.Index], p2pLink(b, l))
			b.Links[a.Index] = append(b.Links[a.Index], p2pLink(a, l))
		}
	}
	return devs, nil
}

// p2pLink is a link to gpu of type l. P2PLink.Type has a type from
// go-gpuallocator's internal package that gpufrac cannot name; setLinkType
// infers it.
func p2pLink(gpu *gpuallocator.Device, l LinkType) gpuallocator.P2PLink {
	link := gpuallocator.P2PLink{GPU: gpu}
	setLinkType(&link.Type, l)
	return link
}

// setLinkType stores l in a go-gpuallocator link type (same numeric values).
func setLinkType[T ~uint](dst *T, l LinkType) { *dst = T(l) }
