package scheduler

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseNomination(t *testing.T) {
	for _, tc := range []struct {
		msg           string
		nodes, claims []string
	}{
		{msg: "Pod should schedule on: nodeclaim/gpu-abc12", claims: []string{"gpu-abc12"}},
		{msg: "Pod should schedule on: nodeclaim/gpu-abc12, node/kwok-gpu-abc12", nodes: []string{"kwok-gpu-abc12"}, claims: []string{"gpu-abc12"}},
		{msg: "something else"},
	} {
		nodes, claims := parseNomination(tc.msg)
		if diff := cmp.Diff(tc.nodes, nodes); diff != "" {
			t.Errorf("%q nodes (-want +got):\n%s", tc.msg, diff)
		}
		if diff := cmp.Diff(tc.claims, claims); diff != "" {
			t.Errorf("%q claims (-want +got):\n%s", tc.msg, diff)
		}
	}
	if g := groupOfPlaceholderName("gpufrac-placeholder-0a1b2c3d4e-12"); g != "0a1b2c3d4e" {
		t.Errorf("group = %q", g)
	}
}
