package attack

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/placeholder"
	"github.com/gpufrac/gpufrac/coordinator/reservation"
	"github.com/gpufrac/gpufrac/tests/cluster"
)

// policies reads the admission policies as shipped: the chart's, rendered
// with its defaults (and bin/helm) as the test bed installs it; policy name
// -> its spec.
func policies(t *testing.T) map[string]map[string]any {
	t.Helper()
	values, err := cluster.TestbedValues()
	if err != nil {
		t.Fatal(err)
	}
	rendered, err := cluster.RenderChart(t.Context(), cluster.ChartOptions{ValuesFiles: []string{values}})
	if errors.Is(err, cluster.ErrHelmMissing) && testing.Short() {
		t.Skipf("%v (make tools)", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	objs := rendered.OfKind("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
	if len(objs) == 0 {
		t.Fatal("the chart renders no admission policy")
	}
	out := map[string]map[string]any{}
	bound := map[string]bool{}
	for _, o := range objs {
		spec, _ := o.Object["spec"].(map[string]any)
		switch o.GetKind() {
		case "ValidatingAdmissionPolicy":
			out[o.GetName()] = spec
			if spec["failurePolicy"] != "Fail" {
				t.Errorf("policy %s fails open (failurePolicy %v)", o.GetName(), spec["failurePolicy"])
			}
		case "ValidatingAdmissionPolicyBinding":
			bound[spec["policyName"].(string)] = true
			if acts, _ := spec["validationActions"].([]any); !slices.Contains(acts, any("Deny")) {
				t.Errorf("binding %s does not deny (%v)", o.GetName(), acts)
			}
		}
	}
	for name := range out {
		if !bound[name] {
			t.Errorf("policy %s has no binding: it does nothing", name)
		}
	}
	return out
}

// variable is the expression of a policy's named variable.
func variable(spec map[string]any, name string) string {
	vars, _ := spec["variables"].([]any)
	for _, v := range vars {
		m := v.(map[string]any)
		if m["name"] == name {
			return m["expression"].(string)
		}
	}
	return ""
}

// TestPoliciesMatchTheCode keeps the policies in step with the names the
// components use: every protocol annotation is guarded for its owner, and
// the ServiceAccounts, scheduler name, reservation namespace and image are
// the components' own.
func TestPoliciesMatchTheCode(t *testing.T) {
	ps := policies(t)
	proto := ps["gpufrac-protocol-annotations"]
	if proto == nil {
		t.Fatal("no policy gpufrac-protocol-annotations")
	}
	owners := map[string]string{
		api.CoordinatorServiceAccount: variable(proto, "changedCoordinatorKeys"),
		api.NodeServiceAccount:        variable(proto, "changedNodeKeys"),
	}
	for _, a := range api.ProtocolAnnotations() {
		for owner, expr := range owners {
			if has := strings.Contains(expr, "'"+a.Key+"'"); has != (owner == a.Owner) {
				t.Errorf("annotation %s (owner %s) in %s's list: %v", a.Key, a.Owner, owner, has)
			}
		}
		if a.Owner == api.NodeServiceAccount && !strings.Contains(variable(ps["gpufrac-node-agent"], "mine"), "'"+a.Key+"'") {
			t.Errorf("gpufrac-node-agent does not let gpufrac-node write its annotation %s", a.Key)
		}
	}
	for sa, want := range map[string]string{
		"coordinator": "system:serviceaccount:" + api.ComponentNamespace + ":" + api.CoordinatorServiceAccount,
		"node":        "system:serviceaccount:" + api.ComponentNamespace + ":" + api.NodeServiceAccount,
	} {
		if got := variable(proto, sa); got != "'"+want+"'" {
			t.Errorf("protocol policy's %s identity %s, want %q", sa, got, want)
		}
	}
	text := ""
	for _, spec := range ps {
		text += strings.Join(strings.Fields(stringOf(spec)), " ")
	}
	for what, want := range map[string]string{
		"scheduler name":        "'" + api.SchedulerName + "'",
		"reservation namespace": "'" + api.ReservationNamespace + "'",
		"reservation image":     "'" + reservation.DefaultOptions().Image + "'",
		"placeholder image":     "'" + placeholder.DefaultOptions().Image + "'",
		"queue label":           "'" + api.LabelQueue + "'",
		"default-queue label":   "'" + api.LabelDefaultQueue + "'",
		"role label":            "'" + api.LabelRole + "'",
		"reservation prefix":    "'" + api.ReservationNamePrefix + "'",
		"placeholder prefix":    "'" + placeholder.NamePrefix + "'",
		"fraction resource":     "'" + api.ResourceFraction + "'",
		"the variable":          "'" + api.EnvVisibleDevices + "'",
		"whole-GPU resource":    "'" + api.ResourceGPU + "'",
		"time-slice resource":   "'" + api.DefaultTimesliceResource + "'",
		"MIG resource prefix":   "'" + api.MIGResourcePrefix + "'",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the policies never name the %s %s", what, want)
		}
	}
}

// stringOf flattens a decoded YAML value into its strings.
func stringOf(v any) string {
	switch x := v.(type) {
	case string:
		return x + " "
	case map[string]any:
		s := ""
		for _, e := range x {
			s += stringOf(e)
		}
		return s
	case []any:
		s := ""
		for _, e := range x {
			s += stringOf(e)
		}
		return s
	}
	return ""
}
