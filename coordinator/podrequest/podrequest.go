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
//   - GPU resources, CPU and memory: from the request model, api/request,
//     which the node agent reads pods with too (containers, init containers
//     and sidecars, requests vs limits, the one-kind and one-fraction rules,
//     and the refusal of fractions in init containers). Its problems are
//     this package's problems.
//   - nvidia.com/gpu: whole GPUs, 1..Options.MaxGPUs in total.
//   - gpufrac.io/gpu-fraction: percent (1..100) of ONE GPU;
//     placement.Request.ShareMilli is percent×10, so 100 is a share of 1000
//     (a whole GPU reached through the fraction resource, shareable with
//     nobody).
//   - nvidia.com/mig-<profile> (MIG devices, mixed strategy) and the
//     time-sliced replica resource (Options.TimesliceResource): placed as
//     placement.Request.Scalars; the queue is charged them in GPU terms
//     (Options.ScalarMilli), at most Options.MaxGPUs GPUs' worth.
//   - spec.resourceClaims (Options.Claims, nodes in mode dra): one claim
//     request of gpufrac's classes gives whole GPUs (gpu.gpufrac.io, count
//     N) or a share of one GPU (fraction.gpufrac.io: shares P is P×10
//     milli, memory M is M over the GPU's memory, rounded up); the pod then
//     goes to nodes in mode dra only (Parsed.ClaimsGPU). Claims not created
//     yet give ErrClaimsPending; MIG claims, several GPU claims, or claims
//     beside GPU extended resources are invalid.
//   - annotation gpufrac.io/gpu-models ("H100|A100"): GPU model patterns,
//     matched case-insensitively as substrings of the nodes'
//     nvidia.com/gpu.product label (see MatchModels).
//   - nodeSelector, required node affinity and tolerations: placement constraints.
//   - label gpufrac.io/queue: the queue (required).
//   - spec.schedulingGroup.podGroupName (Kubernetes' own gangs, KEP-4671;
//     Options.PodGroupLookup): a PodGroup with the gang policy is a gang of
//     min-member gang.minCount, named "podgroup/<name>"; with the basic policy
//     each pod goes alone. A PodGroup not created yet makes the pod wait
//     (Gang.Missing). Beside the label below, it is an invalid request.
//   - label gpufrac.io/pod-group + annotation gpufrac.io/min-member: the gang;
//     without them, a pod controlled by a batch/v1 Job with parallelism above 1
//     belongs to the gang named after the Job, min-member min(parallelism, completions).
//   - non-preemptible: priority at or above Options.NonPreemptiblePriority, or
//     annotation gpufrac.io/preemptible: "false".
//
// A container that sets NVIDIA_VISIBLE_DEVICES in its literal env is refused
// with a clear reason. That is a courtesy, not the protection: gpufrac-node
// sets the variable to "void" in every Allocate response (which overrides an
// image's ENV), and the admission policies refuse it in any container.
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
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1alpha2 "k8s.io/api/scheduling/v1alpha2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/request"
	"github.com/gpufrac/gpufrac/coordinator/placement"
	"github.com/gpufrac/gpufrac/coordinator/queue"
)

// DefaultMaxGPUs is the most whole GPUs a pod may ask for unless Options say otherwise.
const DefaultMaxGPUs = 8

// DefaultNonPreemptiblePriority is the priority from which pods are
// non-preemptible unless Options say otherwise.
const DefaultNonPreemptiblePriority int32 = 1000000

// Options tune Parse. The zero value uses the defaults.
type Options struct {
	// MaxGPUs is the most nvidia.com/gpu a pod may ask for; 0 means DefaultMaxGPUs.
	MaxGPUs int
	// NonPreemptiblePriority: pods with at least this priority are
	// non-preemptible; nil means DefaultNonPreemptiblePriority.
	NonPreemptiblePriority *int32
	// PodGroupLookup finds a PodGroup (scheduling.k8s.io/v1alpha2) by
	// namespace and name; nil when the API server serves none.
	PodGroupLookup func(namespace, name string) (*schedulingv1alpha2.PodGroup, bool)
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
	// Claims reads the pod's resource claims (nodes in mode dra).
	Claims ClaimOptions
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
	// PodGroup names the pod's PodGroup (spec.schedulingGroup) when the gang
	// is one; Missing says it does not exist (yet): the pod waits for it.
	PodGroup string
	Missing  bool
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
	// Claims are the pod's resource claims (spec.resourceClaims), read
	// through Options.Claims. When one asks for gpufrac's GPUs, Request says
	// what (whole GPUs, or a share: percent x 10, bytes over the GPU's
	// memory) and ClaimsGPU is set: the pod goes only to nodes in mode dra,
	// where the coordinator allocates its claims.
	Claims    []*resourceapi.ResourceClaim
	ClaimsGPU bool
}

// GangName is the name of the pod's gang, "" for a pod on its own.
func (p *Parsed) GangName() string {
	if p.Gang == nil {
		return ""
	}
	return p.Gang.Name
}

// GangMinMember is the pod's gang's min-member, 0 for a pod on its own.
func (p *Parsed) GangMinMember() int {
	if p.Gang == nil {
		return 0
	}
	return int(p.Gang.MinMember)
}

// MissingPodGroup names the PodGroup the pod is in when it does not exist
// (yet), "" otherwise: its gang waits for it.
func (p *Parsed) MissingPodGroup() string {
	if p.Gang == nil || !p.Gang.Missing {
		return ""
	}
	return p.Gang.PodGroup
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

// ErrInvalidRequest is matched (errors.Is) by every *InvalidRequestError;
// it is the request model's request.ErrInvalid.
var ErrInvalidRequest = request.ErrInvalid

// ErrJobNotFound reports a pod controlled by a Job that JobLookup does not
// know (yet): retry later, the request itself is not known to be invalid.
var ErrJobNotFound = errors.New("owning Job not found")

// Problem is one reason a pod cannot be admitted as written (the request
// model's, api/request).
type Problem = request.Problem

// InvalidRequestError lists every problem found in a pod (the request
// model's error, with the coordinator's own problems added).
type InvalidRequestError = request.InvalidError

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
	r := request.Parse(pod, request.Options{TimesliceResource: opts.TimesliceResource})
	gpus, share, scalars, scalarMilli := p.gpus(r)
	out.Request.GPUs, out.Request.ShareMilli, out.Request.Scalars, out.ScalarMilli = gpus, share, scalars, scalarMilli
	claims, claimGPUs, claimShare, claimErr := p.claims(r.Whole() > 0 || r.Fraction() > 0 || len(scalars) > 0)
	out.Claims = claims
	if claimGPUs > 0 || claimShare > 0 {
		out.Request.GPUs, out.Request.ShareMilli, out.ClaimsGPU = claimGPUs, claimShare, true
	}
	out.Request.CPUMilli, out.Request.MemoryBytes = r.CPUMilli, r.MemoryBytes
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
	if claimErr != nil {
		return Parsed{}, claimErr
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

// gpus takes the GPU resources from the request model (api/request),
// adds its problems to p's, checks the coordinator's own limits (at most
// Options.MaxGPUs GPUs, or GPUs' worth of MIG devices and replicas) and
// returns the pod's whole GPUs, share, scalar resources (MIG devices,
// replicas) and their worth in milli-GPU.
func (p *parser) gpus(r *request.Pod) (int, int, map[string]int64, int64) {
	p.problems = append(p.problems, r.Problems...)
	scalars := r.Scalars()
	var scalarMilli int64
	for name, n := range scalars {
		scalarMilli += n * p.unitMilli(name)
	}
	if limit := int64(p.opts.MaxGPUs) * placement.MilliPerGPU; scalarMilli > limit {
		p.add("spec", "the pod asks %s, %s GPUs' worth in total; at most %d GPUs' worth fit one pod: split the work across pods (a gang)",
			describeScalars(scalars), strconv.FormatFloat(float64(scalarMilli)/placement.MilliPerGPU, 'f', -1, 64), p.opts.MaxGPUs)
		return 0, 0, nil, 0
	}
	if len(r.FractionContainers()) > 0 {
		// One container holds the fraction (else a problem is reported):
		// its share, not the pod's sum.
		return 0, shareMilli(r.FractionContainers()[0].Units()), scalars, scalarMilli
	}
	if total := r.Whole(); total > p.opts.MaxGPUs {
		p.add("spec", "the pod asks %d %s in total; at most %d fit one pod: split the work across pods (a gang)",
			total, api.ResourceGPU, p.opts.MaxGPUs)
		return 0, 0, scalars, scalarMilli
	}
	return r.Whole(), 0, scalars, scalarMilli
}

// shareMilli is fraction units as a share of one GPU, in milli-GPU (at
// most a whole GPU).
func shareMilli(units int) int {
	return min(units*placement.MilliPerGPU/api.UnitsPerGPU, placement.MilliPerGPU)
}

// Demand is what a pod's demand (the request model's) takes in placement's
// terms, unchecked: whole GPUs, else a share of one GPU, CPU and memory.
// It is how a bound pod that Parse refuses (written by someone else, or
// changed since) is still counted where it runs.
func Demand(d request.Demand) placement.Request {
	r := placement.Request{CPUMilli: d.CPUMilli, MemoryBytes: d.MemoryBytes, GPUs: d.Whole}
	if d.Whole == 0 && d.Fraction > 0 {
		r.ShareMilli = shareMilli(d.Fraction)
	}
	return r
}

// unitMilli is what one unit of a scalar resource is charged in milli-GPU.
func (p *parser) unitMilli(name string) int64 {
	if m, ok := p.opts.ScalarMilli[name]; ok && m > 0 {
		return m
	}
	return FallbackScalarMilli(name, p.opts.TimesliceResource)
}

// describeScalars renders scalar requests as "2 nvidia.com/mig-1g.10gb, 1 nvidia.com/mig-3g.40gb".
func describeScalars(sc map[string]int64) string {
	parts := make([]string, 0, len(sc))
	for _, name := range slices.Sorted(maps.Keys(sc)) {
		parts = append(parts, fmt.Sprintf("%d %s", sc[name], name))
	}
	return strings.Join(parts, ", ")
}

// visibleDevices refuses containers that set NVIDIA_VISIBLE_DEVICES in
// their literal env. This is a courtesy to the user (a clear reason early),
// not the protection: gpufrac-node sets the variable to "void" in every
// Allocate response, and the admission policies refuse it in every container.
func (p *parser) visibleDevices() {
	check := func(c *corev1.Container, field string) {
		for _, e := range c.Env {
			if e.Name == api.EnvVisibleDevices {
				p.add(field+".env["+api.EnvVisibleDevices+"]",
					"container %q sets %s itself: remove it; gpufrac gives GPU access through the device plugin, and the variable would bypass it",
					c.Name, api.EnvVisibleDevices)
			}
		}
	}
	for i := range p.pod.Spec.InitContainers {
		check(&p.pod.Spec.InitContainers[i], fmt.Sprintf("spec.initContainers[%s]", p.pod.Spec.InitContainers[i].Name))
	}
	for i := range p.pod.Spec.Containers {
		check(&p.pod.Spec.Containers[i], fmt.Sprintf("spec.containers[%s]", p.pod.Spec.Containers[i].Name))
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

// MaxGPUModels bounds the models a pod may list in gpufrac.io/gpu-models.
// The coordinator parses every pending pod in every cycle: an annotation
// listing tens of thousands of models would make each parse, and so every
// cycle, take seconds.
const MaxGPUModels = 32

func (p *parser) models() []string {
	v, ok := p.pod.Annotations[api.AnnotationGPUModels]
	if !ok {
		return nil
	}
	if n := strings.Count(v, "|") + 1; n > MaxGPUModels {
		p.add("metadata.annotations["+api.AnnotationGPUModels+"]",
			"annotation %s lists %d models, more than %d: name the few models the pod can use, for example \"H100|A100\"",
			api.AnnotationGPUModels, n, MaxGPUModels)
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
			"annotation %s %s names no GPU model: list models separated by |, for example \"H100|A100\"", api.AnnotationGPUModels, quoted(v))
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

// constraints are the pod's node constraints; nil when it has none. They
// are the pod's own selector, affinity and tolerations, not copies: an
// informer's objects never change (it replaces them), placement only reads
// constraints and derives new ones by copying (placement.WithNodes,
// InPool), and each bound pod is parsed twice (as admitted and as it is):
// at 50,000 pods the copies were 7 % of the coordinator's heap
// (docs/benchmarks-history.md, "kube-scheduler's checks at scale").
func constraints(pod *corev1.Pod) *placement.Constraints {
	var c placement.Constraints
	if len(pod.Spec.NodeSelector) > 0 {
		c.NodeSelector = pod.Spec.NodeSelector
	}
	if a := pod.Spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		c.Affinity = a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	}
	if len(pod.Spec.Tolerations) > 0 {
		c.Tolerations = pod.Spec.Tolerations
	}
	if c.NodeSelector == nil && c.Affinity == nil && c.Tolerations == nil {
		return nil
	}
	return c.Sealed() // kept with the parse, placed in every cycle
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
			"annotation %s %s must be \"true\" or \"false\"", api.AnnotationPreemptible, quoted(v))
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
	if sg := p.pod.Spec.SchedulingGroup; sg != nil && sg.PodGroupName != nil {
		return p.podGroupGang(*sg.PodGroupName)
	}
	group := p.pod.Labels[api.LabelPodGroup]
	minStr, hasMin := p.pod.Annotations[api.AnnotationMinMember]
	var minMember int32
	if hasMin {
		n, err := strconv.ParseInt(strings.TrimSpace(minStr), 10, 32)
		if err != nil || n < 1 {
			p.add(minField, "annotation %s %s must be a positive whole number: how many pods of the gang must start together",
				api.AnnotationMinMember, quoted(minStr))
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

// PodGroupGangPrefix starts the name of a gang read from a PodGroup: a
// PodGroup and a gpufrac.io/pod-group label of the same name in one
// namespace are two gangs.
const PodGroupGangPrefix = "podgroup/"

// podGroupGang reads the gang of a pod in PodGroup name (spec.schedulingGroup).
func (p *parser) podGroupGang(name string) (*Gang, error) {
	const field = "spec.schedulingGroup.podGroupName"
	if _, labelled := p.pod.Labels[api.LabelPodGroup]; labelled {
		p.add(field, "the pod is in PodGroup %q and names a gang with label %s too: use one", name, api.LabelPodGroup)
		return nil, nil
	}
	if _, annotated := p.pod.Annotations[api.AnnotationMinMember]; annotated {
		p.add(field, "the pod is in PodGroup %q, whose policy says how many pods start together, and sets annotation %s too: use one", name, api.AnnotationMinMember)
		return nil, nil
	}
	if p.opts.PodGroupLookup == nil {
		p.add(field, "the pod is in PodGroup %q but the coordinator reads no PodGroups (the API server serves no scheduling.k8s.io/v1alpha2, or the coordinator may not read it)", name)
		return nil, nil
	}
	g := &Gang{Namespace: p.pod.Namespace, Name: PodGroupGangPrefix + name, PodGroup: name}
	pg, ok := p.opts.PodGroupLookup(p.pod.Namespace, name)
	switch {
	case !ok:
		g.Missing = true
		return g, nil
	case pg.Spec.SchedulingPolicy.Gang != nil:
		g.MinMember = max(pg.Spec.SchedulingPolicy.Gang.MinCount, 1)
		return g, nil
	default:
		return nil, nil // the basic policy: each pod on its own
	}
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

// quotedMax is how much of a value a problem message quotes.
const quotedMax = 64

// quoted quotes a value a pod's author wrote for a problem message, cut
// short: messages go to the pod's condition, an event and the log, and an
// annotation may be 256 kB.
func quoted(v string) string {
	if len(v) <= quotedMax {
		return strconv.Quote(v)
	}
	return fmt.Sprintf("%s (%d bytes)", strconv.Quote(v[:quotedMax]+"..."), len(v))
}
