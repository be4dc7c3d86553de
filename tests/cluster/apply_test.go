package cluster_test

import (
	"strings"
	"testing"

	"github.com/gpufrac/gpufrac/tests/cluster"
)

func TestDecodeObjects(t *testing.T) {
	tests := []struct {
		name    string
		data    string
		want    []string // kind/name
		wantErr string
	}{
		{name: "empty", data: "", want: nil},
		{
			name: "documents, comments and empty ones",
			data: "# a queue\napiVersion: gpufrac.io/v1alpha1\nkind: Queue\nmetadata:\n  name: a\n---\n---\n# nothing\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n",
			want: []string{"Queue/a", "Pod/p"},
		},
		{
			name: "JSON",
			data: `{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"ns"}}`,
			want: []string{"Namespace/ns"},
		},
		{
			name:    "malformed YAML names its source",
			data:    "apiVersion: v1\nkind: Pod\nmetadata: [\n",
			wantErr: "examples/broken.yaml",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := cluster.DecodeObjects("examples/broken.yaml", []byte(tc.data))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one naming %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, o := range objs {
				got = append(got, o.GetKind()+"/"+o.GetName())
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Errorf("decoded %v, want %v", got, tc.want)
			}
		})
	}
}
