package enforcement

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Owner label values of the per-GPU process metrics.
const (
	// OwnerManaged: the process runs in a container holding a gpufrac
	// device (whole GPU, fraction, replica or MIG device) on that GPU.
	OwnerManaged = "managed"
	// OwnerUnknown: any other process - a host process, a container holding
	// no device on the GPU, or one the agent cannot map to a pod (standalone,
	// pod not yet in the informer, unreadable /proc entry).
	OwnerUnknown = "unknown"
)

// Action and result label values.
const (
	resultSuccess = "success"
	// resultSkipped: the process had exited or its PID was reused; nothing was signalled.
	resultSkipped = "skipped"
	resultFailed  = "failed"
)

var (
	containerLabels = []string{"namespace", "pod", "container", "gpu_uuid"}
	actionLabels    = []string{"namespace", "pod", "container", "gpu_uuid", "action", "result"}
)

// metrics are the watchdog's Prometheus metrics. Per-container series are
// deleted when the container no longer holds devices (PodResources);
// the node-wide counters keep the totals after that.
type metrics struct {
	used          *prometheus.GaugeVec
	limit         *prometheus.GaugeVec
	violations    *prometheus.CounterVec
	actions       *prometheus.CounterVec
	nodeViolation *prometheus.CounterVec
	nodeAction    *prometheus.CounterVec
	gpuUsed       *prometheus.GaugeVec
	gpuProcs      *prometheus.GaugeVec
	nvmlErrors    *prometheus.CounterVec
	deviceErrors  prometheus.Counter
	pollDuration  prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		used: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpufrac_container_gpu_memory_used_bytes",
			Help: "GPU memory held by a container's processes on one GPU at the last watchdog poll. Only exported with API access, which maps processes to containers.",
		}, containerLabels),
		limit: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpufrac_container_gpu_memory_limit_bytes",
			Help: "A container's GPU memory limit on one GPU: fraction units x GPU memory / 100, or GPU memory / replicas per time-sliced replica. Not exported for whole GPUs and MIG devices (unlimited).",
		}, containerLabels),
		violations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpufrac_container_gpu_memory_violations_total",
			Help: "Times a container stayed over its GPU memory limit (plus tolerance) for the configured number of consecutive samples.",
		}, containerLabels),
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpufrac_container_gpu_memory_actions_total",
			Help: "Enforcement actions against a container over its GPU memory limit. action: kill (one process) or evict (the pod). result: success; skipped (the process had exited or its PID was reused: nothing was signalled); failed.",
		}, actionLabels),
		nodeViolation: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpufrac_memory_limit_violations_total",
			Help: "GPU memory limit violations on this node, by the configured action (report, kill or evict). Unlike the per-container counter it survives the container.",
		}, []string{"action"}),
		nodeAction: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpufrac_memory_limit_actions_total",
			Help: "Enforcement actions on this node, by action (kill, evict) and result (success, skipped: the process was gone or its PID reused, failed).",
		}, []string{"action", "result"}),
		gpuUsed: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpufrac_gpu_process_memory_used_bytes",
			Help: "GPU memory held by processes at the last watchdog poll, by owner: managed (a container holding a gpufrac device on the GPU) or unknown (host processes, containers without a device on it, processes that cannot be mapped to a pod).",
		}, []string{"gpu_uuid", "owner"}),
		gpuProcs: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpufrac_gpu_processes",
			Help: "Processes holding memory on the GPU at the last watchdog poll, by owner (managed or unknown, as for gpufrac_gpu_process_memory_used_bytes).",
		}, []string{"gpu_uuid", "owner"}),
		nvmlErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpufrac_enforcement_nvml_errors_total",
			Help: "Watchdog polls that could not list a GPU's processes through NVML; the GPU is skipped for that poll and nothing on it is acted on.",
		}, []string{"gpu_uuid"}),
		deviceErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpufrac_enforcement_podresources_errors_total",
			Help: "Watchdog polls skipped because the kubelet's PodResources API could not be read.",
		}),
		pollDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "gpufrac_enforcement_poll_duration_seconds",
			Help:    "Time one watchdog poll took: NVML process lists, /proc reads, limit checks and actions.",
			Buckets: []float64{1e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 1},
		}),
	}
	reg.MustRegister(m.used, m.limit, m.violations, m.actions, m.nodeViolation, m.nodeAction,
		m.gpuUsed, m.gpuProcs, m.nvmlErrors, m.deviceErrors, m.pollDuration)
	return m
}

// seriesKey is one per-container, per-GPU label set.
type seriesKey struct {
	ContainerKey
	gpu string
}

// values are the label values of k, in containerLabels order.
func (k seriesKey) values() []string {
	return []string{k.Namespace, k.Pod, k.Container, k.gpu}
}

func (k seriesKey) labels() prometheus.Labels {
	return prometheus.Labels{"namespace": k.Namespace, "pod": k.Pod, "container": k.Container, "gpu_uuid": k.gpu}
}

// deleteSeries drops every per-container series of k.
func (m *metrics) deleteSeries(k seriesKey) {
	l := k.labels()
	m.used.Delete(l)
	m.limit.Delete(l)
	m.violations.Delete(l)
	m.actions.DeletePartialMatch(l)
}
