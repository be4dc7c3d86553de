package nvidia

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestNVLinks(t *testing.T) {
	tests := []struct {
		name string
		n    int
		want LinkType
	}{
		{name: "none", n: 0, want: LinkUnknown},
		{name: "negative", n: -3, want: LinkUnknown},
		{name: "one", n: 1, want: LinkNVLink1},
		{name: "twelve", n: 12, want: LinkNVLink1 + 11},
		{name: "eighteen", n: 18, want: LinkNVLink1 + 17},
		{name: "capped", n: 36, want: LinkNVLink1 + 17},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := NVLinks(tc.n)
			if got != tc.want {
				t.Errorf("NVLinks(%d) = %v, want %v", tc.n, got, tc.want)
			}
			if wantCount := min(max(tc.n, 0), MaxNVLinks); got.NVLinkCount() != wantCount {
				t.Errorf("NVLinks(%d).NVLinkCount() = %d, want %d", tc.n, got.NVLinkCount(), wantCount)
			}
		})
	}
}

func TestLinkTypeFromTopology(t *testing.T) {
	tests := []struct {
		name    string
		level   nvml.GpuTopologyLevel
		nvlinks int
		want    LinkType
	}{
		{name: "same board", level: nvml.TOPOLOGY_INTERNAL, want: LinkSameBoard},
		{name: "single switch", level: nvml.TOPOLOGY_SINGLE, want: LinkSingleSwitch},
		{name: "multiple switches", level: nvml.TOPOLOGY_MULTIPLE, want: LinkMultiSwitch},
		{name: "host bridge", level: nvml.TOPOLOGY_HOSTBRIDGE, want: LinkHostBridge},
		{name: "same numa node", level: nvml.TOPOLOGY_NODE, want: LinkSameCPU},
		{name: "cross cpu", level: nvml.TOPOLOGY_SYSTEM, want: LinkCrossCPU},
		{name: "unknown level", level: nvml.GpuTopologyLevel(7), want: LinkUnknown},
		{name: "nvlink beats pcie", level: nvml.TOPOLOGY_SYSTEM, nvlinks: 4, want: NVLinks(4)},
		{name: "nvlink with unknown level", level: nvml.GpuTopologyLevel(7), nvlinks: 18, want: NVLinks(18)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := linkType(tc.level, tc.nvlinks); got != tc.want {
				t.Errorf("linkType(%v, %d) = %v, want %v", tc.level, tc.nvlinks, got, tc.want)
			}
		})
	}
}

func TestLinksBetween(t *testing.T) {
	const busB = "0000:08:00.0"
	tests := []struct {
		name string
		a, b nvlinkRemotes
		want int
	}{
		{name: "no links", a: nvlinkRemotes{}, b: nvlinkRemotes{}, want: 0},
		{name: "direct", a: nvlinkRemotes{gpus: map[string]int{busB: 4, "0000:09:00.0": 2}}, want: 4},
		{name: "direct to another gpu", a: nvlinkRemotes{gpus: map[string]int{"0000:09:00.0": 2}}, want: 0},
		{name: "nvswitch", a: nvlinkRemotes{switchLinks: 18}, b: nvlinkRemotes{switchLinks: 18}, want: 18},
		{name: "nvswitch uneven", a: nvlinkRemotes{switchLinks: 18}, b: nvlinkRemotes{switchLinks: 12}, want: 12},
		{name: "only one side on nvswitch", a: nvlinkRemotes{switchLinks: 18}, want: 0},
		{name: "direct plus nvswitch", a: nvlinkRemotes{gpus: map[string]int{busB: 2}, switchLinks: 6}, b: nvlinkRemotes{switchLinks: 6}, want: 8},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := linksBetween(tc.a, tc.b, busB); got != tc.want {
				t.Errorf("linksBetween = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestNormalizeBusID(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{name: "nvml 8-digit domain", in: "00000000:07:00.0", want: "0000:07:00.0"},
		{name: "upper case", in: "00000000:B7:00.0", want: "0000:b7:00.0"},
		{name: "already short", in: "0000:07:00.0", want: "0000:07:00.0"},
		{name: "non-zero domain kept", in: "00010000:07:00.0", want: "00010000:07:00.0"},
		{name: "empty", in: "", want: ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := normalizeBusID(tc.in); got != tc.want {
				t.Errorf("normalizeBusID(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestBusIDFromPciInfo(t *testing.T) {
	pci := mockPciInfo("0000:1a:00.0", 0x233010de)
	if got, want := busID(pci), "0000:1a:00.0"; got != want {
		t.Errorf("busID = %q, want %q", got, want)
	}
	if got, want := cString(pci.BusId[:]), "00000000:1a:00.0"; got != want {
		t.Errorf("raw BusId = %q, want NVML's 8-digit domain form %q", got, want)
	}
	if pci.Bus != 0x1a {
		t.Errorf("Bus = %#x, want 0x1a", pci.Bus)
	}
}

func TestLinkTypeString(t *testing.T) {
	tests := []struct {
		name string
		l    LinkType
		want string
	}{
		{name: "unknown", l: LinkUnknown, want: "Unknown"},
		{name: "same cpu", l: LinkSameCPU, want: "SameCPU"},
		{name: "nvlink", l: NVLinks(18), want: "NVLinkx18"},
		{name: "out of range", l: LinkType(99), want: "LinkType(99)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.l.String(); got != tc.want {
				t.Errorf("String() = %q, want %q", got, tc.want)
			}
		})
	}
}
