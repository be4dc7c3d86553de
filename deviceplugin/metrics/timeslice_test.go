package metrics

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpufrac/gpufrac/timeslice"
)

func TestTimesliceCollector(t *testing.T) {
	reg := prometheus.NewRegistry()
	offer := TimesliceOffer{Sharing: timeslice.Sharing{Replicas: 4, ResourceName: "nvidia.com/gpu.shared"}, GPUs: []string{"GPU-a", "GPU-b"}}
	NewTimesliceCollector(reg, TimesliceSources{
		Offer: func() TimesliceOffer { return offer },
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
