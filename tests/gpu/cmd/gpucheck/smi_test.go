package main

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Output of nvidia-smi --query-gpu=<smiGPUQuery> --format=csv,noheader,nounits
// in the shape the driver prints it: an H200 (MIG-capable, disabled) and a T4
// (no MIG).
const smiGPUsOut = `0, GPU-1b2c3d4e-0000-1111-2222-333344445555, NVIDIA H200, 143771, 00000000:19:00.0, Disabled, 570.124.06
1, GPU-9f8e7d6c-0000-1111-2222-333344445555, Tesla T4, 15360, 00000000:3B:00.0, [N/A], 570.124.06
`

func TestParseSMIGPUs(t *testing.T) {
	got, err := parseSMIGPUs(smiGPUsOut)
	if err != nil {
		t.Fatal(err)
	}
	want := []smiGPU{
		{Index: 0, UUID: "GPU-1b2c3d4e-0000-1111-2222-333344445555", Name: "NVIDIA H200", MemoryMiB: 143771, PCIBusID: "0000:19:00.0", MIGMode: "Disabled", Driver: "570.124.06"},
		{Index: 1, UUID: "GPU-9f8e7d6c-0000-1111-2222-333344445555", Name: "Tesla T4", MemoryMiB: 15360, PCIBusID: "0000:3b:00.0", MIGMode: "", Driver: "570.124.06"},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("parseSMIGPUs (-want +got):\n%s", d)
	}
	for _, bad := range []string{"0, GPU-x, name\n", "x, GPU-x, n, 1, 0000:00:00.0, Disabled, 1\n"} {
		if _, err := parseSMIGPUs(bad); err == nil {
			t.Errorf("parseSMIGPUs(%q) = nil error", bad)
		}
	}
}

func TestParseSMIApps(t *testing.T) {
	got, err := parseSMIApps("4242, GPU-1b2c3d4e-0000-1111-2222-333344445555, 4614\n77, GPU-1b2c3d4e-0000-1111-2222-333344445555, [N/A]\n")
	if err != nil {
		t.Fatal(err)
	}
	want := []smiApp{
		{PID: 4242, GPUUUID: "GPU-1b2c3d4e-0000-1111-2222-333344445555", UsedMiB: 4614},
		{PID: 77, GPUUUID: "GPU-1b2c3d4e-0000-1111-2222-333344445555", UsedMiB: -1},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("parseSMIApps (-want +got):\n%s", d)
	}
	for _, empty := range []string{"", "\n", "No running processes found\n"} {
		if apps, err := parseSMIApps(empty); err != nil || len(apps) != 0 {
			t.Errorf("parseSMIApps(%q) = %v, %v; want none", empty, apps, err)
		}
	}
}

func TestNormalizeBusID(t *testing.T) {
	for in, want := range map[string]string{
		"00000000:19:00.0": "0000:19:00.0",
		"0000:3B:00.0":     "0000:3b:00.0",
		"00010000:01:00.0": "00010000:01:00.0",
	} {
		if got := normalizeBusID(in); got != want {
			t.Errorf("normalizeBusID(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCompareInventory(t *testing.T) {
	smi, err := parseSMIGPUs(smiGPUsOut)
	if err != nil {
		t.Fatal(err)
	}
	nv := []nvmlGPU{
		{Index: 0, UUID: "GPU-1b2c3d4e-0000-1111-2222-333344445555", Name: "NVIDIA H200", MemoryMiB: 143771, PCIBusID: "0000:19:00.0", MIGCapable: true},
		{Index: 1, UUID: "GPU-9f8e7d6c-0000-1111-2222-333344445555", Name: "Tesla T4", MemoryMiB: 15360, PCIBusID: "0000:3b:00.0"},
	}
	if d := compareInventory(nv, "570.124.06", smi); len(d) != 0 {
		t.Errorf("agreeing inventories differ: %v", d)
	}
	// Within 1 % of memory is the same.
	nv[0].MemoryMiB = 143771 - 1000
	if d := compareInventory(nv, "570.124.06", smi); len(d) != 0 {
		t.Errorf("memory within 1%%: %v", d)
	}

	bad := append([]nvmlGPU(nil), nv...)
	bad[0].MemoryMiB = 80000
	bad[0].MIGEnabled = true
	bad[1].PCIBusID = "0000:3c:00.0"
	bad[1].Index = 2
	d := compareInventory(bad, "570.86.10", smi)
	for _, want := range []string{"memory NVML 80000 MiB, nvidia-smi 143771 MiB", `MIG mode NVML "Enabled", nvidia-smi "Disabled"`, "PCI bus ID NVML 0000:3c:00.0", "index NVML 2, nvidia-smi 1", "driver NVML 570.86.10"} {
		if !strings.Contains(strings.Join(d, "\n"), want) {
			t.Errorf("differences %q miss %q", d, want)
		}
	}
	if d := compareInventory(nv[:1], "570.124.06", smi); len(d) != 1 || !strings.Contains(d[0], "GPU count") {
		t.Errorf("a missing GPU: %v", d)
	}
	if d := compareInventory(nv, "570.124.06", smi[:1]); len(d) != 2 {
		t.Errorf("a GPU nvidia-smi does not list: %v", d)
	}
}
