package nvidia

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/go-cmp/cmp"
)

func TestMergeProcesses(t *testing.T) {
	tests := []struct {
		name              string
		compute, graphics []nvml.ProcessInfo
		want              []Process
	}{
		{name: "none", want: []Process{}},
		{
			name:     "disjoint, sorted by pid",
			compute:  []nvml.ProcessInfo{{Pid: 300, UsedGpuMemory: 3}, {Pid: 100, UsedGpuMemory: 1}},
			graphics: []nvml.ProcessInfo{{Pid: 200, UsedGpuMemory: 2}},
			want:     []Process{{PID: 100, UsedBytes: 1}, {PID: 200, UsedBytes: 2}, {PID: 300, UsedBytes: 3}},
		},
		{
			name:     "compute and graphics context of one process counted once",
			compute:  []nvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 1 << 30}},
			graphics: []nvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 1 << 30}},
			want:     []Process{{PID: 100, UsedBytes: 1 << 30}},
		},
		{
			name:     "larger of two reports kept",
			compute:  []nvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 5}},
			graphics: []nvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 9}},
			want:     []Process{{PID: 100, UsedBytes: 9}},
		},
		{
			name:    "memory not available becomes zero",
			compute: []nvml.ProcessInfo{{Pid: 100, UsedGpuMemory: ^uint64(0)}},
			want:    []Process{{PID: 100, UsedBytes: 0}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := mergeProcesses(tc.compute, tc.graphics)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("mergeProcesses (-want +got):\n%s", diff)
			}
		})
	}
}
