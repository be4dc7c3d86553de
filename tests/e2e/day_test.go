package e2e

// Issue 5's measurement: how many GPU-node-hours gpufrac and Karpenter use
// against the packing lower bound, and how many protected pods get disrupted
// (must be none). Runs on the local cluster with Karpenter's kwok provider,
// the instance types 1×H100 ($14.19/h) and 8×H100 ($98.32/h), a NodePool with
// consolidationPolicy WhenEmptyOrUnderutilized and a short consolidateAfter,
// and the coordinator with a short --reservation-grace:
//
//   - TestKarpenterFiguresScenario1: ten 40% fractions in a queue, no capacity.
//   - TestKarpenterFiguresDay: a scripted day compressed in time (daySimHour of
//     wall time per simulated hour): seeded fraction jobs arriving with a daily
//     peak, a few whole-GPU jobs, each running its length once it runs.
//   - TestKarpenterFiguresDayOneGPUNodes: the same day with 1×H100 nodes only.
//
// A meter samples every second what exists (GPU nodes, their GPUs from
// allocatable, their price from the instance type) and what runs (the script's
// pods in phase Running), and watches pod deletions and eviction events:
//
//	go test ./tests/e2e -run 'TestKarpenterFigures' -v -count=1 -timeout 40m 2>&1 | grep -A70 'FIGURES'
//
// The latest figures are in docs/benchmarks.md, "Karpenter interworking"; every run
// and the analysis in docs/benchmarks-history.md, same section.

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/google/go-cmp/cmp"
	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/tests/cluster"
)

const (
	// daySimHour is the wall time of one simulated hour.
	daySimHour = 10 * time.Second
	// daySampleEvery is the meter's sampling period (wall time).
	daySampleEvery = time.Second
	// dayReservationGrace is the coordinator's --reservation-grace.
	dayReservationGrace = 5 * time.Second
	// dayConsolidateAfter is the NodePool's consolidateAfter.
	dayConsolidateAfter = 5 * time.Second
	// daySeed seeds the day's schedule.
	daySeed = 1

	// dayArrivalEnd is the simulated hour after which no job arrives.
	dayArrivalEnd = 21.0
	// dayBaseRate and dayPeakRate are fraction-job arrivals per simulated
	// hour: base all day, plus a Gaussian peak of height dayPeakRate at
	// dayPeakHour with standard deviation dayPeakWidth hours.
	dayBaseRate, dayPeakRate  = 1.5, 7.5
	dayPeakHour, dayPeakWidth = 14.0, 3.0
	// dayMinDuration and dayMaxDuration bound a fraction job's running time
	// (simulated hours, uniform).
	dayMinDuration, dayMaxDuration = 0.5, 3.0
	// dayWholeJobs is how many one-GPU whole-GPU jobs arrive, uniformly
	// between dayWholeFrom and dayWholeTo, each running 1.5 to 4 simulated hours.
	dayWholeJobs                = 6
	dayWholeFrom, dayWholeTo    = 7.0, 19.0
	dayWholeMinDur, dayWholeMax = 1.5, 4.0

	// scenario1Hold is how long (simulated hours) the ten fractions of
	// scenario 1 run once all ten run.
	scenario1Hold = 3.0
	// scenario1ScaleUpLimit is how long the ten may take to run: Karpenter
	// and the node agent need seconds, so more is a defect worth its logs.
	scenario1ScaleUpLimit = time.Minute
)

// daySizes is the fraction mix, drawn uniformly.
func daySizes() []int { return []int{10, 20, 30, 40, 50, 60} }

// dayJob is one job of the scripted day.
type dayJob struct {
	Name string
	// Arrival is when the pod is created, simulated hours from the start.
	Arrival float64
	// Duration is how long the job runs once its pod runs (simulated hours).
	Duration float64
	// Fraction is percent of one GPU; GPUs is whole GPUs. One is zero.
	Fraction, GPUs int
	// NonPreemptible marks the pod gpufrac.io/preemptible=false.
	NonPreemptible bool
}

// dayArrivalRate is the fraction jobs' arrival rate at simulated hour h.
func dayArrivalRate(h float64) float64 {
	z := (h - dayPeakHour) / dayPeakWidth
	return dayBaseRate + dayPeakRate*math.Exp(-z*z/2)
}

// daySchedule draws the day from seed: fraction jobs as a non-homogeneous
// Poisson process (thinning), sizes from daySizes, and dayWholeJobs whole-GPU
// jobs, every other one non-preemptible. Sorted by arrival.
func daySchedule(seed uint64) []dayJob {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	sizes := daySizes()
	maxRate := dayBaseRate + dayPeakRate
	var jobs []dayJob
	for h := 0.0; ; {
		h += rng.ExpFloat64() / maxRate
		if h >= dayArrivalEnd {
			break
		}
		if rng.Float64()*maxRate > dayArrivalRate(h) {
			continue
		}
		jobs = append(jobs, dayJob{
			Arrival:  h,
			Duration: dayMinDuration + (dayMaxDuration-dayMinDuration)*rng.Float64(),
			Fraction: sizes[rng.IntN(len(sizes))],
		})
	}
	for i := 0; i < dayWholeJobs; i++ {
		jobs = append(jobs, dayJob{
			Arrival:        dayWholeFrom + (dayWholeTo-dayWholeFrom)*rng.Float64(),
			Duration:       dayWholeMinDur + (dayWholeMax-dayWholeMinDur)*rng.Float64(),
			GPUs:           1, // a 1×H100 node holds it, so every NodePool below can run the day
			NonPreemptible: i%2 == 0,
		})
	}
	sort.SliceStable(jobs, func(i, j int) bool { return jobs[i].Arrival < jobs[j].Arrival })
	for i := range jobs {
		kind := "frac"
		if jobs[i].GPUs > 0 {
			kind = "whole"
		}
		jobs[i].Name = fmt.Sprintf("day-%03d-%s", i, kind)
	}
	return jobs
}

// cheapestMix is the cheapest set of GPU instance types holding at least
// gpus GPUs: its node count and its price per hour (fewer nodes on a tie).
func cheapestMix(gpus int, types []cluster.InstanceType) (nodes int, price float64) {
	type best struct {
		nodes int
		price float64
	}
	dp := make([]best, gpus+1) // GPUs -> the cheapest mix with at least that many
	for g := 1; g <= gpus; g++ {
		dp[g] = best{price: math.Inf(1)}
		for _, it := range types {
			n := instanceGPUs(it)
			if n == 0 {
				continue
			}
			prev := dp[max(0, g-int(n))]
			cand := best{nodes: prev.nodes + 1, price: prev.price + it.Price}
			if cand.price < dp[g].price-1e-9 || (math.Abs(cand.price-dp[g].price) <= 1e-9 && cand.nodes < dp[g].nodes) {
				dp[g] = cand
			}
		}
	}
	return dp[gpus].nodes, dp[gpus].price
}

func instanceGPUs(it cluster.InstanceType) int64 {
	q := it.Resources[api.ResourceGPU]
	return q.Value()
}

// fewestNodes is the fewest GPU nodes holding gpus GPUs: all of the largest type.
func fewestNodes(gpus int64, types []cluster.InstanceType) int {
	var largest int64
	for _, it := range types {
		largest = max(largest, instanceGPUs(it))
	}
	if largest == 0 || gpus <= 0 {
		return 0
	}
	return int((gpus + largest - 1) / largest)
}

// ffd is the GPUs a first-fit-decreasing packing of the fractions (percent)
// needs, plus the whole GPUs.
func ffd(fractions []int64, whole int64) int64 {
	fr := slices.Clone(fractions)
	slices.SortFunc(fr, func(a, b int64) int { return int(b - a) })
	var free []int64 // open GPU -> percent left
	for _, f := range fr {
		i := slices.IndexFunc(free, func(left int64) bool { return left >= f })
		if i < 0 {
			free = append(free, api.UnitsPerGPU)
			i = len(free) - 1
		}
		free[i] -= f
	}
	return int64(len(free)) + whole
}

// daySample is what the meter saw at one instant.
type daySample struct {
	At time.Time
	// Nodes, GPUs and Price ($/hour) of the GPU nodes that exist.
	Nodes int
	GPUs  int64
	Price float64
	// Demand is the running script pods' GPU demand in percent of a GPU
	// (fractions plus 100 per whole GPU).
	Demand int64
	// Running is how many script pods run.
	Running int
	// Bound is ceil(Demand/100) GPUs, the packing lower bound; BoundNodes
	// is the fewest nodes holding Bound GPUs (all of the largest type) and
	// BoundPrice the price of the cheapest instance mix holding them.
	Bound      int64
	BoundNodes int
	BoundPrice float64
	// Packed is the GPUs of a first-fit-decreasing packing of what runs: an
	// achievable packing, at least Bound (40% pods fit two per GPU).
	Packed int64
	// IdleGPUs are the GPUs of nodes no running script pod uses (nodes
	// coming up, or waiting for reservation grace and consolidation).
	IdleGPUs int64
	// PerNode is each GPU node's running script demand.
	PerNode []nodeLoad
	// Placeholders and Reservations count gpufrac's system pods.
	Placeholders, Reservations int
}

// nodeLoad is one GPU node's running script demand (percent of a GPU).
type nodeLoad struct {
	Node, Type string
	Demand     int64
}

// dayFigures are the integrals of the samples over a window, in simulated hours.
type dayFigures struct {
	Hours                                 float64
	NodeHours, GPUHours, Dollars          float64
	DemandGPUHours                        float64 // Σ exact demand, fractions unrounded
	BoundGPUHours, BoundNodeHours, BoundD float64 // the packing lower bound
	PackedGPUHours                        float64 // Σ first-fit-decreasing packing
	IdleGPUHours                          float64 // GPUs of nodes running no script pod
}

// integrate holds each sample until the next one (the last until to) and
// sums over [from, to), in simulated hours of simHour wall time each.
func integrate(samples []daySample, from, to time.Time, simHour time.Duration) dayFigures {
	var f dayFigures
	if !to.After(from) {
		return f
	}
	f.Hours = float64(to.Sub(from)) / float64(simHour)
	eachHeld(samples, from, to, simHour, func(s daySample, h float64) {
		f.NodeHours += float64(s.Nodes) * h
		f.GPUHours += float64(s.GPUs) * h
		f.Dollars += s.Price * h
		f.DemandGPUHours += float64(s.Demand) / 100 * h
		f.BoundGPUHours += float64(s.Bound) * h
		f.BoundNodeHours += float64(s.BoundNodes) * h
		f.BoundD += s.BoundPrice * h
		f.PackedGPUHours += float64(s.Packed) * h
		f.IdleGPUHours += float64(s.IdleGPUs) * h
	})
	return f
}

// eachHeld calls f with each sample and the simulated hours it is held
// within [from, to): until the next sample, the last until to.
func eachHeld(samples []daySample, from, to time.Time, simHour time.Duration, f func(s daySample, h float64)) {
	for i, s := range samples {
		end := to
		if i+1 < len(samples) && samples[i+1].At.Before(to) {
			end = samples[i+1].At
		}
		begin := s.At
		if begin.Before(from) {
			begin = from
		}
		if end.After(begin) {
			f(s, float64(end.Sub(begin))/float64(simHour))
		}
	}
}

func ratio(used, bound float64) string {
	if bound == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", used/bound)
}

// row renders the figures as one line of a markdown table.
func (f dayFigures) row(window string) string {
	return fmt.Sprintf("| %s | %.2f | %.2f / %.2f = %s | %.2f / %.2f = %s | $%.0f / $%.0f = %s | %.2f (%s) | %.2f | %.2f |",
		window, f.Hours,
		f.GPUHours, f.BoundGPUHours, ratio(f.GPUHours, f.BoundGPUHours),
		f.NodeHours, f.BoundNodeHours, ratio(f.NodeHours, f.BoundNodeHours),
		f.Dollars, f.BoundD, ratio(f.Dollars, f.BoundD),
		f.PackedGPUHours, ratio(f.GPUHours, f.PackedGPUHours),
		f.IdleGPUHours, f.DemandGPUHours)
}

const figuresHeader = "| window | sim h | GPU-h used / bound | node-h used / bound | $ used / bound | GPU-h FFD packing (used/it) | GPU-h on idle nodes | GPU-h demanded |\n|---|---|---|---|---|---|---|---|"

// disruption is a script pod that went away, or was told to, without the script.
type disruption struct {
	Pod       string
	Protected bool
	Causes    []string
}

// meter samples the cluster and records disruptions of the script's pods
// (namespace default, label e2e=yes).
type meter struct {
	c       *cluster.Cluster
	types   map[string]cluster.InstanceType // instance type name -> type
	all     []cluster.InstanceType
	nodes   corelisters.NodeLister
	pods    corelisters.PodLister
	scripts labels.Selector

	// mu guards the fields below it.
	mu              sync.Mutex
	samples         []daySample
	scriptDeleted   map[string]bool        // pod name -> the script deleted it
	runningSince    map[string]time.Time   // pod name -> first seen Running
	gone            map[string]bool        // pod name -> deleted (by anyone)
	failed          map[string]string      // pod name -> why it failed
	disrupted       map[string]*disruption // pod name -> what disrupted it
	events          map[string]int         // event reason -> events seen
	terminations    []string               // Karpenter's disruption decisions and refusals
	reservationHits []string               // evictions of reservation pods
	nodeLife        map[string]*nodeLife   // node name -> when it was seen
}

// nodeLife is one GPU node's time in the samples.
type nodeLife struct {
	Type        string
	First, Last time.Time
}

// watchedReasons are the event reasons the meter counts. Evicted and
// Disrupted (Karpenter), Reclaimed (coordinator) and Preempted
// (kube-scheduler) on a script pod are disruptions.
func watchedReasons() map[string]bool {
	return map[string]bool{
		"Evicted": true, "Disrupted": true, "Reclaimed": true, "Preempted": true,
		"DisruptionTerminating": true, "DisruptionLaunching": true, "DisruptionBlocked": true,
		"Unconsolidatable": true, "ReservationRemoved": true, "Nominated": true,
	}
}

// startMeter starts informers and the sampler; the returned stop ends the
// sampler and waits for it.
func startMeter(t *testing.T, c *cluster.Cluster, types []cluster.InstanceType) (*meter, func()) {
	t.Helper()
	m := &meter{
		c: c, types: map[string]cluster.InstanceType{}, all: types,
		scripts:       labels.SelectorFromSet(labels.Set{"e2e": "yes"}),
		scriptDeleted: map[string]bool{}, runningSince: map[string]time.Time{}, gone: map[string]bool{},
		failed: map[string]string{}, disrupted: map[string]*disruption{}, events: map[string]int{},
		nodeLife: map[string]*nodeLife{},
	}
	for _, it := range types {
		m.types[it.Name] = it
	}
	ctx, cancel := context.WithCancel(t.Context())
	factory := informers.NewSharedInformerFactory(c.Client, 0)
	nodeInf := factory.Core().V1().Nodes()
	podInf := factory.Core().V1().Pods()
	eventInf := factory.Core().V1().Events()
	m.nodes, m.pods = nodeInf.Lister(), podInf.Lister()
	if _, err := podInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { m.onPod(nil, obj) },
		UpdateFunc: m.onPod,
		DeleteFunc: m.onPodDelete,
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := eventInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: m.onEvent}); err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			cancel()
			t.Fatalf("meter: %v informer did not sync", typ)
		}
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(daySampleEvery)
		defer tick.Stop()
		for {
			m.sample(time.Now())
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	stop := func() {
		cancel()
		wg.Wait()
		factory.Shutdown()
	}
	t.Cleanup(stop)
	return m, stop
}

func (m *meter) isScriptPod(p *corev1.Pod) bool {
	return p.Namespace == "default" && m.scripts.Matches(labels.Set(p.Labels))
}

func (m *meter) onPod(_, obj any) {
	p, ok := obj.(*corev1.Pod)
	if !ok || !m.isScriptPod(p) {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
		if _, seen := m.runningSince[p.Name]; !seen {
			m.runningSince[p.Name] = time.Now()
		}
	}
	if p.Status.Phase == corev1.PodFailed && m.failed[p.Name] == "" {
		m.failed[p.Name] = fmt.Sprintf("%s: %s", p.Status.Reason, p.Status.Message)
	}
	if p.DeletionTimestamp != nil && !m.scriptDeleted[p.Name] {
		m.disruptLocked(p, "deletion requested")
	}
}

func (m *meter) onPodDelete(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	p, ok := obj.(*corev1.Pod)
	if !ok || !m.isScriptPod(p) {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gone[p.Name] = true
	if !m.scriptDeleted[p.Name] {
		m.disruptLocked(p, "deleted")
	}
}

// disruptLocked records a cause of p's disruption; the caller holds mu.
func (m *meter) disruptLocked(p *corev1.Pod, cause string) {
	d := m.disrupted[p.Name]
	if d == nil {
		d = &disruption{Pod: p.Name, Protected: podDemand(p).fraction > 0 || p.Annotations[api.AnnotationPreemptible] == "false"}
		m.disrupted[p.Name] = d
	}
	if !slices.Contains(d.Causes, cause) {
		d.Causes = append(d.Causes, cause)
	}
}

func (m *meter) onEvent(obj any) {
	e, ok := obj.(*corev1.Event)
	if !ok || !watchedReasons()[e.Reason] {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.events[e.Reason]++
	if e.Reason == "DisruptionTerminating" || e.Reason == "DisruptionBlocked" || e.Reason == "Unconsolidatable" {
		m.terminations = append(m.terminations, e.Reason+" "+e.InvolvedObject.Kind+"/"+e.InvolvedObject.Name+": "+e.Message)
	}
	if e.InvolvedObject.Kind != "Pod" {
		return
	}
	switch e.Reason {
	case "Evicted", "Disrupted", "Reclaimed", "Preempted":
	default:
		return
	}
	if e.InvolvedObject.Namespace == api.ReservationNamespace && strings.HasPrefix(e.InvolvedObject.Name, api.ReservationNamePrefix) {
		m.reservationHits = append(m.reservationHits, e.InvolvedObject.Name+": "+e.Reason+": "+e.Message)
		return
	}
	if e.InvolvedObject.Namespace != "default" {
		return
	}
	p, err := m.pods.Pods("default").Get(e.InvolvedObject.Name)
	if err != nil {
		// Already gone: keep the cause under the name; protection unknown counts as protected.
		p = &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: e.InvolvedObject.Name, Namespace: "default", Annotations: map[string]string{api.AnnotationPreemptible: "false"}}}
	} else if !m.isScriptPod(p) {
		return
	}
	m.disruptLocked(p, e.Reason+" event: "+e.Message)
}

// demand is a pod's GPU request.
type demand struct{ fraction, gpus int64 }

func podDemand(p *corev1.Pod) demand {
	var d demand
	for _, c := range p.Spec.Containers {
		if q, ok := c.Resources.Requests[api.ResourceFraction]; ok {
			d.fraction += q.Value()
		}
		if q, ok := c.Resources.Requests[api.ResourceGPU]; ok {
			d.gpus += q.Value()
		}
	}
	return d
}

// sample records one instant.
func (m *meter) sample(now time.Time) {
	s := daySample{At: now}
	nodes, _ := m.nodes.List(labels.SelectorFromSet(labels.Set{api.LabelGPUNode: "true"}))
	pods, _ := m.pods.List(labels.Everything())
	m.mu.Lock()
	defer m.mu.Unlock()
	var fractions []int64
	var whole int64
	onNode := map[string]int64{} // node name -> running script pods' demand in percent
	for _, p := range pods {
		if p.Namespace == api.ReservationNamespace && p.DeletionTimestamp == nil {
			switch p.Labels[api.LabelRole] {
			case api.RolePlaceholder:
				s.Placeholders++
			case api.RoleReservation:
				s.Reservations++
			}
		}
		if !m.isScriptPod(p) || p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
			continue
		}
		d := podDemand(p)
		s.Running++
		s.Demand += d.fraction + 100*d.gpus
		onNode[p.Spec.NodeName] += d.fraction + 100*d.gpus
		if d.fraction > 0 {
			fractions = append(fractions, d.fraction)
		}
		whole += d.gpus
	}
	for _, n := range nodes {
		typ := n.Labels[corev1.LabelInstanceTypeStable]
		it := m.types[typ]
		gpus := n.Status.Allocatable[api.ResourceGPU]
		g := gpus.Value()
		if g == 0 {
			g = instanceGPUs(it) // before the node agent publishes
		}
		s.Nodes++
		s.GPUs += g
		s.Price += it.Price
		if onNode[n.Name] == 0 {
			s.IdleGPUs += g
		}
		s.PerNode = append(s.PerNode, nodeLoad{Node: n.Name, Type: typ, Demand: onNode[n.Name]})
		l := m.nodeLife[n.Name]
		if l == nil {
			l = &nodeLife{Type: typ, First: now}
			m.nodeLife[n.Name] = l
		}
		l.Last = now
	}
	s.Bound = (s.Demand + 99) / 100
	s.BoundNodes = fewestNodes(s.Bound, m.all)
	_, s.BoundPrice = cheapestMix(int(s.Bound), m.all)
	s.Packed = ffd(fractions, whole)
	m.samples = append(m.samples, s)
}

// markScriptDeleted records that the script, not anyone else, deletes name.
func (m *meter) markScriptDeleted(name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.scriptDeleted[name] = true
}

// state tells the script what became of a pod.
func (m *meter) state(name string) (runningSince time.Time, running bool, failed string, gone bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	runningSince, running = m.runningSince[name]
	return runningSince, running, m.failed[name], m.gone[name]
}

// snapshot copies the samples.
func (m *meter) snapshot() []daySample {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.samples)
}

// disruptions lists the disruptions of protected pods, and of the others.
func (m *meter) disruptions() (protected, other []disruption) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, d := range m.disrupted {
		if d.Protected {
			protected = append(protected, *d)
		} else {
			other = append(other, *d)
		}
	}
	sort.Slice(protected, func(i, j int) bool { return protected[i].Pod < protected[j].Pod })
	sort.Slice(other, func(i, j int) bool { return other[i].Pod < other[j].Pod })
	return protected, other
}

// report renders the meter's counters and node lifetimes since began.
func (m *meter) report(began time.Time) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var b strings.Builder
	reasons := make([]string, 0, len(m.events))
	for r := range m.events {
		reasons = append(reasons, r)
	}
	sort.Strings(reasons)
	fmt.Fprintf(&b, "events:")
	for _, r := range reasons {
		fmt.Fprintf(&b, " %s=%d", r, m.events[r])
	}
	fmt.Fprintf(&b, "\nreservation pods evicted by Karpenter/others: %d %v\n", len(m.reservationHits), m.reservationHits)
	fmt.Fprintf(&b, "failed script pods: %d %v\n", len(m.failed), m.failed)
	for _, msg := range m.terminations {
		fmt.Fprintf(&b, "karpenter %s\n", msg)
	}
	names := make([]string, 0, len(m.nodeLife))
	for n := range m.nodeLife {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return m.nodeLife[names[i]].First.Before(m.nodeLife[names[j]].First) })
	for _, n := range names {
		l := m.nodeLife[n]
		fmt.Fprintf(&b, "node %s %s: seen %.2f..%.2f sim h (%.1f s wall)\n", n, l.Type,
			float64(l.First.Sub(began))/float64(daySimHour), float64(l.Last.Sub(began))/float64(daySimHour), l.Last.Sub(l.First).Seconds())
	}
	return b.String()
}

// changes renders the samples whose counts differ from the previous one.
func changes(samples []daySample, began time.Time) string {
	var b strings.Builder
	var prev daySample
	for i, s := range samples {
		if i > 0 && s.Nodes == prev.Nodes && s.GPUs == prev.GPUs && s.Running == prev.Running && s.Bound == prev.Bound && s.Packed == prev.Packed &&
			s.Placeholders == prev.Placeholders && s.Reservations == prev.Reservations {
			continue
		}
		fmt.Fprintf(&b, "t=%6.1fs nodes=%d gpus=%d running=%d demand=%d%% bound=%d ffd=%d placeholders=%d reservations=%d\n",
			s.At.Sub(began).Seconds(), s.Nodes, s.GPUs, s.Running, s.Demand, s.Bound, s.Packed, s.Placeholders, s.Reservations)
		prev = s
	}
	return b.String()
}

// hourly renders the mean of each simulated hour's samples.
func hourly(samples []daySample, began, end time.Time) string {
	return hourlyAt(samples, began, end, daySimHour)
}

// hourlyAt is hourly with simHour of wall time per simulated hour.
func hourlyAt(samples []daySample, began, end time.Time, daySimHour time.Duration) string {
	var b strings.Builder
	b.WriteString("| sim hour | GPU nodes | GPUs | GPU bound | FFD GPUs | demand % | running pods | placeholders | reservations | demand % per node (type) |\n|---|---|---|---|---|---|---|---|---|---|\n")
	first := map[string]int{} // node name -> order of first appearance
	for _, s := range samples {
		for _, l := range s.PerNode {
			if _, ok := first[l.Node]; !ok {
				first[l.Node] = len(first)
			}
		}
	}
	for h := 0; began.Add(time.Duration(h) * daySimHour).Before(end); h++ {
		from := began.Add(time.Duration(h) * daySimHour)
		to := from.Add(daySimHour)
		var n, nodes, gpus, bound, packed, dem, run, ph, res float64
		perNode := map[string]float64{} // node name -> Σ demand over the hour's samples
		typeOf := map[string]string{}   // node name -> instance type
		for _, s := range samples {
			if s.At.Before(from) || !s.At.Before(to) {
				continue
			}
			n++
			nodes += float64(s.Nodes)
			gpus += float64(s.GPUs)
			bound += float64(s.Bound)
			packed += float64(s.Packed)
			dem += float64(s.Demand)
			run += float64(s.Running)
			ph += float64(s.Placeholders)
			res += float64(s.Reservations)
			for _, l := range s.PerNode {
				perNode[l.Node] += float64(l.Demand)
				typeOf[l.Node] = strings.TrimPrefix(strings.TrimSuffix(l.Type, "-h100"), "gpu-")
			}
		}
		if n == 0 {
			continue
		}
		names := make([]string, 0, len(perNode))
		for node := range perNode {
			names = append(names, node)
		}
		sort.Slice(names, func(i, j int) bool { return first[names[i]] < first[names[j]] })
		var loads []string
		for _, node := range names {
			loads = append(loads, fmt.Sprintf("#%d %s:%.0f", first[node]+1, typeOf[node], perNode[node]/n))
		}
		fmt.Fprintf(&b, "| %d | %.1f | %.1f | %.1f | %.1f | %.0f | %.1f | %.1f | %.1f | %s |\n", h, nodes/n, gpus/n, bound/n, packed/n, dem/n, run/n, ph/n, res/n, strings.Join(loads, " "))
	}
	return b.String()
}

// figuresCluster starts the cluster with the measured NodePool, which may
// launch instanceTypes, a queue with quota GPUs, and the coordinator with the
// short reservation grace.
func figuresCluster(t *testing.T, queue string, quota int, instanceTypes ...string) *cluster.Cluster {
	t.Helper()
	// These are measurements (several minutes each), run on demand for
	// docs/benchmarks.md, not in every make test.
	if os.Getenv("GPUFRAC_FIGURES") == "" {
		t.Skip("measurement: set GPUFRAC_FIGURES=1 to run (see docs/benchmarks.md, Karpenter interworking)")
	}
	pool := cluster.NodePool{
		Name: "gpu", Labels: map[string]string{api.LabelGPUNode: "true"},
		InstanceTypes:       instanceTypes,
		ConsolidationPolicy: "WhenEmptyOrUnderutilized",
		ConsolidateAfter:    dayConsolidateAfter,
	}
	c := karpenterCluster(t, pool)
	applyYAML(t, c, queuesYAML(map[string]string{queue: fmt.Sprint(quota)}))
	startCoordinator(t, c, "c1", "--leader-elect=false", "--reservation-grace="+dayReservationGrace.String())
	return c
}

// deleteByScript deletes a script pod, telling the meter first.
func deleteByScript(ctx context.Context, c *cluster.Cluster, m *meter, name string) error {
	m.markScriptDeleted(name)
	err := c.Client.CoreV1().Pods("default").Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting %s: %w", name, err)
	}
	return nil
}

// zeroGPUNodes waits until no GPU node is left and returns when that was seen.
func zeroGPUNodes(t *testing.T, c *cluster.Cluster, limit time.Duration) time.Time {
	t.Helper()
	waitFor(t, limit, "zero GPU nodes", func(ctx context.Context) (bool, error) {
		return len(gpuNodes(t, c)) == 0, nil
	})
	return time.Now()
}

// checkDisruptions fails the test on any protected-pod disruption and logs the others.
func checkDisruptions(t *testing.T, m *meter) (protected, other int) {
	t.Helper()
	p, o := m.disruptions()
	for _, d := range p {
		t.Errorf("protected pod %s disrupted: %v", d.Pod, d.Causes)
	}
	for _, d := range o {
		t.Logf("preemptible pod %s disrupted: %v", d.Pod, d.Causes)
	}
	return len(p), len(o)
}

// Scenario 1 measured: ten 40% fractions, no capacity; Karpenter provisions,
// all ten run for scenario1Hold simulated hours, then end, and the cluster
// returns to zero GPU nodes.
func TestKarpenterFiguresScenario1(t *testing.T) {
	c := figuresCluster(t, "team-a", 8, "gpu-8x-h100", "gpu-1x-h100")
	types := cluster.DefaultInstanceTypes()
	m, stopMeter := startMeter(t, c, types)

	submitted := time.Now()
	names := tenFractions(t, c)
	pods := running(t, c, 3*time.Minute, names...)
	allRunning := time.Now()
	planned := checkGiven(t, c, pods)
	// The hold is the jobs' length, part of the workload being measured, not
	// a wait for a condition.
	hold := time.Duration(scenario1Hold * float64(daySimHour))
	select {
	case <-t.Context().Done():
		t.Fatal("cancelled while holding the fractions")
	case <-time.After(hold):
	}
	ended := time.Now()
	for _, n := range names {
		if err := deleteByScript(t.Context(), c, m, n); err != nil {
			t.Fatal(err)
		}
	}
	zero := zeroGPUNodes(t, c, 3*time.Minute)
	stopMeter()

	samples := m.snapshot()
	windows := []struct {
		name     string
		from, to time.Time
	}{
		{"all ten running → they end", allRunning, ended},
		{"submitted → they end (with scale-up)", submitted, ended},
		{"submitted → zero GPU nodes (with scale-down tail)", submitted, zero},
	}
	var b strings.Builder
	fmt.Fprintf(&b, "FIGURES scenario 1 (1 sim h = %s wall, reservation grace %s, consolidateAfter %s)\n", daySimHour, dayReservationGrace, dayConsolidateAfter)
	fmt.Fprintf(&b, "scale-up: submitted → all ten running %.1f s wall (%.2f sim h); ended → zero GPU nodes %.1f s wall (%.2f sim h)\n",
		allRunning.Sub(submitted).Seconds(), float64(allRunning.Sub(submitted))/float64(daySimHour),
		zero.Sub(ended).Seconds(), float64(zero.Sub(ended))/float64(daySimHour))
	b.WriteString(figuresHeader + "\n")
	for _, w := range windows {
		f := integrate(samples, w.from, w.to, daySimHour)
		b.WriteString(f.row(w.name) + "\n")
		if f.GPUHours+1e-9 < f.BoundGPUHours {
			t.Errorf("%s: used %.3f GPU-h below the lower bound %.3f: the meter is wrong", w.name, f.GPUHours, f.BoundGPUHours)
		}
	}
	prot, other := checkDisruptions(t, m)
	fmt.Fprintf(&b, "protected-pod disruptions: %d; other script-pod disruptions: %d\n", prot, other)
	fmt.Fprintf(&b, "planned load per GPU (gpufrac.io/gpu annotations, %%): %v\n", planned)
	b.WriteString(m.report(submitted))
	b.WriteString(changes(samples, submitted))
	t.Log("\n" + b.String())
	if d := allRunning.Sub(submitted); d > scenario1ScaleUpLimit {
		t.Errorf("the ten fractions took %s to run, more than %s", d.Round(time.Second), scenario1ScaleUpLimit)
	}
}

// checkGiven checks the GPUs the kubelet gave the ten 40% fractions (the
// node agent's gpufrac.io/allocated-gpu): two per GPU, five GPUs, each held
// by one reservation. It returns the planned load per GPU from the
// coordinator's gpufrac.io/gpu annotations, which may differ: same-size
// fractions are interchangeable at admission.
func checkGiven(t *testing.T, c *cluster.Cluster, pods map[string]*corev1.Pod) map[string]int {
	t.Helper()
	given := map[string]int{}
	waitFor(t, 30*time.Second, "allocated-gpu write-back of the ten", func(ctx context.Context) (bool, error) {
		clear(given)
		for name := range pods {
			p, err := c.Client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
			if err != nil || p.Annotations[api.AnnotationAllocatedGPU] == "" {
				return false, nil
			}
			given[p.Spec.NodeName+"/"+p.Annotations[api.AnnotationAllocatedGPU]] += int(podDemand(p).fraction)
		}
		return true, nil
	})
	for g, pct := range given {
		if pct > 100 {
			t.Errorf("GPU %s was given %d%%", g, pct)
		}
	}
	if len(given) != 5 {
		t.Errorf("ten 40%% fractions were given %d GPUs, want 5: %v", len(given), given)
	}
	res := map[string]int{}
	for _, r := range systemPods(t, c, api.RoleReservation) {
		res[r.Spec.NodeName+"/"+r.Annotations[api.AnnotationReservedGPU]]++
	}
	for g := range given {
		if res[g] != 1 {
			t.Errorf("shared GPU %s has %d reservations, want 1 (all: %v)", g, res[g], res)
		}
	}
	planned := map[string]int{}
	for _, p := range pods {
		g := p.Annotations[api.AnnotationGPU]
		if len(g) > 12 {
			g = g[:12] // "GPU-" and 8 hex digits name it in the report
		}
		planned[g] += int(podDemand(p).fraction)
	}
	return planned
}

// The scripted day: seeded fraction jobs with a daily peak and a few
// whole-GPU jobs; each job's pod is created at its arrival and deleted by the
// script once it has run for its duration. Karpenter may launch 1×H100 and
// 8×H100 nodes.
func TestKarpenterFiguresDay(t *testing.T) {
	runDay(t, "gpu-8x-h100", "gpu-1x-h100")
}

// The same day with only 1×H100 nodes: what Karpenter's choice of the 8×
// type costs or saves.
func TestKarpenterFiguresDayOneGPUNodes(t *testing.T) {
	runDay(t, "gpu-1x-h100")
}

// runDay runs the scripted day with a NodePool of instanceTypes and logs its figures.
func runDay(t *testing.T, instanceTypes ...string) {
	jobs := daySchedule(daySeed)
	c := figuresCluster(t, "day", 64, instanceTypes...)
	types := cluster.DefaultInstanceTypes()
	m, stopMeter := startMeter(t, c, types)

	began := time.Now()
	at := func(h float64) time.Time { return began.Add(time.Duration(h * float64(daySimHour))) }
	var last float64
	for _, j := range jobs {
		last = max(last, j.Arrival+j.Duration)
	}
	// Bound: the day plus four simulated hours of queueing, plus slack.
	deadline := at(last + 4).Add(time.Minute)
	created := map[string]time.Time{}
	ended := map[string]string{} // job -> how it ended
	var waits []time.Duration
	next := 0
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for len(ended) < len(jobs) {
		now := time.Now()
		if now.After(deadline) {
			for _, j := range jobs {
				if ended[j.Name] == "" {
					t.Errorf("job %s (arrival %.2f h) did not finish by the deadline", j.Name, j.Arrival)
					if _, ok := created[j.Name]; ok {
						if err := deleteByScript(t.Context(), c, m, j.Name); err != nil {
							t.Error(err)
						}
					}
					ended[j.Name] = "deadline"
				}
			}
			break
		}
		for ; next < len(jobs) && !at(jobs[next].Arrival).After(now); next++ {
			j := jobs[next]
			w := pod(j.Name, "day")
			if j.GPUs > 0 {
				w = w.GPUs(j.GPUs)
			} else {
				w = w.Fraction(j.Fraction)
			}
			if j.NonPreemptible {
				w = w.Preemptible(false)
			}
			create(t, c, w.Obj())
			created[j.Name] = time.Now()
		}
		for _, j := range jobs[:next] {
			if ended[j.Name] != "" {
				continue
			}
			since, running, failed, gone := m.state(j.Name)
			switch {
			case gone:
				ended[j.Name] = "disrupted"
			case failed != "":
				t.Errorf("job %s failed: %s", j.Name, failed)
				if err := deleteByScript(t.Context(), c, m, j.Name); err != nil {
					t.Fatal(err)
				}
				ended[j.Name] = "failed"
			case running && !now.Before(since.Add(time.Duration(j.Duration*float64(daySimHour)))):
				if err := deleteByScript(t.Context(), c, m, j.Name); err != nil {
					t.Fatal(err)
				}
				ended[j.Name] = "done"
				waits = append(waits, since.Sub(created[j.Name]))
			}
		}
		select {
		case <-t.Context().Done():
			t.Fatal("cancelled during the day")
		case <-tick.C:
		}
	}
	dayEnd := time.Now()
	zero := zeroGPUNodes(t, c, 3*time.Minute)
	stopMeter()

	samples := m.snapshot()
	var b strings.Builder
	var fractions, whole, wholeGPUs int
	var fracPercent int
	for _, j := range jobs {
		if j.GPUs > 0 {
			whole++
			wholeGPUs += j.GPUs
		} else {
			fractions++
			fracPercent += j.Fraction
		}
	}
	fmt.Fprintf(&b, "FIGURES day (seed %d; instance types %v; 1 sim h = %s wall; reservation grace %s; consolidateAfter %s)\n",
		daySeed, instanceTypes, daySimHour, dayReservationGrace, dayConsolidateAfter)
	fmt.Fprintf(&b, "jobs: %d fraction (mean %.0f%%), %d whole (%d GPUs); last job ended at %.2f sim h; zero GPU nodes %.1f s wall later\n",
		fractions, float64(fracPercent)/float64(max(1, fractions)), whole, wholeGPUs,
		float64(dayEnd.Sub(began))/float64(daySimHour), zero.Sub(dayEnd).Seconds())
	slices.Sort(waits)
	if len(waits) > 0 {
		var sum time.Duration
		for _, w := range waits {
			sum += w
		}
		mean := sum / time.Duration(len(waits))
		p95 := waits[(len(waits)*95)/100]
		fmt.Fprintf(&b, "queueing (created → Running): mean %.1f s wall (%.0f sim min), p95 %.1f s (%.0f sim min), max %.1f s (%.0f sim min)\n",
			mean.Seconds(), 60*float64(mean)/float64(daySimHour), p95.Seconds(), 60*float64(p95)/float64(daySimHour),
			waits[len(waits)-1].Seconds(), 60*float64(waits[len(waits)-1])/float64(daySimHour))
	}
	outcomes := map[string]int{}
	for _, how := range ended {
		outcomes[how]++
	}
	fmt.Fprintf(&b, "job outcomes: %v\n", outcomes)
	b.WriteString(figuresHeader + "\n")
	for _, w := range []struct {
		name     string
		from, to time.Time
	}{
		{"the day (start → last job ends)", began, dayEnd},
		{"the day with the scale-down tail", began, zero},
	} {
		f := integrate(samples, w.from, w.to, daySimHour)
		b.WriteString(f.row(w.name) + "\n")
		if f.GPUHours+1e-9 < f.BoundGPUHours {
			t.Errorf("%s: used %.3f GPU-h below the lower bound %.3f: the meter is wrong", w.name, f.GPUHours, f.BoundGPUHours)
		}
	}
	prot, other := checkDisruptions(t, m)
	fmt.Fprintf(&b, "protected-pod disruptions: %d; other script-pod disruptions: %d\n", prot, other)
	b.WriteString(m.report(began))
	b.WriteString(hourly(samples, began, zero))
	t.Log("\n" + b.String())
}

func TestCheapestMix(t *testing.T) {
	types := cluster.DefaultInstanceTypes()
	tests := []struct {
		name      string
		gpus      int
		wantNodes int
		wantPrice float64
	}{
		{name: "nothing", gpus: 0},
		{name: "one GPU: a 1x", gpus: 1, wantNodes: 1, wantPrice: 14.19},
		{name: "five GPUs: five 1x beat one 8x", gpus: 5, wantNodes: 5, wantPrice: 5 * 14.19},
		{name: "six GPUs: six 1x", gpus: 6, wantNodes: 6, wantPrice: 6 * 14.19},
		{name: "seven GPUs: one 8x beats seven 1x", gpus: 7, wantNodes: 1, wantPrice: 98.32},
		{name: "eight GPUs", gpus: 8, wantNodes: 1, wantPrice: 98.32},
		{name: "nine GPUs: 8x plus 1x", gpus: 9, wantNodes: 2, wantPrice: 98.32 + 14.19},
		{name: "fifteen GPUs: two 8x", gpus: 15, wantNodes: 2, wantPrice: 2 * 98.32},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nodes, price := cheapestMix(tt.gpus, types)
			if nodes != tt.wantNodes || math.Abs(price-tt.wantPrice) > 1e-9 {
				t.Errorf("cheapestMix(%d) = %d nodes $%.2f, want %d nodes $%.2f", tt.gpus, nodes, price, tt.wantNodes, tt.wantPrice)
			}
		})
	}
}

func TestFFD(t *testing.T) {
	tests := []struct {
		name      string
		fractions []int64
		whole     int64
		want      int64
	}{
		{name: "nothing"},
		{name: "ten 40% need five GPUs (the bound says four)", fractions: []int64{40, 40, 40, 40, 40, 40, 40, 40, 40, 40}, want: 5},
		{name: "60+40 and 50+50 fill two", fractions: []int64{50, 40, 60, 50}, want: 2},
		{name: "whole GPUs add", fractions: []int64{10}, whole: 2, want: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ffd(tt.fractions, tt.whole); got != tt.want {
				t.Errorf("ffd(%v, %d) = %d, want %d", tt.fractions, tt.whole, got, tt.want)
			}
		})
	}
}

func TestFewestNodes(t *testing.T) {
	types := cluster.DefaultInstanceTypes()
	tests := []struct {
		name string
		gpus int64
		want int
	}{
		{name: "none", gpus: 0, want: 0},
		{name: "one", gpus: 1, want: 1},
		{name: "eight fit one 8x", gpus: 8, want: 1},
		{name: "nine need two", gpus: 9, want: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := fewestNodes(tt.gpus, types); got != tt.want {
				t.Errorf("fewestNodes(%d) = %d, want %d", tt.gpus, got, tt.want)
			}
		})
	}
}

func TestIntegrate(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	sec := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	samples := []daySample{
		{At: sec(0), Nodes: 1, GPUs: 8, Price: 98.32, Demand: 0, IdleGPUs: 8},
		{At: sec(10), Nodes: 1, GPUs: 8, Price: 98.32, Demand: 400, Bound: 4, BoundNodes: 1, BoundPrice: 4 * 14.19, Packed: 5},
		{At: sec(30), Nodes: 0},
	}
	tests := []struct {
		name     string
		from, to time.Time
		want     dayFigures
	}{
		{
			name: "whole span", from: sec(0), to: sec(40),
			want: dayFigures{Hours: 4, NodeHours: 3, GPUHours: 24, Dollars: 3 * 98.32, DemandGPUHours: 8, BoundGPUHours: 8, BoundNodeHours: 2, BoundD: 2 * 4 * 14.19, PackedGPUHours: 10, IdleGPUHours: 8},
		},
		{
			name: "window cuts both samples", from: sec(5), to: sec(20),
			want: dayFigures{Hours: 1.5, NodeHours: 1.5, GPUHours: 12, Dollars: 1.5 * 98.32, DemandGPUHours: 4, BoundGPUHours: 4, BoundNodeHours: 1, BoundD: 4 * 14.19, PackedGPUHours: 5, IdleGPUHours: 4},
		},
		{
			name: "window after the last sample holds it", from: sec(35), to: sec(45),
			want: dayFigures{Hours: 1},
		},
		{name: "empty window", from: sec(20), to: sec(20)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := integrate(samples, tt.from, tt.to, 10*time.Second)
			if diff := cmp.Diff(tt.want, got, cmp.Comparer(func(a, b float64) bool { return math.Abs(a-b) < 1e-9 })); diff != "" {
				t.Errorf("integrate (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDaySchedule(t *testing.T) {
	a, b := daySchedule(daySeed), daySchedule(daySeed)
	if diff := cmp.Diff(a, b); diff != "" {
		t.Fatalf("the same seed gave two schedules (-first +second):\n%s", diff)
	}
	if diff := cmp.Diff(a, daySchedule(daySeed+1)); diff == "" {
		t.Error("seeds 1 and 2 gave the same schedule")
	}
	sizes := daySizes()
	var whole, night, peak int
	for i, j := range a {
		if i > 0 && j.Arrival < a[i-1].Arrival {
			t.Errorf("job %s arrives at %.2f, before the previous one (%.2f)", j.Name, j.Arrival, a[i-1].Arrival)
		}
		if j.Arrival < 0 || j.Arrival >= dayArrivalEnd || j.Duration <= 0 {
			t.Errorf("job %s: arrival %.2f, duration %.2f", j.Name, j.Arrival, j.Duration)
		}
		switch {
		case j.GPUs > 0 && j.Fraction == 0:
			whole++
		case j.GPUs == 0 && slices.Contains(sizes, j.Fraction):
			switch {
			case j.Arrival < 6:
				night++
			case j.Arrival >= 11 && j.Arrival < 17:
				peak++
			}
		default:
			t.Errorf("job %s asks %d%% and %d GPUs", j.Name, j.Fraction, j.GPUs)
		}
	}
	if whole != dayWholeJobs {
		t.Errorf("%d whole-GPU jobs, want %d", whole, dayWholeJobs)
	}
	// Six hours each: the peak's rate is about four times the night's.
	if peak < 2*night {
		t.Errorf("%d fraction jobs arrive 11:00-17:00 and %d at 00:00-06:00; want a daily peak", peak, night)
	}
}
