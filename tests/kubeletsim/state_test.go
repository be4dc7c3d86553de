package kubeletsim_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpufrac/gpufrac/tests/kubeletsim"
)

func TestCounts(t *testing.T) {
	tests := []struct {
		name string
		devs []*v1beta1.Device
		want [2]int // capacity, allocatable
	}{
		{name: "removed resource", devs: nil, want: [2]int{0, 0}},
		{name: "all healthy", devs: []*v1beta1.Device{{ID: "a", Health: v1beta1.Healthy}, {ID: "b", Health: v1beta1.Healthy}}, want: [2]int{2, 2}},
		{
			name: "unhealthy and unknown health are not allocatable",
			devs: []*v1beta1.Device{{ID: "a", Health: v1beta1.Healthy}, {ID: "b", Health: v1beta1.Unhealthy}, {ID: "c"}},
			want: [2]int{3, 1},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			capacity, allocatable := kubeletsim.Counts(tc.devs)
			if diff := cmp.Diff(tc.want, [2]int{capacity, allocatable}); diff != "" {
				t.Errorf("Counts() (-want +got):\n%s", diff)
			}
		})
	}
}
