package dra

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	k8sresource "k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/config"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/mig"
)

const h100Bytes = 81559 << 20

func h100(i int) nvidia.GPU {
	return nvidia.GPU{Index: i, Minor: i, UUID: "GPU-" + string(rune('a'+i)), Name: "NVIDIA H100 80GB HBM3", MemoryBytes: h100Bytes, PCIBusID: "0000:0" + string(rune('1'+i)) + ":00.0"}
}

// migInstance is a clean GPU instance of profile at start (size slices).
func migInstance(gpu string, id, profileID int, profile string, start, size int, mem uint64) mig.GPUInstance {
	return mig.GPUInstance{GPU: gpu, ID: id, ProfileID: profileID, Profile: profile,
		Placement: mig.Placement{Start: start, Size: size}, MemoryBytes: mem,
		Devices: []mig.Device{{UUID: "MIG-" + gpu + "-" + profile + "-" + string(rune('0'+start)), GPU: gpu, GI: id, Profile: profile, Full: true, MemoryBytes: mem}}}
}

func deviceNames(p Published) []string {
	var out []string
	for _, s := range p.Resources.Pools["node-a"].Slices {
		for _, d := range s.Devices {
			out = append(out, d.Name)
		}
	}
	return out
}

func TestBuild(t *testing.T) {
	g3 := h100(3)
	gpus := []GPU{
		{GPU: h100(1), Mode: config.ModeExclusive, Healthy: true},
		{GPU: h100(0), Mode: config.ModeFraction, Healthy: true},
		{GPU: h100(2), Mode: config.ModeFraction, Healthy: false},
		{GPU: g3, Mode: config.ModeMIG, Healthy: true, MIG: []mig.GPUInstance{
			migInstance(g3.UUID, 2, 9, "3g.40gb", 4, 4, 40<<30),
			migInstance(g3.UUID, 5, 19, "1g.10gb", 0, 1, 10<<30),
			// Two compute instances in one GPU instance: not published.
			{GPU: g3.UUID, ID: 7, ProfileID: 14, Profile: "2g.20gb", Placement: mig.Placement{Start: 2, Size: 2},
				Devices: []mig.Device{{UUID: "MIG-x", Profile: "1c.2g.20gb"}, {UUID: "MIG-y", Profile: "1c.2g.20gb"}}},
		}},
	}
	p, err := Build("node-a", gpus)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"gpu-0", "gpu-0-shares", "gpu-0-memory",
		"gpu-1",
		"gpu-2", "gpu-2-shares", "gpu-2-memory",
		"gpu-3-mig-1g10gb-19-0", "gpu-3-mig-3g40gb-9-4",
	}
	if diff := cmp.Diff(want, deviceNames(p)); diff != "" {
		t.Errorf("device names, GPU by index (-want +got):\n%s", diff)
	}
	pool := p.Resources.Pools["node-a"]
	if len(pool.Slices) != 2 || len(pool.Slices[0].SharedCounters) != 3 || len(pool.Slices[0].Devices) != 0 {
		t.Fatalf("slices %+v, want one with the 3 counter sets, then one with the devices", pool.Slices)
	}
	// Device details.
	byName := map[string]resourceapi.Device{}
	for _, d := range pool.Slices[1].Devices {
		byName[d.Name] = d
	}
	shares := byName["gpu-0-shares"]
	if shares.AllowMultipleAllocations == nil || !*shares.AllowMultipleAllocations {
		t.Error("gpu-0-shares must allow multiple allocations")
	}
	c := shares.Capacity[api.DRACapacityShares]
	if c.Value.Value() != 100 || c.RequestPolicy.Default.Value() != 100 || c.RequestPolicy.ValidRange.Min.Value() != 1 || c.RequestPolicy.ValidRange.Step.Value() != 1 {
		t.Errorf("gpu-0-shares capacity %+v, want 100 shares, default 100, range 1..100 step 1", c)
	}
	mem := byName["gpu-0-memory"].Capacity[api.DRACapacityMemory]
	if mem.Value.Value() != h100Bytes || mem.RequestPolicy.ValidRange.Step.Value() != 1<<20 {
		t.Errorf("gpu-0-memory capacity %+v, want %d bytes in MiB steps", mem, int64(h100Bytes))
	}
	w := byName["gpu-0"]
	if q := w.Capacity[api.DRACapacityMemory].Value; w.AllowMultipleAllocations != nil || q.Value() != h100Bytes {
		t.Errorf("gpu-0 = %+v, want an exclusive device with the GPU's memory", w)
	}
	for _, n := range []string{"gpu-0", "gpu-0-shares", "gpu-0-memory"} {
		cc := byName[n].ConsumesCounters
		q := cc[0].Counters[api.DRACapacityMemory].Value
		if len(cc) != 1 || cc[0].CounterSet != "gpu-0-counter-set" || q.Value() != h100Bytes {
			t.Errorf("%s consumes %+v, want all of gpu-0-counter-set", n, cc)
		}
	}
	if len(byName["gpu-1"].ConsumesCounters) != 0 {
		t.Error("an exclusive GPU needs no counters")
	}
	for _, n := range []string{"gpu-2", "gpu-2-shares", "gpu-2-memory"} {
		if diff := cmp.Diff([]resourceapi.DeviceTaint{{Key: api.DRATaintUnhealthy, Effect: resourceapi.DeviceTaintEffectNoSchedule}}, byName[n].Taints); diff != "" {
			t.Errorf("%s taints (-want +got):\n%s", n, diff)
		}
	}
	if len(byName["gpu-0"].Taints) != 0 {
		t.Error("a healthy GPU is not tainted")
	}
	attrs := byName["gpu-0-shares"].Attributes
	if *attrs[api.DRAAttrType].StringValue != api.DRATypeFraction || *attrs[api.DRAAttrUUID].StringValue != "GPU-a" ||
		*attrs[api.DRAAttrIndex].IntValue != 0 || *attrs[api.DRAAttrProductName].StringValue != "NVIDIA H100 80GB HBM3" ||
		*attrs[api.DRAAttrSharing].StringValue != "shares" || *attrs[api.DRAAttrMemoryBytes].IntValue != h100Bytes {
		t.Errorf("gpu-0-shares attributes %v", attrs)
	}
	if *byName["gpu-1"].Attributes[api.DRAAttrType].StringValue != api.DRATypeGPU {
		t.Error("gpu-1 must be of type gpu")
	}
	// MIG: the 3g consumes memory slices 4-7 of gpu-3's counter set.
	m := byName["gpu-3-mig-3g40gb-9-4"]
	if *m.Attributes[api.DRAAttrProfile].StringValue != "3g.40gb" || *m.Attributes[api.DRAAttrParentUUID].StringValue != g3.UUID || *m.Attributes[api.DRAAttrType].StringValue != api.DRATypeMIG {
		t.Errorf("MIG attributes %v", m.Attributes)
	}
	var slicesUsed []string
	for k := range m.ConsumesCounters[0].Counters {
		if strings.HasPrefix(k, "memory-slice-") {
			slicesUsed = append(slicesUsed, k)
		}
	}
	if q := m.ConsumesCounters[0].Counters["memory-slice-4"].Value; len(slicesUsed) != 4 || q.Value() != 1 {
		t.Errorf("3g.40gb consumes %v, want memory slices 4-7", m.ConsumesCounters[0].Counters)
	}
	set := pool.Slices[0].SharedCounters[2]
	if set.Name != "gpu-3-counter-set" || len(set.Counters) != 1+5 {
		t.Errorf("gpu-3 counter set %+v, want memory and slices 0, 4-7", set)
	}
	// Targets.
	if tg := p.Targets["gpu-0-memory"]; tg.View != api.DRAViewMemory || tg.GPU.UUID != "GPU-a" || tg.MemoryBytes != h100Bytes {
		t.Errorf("target of gpu-0-memory = %+v", tg)
	}
	if tg := p.Targets["gpu-3-mig-1g10gb-19-0"]; tg.View != api.DRAViewMIG || tg.MIG.Profile != "1g.10gb" || tg.GPU.UUID != g3.UUID {
		t.Errorf("target of the 1g.10gb = %+v", tg)
	}
}

func TestBuildSplitsSlicesAtTheAPILimits(t *testing.T) {
	var gpus []GPU
	for i := range 24 { // 72 devices over 24 counter sets
		gpus = append(gpus, GPU{GPU: h100(i), Mode: config.ModeFraction, Healthy: true})
	}
	p, err := Build("node-a", gpus)
	if err != nil {
		t.Fatal(err)
	}
	var sets, devs []int
	for _, s := range p.Resources.Pools["node-a"].Slices {
		if len(s.SharedCounters) > 0 {
			sets = append(sets, len(s.SharedCounters))
		}
		if len(s.Devices) > 0 {
			devs = append(devs, len(s.Devices))
		}
		if len(s.SharedCounters) > 0 && len(s.Devices) > 0 {
			t.Error("a slice holds counters and devices; the API allows one or the other")
		}
	}
	if diff := cmp.Diff([]int{8, 8, 8}, sets); diff != "" {
		t.Errorf("counter sets per slice (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int{64, 8}, devs); diff != "" {
		t.Errorf("devices per slice (-want +got):\n%s", diff)
	}
}

func TestBuildRefusesTimeslice(t *testing.T) {
	_, err := Build("node-a", []GPU{{GPU: h100(0), Mode: config.ModeTimeslice, Healthy: true}})
	if err == nil || !strings.Contains(err.Error(), `mode "timeslice" is not served through DRA`) {
		t.Errorf("Build error = %v, want one refusing timeslice", err)
	}
}

func TestBuildRoundsMemoryDownToMiB(t *testing.T) {
	g := h100(0)
	g.MemoryBytes = 80<<30 + 12345
	p, err := Build("node-a", []GPU{{GPU: g, Mode: config.ModeFraction, Healthy: true}})
	if err != nil {
		t.Fatal(err)
	}
	d := p.Resources.Pools["node-a"].Slices[1].Devices[2]
	want := k8sresource.MustParse("80Gi")
	if got := d.Capacity[api.DRACapacityMemory]; got.Value.Cmp(want) != 0 || got.RequestPolicy.ValidRange.Max.Cmp(want) != 0 {
		t.Errorf("memory view capacity %v, want 80Gi (max a multiple of the 1Mi step)", got.Value.String())
	}
}

func TestBuildLeavesOutWholeGPUsInMIGMode(t *testing.T) {
	g2 := h100(2)
	p, err := Build("node-a", []GPU{
		{GPU: h100(0), Mode: config.ModeExclusive, Healthy: true, MIGEnabled: true},
		{GPU: h100(1), Mode: config.ModeFraction, Healthy: true, MIGEnabled: true},
		{GPU: g2, Mode: config.ModeMIG, Healthy: true, MIGEnabled: true, MIG: []mig.GPUInstance{
			migInstance(g2.UUID, 2, 0, "7g.80gb", 0, 8, 80<<30)}},
		{GPU: h100(3), Mode: config.ModeExclusive, Healthy: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"gpu-2-mig-7g80gb-0-0", "gpu-3"}
	if diff := cmp.Diff(want, deviceNames(p)); diff != "" {
		t.Errorf("devices (-want +got):\n%s", diff)
	}
	if _, ok := p.Targets["gpu-0"]; ok {
		t.Error("a GPU in MIG mode has a whole-GPU target")
	}
}
