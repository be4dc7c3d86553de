package cluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"sigs.k8s.io/yaml"
)

const (
	// AnnotationAdmitted (value "true") is the harness's admission mark on a pod: the
	// pod bound to a kwok node passed device admission (the kubelet's Allocate step)
	// and kwok may now run it. kwok's pod-ready stage, as the cluster installs it,
	// waits for it. It is a harness key, not part of gpufrac's API, hence the .test
	// domain.
	AnnotationAdmitted = "kubeletsim.gpufrac.test/admitted"

	// podReadyStage is the name of kwok's stage that turns a Pending pod Running.
	podReadyStage = "pod-ready"
)

// gatedStages copies kwok's Stage files into dir, adding to the pod-ready stage's
// selector the condition that the pod carries AnnotationAdmitted=true. Every other
// stage is copied unchanged. It returns the paths of the copies and fails when no
// file holds the pod-ready stage: the gate must never silently go missing.
func gatedStages(files []string, dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating stage dir: %w", err)
	}
	var out []string
	gated := false
	for i, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("reading kwok stage: %w", err)
		}
		changed, ok, err := gateStage(data)
		if err != nil {
			return nil, fmt.Errorf("gating kwok stage %s: %w", f, err)
		}
		gated = gated || ok
		dst := filepath.Join(dir, strconv.Itoa(i)+"-"+filepath.Base(f))
		if err := os.WriteFile(dst, changed, 0o644); err != nil {
			return nil, fmt.Errorf("writing kwok stage: %w", err)
		}
		out = append(out, dst)
	}
	if !gated {
		return nil, fmt.Errorf("gating kwok stages: no stage named %s among %v", podReadyStage, files)
	}
	return out, nil
}

// gateStage adds the admission condition to a Stage document named pod-ready for
// pods and reports whether it did; any other document comes back unchanged.
func gateStage(data []byte) (out []byte, gated bool, err error) {
	var stage map[string]any
	if err := yaml.Unmarshal(data, &stage); err != nil {
		return nil, false, fmt.Errorf("decoding stage: %w", err)
	}
	meta, _ := stage["metadata"].(map[string]any)
	spec, _ := stage["spec"].(map[string]any)
	ref, _ := spec["resourceRef"].(map[string]any)
	if stage["kind"] != "Stage" || meta["name"] != podReadyStage || ref["kind"] != "Pod" {
		return data, false, nil
	}
	selector, _ := spec["selector"].(map[string]any)
	if selector == nil {
		return nil, false, errors.New("pod-ready stage has no selector")
	}
	exprs, _ := selector["matchExpressions"].([]any)
	selector["matchExpressions"] = append(exprs, map[string]any{
		"key":      `.metadata.annotations["` + AnnotationAdmitted + `"]`,
		"operator": "In",
		"values":   []any{"true"},
	})
	out, err = yaml.Marshal(stage)
	if err != nil {
		return nil, false, fmt.Errorf("encoding stage: %w", err)
	}
	return out, true, nil
}
