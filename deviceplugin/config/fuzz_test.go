package config

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"
)

// FuzzParse checks that Parse never panics, that what it refuses it refuses
// with an error, and that a config it accepts survives a marshal and re-parse
// unchanged.
func FuzzParse(f *testing.F) {
	seeds := []string{
		"",
		"version: v1",
		fullExample,
		resolveFile,
		badConfig,
		cfg(8),
		`{"version": "v1", "default": {"mode": "timeslice", "gpus": []}, "groups": []}`,
		"version: v1\ndefault: {fraction: {pollInterval: 250ms, samples: 2}, mig: {strategy: single, layout: 'all-balanced'}}",
		"version: v1\ndefault: {gpus: [{indices: '0-1, 4', mode: mig, migLayout: '3g.40gb,1g.10gb+me'}, {indices: '2', mode: exclusive}]}",
		"version: v1\ngroups: [{nodeSelector: {'a': 'true', b: ''}, timeslice: {failRequestsGreaterThanOne: true}}]",
		"version: v1\ndefault: {gpus: [{indices: '3-1', mode: mig}]}",
		"version: v1\nversion: v1",
		"- a\n- b",
		"version: v1\ndefault: &a {mode: mig}\ngroups: [{nodeSelector: {x: y}, <<: *a}]",
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		parsed, err := Parse(data)
		if err != nil {
			if parsed != nil {
				t.Fatalf("Parse returned a config and an error: %v", err)
			}
			var verr *ValidationError
			if errors.As(err, &verr) && len(verr.Problems) == 0 {
				t.Fatalf("Parse returned a ValidationError without problems: %v", err)
			}
			return
		}
		if err := parsed.Validate(); err != nil {
			t.Fatalf("a parsed config does not validate: %v", err)
		}
		out, err := yaml.Marshal(parsed)
		if err != nil {
			t.Fatalf("marshalling a parsed config: %v", err)
		}
		again, err := Parse(out)
		if err != nil {
			t.Fatalf("re-parsing a marshalled config: %v\ninput:\n%s\nmarshalled:\n%s", err, data, out)
		}
		if diff := cmp.Diff(parsed, again); diff != "" {
			t.Fatalf("config changed through marshal and re-parse (-first +second):\n%s\nmarshalled:\n%s", diff, out)
		}
		// Resolve must not panic either, whatever the node.
		_, _ = parsed.Resolve(map[string]string{"gpufrac.io/pool": "inference", "a": "true"}, 8)
	})
}
