package pricing

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/tests/builders"
)

const h100Table = `
instanceTypes:
  - {name: gpu-8x-h100, gpus: 8, price: 98.32}
  - {name: gpu-1x-h100, gpus: 1, price: 14.19}
nodePools: {spot: 2.5}
`

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    *Table
		wantErr string
	}{
		{
			name: "types and pools",
			in:   h100Table,
			want: &Table{
				InstanceTypes: []InstanceType{{Name: "gpu-8x-h100", GPUs: 8, Price: 98.32}, {Name: "gpu-1x-h100", GPUs: 1, Price: 14.19}},
				NodePools:     map[string]float64{"spot": 2.5},
			},
		},
		{name: "empty is no table", in: "", want: &Table{}},
		{name: "typo in a field", in: "instanceType: []", wantErr: `unknown field "instanceType"`},
		{name: "no GPUs", in: "instanceTypes: [{name: a, gpus: 0, price: 1}]", wantErr: `"a" has 0 GPUs`},
		{name: "free", in: "instanceTypes: [{name: a, gpus: 1, price: 0}]", wantErr: `"a" costs 0 per hour`},
		{name: "negative", in: "instanceTypes: [{name: a, gpus: 1, price: -3}]", wantErr: `costs -3 per hour`},
		{name: "twice", in: "instanceTypes: [{name: a, gpus: 1, price: 1}, {name: a, gpus: 2, price: 2}]", wantErr: `"a" is listed twice`},
		{name: "no name", in: "instanceTypes: [{gpus: 1, price: 1}]", wantErr: `instanceTypes[0] has no name`},
		{name: "pool free", in: "nodePools: {p: 0}", wantErr: `NodePool "p" costs 0`},
		{name: "negative default", in: "defaultGPUPrice: -1", wantErr: `defaultGPUPrice -1`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(tt.in))
			if tt.wantErr != "" {
				if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Parse error %v, want ErrInvalid mentioning %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Parse (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLoad(t *testing.T) {
	if tab, err := Load(""); tab != nil || err != nil {
		t.Errorf("Load(\"\") = %v, %v; want no table", tab, err)
	}
	dir := t.TempDir()
	good := filepath.Join(dir, "prices.yaml")
	if err := os.WriteFile(good, []byte(h100Table), 0o600); err != nil {
		t.Fatal(err)
	}
	tab, err := Load(good)
	if err != nil || len(tab.InstanceTypes) != 2 {
		t.Fatalf("Load = %+v, %v", tab, err)
	}
	if _, err := Load(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Error("Load of a missing file succeeded")
	}
}

func TestNodePrice(t *testing.T) {
	tab, err := Parse([]byte(h100Table))
	if err != nil {
		t.Fatal(err)
	}
	node := func(typ, pool string) *builders.NodeWrapper {
		w := builders.MakeNode("n")
		if typ != "" {
			w = w.Label("node.kubernetes.io/instance-type", typ)
		}
		if pool != "" {
			w = w.Label(api.LabelNodePool, pool)
		}
		return w
	}
	tests := []struct {
		name       string
		tab        *Table
		typ, pool  string
		gpus       int
		want       float64
		wantSource Source
	}{
		{name: "listed type", tab: tab, typ: "gpu-8x-h100", pool: "spot", gpus: 8, want: 98.32, wantSource: SourceInstanceType},
		{name: "pool price per GPU", tab: tab, typ: "p4d", pool: "spot", gpus: 4, want: 10, wantSource: SourceNodePool},
		{name: "unknown: the lowest per-GPU price", tab: tab, typ: "p4d", pool: "other", gpus: 2, want: 2 * 2.5, wantSource: SourceDefault},
		{name: "admin's default", tab: &Table{DefaultGPUPrice: 3}, gpus: 2, want: 6, wantSource: SourceDefault},
		{name: "no table: GPUs", tab: nil, typ: "gpu-8x-h100", gpus: 8, want: 8, wantSource: SourceDefault},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, src := tt.tab.NodePrice(node(tt.typ, tt.pool).Obj(), tt.gpus)
			if math.Abs(got-tt.want) > 1e-9 || src != tt.wantSource {
				t.Errorf("NodePrice = %v (%s), want %v (%s)", got, src, tt.want, tt.wantSource)
			}
		})
	}
}

func TestCheapestMix(t *testing.T) {
	tab, err := Parse([]byte(h100Table))
	if err != nil {
		t.Fatal(err)
	}
	types := tab.Sorted()
	names := func(m Mix) []string {
		var out []string
		for _, t := range m.Types {
			out = append(out, t.Name)
		}
		return out
	}
	one, eight := "gpu-1x-h100", "gpu-8x-h100"
	tests := []struct {
		name  string
		gpus  int
		want  []string
		price float64
	}{
		{name: "one GPU", gpus: 1, want: []string{one}, price: 14.19},
		{name: "five 40% fractions need three GPUs: three 1x", gpus: 3, want: []string{one, one, one}, price: 3 * 14.19},
		{name: "five GPUs: five 1x beat one 8x", gpus: 5, want: []string{one, one, one, one, one}, price: 5 * 14.19},
		{name: "seven GPUs: one 8x beats seven 1x", gpus: 7, want: []string{eight}, price: 98.32},
		{name: "nine GPUs: 8x and 1x", gpus: 9, want: []string{eight, one}, price: 98.32 + 14.19},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, ok := CheapestMix(tt.gpus, types)
			if !ok {
				t.Fatal("no mix")
			}
			if diff := cmp.Diff(tt.want, names(m)); diff != "" || math.Abs(m.Price-tt.price) > 1e-9 {
				t.Errorf("CheapestMix(%d) = %v $%.2f, want $%.2f (-want +got):\n%s", tt.gpus, names(m), m.Price, tt.price, diff)
			}
			if m.GPUs() < tt.gpus {
				t.Errorf("mix holds %d GPUs, fewer than %d", m.GPUs(), tt.gpus)
			}
		})
	}
	if _, ok := CheapestMix(0, types); ok {
		t.Error("a mix for no GPUs")
	}
	if _, ok := CheapestMix(3, nil); ok {
		t.Error("a mix without types")
	}
}
