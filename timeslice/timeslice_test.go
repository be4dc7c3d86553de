package timeslice

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpufrac/gpufrac/deviceplugin/config"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
)

func TestFromConfig(t *testing.T) {
	tests := []struct {
		name string
		in   config.TimesliceConfig
		want Sharing
	}{
		{name: "defaults", want: Sharing{Replicas: 4, ResourceName: "nvidia.com/gpu.shared"}},
		{name: "set", in: config.TimesliceConfig{Replicas: 8, ResourceName: "example.com/ts", FailRequestsGreaterThanOne: true},
			want: Sharing{Replicas: 8, ResourceName: "example.com/ts", FailRequestsGreaterThanOne: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, FromConfig(tc.in)); diff != "" {
				t.Errorf("FromConfig (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCheckRequest(t *testing.T) {
	tests := []struct {
		name    string
		fail    bool
		n       int
		wantErr error
		errText string
	}{
		{name: "one replica", n: 1},
		{name: "two replicas allowed", n: 2},
		{name: "two replicas refused", fail: true, n: 2, wantErr: ErrMultipleReplicas, errText: "request for 2 replicas of nvidia.com/gpu.shared"},
		{name: "one replica when refusing more", fail: true, n: 1},
		{name: "zero", n: 0, errText: "must be positive"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := FromConfig(config.TimesliceConfig{FailRequestsGreaterThanOne: tc.fail})
			err := s.CheckRequest(tc.n)
			if tc.errText == "" {
				if err != nil {
					t.Fatalf("CheckRequest(%d) = %v", tc.n, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.errText) || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) {
				t.Errorf("CheckRequest(%d) = %v, want %q (%v)", tc.n, err, tc.errText, tc.wantErr)
			}
		})
	}
}

func TestMemoryLimitMiB(t *testing.T) {
	h100 := nvidia.GPU{MemoryBytes: 81559 << 20}
	tests := []struct {
		name     string
		replicas int
		n        int
		want     uint64
	}{
		{name: "one of four", replicas: 4, n: 1, want: 20389}, // 81559/4 = 20389.75
		{name: "two of four", replicas: 4, n: 2, want: 40779}, // 163118/4 = 40779.5
		{name: "one of three", replicas: 3, n: 1, want: 27186},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := (Sharing{Replicas: tc.replicas}).MemoryLimitMiB(h100, tc.n); got != tc.want {
				t.Errorf("MemoryLimitMiB = %d, want %d", got, tc.want)
			}
		})
	}
}

// free lists free replica indices per GPU: GPU i has replicas [used[i], n).
func free(gpus, n int, used map[int]int) (map[string][]int, []string) {
	out := map[string][]int{}
	var order []string
	for i := range gpus {
		g := fmt.Sprintf("GPU-%d", i)
		order = append(order, g)
		for k := used[i]; k < n; k++ {
			out[g] = append(out[g], k)
		}
	}
	return out, order
}

func TestPick(t *testing.T) {
	tests := []struct {
		name        string
		used        map[int]int
		mustInclude []Replica
		size        int
		want        []Replica
		wantErr     string
	}{
		{name: "empty node: GPU 0", size: 1, want: []Replica{{"GPU-0", 0}}},
		{name: "least loaded GPU", used: map[int]int{0: 2, 1: 1, 2: 3}, size: 1, want: []Replica{{"GPU-3", 0}}},
		{name: "several replicas stay on one GPU", used: map[int]int{0: 1, 1: 1, 2: 1}, size: 2, want: []Replica{{"GPU-3", 0}, {"GPU-3", 1}}},
		{name: "no GPU has room for all: most free first", used: map[int]int{0: 3, 1: 2, 2: 3, 3: 3}, size: 3,
			want: []Replica{{"GPU-1", 2}, {"GPU-1", 3}, {"GPU-0", 3}}},
		{name: "must include pins the GPU", mustInclude: []Replica{{"GPU-2", 1}}, size: 2, want: []Replica{{"GPU-2", 1}, {"GPU-2", 0}}},
		{name: "too few free", used: map[int]int{0: 4, 1: 4, 2: 4, 3: 3}, size: 2, wantErr: "only 1 free"},
		{name: "zero", size: 0, wantErr: "must be positive"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, order := free(4, 4, tc.used)
			got, err := Pick(f, order, tc.mustInclude, tc.size)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Pick() error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Pick() (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCollector(t *testing.T) {
	reg := prometheus.NewRegistry()
	offer := Offer{Sharing: Sharing{Replicas: 4, ResourceName: "nvidia.com/gpu.shared"}, GPUs: []string{"GPU-a", "GPU-b"}}
	NewCollector(reg, Sources{
		Offer: func() Offer { return offer },
		Allocations: func(context.Context) (map[string][]string, error) {
			return map[string][]string{
				"nvidia.com/gpu.shared":   {"GPU-a::0", "GPU-a::3", "GPU-b::1"},
				"gpufrac.io/gpu-fraction": {"GPU-a::7"}, // another resource's unit
			}, nil
		},
	})
	want := `
# HELP gpufrac_timeslice_replicas Time-sliced replicas the GPU offers (timeslice.replicas) under resource.
# TYPE gpufrac_timeslice_replicas gauge
gpufrac_timeslice_replicas{gpu_uuid="GPU-a",resource="nvidia.com/gpu.shared"} 4
gpufrac_timeslice_replicas{gpu_uuid="GPU-b",resource="nvidia.com/gpu.shared"} 4
# HELP gpufrac_timeslice_replicas_allocated Time-sliced replicas of the GPU the kubelet has allocated to containers.
# TYPE gpufrac_timeslice_replicas_allocated gauge
gpufrac_timeslice_replicas_allocated{gpu_uuid="GPU-a",resource="nvidia.com/gpu.shared"} 2
gpufrac_timeslice_replicas_allocated{gpu_uuid="GPU-b",resource="nvidia.com/gpu.shared"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}
