package scheduler

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	cycleDuration prometheus.Histogram
	pending       *prometheus.GaugeVec
	pendingAge    *prometheus.GaugeVec
	bindings      *prometheus.CounterVec
	bindDuration  prometheus.Histogram

	placeholdersCreated prometheus.Counter
	placeholderLanded   prometheus.Counter
	fractionsEvicted    *prometheus.CounterVec
	nonPreemptibleLost  *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		cycleDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "gpufrac_scheduling_cycle_duration_seconds",
			Help:    "Time of one scheduling cycle: snapshot, admission, placement of every pending pod.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		pending: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpufrac_pending_pods",
			Help: "Pods left pending by the last cycle, by reason: OverQuota, OverLimit, GangIncomplete, NoCapacity, InvalidRequest, ReservationPending, BindingFailed, WaitingToBind (admitted, not placed yet because the bind queue was full), NextCycle (not placed yet because the cycle spent its place budget) or NodeSettling (placed on a node that settles after it lost a NoExecute taint, bound once it has); the last three are never written on a pod.",
		}, []string{"reason"}),
		pendingAge: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpufrac_pending_pods_oldest_age_seconds",
			Help: "Age (since creation) of the oldest pod the last cycle left pending, by reason (as gpufrac_pending_pods); no series for a reason with no pod.",
		}, []string{"reason"}),
		bindings: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpufrac_bindings_total",
			Help: "Pod bindings attempted, by result (\"success\" or \"error\").",
		}, []string{"result"}),
		bindDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "gpufrac_binding_duration_seconds",
			Help:    "Time to annotate and bind one pod.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
	}
	m.placeholdersCreated = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "gpufrac_placeholders_created_total",
		Help: "Placeholder pods created to ask the autoscaler for GPU capacity.",
	})
	m.placeholderLanded = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "gpufrac_placeholders_landed_total",
		Help: "Placeholder pods that were scheduled onto a node (the capacity arrived) and released for the real pods.",
	})
	m.fractionsEvicted = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpufrac_fractions_evicted_total",
		Help: "Fraction pods the coordinator evicted to keep a GPU's sharing safe, by reason: gpu_taken (the GPU's reservation was lost and the node agent gave the GPU whole to another pod while the fraction ran there).",
	}, []string{"reason"})
	m.nonPreemptibleLost = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpufrac_nonpreemptible_pods_lost_total",
		Help: "Pods the coordinator admitted non-preemptible and bound that Kubernetes deleted before they finished (a spot interruption, a drain), by the reason of their DisruptionTarget condition: DeletionByPodGC (their node was gone), DeletionByTaintManager (a NoExecute taint), EvictionByEvictionAPI (an eviction, a drain), TerminationByKubelet (node shutdown or pressure), PreemptionByScheduler, or Other.",
	}, []string{"reason"})
	for _, c := range []prometheus.Collector{m.cycleDuration, m.pending, m.pendingAge, m.bindings, m.bindDuration, m.placeholdersCreated, m.placeholderLanded, m.fractionsEvicted, m.nonPreemptibleLost} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// cycle records a cycle that began at start and took d.
func (m *metrics) cycle(start time.Time, d time.Duration, r Result) {
	m.cycleDuration.Observe(d.Seconds())
	m.pending.Reset()
	for reason, n := range r.Pending {
		m.pending.WithLabelValues(reason).Set(float64(n))
	}
	m.pendingAge.Reset()
	for reason, t := range r.OldestPending {
		m.pendingAge.WithLabelValues(reason).Set(max(start.Sub(t), 0).Seconds())
	}
}

func (m *metrics) bind(err error, d time.Duration) {
	result := "success"
	if err != nil {
		result = "error"
	}
	m.bindings.WithLabelValues(result).Inc()
	m.bindDuration.Observe(d.Seconds())
}
