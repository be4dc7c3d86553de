// Package podrequest turns a pod into what the coordinator schedules: a
// placement.Request (CPU, memory, whole GPUs or a share of one GPU, GPU
// models, node constraints), the queue it is charged to, its gang and whether
// it may be preempted. Pods that can never be admitted as written get an
// error matching ErrInvalidRequest whose message tells the user what to
// change; the coordinator puts it in the pod's condition (reason
// InvalidRequest) and an event.
//
// What is read, and from where:
//
//   - CPU and memory: the container requests as kube-scheduler sums them
//     (init containers: the maximum; sidecars; pod overhead; pod-level
//     resources), through k8s.io/component-helpers/resource.
//   - nvidia.com/gpu: whole GPUs, each container's limit (requests must equal
//     it), summed the same way; 1..Options.MaxGPUs.
//   - gpufrac.io/gpu-fraction: percent (1..100) of ONE GPU, in one container
//     only, never together with nvidia.com/gpu; placement.Request.ShareMilli
//     is percent×10, so 100 is a share of 1000 (a whole GPU reached through
//     the fraction resource, shareable with nobody).
//   - nvidia.com/mig-<profile> (MIG devices, mixed strategy) and the
//     time-sliced replica resource (Options.TimesliceResource): whole
//     numbers of devices, summed like nvidia.com/gpu, placed as
//     placement.Request.Scalars. A pod holds one kind of GPU: whole GPUs, a
//     fraction, MIG devices (several profiles may mix) or replicas. Its
//     queue is charged them in GPU terms (Options.ScalarMilli), at most
//     Options.MaxGPUs GPUs' worth.
//   - annotation gpufrac.io/gpu-models ("H100|A100"): GPU model patterns,
//     matched case-insensitively as substrings of the nodes'
//     nvidia.com/gpu.product label (see MatchModels).
//   - nodeSelector, required node affinity and tolerations: placement constraints.
//   - label gpufrac.io/queue: the queue (required).
//   - label gpufrac.io/pod-group + annotation gpufrac.io/min-member: the gang;
//     without them, a pod controlled by a batch/v1 Job with parallelism above 1
//     belongs to the gang named after the Job, min-member min(parallelism, completions).
//   - non-preemptible: priority at or above Options.NonPreemptiblePriority, or
//     annotation gpufrac.io/preemptible: "false".
//
// A container that sets NVIDIA_VISIBLE_DEVICES in env is refused: with the
// NVIDIA runtime that variable would grant GPUs behind the device plugin's
// back. Variables from envFrom (ConfigMaps, Secrets) cannot be seen from the
// pod spec and are not checked; the node agent's Allocate overrides the
// variable anyway.
package podrequest

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	resourcehelper "k8s.io/component-helpers/resource"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/placement"
	"github.com/gpufrac/gpufrac/coordinator/queue"
)

// DefaultMaxGPUs is the most whole GPUs a pod may ask for unless Options say otherwise.
const DefaultMaxGPUs = 8

// DefaultNonPreemptiblePriority is the priority from which pods are
// non-preemptible unless Options say otherwise.
const DefaultNonPreemptiblePriority int32 = 100

// Options tune Parse. The zero value uses the defaults.
type Options struct {
	// MaxGPUs is the most nvidia.com/gpu a pod may ask for; 0 means DefaultMaxGPUs.
	MaxGPUs int
	// NonPreemptiblePriority: pods with at least this priority are
	// non-preemptible; nil means DefaultNonPreemptiblePriority.
	NonPreemptiblePriority *int32
	// JobLookup finds a Job by namespace and name, for gangs derived from a
	// pod's owning Job. Nil: pods are never grouped by their Job.
	JobLookup func(namespace, name string) (*batchv1.Job, bool)
	// GPUModels are the GPU products present in the cluster (values of the
	// nvidia.com/gpu.product node label). When set, the pod's model patterns
	// are resolved against them into Request.Models; see Parsed.ModelPatterns.
	GPUModels []string
	// TimesliceResource is the time-sliced replica resource; "" means
	// api.DefaultTimesliceResource.
	TimesliceResource string
	// ScalarMilli is what one MIG device or replica of each resource is
	// worth in milli-GPU, as the nodes' inventories say
	// (state.Snapshot.ScalarMilli). Resources missing here are charged
	// FallbackScalarMilli.
	ScalarMilli map[string]int64
}

// defaultReplicas is the node agent's default replicas per time-sliced GPU
// (deviceplugin/config.DefaultReplicas), used when no node says better.
const defaultReplicas = 4

// migComputeSlices is the compute slices of a MIG GPU (A100, H100, H200,
// B200; an A30 has 4), for the fallback worth of a MIG device.
const migComputeSlices = 7

// FallbackScalarMilli is what one unit of a MIG or replica resource is
// charged in milli-GPU when no node's inventory tells (no node serves it
// yet): a MIG device its compute slices over 7 ("mig-1g.10gb" 143,
// "mig-3g.40gb" 429, "mig-1c.3g.40gb" 143), a replica 1000 over the default
// 4 replicas. A name it cannot read is charged a whole GPU.
func FallbackScalarMilli(name, timeslice string) int64 {
	if timeslice == "" {
		timeslice = api.DefaultTimesliceResource
	}
	if name == timeslice {
		return placement.MilliPerGPU / defaultReplicas
	}
	profile, ok := strings.CutPrefix(name, api.MIGResourcePrefix)
	if !ok {
		return placement.MilliPerGPU
	}
	// "1g.10gb", "1g.10gb.me", "1c.3g.40gb": the first field is the compute slices.
	first, _, _ := strings.Cut(profile, ".")
	if len(first) < 2 || (first[len(first)-1] != 'g' && first[len(first)-1] != 'c') {
		return placement.MilliPerGPU
	}
	n, err := strconv.Atoi(first[:len(first)-1])
	if err != nil || n < 1 || n > migComputeSlices {
		return placement.MilliPerGPU
	}
	return (int64(n)*placement.MilliPerGPU + migComputeSlices/2) / migComputeSlices
}

// Gang says which gang a pod belongs to.
type Gang struct {
	// Namespace and Name identify the gang; pods of one gang share a namespace.
	Namespace, Name string
	// MinMember is how many pods must be placed together (at least 1).
	MinMember int32
	// FromJob says the gang was derived from the owning Job, not from labels.
	FromJob bool
}

// Key is "namespace/name".
func (g *Gang) Key() string { return g.Namespace + "/" + g.Name }

// Parsed is what the coordinator needs to know about a pod.
type Parsed struct {
	// Request is the placement request. Its Models are the GPU products
	// matching ModelPatterns among Options.GPUModels; when none match (or no
	// products were given) they are the patterns themselves, which placement
	// compares exactly, so the pod cannot land on a GPU model it did not ask for.
	Request placement.Request
	// ModelPatterns are the patterns of annotation gpufrac.io/gpu-models, trimmed.
	ModelPatterns []string
	// Queue is the leaf queue the pod is charged to.
	Queue string
	// Gang is the pod's gang, nil for a pod scheduled on its own.
	Gang *Gang
	// Priority is the pod's priority (0 when unset).
	Priority int32
	// NonPreemptible says the pod must never be preempted or reclaimed.
	NonPreemptible bool
	// ScalarMilli is the pod's MIG devices and replicas (Request.Scalars)
	// in GPU terms, milli-GPU: what its queue is charged for them.
	ScalarMilli int64
}

// QueueResources is the pod's charge to its queue: whole GPUs, a share or
// MIG devices and replicas, all in milli-GPU, and CPU and memory.
func (p *Parsed) QueueResources() queue.Resources {
	return queue.Resources{
		GPUMilli:    p.Request.GPUMilli() + p.ScalarMilli,
		CPUMilli:    p.Request.CPUMilli,
		MemoryBytes: p.Request.MemoryBytes,
	}
}

// ErrInvalidRequest is matched (errors.Is) by every *InvalidRequestError.
var ErrInvalidRequest = errors.New("invalid GPU request")

// ErrJobNotFound reports a pod controlled by a Job that JobLookup does not
// know (yet): retry later, the request itself is not known to be invalid.
var ErrJobNotFound = errors.New("owning Job not found")

// Problem is one reason a pod cannot be admitted as written.
type Problem struct {
	// Field is the path of the offending field
	// ("spec.containers[main].resources.limits[gpufrac.io/gpu-fraction]").
	Field string
	// Message says what is wrong and how to fix it.
	Message string
}

// InvalidRequestError lists every problem found in a pod.
type InvalidRequestError struct {
	// Problems are in the order the pod was checked.
	Problems []Problem
}

// Error joins the problems' messages.
func (e *InvalidRequestError) Error() string {
	msgs := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		msgs[i] = p.Message
	}
	return "invalid GPU request: " + strings.Join(msgs, "; ")
}

// Is makes errors.Is(err, ErrInvalidRequest) true.
func (e *InvalidRequestError) Is(target error) bool { return target == ErrInvalidRequest }

// parser carries one Parse call's state.
type parser struct {
	pod      *corev1.Pod
	opts     Options
	problems []Problem
}

func (p *parser) add(field, format string, args ...any) {
	p.problems = append(p.problems, Problem{Field: field, Message: fmt.Sprintf(format, args...)})
}

// Parse reads a pod; see the package documentation for the rules. The error
// is an *InvalidRequestError (errors.Is ErrInvalidRequest) listing every
// problem, or wraps ErrJobNotFound.
func Parse(pod *corev1.Pod, opts Options) (Parsed, error) {
	if pod == nil {
		return Parsed{}, fmt.Errorf("parsing pod request: nil pod")
	}
	if opts.MaxGPUs <= 0 {
		opts.MaxGPUs = DefaultMaxGPUs
	}
	threshold := DefaultNonPreemptiblePriority
	if opts.NonPreemptiblePriority != nil {
		threshold = *opts.NonPreemptiblePriority
	}
	p := &parser{pod: pod, opts: opts}
	var out Parsed

	out.Queue = p.queue()
	gpus, share, scalars, scalarMilli := p.gpus()
	out.Request.GPUs, out.Request.ShareMilli, out.Request.Scalars, out.ScalarMilli = gpus, share, scalars, scalarMilli
	reqs := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	cpu, mem := reqs[corev1.ResourceCPU], reqs[corev1.ResourceMemory]
	out.Request.CPUMilli, out.Request.MemoryBytes = cpu.MilliValue(), mem.Value()
	p.visibleDevices()
	out.ModelPatterns = p.models()
	if len(out.ModelPatterns) > 0 {
		out.Request.Models = MatchModels(out.ModelPatterns, opts.GPUModels)
		if len(out.Request.Models) == 0 {
			out.Request.Models = slices.Clone(out.ModelPatterns)
		}
	}
	out.Request.Constraints = constraints(pod)
	if pod.Spec.Priority != nil {
		out.Priority = *pod.Spec.Priority
	}
	out.NonPreemptible = p.preemptible() == "false" || out.Priority >= threshold
	gang, jobErr := p.gang()
	out.Gang = gang

	if len(p.problems) > 0 {
		return Parsed{}, &InvalidRequestError{Problems: p.problems}
	}
	if jobErr != nil {
		return Parsed{}, jobErr
	}
	if err := out.Request.Validate(); err != nil {
		// Parse's own checks rule this out; keep the pod off the cluster if they missed something.
		return Parsed{}, &InvalidRequestError{Problems: []Problem{{Field: "spec", Message: err.Error()}}}
	}
	return out, nil
}

func (p *parser) queue() string {
	const field = "metadata.labels[" + api.LabelQueue + "]"
	q, ok := p.pod.Labels[api.LabelQueue]
	switch {
	case !ok || q == "":
		p.add(field, "label %s is missing: set it to the leaf Queue this pod is charged to (kubectl get queues.gpufrac.io)", api.LabelQueue)
	case len(validation.IsDNS1123Subdomain(q)) > 0:
		p.add(field, "label %s %q is not a queue name: queue names are lower-case DNS names (kubectl get queues.gpufrac.io)", api.LabelQueue, q)
	}
	return q
}

// container is one container with where it sits in the pod.
type container struct {
	c       *corev1.Container
	field   string // "spec.containers[main]"
	init    bool   // a regular init container (runs before the others, alone)
	sidecar bool   // an init container with restartPolicy Always
}

func (p *parser) containers() []container {
	var out []container
	for i := range p.pod.Spec.InitContainers {
		c := &p.pod.Spec.InitContainers[i]
		sidecar := c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
		out = append(out, container{c: c, field: fmt.Sprintf("spec.initContainers[%s]", c.Name), init: !sidecar, sidecar: sidecar})
	}
	for i := range p.pod.Spec.Containers {
		c := &p.pod.Spec.Containers[i]
		out = append(out, container{c: c, field: fmt.Sprintf("spec.containers[%s]", c.Name)})
	}
	return out
}

// extended returns a container's amount of an extended resource (its limit;
// its request when only that is set) after checking that request and limit agree.
func (p *parser) extended(c container, name corev1.ResourceName) (resource.Quantity, bool) {
	req, hasReq := c.c.Resources.Requests[name]
	lim, hasLim := c.c.Resources.Limits[name]
	field := fmt.Sprintf("%s.resources", c.field)
	switch {
	case hasReq && hasLim && req.Cmp(lim) != 0:
		p.add(field+".requests["+string(name)+"]",
			"container %q requests %s %s but its limit is %s: extended resources need equal requests and limits (set only the limit)",
			c.c.Name, req.String(), name, lim.String())
	case hasReq && !hasLim:
		p.add(field+".limits["+string(name)+"]",
			"container %q requests %s %s without a limit: extended resources need a limit equal to the request (set only the limit)",
			c.c.Name, req.String(), name)
		return req, true
	}
	return lim, hasLim
}

// gpus checks the GPU resources and returns the pod's whole GPUs, share,
// scalar resources (MIG devices, replicas) and their worth in milli-GPU.
func (p *parser) gpus() (int, int, map[string]int64, int64) {
	var fractionIn []container
	var fraction int64
	var gpuIn []container
	gpuOf := map[*corev1.Container]int64{}
	var migIn, replicaIn []container
	scalarOf := map[corev1.ResourceName]map[*corev1.Container]int64{}
	for _, c := range p.containers() {
		for _, name := range p.scalarNames(c) {
			q, ok := p.extended(c, name)
			if !ok || q.IsZero() {
				continue // like nvidia.com/gpu: 0, common in templates
			}
			field := c.field + ".resources.limits[" + string(name) + "]"
			v, exact := wholeNumber(q)
			if !exact || v < 1 {
				p.add(field, "container %q asks %s %s: MIG devices and time-sliced replicas must be a positive whole number",
					c.c.Name, q.String(), name)
				continue
			}
			if scalarOf[name] == nil {
				scalarOf[name] = map[*corev1.Container]int64{}
			}
			scalarOf[name][c.c] = v
			if string(name) == p.timeslice() {
				replicaIn = append(replicaIn, c)
			} else {
				migIn = append(migIn, c)
			}
		}
		// An explicit fraction of 0 is refused, unlike nvidia.com/gpu: 0
		// (common in templates): no share of a GPU is "0 percent".
		if q, ok := p.extended(c, api.ResourceFraction); ok {
			fractionIn = append(fractionIn, c)
			field := c.field + ".resources.limits[" + api.ResourceFraction + "]"
			v, exact := wholeNumber(q)
			switch {
			case !exact:
				p.add(field, "container %q asks %s: %s must be a whole number of percent of one GPU, 1..100",
					c.c.Name, q.String(), api.ResourceFraction)
			case v < 1 || v > api.UnitsPerGPU:
				p.add(field, "container %q asks %s: %s is percent of one GPU and must be 1..100; ask %s for whole GPUs",
					c.c.Name, q.String(), api.ResourceFraction, api.ResourceGPU)
			default:
				fraction = v
			}
		}
		if q, ok := p.extended(c, api.ResourceGPU); ok && !q.IsZero() {
			gpuIn = append(gpuIn, c)
			field := c.field + ".resources.limits[" + api.ResourceGPU + "]"
			v, exact := wholeNumber(q)
			if !exact || v < 1 {
				p.add(field, "container %q asks %s %s: whole GPUs must be a positive whole number; use %s for part of a GPU",
					c.c.Name, q.String(), api.ResourceGPU, api.ResourceFraction)
				continue
			}
			gpuOf[c.c] = v
		}
	}
	if len(fractionIn) > 1 {
		names := make([]string, len(fractionIn))
		for i, c := range fractionIn {
			names[i] = strconv.Quote(c.c.Name)
		}
		p.add("spec", "containers %s all ask %s: only one container of a pod may hold a GPU fraction (split the pod, or give one container the sum)",
			strings.Join(names, ", "), api.ResourceFraction)
	}
	if len(fractionIn) > 0 && len(gpuIn) > 0 {
		p.add("spec", "container %q asks %s and container %q asks %s: a pod gets either whole GPUs or a fraction of one GPU, not both",
			fractionIn[0].c.Name, api.ResourceFraction, gpuIn[0].c.Name, api.ResourceGPU)
	}
	p.oneKind([]kindUse{
		{api.ResourceGPU, gpuIn}, {api.ResourceFraction, fractionIn},
		{"MIG devices (" + api.MIGResourcePrefix + "*)", migIn}, {p.timeslice(), replicaIn},
	})
	var scalars map[string]int64
	var scalarMilli int64
	if len(scalarOf) > 0 {
		scalars = make(map[string]int64, len(scalarOf))
		for name, of := range scalarOf {
			n := p.podTotal(of)
			scalars[string(name)] = n
			scalarMilli += n * p.unitMilli(string(name))
		}
		if limit := int64(p.opts.MaxGPUs) * placement.MilliPerGPU; scalarMilli > limit {
			p.add("spec", "the pod asks %s, %s GPUs' worth in total; at most %d GPUs' worth fit one pod: split the work across pods (a gang)",
				describeScalars(scalars), strconv.FormatFloat(float64(scalarMilli)/placement.MilliPerGPU, 'f', -1, 64), p.opts.MaxGPUs)
			return 0, 0, nil, 0
		}
	}
	if len(fractionIn) > 0 {
		return 0, int(fraction) * placement.MilliPerGPU / api.UnitsPerGPU, scalars, scalarMilli
	}
	total := p.podTotal(gpuOf)
	if total > int64(p.opts.MaxGPUs) {
		p.add("spec", "the pod asks %d %s in total; at most %d fit one pod: split the work across pods (a gang)",
			total, api.ResourceGPU, p.opts.MaxGPUs)
		return 0, 0, scalars, scalarMilli
	}
	return int(total), 0, scalars, scalarMilli
}

// timeslice is the time-sliced replica resource.
func (p *parser) timeslice() string {
	if p.opts.TimesliceResource != "" {
		return p.opts.TimesliceResource
	}
	return api.DefaultTimesliceResource
}

// scalarNames lists a container's MIG and replica resources (requests or
// limits), sorted so that problems come in a stable order.
func (p *parser) scalarNames(c container) []corev1.ResourceName {
	var out []corev1.ResourceName
	for _, rl := range []corev1.ResourceList{c.c.Resources.Limits, c.c.Resources.Requests} {
		for name := range rl {
			if (strings.HasPrefix(string(name), api.MIGResourcePrefix) || string(name) == p.timeslice()) && !slices.Contains(out, name) {
				out = append(out, name)
			}
		}
	}
	slices.Sort(out)
	return out
}

// unitMilli is what one unit of a scalar resource is charged in milli-GPU.
func (p *parser) unitMilli(name string) int64 {
	if m, ok := p.opts.ScalarMilli[name]; ok && m > 0 {
		return m
	}
	return FallbackScalarMilli(name, p.timeslice())
}

// kindUse is one kind of GPU and the containers asking for it.
type kindUse struct {
	what string
	in   []container
}

// oneKind reports pods that mix MIG devices or replicas with any other
// kind of GPU (whole GPUs with fractions are reported by gpus itself).
func (p *parser) oneKind(kinds []kindUse) {
	var used []kindUse
	for _, k := range kinds {
		if len(k.in) > 0 {
			used = append(used, k)
		}
	}
	if len(used) < 2 || (len(used) == 2 && used[0].what == api.ResourceGPU && used[1].what == api.ResourceFraction) {
		return
	}
	a, b := used[0], used[1]
	if b.what == api.ResourceFraction && len(used) > 2 {
		b = used[2] // whole GPUs with a fraction are already reported
	}
	p.add("spec", "container %q asks %s and container %q asks %s: a pod gets one kind of GPU: whole GPUs, a fraction of one GPU, MIG devices or time-sliced replicas",
		a.in[0].c.Name, a.what, b.in[0].c.Name, b.what)
}

// describeScalars renders scalar requests as "2 nvidia.com/mig-1g.10gb, 1 nvidia.com/mig-3g.40gb".
func describeScalars(sc map[string]int64) string {
	parts := make([]string, 0, len(sc))
	for _, name := range slices.Sorted(maps.Keys(sc)) {
		parts = append(parts, fmt.Sprintf("%d %s", sc[name], name))
	}
	return strings.Join(parts, ", ")
}

// podTotal sums a per-container amount the way kube-scheduler sums requests:
// application containers and sidecars add up; a regular init container runs
// with the sidecars declared before it, and the pod needs the largest of
// these moments.
func (p *parser) podTotal(of map[*corev1.Container]int64) int64 {
	var sidecars, peak, apps int64
	for _, c := range p.containers() {
		v := of[c.c]
		switch {
		case c.init:
			peak = max(peak, sidecars+v)
		case c.sidecar:
			sidecars += v
			peak = max(peak, sidecars)
		default:
			apps += v
		}
	}
	return max(peak, sidecars+apps)
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

func (p *parser) visibleDevices() {
	for _, c := range p.containers() {
		for _, e := range c.c.Env {
			if e.Name == api.EnvVisibleDevices {
				p.add(c.field+".env["+api.EnvVisibleDevices+"]",
					"container %q sets %s itself: remove it; gpufrac gives GPU access through the device plugin, and the variable would bypass it",
					c.c.Name, api.EnvVisibleDevices)
			}
		}
	}
	for i := range p.pod.Spec.EphemeralContainers {
		c := &p.pod.Spec.EphemeralContainers[i]
		for _, e := range c.Env {
			if e.Name == api.EnvVisibleDevices {
				p.add(fmt.Sprintf("spec.ephemeralContainers[%s].env[%s]", c.Name, api.EnvVisibleDevices),
					"ephemeral container %q sets %s itself: remove it; gpufrac gives GPU access through the device plugin",
					c.Name, api.EnvVisibleDevices)
			}
		}
	}
}

func (p *parser) models() []string {
	v, ok := p.pod.Annotations[api.AnnotationGPUModels]
	if !ok {
		return nil
	}
	var out []string
	for _, m := range strings.Split(v, "|") {
		if m = strings.TrimSpace(m); m != "" && !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	if len(out) == 0 {
		p.add("metadata.annotations["+api.AnnotationGPUModels+"]",
			"annotation %s %q names no GPU model: list models separated by |, for example \"H100|A100\"", api.AnnotationGPUModels, v)
	}
	return out
}

// MatchModels returns the products (sorted, without duplicates) that match
// any pattern: a pattern matches a product when it is a substring of it,
// ignoring case ("h100" matches "NVIDIA-H100-80GB-HBM3"). Note that a short
// pattern matches every product containing it ("A10" also matches "A100").
func MatchModels(patterns, products []string) []string {
	set := map[string]bool{}
	for _, prod := range products {
		lp := strings.ToLower(prod)
		for _, pat := range patterns {
			if pat != "" && strings.Contains(lp, strings.ToLower(pat)) {
				set[prod] = true
				break
			}
		}
	}
	if len(set) == 0 {
		return nil
	}
	return slices.Sorted(maps.Keys(set))
}

// constraints copies the pod's node constraints; nil when it has none.
func constraints(pod *corev1.Pod) *placement.Constraints {
	var c placement.Constraints
	if len(pod.Spec.NodeSelector) > 0 {
		c.NodeSelector = maps.Clone(pod.Spec.NodeSelector)
	}
	if a := pod.Spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		c.Affinity = a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.DeepCopy()
	}
	if len(pod.Spec.Tolerations) > 0 {
		c.Tolerations = make([]corev1.Toleration, len(pod.Spec.Tolerations))
		for i := range pod.Spec.Tolerations {
			pod.Spec.Tolerations[i].DeepCopyInto(&c.Tolerations[i])
		}
	}
	if c.NodeSelector == nil && c.Affinity == nil && c.Tolerations == nil {
		return nil
	}
	return &c
}

// preemptible returns the preemptible annotation lower-cased ("true",
// "false" or "" when absent) after checking its value.
func (p *parser) preemptible() string {
	v, ok := p.pod.Annotations[api.AnnotationPreemptible]
	if !ok {
		return ""
	}
	lv := strings.ToLower(strings.TrimSpace(v))
	if lv != "true" && lv != "false" {
		p.add("metadata.annotations["+api.AnnotationPreemptible+"]",
			"annotation %s %q must be \"true\" or \"false\"", api.AnnotationPreemptible, v)
		return ""
	}
	return lv
}

// gang reads the pod's gang. Problems go to p; a Job that cannot be found is
// returned as an error wrapping ErrJobNotFound.
func (p *parser) gang() (*Gang, error) {
	const (
		groupField = "metadata.labels[" + api.LabelPodGroup + "]"
		minField   = "metadata.annotations[" + api.AnnotationMinMember + "]"
	)
	group := p.pod.Labels[api.LabelPodGroup]
	minStr, hasMin := p.pod.Annotations[api.AnnotationMinMember]
	var minMember int32
	if hasMin {
		n, err := strconv.ParseInt(strings.TrimSpace(minStr), 10, 32)
		if err != nil || n < 1 {
			p.add(minField, "annotation %s %q must be a positive whole number: how many pods of the gang must start together",
				api.AnnotationMinMember, minStr)
			hasMin = false
		}
		minMember = int32(n)
	}
	if group != "" && hasMin {
		return &Gang{Namespace: p.pod.Namespace, Name: group, MinMember: minMember}, nil
	}
	if _, minGiven := p.pod.Annotations[api.AnnotationMinMember]; minGiven && !hasMin {
		return nil, nil // already reported
	}
	ref := jobOwner(p.pod)
	if ref == nil || p.opts.JobLookup == nil {
		switch {
		case group != "":
			p.add(minField, "label %s %q needs annotation %s: the number of pods of the gang that must start together",
				api.LabelPodGroup, group, api.AnnotationMinMember)
		case hasMin:
			p.add(groupField, "annotation %s is set but label %s is not: name the gang with the label",
				api.AnnotationMinMember, api.LabelPodGroup)
		}
		return nil, nil
	}
	job, ok := p.opts.JobLookup(p.pod.Namespace, ref.Name)
	if !ok || (ref.UID != "" && job.UID != ref.UID) {
		return nil, fmt.Errorf("reading the gang of pod %s/%s from Job %s: %w", p.pod.Namespace, p.pod.Name, ref.Name, ErrJobNotFound)
	}
	name := group
	if name == "" {
		name = job.Name
	}
	if !hasMin {
		minMember = jobMinMember(job)
		if group == "" && minMember <= 1 {
			return nil, nil // a Job running one pod at a time is no gang
		}
	}
	return &Gang{Namespace: p.pod.Namespace, Name: name, MinMember: minMember, FromJob: true}, nil
}

// jobOwner returns the pod's controller reference when it is a batch/v1 Job.
func jobOwner(pod *corev1.Pod) *metav1.OwnerReference {
	for i := range pod.OwnerReferences {
		r := &pod.OwnerReferences[i]
		if r.Controller != nil && *r.Controller && r.Kind == "Job" && r.APIVersion == batchv1.SchemeGroupVersion.String() {
			return r
		}
	}
	return nil
}

// jobMinMember is how many of the Job's pods run at once: parallelism (1 when
// unset), at most completions when that is set.
func jobMinMember(job *batchv1.Job) int32 {
	n := int32(1)
	if job.Spec.Parallelism != nil {
		n = *job.Spec.Parallelism
	}
	if job.Spec.Completions != nil && *job.Spec.Completions < n {
		n = *job.Spec.Completions
	}
	return max(n, 1)
}
