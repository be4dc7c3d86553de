package consolidation

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Outcomes of a drain (label outcome of gpufrac_consolidation_drains_total).
const (
	OutcomeStarted   = "started"
	OutcomeDrained   = "drained"
	OutcomeAbandoned = "abandoned"
)

// Results of an eviction (label result of gpufrac_consolidation_evictions_total).
const (
	ResultEvicted = "evicted"
	ResultRefused = "refused"
	ResultFailed  = "failed"
)

type metrics struct {
	drains    *prometheus.CounterVec
	evictions *prometheus.CounterVec
	released  prometheus.Counter
	draining  prometheus.Gauge
	nodes     *prometheus.GaugeVec
	pass      prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		drains: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpufrac_consolidation_drains_total",
			Help: "Node drains by outcome: started (the node was tainted gpufrac.io/draining), drained (its gpufrac pods and reservations are gone; Karpenter may remove it), abandoned (the taint was removed: a protected pod arrived, the rest no longer fit, or the deadline passed).",
		}, []string{"outcome"}),
		evictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpufrac_consolidation_evictions_total",
			Help: "Evictions of pods on draining nodes by result: evicted (the Eviction API accepted it), refused (429: a PodDisruptionBudget said no; retried on a later pass), failed (any other error).",
		}, []string{"result"}),
		released: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpufrac_consolidation_reservations_released_total",
			Help: "Reservation pods deleted on draining nodes once no fraction used their GPU.",
		}),
		draining: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpufrac_consolidation_draining_nodes",
			Help: "Nodes tainted gpufrac.io/draining.",
		}),
		nodes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpufrac_consolidation_nodes",
			Help: "Nodes by the last pass's verdict: candidate (worth draining), not_removable (not a Ready Karpenter GPU node), nothing_to_move, protected (a pod there may not move), busy (placeholders or terminating pods), pdb (a PodDisruptionBudget forbids the move), does_not_fit (its pods fit nowhere else), below_threshold (the saving does not outweigh the restarts), draining.",
		}, []string{"verdict"}),
		pass: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "gpufrac_consolidation_pass_duration_seconds",
			Help:    "Time of one consolidation pass (planning, simulation and writes).",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 8),
		}),
	}
	for _, c := range []prometheus.Collector{m.drains, m.evictions, m.released, m.draining, m.nodes, m.pass} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return nil, err
			}
		}
	}
	for _, o := range []string{OutcomeStarted, OutcomeDrained, OutcomeAbandoned} {
		m.drains.WithLabelValues(o)
	}
	for _, r := range []string{ResultEvicted, ResultRefused, ResultFailed} {
		m.evictions.WithLabelValues(r)
	}
	return m, nil
}

// verdicts sets the node gauge from one pass's verdicts.
func (m *metrics) verdicts(vs []NodeVerdict) {
	counts := map[Verdict]int{}
	for _, v := range vs {
		counts[v.Verdict]++
	}
	for _, v := range Verdicts() {
		m.nodes.WithLabelValues(string(v)).Set(float64(counts[v]))
	}
}

func (m *metrics) observePass(d time.Duration) { m.pass.Observe(d.Seconds()) }
