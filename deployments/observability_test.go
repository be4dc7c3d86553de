package deployments_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"

	"github.com/gpufrac/gpufrac/coordinator/app"
	"github.com/gpufrac/gpufrac/coordinator/reservation"
	"github.com/gpufrac/gpufrac/coordinator/scheduler"
	"github.com/gpufrac/gpufrac/deviceplugin/cdi"
	"github.com/gpufrac/gpufrac/deviceplugin/config"
	"github.com/gpufrac/gpufrac/deviceplugin/enforcement"
	"github.com/gpufrac/gpufrac/deviceplugin/metrics"
	"github.com/gpufrac/gpufrac/deviceplugin/miglayout"
	"github.com/gpufrac/gpufrac/tests/cluster"
)

// recorder is a Registerer that records the names every collector
// describes (a vector without children describes its name but gathers
// nothing, so gathering would miss it), and which are histograms or
// summaries (their series carry _bucket, _sum and _count).
type recorder struct {
	reg        *prometheus.Registry
	names      map[string]bool
	histograms map[string]bool
}

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func newRecorder() *recorder {
	return &recorder{reg: prometheus.NewRegistry(), names: map[string]bool{}, histograms: map[string]bool{}}
}

func (r *recorder) Register(c prometheus.Collector) error {
	if err := r.reg.Register(c); err != nil {
		return err
	}
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		m := fqName.FindStringSubmatch(d.String())
		if m == nil {
			continue
		}
		r.names[m[1]] = true
		switch c.(type) {
		case prometheus.Histogram, *prometheus.HistogramVec, prometheus.Summary, *prometheus.SummaryVec:
			r.histograms[m[1]] = true
		}
	}
	return nil
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

func (r *recorder) Unregister(c prometheus.Collector) bool { return r.reg.Unregister(c) }

// gathered adds the names a registry gathers (for registries a component
// builds itself; their metrics here have no labels, so they all gather).
func (r *recorder) gathered(t *testing.T, g prometheus.Gatherer) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		r.names[mf.GetName()] = true
	}
}

// exported builds every metric the components register, from the
// constructors of the packages that own them, and returns their names.
func exported(t *testing.T) *recorder {
	t.Helper()
	r := newRecorder()

	// gpufrac-node: what deviceplugin/agent registers on its registry.
	metrics.New(r, metrics.Sources{}, "test")
	cfgFile := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfgFile, []byte("version: v1\ndefault: {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := config.NewWatcher(cfgFile, config.WithRegisterer(r)); err != nil {
		t.Fatal(err)
	}
	enforcement.New(enforcement.Options{Registerer: r})
	miglayout.NewManager(nil, nil, miglayout.Options{Registerer: r})
	metrics.NewTimesliceCollector(r, metrics.TimesliceSources{})
	if _, err := cdi.New(cdi.Options{SpecDirs: []string{t.TempDir()}, Registerer: r}); err != nil {
		t.Fatal(err)
	}
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	// gpufrac-coordinator: the App's own registry (build info, leader, Go,
	// process), then what lead() registers on it.
	a, err := app.New(app.Config{Version: "test"}, &rest.Config{Host: "https://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	r.gathered(t, a.Registry())
	if _, err := scheduler.New(scheduler.Options{}, scheduler.Deps{Registry: r}); err != nil {
		t.Fatal(err)
	}
	if err := reservation.NewManager(nil, nil, reservation.DefaultOptions(), nil).Register(r); err != nil {
		t.Fatal(err)
	}
	return r
}

// has tells whether a series name belongs to an exported metric.
func (r *recorder) has(name string) bool {
	if r.names[name] {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && r.histograms[base] {
			return true
		}
	}
	return false
}

// prometheusTargetMetrics are the series Prometheus itself writes for every
// scrape target (the node-agent-down alerts read up).
var prometheusTargetMetrics = map[string]bool{"up": true}

// query is a PromQL expression the chart ships, and where.
type query struct{ where, expr string }

// shippedQueries renders the chart with its observability values and
// collects the PrometheusRule's expressions and the dashboard's queries.
func shippedQueries(t *testing.T) []query {
	t.Helper()
	dir, err := cluster.ChartDir()
	if err != nil {
		t.Fatal(err)
	}
	objs := render(t, helmPath(t, cluster.Helm3), filepath.Join(dir, "ci", "observability-values.yaml"))
	var qs []query
	rule := objs.Find("PrometheusRule", "gpufrac")
	if rule == nil {
		t.Fatal("the chart renders no PrometheusRule with prometheusRule.enabled")
	}
	groups, _, _ := unstructured.NestedSlice(rule.Object, "spec", "groups")
	for _, g := range groups {
		rules, _, _ := unstructured.NestedSlice(g.(map[string]any), "rules")
		for _, r := range rules {
			rm := r.(map[string]any)
			qs = append(qs, query{where: "alert " + rm["alert"].(string), expr: rm["expr"].(string)})
		}
	}
	data, err := objs.ConfigMapData("gpufrac-dashboard", "gpufrac.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal([]byte(data), &dash); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			qs = append(qs, query{where: "panel " + p.Title, expr: tg.Expr})
		}
	}
	return qs
}

// TestAlertsAndDashboardUseExportedMetrics parses every alert expression and
// dashboard query with Prometheus' own PromQL parser (bin/promql-metrics)
// and checks that every metric they read is one the components export.
func TestAlertsAndDashboardUseExportedMetrics(t *testing.T) {
	qs := shippedQueries(t)
	wantAlerts := []string{"GPUUnhealthy", "GPUMemoryLimitViolations", "GPUConfigRejected", "GPUCoordinatorNoLeader",
		"GPUPodsPendingTooLong", "GPUReservationWithoutFractions", "GPUCDISpecMissing", "GPUFractionsEvicted",
		"GPUNodeAgentDown", "GPUNodeAgentAbsent"}
	for _, a := range wantAlerts {
		if !slices.ContainsFunc(qs, func(q query) bool { return q.where == "alert "+a }) {
			t.Errorf("the PrometheusRule has no alert %s", a)
		}
	}
	parser := filepath.Join(repoRoot(t), "bin", "promql-metrics")
	if _, err := os.Stat(parser); err != nil {
		if testing.Short() {
			t.Skip("bin/promql-metrics missing (make tools)")
		}
		t.Fatalf("%v (make tools builds it)", err)
	}
	var in bytes.Buffer
	for _, q := range qs {
		line, _ := json.Marshal(q.expr)
		in.Write(append(line, '\n'))
	}
	cmd := exec.Command(parser)
	cmd.Stdin = &in
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("promql-metrics: %v", err)
	}
	exp := exported(t)
	dec := json.NewDecoder(bytes.NewReader(out))
	used := map[string]bool{}
	for _, q := range qs {
		var res struct {
			Metrics []string `json:"metrics"`
			Error   string   `json:"error"`
		}
		if err := dec.Decode(&res); err != nil {
			t.Fatalf("reading promql-metrics' answer for %s: %v", q.where, err)
		}
		if res.Error != "" {
			t.Errorf("%s: %q does not parse: %s", q.where, q.expr, res.Error)
			continue
		}
		if len(res.Metrics) == 0 {
			t.Errorf("%s: %q reads no metric", q.where, q.expr)
		}
		for _, m := range res.Metrics {
			used[m] = true
			if prometheusTargetMetrics[m] {
				continue
			}
			if !exp.has(m) {
				t.Errorf("%s reads %s, which no gpufrac component exports", q.where, m)
			}
		}
	}
	t.Logf("%d queries read %d metrics, all exported (of %d)", len(qs), len(used), len(exp.names))
}

// TestExportedRecorderCanFail: the check above fails for a metric no
// component exports (so it cannot pass by accident).
func TestExportedRecorderCanFail(t *testing.T) {
	exp := exported(t)
	for _, name := range []string{"gpufrac_gpu_healthy", "gpufrac_binding_duration_seconds_bucket", "gpufrac_coordinator_leader"} {
		if !exp.has(name) {
			t.Errorf("%s should be exported", name)
		}
	}
	for _, name := range []string{"gpufrac_gpu_temperature_celsius", "gpufrac_gpu_healthy_bucket", "gpufrac_pending_pods_total"} {
		if exp.has(name) {
			t.Errorf("%s is not exported by any component", name)
		}
	}
}

// alertRules renders the chart with its observability values and returns the
// PrometheusRule's rules.
func alertRules(t *testing.T, helm string, files ...string) []map[string]any {
	t.Helper()
	objs := render(t, helm, files...)
	rule := objs.Find("PrometheusRule", "gpufrac")
	if rule == nil {
		t.Fatal("the chart renders no PrometheusRule")
	}
	var out []map[string]any
	groups, _, _ := unstructured.NestedSlice(rule.Object, "spec", "groups")
	for _, g := range groups {
		rules, _, _ := unstructured.NestedSlice(g.(map[string]any), "rules")
		for _, r := range rules {
			out = append(out, r.(map[string]any))
		}
	}
	return out
}

// githubAnchor is the anchor GitHub gives a Markdown heading.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || ('a' <= r && r <= 'z') || ('0' <= r && r <= '9'):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestAlertsHaveRunbooks (issue 29): every alert's runbook_url is a section
// of docs/runbooks.md under prometheusRule.runbookBaseURL, and every section
// there is an alert's.
func TestAlertsHaveRunbooks(t *testing.T) {
	dir, err := cluster.ChartDir()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(repoRoot(t), "docs", "runbooks.md"))
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string]bool{}
	for _, line := range strings.Split(string(doc), "\n") {
		if h, ok := strings.CutPrefix(line, "## "); ok {
			sections[githubAnchor(h)] = true
		}
	}
	const base = "https://github.com/gpufrac/gpufrac/blob/main/docs/runbooks.md#"
	seen := map[string]bool{}
	for _, r := range alertRules(t, helmPath(t, cluster.Helm3), filepath.Join(dir, "ci", "observability-values.yaml")) {
		name, _ := r["alert"].(string)
		url, _, _ := unstructured.NestedString(r, "annotations", "runbook_url")
		anchor, ok := strings.CutPrefix(url, base)
		if !ok || !sections[anchor] {
			t.Errorf("alert %s: runbook_url %q is no section of docs/runbooks.md (%s...)", name, url, base)
		}
		seen[anchor] = true
	}
	for s := range sections {
		if !seen[s] {
			t.Errorf("docs/runbooks.md has a section #%s for no alert", s)
		}
	}
}

// TestAlertPendingIgnoresNormalReasons (issue 29): GPUPodsPendingTooLong
// filters out the pending reasons of queues working as configured
// (prometheusRule.pendingIgnoredReasons), each a reason the scheduler's
// pending gauge documents.
func TestAlertPendingIgnoresNormalReasons(t *testing.T) {
	dir, err := cluster.ChartDir()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		set  []string
		want string
	}{
		{want: `gpufrac_pending_pods_oldest_age_seconds{reason!~"OverQuota|GangIncomplete"}`},
		{set: []string{"prometheusRule.pendingIgnoredReasons={OverQuota,OverLimit,GangIncomplete}"}, want: `gpufrac_pending_pods_oldest_age_seconds{reason!~"OverQuota|OverLimit|GangIncomplete"}`},
		{set: []string{"prometheusRule.pendingIgnoredReasons=null"}, want: `max by (reason) (gpufrac_pending_pods_oldest_age_seconds) >`},
	} {
		objs, err := cluster.RenderChart(t.Context(), cluster.ChartOptions{Helm: helmPath(t, cluster.Helm3),
			ValuesFiles: []string{filepath.Join(dir, "ci", "observability-values.yaml")}, Set: tc.set, APIVersions: []string{monitoringAPI}})
		if err != nil {
			t.Fatal(err)
		}
		var expr string
		groups, _, _ := unstructured.NestedSlice(objs.Find("PrometheusRule", "gpufrac").Object, "spec", "groups")
		for _, g := range groups {
			rules, _, _ := unstructured.NestedSlice(g.(map[string]any), "rules")
			for _, r := range rules {
				if rm := r.(map[string]any); rm["alert"] == "GPUPodsPendingTooLong" {
					expr = rm["expr"].(string)
				}
			}
		}
		if !strings.Contains(expr, tc.want) {
			t.Errorf("with %v GPUPodsPendingTooLong is %q, want it to read %s", tc.set, expr, tc.want)
		}
	}
	// The reasons are the scheduler's (the gauge's help lists them).
	reg := prometheus.NewPedanticRegistry()
	r := &recorder{reg: reg, names: map[string]bool{}, histograms: map[string]bool{}}
	var descs []string
	if _, err := scheduler.New(scheduler.Options{}, scheduler.Deps{Registry: registererFunc(func(c prometheus.Collector) error {
		ch := make(chan *prometheus.Desc)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			descs = append(descs, d.String())
		}
		return r.Register(c)
	})}); err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(descs, func(d string) bool { return strings.Contains(d, `fqName: "gpufrac_pending_pods"`) })
	if i < 0 {
		t.Fatal("the scheduler exports no gpufrac_pending_pods")
	}
	for _, reason := range []string{"OverQuota", "GangIncomplete"} {
		if !strings.Contains(descs[i], reason) {
			t.Errorf("gpufrac_pending_pods documents no reason %s: %s", reason, descs[i])
		}
	}
}

// registererFunc is a prometheus.Registerer from a Register function.
type registererFunc func(prometheus.Collector) error

func (f registererFunc) Register(c prometheus.Collector) error { return f(c) }
func (f registererFunc) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := f(c); err != nil {
			panic(err)
		}
	}
}
func (f registererFunc) Unregister(prometheus.Collector) bool { return false }

// TestMonitorsKeepTheOffendersLabels (issue 29): the ServiceMonitors and
// PodMonitors honour the series' labels (gpufrac-node's per-container series
// name the offending namespace/pod/container), set job to the component
// (the node-agent-down alerts read up{job="gpufrac-node"}) and add the
// scraped pod's node as label node.
func TestMonitorsKeepTheOffendersLabels(t *testing.T) {
	dir, err := cluster.ChartDir()
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range helms {
		helm := helmPath(t, h)
		for file, kind := range map[string]string{"observability-values.yaml": "ServiceMonitor", "mixed-cluster-values.yaml": "PodMonitor"} {
			objs := render(t, helm, filepath.Join(dir, "ci", file))
			mons := objs.OfKind(kind)
			if len(mons) != 2 {
				t.Fatalf("%s %s: %d %ss, want one per component", h, file, len(mons), kind)
			}
			field := map[string]string{"ServiceMonitor": "endpoints", "PodMonitor": "podMetricsEndpoints"}[kind]
			for _, m := range mons {
				if jl, _, _ := unstructured.NestedString(m.Object, "spec", "jobLabel"); jl != "app.kubernetes.io/name" {
					t.Errorf("%s %s %s: jobLabel %q", h, kind, m.GetName(), jl)
				}
				eps, _, _ := unstructured.NestedSlice(m.Object, "spec", field)
				for _, e := range eps {
					em := e.(map[string]any)
					if em["honorLabels"] != true {
						t.Errorf("%s %s %s: honorLabels is not true", h, kind, m.GetName())
					}
					rls, _, _ := unstructured.NestedSlice(em, "relabelings")
					if !slices.ContainsFunc(rls, func(r any) bool {
						rm := r.(map[string]any)
						src, _, _ := unstructured.NestedStringSlice(rm, "sourceLabels")
						return slices.Equal(src, []string{"__meta_kubernetes_pod_node_name"}) && rm["targetLabel"] == "node"
					}) {
						t.Errorf("%s %s %s: no relabeling of __meta_kubernetes_pod_node_name to node: %v", h, kind, m.GetName(), rls)
					}
				}
			}
		}
	}
	// The node-down alert's job is the one jobLabel gives.
	for _, r := range alertRules(t, helmPath(t, cluster.Helm3), filepath.Join(dir, "ci", "observability-values.yaml")) {
		if r["alert"] == "GPUNodeAgentDown" && !strings.Contains(r["expr"].(string), `up{job="gpufrac-node"}`) {
			t.Errorf("GPUNodeAgentDown reads %q", r["expr"])
		}
	}
}
