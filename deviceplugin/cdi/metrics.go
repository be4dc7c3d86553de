package cdi

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the Checker's gauges and the refusals of the resources it wraps.
type metrics struct {
	served     prometheus.Gauge
	unresolved prometheus.Gauge
	specErrors prometheus.Gauge
	refused    *prometheus.CounterVec
}

func newMetrics() *metrics {
	return &metrics{
		served: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpufrac_cdi_devices_served",
			Help: "CDI device names the node hands out (--device-list-strategy=cdi): one per GPU and MIG device served.",
		}),
		unresolved: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpufrac_cdi_devices_unresolved",
			Help: "CDI device names the node hands out that no CDI spec in its spec directories resolves (missing toolkit spec, or one stale after a MIG layout change); pods given them cannot start.",
		}),
		specErrors: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpufrac_cdi_spec_error_files",
			Help: "CDI spec files in the node's spec directories that could not be used (unreadable or invalid), as of the last check (a gauge).",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpufrac_cdi_allocations_refused_total",
			Help: "Container allocations refused because a CDI device they would get resolves in no spec, by resource.",
		}, []string{"resource"}),
	}
}

func (m *metrics) register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.served, m.unresolved, m.specErrors, m.refused} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

func (m *metrics) observe(served int, st Status) {
	m.served.Set(float64(served))
	m.unresolved.Set(float64(len(st.Missing)))
	m.specErrors.Set(float64(len(st.SpecErrors)))
}
