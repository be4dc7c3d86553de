package miglayout

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the layout manager's metrics: pending changes, NVML
// operations and one series per MIG device.
type metrics struct {
	m          *Manager
	pending    *prometheus.GaugeVec
	operations *prometheus.CounterVec
	scrapeMu   sync.Mutex // serialises device scrapes
}

var (
	descDeviceMemory = prometheus.NewDesc("gpufrac_mig_device_memory_total_bytes",
		"Memory of a MIG device (of its GPU instance). profile is the device's MIG profile (\"1g.10gb\", \"1c.3g.40gb\").",
		[]string{"gpu_uuid", "mig_uuid", "profile"}, nil)
	descDeviceAllocated = prometheus.NewDesc("gpufrac_mig_device_allocated",
		"1 when the kubelet has allocated the MIG device to a container, 0 when it is free. Absent when PodResources cannot be read.",
		[]string{"gpu_uuid", "mig_uuid", "profile"}, nil)
)

func newMetrics(m *Manager) *metrics {
	return &metrics{
		m: m,
		pending: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpufrac_mig_layout_pending",
			Help: "1 for each GPU whose declared MIG mode or layout is not applied yet, by reason: " +
				"DevicesAllocated (deferred until pods free the GPU), AllocationsUnknown (PodResources unreadable), " +
				"ResetRequired (the MIG mode change needs a GPU reset; the mode was left as found), " +
				"InUse (processes use the GPU), NoLayout (mode mig without a layout while MIG is off), " +
				"NotSupported (no MIG, or the layout does not fit), NVMLError (an NVML call failed; retried with back-off), " +
				"NoPermission (NVML refused the change: no SYS_ADMIN) or ExternalOwner (mig.owner external, and the GPU's MIG mode " +
				"does not match its gpufrac mode).",
		}, []string{"gpu_uuid", "reason"}),
		operations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpufrac_mig_operations_total",
			Help: "MIG changes the layout manager made through NVML, by operation (create_instance, destroy_instance, enable_mig, disable_mig) and result (success, error).",
		}, []string{"operation", "result"}),
	}
}

func (x *metrics) register(reg prometheus.Registerer) {
	reg.MustRegister(x.pending, x.operations, x)
}

// setPending replaces the pending series with the GPUs not applied.
func (x *metrics) setPending(statuses []Status) {
	x.pending.Reset()
	for _, s := range statuses {
		if s.State != StateApplied {
			x.pending.WithLabelValues(s.GPU, s.Reason).Set(1)
		}
	}
}

func (x *metrics) operation(op string, err error) {
	result := "success"
	if err != nil {
		result = "error"
	}
	x.operations.WithLabelValues(op, result).Inc()
}

// Describe implements prometheus.Collector for the per-device series.
func (x *metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- descDeviceMemory
	ch <- descDeviceAllocated
}

// Collect implements prometheus.Collector: one series per MIG device the
// manager last saw, allocated or not according to PodResources.
func (x *metrics) Collect(ch chan<- prometheus.Metric) {
	x.scrapeMu.Lock()
	defer x.scrapeMu.Unlock()
	var allocated map[string]bool
	if x.m.opts.Allocations != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		byResource, err := x.m.opts.Allocations(ctx)
		cancel()
		if err == nil {
			allocated = map[string]bool{}
			for _, ids := range byResource {
				for _, id := range ids {
					allocated[id] = true
				}
			}
		}
	}
	for gpu, devs := range x.m.Devices() {
		for _, d := range devs {
			ch <- prometheus.MustNewConstMetric(descDeviceMemory, prometheus.GaugeValue, float64(d.MemoryBytes), gpu, d.UUID, d.Profile)
			if allocated != nil {
				v := 0.0
				if allocated[d.UUID] {
					v = 1
				}
				ch <- prometheus.MustNewConstMetric(descDeviceAllocated, prometheus.GaugeValue, v, gpu, d.UUID, d.Profile)
			}
		}
	}
}
