package nvidia

import (
	"errors"
	"fmt"
	"testing"

	"github.com/NVIDIA/go-gpuallocator/gpuallocator"
	"github.com/google/go-cmp/cmp"
)

// TestLinkTypeMatchesGPUAllocator checks every LinkType has the numeric value
// of go-gpuallocator's constant of the same meaning, through the upstream
// type's String method.
func TestLinkTypeMatchesGPUAllocator(t *testing.T) {
	tests := []struct {
		name string
		l    LinkType
		want string
	}{
		{name: "cross cpu", l: LinkCrossCPU, want: "P2PLinkCrossCPU"},
		{name: "same cpu", l: LinkSameCPU, want: "P2PLinkSameCPU"},
		{name: "host bridge", l: LinkHostBridge, want: "P2PLinkHostBridge"},
		{name: "multi switch", l: LinkMultiSwitch, want: "P2PLinkMultiSwitch"},
		{name: "single switch", l: LinkSingleSwitch, want: "P2PLinkSingleSwitch"},
		{name: "same board", l: LinkSameBoard, want: "P2PLinkSameBoard"},
	}
	nvlinks := []string{"Single", "Two", "Three", "Four", "Five", "Six", "Seven", "Eight", "Nine", "Ten",
		"Eleven", "Twelve", "Thirteen", "Fourteen", "Fifteen", "Sixteen", "Seventeen", "Eighteen"}
	for i, n := range nvlinks {
		suffix := "NVLINKLinks"
		if i == 0 {
			suffix = "NVLINKLink"
		}
		tests = append(tests, struct {
			name string
			l    LinkType
			want string
		}{name: fmt.Sprintf("%d nvlinks", i+1), l: NVLinks(i + 1), want: n + suffix})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			link := p2pLink(nil, tc.l)
			if got := fmt.Sprint(link.Type); got != tc.want {
				t.Errorf("go-gpuallocator name of %v = %q, want %q", tc.l, got, tc.want)
			}
		})
	}
}

func TestAllocatorDevicesDGX(t *testing.T) {
	m := newTestMock(t, "dgxh100")
	gpus, err := m.GPUs()
	if err != nil {
		t.Fatal(err)
	}
	devs, err := AllocatorDevices(m)
	if err != nil {
		t.Fatalf("AllocatorDevices: %v", err)
	}
	type dev struct {
		Index        int
		UUID, BusID  string
		Peers        int
		LinkTypeName string
	}
	var want, got []dev
	for _, g := range gpus {
		want = append(want, dev{Index: g.Index, UUID: g.UUID, BusID: g.PCIBusID, Peers: len(gpus) - 1, LinkTypeName: "EighteenNVLINKLinks"})
	}
	for _, d := range devs {
		got = append(got, dev{Index: d.Index, UUID: d.UUID, BusID: d.PCI.BusID, Peers: len(d.Links)})
		for peer, links := range d.Links {
			if len(links) != 1 || links[0].GPU.Index != peer {
				t.Errorf("device %d links to %d: %v, want one link to that GPU", d.Index, peer, links)
				continue
			}
			got[len(got)-1].LinkTypeName = fmt.Sprint(links[0].Type)
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("allocator devices (-want +got):\n%s", diff)
	}
}

func TestBestEffortAllocateOnDGX(t *testing.T) {
	m := newTestMock(t, "dgxh100")
	devs, err := AllocatorDevices(m)
	if err != nil {
		t.Fatalf("AllocatorDevices: %v", err)
	}
	tests := []struct {
		name     string
		required []int
		size     int
	}{
		{name: "two of eight", size: 2},
		{name: "four of eight", size: 4},
		{name: "two with one required", required: []int{3}, size: 2},
		{name: "two with both required", required: []int{1, 6}, size: 2},
		{name: "all eight", size: 8},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var required []*gpuallocator.Device
			for _, i := range tc.required {
				required = append(required, devs[i])
			}
			got := gpuallocator.NewBestEffortPolicy().Allocate(devs, required, tc.size)
			if len(got) != tc.size {
				t.Fatalf("allocated %d devices (%v), want %d", len(got), got, tc.size)
			}
			seen := map[int]bool{}
			for _, d := range got {
				if d == nil || seen[d.Index] {
					t.Fatalf("allocation %v has a nil or repeated device", got)
				}
				seen[d.Index] = true
			}
			for _, i := range tc.required {
				if !seen[i] {
					t.Errorf("allocation %v misses required GPU %d", got, i)
				}
			}
		})
	}
}

// topologyLib is a narrow fake: GPUs and Link only; any other call panics.
type topologyLib struct {
	Lib
	gpus  []GPU
	links map[[2]int]LinkType
	err   error
}

func (f *topologyLib) GPUs() ([]GPU, error) { return f.gpus, nil }

func (f *topologyLib) Link(a, b int) (LinkType, error) {
	if f.err != nil {
		return LinkUnknown, f.err
	}
	return f.links[[2]int{min(a, b), max(a, b)}], nil
}

func TestAllocatorDevicesLinks(t *testing.T) {
	gpus := []GPU{{Index: 0, UUID: "GPU-a"}, {Index: 1, UUID: "GPU-b"}, {Index: 2, UUID: "GPU-c"}}
	lib := &topologyLib{gpus: gpus, links: map[[2]int]LinkType{
		{0, 1}: NVLinks(2),
		{1, 2}: LinkSameCPU,
		// {0, 2} unknown: no link either way.
	}}
	devs, err := AllocatorDevices(lib)
	if err != nil {
		t.Fatalf("AllocatorDevices: %v", err)
	}
	got := map[int]map[int]string{}
	for _, d := range devs {
		got[d.Index] = map[int]string{}
		for peer, links := range d.Links {
			for _, l := range links {
				got[d.Index][peer] += fmt.Sprint(l.Type)
			}
		}
	}
	want := map[int]map[int]string{
		0: {1: "TwoNVLINKLinks"},
		1: {0: "TwoNVLINKLinks", 2: "P2PLinkSameCPU"},
		2: {1: "P2PLinkSameCPU"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("links (-want +got):\n%s", diff)
	}
	// The policy prefers the NVLink pair.
	pick := gpuallocator.NewBestEffortPolicy().Allocate(devs, nil, 2)
	if len(pick) != 2 || pick[0].Index+pick[1].Index != 1 {
		t.Errorf("best-effort pick = %v, want GPUs 0 and 1", pick)
	}

	errBoom := errors.New("boom")
	lib.err = errBoom
	if _, err := AllocatorDevices(lib); !errors.Is(err, errBoom) {
		t.Errorf("AllocatorDevices with a failing Link = %v, want %v", err, errBoom)
	}
}
