package config

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const resolveFile = `
version: v1
default:
  mode: fraction
  fraction: {enforcement: kill, pollInterval: 2s, tolerancePercent: 5}
  timeslice: {replicas: 4}
  mig: {layout: all-1g.10gb}
  gpus: [{indices: "0-1", mode: mig}, {indices: "3", mode: exclusive}]
groups:
  - nodeSelector: {gpufrac.io/pool: inference}
    mode: mig
  - nodeSelector: {gpufrac.io/pool: batch, zone: a}
    mode: timeslice
    timeslice: {replicas: 8, failRequestsGreaterThanOne: true}
    fraction: {samples: 5}
  - nodeSelector: {gpufrac.io/pool: batch}
    gpus: [{indices: "0,2", mode: mig, migLayout: "3g.40gb,3g.40gb"}, {indices: "1", mode: exclusive}]
  - nodeSelector: {gpufrac.io/pool: big}
    gpus: [{indices: "6-9", mode: exclusive}]
`

func TestResolve(t *testing.T) {
	f, err := Parse([]byte(resolveFile))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	base := Policy{
		Mode:      ModeFraction,
		Fraction:  FractionConfig{Enforcement: EnforcementKill, PollInterval: Duration{2 * time.Second}, TolerancePercent: 5, Samples: 3},
		Timeslice: TimesliceConfig{Replicas: 4, ResourceName: "nvidia.com/gpu.shared"},
		MIG:       MIGConfig{Strategy: "mixed", Layout: "all-1g.10gb", Owner: "gpufrac"},
		GPUs:      []GPUOverride{{Indices: "0-1", Mode: ModeMIG}, {Indices: "3", Mode: ModeExclusive}},
	}
	with := func(change func(p *Policy)) Policy {
		p := base
		p.GPUs = append([]GPUOverride(nil), base.GPUs...)
		change(&p)
		return p
	}
	tests := []struct {
		name     string
		labels   map[string]string
		gpuCount int
		want     NodePolicy
	}{
		{
			name:     "no labels: default with per-GPU overrides",
			gpuCount: 4,
			want: NodePolicy{
				Policy:        base,
				GPUModes:      []Mode{ModeMIG, ModeMIG, ModeFraction, ModeExclusive},
				GPUMIGLayouts: []string{"all-1g.10gb", "all-1g.10gb", "", ""},
				Source:        "default",
			},
		},
		{
			name:     "unrelated labels: default",
			labels:   map[string]string{"gpufrac.io/pool": "training", "zone": "a"},
			gpuCount: 4,
			want: NodePolicy{
				Policy:        base,
				GPUModes:      []Mode{ModeMIG, ModeMIG, ModeFraction, ModeExclusive},
				GPUMIGLayouts: []string{"all-1g.10gb", "all-1g.10gb", "", ""},
				Source:        "default",
			},
		},
		{
			name:     "group sets the mode; the default's per-GPU list still applies",
			labels:   map[string]string{"gpufrac.io/pool": "inference", "other": "x"},
			gpuCount: 5,
			want: NodePolicy{
				Policy:        with(func(p *Policy) { p.Mode = ModeMIG }),
				GPUModes:      []Mode{ModeMIG, ModeMIG, ModeMIG, ModeExclusive, ModeMIG},
				GPUMIGLayouts: []string{"all-1g.10gb", "all-1g.10gb", "all-1g.10gb", "", "all-1g.10gb"},
				Source:        "groups[0]",
			},
		},
		{
			name:     "first match wins and inherits field by field",
			labels:   map[string]string{"gpufrac.io/pool": "batch", "zone": "a"},
			gpuCount: 4,
			want: NodePolicy{
				Policy: with(func(p *Policy) {
					p.Mode = ModeTimeslice
					p.Timeslice.Replicas = 8
					p.Timeslice.FailRequestsGreaterThanOne = true
					p.Fraction.Samples = 5
				}),
				GPUModes:      []Mode{ModeMIG, ModeMIG, ModeTimeslice, ModeExclusive},
				GPUMIGLayouts: []string{"all-1g.10gb", "all-1g.10gb", "", ""},
				Source:        "groups[1]",
			},
		},
		{
			name:     "a group's gpus list replaces the default's",
			labels:   map[string]string{"gpufrac.io/pool": "batch", "zone": "b"},
			gpuCount: 4,
			want: NodePolicy{
				Policy: with(func(p *Policy) {
					p.GPUs = []GPUOverride{{Indices: "0,2", Mode: ModeMIG, MIGLayout: "3g.40gb,3g.40gb"}, {Indices: "1", Mode: ModeExclusive}}
				}),
				GPUModes:      []Mode{ModeMIG, ModeExclusive, ModeMIG, ModeFraction},
				GPUMIGLayouts: []string{"3g.40gb,3g.40gb", "", "3g.40gb,3g.40gb", ""},
				Source:        "groups[2]",
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := f.Resolve(tc.labels, tc.gpuCount)
			if err != nil {
				t.Fatalf("Resolve: %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Resolve (-want +got):\n%s", diff)
			}
		})
	}
}

func TestResolveDoesNotShareMemoryWithTheFile(t *testing.T) {
	f, err := Parse([]byte(resolveFile))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	got, err := f.Resolve(nil, 4)
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	got.Policy.GPUs[0].Mode = ModeTimeslice
	if f.Default.GPUs[0].Mode != ModeMIG {
		t.Errorf("changing the resolved policy changed the file: default.gpus[0].mode = %q", f.Default.GPUs[0].Mode)
	}
}

func TestResolveFillsDefaultsOfAnUnparsedFile(t *testing.T) {
	f := &File{Version: Version, Groups: []Group{{NodeSelector: map[string]string{"a": "b"}, Policy: Policy{Mode: ModeExclusive}}}}
	got, err := f.Resolve(map[string]string{"a": "b"}, 2)
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	want := defaultPolicy()
	want.Mode = ModeExclusive
	if diff := cmp.Diff(NodePolicy{Policy: want, GPUModes: []Mode{ModeExclusive, ModeExclusive}, GPUMIGLayouts: []string{"", ""}, Source: "groups[0]"}, got); diff != "" {
		t.Errorf("Resolve (-want +got):\n%s", diff)
	}
	if f.Default.Mode != "" {
		t.Errorf("Resolve changed the file's default policy: mode = %q", f.Default.Mode)
	}
}

func TestResolveProblems(t *testing.T) {
	tests := []struct {
		name     string
		yaml     string
		labels   map[string]string
		gpuCount int
		want     []string
	}{
		{
			name:     "group range beyond the node's GPUs",
			yaml:     resolveFile,
			labels:   map[string]string{"gpufrac.io/pool": "big"},
			gpuCount: 8,
			want:     []string{`groups[3].gpus[0].indices: "6-9" names GPUs 8-9, but the node has 8 GPUs (0-7)`},
		},
		{
			name:     "every default range beyond a one-GPU node",
			yaml:     resolveFile,
			gpuCount: 1,
			want: []string{
				`default.gpus[0].indices: "0-1" names GPU 1, but the node has 1 GPU (0)`,
				`default.gpus[1].indices: "3" names GPU 3, but the node has 1 GPU (0)`,
			},
		},
		{
			name:     "no GPUs",
			yaml:     "version: v1\ndefault: {gpus: [{indices: '0', mode: mig}]}",
			gpuCount: 0,
			want:     []string{`default.gpus[0].indices: "0" names GPU 0, but the node has no GPUs`},
		},
		{
			name: "strategy none cannot serve MIG GPUs",
			yaml: `
version: v1
default: {mig: {strategy: none}, gpus: [{indices: "1-2", mode: mig}]}`,
			gpuCount: 4,
			want:     []string{`default.mig.strategy: none serves no MIG devices, but GPUs 1-2 are in mode mig`},
		},
		{
			name: "strategy single set by a group needs all GPUs in mig with one layout",
			yaml: `
version: v1
default: {mig: {layout: all-1g.10gb}, gpus: [{indices: "1", mode: mig, migLayout: all-7g.80gb}, {indices: "2", mode: mig}]}
groups:
  - {nodeSelector: {a: b}, mig: {strategy: single}}`,
			labels:   map[string]string{"a": "b"},
			gpuCount: 4,
			want: []string{
				`groups[0].mig.strategy: single needs every GPU in mode mig, but GPUs 0,3 are not`,
				`groups[0].mig.strategy: single needs one MIG layout on every GPU, but GPU 2 uses "all-1g.10gb" and GPU 1 uses "all-7g.80gb"`,
			},
		},
		{
			name: "an external MIG owner sets the layouts, so none may be declared",
			yaml: `
version: v1
default: {mig: {layout: all-1g.10gb}, gpus: [{indices: "0", mode: mig}, {indices: "1", mode: mig, migLayout: all-7g.80gb}]}
groups:
  - {nodeSelector: {gpu-operator: mig}, mig: {owner: external}}`,
			labels:   map[string]string{"gpu-operator": "mig"},
			gpuCount: 4,
			want:     []string{`groups[0].mig.owner: external leaves MIG layouts to another MIG manager, but GPUs 0-1 have a declared layout (mig.layout or gpus[].migLayout): remove it`},
		},
		{
			name: "a node in mode dra serves no time-sliced GPUs",
			yaml: `
version: v1
default: {mode: fraction}
groups:
  - {nodeSelector: {a: b}, mode: dra, gpus: [{indices: "2-3", mode: timeslice}]}`,
			labels:   map[string]string{"a": "b"},
			gpuCount: 4,
			want:     []string{`groups[0].gpus: GPUs 2-3 are in mode timeslice, which the node's mode dra does not serve (want exclusive, fraction or mig)`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Parse([]byte(tc.yaml))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			_, err = f.Resolve(tc.labels, tc.gpuCount)
			var verr *ValidationError
			if !errors.As(err, &verr) {
				t.Fatalf("Resolve error = %v, want a *ValidationError", err)
			}
			var got []string
			for _, p := range verr.Problems {
				got = append(got, p.String())
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("problems (-want +got):\n%s", diff)
			}
		})
	}
}

func TestResolveRefusesInvalidInput(t *testing.T) {
	invalid := &File{Version: "v0"}
	if _, err := invalid.Resolve(nil, 1); !errors.Is(err, ErrInvalid) {
		t.Errorf("Resolve(invalid file) error = %v, want ErrInvalid", err)
	}
	valid := &File{Version: Version}
	if _, err := valid.Resolve(nil, -1); err == nil || !strings.Contains(err.Error(), "negative GPU count -1") {
		t.Errorf("Resolve(gpuCount -1) error = %v, want a negative count error", err)
	}
}

func TestResolveDRA(t *testing.T) {
	const file = `
version: v1
default:
  mode: fraction
  mig: {strategy: none, layout: all-1g.10gb}
groups:
  - nodeSelector: {gpufrac.io/serving: dra}
    mode: dra
    gpus: [{indices: "1", mode: exclusive}, {indices: "2-3", mode: mig, migLayout: all-3g.40gb}]
  - nodeSelector: {gpufrac.io/serving: dra-whole}
    mode: dra
    dra: {gpuMode: exclusive}
`
	f, err := Parse([]byte(file))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	tests := []struct {
		name       string
		labels     map[string]string
		wantDRA    bool
		wantModes  []Mode
		wantLayout []string
	}{
		{name: "device plugins by default", wantModes: []Mode{ModeFraction, ModeFraction, ModeFraction, ModeFraction}, wantLayout: []string{"", "", "", ""}},
		{name: "dra: fraction views unless overridden; mig strategy none does not matter",
			labels: map[string]string{"gpufrac.io/serving": "dra"}, wantDRA: true,
			wantModes:  []Mode{ModeFraction, ModeExclusive, ModeMIG, ModeMIG},
			wantLayout: []string{"", "", "all-3g.40gb", "all-3g.40gb"}},
		{name: "dra with gpuMode exclusive",
			labels: map[string]string{"gpufrac.io/serving": "dra-whole"}, wantDRA: true,
			wantModes:  []Mode{ModeExclusive, ModeExclusive, ModeExclusive, ModeExclusive},
			wantLayout: []string{"", "", "", ""}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			np, err := f.Resolve(tc.labels, 4)
			if err != nil {
				t.Fatalf("Resolve: %v", err)
			}
			if np.DRA != tc.wantDRA {
				t.Errorf("DRA = %v, want %v", np.DRA, tc.wantDRA)
			}
			if diff := cmp.Diff(tc.wantModes, np.GPUModes); diff != "" {
				t.Errorf("GPUModes (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantLayout, np.GPUMIGLayouts); diff != "" {
				t.Errorf("GPUMIGLayouts (-want +got):\n%s", diff)
			}
			if tc.wantDRA && np.Policy.DRA.GPUMode == "" {
				t.Error("Policy.DRA.GPUMode not filled in")
			}
		})
	}
}

func TestParseRefusesDRAMisuse(t *testing.T) {
	_, err := Parse([]byte(`
version: v1
default: {mode: dra, dra: {gpuMode: timeslice}, gpus: [{indices: "0", mode: dra}]}`))
	var verr *ValidationError
	if !errors.As(err, &verr) {
		t.Fatalf("Parse error = %v, want a *ValidationError", err)
	}
	var got []string
	for _, p := range verr.Problems {
		got = append(got, p.String())
	}
	want := []string{
		`default.dra.gpuMode: unsupported mode "timeslice" (want exclusive, fraction or mig)`,
		`default.gpus[0].mode: dra is how a whole node is served: set it as the policy's mode, and the GPU's mode here (want exclusive, fraction or mig)`,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("problems (-want +got):\n%s", diff)
	}
}
