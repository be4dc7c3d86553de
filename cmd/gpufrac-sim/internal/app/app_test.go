package app

import (
	"bytes"
	"encoding/csv"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseSeeds(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []uint64
		wantErr bool
	}{
		{name: "range", in: "42-45", want: []uint64{42, 43, 44, 45}},
		{name: "list and range", in: "1, 5-6,9", want: []uint64{1, 5, 6, 9}},
		{name: "single", in: "7", want: []uint64{7}},
		{name: "reversed range", in: "9-1", wantErr: true},
		{name: "not a number", in: "x", wantErr: true},
		{name: "empty", in: "", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseSeeds(tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("ParseSeeds(%q): err %v, want error %v", tc.in, err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ParseSeeds(%q) (-want +got):\n%s", tc.in, diff)
			}
		})
	}
}

// Run on a tiny trace writes the summary, one curve row per seed and the plot.
func TestRunWritesReports(t *testing.T) {
	dir := t.TempDir()
	nodes := "sn,cpu_milli,memory_mib,gpu,model\n"
	for i := range 6 {
		nodes += fmt.Sprintf("n%d,64000,262144,4,%s\n", i, []string{"A", "B"}[i%2])
	}
	pods := "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
	for i := range 40 {
		pods += fmt.Sprintf("p%02d,4000,8192,%d,%d,\n", i, 1-i%5/4, []int{470, 1000, 810, 320, 0}[i%5])
	}
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	cfg := Config{
		NodesFile: write("nodes.csv", nodes),
		PodsFile:  write("pods.csv", pods),
		Policies:  []string{"fgd", "gpufrac"},
		Seeds:     []uint64{1, 2},
		Inflation: 1.3,
		Coverage:  0.95,
		Variants:  []string{"", "share=0.8"},
		OutDir:    filepath.Join(dir, "out"),
		Workers:   2,
	}
	var stdout bytes.Buffer
	if err := Run(t.Context(), cfg, &stdout); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## workload default", "## workload share=0.80", "| fgd | 2 |", "| gpufrac | 2 |"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout.String())
		}
	}
	for _, workload := range []string{"default", "share=0.80"} {
		for _, name := range []string{"summary.md", "alloc.svg", "fgd_alloc.csv", "gpufrac_frag.csv"} {
			if _, err := os.Stat(filepath.Join(cfg.OutDir, workload, name)); err != nil {
				t.Errorf("missing report: %v", err)
			}
		}
	}
	f, err := os.Open(filepath.Join(cfg.OutDir, "default", "gpufrac_alloc.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 || len(rows[0]) != 132 || rows[0][131] != "130" || rows[1][0] != "1" {
		t.Errorf("curve CSV: %d rows, header %v...", len(rows), rows[0][:3])
	}

	for _, name := range []string{"curve.md", "curve.csv"} {
		if _, err := os.Stat(filepath.Join(cfg.OutDir, "default", name)); err != nil {
			t.Errorf("missing whole-curve report: %v", err)
		}
	}

	// A family: every variant's reports under the family, and the family's
	// table, curves and plot.
	stdout.Reset()
	cfg.Variants, cfg.Families, cfg.Compare = nil, []string{"gpuspec", "focus"}, [2]string{"gpufrac", "fgd"}
	if err := Run(t.Context(), cfg, &stdout); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## family gpuspec", "## family focus", "| gpuspec=0.20 |", "| gpuspec=0.20,focus=A,conc=0.50 |", "worst x (gap)"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout.String())
		}
	}
	for _, name := range []string{"gpuspec/family.md", "gpuspec/family.svg", "gpuspec/curves.csv", "gpuspec/gpuspec=0.33/curve.md", "focus/gpuspec=0.20,focus=B,conc=0.50/gpufrac_alloc.csv"} {
		if _, err := os.Stat(filepath.Join(cfg.OutDir, name)); err != nil {
			t.Errorf("missing family report: %v", err)
		}
	}
	cfg.Families = []string{"nope"}
	if err := Run(t.Context(), cfg, &stdout); err == nil || !strings.Contains(err.Error(), "scarcemix") {
		t.Errorf("Run with an unknown family: got %v, want an error listing the families", err)
	}

	cfg.Families = nil
	cfg.Policies = []string{"nope"}
	if err := Run(t.Context(), cfg, &stdout); err == nil {
		t.Error("Run with an unknown policy: got nil error")
	}
}
