package timeslice

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

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
			s := Sharing{Replicas: 4, ResourceName: "nvidia.com/gpu.shared", FailRequestsGreaterThanOne: tc.fail}
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
	const h100MiB = 81559
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
			if got := (Sharing{Replicas: tc.replicas}).MemoryLimitMiB(h100MiB, tc.n); got != tc.want {
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
