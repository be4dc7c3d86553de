package config

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Values of the result label of gpufrac_config_reloads_total.
const (
	reloadSuccess  = "success"
	reloadRejected = "rejected"
)

// metrics are the Watcher's reload counters. They are registered on the
// Registerer given to NewWatcher, never on a global one.
type metrics struct {
	reloads     *prometheus.CounterVec
	lastSuccess prometheus.Gauge
	lastOK      prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpufrac_config_reloads_total",
			Help: "Config file loads by result: success (the file was read and is now in force, " +
				"including a return to the config already in force) or rejected (the file could not be " +
				"read or is invalid; the last good config stays in force).",
		}, []string{"result"}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpufrac_config_last_reload_success_timestamp_seconds",
			Help: "Unix time of the last successful config load; 0 before the first.",
		}),
		lastOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpufrac_config_last_reload_successful",
			Help: "1 when the last config load succeeded, 0 when it was rejected (the node keeps its last good config, or its defaults, until a valid one appears).",
		}),
	}
	// Both series exist from the start, so rate() and alerts see a zero.
	m.reloads.WithLabelValues(reloadSuccess)
	m.reloads.WithLabelValues(reloadRejected)
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.reloads, m.lastSuccess, m.lastOK} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering config reload metrics: %w", err)
		}
	}
	return m, nil
}
