package placement

import (
	"slices"
)

// hostType is a kind of node as far as hosting a request goes: GPU model,
// GPU count and allocatable CPU and memory.
type hostType struct {
	model    int32
	gpus     int32
	cpu, mem int64
}

// demandBook is the workload's GPU demand by the GPU models able to host it:
// what gpufrac weighs each model's free capacity against (see
// Snapshot.AddDemand).
type demandBook struct {
	total int64 // GPU milli of every request counted
	// cpuOnly and gpuCPU are the CPU (milli) asked by the requests counted
	// that ask no GPU and by those that do: the CPU-only share of the
	// workload's CPU demand (see slotRamp).
	cpuOnly, gpuCPU int64
	// multi is the demand of requests for k ≥ 2 whole GPUs that every model
	// can host, by k (larger counts in the last slot).
	multi [MaxKindGPUs + 1]int64
	// multiCPU splits multi by the CPU the requests ask, per k.
	multiCPU [MaxKindGPUs + 1][]cpuLevel
	sets     []demandSet // one per distinct set of host models, short of all
	// shapes caches a request shape's index in sets, or demandAnyModel /
	// demandNoModel.
	shapes map[demandShape]int
}

// demandSet is the demand of the requests that only these models can host.
type demandSet struct {
	models []int32 // snapshot model indices, ascending; never written once built
	milli  int64
	// multi is the part of milli asking k ≥ 2 whole GPUs, by k.
	multi [MaxKindGPUs + 1]int64
	// multiCPU splits multi by the CPU the requests ask, per k.
	multiCPU [MaxKindGPUs + 1][]cpuLevel
}

// cpuLevel is the k-GPU demand (milli) of requests asking cpu CPU.
type cpuLevel struct {
	cpu, milli int64
}

// addLevel adds milli at cpu to levels, kept sorted by cpu.
func addLevel(levels []cpuLevel, cpu, milli int64) []cpuLevel {
	i, found := slices.BinarySearchFunc(levels, cpu, func(l cpuLevel, c int64) int {
		switch {
		case l.cpu < c:
			return -1
		case l.cpu > c:
			return 1
		}
		return 0
	})
	if found {
		levels[i].milli += milli
		return levels
	}
	return slices.Insert(levels, i, cpuLevel{cpu: cpu, milli: milli})
}

// demandShape is what decides which models can host a request.
type demandShape struct {
	cpu, mem int64
	gpus     int32 // GPUs needed on one node: k, or 1 for a share
	models   string
}

// Marks of a shape that has no demand set.
const (
	demandAnyModel = -1 // every model can host it
	demandNoModel  = -2 // no model can
)

// constrained reports whether any demand is constrained: to some models, or
// to k-GPU slots.
func (d *demandBook) constrained() bool {
	return len(d.sets) > 0 || d.multi != [MaxKindGPUs + 1]int64{}
}

func (d *demandBook) clone() demandBook {
	c := demandBook{total: d.total, cpuOnly: d.cpuOnly, gpuCPU: d.gpuCPU, multi: d.multi, sets: slices.Clone(d.sets)}
	for k := range c.multiCPU {
		c.multiCPU[k] = slices.Clone(d.multiCPU[k])
	}
	for i := range c.sets {
		for k := range c.sets[i].multiCPU {
			c.sets[i].multiCPU[k] = slices.Clone(c.sets[i].multiCPU[k])
		}
	}
	if d.shapes != nil {
		c.shapes = make(map[demandShape]int, len(d.shapes))
		for k, v := range d.shapes {
			c.shapes[k] = v
		}
	}
	return c
}

// AddDemand counts r's GPU demand in the workload the snapshot serves: the
// pods placed and the pods waiting, once each, whether or not they fit. The
// gpufrac policy reads it to keep flexible pods off the GPU models that
// constrained demand needs. Demand is constrained to the models that have a
// node able to host it: by its model list, or by its size (a pod asking more
// GPUs, CPU or memory than the nodes of most models have). Requests asking
// no GPU count only their CPU (the CPU-only share gpufrac's slot charges
// read); requests that no node can host count for nothing. Rollback does
// not undo it.
func (s *Snapshot) AddDemand(r *Request) { s.AddDemandN(r, 1) }

// AddDemandN counts the demand of n pods asking r each: the same as n calls
// of AddDemand(r).
func (s *Snapshot) AddDemandN(r *Request, n int) {
	if n <= 0 || r.Validate() != nil || len(s.htypes) == 0 {
		return
	}
	count := int64(n)
	milli := r.GPUMilli()
	if milli <= 0 {
		s.demand.cpuOnly += r.CPUMilli * count
		return
	}
	sh := demandShape{cpu: r.CPUMilli, mem: r.MemoryBytes, gpus: int32(max(r.GPUs, 1))}
	if len(r.Models) > 0 {
		sh.models = modelsKey(r.Models)
	}
	k, ok := s.demand.shapes[sh]
	if !ok {
		k = s.demandSetOf(r, &sh)
		if s.demand.shapes == nil {
			s.demand.shapes = map[demandShape]int{}
		}
		s.demand.shapes[sh] = k
	}
	if k == demandNoModel {
		return
	}
	s.demand.total += milli * count
	s.demand.gpuCPU += r.CPUMilli * count
	multi, levels := &s.demand.multi, &s.demand.multiCPU
	if k >= 0 {
		s.demand.sets[k].milli += milli * count
		multi, levels = &s.demand.sets[k].multi, &s.demand.sets[k].multiCPU
	}
	if r.GPUs >= 2 {
		g := min(r.GPUs, MaxKindGPUs)
		multi[g] += milli * count
		levels[g] = addLevel(levels[g], r.CPUMilli, milli*count)
	}
}

// demandSetOf finds or makes the set of the models able to host sh.
func (s *Snapshot) demandSetOf(r *Request, sh *demandShape) int {
	var models []int32
	for _, ht := range s.htypes {
		if slices.Contains(models, ht.model) || len(r.Models) > 0 && !slices.Contains(r.Models, s.models[ht.model]) {
			continue
		}
		if ht.gpus >= sh.gpus && ht.cpu >= sh.cpu && ht.mem >= sh.mem {
			models = append(models, ht.model)
		}
	}
	slices.Sort(models)
	switch {
	case len(models) == 0:
		return demandNoModel
	case len(models) == s.gpuModels():
		return demandAnyModel
	}
	for k := range s.demand.sets {
		if slices.Equal(s.demand.sets[k].models, models) {
			return k
		}
	}
	s.demand.sets = append(s.demand.sets, demandSet{models: models})
	return len(s.demand.sets) - 1
}

// modelsKey is a model list in a canonical text form.
func modelsKey(models []string) string {
	if len(models) == 1 {
		return models[0]
	}
	m := slices.Clone(models)
	slices.Sort(m)
	m = slices.Compact(m)
	key := ""
	for i, x := range m {
		if i > 0 {
			key += "|"
		}
		key += x
	}
	return key
}

// gpuModels is the number of models with GPU nodes.
func (s *Snapshot) gpuModels() int {
	var seen []int32
	for _, ht := range s.htypes {
		if !slices.Contains(seen, ht.model) {
			seen = append(seen, ht.model)
		}
	}
	return len(seen)
}
