package api

import (
	"strings"
	"testing"
)

func TestShareMilli(t *testing.T) {
	h100 := GPUInfo{MemoryMiB: 81920}
	tests := []struct {
		name string
		got  int64
		want int64
	}{
		{name: "1g.10gb of an 80 GB H100", got: h100.MIGShareMilli(MIGDeviceInfo{MemoryMiB: 10240}), want: 125},
		{name: "3g.40gb of an 80 GB H100", got: h100.MIGShareMilli(MIGDeviceInfo{MemoryMiB: 40960}), want: 500},
		{name: "1g.5gb of a 40 GB A100 rounds to the nearest milli", got: GPUInfo{MemoryMiB: 40960}.MIGShareMilli(MIGDeviceInfo{MemoryMiB: 4864}), want: 119},
		{name: "a tiny device is worth at least 1", got: h100.MIGShareMilli(MIGDeviceInfo{MemoryMiB: 1}), want: 1},
		{name: "never more than the GPU", got: h100.MIGShareMilli(MIGDeviceInfo{MemoryMiB: 90000}), want: 1000},
		{name: "a GPU without memory", got: GPUInfo{}.MIGShareMilli(MIGDeviceInfo{MemoryMiB: 10240}), want: 1},
		{name: "4 replicas", got: GPUInfo{Replicas: 4}.ReplicaShareMilli(), want: 250},
		{name: "3 replicas round to the nearest milli", got: GPUInfo{Replicas: 3}.ReplicaShareMilli(), want: 333},
		{name: "not time-sliced", got: GPUInfo{}.ReplicaShareMilli(), want: 0},
		{name: "very many replicas are worth at least 1", got: GPUInfo{Replicas: 5000}.ReplicaShareMilli(), want: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.got != tc.want {
				t.Errorf("got %d milli, want %d", tc.got, tc.want)
			}
		})
	}
}

func TestInventoryRoundTrip(t *testing.T) {
	in := []GPUInfo{
		{UUID: "GPU-0", Mode: "mig", MemoryMiB: 81920, Healthy: true, MIGDevices: []MIGDeviceInfo{{UUID: "MIG-0", Profile: "1g.10gb", Resource: "nvidia.com/mig-1g.10gb", MemoryMiB: 10240}}},
		{UUID: "GPU-1", Index: 1, Mode: "timeslice", Replicas: 4, ReplicaResource: DefaultTimesliceResource},
		{UUID: "GPU-2", Index: 2, Mode: "fraction"},
	}
	s, err := EncodeInventory(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := DecodeInventory(s)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 3 || len(out[0].MIGDevices) != 1 || out[0].MIGDevices[0] != in[0].MIGDevices[0] || out[1].Replicas != 4 || out[1].ReplicaResource != DefaultTimesliceResource {
		t.Errorf("round trip gave %+v", out)
	}
	if want := `{"uuid":"GPU-2","index":2,"model":"","memoryMiB":0,"mode":"fraction","healthy":false}`; !strings.Contains(s, want) {
		t.Errorf("a fraction GPU's JSON is not as before (no empty MIG or replica fields): %s", s)
	}
}
