// Package metrics exports the node agent's Prometheus metrics: per-GPU
// state read from NVML at scrape time, fraction units allocated, health and
// Xid counts, allocation outcomes and build information. Everything is
// registered on a prometheus.Registerer passed in; nothing is global.
package metrics

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
)

// Sources are what the GPU collector reads at scrape time.
type Sources struct {
	Lib nvidia.Lib
	// GPUs lists the GPUs to report.
	GPUs func() []nvidia.GPU
	// Healthy tells a GPU's health (nil: all healthy).
	Healthy resource.HealthFunc
	// Usage gives fraction units allocated per GPU (nil: not reported).
	Usage resource.UsageSource
}

// Metrics holds the node agent's metrics.
type Metrics struct {
	xids        *prometheus.CounterVec
	allocations *prometheus.CounterVec
	allocateDur *prometheus.HistogramVec
	nvmlErrors  *prometheus.CounterVec
	failClosed  prometheus.Gauge
	collector   *gpuCollector
}

// New registers the node agent's metrics on reg.
func New(reg prometheus.Registerer, src Sources, version string) *Metrics {
	m := &Metrics{
		xids: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpufrac_gpu_xid_errors_total",
			Help: "Xid errors NVML reported per GPU. critical is \"true\" for Xids that mark the GPU unhealthy, \"false\" for ignored application Xids.",
		}, []string{"gpu_uuid", "xid", "critical"}),
		allocations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpufrac_allocations_total",
			Help: "Container allocations answered by the device plugin, by resource and result (\"success\" or \"error\").",
		}, []string{"resource", "result"}),
		allocateDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gpufrac_allocate_duration_seconds",
			Help:    "Time the device plugin spent answering one container's Allocate, by resource.",
			Buckets: []float64{1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 0.1},
		}, []string{"resource"}),
		nvmlErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpufrac_nvml_errors_total",
			Help: "NVML queries that failed at scrape time, by query (\"memory\", \"utilization\").",
		}, []string{"query"}),
		failClosed: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpufrac_config_fail_closed",
			Help: "1 while gpufrac-node fails closed because its config was invalid at start (it serves whole GPUs only, no fractions, replicas or MIG devices) until a valid config is loaded; 0 otherwise.",
		}),
	}
	m.collector = &gpuCollector{src: src, errs: m.nvmlErrors}
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "gpufrac_build_info",
		Help:        "Always 1; labels carry the gpufrac version and the Go version it was built with.",
		ConstLabels: prometheus.Labels{"version": version, "goversion": runtime.Version(), "component": "gpufrac-node"},
	})
	build.Set(1)
	reg.MustRegister(m.xids, m.allocations, m.allocateDur, m.nvmlErrors, m.failClosed, m.collector, build)
	return m
}

// Xid counts an Xid event.
func (m *Metrics) Xid(ev nvidia.XidEvent, critical bool) {
	m.xids.WithLabelValues(ev.UUID, strconv.FormatUint(ev.Xid, 10), strconv.FormatBool(critical)).Inc()
}

// FailClosed sets gpufrac_config_fail_closed.
func (m *Metrics) FailClosed(on bool) {
	v := 0.
	if on {
		v = 1
	}
	m.failClosed.Set(v)
}

// Allocated implements plugin.Observer.
func (m *Metrics) Allocated(res string, _ []string, d time.Duration, err error) {
	result := "success"
	if err != nil {
		result = "error"
	}
	m.allocations.WithLabelValues(res, result).Inc()
	m.allocateDur.WithLabelValues(res).Observe(d.Seconds())
}

var (
	descMemTotal = prometheus.NewDesc("gpufrac_gpu_memory_total_bytes",
		"Total framebuffer memory of the GPU.", []string{"gpu_uuid", "gpu_index", "model"}, nil)
	descMemUsed = prometheus.NewDesc("gpufrac_gpu_memory_used_bytes",
		"Framebuffer memory in use on the GPU, all processes.", []string{"gpu_uuid"}, nil)
	descUtil = prometheus.NewDesc("gpufrac_gpu_utilization_ratio",
		"GPU compute utilization over NVML's last sample period, 0-1.", []string{"gpu_uuid"}, nil)
	descUnits = prometheus.NewDesc("gpufrac_gpu_fraction_units_allocated",
		"Fraction units (percent of the GPU) the kubelet has allocated on the GPU.", []string{"gpu_uuid"}, nil)
	descHealthy = prometheus.NewDesc("gpufrac_gpu_healthy",
		"1 when the GPU is advertised healthy, 0 when unhealthy (recent critical Xid or failing NVML queries).", []string{"gpu_uuid"}, nil)
)

// gpuCollector reads NVML at scrape time; a failing query skips that
// series for the scrape and counts the error.
type gpuCollector struct {
	src  Sources
	errs *prometheus.CounterVec
	mu   sync.Mutex // serialises scrapes so NVML is not hammered
}

func (c *gpuCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descMemTotal, descMemUsed, descUtil, descUnits, descHealthy} {
		ch <- d
	}
}

func (c *gpuCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.src.GPUs == nil || c.src.Lib == nil {
		return
	}
	var usage map[string]resource.GPUUsage
	if c.src.Usage != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		usage, _ = c.src.Usage.Usage(ctx)
		cancel()
	}
	for _, g := range c.src.GPUs() {
		ch <- prometheus.MustNewConstMetric(descMemTotal, prometheus.GaugeValue, float64(g.MemoryBytes), g.UUID, strconv.Itoa(g.Index), g.Name)
		if mem, err := c.src.Lib.Memory(g.UUID); err == nil {
			ch <- prometheus.MustNewConstMetric(descMemUsed, prometheus.GaugeValue, float64(mem.UsedBytes), g.UUID)
		} else {
			c.errs.WithLabelValues("memory").Inc()
		}
		if u, err := c.src.Lib.Utilization(g.UUID); err == nil {
			ch <- prometheus.MustNewConstMetric(descUtil, prometheus.GaugeValue, float64(u)/100, g.UUID)
		} else {
			c.errs.WithLabelValues("utilization").Inc()
		}
		if usage != nil {
			ch <- prometheus.MustNewConstMetric(descUnits, prometheus.GaugeValue, float64(usage[g.UUID].Units), g.UUID)
		}
		healthy := 1.0
		if c.src.Healthy != nil && !c.src.Healthy(g.UUID) {
			healthy = 0
		}
		ch <- prometheus.MustNewConstMetric(descHealthy, prometheus.GaugeValue, healthy, g.UUID)
	}
}
