package app

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"
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

// A node is drifted when a NodeClaim naming it (status.nodeName) has
// Drifted=True, Karpenter v1's condition; nothing else counts, and without
// Karpenter's CRD (no index) no node is.
func TestNodeDrifted(t *testing.T) {
	claim := func(name, node string, conds ...any) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
			"metadata": map[string]any{"name": name, "annotations": map[string]any{"drifted": "true"}}}}
		u.Object["status"] = map[string]any{"nodeName": node, "conditions": conds}
		return u
	}
	cond := func(typ, status string) any { return map[string]any{"type": typ, "status": status} }
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{nodeClaimByNode: nodeClaimNode})
	for _, c := range []*unstructured.Unstructured{
		claim("a", "drifted", cond("Initialized", "True"), cond("Drifted", "True")),
		claim("b", "not-yet", cond("Drifted", "Unknown")),
		claim("c", "false", cond("Drifted", "False")),
		claim("d", "other", cond("Consolidatable", "True"), "Drifted"),
	} {
		if err := idx.Add(c); err != nil {
			t.Fatal(err)
		}
	}
	l := &leader{claimIndex: idx}
	for node, want := range map[string]bool{"drifted": true, "not-yet": false, "false": false, "other": false, "unknown": false} {
		if got := l.nodeDrifted(node); got != want {
			t.Errorf("nodeDrifted(%q) = %v, want %v", node, got, want)
		}
	}
	if (&leader{}).nodeDrifted("drifted") {
		t.Error("without Karpenter's CRD a node is drifted")
	}
}
