// Package sim replays an openb workload against the placement library
// (coordinator/placement, the code the coordinator runs) and measures the
// GPU allocation ratio against arrived demand, as the FGD paper does.
package sim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/gpufrac/gpufrac/cmd/gpufrac-sim/internal/openb"
	"github.com/gpufrac/gpufrac/coordinator/placement"
)

// Spec is what one experiment replays.
type Spec struct {
	// Nodes is the cluster; Pods the base trace (variant applied).
	Nodes []openb.NodeSpec
	Pods  []openb.Pod
	// Inflation is the arrived GPU demand at the end, as a share of capacity (1.3).
	Inflation float64
	// Coverage is the share of pods the typical-pod mix covers (0.95).
	Coverage float64
}

// Event is the cluster after one pod was tried.
type Event struct {
	// Arrived is the GPU milli of all pods tried so far, failed ones included.
	Arrived int64
	// Allocated is the GPU milli in use.
	Allocated int64
	// Frag is the cluster's fragmented GPU milli (FGD's frag amount).
	Frag float64
	// Placed reports whether this pod found a node.
	Placed bool
}

// Result is one policy's run on one seed.
type Result struct {
	Policy   string
	Seed     uint64
	Capacity int64
	// Alloc and Frag are the curves: column x (0..100×inflation) is the mean,
	// over events whose arrived demand rounds to x% of capacity, of the
	// allocated (fragmented) GPU milli in % of capacity.
	Alloc []float64
	Frag  []float64
	// Events has one entry per pod tried, in arrival order.
	Events []Event
	// Placed and Failed count pods; Elapsed is the run's wall time.
	Placed, Failed int
	Elapsed        time.Duration
}

// RunOne replays the seed's workload with one policy. It stops early with
// ctx's error when ctx ends.
func RunOne(ctx context.Context, spec *Spec, policy string, seed uint64) (*Result, error) {
	capacity := openb.CapacityMilli(spec.Nodes)
	if capacity == 0 {
		return nil, errors.New("running simulation: the cluster has no GPUs")
	}
	pods := openb.Workload(spec.Pods, capacity, spec.Inflation, seed)
	return replay(ctx, spec, pods, policy, seed, capacity)
}

func replay(ctx context.Context, spec *Spec, pods []openb.Pod, policy string, seed uint64, capacity int64) (*Result, error) {
	typical := placement.TypicalFromRequests(openb.Requests(spec.Pods), spec.Coverage)
	start := time.Now()
	snap, err := placement.NewSnapshot(openb.Nodes(spec.Nodes, openb.NodeOrder(len(spec.Nodes), seed)))
	if err != nil {
		return nil, fmt.Errorf("running %s seed %d: %w", policy, seed, err)
	}
	placer, err := placement.New(policy, placement.Options{Seed: seed, Typical: typical})
	if err != nil {
		return nil, fmt.Errorf("running %s seed %d: %w", policy, seed, err)
	}
	meter, err := placement.NewFragMeter(typical)
	if err != nil {
		return nil, fmt.Errorf("running %s seed %d: %w", policy, seed, err)
	}
	nodeFrag := make([]float64, snap.Len())
	frag := 0.0
	for i := range nodeFrag {
		nodeFrag[i] = meter.Node(snap, i)
		frag += nodeFrag[i]
	}

	res := &Result{Policy: policy, Seed: seed, Capacity: capacity, Events: make([]Event, 0, len(pods))}
	var arrived, allocated int64
	for k := range pods {
		if k%1024 == 0 && ctx.Err() != nil {
			return nil, fmt.Errorf("running %s seed %d: %w", policy, seed, ctx.Err())
		}
		r := pods[k].Request()
		arrived += r.GPUMilli()
		// The pod has arrived: it is part of the demand the coordinator
		// would see (pending or placed), whether or not it fits.
		snap.AddDemand(&r)
		d, err := placer.Place(snap, &r)
		switch {
		case errors.Is(err, placement.ErrUnschedulable):
			res.Failed++
		case err != nil:
			return nil, fmt.Errorf("running %s seed %d, pod %s: %w", policy, seed, pods[k].Name, err)
		default:
			if err := snap.Assume(&r, d); err != nil {
				return nil, fmt.Errorf("running %s seed %d, pod %s: %w", policy, seed, pods[k].Name, err)
			}
			res.Placed++
			allocated += r.GPUMilli()
			f := meter.Node(snap, d.NodeIndex)
			frag += f - nodeFrag[d.NodeIndex]
			nodeFrag[d.NodeIndex] = f
		}
		res.Events = append(res.Events, Event{Arrived: arrived, Allocated: allocated, Frag: frag, Placed: err == nil})
	}
	res.Elapsed = time.Since(start)
	res.Alloc, res.Frag = curves(res.Events, capacity, int(math.Round(100*spec.Inflation)))
	return res, nil
}

// curves bins events by arrived demand (METHOD.md, "Metric"): column x is the
// mean over events with round(100·arrived/capacity) = x; a column no event
// falls in takes the events of columns x−1..x+1.
func curves(events []Event, capacity int64, cols int) (alloc, frag []float64) {
	n := make([]int, cols+1)
	sumA := make([]float64, cols+1)
	sumF := make([]float64, cols+1)
	for _, e := range events {
		x := int(math.Round(100 * float64(e.Arrived) / float64(capacity)))
		if x < 0 || x > cols {
			continue
		}
		n[x]++
		sumA[x] += 100 * float64(e.Allocated) / float64(capacity)
		sumF[x] += 100 * e.Frag / float64(capacity)
	}
	alloc, frag = make([]float64, cols+1), make([]float64, cols+1)
	for x := range alloc {
		cnt, a, f := 0, 0.0, 0.0
		for y := x - 1; y <= x+1; y++ {
			if y == x || (n[x] == 0 && y >= 0 && y <= cols) {
				cnt, a, f = cnt+n[y], a+sumA[y], f+sumF[y]
			}
		}
		if cnt == 0 {
			alloc[x], frag[x] = math.NaN(), math.NaN()
			continue
		}
		alloc[x], frag[x] = a/float64(cnt), f/float64(cnt)
	}
	return alloc, frag
}

// Job is one (policy, seed) run.
type Job struct {
	Policy string
	Seed   uint64
}

// RunAll runs every policy on every seed with workers goroutines and returns
// the results in jobs order. It stops early when ctx ends.
func RunAll(ctx context.Context, spec *Spec, jobs []Job, workers int) ([]*Result, error) {
	results := make([]*Result, len(jobs))
	errs := make([]error, len(jobs))
	next := make(chan int)
	var wg sync.WaitGroup
	for range max(workers, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range next {
				results[j], errs[j] = RunOne(ctx, spec, jobs[j].Policy, jobs[j].Seed)
			}
		}()
	}
	var err error
feed:
	for j := range jobs {
		select {
		case next <- j:
		case <-ctx.Done():
			err = fmt.Errorf("running simulations: %w", ctx.Err())
			break feed
		}
	}
	close(next)
	wg.Wait()
	if err != nil {
		return nil, err
	}
	return results, errors.Join(errs...)
}
