package e2e

// Issue 16's comparison: what one scripted GPU day costs under the same real
// Karpenter (kwok provider) when a team runs
//
//	(a) whole: no sharing, every job asks a whole GPU through kube-scheduler;
//	(b) timeslice: NVIDIA-style time-slicing, 4 replicas per GPU through
//	    kube-scheduler (gpufrac-node's timeslice mode serves
//	    nvidia.com/gpu.shared as NVIDIA's device plugin does with
//	    renameByDefault: true; no memory isolation);
//	(c) gpufrac: fractions through the coordinator, with the chart's default
//	    placeholder sizing (no price table; GPUFRAC_COMPARE_PRICE_TABLE=1
//	    gives it the test bed's table) and GPU-aware consolidation.
//
// Each configuration runs the same jobs (same seed) on a fresh control plane,
// as parallel subtests: as many at once as go test's -parallel allows
// (GOMAXPROCS by default: on a 2-core machine two at once, the third when one
// ends; each run's line gives the machine load before and after it). Nothing
// else differs but the way jobs ask for GPUs and what schedules them. An evicted job is re-created by the script, as its
// controller would, and runs its remaining time (services, or jobs that
// checkpoint). The figures are opt-in (minutes to an hour):
//
//	GPUFRAC_FIGURES=1 go test ./tests/e2e -run 'TestCostComparison' -v -count=1 -timeout 4h 2>&1 | grep -E '^ *(COMPARISON|RUN|\|)'
//
// GPUFRAC_COMPARE_SHAPES (peak,tail), GPUFRAC_COMPARE_SIMHOURS (10s,60s) and
// GPUFRAC_COMPARE_CONFIGS (whole,timeslice,gpufrac) narrow it;
// GPUFRAC_COMPARE_POLICY sets (c)'s --policy (default: the coordinator's),
// GPUFRAC_COMPARE_CONSOLIDATION ("stableFor=6s;maxMoves=8") its consolidation
// values over the chart's compressed defaults (costConsolidation),
// GPUFRAC_COMPARE_V its log verbosity and GPUFRAC_COMPARE_LOGS a directory
// that keeps every run's component logs. Method and
// figures: docs/benchmarks.md, "What a GPU day costs".

import (
	"context"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/yaml"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/tests/cluster"
)

const (
	// costSeed seeds the compared day.
	costSeed = 7
	// costReplicas is time-slicing's replicas per GPU in (b), NVIDIA's
	// documented example.
	costReplicas = 4
	// costGrace and costConsolidateAfter are the reservation grace (c) and
	// the NodePool's consolidateAfter (all three), in wall time.
	costGrace = 5 * time.Second
	// costEmptyNodeGrace is (c)'s reservation grace on a node whose GPUs
	// run nothing else: the chart's 5 s compressed as costGrace compresses
	// the chart's 60 s (Karpenter's latencies are not compressed).
	costEmptyNodeGrace   = 400 * time.Millisecond
	costConsolidateAfter = 5 * time.Second
	// costSharedPool is (b)'s time-sliced NodePool; its whole-GPU jobs go
	// to the pool "gpu".
	costSharedPool = "gpu-ts"
	// Job labels.
	costLabelJob, costLabelSize, costLabelProtected = "cost-job", "cost-size", "cost-protected"
)

// The compared configurations.
const (
	configWhole     = "whole"
	configTimeslice = "timeslice"
	configGpufrac   = "gpufrac"
)

// costJob is one job of the compared day.
type costJob struct {
	Name string
	// Arrival and Duration are simulated hours.
	Arrival, Duration float64
	// Size is the percent of one GPU the job needs (100 for whole-GPU jobs).
	Size int
	// Whole jobs need a GPU to themselves in every configuration.
	Whole bool
	// Protected jobs are non-preemptible (do-not-disrupt).
	Protected bool
}

// costDay draws the day. Shape "peak": fraction jobs arrive at 1/h all day
// plus a Gaussian peak of 9/h at 03:30 (σ 1.2 h) until 08:00, each needing
// 10..60% for 0.5-2 h once running; four whole-GPU jobs arrive between 01:00
// and 06:00 (1-2.5 h, every other one non-preemptible). Shape "tail": the
// same draws, but three jobs in ten run 4-7 h, so the day has a long tail of
// a few small jobs spread over the nodes the peak needed.
func costDay(shape string, seed uint64) []costJob {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	const base, peak, at, width, end = 1.0, 9.0, 3.5, 1.2, 8.0
	rate := func(h float64) float64 { z := (h - at) / width; return base + peak*math.Exp(-z*z/2) }
	var jobs []costJob
	for h := 0.0; ; {
		h += rng.ExpFloat64() / (base + peak)
		if h >= end {
			break
		}
		if rng.Float64()*(base+peak) > rate(h) {
			continue
		}
		short := 0.5 + 1.5*rng.Float64()
		long, isLong := 4+3*rng.Float64(), rng.Float64() < 0.3
		d := short
		if shape == "tail" && isLong {
			d = long
		}
		jobs = append(jobs, costJob{Arrival: h, Duration: d, Size: 10 * (1 + rng.IntN(6))})
	}
	for i := 0; i < 4; i++ {
		jobs = append(jobs, costJob{Arrival: 1 + 5*rng.Float64(), Duration: 1 + 1.5*rng.Float64(), Size: 100, Whole: true, Protected: i%2 == 0})
	}
	sort.SliceStable(jobs, func(i, j int) bool { return jobs[i].Arrival < jobs[j].Arrival })
	for i := range jobs {
		jobs[i].Name = fmt.Sprintf("job-%03d", i)
	}
	return jobs
}

// costBound is the day's FFD packing bound: at every instant of the ideal
// schedule (each job running from its arrival for its duration, no
// queueing, no node latency) the GPUs a first-fit-decreasing packing of the
// running jobs needs, and the cheapest instance mix holding them.
type costBound struct{ Hours, GPUHours, Dollars float64 }

func idealBound(jobs []costJob, types []cluster.InstanceType) costBound {
	var times []float64
	for _, j := range jobs {
		times = append(times, j.Arrival, j.Arrival+j.Duration)
	}
	sort.Float64s(times)
	times = slices.Compact(times)
	var b costBound
	for i := 0; i+1 < len(times); i++ {
		t, dt := times[i], times[i+1]-times[i]
		var fr []int64
		var whole int64
		for _, j := range jobs {
			if j.Arrival <= t && t < j.Arrival+j.Duration {
				if j.Whole {
					whole++
				} else {
					fr = append(fr, int64(j.Size))
				}
			}
		}
		g := ffd(fr, whole)
		_, price := cheapestMix(int(g), types)
		b.GPUHours += float64(g) * dt
		b.Dollars += price * dt
	}
	if len(times) > 0 {
		b.Hours = times[len(times)-1] - times[0]
	}
	return b
}

// costResult is one configuration's figures on one day at one compression.
type costResult struct {
	Shape, Config string
	SimHour       time.Duration
	Jobs          int
	// The day: from the first arrival to the end of the last job; Tail adds
	// the scale-down to zero GPU nodes.
	Day, Tail dayFigures
	// Idle says where the day's GPU-hours on idle nodes went.
	Idle  idleSplit
	Bound costBound
	// Queueing is each job's wait from creation to first Running (simulated minutes).
	QueueP50, QueueP95, QueueMax float64
	Failed, Protected, Moves     int
	// MoveDowntime is the mean time a moved job waited to run again (simulated minutes).
	MoveDowntime float64
	// OversubGPUHours are GPU-hours on GPUs whose jobs' needs summed over
	// 100% ((b): nothing keeps a replica to its share); OversubJobs the
	// jobs that ran on such a GPU at some point.
	OversubGPUHours float64
	OversubJobs     int
	LoadBefore      string
	LoadAfter       string
	Nodes           map[string]int // instance type -> nodes launched
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func envList(name, def string) []string {
	v := os.Getenv(name)
	if v == "" {
		v = def
	}
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func TestCostComparison(t *testing.T) {
	if os.Getenv("GPUFRAC_FIGURES") == "" {
		t.Skip("measurement: set GPUFRAC_FIGURES=1 to run (see docs/benchmarks.md, What a GPU day costs)")
	}
	if testing.Short() {
		t.Skip("end-to-end: needs the local cluster")
	}
	configs := envList("GPUFRAC_COMPARE_CONFIGS", "whole,timeslice,gpufrac")
	var (
		mu      sync.Mutex
		results []costResult
	)
	for _, shape := range envList("GPUFRAC_COMPARE_SHAPES", "peak,tail") {
		for _, h := range envList("GPUFRAC_COMPARE_SIMHOURS", "10s,60s") {
			simHour, err := time.ParseDuration(h)
			if err != nil {
				t.Fatalf("GPUFRAC_COMPARE_SIMHOURS: %v", err)
			}
			// The configurations of one day and compression run in parallel
			// (up to -parallel at once), each on its own control plane.
			t.Run(shape+"/"+h, func(t *testing.T) {
				for _, config := range configs {
					t.Run(config, func(t *testing.T) {
						t.Parallel()
						r := runCostDay(t, shape, config, simHour)
						t.Log("\n" + r.line())
						mu.Lock()
						results = append(results, r)
						mu.Unlock()
					})
				}
			})
		}
	}
	// Each day and compression in the order they ran, its configurations in
	// the order asked.
	var groups []string
	group := func(r costResult) int {
		k := r.Shape + "/" + r.SimHour.String()
		if i := slices.Index(groups, k); i >= 0 {
			return i
		}
		groups = append(groups, k)
		return len(groups) - 1
	}
	for _, r := range results {
		group(r)
	}
	sort.SliceStable(results, func(i, j int) bool {
		a, b := results[i], results[j]
		if ga, gb := group(a), group(b); ga != gb {
			return ga < gb
		}
		return slices.Index(configs, a.Config) < slices.Index(configs, b.Config)
	})
	t.Log("\n" + comparisonTable(results))
}

// line is one run's figures on one line.
func (r costResult) line() string {
	return fmt.Sprintf("RUN shape=%s simhour=%s config=%s jobs=%d dayh=%.2f gpuh=%.2f nodeh=%.2f usd=%.0f tail_gpuh=%.2f idle_gpuh=%.2f idle_up=%.2f idle_gap=%.2f idle_down=%.2f ffd_gpuh=%.2f ffd_usd=%.0f q50=%.0f q95=%.0f qmax=%.0f failed=%d protected=%d moves=%d move_down=%.0f oversub_gpuh=%.2f oversub_jobs=%d nodes=%v load=%s..%s",
		r.Shape, r.SimHour, r.Config, r.Jobs, r.Day.Hours, r.Day.GPUHours, r.Day.NodeHours, r.Day.Dollars, r.Tail.GPUHours, r.Day.IdleGPUHours, r.Idle.Up, r.Idle.Gap, r.Idle.Down,
		r.Bound.GPUHours, r.Bound.Dollars, r.QueueP50, r.QueueP95, r.QueueMax, r.Failed, r.Protected, r.Moves, r.MoveDowntime,
		r.OversubGPUHours, r.OversubJobs, r.Nodes, r.LoadBefore, r.LoadAfter)
}

// comparisonTable renders the results as markdown: per day and compression,
// each configuration against (a) whole and against the FFD bound.
func comparisonTable(rs []costResult) string {
	var b strings.Builder
	b.WriteString("COMPARISON\n")
	b.WriteString("| day | 1 sim h | config | GPU-node-h (vs a, vs FFD) | of which on idle nodes | $ (vs a, vs FFD $) | + scale-down GPU-h | queueing p50 / p95 / max (sim min) | p95 vs a | failed | protected disrupted | moves (mean wait, sim min) | oversubscribed GPU-h (jobs) | load 1/5/15 min |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	base := map[string]costResult{}
	for _, r := range rs {
		if r.Config == configWhole {
			base[r.Shape+r.SimHour.String()] = r
		}
	}
	for _, r := range rs {
		a, ok := base[r.Shape+r.SimHour.String()]
		vsA := func(x, y float64) string {
			if !ok || y == 0 {
				return "n/a"
			}
			return fmt.Sprintf("%.2f", x/y)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %.1f (%s, %s) | %.1f | $%.0f (%s, %s) | %.1f | %.0f / %.0f / %.0f | %s | %d | %d | %d (%.0f) | %.1f (%d) | %s |\n",
			r.Shape, r.SimHour, r.Config,
			r.Day.GPUHours, vsA(r.Day.GPUHours, a.Day.GPUHours), ratio(r.Day.GPUHours, r.Bound.GPUHours), r.Day.IdleGPUHours,
			r.Day.Dollars, vsA(r.Day.Dollars, a.Day.Dollars), ratio(r.Day.Dollars, r.Bound.Dollars),
			r.Tail.GPUHours, r.QueueP50, r.QueueP95, r.QueueMax, vsA(r.QueueP95, a.QueueP95), r.Failed, r.Protected, r.Moves, r.MoveDowntime,
			r.OversubGPUHours, r.OversubJobs, r.LoadBefore)
	}
	return b.String()
}

// costTypes are the instance types of the comparison: 1× and 8× H100, and
// for (b) the same machines as time-sliced types advertising replicas.
func costTypes(config string) []cluster.InstanceType {
	types := cluster.DefaultInstanceTypes()
	if config != configTimeslice {
		return types
	}
	var out []cluster.InstanceType
	for _, it := range types {
		out = append(out, it)
		if g := instanceGPUs(it); g > 0 {
			ts := it
			ts.Name = it.Name + "-ts"
			ts.Resources = it.Resources.DeepCopy()
			// Karpenter must know the replicas to provision for them: the
			// fake cloud says so. A real cloud provider cannot (see docs).
			ts.Resources[api.DefaultTimesliceResource] = *resource.NewQuantity(g*costReplicas, resource.DecimalSI)
			out = append(out, ts)
		}
	}
	return out
}

// costCluster starts the cluster for a configuration, gpufrac's chart
// installed with chart.
func costCluster(t *testing.T, config string, types []cluster.InstanceType, chart cluster.ChartOptions) *cluster.Cluster {
	t.Helper()
	pool := func(name string, its ...string) cluster.NodePool {
		return cluster.NodePool{Name: name, Labels: map[string]string{api.LabelGPUNode: "true"}, InstanceTypes: its,
			ConsolidationPolicy: "WhenEmptyOrUnderutilized", ConsolidateAfter: costConsolidateAfter}
	}
	pools := []cluster.NodePool{pool("gpu", "gpu-8x-h100", "gpu-1x-h100")}
	agents := &cluster.NodeAgentOptions{StopGracePeriod: 5 * time.Second}
	if config == configTimeslice {
		pools = append(pools, pool(costSharedPool, "gpu-8x-h100-ts", "gpu-1x-h100-ts"))
		// No memory limit enforced, as with NVIDIA's plugin: the watchdog
		// only reports.
		agents.Config = fmt.Sprintf(`version: v1
default:
  mode: fraction
  fraction: {enforcement: report}
groups:
  - nodeSelector: {%s: %s}
    mode: timeslice
    timeslice: {replicas: %d, resourceName: %s}
`, api.LabelNodePool, costSharedPool, costReplicas, api.DefaultTimesliceResource)
	}
	// The cluster's directory (etcd's data among it) under bin/, not the
	// shared /tmp: these runs last up to half an hour.
	dir, err := os.MkdirTemp(filepath.Join(repoRoot(t), "bin"), "cc-")
	if err != nil {
		t.Fatal(err)
	}
	c := startCluster(t, cluster.Options{
		Dir:        dir,
		Karpenter:  &cluster.KarpenterOptions{InstanceTypes: types, NodePools: pools},
		NodeAgents: agents,
		Chart:      chart,
	})
	return c
}

// costPod builds job j's attempt-th pod for a configuration.
func costPod(j costJob, attempt int, config string) *corev1.Pod {
	w := pod(fmt.Sprintf("%s-%d", j.Name, attempt), "day").Label("e2e", "cost").Label(costLabelJob, j.Name).
		Label(costLabelSize, strconv.Itoa(j.Size)).Label(costLabelProtected, strconv.FormatBool(j.Protected))
	switch {
	case config == configGpufrac && j.Whole:
		w = w.GPUs(1)
	case config == configGpufrac:
		w = w.Fraction(j.Size)
	case config == configTimeslice && !j.Whole:
		w = w.Resource(api.DefaultTimesliceResource, "1")
	default:
		w = w.GPUs(1)
	}
	if config == configTimeslice && j.Whole {
		w = w.NodeSelector(api.LabelNodePool, "gpu")
	}
	if j.Protected {
		if config == configGpufrac {
			w = w.Preemptible(false) // the coordinator adds do-not-disrupt at bind
		} else {
			w = w.Annotation(api.AnnotationDoNotDisrupt, "true")
		}
	}
	p := w.Obj()
	if config == configGpufrac {
		p.Spec.SchedulerName = api.SchedulerName
	} else {
		p.Spec.SchedulerName = ""
		delete(p.Labels, api.LabelQueue)
	}
	p.Spec.TerminationGracePeriodSeconds = new(int64)
	return p
}

// costConsolidation is (c)'s coordinator.consolidation values: the chart's
// defaults (values.yaml), their times compressed as the day is (stableFor 2m
// and moveWindow 1m are 2 s and 1 s at 1 h = 60 s), except where the day or
// the test bed needs otherwise:
//   - enabled: the chart ships consolidation off (consolidationValues turns
//     it on);
//   - interval at least 1 s (the chart's 10 s compressed is 0.17 s), so
//     passes are sparser in sim time than the chart's; stableFor, 2 s at
//     60 s, spans two or three passes, and at 1 h = 10 s (333 ms) it only
//     asks for the best candidate on two passes in a row;
//   - moveWindow (1 s at 60 s) is no longer than a pass, so maxMoves only
//     caps one pass at 10 and maxInFlight (4) is what limits the moves;
//   - drainTimeout 3m: a drain waits on Karpenter, whose latencies are not
//     compressed;
//   - moveBarePods: the day's jobs are bare pods the script re-creates;
//   - deleteDrainedNodes (off in the chart): a drained node is deleted
//     instead of waiting for Karpenter's emptiness path (up to 30 s wall,
//     30 sim minutes, a node).
//
// The reservation graces are compressed apart (costGrace). Until
// 2026-11-30 the comparison ran stricter values of its own: stableFor 0.1
// sim h, 8 moves per sim hour, 2 nodes draining at once.
// GPUFRAC_COMPARE_CONSOLIDATION's "key=value;key=value" goes over them
// (keys of the chart's coordinator.consolidation, enabled excepted).
func costConsolidation(simHour time.Duration) ([]string, error) {
	v, err := chartConsolidationDefaults()
	if err != nil {
		return nil, err
	}
	for _, k := range []string{"interval", "stableFor", "moveWindow"} {
		d, err := time.ParseDuration(v[k])
		if err != nil {
			return nil, fmt.Errorf("the chart's coordinator.consolidation.%s: %w", k, err)
		}
		v[k] = time.Duration(float64(d) * float64(simHour) / float64(time.Hour)).Round(time.Millisecond).String()
	}
	if d, _ := time.ParseDuration(v["interval"]); d < time.Second {
		v["interval"] = "1s"
	}
	v["drainTimeout"], v["moveBarePods"], v["deleteDrainedNodes"] = "3m", "true", "true"
	delete(v, "enabled") // consolidationValues turns it on
	for _, kv := range strings.Split(os.Getenv("GPUFRAC_COMPARE_CONSOLIDATION"), ";") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		k, val, ok := strings.Cut(kv, "=")
		k = strings.TrimSpace(k)
		if _, known := v[k]; !ok || !known {
			return nil, fmt.Errorf("GPUFRAC_COMPARE_CONSOLIDATION: %q is not key=value with a key of the chart's coordinator.consolidation (enabled excepted)", kv)
		}
		v[k] = strings.TrimSpace(val)
	}
	out := make([]string, 0, len(v))
	for _, k := range slices.Sorted(maps.Keys(v)) {
		out = append(out, k+": "+v[k])
	}
	return out, nil
}

// chartConsolidationDefaults reads coordinator.consolidation from the
// chart's values.yaml, each value as a values file would write it.
func chartConsolidationDefaults() (map[string]string, error) {
	root, err := cluster.RepoRoot()
	if err != nil {
		return nil, err
	}
	path := filepath.Join(root, "deployments", "helm", "gpufrac", "values.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var values struct {
		Coordinator struct {
			Consolidation map[string]any `json:"consolidation"`
		} `json:"coordinator"`
	}
	if err := yaml.Unmarshal(data, &values); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(values.Coordinator.Consolidation) == 0 {
		return nil, fmt.Errorf("%s: no coordinator.consolidation", path)
	}
	out := make(map[string]string, len(values.Coordinator.Consolidation))
	for k, x := range values.Coordinator.Consolidation {
		switch x := x.(type) {
		case string:
			out[k] = x
		case bool:
			out[k] = strconv.FormatBool(x)
		case float64:
			out[k] = strconv.FormatFloat(x, 'f', -1, 64)
		default:
			return nil, fmt.Errorf("%s: coordinator.consolidation.%s is %T %v, not a string, a number or a bool", path, k, x, x)
		}
	}
	return out, nil
}

// runCostDay runs the day for one configuration and measures it.
func runCostDay(t *testing.T, shape, config string, simHour time.Duration) costResult {
	jobs := costDay(shape, costSeed)
	types := costTypes(config)
	r := costResult{Shape: shape, Config: config, SimHour: simHour, Jobs: len(jobs), LoadBefore: loadavg(),
		Bound: idealBound(jobs, cluster.DefaultInstanceTypes())}
	// (c) runs the chart's coordinator with consolidation (and the price
	// table with GPUFRAC_COMPARE_PRICE_TABLE); the script's jobs are bare
	// pods it re-creates itself.
	var chart cluster.ChartOptions
	if config == configGpufrac {
		// The chart's default sizing (no price table: placeholders prefer
		// the smallest GPU nodes, issue 31) unless GPUFRAC_COMPARE_PRICE_TABLE
		// asks for the test bed's table (issue 16's runs).
		var table []cluster.InstanceType
		if os.Getenv("GPUFRAC_COMPARE_PRICE_TABLE") != "" {
			table = types
		}
		consolidation, err := costConsolidation(simHour)
		if err != nil {
			t.Fatal(err)
		}
		chart.ValuesFiles = consolidationValues(t, table, []string{"grace: " + costGrace.String(), "emptyNodeGrace: " + costEmptyNodeGrace.String()},
			consolidation...)
	}
	c := costCluster(t, config, types, chart)
	if config == configGpufrac {
		buildBinary(t, "gpufrac-coordinator")
		applyYAML(t, c, queuesYAML(map[string]string{"day": "64"}))
		args := []string{"--leader-elect=false"}
		if p := os.Getenv("GPUFRAC_COMPARE_POLICY"); p != "" {
			args = append(args, "--policy="+p)
		}
		if v := os.Getenv("GPUFRAC_COMPARE_SETTLE"); v != "" {
			args = append(args, "--new-node-settle="+v) // the chart's newNodeSettle otherwise
		}
		if v := os.Getenv("GPUFRAC_COMPARE_V"); v != "" {
			args = append(args, "--v="+v)
		}
		startCoordinator(t, c, "c1", args...)
	}
	m := startCostMeter(t, c, config, types, simHour)

	began := time.Now()
	at := func(h float64) time.Time { return began.Add(time.Duration(h * float64(simHour))) }
	var last float64
	for _, j := range jobs {
		last = max(last, j.Arrival+j.Duration)
	}
	deadline := at(last + 4).Add(2 * time.Minute)
	type jobState struct {
		attempt   int
		created   time.Time // first attempt's creation
		ran       time.Duration
		done      bool
		firstRun  time.Time
		movedAt   time.Time // when the current attempt's predecessor was disrupted
		protected bool
	}
	st := make([]jobState, len(jobs))
	var waits, downs []time.Duration
	next, finished := 0, 0
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for finished < len(jobs) {
		now := time.Now()
		if now.After(deadline) {
			for i, j := range jobs {
				if !st[i].done {
					t.Errorf("job %s (arrival %.2f h) did not finish by the deadline", j.Name, j.Arrival)
					_ = m.scriptDelete(t.Context(), fmt.Sprintf("%s-%d", j.Name, st[i].attempt))
				}
			}
			break
		}
		for ; next < len(jobs) && !at(jobs[next].Arrival).After(now); next++ {
			createCostPod(t, c, costPod(jobs[next], 0, config))
			st[next].created = time.Now()
		}
		for i := 0; i < next; i++ {
			j, s := jobs[i], &st[i]
			if s.done {
				continue
			}
			name := fmt.Sprintf("%s-%d", j.Name, s.attempt)
			ps := m.state(name)
			switch {
			case ps.failed != "":
				t.Errorf("job %s failed: %s", name, ps.failed)
				r.Failed++
				_ = m.scriptDelete(t.Context(), name)
				s.done = true
				finished++
			case ps.disrupted:
				// Its controller would re-create it: so does the script.
				if !ps.runningSince.IsZero() {
					s.ran += now.Sub(ps.runningSince)
				}
				r.Moves++
				t.Logf("disrupted: %s on %s: %v", name, ps.node, ps.causes)
				if j.Protected {
					r.Protected++
					t.Errorf("protected job %s disrupted: %v", name, ps.causes)
				}
				s.attempt++
				s.movedAt = now
				createCostPod(t, c, costPod(j, s.attempt, config))
			case !ps.runningSince.IsZero():
				if s.firstRun.IsZero() {
					s.firstRun = ps.runningSince
					waits = append(waits, s.firstRun.Sub(s.created))
					if w := s.firstRun.Sub(s.created); w > simHour/20 {
						t.Logf("slow: %s waited %.0f sim min (%s wall) to run on %s (%s); reasons %v, bound after %.1fs", name, 60*float64(w)/float64(simHour), w.Round(100*time.Millisecond), ps.node, m.nodeAge(ps.node, s.created), ps.reasons, ps.boundAfter.Seconds())
					}
				}
				if !s.movedAt.IsZero() {
					downs = append(downs, ps.runningSince.Sub(s.movedAt))
					if d := ps.runningSince.Sub(s.movedAt); d > simHour/2 {
						t.Logf("slow: moved %s waited %.0f sim min (%s wall) to run again on %s; reasons %v", name, 60*float64(d)/float64(simHour), d.Round(100*time.Millisecond), ps.node, ps.reasons)
					}
					s.movedAt = time.Time{}
				}
				if s.ran+now.Sub(ps.runningSince) >= time.Duration(j.Duration*float64(simHour)) {
					if err := m.scriptDelete(t.Context(), name); err != nil {
						t.Logf("%v; trying again", err) // a slow API server; the next tick retries
						continue
					}
					s.done = true
					finished++
				}
			}
		}
		select {
		case <-t.Context().Done():
			t.Fatal("cancelled during the day")
		case <-tick.C:
		}
	}
	dayEnd := time.Now()
	zero := zeroGPUNodes(t, c, 4*time.Minute)
	samples, over := m.stop()

	t.Logf("%s/%s/%s per simulated hour:\n%s", shape, simHour, config, hourlyAt(samples, began, zero, simHour))
	r.Day = integrate(samples, began, dayEnd, simHour)
	r.Idle = splitIdle(samples, began, dayEnd, simHour, func(typ string) int64 { return instanceGPUs(m.types[typ]) })
	t.Logf("%s/%s/%s %s", shape, simHour, config, r.Idle)
	r.Tail = integrate(samples, began, zero, simHour)
	simMin := func(d time.Duration) float64 { return 60 * float64(d) / float64(simHour) }
	slices.Sort(waits)
	t.Logf("%s/%s/%s WAITS (wall s, sorted) %s", shape, simHour, config, wallSeconds(waits))
	if n := len(waits); n > 0 {
		r.QueueP50, r.QueueP95, r.QueueMax = simMin(waits[n/2]), simMin(waits[min(n-1, (n*95)/100)]), simMin(waits[n-1])
	}
	if len(downs) > 0 {
		var sum time.Duration
		for _, d := range downs {
			sum += d
		}
		r.MoveDowntime = simMin(sum / time.Duration(len(downs)))
	}
	r.OversubGPUHours, r.OversubJobs = over.gpuHours, len(over.jobs)
	r.Nodes = m.launched()
	r.LoadAfter = loadavg()
	keepCostLogs(t, c, shape+"-"+simHour.String()+"-"+config)
	return r
}

// wallSeconds lists ds in seconds to the hundredth, space separated.
func wallSeconds(ds []time.Duration) string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = strconv.FormatFloat(d.Seconds(), 'f', 2, 64)
	}
	return strings.Join(out, " ")
}

// keepCostLogs copies the run's component logs (the coordinator's among
// them) to $GPUFRAC_COMPARE_LOGS/name when that is set: the cluster's own
// directory goes when the run passes.
func keepCostLogs(t *testing.T, c *cluster.Cluster, name string) {
	dir := os.Getenv("GPUFRAC_COMPARE_LOGS")
	if dir == "" {
		return
	}
	dst := filepath.Join(dir, name)
	if err := os.CopyFS(dst, os.DirFS(c.LogDir())); err != nil {
		t.Logf("keeping the logs in %s: %v", dst, err)
		return
	}
	t.Logf("logs kept in %s", dst)
}

// createCostPod creates a job's pod, trying three times: one API request
// that times out on the shared machine should not end an hour's run.
func createCostPod(t *testing.T, c *cluster.Cluster, p *corev1.Pod) {
	t.Helper()
	var err error
	for try := 0; try < 3; try++ {
		_, err = c.Client.CoreV1().Pods("default").Create(t.Context(), p, metav1.CreateOptions{})
		if err == nil || apierrors.IsAlreadyExists(err) {
			return
		}
		t.Logf("creating pod %s (try %d): %v", p.Name, try+1, err)
	}
	t.Fatalf("creating pod %s: %v", p.Name, err)
}

// costMeter samples the cluster every second of wall time: the GPU nodes
// (GPUs and price from their instance type), the jobs running (what they
// need, whatever they asked for), and in (b) which GPU each replica got.
type costMeter struct {
	c       *cluster.Cluster
	config  string
	types   map[string]cluster.InstanceType
	all     []cluster.InstanceType
	simHour time.Duration
	nodes   corelisters.NodeLister
	pods    corelisters.PodLister
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	factory informers.SharedInformerFactory

	// mu guards the fields below.
	mu       sync.Mutex
	samples  []daySample
	pod      map[string]*costPodState // pod name -> what became of it
	deleted  map[string]bool          // pod name -> the script deleted it
	nodeType map[string]string        // node name -> instance type, every GPU node seen
	over     oversub
}

type costPodState struct {
	seen         time.Time // when the meter first saw the pod
	reasons      []string  // PodScheduled=False reasons seen, in order, with when (since seen)
	boundAfter   time.Duration
	node         string
	runningSince time.Time
	failed       string
	disrupted    bool
	causes       []string
}

type oversub struct {
	gpuHours float64
	jobs     map[string]bool
}

func startCostMeter(t *testing.T, c *cluster.Cluster, config string, types []cluster.InstanceType, simHour time.Duration) *costMeter {
	t.Helper()
	m := &costMeter{c: c, config: config, types: map[string]cluster.InstanceType{}, all: cluster.DefaultInstanceTypes(), simHour: simHour,
		pod: map[string]*costPodState{}, deleted: map[string]bool{}, nodeType: map[string]string{}, over: oversub{jobs: map[string]bool{}}}
	for _, it := range types {
		m.types[it.Name] = it
	}
	ctx, cancel := context.WithCancel(t.Context())
	m.cancel = cancel
	m.factory = informers.NewSharedInformerFactory(c.Client, 0)
	nodeInf, podInf := m.factory.Core().V1().Nodes(), m.factory.Core().V1().Pods()
	m.nodes, m.pods = nodeInf.Lister(), podInf.Lister()
	if _, err := podInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    m.onPod,
		UpdateFunc: func(_, obj any) { m.onPod(obj) },
		DeleteFunc: m.onPodDelete,
	}); err != nil {
		t.Fatal(err)
	}
	m.factory.Start(ctx.Done())
	m.factory.WaitForCacheSync(ctx.Done())
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		tick := time.NewTicker(daySampleEvery)
		defer tick.Stop()
		prev := time.Now()
		for {
			now := time.Now()
			m.sample(now, now.Sub(prev))
			prev = now
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { m.stop() })
	return m
}

func isCostPod(p *corev1.Pod) bool { return p.Namespace == "default" && p.Labels["e2e"] == "cost" }

func (m *costMeter) onPod(obj any) {
	p, ok := obj.(*corev1.Pod)
	if !ok || !isCostPod(p) {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.podLocked(p.Name)
	now := time.Now()
	if s.seen.IsZero() {
		s.seen = now
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason != "" &&
			(len(s.reasons) == 0 || !strings.HasPrefix(s.reasons[len(s.reasons)-1], c.Reason+"@")) {
			s.reasons = append(s.reasons, fmt.Sprintf("%s@%.1fs", c.Reason, now.Sub(s.seen).Seconds()))
		}
	}
	if p.Spec.NodeName != "" && s.node == "" {
		s.boundAfter = now.Sub(s.seen)
	}
	if p.Spec.NodeName != "" {
		s.node = p.Spec.NodeName
	}
	if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil && s.runningSince.IsZero() {
		s.runningSince = time.Now()
	}
	if p.Status.Phase == corev1.PodFailed && s.failed == "" {
		s.failed = p.Status.Reason + ": " + p.Status.Message
	}
	if p.DeletionTimestamp != nil && !m.deleted[p.Name] && !s.disrupted {
		s.disrupted = true
		s.causes = append(s.causes, "deletion requested")
	}
	for _, c := range p.Status.Conditions {
		// Who disrupted it: EvictionByEvictionAPI (consolidation, Karpenter),
		// DeletionByTaintManager (a NoExecute taint), PreemptionByScheduler.
		if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue && !slices.Contains(s.causes, c.Reason) {
			s.causes = append(s.causes, c.Reason)
		}
	}
}

func (m *costMeter) onPodDelete(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	p, ok := obj.(*corev1.Pod)
	if !ok || !isCostPod(p) {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.podLocked(p.Name)
	if !m.deleted[p.Name] && !s.disrupted {
		s.disrupted = true
		s.causes = append(s.causes, "deleted")
	}
}

func (m *costMeter) podLocked(name string) *costPodState {
	s := m.pod[name]
	if s == nil {
		s = &costPodState{}
		m.pod[name] = s
	}
	return s
}

func (m *costMeter) state(name string) costPodState {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.pod[name]; s != nil {
		return *s
	}
	return costPodState{}
}

func (m *costMeter) scriptDelete(ctx context.Context, name string) error {
	m.mu.Lock()
	m.deleted[name] = true
	m.mu.Unlock()
	err := m.c.Client.CoreV1().Pods("default").Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting %s: %w", name, err)
	}
	return nil
}

// sample records one instant; held is the time since the previous sample
// (for the oversubscription integral).
func (m *costMeter) sample(now time.Time, held time.Duration) {
	s := daySample{At: now}
	nodes, _ := m.nodes.List(labels.SelectorFromSet(labels.Set{api.LabelGPUNode: "true"}))
	pods, _ := m.pods.List(labels.SelectorFromSet(labels.Set{"e2e": "cost"}))
	var fractions []int64
	var whole int64
	onNode := map[string]int64{}
	size := map[string]int{} // pod name -> percent of a GPU it needs
	for _, p := range pods {
		if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
			continue
		}
		n, _ := strconv.Atoi(p.Labels[costLabelSize])
		size[p.Name] = n
		s.Running++
		s.Demand += int64(n)
		onNode[p.Spec.NodeName] += int64(n)
		if n >= 100 {
			whole++
		} else {
			fractions = append(fractions, int64(n))
		}
	}
	// (b): which GPU each replica got, from the kubelet's allocations.
	var overGPUs int
	overJobs := map[string]bool{}
	if m.config == configTimeslice {
		for _, n := range nodes {
			a := m.c.NodeAgent(n.Name)
			if a == nil {
				continue
			}
			perGPU := map[string][]string{} // GPU UUID -> pods on it
			for _, al := range a.Kubelet.Allocations() {
				if al.Resource != api.DefaultTimesliceResource || size[al.Pod.Name] == 0 {
					continue
				}
				for _, id := range al.DeviceIDs {
					g, _, _ := strings.Cut(id, "::")
					perGPU[g] = append(perGPU[g], al.Pod.Name)
				}
			}
			for _, ps := range perGPU {
				sum := 0
				for _, p := range ps {
					sum += size[p]
				}
				if sum > 100 {
					overGPUs++
					for _, p := range ps {
						overJobs[p] = true
					}
				}
			}
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, n := range nodes {
		typ := n.Labels[corev1.LabelInstanceTypeStable]
		g := instanceGPUs(m.types[typ])
		if g == 0 {
			q := n.Status.Allocatable[api.ResourceGPU]
			g = q.Value()
		}
		s.Nodes++
		s.GPUs += g
		s.Price += m.types[typ].Price
		if onNode[n.Name] == 0 {
			s.IdleGPUs += g
		}
		s.PerNode = append(s.PerNode, nodeLoad{Node: n.Name, Type: typ, Demand: onNode[n.Name]})
		m.nodeType[n.Name] = typ
	}
	s.Bound = (s.Demand + 99) / 100
	s.BoundNodes = fewestNodes(s.Bound, m.all)
	_, s.BoundPrice = cheapestMix(int(s.Bound), m.all)
	s.Packed = ffd(fractions, whole)
	m.samples = append(m.samples, s)
	m.over.gpuHours += float64(overGPUs) * float64(held) / float64(m.simHour)
	for p := range overJobs {
		job := p[:strings.LastIndex(p, "-")]
		m.over.jobs[job] = true
	}
}

// stop ends the sampler and returns the samples and the oversubscription.
func (m *costMeter) stop() ([]daySample, oversub) {
	m.cancel()
	m.wg.Wait()
	m.factory.Shutdown()
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.samples), m.over
}

// nodeAge says when a node was created relative to t (the API's
// timestamps are whole seconds).
func (m *costMeter) nodeAge(name string, t time.Time) string {
	n, err := m.nodes.Get(name)
	if err != nil {
		return "node gone"
	}
	return fmt.Sprintf("node created %+.0fs from the pod", n.CreationTimestamp.Sub(t).Seconds())
}

// launched counts the GPU nodes seen, by instance type.
func (m *costMeter) launched() map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]int{}
	for _, typ := range m.nodeType {
		out[typ]++
	}
	return out
}

func TestCostDay(t *testing.T) {
	for _, shape := range []string{"peak", "tail"} {
		a, b := costDay(shape, costSeed), costDay(shape, costSeed)
		if len(a) != len(b) || len(a) < 20 {
			t.Fatalf("%s: %d and %d jobs", shape, len(a), len(b))
		}
		for i := range a {
			if a[i] != b[i] {
				t.Fatalf("%s: the same seed gave two days at job %d", shape, i)
			}
		}
	}
	peak, tail := costDay("peak", costSeed), costDay("tail", costSeed)
	if len(peak) != len(tail) {
		t.Fatalf("the shapes differ in jobs: %d and %d", len(peak), len(tail))
	}
	var longer, whole, protected int
	for i := range peak {
		if peak[i].Arrival != tail[i].Arrival || peak[i].Size != tail[i].Size {
			t.Errorf("job %d differs between shapes beyond its duration", i)
		}
		if tail[i].Duration > peak[i].Duration {
			longer++
		}
		if peak[i].Whole {
			whole++
			if peak[i].Protected {
				protected++
			}
		} else if peak[i].Size < 10 || peak[i].Size > 60 || peak[i].Size%10 != 0 {
			t.Errorf("job %d asks %d%%", i, peak[i].Size)
		}
	}
	if whole != 4 || protected != 2 {
		t.Errorf("%d whole jobs, %d protected; want 4 and 2", whole, protected)
	}
	if longer == 0 || longer > len(peak)/2 {
		t.Errorf("%d of %d jobs run longer in the tail shape", longer, len(peak))
	}
	// The ideal bound: never less than the exact demand, never more than one GPU per job.
	b := idealBound(peak, cluster.DefaultInstanceTypes())
	var demand, oneEach float64
	for _, j := range peak {
		demand += float64(j.Size) / 100 * j.Duration
		oneEach += j.Duration
	}
	if b.GPUHours < demand-1e-9 || b.GPUHours > oneEach+1e-9 {
		t.Errorf("bound %.2f GPU-h outside [%.2f demand, %.2f one GPU each]", b.GPUHours, demand, oneEach)
	}
	for _, shape := range []string{"peak", "tail"} {
		jobs := costDay(shape, costSeed)
		b := idealBound(jobs, cluster.DefaultInstanceTypes())
		var d, one float64
		for _, j := range jobs {
			d += float64(j.Size) / 100 * j.Duration
			one += j.Duration
		}
		t.Logf("%s day: %d jobs over %.1f sim h; demand %.1f GPU-h, FFD bound %.1f GPU-h ($%.0f), one GPU per job %.1f GPU-h",
			shape, len(jobs), b.Hours, d, b.GPUHours, b.Dollars, one)
	}
}

func TestIdealBound(t *testing.T) {
	jobs := []costJob{
		{Arrival: 0, Duration: 2, Size: 40},
		{Arrival: 0, Duration: 2, Size: 40},
		{Arrival: 1, Duration: 1, Size: 40}, // three 40% for an hour: two GPUs
		{Arrival: 3, Duration: 1, Size: 100, Whole: true},
	}
	b := idealBound(jobs, cluster.DefaultInstanceTypes())
	want := costBound{Hours: 4, GPUHours: 1 + 2 + 1, Dollars: 14.19 + 2*14.19 + 14.19}
	if math.Abs(b.GPUHours-want.GPUHours) > 1e-9 || math.Abs(b.Dollars-want.Dollars) > 1e-9 || b.Hours != want.Hours {
		t.Errorf("idealBound = %+v, want %+v", b, want)
	}
}
