// Package request is gpufrac's one answer to "what does this pod ask for":
// the GPU resources of each of its containers (whole GPUs, a fraction of one
// GPU, MIG devices, time-sliced replicas), the pod's effective amounts as
// Kubernetes computes them, its CPU and memory, and the problems that make
// the request invalid as written. The coordinator (queues, placement, its
// state snapshot) and the node agent (pod hints, admission checks) read a pod
// only through Parse, so both sides count the same containers the same way.
//
// The rules, as Kubernetes applies them to extended resources:
//
//   - A container's amount of a GPU resource is its limit; when only a
//     request is set, the request (the API server refuses that for
//     extended resources, but Parse does not rely on the API server and
//     reports it as a problem). Request and limit set and different is a
//     problem too (InvalidRequest): a device plugin resource cannot be
//     overcommitted, and which of the two would win is not for gpufrac to
//     guess.
//   - The pod's effective amount of a resource is the largest of: the sum
//     over app containers and sidecars (init containers with restartPolicy
//     Always), and, for each regular init container, its own amount plus the
//     sidecars declared before it. Without sidecars this is
//     max(largest init container, sum of app containers), as the kubelet's
//     device manager and kube-scheduler count it.
//   - CPU and memory are summed the same way, plus pod overhead, by
//     k8s.io/component-helpers/resource (kube-scheduler's own code).
//
// gpufrac's own rules on GPU resources (each a Problem):
//
//   - gpufrac.io/gpu-fraction is a whole number of percent of ONE GPU, 1..100,
//     asked by one container of the pod at most, and only by an app
//     container (spec.containers). A fraction in an init container (regular
//     or sidecar) is refused: gpufrac-node learns which GPU a container got,
//     and maps its processes to its memory limit, from the kubelet's
//     PodResources API, which does not report regular init containers; an
//     init container's fraction would be neither written back nor limited.
//     gpufrac-node refuses it at admission too (see deviceplugin/pods).
//   - nvidia.com/gpu, MIG devices (nvidia.com/mig-*) and time-sliced replicas
//     are positive whole numbers; 0 is "none" (common in templates).
//   - A pod holds one kind of GPU: whole GPUs, a fraction, MIG devices
//     (several profiles may mix) or replicas.
//
// Limits that depend on the coordinator's options (the most GPUs per pod,
// what a MIG device is worth) are the coordinator's (coordinator/podrequest).
//
// Everything here comes from the pod spec, which the pod's author wrote:
// Parse only reads and checks it. Who may act on the result, and with what
// trust, is the caller's business.
package request

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	resourcehelper "k8s.io/component-helpers/resource"

	"github.com/gpufrac/gpufrac/api"
)

// Kind is the kind of GPU a resource grants.
type Kind int

// The kinds of GPU resources.
const (
	// None is any resource that is not one of gpufrac's GPU resources.
	None Kind = iota
	// Whole is nvidia.com/gpu: whole, exclusive GPUs.
	Whole
	// Fraction is gpufrac.io/gpu-fraction: percent of one GPU.
	Fraction
	// MIG is a MIG device of the mixed strategy (nvidia.com/mig-<profile>).
	MIG
	// Replica is a time-sliced replica (Options.TimesliceResource).
	Replica
)

// String names the kind as messages do.
func (k Kind) String() string {
	switch k {
	case Whole:
		return api.ResourceGPU
	case Fraction:
		return api.ResourceFraction
	case MIG:
		return "MIG devices (" + api.MIGResourcePrefix + "*)"
	case Replica:
		return "time-sliced replicas"
	}
	return "none"
}

// Options name what differs between clusters.
type Options struct {
	// TimesliceResource is the time-sliced replica resource; "" means
	// api.DefaultTimesliceResource.
	TimesliceResource string
}

// Timeslice is the time-sliced replica resource.
func (o Options) Timeslice() string {
	if o.TimesliceResource != "" {
		return o.TimesliceResource
	}
	return api.DefaultTimesliceResource
}

// KindOf tells which kind of GPU a resource grants; None for the rest.
func (o Options) KindOf(name corev1.ResourceName) Kind {
	switch s := string(name); {
	case s == api.ResourceGPU:
		return Whole
	case s == api.ResourceFraction:
		return Fraction
	case strings.HasPrefix(s, api.MIGResourcePrefix):
		return MIG
	case s == o.Timeslice():
		return Replica
	}
	return None
}

// IsScalar tells whether a resource is placed as a counted scalar: a MIG
// device or a replica.
func (o Options) IsScalar(name corev1.ResourceName) bool {
	k := o.KindOf(name)
	return k == MIG || k == Replica
}

// Role is where a container sits in the pod.
type Role int

// The roles of containers.
const (
	// App is a container of spec.containers.
	App Role = iota
	// Init is a regular init container: it runs to completion, alone,
	// before the app containers start.
	Init
	// Sidecar is an init container with restartPolicy Always: it starts
	// before later init containers and runs beside the app containers.
	Sidecar
)

// Container is one container's GPU request.
type Container struct {
	// Name is the container's name.
	Name string
	// Role says whether it is an app, init or sidecar container.
	Role Role
	// Field is its path in the pod spec ("spec.containers[main]").
	Field string
	// GPU is what it asks of each GPU resource, by name: its limit, or its
	// request when only that is set. Zero amounts and amounts that are not
	// positive whole numbers are left out; whole numbers out of range (a
	// fraction of 150) are kept. Both are Problems.
	GPU map[corev1.ResourceName]int64
}

// Units is the container's fraction units (0 when it asks none).
func (c *Container) Units() int { return int(c.GPU[api.ResourceFraction]) }

// Pod is what a pod asks for.
type Pod struct {
	// Containers are the pod's containers, init containers (regular and
	// sidecars) in spec order first, then the app containers.
	Containers []Container
	// Total is the pod's effective amount of each GPU resource it asks for
	// (see the package documentation), by name.
	Total map[corev1.ResourceName]int64
	// CPUMilli and MemoryBytes are the pod's effective CPU and memory
	// requests, pod overhead included.
	CPUMilli, MemoryBytes int64
	// Problems make the request invalid as written, in the order the pod
	// was checked; empty when it is valid.
	Problems []Problem

	opts Options
}

// Whole is the pod's effective count of whole GPUs (nvidia.com/gpu).
func (p *Pod) Whole() int { return int(p.Total[api.ResourceGPU]) }

// Fraction is the pod's effective fraction units (gpufrac.io/gpu-fraction).
func (p *Pod) Fraction() int { return int(p.Total[api.ResourceFraction]) }

// Scalars are the pod's effective MIG devices and replicas by resource name,
// nil when it asks none.
func (p *Pod) Scalars() map[string]int64 {
	var out map[string]int64
	for name, n := range p.Total {
		if p.opts.IsScalar(name) {
			if out == nil {
				out = map[string]int64{}
			}
			out[string(name)] = n
		}
	}
	return out
}

// Demand is what a pod takes on its node, in short: the pod's effective
// amounts without the per-container detail. It is the part of a Pod the
// coordinator keeps for every bound pod.
type Demand struct {
	// CPUMilli and MemoryBytes are as in Pod.
	CPUMilli, MemoryBytes int64
	// Whole is the count of whole GPUs (nvidia.com/gpu).
	Whole int
	// Fraction is the fraction units (gpufrac.io/gpu-fraction, percent of
	// one GPU).
	Fraction int
	// Scalars are the MIG devices and time-sliced replicas by resource
	// name, nil when none.
	Scalars map[string]int64
}

// Demand returns the pod's Demand.
func (p *Pod) Demand() Demand {
	return Demand{CPUMilli: p.CPUMilli, MemoryBytes: p.MemoryBytes, Whole: p.Whole(), Fraction: p.Fraction(), Scalars: p.Scalars()}
}

// UsesGPU tells whether the demand holds a GPU of any kind.
func (d *Demand) UsesGPU() bool { return d.Whole > 0 || d.Fraction > 0 || len(d.Scalars) > 0 }

// FractionContainers are the app containers asking fraction units: the
// ones gpufrac serves a fraction to.
func (p *Pod) FractionContainers() []Container {
	var out []Container
	for _, c := range p.Containers {
		if c.Role == App && c.Units() > 0 {
			out = append(out, c)
		}
	}
	return out
}

// InitFractions are the init containers (regular or sidecar) asking
// fraction units, which gpufrac refuses.
func (p *Pod) InitFractions() []Container {
	var out []Container
	for _, c := range p.Containers {
		if c.Role != App && c.Units() > 0 {
			out = append(out, c)
		}
	}
	return out
}

// Err is nil for a valid request, else an *InvalidError listing the problems.
func (p *Pod) Err() error {
	if len(p.Problems) == 0 {
		return nil
	}
	return &InvalidError{Problems: slices.Clone(p.Problems)}
}

// ErrInvalid is matched (errors.Is) by every *InvalidError.
var ErrInvalid = errors.New("invalid GPU request")

// Problem is one reason a pod cannot be admitted as written.
type Problem struct {
	// Field is the path of the offending field
	// ("spec.containers[main].resources.limits[gpufrac.io/gpu-fraction]").
	Field string
	// Message says what is wrong and how to fix it.
	Message string
}

// InvalidError lists every problem found in a pod.
type InvalidError struct {
	// Problems are in the order the pod was checked.
	Problems []Problem
}

// Error joins the problems' messages.
func (e *InvalidError) Error() string {
	msgs := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		msgs[i] = p.Message
	}
	return "invalid GPU request: " + strings.Join(msgs, "; ")
}

// Is makes errors.Is(err, ErrInvalid) true.
func (e *InvalidError) Is(target error) bool { return target == ErrInvalid }

// parser carries one Parse call's state.
type parser struct {
	pod  *corev1.Pod
	opts Options
	out  *Pod
}

func (p *parser) add(field, format string, args ...any) {
	p.out.Problems = append(p.out.Problems, Problem{Field: field, Message: fmt.Sprintf(format, args...)})
}

// Parse reads what pod asks for. It never fails: a nil pod asks nothing, and
// an invalid request comes back with its Problems (and Err), its amounts
// read as far as they can be.
func Parse(pod *corev1.Pod, opts Options) *Pod {
	out := &Pod{Total: map[corev1.ResourceName]int64{}, opts: opts}
	if pod == nil {
		return out
	}
	p := &parser{pod: pod, opts: opts, out: out}
	p.containers()
	p.kinds()
	p.totals()
	reqs := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	cpu, mem := reqs[corev1.ResourceCPU], reqs[corev1.ResourceMemory]
	out.CPUMilli = p.bounded(cpu, MaxCPUMilli, true, "CPU")
	out.MemoryBytes = p.bounded(mem, MaxMemoryBytes, false, "memory")
	return out
}

// MaxCPUMilli and MaxMemoryBytes bound what a pod is read to ask, far
// beyond any node: larger quantities overflow int64 milli-units (cpu 1e18
// reads as 0 millicores, 1Ei as the most negative int64), and a pod read as
// asking nothing, or less, would fit every node and shrink its queue's
// usage.
const (
	MaxCPUMilli    int64 = 1 << 40 // about a billion cores
	MaxMemoryBytes int64 = 1 << 60 // 1 EiB
)

// bounded reads q (in milli-units when milli) up to bound, reporting more.
func (p *parser) bounded(q resource.Quantity, bound int64, milli bool, what string) int64 {
	limit := *resource.NewQuantity(bound, q.Format)
	if milli {
		limit = *resource.NewMilliQuantity(bound, q.Format)
	}
	if q.Cmp(limit) <= 0 {
		if milli {
			return q.MilliValue()
		}
		return q.Value()
	}
	p.add("spec", "the pod asks %s %s, more than any node has: ask what the pod needs", q.String(), what)
	return bound
}

// containers reads every container's GPU resources, in spec order, init
// containers first.
func (p *parser) containers() {
	for i := range p.pod.Spec.InitContainers {
		c := &p.pod.Spec.InitContainers[i]
		role := Init
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			role = Sidecar
		}
		p.container(c, role, fmt.Sprintf("spec.initContainers[%s]", c.Name))
	}
	for i := range p.pod.Spec.Containers {
		c := &p.pod.Spec.Containers[i]
		p.container(c, App, fmt.Sprintf("spec.containers[%s]", c.Name))
	}
}

// container reads one container: its scalar resources (sorted, so problems
// come in a stable order), then its fraction, then its whole GPUs.
func (p *parser) container(c *corev1.Container, role Role, field string) {
	rc := Container{Name: c.Name, Role: role, Field: field, GPU: map[corev1.ResourceName]int64{}}
	var scalars []corev1.ResourceName
	for _, rl := range []corev1.ResourceList{c.Resources.Limits, c.Resources.Requests} {
		for name := range rl {
			if p.opts.IsScalar(name) && !slices.Contains(scalars, name) {
				scalars = append(scalars, name)
			}
		}
	}
	slices.Sort(scalars)
	for _, name := range scalars {
		q, ok := p.extended(c, field, name)
		if !ok || q.IsZero() {
			continue // like nvidia.com/gpu: 0, common in templates
		}
		v, exact := wholeNumber(q)
		if !exact || v < 1 {
			p.add(field+".resources.limits["+string(name)+"]",
				"container %q asks %s %s: MIG devices and time-sliced replicas must be a positive whole number",
				c.Name, q.String(), name)
			continue
		}
		rc.GPU[name] = v
	}
	// An explicit fraction of 0 is refused, unlike nvidia.com/gpu: 0
	// (common in templates): no share of a GPU is "0 percent".
	if q, ok := p.extended(c, field, api.ResourceFraction); ok {
		limit := field + ".resources.limits[" + api.ResourceFraction + "]"
		v, exact := wholeNumber(q)
		if exact && v > 0 {
			rc.GPU[api.ResourceFraction] = v // what it asks, even beyond one GPU
		}
		switch {
		case !exact:
			p.add(limit, "container %q asks %s: %s must be a whole number of percent of one GPU, 1..100",
				c.Name, q.String(), api.ResourceFraction)
		case v < 1 || v > api.UnitsPerGPU:
			p.add(limit, "container %q asks %s: %s is percent of one GPU and must be 1..100; ask %s for whole GPUs",
				c.Name, q.String(), api.ResourceFraction, api.ResourceGPU)
		case role != App:
			p.add(limit, "container %q is an init container and asks %s %s: fractions are served to app containers (spec.containers) only, "+
				"since the kubelet reports no init container's devices and gpufrac could neither record nor limit its share; move the fraction to an app container",
				c.Name, q.String(), api.ResourceFraction)
		}
	}
	if q, ok := p.extended(c, field, api.ResourceGPU); ok && !q.IsZero() {
		v, exact := wholeNumber(q)
		if !exact || v < 1 {
			p.add(field+".resources.limits["+api.ResourceGPU+"]",
				"container %q asks %s %s: whole GPUs must be a positive whole number; use %s for part of a GPU",
				c.Name, q.String(), api.ResourceGPU, api.ResourceFraction)
		} else {
			rc.GPU[api.ResourceGPU] = v
		}
	}
	p.out.Containers = append(p.out.Containers, rc)
}

// extended returns a container's amount of an extended resource (its limit;
// its request when only that is set) after checking that request and limit
// agree.
func (p *parser) extended(c *corev1.Container, field string, name corev1.ResourceName) (resource.Quantity, bool) {
	req, hasReq := c.Resources.Requests[name]
	lim, hasLim := c.Resources.Limits[name]
	switch {
	case hasReq && hasLim && req.Cmp(lim) != 0:
		p.add(field+".resources.requests["+string(name)+"]",
			"container %q requests %s %s but its limit is %s: extended resources need equal requests and limits (set only the limit)",
			c.Name, req.String(), name, lim.String())
	case hasReq && !hasLim:
		p.add(field+".resources.limits["+string(name)+"]",
			"container %q requests %s %s without a limit: extended resources need a limit equal to the request (set only the limit)",
			c.Name, req.String(), name)
		return req, true
	}
	return lim, hasLim
}

// kindUse is one kind of GPU and the containers asking for it.
type kindUse struct {
	kind Kind
	what string
	in   []Container
}

// kinds checks the pod-wide rules: one container with a fraction, and one
// kind of GPU per pod. Init containers' fractions are refused on their own
// (container) and left out here.
func (p *parser) kinds() {
	var fraction, whole, migs, replicas []Container
	for _, c := range p.out.Containers {
		seenMIG := false
		for name := range c.GPU {
			switch p.opts.KindOf(name) {
			case Fraction:
				if c.Role == App {
					fraction = append(fraction, c)
				}
			case Whole:
				whole = append(whole, c)
			case MIG:
				if !seenMIG {
					migs = append(migs, c)
					seenMIG = true
				}
			case Replica:
				replicas = append(replicas, c)
			}
		}
	}
	if len(fraction) > 1 {
		names := make([]string, len(fraction))
		for i, c := range fraction {
			names[i] = strconv.Quote(c.Name)
		}
		p.add("spec", "containers %s all ask %s: only one container of a pod may hold a GPU fraction (split the pod, or give one container the sum)",
			strings.Join(names, ", "), api.ResourceFraction)
	}
	if len(fraction) > 0 && len(whole) > 0 {
		p.add("spec", "container %q asks %s and container %q asks %s: a pod gets either whole GPUs or a fraction of one GPU, not both",
			fraction[0].Name, api.ResourceFraction, whole[0].Name, api.ResourceGPU)
	}
	var used []kindUse
	for _, k := range []kindUse{
		{Whole, api.ResourceGPU, whole}, {Fraction, api.ResourceFraction, fraction},
		{MIG, MIG.String(), migs}, {Replica, p.opts.Timeslice(), replicas},
	} {
		if len(k.in) > 0 {
			used = append(used, k)
		}
	}
	// Whole GPUs with a fraction are reported above.
	if len(used) < 2 || (len(used) == 2 && used[0].kind == Whole && used[1].kind == Fraction) {
		return
	}
	a, b := used[0], used[1]
	if b.kind == Fraction && len(used) > 2 {
		b = used[2]
	}
	p.add("spec", "container %q asks %s and container %q asks %s: a pod gets one kind of GPU: whole GPUs, a fraction of one GPU, MIG devices or time-sliced replicas",
		a.in[0].Name, a.what, b.in[0].Name, b.what)
}

// totals sums every GPU resource over the pod (see Total).
func (p *parser) totals() {
	names := map[corev1.ResourceName]bool{}
	for _, c := range p.out.Containers {
		for name := range c.GPU {
			names[name] = true
		}
	}
	for name := range names {
		var sidecars, peak, apps int64
		for _, c := range p.out.Containers {
			v := c.GPU[name]
			switch c.Role {
			case Init:
				peak = max(peak, sidecars+v)
			case Sidecar:
				sidecars += v
				peak = max(peak, sidecars)
			default:
				apps += v
			}
		}
		if t := max(peak, sidecars+apps); t > 0 {
			p.out.Total[name] = t
		}
	}
}

// wholeNumber returns q as an integer and whether it is one.
func wholeNumber(q resource.Quantity) (int64, bool) {
	if q.CmpInt64(1<<40) > 0 || q.CmpInt64(-(1<<40)) < 0 {
		return 0, false // far beyond any real request; also keeps MilliValue exact
	}
	v := q.MilliValue()
	if v%1000 != 0 {
		return 0, false
	}
	return v / 1000, true
}
