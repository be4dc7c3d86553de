package queue_test

import (
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpufrac/gpufrac/coordinator/queue"
	"github.com/gpufrac/gpufrac/tests/builders"
)

func TestOrder(t *testing.T) {
	flat := []queue.Spec{
		spec(builders.MakeQueue("a").GPUQuota("4")),
		spec(builders.MakeQueue("b").GPUQuota("4").Priority(5)),
		spec(builders.MakeQueue("c").GPUQuota("4")),
		spec(builders.MakeQueue("d").GPUQuota("2").CPUQuota("4")),
		spec(builders.MakeQueue("z").GPUQuota("0")),
	}
	tests := []struct {
		name   string
		specs  []queue.Spec
		used   []usage
		fair   *fairShare
		leaves []string
		want   []string
	}{
		{
			name:  "by usage over deserved quota before any fair share",
			specs: flat,
			used: []usage{
				{queue: "a", res: gpus("3")}, // 0.75
				{queue: "c", res: gpus("1")}, // 0.25
				{queue: "d", res: gpus("1")}, // 0.5
			},
			leaves: []string{"a", "c", "d"},
			want:   []string{"c", "d", "a"},
		},
		{
			name:  "dominant resource decides",
			specs: flat,
			used: []usage{
				{queue: "a", res: gpus("2")},           // 0.5
				{queue: "d", res: res("0.5", "3", "")}, // gpu 0.25, cpu 0.75
			},
			leaves: []string{"d", "a"},
			want:   []string{"a", "d"},
		},
		{
			name:   "equal shares: higher priority, then name",
			specs:  flat,
			leaves: []string{"c", "a", "b"},
			want:   []string{"b", "a", "c"},
		},
		{
			name:   "zero quota in use comes last; unknown queues after all",
			specs:  flat,
			used:   []usage{{queue: "z", res: gpus("0.1")}, {queue: "a", res: gpus("4")}},
			leaves: []string{"nope", "z", "a"},
			want:   []string{"a", "z", "nope"},
		},
		{
			name:  "fair share replaces the deserved quota once known",
			specs: flat,
			used: []usage{
				{queue: "a", res: gpus("4")}, // quota 4, fair 8: 0.5
				{queue: "c", res: gpus("3")}, // quota 4, fair 4: 0.75
			},
			fair: &fairShare{capacity: gpus("12"), demand: map[string]queue.Resources{
				"a": gpus("8"), "c": gpus("4"),
			}},
			leaves: []string{"c", "a"},
			want:   []string{"a", "c"},
		},
		{
			name: "hierarchical: a team of a busy organisation waits",
			specs: []queue.Spec{
				spec(builders.MakeQueue("busy").GPUQuota("4")),
				spec(builders.MakeQueue("busy-1").Parent("busy").GPUQuota("2")),
				spec(builders.MakeQueue("busy-2").Parent("busy").GPUQuota("2")),
				spec(builders.MakeQueue("idle").GPUQuota("4")),
				spec(builders.MakeQueue("idle-1").Parent("idle").GPUQuota("4")),
			},
			used: []usage{
				{queue: "busy-2", res: gpus("4")}, // busy at 1.0, busy-1 at 0
				{queue: "idle-1", res: gpus("2")}, // idle at 0.5, idle-1 at 0.5
			},
			leaves: []string{"busy-1", "busy-2", "idle-1"},
			want:   []string{"idle-1", "busy-1", "busy-2"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tree := newTree(t, tc.specs, tc.used...)
			if tc.fair != nil {
				tree.FairShare(tc.fair.capacity, tc.fair.demand)
			}
			in := append([]string(nil), tc.leaves...)
			if diff := cmp.Diff(tc.want, tree.Order(in)); diff != "" {
				t.Errorf("order (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.leaves, in); diff != "" {
				t.Errorf("Order changed its argument (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDominantShare(t *testing.T) {
	tree := newTree(t, []queue.Spec{
		spec(builders.MakeQueue("a").GPUQuota("4").CPUQuota("8")),
		spec(builders.MakeQueue("zero").GPUQuota("0")),
		spec(builders.MakeQueue("idle").GPUQuota("0")),
	}, usage{queue: "a", res: res("1", "6", "100Gi")}, usage{queue: "zero", res: gpus("1")})
	tests := []struct {
		name   string
		queue  string
		want   float64
		wantOK bool
	}{
		{name: "largest managed ratio; memory unmanaged", queue: "a", want: 0.75, wantOK: true},
		{name: "in use with nothing deserved", queue: "zero", want: math.Inf(1), wantOK: true},
		{name: "nothing used, nothing deserved", queue: "idle", want: 0, wantOK: true},
		{name: "unknown", queue: "nope", want: 0, wantOK: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := tree.DominantShare(tc.queue)
			if got != tc.want || ok != tc.wantOK {
				t.Errorf("DominantShare(%s) = %v, %v; want %v, %v", tc.queue, got, ok, tc.want, tc.wantOK)
			}
		})
	}
}
