package enforcement

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpufrac/gpufrac/deviceplugin/config"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/deviceplugin/pods"
)

// ProcessSource lists the processes holding memory on a GPU (nvidia.Lib).
type ProcessSource interface {
	Processes(uuid string) ([]nvidia.Process, error)
}

// DeviceSource lists the devices each container holds (the kubelet's
// PodResources, *pods.PodResources).
type DeviceSource interface {
	List(ctx context.Context) ([]pods.Assignment, error)
}

// ClaimSource tells what a device held through a DRA claim allows on
// which GPU (the DRA driver, from its record of prepared claims).
type ClaimSource interface {
	// ClaimAllowance returns the GPU (UUID; "" for a MIG device, whose
	// parent a MIG UUID does not name) and the allowance of d, false when
	// the claim device is unknown.
	ClaimAllowance(d pods.ClaimDevice) (gpu string, a Allowance, ok bool)
}

// EventRecorder writes Kubernetes events: client-go's
// k8s.io/client-go/tools/events.EventRecorder (events.k8s.io/v1) has this
// method.
type EventRecorder interface {
	// Eventf records an event on regarding (related: an object it
	// involves, or nil), the action taken or failed and a note; it must
	// not block.
	Eventf(regarding, related runtime.Object, eventType, reason, action, note string, args ...any)
}

// The actions of the watchdog's events (events.k8s.io/v1 requires one).
const (
	actionCheckMemory = "CheckGPUMemory" // a container over its limit
	actionKill        = "KillProcess"
	actionEvict       = "EvictPod"
)

// ContainerResolver tells when a host PID's process started and which pod
// container it runs in (ProcFS). Errors matching fs.ErrNotExist mean the
// process is gone.
type ContainerResolver interface {
	// StartTime is the process's start time, which with the PID identifies it.
	StartTime(pid uint32) (uint64, error)
	// Container is the pod container the process runs in.
	Container(pid uint32) (ContainerRef, error)
}

// PodLookup finds a pod on this node by UID (PodInformer).
type PodLookup interface {
	PodByUID(uid types.UID) (*corev1.Pod, bool)
}

// Killer sends SIGKILL to a process if it is still the one that started at
// startTime; otherwise it returns ErrProcessChanged and signals nothing
// (PIDFDKiller).
type Killer interface {
	Kill(ctx context.Context, pid uint32, startTime uint64) error
}

// Evictor evicts a pod (APIEvictor).
type Evictor interface {
	Evict(ctx context.Context, pod *corev1.Pod) error
}

// ErrActionUnavailable is returned by the null Killer and Evictor a
// Watchdog uses when none was given.
var ErrActionUnavailable = errors.New("enforcement action not available in this gpufrac-node")

// Policy is the enforcement configuration of this node.
type Policy struct {
	// Enforcement is what happens to a container over its limit.
	Enforcement config.Enforcement
	// PollInterval is the time between two samples.
	PollInterval time.Duration
	// TolerancePercent is how far over its limit a container may go.
	TolerancePercent int
	// Samples is how many consecutive over-limit samples trigger Enforcement.
	Samples int
	// TimesliceResource is the time-sliced replica resource name.
	TimesliceResource string
	// TimesliceReplicas is the number of replicas per time-sliced GPU.
	TimesliceReplicas int
}

// PolicyOf returns the enforcement policy of a node's resolved config
// policy (config.NodePolicy.Policy).
func PolicyOf(p config.Policy) Policy {
	return Policy{
		Enforcement:       p.Fraction.Enforcement,
		PollInterval:      p.Fraction.PollInterval.Duration,
		TolerancePercent:  p.Fraction.TolerancePercent,
		Samples:           p.Fraction.Samples,
		TimesliceResource: p.Timeslice.ResourceName,
		TimesliceReplicas: p.Timeslice.Replicas,
	}
}

// withDefaults fills unset fields with the config package's defaults.
func (p Policy) withDefaults() Policy {
	if p.Enforcement == "" {
		p.Enforcement = config.DefaultEnforcement
	}
	if p.PollInterval <= 0 {
		p.PollInterval = config.DefaultPollInterval
	}
	if p.Samples <= 0 {
		p.Samples = config.DefaultSamples
	}
	if p.TolerancePercent < 0 {
		p.TolerancePercent = 0
	}
	if p.TimesliceResource == "" {
		p.TimesliceResource = config.DefaultTimesliceResource
	}
	if p.TimesliceReplicas <= 0 {
		p.TimesliceReplicas = config.DefaultReplicas
	}
	return p
}

// Options are a Watchdog's dependencies. GPUs, Processes and Resolver are
// required; the others have null defaults.
type Options struct {
	// GPUs are the node's physical GPUs.
	GPUs []nvidia.GPU
	// Processes lists each GPU's processes (nvidia.Lib).
	Processes ProcessSource
	// Resolver maps PIDs to containers (ProcFS).
	Resolver ContainerResolver
	// Devices gives each container's devices, hence its limits. nil: no
	// container has a known limit, every process is reported only.
	Devices DeviceSource
	// Claims gives the limits of devices held through DRA claims (the DRA
	// driver's record of prepared claims). nil: claim devices carry no
	// known limit.
	Claims ClaimSource
	// Pods maps pod UIDs to pods. nil (standalone, no API access): no
	// process can be tied to a container's limit; every process is
	// reported only, none is ever killed.
	Pods PodLookup
	// Killer kills processes (nil: kill actions fail with ErrActionUnavailable).
	Killer Killer
	// Evictor evicts pods (nil: evict actions fail with ErrActionUnavailable).
	Evictor Evictor
	// Recorder writes events on pods (nil: events are dropped).
	Recorder EventRecorder
	// Clock drives the poll ticker (nil: the real clock).
	Clock clock.WithTicker
	// Registerer receives the metrics (nil: a private registry).
	Registerer prometheus.Registerer
	// ActionTimeout bounds one eviction call (default 5s).
	ActionTimeout time.Duration
}

// Watchdog samples per-process GPU memory from NVML, maps processes to
// containers, compares each container's use with its limit and applies the
// node's Policy. Run polls until its context ends; Poll runs one sample.
type Watchdog struct {
	gpus      []nvidia.GPU
	gpuByUUID map[string]nvidia.GPU
	procs     ProcessSource
	resolver  ContainerResolver
	devices   DeviceSource
	claims    ClaimSource
	pods      PodLookup
	killer    Killer
	evictor   Evictor
	recorder  EventRecorder
	clock     clock.WithTicker
	metrics   *metrics
	timeout   time.Duration

	// mu guards policy.
	mu     sync.Mutex
	policy Policy
	// policyChanged wakes Run to pick up a new poll interval.
	policyChanged chan struct{}

	// pollMu serialises polls; the fields below it belong to the poll.
	pollMu sync.Mutex
	// episodes: container on a GPU -> its current over-limit run.
	episodes map[episodeKey]*episode
	// series: per-container label sets exported at the last poll.
	series map[seriesKey]struct{}
	// reported: unknown-owner process -> why, logged once while it lives.
	reported map[procKey]string
	// containers: process -> the container it runs in, read once per
	// process (the GPU field of the key is unused). Processes do not leave
	// their container's cgroup subtree, and a reused PID has a new start
	// time, hence a new key.
	containers map[procKey]ContainerRef
	// failures: GPU UUID or podResourcesSource -> failing since an earlier poll.
	failures map[string]bool
	// onPoll, when set (tests), is called after every poll.
	onPoll func(Stats)
	// onTicker, when set (tests), is called when Run starts a ticker.
	onTicker func(time.Duration)
}

// episodeKey names one container incarnation on one GPU.
type episodeKey struct {
	uid       types.UID
	container string
	gpu       string
}

// episode is a run of consecutive over-limit samples of one container on one GPU.
type episode struct {
	over int
	// acted: the action of this episode was taken (report, evict); no more
	// until the container goes back under its limit.
	acted bool
}

// procKey identifies a process across polls: a reused PID has a new start time.
type procKey struct {
	gpu   string
	pid   uint32
	start uint64
}

// New returns a Watchdog with the default Policy (report only); call
// SetPolicy with the node's config.
func New(o Options) *Watchdog {
	w := &Watchdog{
		gpus:          slices.Clone(o.GPUs),
		gpuByUUID:     make(map[string]nvidia.GPU, len(o.GPUs)),
		procs:         o.Processes,
		resolver:      o.Resolver,
		devices:       o.Devices,
		claims:        o.Claims,
		pods:          o.Pods,
		killer:        o.Killer,
		evictor:       o.Evictor,
		recorder:      o.Recorder,
		clock:         o.Clock,
		timeout:       o.ActionTimeout,
		policy:        Policy{}.withDefaults(),
		policyChanged: make(chan struct{}, 1),
		episodes:      map[episodeKey]*episode{},
		series:        map[seriesKey]struct{}{},
		reported:      map[procKey]string{},
		containers:    map[procKey]ContainerRef{},
		failures:      map[string]bool{},
	}
	for _, g := range o.GPUs {
		w.gpuByUUID[g.UUID] = g
	}
	if w.killer == nil {
		w.killer = nullActions{}
	}
	if w.evictor == nil {
		w.evictor = nullActions{}
	}
	if w.recorder == nil {
		w.recorder = nullActions{}
	}
	if w.clock == nil {
		w.clock = clock.RealClock{}
	}
	if w.timeout <= 0 {
		w.timeout = 5 * time.Second
	}
	reg := o.Registerer
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	w.metrics = newMetrics(reg)
	return w
}

// nullActions stands in for a missing Killer, Evictor or Recorder: its
// actions fail, its events are dropped.
type nullActions struct{}

func (nullActions) Kill(context.Context, uint32, uint64) error { return ErrActionUnavailable }
func (nullActions) Evict(context.Context, *corev1.Pod) error   { return ErrActionUnavailable }

func (nullActions) Eventf(runtime.Object, runtime.Object, string, string, string, string, ...any) {}

// SetPolicy replaces the policy; unset fields take the config defaults. A
// new poll interval takes effect after the current one. Over-limit runs in
// progress keep their count.
func (w *Watchdog) SetPolicy(p Policy) {
	p = p.withDefaults()
	w.mu.Lock()
	changed := w.policy != p
	w.policy = p
	w.mu.Unlock()
	if changed {
		select {
		case w.policyChanged <- struct{}{}:
		default:
		}
	}
}

// Policy returns the policy in force.
func (w *Watchdog) Policy() Policy {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.policy
}

// Run polls every PollInterval until ctx ends, starting with one poll now.
func (w *Watchdog) Run(ctx context.Context) error {
	interval := w.Policy().PollInterval
	t := w.newTicker(interval)
	defer func() { t.Stop() }()
	klog.FromContext(ctx).Info("GPU memory watchdog started", "pollInterval", interval, "gpus", len(w.gpus), "mapsProcessesToPods", w.pods != nil)
	w.Poll(ctx)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
			w.Poll(ctx)
		case <-w.policyChanged:
			if iv := w.Policy().PollInterval; iv != interval {
				t.Stop()
				interval = iv
				t = w.newTicker(iv)
			}
		}
	}
}

func (w *Watchdog) newTicker(d time.Duration) clock.Ticker {
	t := w.clock.NewTicker(d)
	if w.onTicker != nil {
		w.onTicker(d)
	}
	return t
}

// Stats summarises one poll.
type Stats struct {
	// GPUs is the number of GPUs sampled; SkippedGPUs failed in NVML.
	GPUs, SkippedGPUs int
	// Processes is the number of processes seen on the sampled GPUs;
	// Unknown of them could not be tied to a container's allowance.
	Processes, Unknown int
	// OverLimit is the number of containers over their limit (plus
	// tolerance) on some GPU in this sample.
	OverLimit int
	// Violations is the number of violations confirmed in this poll
	// (Samples consecutive samples over the limit).
	Violations int
	// Kills, Evictions count successful actions; Skipped counts kills not
	// made because the process was gone or its PID reused; Failed counts
	// actions that failed.
	Kills, Evictions, Skipped, Failed int
	// Duration is how long the poll took.
	Duration time.Duration
}

// usage is one container's processes on one GPU in one sample.
type usage struct {
	key       ContainerKey
	pod       *corev1.Pod
	gpu       nvidia.GPU
	allowance Allowance
	used      uint64
	procs     []procSample
}

// procSample is one sampled process of a container.
type procSample struct {
	pid   uint32
	start uint64
	used  uint64
}

// Poll takes one sample of every GPU and acts on what it finds:
//
//  1. read every container's devices from PodResources and compute its
//     allowance per GPU (a failed read skips the whole poll);
//  2. list each GPU's processes through NVML (a failing GPU is skipped for
//     this poll: its runs keep their count and nothing on it is acted on);
//  3. map each process to a container through /proc and the pod lookup,
//     and sum each container's use per GPU; processes that map to no
//     container allowance are reported (logged once, counted as unknown);
//  4. for each container over its limit plus tolerance, count the
//     consecutive sample and, at Samples, apply the policy;
//  5. export the metrics and drop state and series of ended containers.
//
// Poll is safe to call concurrently with Run (polls are serialised).
func (w *Watchdog) Poll(ctx context.Context) Stats {
	w.pollMu.Lock()
	defer w.pollMu.Unlock()
	start := w.clock.Now()
	logger := klog.FromContext(ctx)
	pol := w.Policy()
	var st Stats

	// 1. Allowances.
	var allow map[ContainerKey]map[string]Allowance
	var grants Grants
	if w.devices != nil {
		as, err := w.devices.List(ctx)
		if err != nil {
			w.metrics.deviceErrors.Inc()
			if w.failing(ctx, podResourcesSource, true) {
				logger.Error(err, "Watchdog skips its polls while the kubelet's PodResources are unreadable")
			}
			st.SkippedGPUs = len(w.gpus)
			return w.finish(st, start)
		}
		w.failing(ctx, podResourcesSource, false)
		allow = AllowancesWithClaims(as, w.gpuByUUID, pol, w.claims)
		grants = ClaimGrants(as, w.gpuByUUID, w.claims)
	}

	// 2.-3. Sample and map.
	skipped := map[string]bool{}
	usages := map[episodeKey]*usage{}
	alive := map[procKey]bool{}
	resolved := map[procKey]ContainerRef{}
	for _, g := range w.gpus {
		procs, err := w.procs.Processes(g.UUID)
		if err != nil {
			skipped[g.UUID] = true
			st.SkippedGPUs++
			w.metrics.nvmlErrors.WithLabelValues(g.UUID).Inc()
			if w.failing(ctx, g.UUID, true) {
				logger.Error(err, "Watchdog skips a GPU while NVML cannot list its processes", "gpu", g.UUID)
			}
			continue
		}
		w.failing(ctx, g.UUID, false)
		st.GPUs++
		var managedBytes, unknownBytes uint64
		var managedProcs, unknownProcs int
		for _, p := range procs {
			info, err := w.resolve(p.PID, resolved)
			st.Processes++
			u, why := w.attribute(g, info, err, allow)
			if u == nil {
				st.Unknown++
				unknownBytes += p.UsedBytes
				unknownProcs++
				k := procKey{gpu: g.UUID, pid: p.PID, start: info.StartTime}
				alive[k] = true
				w.reportUnknown(ctx, k, p.UsedBytes, info, why, err)
				continue
			}
			managedBytes += p.UsedBytes
			managedProcs++
			ek := episodeKey{uid: u.pod.UID, container: u.key.Container, gpu: g.UUID}
			if prev, ok := usages[ek]; ok {
				u = prev
			} else {
				usages[ek] = u
			}
			u.used += p.UsedBytes
			u.procs = append(u.procs, procSample{pid: p.PID, start: info.StartTime, used: p.UsedBytes})
		}
		w.metrics.gpuUsed.WithLabelValues(g.UUID, OwnerManaged).Set(float64(managedBytes))
		w.metrics.gpuUsed.WithLabelValues(g.UUID, OwnerUnknown).Set(float64(unknownBytes))
		w.metrics.gpuProcs.WithLabelValues(g.UUID, OwnerManaged).Set(float64(managedProcs))
		w.metrics.gpuProcs.WithLabelValues(g.UUID, OwnerUnknown).Set(float64(unknownProcs))
	}
	for k := range w.reported {
		if !alive[k] && !skipped[k.gpu] {
			delete(w.reported, k)
		}
	}
	// Processes on skipped GPUs are read again when the GPU is back.
	w.containers = resolved

	// 4. Limits, in a stable order so events and kills are reproducible;
	// the containers sharing a claim's device are checked together.
	checked := pooled(usages, grants)
	keys := slices.SortedFunc(maps.Keys(checked), compareEpisodeKeys)
	for _, k := range keys {
		w.check(ctx, pol, k, checked[k], &st)
	}
	for k := range w.episodes {
		if _, seen := checked[k]; !seen && !skipped[k.gpu] {
			delete(w.episodes, k)
		}
	}

	// 5. Per-container series.
	w.exportContainers(allow, usages, skipped)
	return w.finish(st, start)
}

func compareEpisodeKeys(a, b episodeKey) int {
	return cmp.Or(cmp.Compare(a.gpu, b.gpu), cmp.Compare(a.uid, b.uid), cmp.Compare(a.container, b.container))
}

// pooled merges, GPU by GPU, the usages of containers that hold a device of
// the same claim (grants, from ClaimGrants): the kubelet prepares a claim
// once for every container and pod that references it, each is told the
// claim's limit, and together they may hold only that. Containers linked
// through shared claim devices form one pool, checked as one usage: their
// processes and use summed, their limit each distinct claim device's once
// plus what else each member holds on the GPU. The pool is keyed by its
// first member (episodes stay put while it does) and named after its
// largest user (events, eviction: all hold claims of one namespace). Usages
// that share nothing are returned as they are.
func pooled(usages map[episodeKey]*usage, grants Grants) map[episodeKey]*usage {
	if len(grants) == 0 {
		return usages
	}
	parent := map[episodeKey]episodeKey{}
	var find func(k episodeKey) episodeKey
	find = func(k episodeKey) episodeKey {
		p, ok := parent[k]
		if !ok || p == k {
			return k
		}
		r := find(p)
		parent[k] = r
		return r
	}
	type held struct {
		gpu string
		d   pods.ClaimDevice
	}
	first := map[held]episodeKey{}
	keys := slices.SortedFunc(maps.Keys(usages), compareEpisodeKeys)
	for _, k := range keys {
		for d := range grants.On(usages[k].key, k.gpu) {
			h := held{k.gpu, d}
			o, seen := first[h]
			if !seen {
				first[h] = k
				continue
			}
			if ra, rb := find(o), find(k); ra != rb {
				if compareEpisodeKeys(rb, ra) < 0 {
					ra, rb = rb, ra
				}
				parent[rb] = ra
			}
		}
	}
	members := map[episodeKey][]episodeKey{}
	for _, k := range keys {
		r := find(k)
		members[r] = append(members[r], k)
	}
	out := make(map[episodeKey]*usage, len(members))
	for root, ks := range members {
		if len(ks) == 1 {
			out[root] = usages[root]
			continue
		}
		pool := &usage{gpu: usages[root].gpu}
		distinct := DeviceLimits{}
		var own uint64
		var largest *usage
		for _, k := range ks {
			u := usages[k]
			pool.used += u.used
			pool.procs = append(pool.procs, u.procs...)
			pool.allowance.Unlimited = pool.allowance.Unlimited || u.allowance.Unlimited
			held := grants.On(u.key, k.gpu)
			maps.Copy(distinct, held)
			own += u.allowance.LimitBytes - min(held.Total(), u.allowance.LimitBytes)
			if largest == nil || u.used > largest.used {
				largest = u
			}
		}
		pool.key, pool.pod = largest.key, largest.pod
		pool.allowance.LimitBytes = own + distinct.Total()
		out[root] = pool
	}
	return out
}

// podResourcesSource names PodResources among the GPU UUIDs in Watchdog.failures.
const podResourcesSource = "podresources"

// failing records whether a source (a GPU UUID or podResourcesSource) fails
// this poll, and tells whether it just started to: errors are logged when a
// source starts failing and recovery when it stops, not every poll.
func (w *Watchdog) failing(ctx context.Context, source string, failed bool) bool {
	was := w.failures[source]
	switch {
	case failed && !was:
		w.failures[source] = true
		return true
	case !failed && was:
		delete(w.failures, source)
		klog.FromContext(ctx).Info("Watchdog source works again", "source", source)
	}
	return false
}

// resolve reads a process's start time and, unless known from an earlier
// poll, its container. The start time is read first: if the PID is reused
// between the two reads, the container may be the newcomer's, but the start
// time is the old process's, so a kill aimed at it is refused (Killer
// checks the start time) instead of hitting the newcomer.
func (w *Watchdog) resolve(pid uint32, resolved map[procKey]ContainerRef) (ProcessInfo, error) {
	start, err := w.resolver.StartTime(pid)
	if err != nil {
		return ProcessInfo{}, err
	}
	k := procKey{pid: pid, start: start}
	ref, ok := resolved[k]
	if !ok {
		if ref, ok = w.containers[k]; !ok {
			if ref, err = w.resolver.Container(pid); err != nil {
				return ProcessInfo{StartTime: start}, err
			}
		}
		resolved[k] = ref
	}
	return ProcessInfo{StartTime: start, Container: ref}, nil
}

func (w *Watchdog) finish(st Stats, start time.Time) Stats {
	st.Duration = w.clock.Since(start)
	w.metrics.pollDuration.Observe(st.Duration.Seconds())
	if w.onPoll != nil {
		w.onPoll(st)
	}
	return st
}

// Reasons a process is not tied to a container allowance, for the log.
const (
	whyUnreadable = "its /proc entry is unreadable"
	whyNoProc     = "its PID is not in /proc: it just exited, or gpufrac-node does not see host PIDs (hostPID, --proc-root)"
	whyHost       = "it runs in no pod container"
	whyNoAPI      = "no API access: pods cannot be looked up by UID"
	whyPod        = "its pod is not (yet) known on this node"
	whyContainer  = "its container is not in the pod's status"
	whyNoDevice   = "its container holds no gpufrac device on this GPU"
)

// attribute ties a process to a container's allowance on g, or says why not.
func (w *Watchdog) attribute(g nvidia.GPU, info ProcessInfo, resolveErr error, allow map[ContainerKey]map[string]Allowance) (*usage, string) {
	switch {
	case errors.Is(resolveErr, fs.ErrNotExist):
		return nil, whyNoProc
	case resolveErr != nil:
		return nil, whyUnreadable
	case info.Container.PodUID == "":
		return nil, whyHost
	case w.pods == nil:
		return nil, whyNoAPI
	}
	pod, ok := w.pods.PodByUID(info.Container.PodUID)
	if !ok {
		return nil, whyPod
	}
	name, ok := ContainerName(pod, info.Container.ContainerID)
	if !ok {
		return nil, whyContainer
	}
	key := ContainerKey{Namespace: pod.Namespace, Pod: pod.Name, Container: name}
	a, ok := allowanceOn(allow[key], g.UUID)
	if !ok {
		return nil, whyNoDevice
	}
	return &usage{key: key, pod: pod, gpu: g, allowance: a}, ""
}

// reportUnknown logs a process outside any container allowance, once per
// process and GPU. Such processes are never acted on.
func (w *Watchdog) reportUnknown(ctx context.Context, k procKey, used uint64, info ProcessInfo, why string, err error) {
	if _, done := w.reported[k]; done {
		return
	}
	w.reported[k] = why
	kv := []any{"gpu", k.gpu, "pid", k.pid, "usedBytes", used, "reason", why}
	if info.Container.PodUID != "" {
		kv = append(kv, "podUID", info.Container.PodUID, "containerID", info.Container.ContainerID)
	}
	if err != nil {
		kv = append(kv, "err", err.Error())
	}
	klog.FromContext(ctx).Info("GPU memory held by a process gpufrac does not manage; reporting only", kv...)
}

// check updates a container's over-limit run on one GPU and acts when the
// run reaches the policy's sample count.
func (w *Watchdog) check(ctx context.Context, pol Policy, k episodeKey, u *usage, st *Stats) {
	if u.allowance.Unlimited {
		delete(w.episodes, k)
		return
	}
	threshold := u.allowance.LimitBytes + u.allowance.LimitBytes*uint64(pol.TolerancePercent)/100
	if u.used <= threshold {
		delete(w.episodes, k)
		return
	}
	st.OverLimit++
	ep := w.episodes[k]
	if ep == nil {
		ep = &episode{}
		w.episodes[k] = ep
	}
	ep.over++
	logger := klog.FromContext(ctx).WithValues("pod", klog.KObj(u.pod), "container", u.key.Container, "gpu", u.gpu.UUID)
	logger.V(2).Info("Container over its GPU memory limit", "usedBytes", u.used, "limitBytes", u.allowance.LimitBytes, "samples", ep.over, "requiredSamples", pol.Samples)
	if ep.over < pol.Samples || ep.acted {
		return
	}

	st.Violations++
	sk := seriesKey{ContainerKey: u.key, gpu: u.gpu.UUID}
	w.metrics.violations.With(sk.labels()).Inc()
	w.metrics.nodeViolation.WithLabelValues(string(pol.Enforcement)).Inc()
	logger.Info("GPU memory limit violated", "usedBytes", u.used, "limitBytes", u.allowance.LimitBytes, "tolerancePercent", pol.TolerancePercent, "samples", ep.over, "action", pol.Enforcement)
	w.recorder.Eventf(u.pod, nil, corev1.EventTypeWarning, "GPUMemoryLimitExceeded", EventAction(actionCheckMemory, u.key.Container, u.gpu.UUID),
		"Container %s uses %s of GPU memory on %s, over its limit of %s (tolerance %d%%) for %d consecutive samples; action: %s",
		u.key.Container, mib(u.used), u.gpu.UUID, mib(u.allowance.LimitBytes), pol.TolerancePercent, ep.over, pol.Enforcement)

	switch pol.Enforcement {
	case config.EnforcementKill:
		w.kill(ctx, u, threshold, st)
		// The offending processes are gone (or were already): a new run
		// must build up again before anything else of the container dies.
		ep.over = 0
	case config.EnforcementEvict:
		if w.evict(ctx, u, st) {
			ep.acted = true
		} else {
			ep.over = 0 // retry after another full run
		}
	default:
		ep.acted = true
	}
}

// kill kills the container's processes on the GPU, largest first, until
// the remaining use is within the threshold. A process whose PID was reused
// or that exited counts as gone: its memory is freed either way.
func (w *Watchdog) kill(ctx context.Context, u *usage, threshold uint64, st *Stats) {
	logger := klog.FromContext(ctx).WithValues("pod", klog.KObj(u.pod), "container", u.key.Container, "gpu", u.gpu.UUID)
	procs := slices.Clone(u.procs)
	slices.SortFunc(procs, func(a, b procSample) int {
		return cmp.Or(cmp.Compare(b.used, a.used), cmp.Compare(a.pid, b.pid))
	})
	remaining := u.used
	for _, p := range procs {
		if remaining <= threshold {
			break
		}
		err := w.killer.Kill(ctx, p.pid, p.start)
		switch {
		case err == nil:
			remaining -= p.used
			st.Kills++
			w.countAction(u, config.EnforcementKill, resultSuccess)
			logger.Info("Killed a process over its container's GPU memory limit", "pid", p.pid, "usedBytes", p.used, "limitBytes", u.allowance.LimitBytes)
			w.recorder.Eventf(u.pod, nil, corev1.EventTypeWarning, "GPUMemoryProcessKilled", EventAction(actionKill, u.key.Container, fmt.Sprintf("pid-%d", p.pid)),
				"Killed process %d of container %s: it held %s of GPU memory on %s; the container uses %s, its limit is %s",
				p.pid, u.key.Container, mib(p.used), u.gpu.UUID, mib(u.used), mib(u.allowance.LimitBytes))
		case errors.Is(err, ErrProcessChanged):
			remaining -= p.used
			st.Skipped++
			w.countAction(u, config.EnforcementKill, resultSkipped)
			logger.Info("Did not kill a process: it exited or its PID was reused since the sample", "pid", p.pid, "err", err.Error())
			w.recorder.Eventf(u.pod, nil, corev1.EventTypeNormal, "GPUMemoryKillSkipped", EventAction(actionKill, u.key.Container, fmt.Sprintf("pid-%d", p.pid)),
				"Did not kill process %d of container %s (%s of GPU memory on %s): it exited or its PID now belongs to another process",
				p.pid, u.key.Container, mib(p.used), u.gpu.UUID)
		default:
			st.Failed++
			w.countAction(u, config.EnforcementKill, resultFailed)
			logger.Error(err, "Killing a process over its container's GPU memory limit failed", "pid", p.pid)
			w.recorder.Eventf(u.pod, nil, corev1.EventTypeWarning, "GPUMemoryActionFailed", EventAction(actionKill, u.key.Container, fmt.Sprintf("pid-%d", p.pid)),
				"Could not kill process %d of container %s (%s of GPU memory on %s, limit %s): %v",
				p.pid, u.key.Container, mib(p.used), u.gpu.UUID, mib(u.allowance.LimitBytes), err)
		}
	}
}

// evict evicts the container's pod; it reports success (or a pod already
// terminating).
func (w *Watchdog) evict(ctx context.Context, u *usage, st *Stats) bool {
	logger := klog.FromContext(ctx).WithValues("pod", klog.KObj(u.pod), "container", u.key.Container, "gpu", u.gpu.UUID)
	if u.pod.DeletionTimestamp != nil {
		logger.V(2).Info("Pod over its GPU memory limit is already terminating; not evicting")
		return true
	}
	ctx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	if err := w.evictor.Evict(ctx, u.pod); err != nil {
		st.Failed++
		w.countAction(u, config.EnforcementEvict, resultFailed)
		logger.Error(err, "Evicting a pod over its GPU memory limit failed; retrying after another run of samples")
		w.recorder.Eventf(u.pod, nil, corev1.EventTypeWarning, "GPUMemoryActionFailed", EventAction(actionEvict, u.key.Container),
			"Could not evict the pod: container %s uses %s of GPU memory on %s, limit %s: %v",
			u.key.Container, mib(u.used), u.gpu.UUID, mib(u.allowance.LimitBytes), err)
		return false
	}
	st.Evictions++
	w.countAction(u, config.EnforcementEvict, resultSuccess)
	logger.Info("Evicted a pod over its GPU memory limit", "usedBytes", u.used, "limitBytes", u.allowance.LimitBytes)
	w.recorder.Eventf(u.pod, nil, corev1.EventTypeWarning, "GPUMemoryPodEvicted", EventAction(actionEvict, u.key.Container),
		"Evicted: container %s uses %s of GPU memory on %s, over its limit of %s",
		u.key.Container, mib(u.used), u.gpu.UUID, mib(u.allowance.LimitBytes))
	return true
}

func (w *Watchdog) countAction(u *usage, action config.Enforcement, result string) {
	l := seriesKey{ContainerKey: u.key, gpu: u.gpu.UUID}.labels()
	l["action"], l["result"] = string(action), result
	w.metrics.actions.With(l).Inc()
	w.metrics.nodeAction.WithLabelValues(string(action), result).Inc()
}

// exportContainers sets the per-container gauges of every container holding
// devices, and deletes the series of containers that no longer do. Series
// on skipped GPUs keep their last values.
func (w *Watchdog) exportContainers(allow map[ContainerKey]map[string]Allowance, usages map[episodeKey]*usage, skipped map[string]bool) {
	used := map[seriesKey]uint64{}
	for _, u := range usages {
		used[seriesKey{ContainerKey: u.key, gpu: u.gpu.UUID}] += u.used
	}
	now := map[seriesKey]struct{}{}
	for key, byGPU := range allow {
		for gpu, a := range byGPU {
			if gpu == anyGPU {
				continue // MIG holders: the parent GPU is unknown, nothing to export
			}
			sk := seriesKey{ContainerKey: key, gpu: gpu}
			now[sk] = struct{}{}
			if skipped[gpu] {
				continue
			}
			if !a.Unlimited {
				w.metrics.limit.WithLabelValues(sk.values()...).Set(float64(a.LimitBytes))
			} else {
				w.metrics.limit.DeleteLabelValues(sk.values()...)
			}
			if w.pods != nil {
				w.metrics.used.WithLabelValues(sk.values()...).Set(float64(used[sk]))
			}
		}
	}
	for sk := range w.series {
		if _, ok := now[sk]; !ok {
			w.metrics.deleteSeries(sk)
		}
	}
	w.series = now
}

// mib formats bytes as MiB, the unit of GPUFRAC_MEMORY_LIMIT_MIB.
func mib(b uint64) string {
	if b%(1<<20) == 0 {
		return strconv.FormatUint(b>>20, 10) + " MiB"
	}
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}
