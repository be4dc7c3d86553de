package reservation

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpufrac/gpufrac/coordinator/state"
)

// Values of the state label of gpufrac_reservations.
const (
	statePending = "pending" // the node agent has not written the GPU the kubelet gave it yet
	stateInUse   = "in_use"  // fractions are bound or assumed on its GPU
	stateIdle    = "idle"    // ready, no fraction on its GPU (removed after the grace)
)

// metrics are the reservations' gauges, set by every Reconcile.
type metrics struct {
	reservations *prometheus.GaugeVec
	idleMax      prometheus.Gauge
}

// Register registers the manager's metrics on reg; without it they are kept
// but not exported.
func (m *Manager) Register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.metrics.reservations, m.metrics.idleMax} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

func newMetrics() *metrics {
	return &metrics{
		reservations: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpufrac_reservations",
			Help: "Reservation pods at the last cycle, by state: pending (waiting for the kubelet to admit it on its GPU), in_use (fractions run on its GPU) or idle (no fraction; removed after the grace period).",
		}, []string{"state"}),
		idleMax: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpufrac_reservation_idle_max_seconds",
			Help: "How long the longest-idle reservation pod has held its GPU without any fraction; it is removed after --reservation-grace, so a value well beyond it means reservations are not cleaned up.",
		}),
	}
}

// observe sets the gauges from a Reconcile's view.
func (m *metrics) observe(rs map[state.NodeGPU]*state.Reservation, idleSince map[state.NodeGPU]time.Time, now time.Time) {
	counts := map[string]float64{statePending: 0, stateInUse: 0, stateIdle: 0}
	for _, r := range rs {
		switch {
		case r.Fractions > 0:
			counts[stateInUse]++
		case !r.Ready:
			counts[statePending]++
		default:
			counts[stateIdle]++
		}
	}
	for s, n := range counts {
		m.reservations.WithLabelValues(s).Set(n)
	}
	var longest time.Duration
	for key, since := range idleSince {
		if rs[key] != nil {
			longest = max(longest, now.Sub(since))
		}
	}
	m.idleMax.Set(longest.Seconds())
}
