package config

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/gpufrac/gpufrac/api"
)

// ErrInvalid is matched (errors.Is) by every [*ValidationError].
var ErrInvalid = errors.New("invalid config")

// Problem is one thing wrong with a config file, at a path such as
// "groups[1].mode". Path is empty for problems with the document as a whole.
type Problem struct {
	Path    string
	Message string
}

// String returns "path: message", or the message alone when Path is empty.
func (p Problem) String() string {
	if p.Path == "" {
		return p.Message
	}
	return p.Path + ": " + p.Message
}

// ValidationError lists every problem found in a config file, in a stable
// order: fields in the order of the types, map keys sorted.
type ValidationError struct {
	Problems []Problem
}

// Error joins the problems with "; ".
func (e *ValidationError) Error() string {
	parts := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		parts[i] = p.String()
	}
	return strings.Join(parts, "; ")
}

// Is reports whether target is [ErrInvalid].
func (e *ValidationError) Is(target error) bool {
	return target == ErrInvalid
}

// problemsError returns nil for no problems, else a *ValidationError.
func problemsError(problems []Problem) error {
	if len(problems) == 0 {
		return nil
	}
	return &ValidationError{Problems: problems}
}

func problem(p *field.Path, format string, args ...any) Problem {
	path := ""
	if p != nil {
		path = p.String()
	}
	return Problem{Path: path, Message: fmt.Sprintf(format, args...)}
}

// Validate checks every field of f and returns a [*ValidationError] listing
// all problems, or nil. Zero values mean "unset" and are always valid, so
// Validate accepts a file before and after [File.SetDefaults]. It does not
// check MIG profiles against a GPU model, only their syntax.
func (f *File) Validate() error {
	var problems []Problem
	switch f.Version {
	case Version:
	case "":
		problems = append(problems, problem(field.NewPath("version"), "required (want %q)", Version))
	default:
		problems = append(problems, problem(field.NewPath("version"), "unsupported version %q (want %q)", f.Version, Version))
	}
	problems = append(problems, validatePolicy(&f.Default, field.NewPath("default"))...)
	groupsPath := field.NewPath("groups")
	for i := range f.Groups {
		g := &f.Groups[i]
		gp := groupsPath.Index(i)
		problems = append(problems, validateSelector(g.NodeSelector, gp.Child("nodeSelector"))...)
		// First match wins, so a group whose selector includes an earlier
		// group's selector can never be chosen.
		for j := range i {
			if len(f.Groups[j].NodeSelector) > 0 && len(g.NodeSelector) > 0 && selects(f.Groups[j].NodeSelector, g.NodeSelector) {
				problems = append(problems, problem(gp.Child("nodeSelector"),
					"never matches: every node it selects also matches %s, which comes first", groupsPath.Index(j)))
				break
			}
		}
		problems = append(problems, validatePolicy(&g.Policy, gp)...)
	}
	return problemsError(problems)
}

// selects reports whether labels carry every pair of selector.
func selects(selector, labels map[string]string) bool {
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

func validateSelector(sel map[string]string, p *field.Path) []Problem {
	if len(sel) == 0 {
		return []Problem{problem(p, "must not be empty (a group needs at least one label to match)")}
	}
	var problems []Problem
	for _, k := range slices.Sorted(maps.Keys(sel)) {
		if msgs := validation.IsQualifiedName(k); len(msgs) > 0 {
			problems = append(problems, problem(p.Key(k), "invalid label key: %s", strings.Join(msgs, "; ")))
		}
		if msgs := validation.IsValidLabelValue(sel[k]); len(msgs) > 0 {
			problems = append(problems, problem(p.Key(k), "invalid label value %q: %s", sel[k], strings.Join(msgs, "; ")))
		}
	}
	return problems
}

const (
	wantModes       = "want exclusive, fraction, timeslice or mig"
	wantPolicyModes = "want exclusive, fraction, timeslice, mig or dra"
	wantDRAGPUModes = "want exclusive, fraction or mig"
)

// validDRAGPUMode tells whether a GPU of a node in mode dra can be published as m.
func validDRAGPUMode(m Mode) bool {
	return m == ModeExclusive || m == ModeFraction || m == ModeMIG
}

func validMode(m Mode) bool {
	switch m {
	case ModeExclusive, ModeFraction, ModeTimeslice, ModeMIG:
		return true
	}
	return false
}

func validatePolicy(pol *Policy, p *field.Path) []Problem {
	var problems []Problem
	add := func(pr Problem) { problems = append(problems, pr) }

	if pol.Mode != "" && pol.Mode != ModeDRA && !validMode(pol.Mode) {
		add(problem(p.Child("mode"), "unsupported mode %q (%s)", pol.Mode, wantPolicyModes))
	}
	if m := pol.DRA.GPUMode; m != "" && !validDRAGPUMode(m) {
		add(problem(p.Child("dra", "gpuMode"), "unsupported mode %q (%s)", m, wantDRAGPUModes))
	}

	fp := p.Child("fraction")
	fr := &pol.Fraction
	switch fr.Enforcement {
	case "", EnforcementKill, EnforcementEvict, EnforcementReport:
	default:
		add(problem(fp.Child("enforcement"), "unsupported enforcement %q (want kill, evict or report)", fr.Enforcement))
	}
	if d := fr.PollInterval.Duration; d != 0 && (d < MinPollInterval || d > MaxPollInterval) {
		add(problem(fp.Child("pollInterval"), "must be between 100ms and 1m, got %s", d))
	}
	if fr.TolerancePercent < 0 || fr.TolerancePercent > 100 {
		add(problem(fp.Child("tolerancePercent"), "must be between 0 and 100, got %d", fr.TolerancePercent))
	}
	if fr.Samples < 0 {
		add(problem(fp.Child("samples"), "must be at least 1, got %d", fr.Samples))
	}

	tp := p.Child("timeslice")
	ts := &pol.Timeslice
	switch {
	case ts.Replicas == 0:
	case ts.Replicas < MinReplicas:
		add(problem(tp.Child("replicas"), "must be at least %d, got %d", MinReplicas, ts.Replicas))
	case ts.Replicas > MaxReplicas:
		add(problem(tp.Child("replicas"), "must be at most %d, got %d", MaxReplicas, ts.Replicas))
	}
	if ts.ResourceName != "" {
		if msg := checkResourceName(ts.ResourceName); msg != "" {
			add(problem(tp.Child("resourceName"), "%s", msg))
		}
	}

	mp := p.Child("mig")
	switch pol.MIG.Strategy {
	case "", MIGStrategyNone, MIGStrategySingle, MIGStrategyMixed:
	default:
		add(problem(mp.Child("strategy"), "unsupported strategy %q (want none, single or mixed)", pol.MIG.Strategy))
	}
	if pol.MIG.Layout != "" {
		if msg := checkMIGLayout(pol.MIG.Layout); msg != "" {
			add(problem(mp.Child("layout"), "%s", msg))
		}
	}
	switch pol.MIG.Owner {
	case "", MIGOwnerGpufrac, MIGOwnerExternal:
	default:
		add(problem(mp.Child("owner"), "unsupported owner %q (want gpufrac or external)", pol.MIG.Owner))
	}

	problems = append(problems, validateGPUs(pol.GPUs, p.Child("gpus"))...)
	return problems
}

// checkResourceName returns why name cannot be the time-sliced resource, or "".
func checkResourceName(name string) string {
	if !strings.Contains(name, "/") || len(validation.IsQualifiedName(name)) > 0 {
		return fmt.Sprintf("%q is not a domain-prefixed resource name such as %s", name, DefaultTimesliceResource)
	}
	switch {
	case name == api.ResourceGPU:
		return fmt.Sprintf("must not be %s, which whole GPUs use", api.ResourceGPU)
	case name == api.ResourceFraction:
		return fmt.Sprintf("must not be %s, which fractions use", api.ResourceFraction)
	case strings.HasPrefix(name, api.MIGResourcePrefix):
		return fmt.Sprintf("must not start with %s, which MIG devices use", api.MIGResourcePrefix)
	case strings.HasPrefix(name, "kubernetes.io/") || strings.HasSuffix(strings.SplitN(name, "/", 2)[0], ".kubernetes.io"):
		return fmt.Sprintf("%q is in the kubernetes.io domain, which extended resources may not use", name)
	}
	return ""
}

// migProfile matches a MIG GPU instance profile ("1g.10gb", "1g.10gb+me",
// "4g.71gb", "1g.24gb+gfx"), optionally with a compute-instance prefix
// ("1c.3g.40gb"). Whether a GPU model offers it is checked elsewhere.
var migProfile = regexp.MustCompile(`^([1-9][0-9]*c\.)?[1-9][0-9]*g\.[1-9][0-9]*gb([+-][a-z]+(\.[a-z]+)?)*$`)

// checkMIGLayout returns why layout is not a MIG layout, or "". A layout is
// "all-balanced", "all-<profile>" or a comma-separated list of profiles.
func checkMIGLayout(layout string) string {
	if rest, ok := strings.CutPrefix(layout, "all-"); ok {
		if rest == "balanced" || migProfile.MatchString(rest) {
			return ""
		}
		return fmt.Sprintf("%q is not a MIG layout (want all-balanced, all-<profile> or a comma-separated list of profiles such as 3g.40gb,2g.20gb)", layout)
	}
	for item := range strings.SplitSeq(layout, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			return fmt.Sprintf("%q has an empty profile", layout)
		}
		if !migProfile.MatchString(item) {
			return fmt.Sprintf("%q is not a MIG profile (want a name such as 1g.10gb)", item)
		}
	}
	return ""
}

func validateGPUs(gpus []GPUOverride, p *field.Path) []Problem {
	var problems []Problem
	owner := map[int]int{} // GPU index -> gpus entry that sets it
	for i := range gpus {
		o := &gpus[i]
		ip := p.Index(i)
		ranges, err := parseIndices(o.Indices)
		if err != nil {
			problems = append(problems, problem(ip.Child("indices"), "%s", err))
		} else {
			var twice []int
			clash := map[int][]int{} // earlier entry -> indices it already sets
			for _, r := range ranges {
				for idx := r.lo; idx <= r.hi; idx++ {
					prev, ok := owner[idx]
					switch {
					case !ok:
						owner[idx] = i
					case prev == i:
						twice = append(twice, idx)
					default:
						clash[prev] = append(clash[prev], idx)
					}
				}
			}
			if len(twice) > 0 {
				problems = append(problems, problem(ip.Child("indices"), "%s listed more than once", describeGPUs(twice)))
			}
			for _, prev := range slices.Sorted(maps.Keys(clash)) {
				problems = append(problems, problem(ip.Child("indices"), "%s already set by %s", withVerb(clash[prev], "is", "are"), p.Index(prev)))
			}
		}
		switch {
		case o.Mode == "":
			problems = append(problems, problem(ip.Child("mode"), "required (%s)", wantModes))
		case o.Mode == ModeDRA:
			problems = append(problems, problem(ip.Child("mode"), "dra is how a whole node is served: set it as the policy's mode, and the GPU's mode here (%s)", wantDRAGPUModes))
		case !validMode(o.Mode):
			problems = append(problems, problem(ip.Child("mode"), "unsupported mode %q (%s)", o.Mode, wantModes))
		}
		if o.MIGLayout != "" {
			if o.Mode != ModeMIG && validMode(o.Mode) {
				problems = append(problems, problem(ip.Child("migLayout"), "only valid with mode mig, got mode %s", o.Mode))
			}
			if msg := checkMIGLayout(o.MIGLayout); msg != "" {
				problems = append(problems, problem(ip.Child("migLayout"), "%s", msg))
			}
		}
	}
	return problems
}

// indexRange is an inclusive range of GPU indices.
type indexRange struct{ lo, hi int }

// parseIndices reads "0-3", "4,6", "7" or a mix ("0-1, 4, 6-7"). The error
// message is meant to follow a field path.
func parseIndices(s string) ([]indexRange, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New(`required (e.g. "0-3" or "4,6")`)
	}
	var ranges []indexRange
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			return nil, fmt.Errorf("%q has an empty item", s)
		}
		loText, hiText, isRange := strings.Cut(item, "-")
		lo, loErr := parseIndex(loText)
		hi := lo
		var hiErr error
		if isRange {
			hi, hiErr = parseIndex(hiText)
		}
		if loErr != nil || hiErr != nil {
			return nil, fmt.Errorf("%q is not a GPU index or range", item)
		}
		if lo > MaxGPUIndex || hi > MaxGPUIndex {
			return nil, fmt.Errorf("%q goes above the highest GPU index, %d", item, MaxGPUIndex)
		}
		if hi < lo {
			return nil, fmt.Errorf("%q is not a range", item)
		}
		ranges = append(ranges, indexRange{lo: lo, hi: hi})
	}
	return ranges, nil
}

// parseIndex reads a plain decimal index: no sign, no spaces, no "0x".
func parseIndex(s string) (int, error) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, fmt.Errorf("%q is not a GPU index", s)
	}
	if len(s) > 4 {
		// Far above MaxGPUIndex; keeps Atoi away from overflow.
		return MaxGPUIndex + 1, nil
	}
	return strconv.Atoi(s)
}

// describeGPUs writes sorted indices compactly: "GPU 2", "GPUs 2-3,5".
func describeGPUs(idxs []int) string {
	sorted := slices.Clone(idxs)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	var parts []string
	for i := 0; i < len(sorted); {
		j := i
		for j+1 < len(sorted) && sorted[j+1] == sorted[j]+1 {
			j++
		}
		if i == j {
			parts = append(parts, strconv.Itoa(sorted[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", sorted[i], sorted[j]))
		}
		i = j + 1
	}
	if len(sorted) == 1 {
		return "GPU " + parts[0]
	}
	return "GPUs " + strings.Join(parts, ",")
}
