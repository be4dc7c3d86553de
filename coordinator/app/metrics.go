package app

import (
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// registerMetrics registers the replica's own metrics: build information,
// whether it leads, and the Go and process collectors. Every replica exports
// them, standby ones included, so an alert can tell "no replica leads" from
// "no replica runs".
func (a *App) registerMetrics() error {
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "gpufrac_build_info", Help: "Always 1; labels carry the gpufrac version and the Go version it was built with.",
		ConstLabels: prometheus.Labels{"version": a.cfg.Version, "goversion": runtime.Version(), "component": "gpufrac-coordinator"},
	})
	build.Set(1)
	leader := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "gpufrac_coordinator_leader",
		Help: "1 while this replica holds the leader-election Lease and schedules (always 1 without leader election), 0 while it stands by.",
	}, func() float64 {
		if a.leading.Load() {
			return 1
		}
		return 0
	})
	for _, c := range []prometheus.Collector{build, leader, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		if err := a.reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
