package queue_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpufrac/gpufrac/coordinator/queue"
	"github.com/gpufrac/gpufrac/tests/builders"
)

// fairShare is a FairShare call to make before Check.
type fairShare struct {
	capacity queue.Resources
	demand   map[string]queue.Resources
}

func TestCheck(t *testing.T) {
	oversubscribed := []queue.Spec{
		spec(builders.MakeQueue("org").GPUQuota("4")),
		spec(builders.MakeQueue("a").Parent("org").GPUQuota("4")),
		spec(builders.MakeQueue("b").Parent("org").GPUQuota("4")),
	}
	tests := []struct {
		name           string
		specs          []queue.Spec // orgTree when nil
		used           []usage
		fair           *fairShare
		queue          string
		req            queue.Resources
		nonPreemptible bool
		want           queue.Verdict
	}{
		{
			name:  "within the deserved quota",
			used:  []usage{{queue: "team-a", res: gpus("2")}},
			queue: "team-a", req: gpus("1"),
			want: queue.Verdict{Allowed: true},
		},
		{
			name:  "over the leaf's limit",
			used:  []usage{{queue: "team-a", res: gpus("5.5")}},
			fair:  &fairShare{capacity: gpus("20"), demand: map[string]queue.Resources{"team-a": gpus("10")}},
			queue: "team-a", req: gpus("1"),
			want: queue.Verdict{Reason: queue.ReasonOverLimit,
				Message: "queue team-a: limit of 6 GPUs; 5.5 in use and 1 more asked"},
		},
		{
			name: "over an ancestor's limit",
			used: []usage{
				{queue: "team-a", res: gpus("3.5")},
				{queue: "team-b", res: gpus("6")},
			},
			queue: "team-a", req: gpus("1"),
			want: queue.Verdict{Reason: queue.ReasonOverLimit,
				Message: "queue org (an ancestor of team-a): limit of 10 GPUs; 9.5 in use and 1 more asked"},
		},
		{
			name:  "non-preemptible within deserved while preemptible work fills it",
			used:  []usage{{queue: "team-a", res: gpus("4")}},
			queue: "team-a", req: gpus("2"), nonPreemptible: true,
			want: queue.Verdict{Allowed: true},
		},
		{
			name:  "non-preemptible beyond the deserved quota",
			used:  []usage{{queue: "team-a", res: gpus("3.5"), nonPreemptible: true}},
			fair:  &fairShare{capacity: gpus("20"), demand: map[string]queue.Resources{"team-a": gpus("10")}},
			queue: "team-a", req: gpus("1"), nonPreemptible: true,
			want: queue.Verdict{Reason: queue.ReasonOverQuota,
				Message: "queue team-a: non-preemptible pods use 3.5 of 4 deserved GPUs and 1 more is asked; " +
					"non-preemptible work must fit in the deserved quota: wait for some to finish, or run this as preemptible"},
		},
		{
			name:  "non-preemptible beyond an ancestor's deserved quota",
			specs: oversubscribed,
			used:  []usage{{queue: "b", res: gpus("3"), nonPreemptible: true}},
			queue: "a", req: gpus("2"), nonPreemptible: true,
			want: queue.Verdict{Reason: queue.ReasonOverQuota,
				Message: "queue org (an ancestor of a): non-preemptible pods use 3 of 4 deserved GPUs and 2 more is asked; " +
					"non-preemptible work must fit in the deserved quota: wait for some to finish, or run this as preemptible"},
		},
		{
			name:  "preemptible borrows within its fair share",
			used:  []usage{{queue: "team-a", res: gpus("4")}},
			fair:  &fairShare{capacity: gpus("10"), demand: map[string]queue.Resources{"team-a": gpus("6")}},
			queue: "team-a", req: gpus("1"),
			want: queue.Verdict{Allowed: true, OverQuota: true,
				Message: "queue team-a: beyond its 4 deserved GPUs (5 with this, fair share 6); runs preemptible and may be reclaimed"},
		},
		{
			name: "preemptible beyond its fair share",
			used: []usage{
				{queue: "team-a", res: gpus("3.5")},
				{queue: "team-b", res: gpus("4")},
			},
			fair: &fairShare{capacity: gpus("8"), demand: map[string]queue.Resources{
				"team-a": gpus("4.5"), "team-b": gpus("8"),
			}},
			queue: "team-a", req: gpus("1"),
			want: queue.Verdict{Reason: queue.ReasonOverQuota,
				Message: "queue team-a: 3.5 of 4 GPUs deserved in use and 1 more asked, and its fair share is 4 while other queues wait"},
		},
		{
			name:  "before any fair share, borrowing is held to the deserved quota",
			used:  []usage{{queue: "team-a", res: gpus("4")}},
			queue: "team-a", req: gpus("0.5"),
			want: queue.Verdict{Reason: queue.ReasonOverQuota,
				Message: "queue team-a: 4 of 4 GPUs deserved in use and 0.5 more asked, and no fair share is known yet, " +
					"so it is held to 4 while other queues wait"},
		},
		{
			name: "a sibling's borrowing does not count against the deserved quota",
			used: []usage{
				{queue: "team-a", res: gpus("2")},
				{queue: "team-b", res: gpus("6")},
			},
			fair: &fairShare{capacity: gpus("8"), demand: map[string]queue.Resources{
				"team-a": gpus("3"), "team-b": gpus("6"),
			}},
			queue: "team-a", req: gpus("1"),
			want: queue.Verdict{Allowed: true},
		},
		{
			name:  "borrowing at an oversubscribed parent within its fair share",
			specs: oversubscribed,
			used:  []usage{{queue: "b", res: gpus("4")}},
			fair: &fairShare{capacity: gpus("6"), demand: map[string]queue.Resources{
				"a": gpus("1"), "b": gpus("4"),
			}},
			queue: "a", req: gpus("1"),
			want: queue.Verdict{Allowed: true, OverQuota: true,
				Message: "queue org (an ancestor of a): beyond its 4 deserved GPUs (5 with this, fair share 5); runs preemptible and may be reclaimed"},
		},
		{
			name:  "borrowing at an oversubscribed parent beyond its fair share",
			specs: oversubscribed,
			used:  []usage{{queue: "b", res: gpus("4")}},
			fair:  &fairShare{capacity: gpus("4"), demand: map[string]queue.Resources{"a": gpus("1"), "b": gpus("4")}},
			queue: "a", req: gpus("1"),
			want: queue.Verdict{Reason: queue.ReasonOverQuota,
				Message: "queue org (an ancestor of a): 4 of 4 GPUs deserved in use and 1 more asked, and its fair share is 4 while other queues wait"},
		},
		{
			name: "resources the queues do not manage are not checked",
			specs: []queue.Spec{
				spec(builders.MakeQueue("solo").GPUQuota("1")),
			},
			queue: "solo", req: res("1", "64", "1Ti"), nonPreemptible: true,
			want: queue.Verdict{Allowed: true},
		},
		{
			name: "a managed CPU quota is checked like GPUs",
			specs: []queue.Spec{
				spec(builders.MakeQueue("solo").GPUQuota("1").CPUQuota("4").CPULimit("8")),
			},
			used:  []usage{{queue: "solo", res: res("", "7.5", "")}},
			queue: "solo", req: res("", "500m", ""),
			fair: &fairShare{capacity: res("1", "100", ""), demand: map[string]queue.Resources{"solo": res("", "8", "")}},
			want: queue.Verdict{Allowed: true, OverQuota: true,
				Message: "queue solo: beyond its 4 deserved CPUs (8 with this, fair share 8); runs preemptible and may be reclaimed"},
		},
		{
			name:  "unknown queue",
			queue: "team-z", req: gpus("1"),
			want: queue.Verdict{Reason: queue.ReasonInvalidRequest,
				Message: `queue "team-z": unknown queue: create a Queue of that name or use an existing leaf queue`},
		},
		{
			name:  "parent queue",
			queue: "org", req: gpus("1"),
			want: queue.Verdict{Reason: queue.ReasonInvalidRequest,
				Message: `queue "org": queue has child queues (team-a, team-b); pods must use a leaf queue`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			specs := tc.specs
			if specs == nil {
				specs = orgTree()
			}
			tree := newTree(t, specs, tc.used...)
			if tc.fair != nil {
				tree.FairShare(tc.fair.capacity, tc.fair.demand)
			}
			before := usageSnapshot(tree)
			got := tree.Check(tc.queue, tc.req, tc.nonPreemptible)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("verdict (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(before, usageSnapshot(tree)); diff != "" {
				t.Errorf("Check changed the usage (-before +after):\n%s", diff)
			}
		})
	}
}

func usageSnapshot(tree *queue.Tree) map[string][2]queue.Resources {
	out := map[string][2]queue.Resources{}
	for _, name := range tree.Names() {
		u, np, _ := tree.Usage(name)
		out[name] = [2]queue.Resources{u, np}
	}
	return out
}
