package scheduler

import (
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

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

	idleSkipped prometheus.Counter

	queuePending        *prometheus.GaugeVec
	queueAllocated      *prometheus.GaugeVec
	queueNonPreemptible *prometheus.GaugeVec
	queueQuota          *prometheus.GaugeVec
	queueLimit          *prometheus.GaugeVec
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
			Help: "Pods left pending by the last cycle, by reason: OverQuota, OverLimit, GangIncomplete, NotAdmittedByKueue, NoCapacity, DriftedNodesOnly (room only on nodes Karpenter marked Drifted), InvalidRequest, ReservationPending, BindingFailed, WaitingToBind (admitted, not placed yet because the bind queue was full), NextCycle (not placed yet because the cycle spent its place budget) or NodeSettling (placed on a node that settles after it lost a NoExecute taint, bound once it has); the last three are never written on a pod.",
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
	m.idleSkipped = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "gpufrac_scheduling_cycles_skipped_total",
		Help: "Cycles not run because the cluster was idle: the last cycle left nothing pending or in flight and nothing happened since (no informer event, binding or API write); one runs at least every --idle-resync.",
	})
	// Per queue: a queue is named by an admin's Queue object, never by a
	// tenant's label, so the series are as many as the Queues.
	m.queuePending = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpufrac_queue_pending_pods",
		Help: "Pods left pending by the last cycle, by queue and reason (the reasons of gpufrac_pending_pods); queue=\"\" for pods whose queue is not a Queue (their request could not be read, or names no Queue).",
	}, []string{"queue", "reason"})
	m.queueAllocated = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpufrac_queue_allocated_gpus",
		Help: "GPUs (fractions as parts of one) used by the queue's running and binding pods, its children's included, as the last cycle counted them (the Queue's status.allocated).",
	}, []string{"queue"})
	m.queueNonPreemptible = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpufrac_queue_allocated_nonpreemptible_gpus",
		Help: "The part of gpufrac_queue_allocated_gpus that is non-preemptible.",
	}, []string{"queue"})
	m.queueQuota = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpufrac_queue_quota_gpus",
		Help: "The queue's deserved GPU quota (spec.resources.gpu.quota; 0 when absent).",
	}, []string{"queue"})
	m.queueLimit = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpufrac_queue_limit_gpus",
		Help: "The queue's GPU limit (spec.resources.gpu.limit); no series for a queue without one (unlimited).",
	}, []string{"queue"})
	for _, c := range []prometheus.Collector{m.cycleDuration, m.pending, m.pendingAge, m.bindings, m.bindDuration, m.placeholdersCreated, m.placeholderLanded, m.fractionsEvicted, m.nonPreemptibleLost,
		m.idleSkipped, m.queuePending, m.queueAllocated, m.queueNonPreemptible, m.queueQuota, m.queueLimit} {
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

// queueFigures is what a cycle knew of one queue.
type queueFigures struct {
	name                            string
	allocatedMilli, nonPreemptMilli int64
	quota, limit                    *resource.Quantity // GPUs; nil when absent
	// invalid: the Queue cannot be used; only its pending pods are counted.
	invalid bool
}

// queues records the queues' figures and the pods r left pending in each.
// Pods of a queue not among figs count under queue "".
func (m *metrics) queues(figs []queueFigures, r Result) {
	m.queueAllocated.Reset()
	m.queueNonPreemptible.Reset()
	m.queueQuota.Reset()
	m.queueLimit.Reset()
	known := make(map[string]bool, len(figs))
	for _, f := range figs {
		known[f.name] = true
		if f.invalid {
			continue
		}
		m.queueAllocated.WithLabelValues(f.name).Set(float64(f.allocatedMilli) / 1000)
		m.queueNonPreemptible.WithLabelValues(f.name).Set(float64(f.nonPreemptMilli) / 1000)
		quota := 0.0
		if f.quota != nil {
			quota = f.quota.AsApproximateFloat64()
		}
		m.queueQuota.WithLabelValues(f.name).Set(quota)
		if f.limit != nil {
			m.queueLimit.WithLabelValues(f.name).Set(f.limit.AsApproximateFloat64())
		}
	}
	m.queuePending.Reset()
	pending := map[QueueReason]int{}
	for qr, n := range r.QueuePending {
		if !known[qr.Queue] {
			qr.Queue = ""
		}
		pending[qr] += n
	}
	for qr, n := range pending {
		m.queuePending.WithLabelValues(qr.Queue, qr.Reason).Set(float64(n))
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
