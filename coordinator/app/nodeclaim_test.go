package app

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func TestNodeClaimRegistered(t *testing.T) {
	at := func(s string) time.Time {
		t, err := time.Parse(time.RFC3339, s)
		if err != nil {
			panic(err)
		}
		return t
	}
	cond := func(typ, status, when string) any {
		return map[string]any{"type": typ, "status": status, "lastTransitionTime": when}
	}
	for _, tc := range []struct {
		name  string
		conds []any
		want  time.Time
	}{
		{name: "no status"},
		{name: "launched, not registered", conds: []any{cond("Launched", "True", "2026-11-28T19:00:00Z"), cond("Registered", "Unknown", "2026-11-28T19:00:01Z")}},
		{name: "registered", conds: []any{cond("Launched", "True", "2026-11-28T19:00:00Z"), cond("Registered", "True", "2026-11-28T19:00:05Z")}, want: at("2026-11-28T19:00:05Z")},
		{
			name:  "initialized after it registered: the later",
			conds: []any{cond("Registered", "True", "2026-11-28T19:00:05Z"), cond("Initialized", "True", "2026-11-28T19:00:07Z")},
			want:  at("2026-11-28T19:00:07Z"),
		},
		{name: "a time that does not parse", conds: []any{cond("Registered", "True", "soon")}},
		{name: "a condition that is no object", conds: []any{"Registered"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := &unstructured.Unstructured{Object: map[string]any{"kind": "NodeClaim"}}
			if tc.conds != nil {
				u.Object["status"] = map[string]any{"conditions": tc.conds, "nodeName": "n1"}
			}
			if got := nodeClaimRegistered(u); !got.Equal(tc.want) {
				t.Errorf("nodeClaimRegistered = %v, want %v", got, tc.want)
			}
			keys, err := nodeClaimNode(u)
			if err != nil {
				t.Fatal(err)
			}
			var want []string
			if tc.conds != nil {
				want = []string{"n1"}
			}
			if diff := cmp.Diff(want, keys); diff != "" {
				t.Errorf("index keys (-want +got):\n%s", diff)
			}
		})
	}
}
