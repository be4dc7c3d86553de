package main

import (
	"strings"
	"testing"
	"time"
)

// TestSourceDateEpoch checks SOURCE_DATE_EPOCH's reading: unset is the zero
// time (the release takes the commit's), a number of seconds is that time in
// UTC, anything else a clear error.
func TestSourceDateEpoch(t *testing.T) {
	tests := []struct {
		in      string
		want    time.Time
		wantErr string
	}{
		{"", time.Time{}, ""},
		{"0", time.Unix(0, 0).UTC(), ""},
		{"1795968817", time.Date(2026, 11, 29, 16, 13, 37, 0, time.UTC), ""},
		{"-1", time.Time{}, "non-negative number of seconds"},
		{"2026-11-29", time.Time{}, `SOURCE_DATE_EPOCH="2026-11-29"`},
	}
	for _, tc := range tests {
		got, err := sourceDateEpoch(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("sourceDateEpoch(%q) = %v, %v; want an error saying %q", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !got.Equal(tc.want) || got.Location() != time.UTC {
			t.Errorf("sourceDateEpoch(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}
