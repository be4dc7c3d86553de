package queue_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpufrac/gpufrac/coordinator/queue"
	"github.com/gpufrac/gpufrac/tests/builders"
)

func TestFairShare(t *testing.T) {
	tests := []struct {
		name     string
		specs    []queue.Spec
		used     []usage
		capacity queue.Resources
		demand   map[string]queue.Resources
		want     map[string]queue.Resources
	}{
		{
			name: "surplus in proportion to weights",
			specs: []queue.Spec{
				spec(builders.MakeQueue("a").GPUQuota("2").GPUWeight(1)),
				spec(builders.MakeQueue("b").GPUQuota("2").GPUWeight(3)),
			},
			capacity: gpus("12"),
			demand:   map[string]queue.Resources{"a": gpus("10"), "b": gpus("10")},
			want:     map[string]queue.Resources{"a": gpus("4"), "b": gpus("8")},
		},
		{
			name: "water-filling: what a queue cannot use goes to the others",
			specs: []queue.Spec{
				spec(builders.MakeQueue("a").GPUQuota("2").GPUWeight(1)),
				spec(builders.MakeQueue("b").GPUQuota("2").GPUWeight(3)),
			},
			capacity: gpus("12"),
			demand:   map[string]queue.Resources{"a": gpus("10"), "b": gpus("3")},
			want:     map[string]queue.Resources{"a": gpus("9"), "b": gpus("3")},
		},
		{
			name: "deserved quota beyond demand is not held",
			specs: []queue.Spec{
				spec(builders.MakeQueue("a").GPUQuota("4")),
				spec(builders.MakeQueue("b").GPUQuota("4")),
			},
			capacity: gpus("8"),
			demand:   map[string]queue.Resources{"a": gpus("1"), "b": gpus("10")},
			want:     map[string]queue.Resources{"a": gpus("1"), "b": gpus("7")},
		},
		{
			name: "deserved quotas beyond capacity are scaled down",
			specs: []queue.Spec{
				spec(builders.MakeQueue("a").GPUQuota("6")),
				spec(builders.MakeQueue("b").GPUQuota("2")),
			},
			capacity: gpus("4"),
			demand:   map[string]queue.Resources{"a": gpus("10"), "b": gpus("10")},
			want:     map[string]queue.Resources{"a": gpus("3"), "b": gpus("1")},
		},
		{
			name: "weight zero gets no surplus",
			specs: []queue.Spec{
				spec(builders.MakeQueue("a").GPUQuota("1").GPUWeight(0)),
				spec(builders.MakeQueue("b").GPUQuota("1")),
			},
			capacity: gpus("10"),
			demand:   map[string]queue.Resources{"a": gpus("10"), "b": gpus("3")},
			want:     map[string]queue.Resources{"a": gpus("1"), "b": gpus("3")},
		},
		{
			name: "limit caps the share",
			specs: []queue.Spec{
				spec(builders.MakeQueue("a").GPUQuota("2").GPULimit("3")),
				spec(builders.MakeQueue("b").GPUQuota("2")),
			},
			capacity: gpus("12"),
			demand:   map[string]queue.Resources{"a": gpus("10"), "b": gpus("10")},
			want:     map[string]queue.Resources{"a": gpus("3"), "b": gpus("9")},
		},
		{
			name: "recursively down the hierarchy",
			specs: []queue.Spec{
				spec(builders.MakeQueue("org1").GPUQuota("6")),
				spec(builders.MakeQueue("a").Parent("org1").GPUQuota("4")),
				spec(builders.MakeQueue("b").Parent("org1").GPUQuota("2")),
				spec(builders.MakeQueue("org2").GPUQuota("2")),
				spec(builders.MakeQueue("c").Parent("org2").GPUQuota("2")),
			},
			capacity: gpus("10"),
			demand:   map[string]queue.Resources{"a": gpus("8"), "c": gpus("8")},
			want: map[string]queue.Resources{
				"org1": gpus("7"), "a": gpus("7"), "b": {},
				"org2": gpus("3"), "c": gpus("3"),
			},
		},
		{
			name: "usage counts as demand",
			specs: []queue.Spec{
				spec(builders.MakeQueue("a").GPUQuota("1")),
				spec(builders.MakeQueue("b").GPUQuota("1")),
			},
			used:     []usage{{queue: "a", res: gpus("3")}},
			capacity: gpus("10"),
			demand:   map[string]queue.Resources{"b": gpus("2"), "ghost": gpus("5")},
			want:     map[string]queue.Resources{"a": gpus("3"), "b": gpus("2")},
		},
		{
			name: "remainders go to the first queues by name",
			specs: []queue.Spec{
				spec(builders.MakeQueue("a").GPUQuota("0")),
				spec(builders.MakeQueue("b").GPUQuota("0")),
				spec(builders.MakeQueue("c").GPUQuota("0")),
			},
			capacity: gpus("1"),
			demand:   map[string]queue.Resources{"a": gpus("1"), "b": gpus("1"), "c": gpus("1")},
			want: map[string]queue.Resources{
				"a": {GPUMilli: 334}, "b": {GPUMilli: 333}, "c": {GPUMilli: 333},
			},
		},
		{
			name: "each resource on its own; unmanaged ones by demand",
			specs: []queue.Spec{
				spec(builders.MakeQueue("a").GPUQuota("1").MemoryQuota("10Gi")), // CPU unmanaged
				spec(builders.MakeQueue("b").GPUQuota("1").CPUQuota("2").MemoryQuota("10Gi")),
			},
			capacity: res("2", "10", "16Gi"),
			demand: map[string]queue.Resources{
				"a": res("4", "9", "4Gi"),
				"b": res("4", "4", "20Gi"),
			},
			// CPU: a's unmanaged quota is unlimited, so both deserved parts
			// (9 for a, 2 for b) exceed the 10 CPUs and are scaled down.
			want: map[string]queue.Resources{
				"a": {GPUMilli: 1000, CPUMilli: 8182, MemoryBytes: 4 << 30},
				"b": {GPUMilli: 1000, CPUMilli: 1818, MemoryBytes: 12 << 30},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tree := newTree(t, tc.specs, tc.used...)
			got := tree.FairShare(tc.capacity, tc.demand)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("fair share (-want +got):\n%s", diff)
			}
		})
	}
}

// TestFairShareInvariants checks properties of the fair share on random trees.
func TestFairShareInvariants(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := range 300 {
		t.Run(fmt.Sprint(iter), func(t *testing.T) {
			var specs []queue.Spec
			nQueues := 1 + rng.IntN(12)
			positiveWeights := iter%2 == 0
			for i := range nQueues {
				w := int32(rng.IntN(4))
				if positiveWeights {
					w++
				}
				b := builders.MakeQueue(fmt.Sprintf("q%02d", i)).
					GPUQuota(fmt.Sprintf("%dm", rng.IntN(5000))).
					GPUWeight(w)
				if rng.IntN(4) == 0 {
					b.GPULimit(fmt.Sprintf("%dm", 5000+rng.IntN(5000)))
				}
				if i > 0 && rng.IntN(3) > 0 {
					b.Parent(fmt.Sprintf("q%02d", rng.IntN(i)))
				}
				specs = append(specs, spec(b))
			}
			tree := newTree(t, specs)
			demand := map[string]queue.Resources{}
			for _, leaf := range tree.Leaves() {
				demand[leaf] = queue.Resources{GPUMilli: int64(rng.IntN(8000))}
			}
			capacity := int64(rng.IntN(30000))
			share := tree.FairShare(queue.Resources{GPUMilli: capacity}, demand)

			var rootsSum, wantSum, baseSum int64
			childSum := map[string]int64{}
			for _, name := range tree.Names() {
				spec, _ := tree.Spec(name)
				s := share[name].GPUMilli
				if s < 0 || s > spec.Limit.GPUMilli {
					t.Errorf("queue %s: share %d outside 0..limit %d", name, s, spec.Limit.GPUMilli)
				}
				if d, leaf := demand[name]; leaf && s > d.GPUMilli {
					t.Errorf("leaf %s: share %d above demand %d", name, s, d.GPUMilli)
				}
				if spec.Parent == "" {
					rootsSum += s
					w := wantOf(tree, name, demand)
					wantSum += w
					baseSum += min(w, spec.Quota.GPUMilli)
				} else {
					childSum[spec.Parent] += s
				}
			}
			for parent, sum := range childSum {
				if sum > share[parent].GPUMilli {
					t.Errorf("children of %s get %d, more than its share %d", parent, sum, share[parent].GPUMilli)
				}
				// A parent's share never exceeds what its children want, so
				// with positive weights they use all of it.
				if positiveWeights && sum != share[parent].GPUMilli {
					t.Errorf("children of %s get %d, want all of its share %d", parent, sum, share[parent].GPUMilli)
				}
			}
			if rootsSum > capacity {
				t.Errorf("top-level queues get %d, more than the capacity %d", rootsSum, capacity)
			}
			// Deserved first: when the deserved parts fit, every top-level
			// queue gets at least min(quota, demand).
			if baseSum <= capacity {
				for _, name := range tree.Names() {
					spec, _ := tree.Spec(name)
					if spec.Parent != "" {
						continue
					}
					if floor := min(wantOf(tree, name, demand), spec.Quota.GPUMilli); share[name].GPUMilli < floor {
						t.Errorf("queue %s: share %d below its deserved part %d", name, share[name].GPUMilli, floor)
					}
				}
			}
			// Work conserving when every queue takes surplus: nothing is left
			// idle while some queue still wants it.
			if positiveWeights && rootsSum != min(capacity, wantSum) {
				t.Errorf("top-level queues get %d, want min(capacity %d, demand %d)", rootsSum, capacity, wantSum)
			}
		})
	}
}

// wantOf is a queue's demand for its subtree capped by its limit, as FairShare sees it.
func wantOf(tree *queue.Tree, name string, demand map[string]queue.Resources) int64 {
	spec, _ := tree.Spec(name)
	var w int64
	if d, ok := demand[name]; ok {
		w = d.GPUMilli
	}
	for _, other := range tree.Names() {
		if s, _ := tree.Spec(other); s.Parent == name {
			w += wantOf(tree, other, demand)
		}
	}
	return min(w, spec.Limit.GPUMilli)
}
