package app

import (
	"math"
	"runtime/debug"
	"testing"
)

// TestMemoryLimit: the runtime's soft limit is 90 % of the container's
// limit; GOMEMLIMIT, when set, wins; no limit leaves the runtime's
// default; a value that is not bytes is refused and sets nothing.
func TestMemoryLimit(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1)) // restored after the test
	cases := []struct {
		name, container, gomemlimit string
		want                        int64
		wantErr                     bool
	}{
		{name: "chart default 512Mi", container: "536870912", want: 483183820},
		{name: "GOMEMLIMIT wins", container: "536870912", gomemlimit: "300MiB"},
		{name: "no limit", container: ""},
		{name: "quantity, not bytes", container: "512Mi", wantErr: true},
		{name: "zero", container: "0", wantErr: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			debug.SetMemoryLimit(math.MaxInt64)
			got, err := MemoryLimit(tc.container, tc.gomemlimit)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("MemoryLimit(%q, %q) = %d, %v; want %d, error %v", tc.container, tc.gomemlimit, got, err, tc.want, tc.wantErr)
			}
			wantRuntime := int64(math.MaxInt64)
			if tc.want > 0 {
				wantRuntime = tc.want
			}
			if rt := debug.SetMemoryLimit(-1); rt != wantRuntime {
				t.Errorf("runtime limit %d, want %d", rt, wantRuntime)
			}
		})
	}
}
