package config

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// defaultPolicy is the default policy of a file that sets nothing, written
// out by hand so the test checks the documented defaults.
func defaultPolicy() Policy {
	return Policy{
		Mode:      ModeFraction,
		Fraction:  FractionConfig{Enforcement: EnforcementKill, PollInterval: Duration{time.Second}, TolerancePercent: 0, Samples: 3},
		Timeslice: TimesliceConfig{Replicas: 4, ResourceName: "nvidia.com/gpu.shared"},
		MIG:       MIGConfig{Strategy: "mixed", Owner: "gpufrac"},
	}
}

const fullExample = `
version: v1
default:
  mode: fraction
  fraction: {enforcement: kill, pollInterval: 1s, tolerancePercent: 5, samples: 3}
  timeslice: {replicas: 4, resourceName: nvidia.com/gpu.shared, failRequestsGreaterThanOne: false}
  mig: {strategy: mixed, layout: all-1g.10gb}
  gpus: [{indices: "0-3", mode: mig}, {indices: "4-7", mode: fraction}]
groups:
  - nodeSelector: {gpufrac.io/pool: inference}
    mode: mig
`

func TestParse(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want *File
	}{
		{
			name: "version only gets every default",
			yaml: "version: v1\n",
			want: &File{Version: "v1", Default: defaultPolicy()},
		},
		{
			name: "design example",
			yaml: fullExample,
			want: &File{
				Version: "v1",
				Default: Policy{
					Mode:      ModeFraction,
					Fraction:  FractionConfig{Enforcement: EnforcementKill, PollInterval: Duration{time.Second}, TolerancePercent: 5, Samples: 3},
					Timeslice: TimesliceConfig{Replicas: 4, ResourceName: "nvidia.com/gpu.shared"},
					MIG:       MIGConfig{Strategy: "mixed", Layout: "all-1g.10gb", Owner: "gpufrac"},
					GPUs:      []GPUOverride{{Indices: "0-3", Mode: ModeMIG}, {Indices: "4-7", Mode: ModeFraction}},
				},
				Groups: []Group{{NodeSelector: map[string]string{"gpufrac.io/pool": "inference"}, Policy: Policy{Mode: ModeMIG}}},
			},
		},
		{
			name: "groups are not defaulted",
			yaml: `
version: v1
default: {mode: exclusive}
groups:
  - nodeSelector: {a: b}
    timeslice: {replicas: 8}
    fraction: {pollInterval: 500ms}
`,
			want: &File{
				Version: "v1",
				Default: func() Policy { p := defaultPolicy(); p.Mode = ModeExclusive; return p }(),
				Groups: []Group{{
					NodeSelector: map[string]string{"a": "b"},
					Policy: Policy{
						Timeslice: TimesliceConfig{Replicas: 8},
						Fraction:  FractionConfig{PollInterval: Duration{500 * time.Millisecond}},
					},
				}},
			},
		},
		{
			name: "JSON is YAML too, and empty lists become nil",
			yaml: `{"version": "v1", "default": {"mode": "timeslice", "gpus": []}, "groups": []}`,
			want: &File{Version: "v1", Default: func() Policy { p := defaultPolicy(); p.Mode = ModeTimeslice; return p }()},
		},
		{
			name: "nulls leave fields unset",
			yaml: "version: v1\ndefault:\n  fraction: null\n  mig: ~\ngroups:\n",
			want: &File{Version: "v1", Default: defaultPolicy()},
		},
		{
			name: "bounds are inclusive, and per-GPU MIG layouts",
			yaml: `
version: v1
default:
  fraction: {enforcement: report, pollInterval: 1m, tolerancePercent: 100, samples: 1}
  timeslice: {replicas: 1024, resourceName: example.com/shared-gpu, failRequestsGreaterThanOne: true}
  mig: {strategy: single, layout: "3g.40gb, 2g.20gb,1g.10gb+me"}
  gpus:
    - {indices: "0-1, 4", mode: mig, migLayout: all-balanced}
    - {indices: "2", mode: exclusive}
    - {indices: "255", mode: timeslice}
`,
			want: &File{
				Version: "v1",
				Default: Policy{
					Mode:      ModeFraction,
					Fraction:  FractionConfig{Enforcement: EnforcementReport, PollInterval: Duration{time.Minute}, TolerancePercent: 100, Samples: 1},
					Timeslice: TimesliceConfig{Replicas: 1024, ResourceName: "example.com/shared-gpu", FailRequestsGreaterThanOne: true},
					MIG:       MIGConfig{Strategy: "single", Layout: "3g.40gb, 2g.20gb,1g.10gb+me", Owner: "gpufrac"},
					GPUs: []GPUOverride{
						{Indices: "0-1, 4", Mode: ModeMIG, MIGLayout: "all-balanced"},
						{Indices: "2", Mode: ModeExclusive},
						{Indices: "255", Mode: ModeTimeslice},
					},
				},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse([]byte(tc.yaml))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Parse (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseProblems(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want []string
	}{
		{
			name: "empty file",
			yaml: "",
			want: []string{`version: required (want "v1")`},
		},
		{
			name: "wrong version",
			yaml: "version: v2",
			want: []string{`version: unsupported version "v2" (want "v1")`},
		},
		{
			name: "document is a list",
			yaml: "- version: v1",
			want: []string{`must be a mapping, got a list`},
		},
		{
			name: "unknown fields everywhere, with a case hint",
			yaml: `
version: v1
extra: 1
default:
  Mode: mig
  fraction: {enforce: kill}
groups:
  - nodeSelector: {a: b}
    gpus: [{indices: "0", mode: mig, layout: x}]
`,
			want: []string{
				`default.Mode: unknown field (did you mean "mode"?)`,
				`default.fraction.enforce: unknown field`,
				`extra: unknown field`,
				`groups[0].gpus[0].layout: unknown field`,
			},
		},
		{
			name: "wrong types",
			yaml: `
version: 1
default:
  mode: [fraction]
  fraction: {pollInterval: 1, samples: three, tolerancePercent: 2.5}
  timeslice: {failRequestsGreaterThanOne: "yes", replicas: true}
  mig: fraction
  gpus: {indices: "0"}
groups:
  - nodeSelector: {nvidia.com/mig.capable: true, zone: 1}
`,
			want: []string{
				`default.fraction.pollInterval: must be a duration such as "1s", got number 1`,
				`default.fraction.samples: must be an integer, got string "three"`,
				`default.fraction.tolerancePercent: must be an integer, got 2.5`,
				`default.gpus: must be a list, got a mapping`,
				`default.mig: must be a mapping, got string "fraction"`,
				`default.mode: must be a string, got a list`,
				`default.timeslice.failRequestsGreaterThanOne: must be true or false, got string "yes"`,
				`default.timeslice.replicas: must be an integer, got boolean true`,
				`groups[0].nodeSelector[nvidia.com/mig.capable]: must be a string, got boolean true (put it in quotes)`,
				`groups[0].nodeSelector[zone]: must be a string, got number 1 (put it in quotes)`,
				`version: must be a string, got number 1 (put it in quotes)`,
			},
		},
		{
			name: "bad duration string",
			yaml: "version: v1\ndefault: {fraction: {pollInterval: 1 second}}",
			want: []string{`default.fraction.pollInterval: "1 second" is not a duration (want a value such as "500ms" or "1s")`},
		},
		{
			name: "bad mode in a group",
			yaml: `
version: v1
groups:
  - {nodeSelector: {pool: a}, mode: mig}
  - {nodeSelector: {pool: b}, mode: frac}
`,
			want: []string{`groups[1].mode: unsupported mode "frac" (want exclusive, fraction, timeslice, mig or dra)`},
		},
		{
			name: "every bad value in the default policy",
			yaml: `
version: v1
default:
  mode: shared
  fraction: {enforcement: shoot, pollInterval: 50ms, tolerancePercent: 150, samples: -1}
  timeslice: {replicas: 1, resourceName: gpu}
  mig: {strategy: double, layout: all-big, owner: operator}
`,
			want: []string{
				`default.mode: unsupported mode "shared" (want exclusive, fraction, timeslice, mig or dra)`,
				`default.fraction.enforcement: unsupported enforcement "shoot" (want kill, evict or report)`,
				`default.fraction.pollInterval: must be between 100ms and 1m, got 50ms`,
				`default.fraction.tolerancePercent: must be between 0 and 100, got 150`,
				`default.fraction.samples: must be at least 1, got -1`,
				`default.timeslice.replicas: must be at least 2, got 1`,
				`default.timeslice.resourceName: "gpu" is not a domain-prefixed resource name such as nvidia.com/gpu.shared`,
				`default.mig.strategy: unsupported strategy "double" (want none, single or mixed)`,
				`default.mig.layout: "all-big" is not a MIG layout (want all-balanced, all-<profile> or a comma-separated list of profiles such as 3g.40gb,2g.20gb)`,
				`default.mig.owner: unsupported owner "operator" (want gpufrac or external)`,
			},
		},
		{
			name: "out of range numbers",
			yaml: `
version: v1
default:
  fraction: {pollInterval: 2m, tolerancePercent: -1}
  timeslice: {replicas: 5000}
groups:
  - nodeSelector: {a: b}
    fraction: {pollInterval: -1s}
    timeslice: {replicas: -3}
`,
			want: []string{
				`default.fraction.pollInterval: must be between 100ms and 1m, got 2m0s`,
				`default.fraction.tolerancePercent: must be between 0 and 100, got -1`,
				`default.timeslice.replicas: must be at most 1024, got 5000`,
				`groups[0].fraction.pollInterval: must be between 100ms and 1m, got -1s`,
				`groups[0].timeslice.replicas: must be at least 2, got -3`,
			},
		},
		{
			name: "resource names that collide",
			yaml: `
version: v1
default: {timeslice: {resourceName: nvidia.com/gpu}}
groups:
  - {nodeSelector: {a: "1"}, timeslice: {resourceName: gpufrac.io/gpu-fraction}}
  - {nodeSelector: {a: "2"}, timeslice: {resourceName: nvidia.com/mig-1g.10gb}}
  - {nodeSelector: {a: "3"}, timeslice: {resourceName: kubernetes.io/gpu}}
  - {nodeSelector: {a: "4"}, timeslice: {resourceName: "bad name/x"}}
`,
			want: []string{
				`default.timeslice.resourceName: must not be nvidia.com/gpu, which whole GPUs use`,
				`groups[0].timeslice.resourceName: must not be gpufrac.io/gpu-fraction, which fractions use`,
				`groups[1].timeslice.resourceName: must not start with nvidia.com/mig-, which MIG devices use`,
				`groups[2].timeslice.resourceName: "kubernetes.io/gpu" is in the kubernetes.io domain, which extended resources may not use`,
				`groups[3].timeslice.resourceName: "bad name/x" is not a domain-prefixed resource name such as nvidia.com/gpu.shared`,
			},
		},
		{
			name: "MIG layouts",
			yaml: `
version: v1
default: {mig: {layout: "1g.10gb,,2g.20gb"}}
groups:
  - {nodeSelector: {a: "1"}, mig: {layout: "1g.10"}}
  - {nodeSelector: {a: "2"}, mig: {layout: "0g.10gb"}}
  - {nodeSelector: {a: "3"}, mig: {layout: "all-1c.3g.40gb"}}
`,
			want: []string{
				`default.mig.layout: "1g.10gb,,2g.20gb" has an empty profile`,
				`groups[0].mig.layout: "1g.10" is not a MIG profile (want a name such as 1g.10gb)`,
				`groups[1].mig.layout: "0g.10gb" is not a MIG profile (want a name such as 1g.10gb)`,
			},
		},
		{
			name: "GPU index syntax",
			yaml: `
version: v1
default:
  gpus:
    - {indices: "3-1", mode: mig}
    - {indices: "", mode: mig}
    - {indices: "1,,2", mode: mig}
    - {indices: "a", mode: mig}
    - {indices: "-1", mode: mig}
    - {indices: "1-2-3", mode: mig}
    - {indices: "0-300", mode: mig}
    - {indices: "99999999999999999999", mode: mig}
    - {indices: "+1", mode: mig}
`,
			want: []string{
				`default.gpus[0].indices: "3-1" is not a range`,
				`default.gpus[1].indices: required (e.g. "0-3" or "4,6")`,
				`default.gpus[2].indices: "1,,2" has an empty item`,
				`default.gpus[3].indices: "a" is not a GPU index or range`,
				`default.gpus[4].indices: "-1" is not a GPU index or range`,
				`default.gpus[5].indices: "1-2-3" is not a GPU index or range`,
				`default.gpus[6].indices: "0-300" goes above the highest GPU index, 255`,
				`default.gpus[7].indices: "99999999999999999999" goes above the highest GPU index, 255`,
				`default.gpus[8].indices: "+1" is not a GPU index or range`,
			},
		},
		{
			name: "overlapping GPU ranges",
			yaml: `
version: v1
default:
  gpus:
    - {indices: "0-3", mode: mig}
    - {indices: "2-5", mode: fraction}
    - {indices: "5,3,7,7", mode: exclusive}
`,
			want: []string{
				`default.gpus[1].indices: GPUs 2-3 are already set by default.gpus[0]`,
				`default.gpus[2].indices: GPU 7 listed more than once`,
				`default.gpus[2].indices: GPU 3 is already set by default.gpus[0]`,
				`default.gpus[2].indices: GPU 5 is already set by default.gpus[1]`,
			},
		},
		{
			name: "per-GPU override fields",
			yaml: `
version: v1
groups:
  - nodeSelector: {a: b}
    gpus:
      - {indices: "0"}
      - {indices: "1", mode: whole}
      - {indices: "2", mode: fraction, migLayout: all-1g.10gb}
      - {indices: "3", mode: mig, migLayout: "7g"}
`,
			want: []string{
				`groups[0].gpus[0].mode: required (want exclusive, fraction, timeslice or mig)`,
				`groups[0].gpus[1].mode: unsupported mode "whole" (want exclusive, fraction, timeslice or mig)`,
				`groups[0].gpus[2].migLayout: only valid with mode mig, got mode fraction`,
				`groups[0].gpus[3].migLayout: "7g" is not a MIG profile (want a name such as 1g.10gb)`,
			},
		},
		{
			name: "node selectors",
			yaml: `
version: v1
groups:
  - {mode: mig}
  - {nodeSelector: {}, mode: mig}
  - {nodeSelector: {"bad key!": "x", ok: "not ok!"}}
  - {nodeSelector: {pool: a}, mode: mig}
  - {nodeSelector: {pool: a, zone: z}, mode: exclusive}
  - {nodeSelector: {pool: b}}
`,
			want: []string{
				`groups[0].nodeSelector: must not be empty (a group needs at least one label to match)`,
				`groups[1].nodeSelector: must not be empty (a group needs at least one label to match)`,
				`groups[2].nodeSelector[bad key!]: invalid label key: name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')`,
				`groups[2].nodeSelector[ok]: invalid label value "not ok!": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')`,
				`groups[4].nodeSelector: never matches: every node it selects also matches groups[3], which comes first`,
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Parse([]byte(tc.yaml))
			if err == nil {
				t.Fatalf("Parse succeeded with %+v, want problems", f)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("errors.Is(%v, ErrInvalid) = false, want true", err)
			}
			var verr *ValidationError
			if !errors.As(err, &verr) {
				t.Fatalf("Parse error %v is not a *ValidationError", err)
			}
			var got []string
			for _, p := range verr.Problems {
				got = append(got, p.String())
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("problems (-want +got):\n%s", diff)
			}
			// The error text carries every problem.
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestParseYAMLErrors(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		wantErr string
	}{
		{name: "duplicate key", yaml: "version: v1\nversion: v1\n", wantErr: "parsing config YAML: yaml: unmarshal errors:\n  line 2: key \"version\" already set in map"},
		{name: "bad syntax", yaml: "version: [v1\n", wantErr: `parsing config YAML: yaml: line 1: did not find expected ',' or ']'`},
		{name: "tab indentation", yaml: "version: v1\ndefault:\n\tmode: mig\n", wantErr: `parsing config YAML:`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml))
			if err == nil {
				t.Fatal("Parse succeeded, want an error")
			}
			if !strings.HasPrefix(err.Error(), tc.wantErr) {
				t.Errorf("Parse error = %q, want prefix %q", err, tc.wantErr)
			}
			if errors.Is(err, ErrInvalid) {
				t.Errorf("a YAML error matches ErrInvalid: %v", err)
			}
		})
	}
}

func TestValidateAcceptsDefaultedAndBareFiles(t *testing.T) {
	bare := &File{Version: Version}
	if err := bare.Validate(); err != nil {
		t.Fatalf("Validate(bare) = %v", err)
	}
	bare.SetDefaults()
	if diff := cmp.Diff(&File{Version: Version, Default: defaultPolicy()}, bare); diff != "" {
		t.Errorf("SetDefaults (-want +got):\n%s", diff)
	}
	if err := bare.Validate(); err != nil {
		t.Errorf("Validate(defaulted) = %v", err)
	}
	again := *bare
	again.SetDefaults()
	if diff := cmp.Diff(bare, &again); diff != "" {
		t.Errorf("SetDefaults is not idempotent (-want +got):\n%s", diff)
	}
}

func TestDuration(t *testing.T) {
	tests := []struct {
		name    string
		json    string
		want    time.Duration
		wantErr string
		// marshal is what want marshals back to.
		marshal string
	}{
		{name: "seconds", json: `"1s"`, want: time.Second, marshal: `"1s"`},
		{name: "milliseconds", json: `"250ms"`, want: 250 * time.Millisecond, marshal: `"250ms"`},
		{name: "minute", json: `"1m"`, want: time.Minute, marshal: `"1m0s"`},
		{name: "null keeps zero", json: `null`, want: 0, marshal: `"0s"`},
		{name: "number", json: `1`, wantErr: `reading duration 1: want a string such as "1s"`},
		{name: "bad string", json: `"soon"`, wantErr: `reading duration: time: invalid duration "soon"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var d Duration
			err := d.UnmarshalJSON([]byte(tc.json))
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("UnmarshalJSON(%s) error = %v, want %q", tc.json, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("UnmarshalJSON(%s): %v", tc.json, err)
			}
			if d.Duration != tc.want {
				t.Errorf("UnmarshalJSON(%s) = %v, want %v", tc.json, d.Duration, tc.want)
			}
			out, err := d.MarshalJSON()
			if err != nil {
				t.Fatalf("MarshalJSON: %v", err)
			}
			if string(out) != tc.marshal {
				t.Errorf("MarshalJSON = %s, want %s", out, tc.marshal)
			}
		})
	}
}

func TestDescribeGPUs(t *testing.T) {
	tests := []struct {
		name string
		idxs []int
		want string
	}{
		{name: "one", idxs: []int{3}, want: "GPU 3"},
		{name: "run", idxs: []int{2, 3, 4}, want: "GPUs 2-4"},
		{name: "unsorted with gaps and repeats", idxs: []int{7, 0, 5, 1, 5, 9, 8}, want: "GPUs 0-1,5,7-9"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := describeGPUs(tc.idxs); got != tc.want {
				t.Errorf("describeGPUs(%v) = %q, want %q", tc.idxs, got, tc.want)
			}
		})
	}
}
