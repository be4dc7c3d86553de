package placement

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestReservedGPUsTakeSharesOnly: every policy keeps whole-GPU requests off
// a reserved GPU, even when all of it is free, puts shares on it, and the
// snapshot reports its true free milli through Assume, Rollback and Clone.
func TestReservedGPUsTakeSharesOnly(t *testing.T) {
	for _, policy := range Policies() {
		t.Run(policy, func(t *testing.T) {
			s, err := NewSnapshot([]Node{{Name: "n", CPUMilli: 64000, MemoryBytes: 1 << 40,
				GPUs: []GPU{{ID: "g0", FreeMilli: 1000, Reserved: true}, {ID: "g1", FreeMilli: 1000}}}})
			if err != nil {
				t.Fatal(err)
			}
			p, err := New(policy, Options{Seed: 1})
			if err != nil {
				t.Fatal(err)
			}
			d, err := p.Place(s, &Request{GPUs: 1})
			if err != nil || d.GPUs[0] != "g1" {
				t.Fatalf("whole GPU: %+v, %v; want g1, the unreserved one", d, err)
			}
			cp := s.Checkpoint()
			if err := s.Assume(&Request{GPUs: 1}, d); err != nil {
				t.Fatal(err)
			}
			if _, err := p.Place(s, &Request{GPUs: 1}); err == nil {
				t.Fatal("a second whole GPU was placed: only the reserved one is left")
			}
			share := &Request{ShareMilli: 300}
			d, err = p.Place(s, share)
			if err != nil || d.GPUs[0] != "g0" {
				t.Fatalf("share: %+v, %v; want the reserved g0", d, err)
			}
			if err := s.Assume(share, d); err != nil {
				t.Fatal(err)
			}
			want := []GPU{{ID: "g0", FreeMilli: 700, Reserved: true}, {ID: "g1", FreeMilli: 0}}
			if diff := cmp.Diff(want, s.Node(0).GPUs); diff != "" {
				t.Errorf("after a whole GPU and a share (-want +got):\n%s", diff)
			}
			c := s.Clone()
			if err := s.Rollback(cp); err != nil {
				t.Fatal(err)
			}
			want = []GPU{{ID: "g0", FreeMilli: 1000, Reserved: true}, {ID: "g1", FreeMilli: 1000}}
			if diff := cmp.Diff(want, s.Node(0).GPUs); diff != "" {
				t.Errorf("after rollback (-want +got):\n%s", diff)
			}
			if got := c.Node(0).GPUs[0]; got.FreeMilli != 700 || !got.Reserved {
				t.Errorf("clone's g0 = %+v, want 700 free, reserved", got)
			}
			if _, err := p.Place(s, &Request{GPUs: 2}); err == nil {
				t.Error("two whole GPUs placed on a node with one unreserved GPU")
			}
			err = s.Assume(&Request{GPUs: 1}, Decision{Node: "n", GPUIndices: []int{0}})
			if !errors.Is(err, ErrConflict) {
				t.Errorf("assuming a whole GPU on the reserved one: %v, want ErrConflict", err)
			}
		})
	}
}
