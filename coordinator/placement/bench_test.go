package placement

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// benchMix is an openb-like request mix: shares of 810/470/320/650/230
// milli, whole GPUs, a few 2- and 8-GPU pods and CPU-only pods.
func benchMix() []Request {
	shares := []struct {
		m   int
		cpu int64
		n   int
	}{{810, 3152, 13}, {470, 11908, 9}, {320, 4000, 4}, {650, 11908, 3}, {230, 4000, 2}}
	var out []Request
	for _, s := range shares {
		for range s.n {
			out = append(out, Request{CPUMilli: s.cpu, MemoryBytes: 16 * gib, ShareMilli: s.m})
		}
	}
	for i := range 48 {
		out = append(out, Request{CPUMilli: []int64{11300, 11400, 3152, 12000}[i%4], MemoryBytes: 40 * gib, GPUs: 1})
	}
	out = append(out, Request{CPUMilli: 24000, MemoryBytes: 80 * gib, GPUs: 2}, Request{CPUMilli: 88000, MemoryBytes: 320 * gib, GPUs: 8})
	for range 13 {
		out = append(out, Request{CPUMilli: 12500, MemoryBytes: 24 * gib})
	}
	return out
}

// filledCluster is n nodes of 8 GPUs (96 cores, 384 GiB) about 60% used:
// each GPU is free, full, or holds one of the usual shares.
func filledCluster(b *testing.B, n int) *Snapshot {
	return filledClusterOf(b, n, func(int) string { return "G2" })
}

// filledClusterOf is filledCluster with node i of model model(i).
func filledClusterOf(b *testing.B, n int, model func(i int) string) *Snapshot {
	s, err := NewSnapshot(filledNodes(n, model))
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// filledNodes are filledClusterOf's nodes.
func filledNodes(n int, model func(i int) string) []Node {
	rng := rand.New(rand.NewPCG(uint64(n), 42))
	nodes := make([]Node, n)
	for i := range nodes {
		nd := Node{Name: fmt.Sprintf("node-%05d", i), Model: model(i), CPUMilli: 96000, MemoryBytes: 384 * gib, GPUs: make([]GPU, 8)}
		for g := range nd.GPUs {
			free := []int{1000, 1000, 1000, 0, 0, 0, 190, 530, 350, 680}[rng.IntN(10)]
			nd.GPUs[g] = GPU{ID: fmt.Sprintf("%s-%d", nd.Name, g), FreeMilli: free}
			nd.UsedCPUMilli += int64(1000-free) * 10
			nd.UsedMemoryBytes += int64(1000-free) * 40 * (gib / 1000)
		}
		nodes[i] = nd
	}
	return nodes
}

// BenchmarkPlace measures decisions per second on a partly filled cluster:
// each iteration places one request and assumes it, and forgets the oldest
// of the last 500 so the fill level stays put (one node changes per step,
// as in the coordinator).
func BenchmarkPlace(b *testing.B) {
	mix := benchMix()
	typical := TypicalFromRequests(mix, 0.95)
	for _, policy := range []string{"gpufrac", "fgd"} {
		for _, n := range []int{1500, 10000} {
			b.Run(fmt.Sprintf("%s/%dnodes", policy, n), func(b *testing.B) {
				s := filledCluster(b, n)
				p, err := New(policy, Options{Typical: typical})
				if err != nil {
					b.Fatal(err)
				}
				placeLoop(b, s, p, mix, false)
			})
		}
	}
}

// placeLoop places mix round and round on s, assuming each decision and
// forgetting the oldest of the last 500 so the fill level stays put (one
// node changes per step, as in the coordinator). With feed, every request
// is also added to the snapshot's demand first, as the coordinator and the
// simulator do.
func placeLoop(b *testing.B, s *Snapshot, p *Placer, mix []Request, feed bool) {
	type assumed struct {
		r *Request
		d Decision
	}
	ring := make([]assumed, 0, 500)
	next, placed := 0, 0
	for i := 0; b.Loop(); i++ {
		r := &mix[i%len(mix)]
		if feed {
			s.AddDemand(r)
		}
		d, err := p.Place(s, r)
		if err != nil {
			continue
		}
		placed++
		if err := s.Assume(r, d); err != nil {
			b.Fatal(err)
		}
		if len(ring) < cap(ring) {
			ring = append(ring, assumed{r, d})
			continue
		}
		if err := s.Forget(ring[next].r, ring[next].d); err != nil {
			b.Fatal(err)
		}
		ring[next] = assumed{r, d}
		next = (next + 1) % len(ring)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
	b.ReportMetric(float64(placed)/float64(b.N), "placed/op")
}

// BenchmarkPlaceCold is the first decision of a fresh Placer: every node is
// scored, nothing comes from the cache (the coordinator's worst case, after
// rebuilding its snapshot).
func BenchmarkPlaceCold(b *testing.B) {
	mix := benchMix()
	typical := TypicalFromRequests(mix, 0.95)
	for _, policy := range []string{"gpufrac", "fgd"} {
		for _, n := range []int{1500, 10000} {
			b.Run(fmt.Sprintf("%s/%dnodes", policy, n), func(b *testing.B) {
				s := filledCluster(b, n)
				r := &Request{CPUMilli: 4000, MemoryBytes: 16 * gib, ShareMilli: 470}
				for b.Loop() {
					p, err := New(policy, Options{Typical: typical})
					if err != nil {
						b.Fatal(err)
					}
					if _, err := p.Place(s, r); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkPlaceWithDemand is BenchmarkPlace with the demand the coordinator
// feeds (Snapshot.AddDemand, every request placed) on a cluster of two
// models, where a fifth of the requests may only use the smaller one (one
// node in seven): gpufrac's charges are live on every decision.
func BenchmarkPlaceWithDemand(b *testing.B) {
	mix := benchMix()
	typical := TypicalFromRequests(mix, 0.95)
	for i := range mix {
		if i%5 == 0 && mix[i].GPUs <= 2 {
			mix[i].Models = []string{"T4"}
		}
	}
	for _, n := range []int{1500, 10000} {
		b.Run(fmt.Sprintf("gpufrac/%dnodes", n), func(b *testing.B) {
			s := filledClusterOf(b, n, func(i int) string { return []string{"G2", "G2", "G2", "G2", "G2", "G2", "T4"}[i%7] })
			for i := range mix {
				s.AddDemand(&mix[i]) // what runs already
			}
			p, err := New("gpufrac", Options{Typical: typical})
			if err != nil {
				b.Fatal(err)
			}
			placeLoop(b, s, p, mix, true)
		})
	}
}

// BenchmarkPlaceManyNodeTypes is BenchmarkPlaceWithDemand on 5,000 nodes
// whose node types (model, GPUs, CPU, memory) are many: a thousand models,
// or four models whose nodes' allocatable memory differs by a few MiB from
// node to node, as kubelets report it. gpufrac's prior reads the node
// types on every decision that has charges.
func BenchmarkPlaceManyNodeTypes(b *testing.B) {
	mix := benchMix()
	typical := TypicalFromRequests(mix, 0.95)
	for _, c := range []struct {
		name  string
		model func(i int) string
		mem   func(i int) int64
	}{
		{"1000models", func(i int) string { return fmt.Sprintf("M%03d", i%1000) }, func(int) int64 { return 384 * gib }},
		{"4models-mem-per-node", func(i int) string { return []string{"G2", "G3", "T4", "A10"}[i%4] }, func(i int) int64 { return 384*gib - int64(i)*(1<<20) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			nodes := filledNodes(5000, c.model)
			for i := range nodes {
				nodes[i].MemoryBytes = c.mem(i)
			}
			s, err := NewSnapshot(nodes)
			if err != nil {
				b.Fatal(err)
			}
			for i := range mix {
				s.AddDemand(&mix[i])
			}
			p, err := New("gpufrac", Options{Typical: typical})
			if err != nil {
				b.Fatal(err)
			}
			placeLoop(b, s, p, mix, true)
		})
	}
}
