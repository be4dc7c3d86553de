package config

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpufrac/gpufrac/timeslice"
)

func TestTimesliceSharing(t *testing.T) {
	tests := []struct {
		name string
		in   TimesliceConfig
		want timeslice.Sharing
	}{
		{name: "defaults", want: timeslice.Sharing{Replicas: 4, ResourceName: "nvidia.com/gpu.shared"}},
		{name: "set", in: TimesliceConfig{Replicas: 8, ResourceName: "example.com/ts", FailRequestsGreaterThanOne: true},
			want: timeslice.Sharing{Replicas: 8, ResourceName: "example.com/ts", FailRequestsGreaterThanOne: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, tc.in.Sharing()); diff != "" {
				t.Errorf("Sharing (-want +got):\n%s", diff)
			}
		})
	}
}
