package consolidation

import (
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

// Writes that can fail (label action of gpufrac_consolidation_errors_total).
const (
	ActionTaint   = "taint"
	ActionUntaint = "untaint"
	ActionRelease = "release"
	ActionRead    = "read"
	ActionDelete  = "delete"
)

type metrics struct {
	drains      *prometheus.CounterVec
	evictions   *prometheus.CounterVec
	errors      *prometheus.CounterVec
	released    prometheus.Counter
	deleted     prometheus.Counter
	drainedGPUs prometheus.Counter
	saving      prometheus.Counter
	draining    prometheus.Gauge
	inFlight    prometheus.Gauge
	nodes       *prometheus.GaugeVec
	pass        prometheus.Histogram
}

// newMetrics registers the controller's metrics on reg. A controller is
// built once per leadership (the process ends when the lease is lost), so a
// second registration is a bug and fails.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		drains: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpufrac_consolidation_drains_total",
			Help: "Node drains by outcome: started (the node was tainted gpufrac.io/draining), drained (its gpufrac pods and reservations are gone; Karpenter may remove it), abandoned (the taint was removed: a protected pod arrived, the rest no longer fit, work waits for capacity, or the deadline passed).",
		}, []string{"outcome"}),
		evictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpufrac_consolidation_evictions_total",
			Help: "Evictions of pods on draining nodes (one per pod moved) by result: evicted (the Eviction API accepted it), refused (429: a PodDisruptionBudget said no; retried on a later pass), failed (any other error; retried).",
		}, []string{"result"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpufrac_consolidation_errors_total",
			Help: "Failed consolidation writes and reads by action, each retried on a later pass: taint (starting a drain), untaint (abandoning one), release (deleting a drained node's reservation), read (listing the cluster), delete (deleting a drained node, or listing its pods right before).",
		}, []string{"action"}),
		released: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpufrac_consolidation_reservations_released_total",
			Help: "Reservation pods deleted on draining nodes once no fraction used their GPU.",
		}),
		deleted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpufrac_consolidation_nodes_deleted_total",
			Help: "Drained nodes the coordinator deleted (--consolidation-delete-drained-nodes) so that Karpenter terminates them at once.",
		}),
		drainedGPUs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpufrac_consolidation_drained_gpus_total",
			Help: "GPUs of the nodes drained for Karpenter to remove.",
		}),
		saving: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpufrac_consolidation_drained_hourly_price_total",
			Help: "Sum of the hourly prices of the nodes drained (the price table's unit; GPUs without a table): what each removal saves per hour it would have run.",
		}),
		draining: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpufrac_consolidation_draining_nodes",
			Help: "Nodes tainted gpufrac.io/draining.",
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpufrac_consolidation_moves_in_flight",
			Help: "Moved pods not settled yet (terminating on a draining node, or the coordinator's pods waiting to be placed): what the disruption budget --consolidation-max-in-flight bounds.",
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
	for _, c := range []prometheus.Collector{m.drains, m.evictions, m.errors, m.released, m.deleted, m.drainedGPUs, m.saving, m.draining, m.inFlight, m.nodes, m.pass} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, o := range []string{OutcomeStarted, OutcomeDrained, OutcomeAbandoned} {
		m.drains.WithLabelValues(o)
	}
	for _, r := range []string{ResultEvicted, ResultRefused, ResultFailed} {
		m.evictions.WithLabelValues(r)
	}
	for _, a := range []string{ActionTaint, ActionUntaint, ActionRelease, ActionRead, ActionDelete} {
		m.errors.WithLabelValues(a)
	}
	for _, v := range Verdicts() {
		m.nodes.WithLabelValues(string(v))
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
