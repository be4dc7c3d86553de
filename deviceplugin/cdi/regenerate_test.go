package cdi

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
)

// TestParseSteps: the admin's command is refused when a step is empty or
// its program is not an absolute path (it runs without a shell or PATH).
func TestParseSteps(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps [][]string
		err   string
	}{
		{name: "none", err: "no command"},
		{name: "empty step", steps: [][]string{{"/usr/bin/nvidia-ctk", "cdi", "generate"}, {}}, err: "step 2 is empty"},
		{name: "relative", steps: [][]string{{"nvidia-ctk", "cdi", "generate"}}, err: `step 1: "nvidia-ctk" is not an absolute path`},
		{name: "good", steps: [][]string{{"/usr/bin/nvidia-ctk", "cdi", "generate"}, {"/usr/bin/nvidia-ctk", "cdi", "transform", "root"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ParseSteps(tc.steps)
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("ParseSteps = %v, want %q", err, tc.err)
			}
			if _, err := NewRegenerator(RegenerateOptions{Steps: tc.steps}); (err == nil) != (tc.err == "") {
				t.Errorf("NewRegenerator = %v, want an error: %v", err, tc.err != "")
			}
		})
	}
}

type result struct {
	why string
	err error
}

// startRegenerator runs a Regenerator on steps until the test ends,
// reporting every run's result; the triggers before are pulled before it
// runs, so that they coalesce however the goroutines are scheduled.
func startRegenerator(t *testing.T, steps [][]string, timeout time.Duration, before ...string) (*Regenerator, *prometheus.Registry, chan result) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	results := make(chan result, 100)
	reg := prometheus.NewRegistry()
	r, err := NewRegenerator(RegenerateOptions{Steps: steps, Timeout: timeout, Registerer: reg,
		Backoff:  wait.Backoff{Duration: 20 * time.Millisecond, Factor: 2, Steps: 1 << 30, Cap: 50 * time.Millisecond},
		OnResult: func(why string, err error) { results <- result{why, err} }})
	if err != nil {
		t.Fatal(err)
	}
	for _, why := range before {
		r.Trigger(why)
	}
	done := make(chan struct{})
	go func() { _ = r.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return r, reg, results
}

func next(t *testing.T, results chan result) result {
	t.Helper()
	select {
	case r := <-results:
		return r
	case <-time.After(20 * time.Second):
		t.Fatal("no run")
		return result{}
	}
}

// TestRegeneratorRunsStepsInOrder: the steps run in order on a trigger
// (triggers coalesce, their reasons joined), a failing step stops the run
// and is retried with backoff without a new trigger, the metric counts
// runs by result.
func TestRegeneratorRunsStepsInOrder(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	gate := filepath.Join(dir, "gate")
	steps := [][]string{
		{"/bin/sh", "-c", "echo one >> " + log},
		{"/bin/sh", "-c", "test ! -e " + gate + " || { echo 'NVML: not ready' >&2; exit 3; }"},
		{"/bin/sh", "-c", "echo three >> " + log},
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r, reg, results := startRegenerator(t, steps, time.Minute, "a", "b", "a")
	got := next(t, results)
	if got.why != "a; b" || got.err == nil || !strings.Contains(got.err.Error(), "step 2 (sh): exit status 3") {
		t.Errorf("first run %+v, want why a; b and step 2's exit status 3", got)
	}
	if got := next(t, results); got.err == nil || got.why != "a; b" {
		t.Errorf("retry %+v, want the same failure", got)
	}
	if err := os.Remove(gate); err != nil {
		t.Fatal(err)
	}
	for got = next(t, results); got.err != nil; got = next(t, results) {
	}
	b, _ := os.ReadFile(log)
	lines := strings.Fields(string(b))
	if len(lines) < 3 || lines[len(lines)-1] != "three" || lines[len(lines)-2] != "one" || strings.Count(string(b), "three") != 1 {
		t.Errorf("steps ran %q, want one per run and three only once step 2 passed", lines)
	}
	if v := testutil.ToFloat64(r.runs.WithLabelValues("success")); v != 1 {
		t.Errorf("success runs %v, want 1", v)
	}
	if v := testutil.ToFloat64(r.runs.WithLabelValues("failure")); v < 2 {
		t.Errorf("failure runs %v, want 2 or more", v)
	}
	if n, err := testutil.GatherAndCount(reg, "gpufrac_cdi_regenerations_total"); err != nil || n != 2 {
		t.Errorf("gpufrac_cdi_regenerations_total series %d (%v), want 2", n, err)
	}
	// No more runs without a trigger.
	select {
	case got := <-results:
		t.Errorf("a run without a trigger: %+v", got)
	case <-time.After(200 * time.Millisecond):
	}
}

// TestRegeneratorTimesOut: a step that outlives the timeout is killed and
// the run fails, saying so.
func TestRegeneratorTimesOut(t *testing.T) {
	r, _, results := startRegenerator(t, [][]string{{"/bin/sleep", "30"}}, 100*time.Millisecond)
	start := time.Now()
	r.Trigger("MIG layout changed")
	got := next(t, results)
	if got.err == nil || !strings.Contains(got.err.Error(), "timed out after 100ms") {
		t.Errorf("run %+v, want a timeout", got)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the timed-out step took %s", d)
	}
}

// TestTailBuffer keeps the end of long output.
func TestTailBuffer(t *testing.T) {
	var b tailBuffer
	b.Write([]byte(strings.Repeat("a", maxOutput)))
	b.Write([]byte("end"))
	if s := b.String(); !strings.HasPrefix(s, "…a") || !strings.HasSuffix(s, "aend") || len(s) != len("…")+maxOutput {
		t.Errorf("tail of %d bytes, ends %q", len(s), s[len(s)-8:])
	}
}

// TestRegeneratorTimeoutKillsTheStepsChildren: a step killed at its timeout
// takes the processes it started with it (its process group): none is left
// to hold the output pipes (the run would wait for them) or to write later
// (a half-run nvidia-ctk's helper writing a spec after the retry started).
func TestRegeneratorTimeoutKillsTheStepsChildren(t *testing.T) {
	late := filepath.Join(t.TempDir(), "late")
	r, _, results := startRegenerator(t, [][]string{{"/bin/sh", "-c", "(sleep 1; touch " + late + ") & sleep 30"}}, 100*time.Millisecond)
	start := time.Now()
	r.Trigger("MIG layout changed")
	got := next(t, results)
	if got.err == nil || !strings.Contains(got.err.Error(), "timed out after 100ms") {
		t.Errorf("run %+v, want a timeout", got)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("the timed-out step took %s: the run waited for a child holding its output", d)
	}
	time.Sleep(1500 * time.Millisecond)
	if _, err := os.Stat(late); err == nil {
		t.Error("a child of the timed-out step lived on and wrote after it")
	}
}

// TestRegeneratorInstallsOnlyAValidSpec: with a staged path, a run that
// wrote a spec the CDI library refuses, of another kind, or with no device
// fails (and is retried), and the installed spec stays as it was; a valid
// one replaces it whole.
func TestRegeneratorInstallsOnlyAValidSpec(t *testing.T) {
	const good = "cdiVersion: 0.6.0\nkind: nvidia.com/gpu\ndevices:\n- name: GPU-new\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n"
	const old = "cdiVersion: 0.6.0\nkind: nvidia.com/gpu\ndevices:\n- name: GPU-old\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n"
	for _, tc := range []struct {
		name   string
		staged string // "" writes nothing
		err    string
		want   string // the installed spec after the run
	}{
		{name: "valid", staged: good, want: good},
		{name: "not YAML", staged: "{{{", err: "is not valid", want: old},
		{name: "invalid CDI (no cdiVersion)", staged: "kind: nvidia.com/gpu\ndevices:\n- name: GPU-new\n", err: "is not valid", want: old},
		{name: "another kind", staged: strings.Replace(good, "nvidia.com/gpu", "example.com/net", 1), err: `of kind "example.com/net"`, want: old},
		{name: "no device", staged: "cdiVersion: 0.6.0\nkind: nvidia.com/gpu\ndevices: []\ncontainerEdits:\n  deviceNodes:\n  - path: /dev/nvidiactl\n", err: "", want: old},
		{name: "nothing written", err: "is not valid", want: old},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			staged, output := filepath.Join(dir, "stage", "staged.yaml"), filepath.Join(dir, "cdi", "nvidia.yaml")
			for _, d := range []string{filepath.Dir(staged), filepath.Dir(output)} {
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.WriteFile(output, []byte(old), 0o644); err != nil {
				t.Fatal(err)
			}
			// The step: write the staged spec (the shell's printf, not a
			// library call: what nvidia-ctk would leave).
			step := []string{"/bin/true"}
			if tc.staged != "" {
				script := filepath.Join(dir, "step.sh")
				if err := os.WriteFile(staged+".src", []byte(tc.staged), 0o644); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(script, []byte("#!/bin/sh\ncp '"+staged+".src' '"+staged+"'\n"), 0o755); err != nil {
					t.Fatal(err)
				}
				step = []string{script}
			}
			r, err := NewRegenerator(RegenerateOptions{Steps: [][]string{step}, Staged: staged, Output: output})
			if err != nil {
				t.Fatal(err)
			}
			_, ctx := ktesting.NewTestContext(t)
			err = r.runOnce(ctx, klog.FromContext(ctx), "test")
			wantErr := tc.want == old
			if wantErr != (err != nil) || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("run: %v, want an error %v (%q)", err, wantErr, tc.err)
			}
			got, rerr := os.ReadFile(output)
			if rerr != nil || string(got) != tc.want {
				t.Errorf("installed spec after the run (%v):\n%s\nwant:\n%s", rerr, got, tc.want)
			}
			// No temporary file is left beside the spec.
			if entries, _ := os.ReadDir(filepath.Dir(output)); len(entries) != 1 {
				var names []string
				for _, e := range entries {
					names = append(names, e.Name())
				}
				t.Errorf("spec dir holds %q, want only nvidia.yaml", names)
			}
		})
	}
	// Staged and output come together, absolute, the output a spec file.
	for _, o := range []RegenerateOptions{
		{Staged: "/run/gpufrac-cdi/staged.yaml"},
		{Output: "/var/run/cdi/nvidia.yaml"},
		{Staged: "staged.yaml", Output: "/var/run/cdi/nvidia.yaml"},
		{Staged: "/run/gpufrac-cdi/staged.yaml", Output: "/var/run/cdi/nvidia.txt"},
	} {
		o.Steps = [][]string{{"/bin/true"}}
		if _, err := NewRegenerator(o); err == nil {
			t.Errorf("NewRegenerator(staged %q, output %q) = nil, want an error", o.Staged, o.Output)
		}
	}
}
