package metrics

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpufrac/gpufrac/timeslice"
)

// TimesliceOffer is what a node time-slices right now: the replicas each GPU offers
// and the resource they are served as.
type TimesliceOffer struct {
	Sharing timeslice.Sharing
	// GPUs are the UUIDs of the GPUs in timeslice mode.
	GPUs []string
}

// TimesliceSources are what the replica collector reads at scrape time.
type TimesliceSources struct {
	// Offer returns the current time-slicing (nil or no GPUs: nothing is
	// reported).
	Offer func() TimesliceOffer
	// Allocations lists allocated device IDs by resource name (from
	// PodResources); nil or an error leaves the allocated series out.
	Allocations func(ctx context.Context) (map[string][]string, error)
}

var (
	descReplicas = prometheus.NewDesc("gpufrac_timeslice_replicas",
		"Time-sliced replicas the GPU offers (timeslice.replicas) under resource.",
		[]string{"gpu_uuid", "resource"}, nil)
	descReplicasAllocated = prometheus.NewDesc("gpufrac_timeslice_replicas_allocated",
		"Time-sliced replicas of the GPU the kubelet has allocated to containers.",
		[]string{"gpu_uuid", "resource"}, nil)
)

// TimesliceCollector exports per-GPU replica counts, offered and allocated.
type TimesliceCollector struct {
	src TimesliceSources
	mu  sync.Mutex // serialises scrapes
}

// NewTimesliceCollector registers a replica collector on reg.
func NewTimesliceCollector(reg prometheus.Registerer, src TimesliceSources) *TimesliceCollector {
	c := &TimesliceCollector{src: src}
	reg.MustRegister(c)
	return c
}

// Describe implements prometheus.Collector.
func (c *TimesliceCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descReplicas
	ch <- descReplicasAllocated
}

// Collect implements prometheus.Collector.
func (c *TimesliceCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.src.Offer == nil {
		return
	}
	offer := c.src.Offer()
	if len(offer.GPUs) == 0 {
		return
	}
	var held map[string]int // GPU UUID -> allocated replicas
	if c.src.Allocations != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		byResource, err := c.src.Allocations(ctx)
		cancel()
		if err == nil {
			held = map[string]int{}
			for _, id := range byResource[offer.Sharing.ResourceName] {
				if i := strings.LastIndex(id, "::"); i > 0 {
					held[id[:i]]++
				}
			}
		}
	}
	name := offer.Sharing.ResourceName
	for _, g := range offer.GPUs {
		ch <- prometheus.MustNewConstMetric(descReplicas, prometheus.GaugeValue, float64(offer.Sharing.Replicas), g, name)
		if held != nil {
			ch <- prometheus.MustNewConstMetric(descReplicasAllocated, prometheus.GaugeValue, float64(held[g]), g, name)
		}
	}
}
