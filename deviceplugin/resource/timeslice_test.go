package resource

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/config"
	"github.com/gpufrac/gpufrac/timeslice"
)

func newTimeslice(replicas int, failMany bool, health HealthFunc) *Timeslice {
	return NewTimeslice(TimesliceOptions{
		Sharing: config.TimesliceConfig{Replicas: replicas, FailRequestsGreaterThanOne: failMany}.Sharing(),
		GPUs:    gpus(8),
		Health:  health,
		Usage:   fakeUsage{},
	})
}

func TestTimesliceDevices(t *testing.T) {
	r := newTimeslice(4, false, func(u string) bool { return u != "GPU-2" })
	if r.Name() != api.DefaultTimesliceResource {
		t.Errorf("Name() = %q, want %q", r.Name(), api.DefaultTimesliceResource)
	}
	devs := r.Devices()
	if len(devs) != 32 {
		t.Fatalf("4 replicas on 8 GPUs gave %d devices, want 32", len(devs))
	}
	perGPU := map[string]int{}
	for _, d := range devs {
		g, k, err := ParseUnitID(d.ID)
		if err != nil || k >= 4 {
			t.Fatalf("device %q: %v (k=%d)", d.ID, err, k)
		}
		perGPU[g]++
		if want := healthString(g != "GPU-2"); d.Health != want {
			t.Errorf("replica %s health %s, want %s (its GPU's)", d.ID, d.Health, want)
		}
	}
	for i := range 8 {
		if n := perGPU[fmt.Sprintf("GPU-%d", i)]; n != 4 {
			t.Errorf("GPU-%d has %d replicas, want 4", i, n)
		}
	}
}

func TestTimesliceAllocate(t *testing.T) {
	tests := []struct {
		name      string
		failMany  bool
		ids       []string
		wantLimit string
		wantPaths []string
		wantErr   error
		errText   string
	}{
		{name: "one replica gets a quarter of the memory", ids: []string{"GPU-3::2"}, wantLimit: "20480",
			wantPaths: []string{"/dev/nvidia3", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}},
		{name: "two replicas of one GPU get half", ids: []string{"GPU-1::0", "GPU-1::3"}, wantLimit: "40960",
			wantPaths: []string{"/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}},
		{name: "replicas on two GPUs: the smaller share", ids: []string{"GPU-1::0", "GPU-1::1", "GPU-5::0"}, wantLimit: "20480",
			wantPaths: []string{"/dev/nvidia1", "/dev/nvidia5", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}},
		{name: "more than one refused", failMany: true, ids: []string{"GPU-1::0", "GPU-1::1"}, wantErr: timeslice.ErrMultipleReplicas},
		{name: "one allowed when refusing more", failMany: true, ids: []string{"GPU-0::0"}, wantLimit: "20480",
			wantPaths: []string{"/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}},
		{name: "replica index beyond the replicas", ids: []string{"GPU-0::4"}, errText: "unknown device"},
		{name: "unknown GPU", ids: []string{"GPU-9::0"}, errText: "unknown device"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := newTimeslice(4, tc.failMany, nil).Allocate(t.Context(), tc.ids)
			if tc.wantErr != nil || tc.errText != "" {
				if err == nil || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) || !strings.Contains(err.Error(), tc.errText) {
					t.Fatalf("Allocate(%v) error = %v, want %v %q", tc.ids, err, tc.wantErr, tc.errText)
				}
				return
			}
			if err != nil {
				t.Fatalf("Allocate(%v): %v", tc.ids, err)
			}
			if diff := cmp.Diff(map[string]string{api.EnvMemoryLimitMiB: tc.wantLimit, api.EnvVisibleDevices: "void"}, resp.Envs); diff != "" {
				t.Errorf("envs (-want +got):\n%s", diff)
			}
			var paths []string
			for _, d := range resp.Devices {
				paths = append(paths, d.HostPath)
			}
			if diff := cmp.Diff(tc.wantPaths, paths); diff != "" {
				t.Errorf("device specs (-want +got):\n%s", diff)
			}
		})
	}
}

func TestTimeslicePreferred(t *testing.T) {
	all := func(used map[int]int) []string {
		var out []string
		for i := range 8 {
			for k := used[i]; k < 4; k++ {
				out = append(out, UnitID(fmt.Sprintf("GPU-%d", i), k))
			}
		}
		return out
	}
	tests := []struct {
		name      string
		available []string
		size      int
		failMany  bool
		unhealthy string
		want      []string
		wantErr   error
	}{
		{name: "first GPU of an empty node", available: all(nil), size: 1, want: []string{"GPU-0::0"}},
		{name: "least loaded GPU", available: all(map[int]int{0: 1, 1: 1, 2: 1, 3: 1, 4: 2, 5: 1, 6: 1, 7: 1}), size: 1, want: []string{"GPU-0::1"}},
		{name: "an empty GPU beats partly used ones", available: all(map[int]int{0: 1, 1: 2, 2: 1, 3: 1, 4: 1, 5: 1, 6: 0, 7: 3}), size: 1, want: []string{"GPU-6::0"}},
		{name: "unhealthy GPU skipped", available: all(nil), size: 1, unhealthy: "GPU-0", want: []string{"GPU-1::0"}},
		{name: "two replicas on one GPU", available: all(nil), size: 2, want: []string{"GPU-0::0", "GPU-0::1"}},
		{name: "two replicas refused", available: all(nil), size: 2, failMany: true, wantErr: timeslice.ErrMultipleReplicas},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newTimeslice(4, tc.failMany, func(u string) bool { return u != tc.unhealthy })
			got, err := r.Preferred(t.Context(), tc.available, nil, tc.size)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("Preferred() error = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Preferred() (-want +got):\n%s", diff)
			}
		})
	}
}

func TestTimesliceCDI(t *testing.T) {
	r := NewTimeslice(TimesliceOptions{Sharing: timeslice.Sharing{Replicas: 2, ResourceName: "example.com/ts"}, GPUs: gpus(2), Strategy: StrategyCDI, Usage: fakeUsage{}})
	resp, err := r.Allocate(t.Context(), []string{"GPU-1::1"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]*pluginapi.CDIDevice{{Name: "nvidia.com/gpu=GPU-1"}}, resp.CdiDevices, cmpProto()); diff != "" {
		t.Errorf("CDI devices (-want +got):\n%s", diff)
	}
	if r.Name() != "example.com/ts" {
		t.Errorf("Name() = %q", r.Name())
	}
}

// BenchmarkTimeslicePreferred measures GetPreferredAllocation of one replica
// on 8 GPUs with 16 replicas each, half of them taken.
func BenchmarkTimeslicePreferred(b *testing.B) {
	r := newTimeslice(16, false, nil)
	var avail []string
	for i := range 8 {
		for k := 8; k < 16; k++ {
			avail = append(avail, UnitID(fmt.Sprintf("GPU-%d", i), k))
		}
	}
	ctx := b.Context()
	b.ResetTimer()
	for range b.N {
		if _, err := r.Preferred(ctx, avail, nil, 1); err != nil {
			b.Fatal(err)
		}
	}
}
