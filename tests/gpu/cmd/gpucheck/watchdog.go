package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/config"
	"github.com/gpufrac/gpufrac/deviceplugin/enforcement"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/deviceplugin/pods"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
)

// The pod and container the holder pretends to run in.
const (
	podNamespace  = "gpucheck"
	podName       = "cudahold"
	containerName = "cuda"
)

// fakePod is the pod object the watchdog's pod lookup returns.
func fakePod(uid types.UID, containerID string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: podNamespace, Name: podName, UID: uid},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: containerName}}},
		Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{
			Name: containerName, ContainerID: "containerd://" + containerID,
		}}},
	}
}

// staticDevices is the kubelet's PodResources answer: the container holds
// units fraction units of one GPU.
type staticDevices []pods.Assignment

func (s staticDevices) List(context.Context) ([]pods.Assignment, error) { return s, nil }

func fractionOf(uuid string, units int) staticDevices {
	ids := make([]string, units)
	for k := range units {
		ids[k] = resource.UnitID(uuid, k)
	}
	return staticDevices{{Namespace: podNamespace, Pod: podName, Container: containerName, Resource: api.ResourceFraction, DeviceIDs: ids}}
}

// onePod is the pod informer: one pod.
type onePod struct{ pod *corev1.Pod }

func (o onePod) PodByUID(uid types.UID) (*corev1.Pod, bool) {
	return o.pod, uid == o.pod.UID
}

// event is one Kubernetes event the watchdog wrote.
type event struct{ Type, Reason, Message string }

// recorder keeps the watchdog's events.
type recorder struct {
	mu     sync.Mutex
	events []event
}

func (r *recorder) Eventf(_, _ runtime.Object, typ, reason, _, format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, event{typ, reason, fmt.Sprintf(format, args...)})
}

func (r *recorder) find(reason string) (event, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.events {
		if e.Reason == reason {
			return e, true
		}
	}
	return event{}, false
}

// wdRun is one watchdog against the holder: a fraction of units on gpu,
// the given action, polled until stop says so or maxPolls.
type wdRun struct {
	GPU       nvidia.GPU
	Processes enforcement.ProcessSource
	Place     *placement
	UID       types.UID
	Container string
	Units     int
	Mode      config.Enforcement
	Interval  time.Duration
	Samples   int
}

// wdResult is what the polls showed.
type wdResult struct {
	Stats    []enforcement.Stats
	Rec      *recorder
	Reg      *prometheus.Registry
	Elapsed  time.Duration
	LimitMiB uint64
}

// total sums the polls' stats.
func (r wdResult) total() enforcement.Stats {
	var t enforcement.Stats
	for _, s := range r.Stats {
		t.GPUs += s.GPUs
		t.SkippedGPUs += s.SkippedGPUs
		t.OverLimit += s.OverLimit
		t.Violations += s.Violations
		t.Kills += s.Kills
		t.Skipped += s.Skipped
		t.Failed += s.Failed
	}
	return t
}

// firstPoll returns the 1-based number of the first poll where f holds, 0 if none.
func (r wdResult) firstPoll(f func(enforcement.Stats) bool) int {
	for i, s := range r.Stats {
		if f(s) {
			return i + 1
		}
	}
	return 0
}

func (w wdRun) run(ctx context.Context, maxPolls int, stop func(enforcement.Stats) bool) wdResult {
	res := wdResult{Rec: &recorder{}, Reg: prometheus.NewRegistry(), LimitMiB: resource.MemoryLimitMiB(w.GPU, w.Units)}
	wd := enforcement.New(enforcement.Options{
		GPUs:       []nvidia.GPU{w.GPU},
		Processes:  w.Processes,
		Resolver:   enforcement.ProcFS{Root: w.Place.ProcRoot},
		Devices:    fractionOf(w.GPU.UUID, w.Units),
		Pods:       onePod{fakePod(w.UID, w.Container)},
		Killer:     enforcement.NewKiller(w.Place.ProcRoot),
		Recorder:   res.Rec,
		Registerer: res.Reg,
	})
	wd.SetPolicy(enforcement.Policy{Enforcement: w.Mode, PollInterval: w.Interval, TolerancePercent: 0, Samples: w.Samples})
	start := time.Now()
	for i := 0; i < maxPolls && ctx.Err() == nil; i++ {
		if i > 0 {
			time.Sleep(w.Interval)
		}
		st := wd.Poll(ctx)
		res.Stats = append(res.Stats, st)
		if stop != nil && stop(st) {
			break
		}
	}
	res.Elapsed = time.Since(start)
	return res
}

// metricValue returns the value of the series of name whose labels include
// want, and whether there is one.
func metricValue(reg *prometheus.Registry, name string, want map[string]string) (float64, bool) {
	mfs, err := reg.Gather()
	if err != nil {
		return 0, false
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if have[k] != v {
					continue series
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue(), true
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}

// containerLabels are the per-container series' labels of the fake container on gpu.
func containerLabels(gpu string) map[string]string {
	return map[string]string{"namespace": podNamespace, "pod": podName, "container": containerName, "gpu_uuid": gpu}
}

// checkUnderLimit: with a limit above what the holder holds, samples+1
// polls find the container, under its limit, and do nothing.
func checkUnderLimit(ctx context.Context, w wdRun, h *holder) Check {
	w.Mode = config.EnforcementKill
	r := w.run(ctx, w.Samples+1, nil)
	t := r.total()
	used, _ := metricValue(r.Reg, "gpufrac_container_gpu_memory_used_bytes", containerLabels(w.GPU.UUID))
	detail := fmt.Sprintf("limit %d MiB (%d units), container uses %d MiB as the watchdog sees it; %d polls: over-limit %d, violations %d, kills %d; holder alive: %v",
		r.LimitMiB, w.Units, uint64(used)>>20, len(r.Stats), t.OverLimit, t.Violations, t.Kills, h.Alive())
	switch {
	case used == 0:
		return Check{"watchdog-under-limit", Fail, detail + " (the watchdog did not attribute the holder's memory to the container)"}
	case t.OverLimit != 0 || t.Violations != 0 || t.Kills != 0 || !h.Alive():
		return Check{"watchdog-under-limit", Fail, detail}
	}
	return Check{"watchdog-under-limit", Pass, detail}
}

// checkReport: with a limit below what the holder holds, mode report logs
// and counts a violation after Samples polls, writes the event, and leaves
// the process alone.
func checkReport(ctx context.Context, w wdRun, h *holder) Check {
	w.Mode = config.EnforcementReport
	r := w.run(ctx, w.Samples+2, nil)
	t := r.total()
	at := r.firstPoll(func(s enforcement.Stats) bool { return s.Violations > 0 })
	viol, _ := metricValue(r.Reg, "gpufrac_memory_limit_violations_total", map[string]string{"action": "report"})
	cviol, _ := metricValue(r.Reg, "gpufrac_container_gpu_memory_violations_total", containerLabels(w.GPU.UUID))
	used, _ := metricValue(r.Reg, "gpufrac_container_gpu_memory_used_bytes", containerLabels(w.GPU.UUID))
	ev, evOK := r.Rec.find("GPUMemoryLimitExceeded")
	detail := fmt.Sprintf("limit %d MiB (%d unit), used %d MiB; violation at poll %d of %d (samples %d, interval %v); gpufrac_memory_limit_violations_total{action=report}=%v, per-container %v; kills %d; event: %q; holder alive after: %v",
		r.LimitMiB, w.Units, uint64(used)>>20, at, len(r.Stats), w.Samples, w.Interval, viol, cviol, t.Kills, ev.Message, h.Alive())
	if at != w.Samples || t.Violations != 1 || viol != 1 || cviol != 1 || !evOK || t.Kills != 0 || !h.Alive() {
		return Check{"watchdog-report", Fail, detail}
	}
	return Check{"watchdog-report", Pass, detail}
}

// checkKill: mode kill SIGKILLs the holder after Samples polls (through the
// watchdog's pidfd killer), and NVML stops listing it.
func checkKill(ctx context.Context, w wdRun, h *holder, lib enforcement.ProcessSource) Check {
	w.Mode = config.EnforcementKill
	r := w.run(ctx, w.Samples+3, func(s enforcement.Stats) bool { return s.Kills > 0 || s.Failed > 0 })
	killedAt := time.Now()
	t := r.total()
	at := r.firstPoll(func(s enforcement.Stats) bool { return s.Kills > 0 })
	ok, _ := metricValue(r.Reg, "gpufrac_memory_limit_actions_total", map[string]string{"action": "kill", "result": "success"})
	ev, evOK := r.Rec.find("GPUMemoryProcessKilled")
	st, exited := h.WaitExit(10 * time.Second)
	sigkill := killedBySIGKILL(st)
	// NVML frees the process's memory when the driver tears its context
	// down: wait for the PID to leave NVML's list.
	var gone time.Duration = -1
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		procs, err := lib.Processes(w.GPU.UUID)
		if err == nil && !hasPID(procs, h.PID) {
			gone = time.Since(killedAt)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	detail := fmt.Sprintf("limit %d MiB (%d unit); kill at poll %d of %d (samples %d, interval %v), kills %d, failed %d, skipped %d; gpufrac_memory_limit_actions_total{kill,success}=%v; event: %q; holder exited: %v (%v, SIGKILL: %v); PID gone from NVML %s after the kill",
		r.LimitMiB, w.Units, at, len(r.Stats), w.Samples, w.Interval, t.Kills, t.Failed, t.Skipped, ok, ev.Message, exited, st, sigkill, durationOrNever(gone))
	if at != w.Samples || t.Kills != 1 || t.Failed != 0 || ok != 1 || !evOK || !sigkill || gone < 0 {
		return Check{"watchdog-kill", Fail, detail}
	}
	return Check{"watchdog-kill", Pass, detail}
}

func hasPID(procs []nvidia.Process, pid uint32) bool {
	for _, p := range procs {
		if p.PID == pid {
			return true
		}
	}
	return false
}

func durationOrNever(d time.Duration) string {
	if d < 0 {
		return "never (30 s)"
	}
	return d.Round(time.Millisecond).String()
}

// describeProcs formats an NVML process list for the report.
func describeProcs(procs []nvidia.Process) string {
	var b strings.Builder
	for i, p := range procs {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "pid %d %d MiB", p.PID, p.UsedBytes>>20)
	}
	if b.Len() == 0 {
		return "none"
	}
	return b.String()
}
