package scheduler

import (
	"math"
	"strconv"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1alpha2 "k8s.io/api/scheduling/v1alpha2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/podrequest"
)

// parse turns a pod into what the cycle needs, through podrequest. A pod
// of the coordinator without a queue label is charged to its namespace's
// default queue (label gpufrac.io/default-queue on the Namespace) when it
// names one.
func (s *Scheduler) parse(v *draCycle, p *corev1.Pod) (podInfo, error) {
	e := s.parses.entry(p)
	if e != nil && e.own.done && e.own.fixed {
		return e.own.result(p)
	}
	q := p.Labels[api.LabelQueue]
	fixed := q != "" || p.Spec.SchedulerName != s.opts.SchedulerName
	if !fixed {
		q = s.defaultQueue(p.Namespace) // the namespace's label can change under the same pod
	}
	if e != nil && e.own.done && e.own.queue == q {
		return e.own.result(p)
	}
	pi, err, readJob := s.parseFor(v, p, q)
	if e != nil && !readJob {
		e.own = parsed{done: true, fixed: fixed, queue: q, pi: pi, err: err}
	}
	return pi, err
}

// parseAdmitted parses a pod the coordinator bound, for the books: it is
// charged to the queue its binding recorded (gpufrac.io/admitted-queue), as
// preemptible or not as its binding recorded (gpufrac.io/admitted-preemptible),
// whatever its labels and annotations say now. Those are the pod author's to
// change after admission; the protocol annotations only the coordinator
// writes (the admission policies see to it). So what the author may edit is
// left out: a pod made invalid after admission (an unparsable
// gpufrac.io/preemptible, min-member or gpu-models, a pod-group label without
// min-member, an owner reference to an unknown Job) stays charged, and
// gpufrac.io/preemptible "false" added after admission protects nothing. Only
// the spec, which cannot change, is parsed. The gang (pod-group label, else
// the owning Job's name) still groups pods for reclaim, keyed with how they
// were admitted. ok is false for pods the coordinator did not admit.
func (s *Scheduler) parseAdmitted(v *draCycle, p *corev1.Pod) (pi podInfo, ok bool, err error) {
	e := s.parses.entry(p)
	if e != nil && e.admitted.done {
		if e.admitted.queue == "" {
			return podInfo{}, false, nil
		}
		pi, err = e.admitted.result(p)
		return pi, err == nil, err
	}
	// What is parsed depends on the pod object alone (no Job is read): it
	// is kept whole, unless it read a resource claim, which changes under
	// the same pod (allocated, its allocation shown).
	var readClaims bool
	pi, ok, err = s.parseAdmittedAfresh(v, p, &readClaims)
	if e != nil && !readClaims {
		e.admitted = parsed{done: true, queue: p.Annotations[api.AnnotationAdmittedQueue], pi: pi, err: err}
	}
	return pi, ok, err
}

// parseAdmittedAfresh is parseAdmitted without the cache; it sets
// *readClaims (when not nil) if the parse read a resource claim.
func (s *Scheduler) parseAdmittedAfresh(v *draCycle, p *corev1.Pod, readClaims *bool) (pi podInfo, ok bool, err error) {
	q := p.Annotations[api.AnnotationAdmittedQueue]
	if q == "" {
		return podInfo{}, false, nil
	}
	spec := *p
	spec.Labels = map[string]string{api.LabelQueue: q}
	spec.Annotations = nil
	spec.OwnerReferences = nil
	spec.Spec.SchedulingGroup = nil // the gang is read below
	if pi, err = s.parseAsIs(v, &spec, nil, nil, readClaims); err != nil {
		return podInfo{}, false, err
	}
	pi.pod = p
	pi.Gang = s.admittedGang(p)
	return s.admittedPreemptible(p, pi), true, nil
}

// admittedGang is the gang of a pod the coordinator admitted, read from
// what cannot change under it, else from what its binding recorded:
//   - A pod in a PodGroup (spec.schedulingGroup) is a member of its gang
//     when the group has the gang policy (the pod's field cannot change,
//     nor can the group's policy); else a pod on its own, whatever its
//     labels say. Read once and kept with the parse: a group deleted later
//     leaves its bound members counted as they were bound.
//   - Otherwise the gang its binding recorded (gpufrac.io/admitted-gang): a
//     label changed since counts for nothing. A pod bound by a coordinator
//     that did not record it is read as it says now (label, else the
//     owning Job).
//
// The gang's size counts its bound members for the rollback of a gang
// bound in part (checkGangBinds). Read leniently: a value edited after
// admission can only make the author's own gang roll back or not, and an
// unparsable one leaves the pod charged as it was admitted.
func (s *Scheduler) admittedGang(p *corev1.Pod) *podrequest.Gang {
	if sg := p.Spec.SchedulingGroup; sg != nil && sg.PodGroupName != nil {
		if s.deps.PodGroups == nil {
			return nil
		}
		pg, ok := s.deps.PodGroups(p.Namespace, *sg.PodGroupName)
		if !ok || pg.Spec.SchedulingPolicy.Gang == nil {
			return nil
		}
		return &podrequest.Gang{Namespace: p.Namespace, Name: podrequest.PodGroupGangPrefix + *sg.PodGroupName,
			MinMember: max(pg.Spec.SchedulingPolicy.Gang.MinCount, 1), PodGroup: *sg.PodGroupName}
	}
	name, recorded := p.Annotations[api.AnnotationAdmittedGang]
	if !recorded {
		name = p.Labels[api.LabelPodGroup]
		if ref := metav1.GetControllerOf(p); name == "" && ref != nil && ref.Kind == "Job" {
			name = ref.Name
		}
	}
	if name == "" {
		return nil
	}
	g := &podrequest.Gang{Namespace: p.Namespace, Name: name}
	if n, err := strconv.Atoi(strings.TrimSpace(p.Annotations[api.AnnotationMinMember])); err == nil && n > 0 {
		g.MinMember = int32(min(n, math.MaxInt32))
	}
	return g
}

// admittedPreemptible sets pi's non-preemptible bit as the coordinator
// recorded it when it admitted p.
func (s *Scheduler) admittedPreemptible(p *corev1.Pod, pi podInfo) podInfo {
	switch p.Annotations[api.AnnotationAdmittedPreemptible] {
	case "true":
		pi.NonPreemptible = false
	case "false":
		pi.NonPreemptible = true
	default:
		// Bound by a coordinator that did not record it: the pod as it is
		// now (its priority is in pi already; an unparsable annotation
		// protects nothing).
		pi.NonPreemptible = pi.NonPreemptible || strings.EqualFold(strings.TrimSpace(p.Annotations[api.AnnotationPreemptible]), "false")
	}
	return pi
}

// withQueueLabel returns a copy of p (sharing all but its labels) whose
// queue label is q.
func withQueueLabel(p *corev1.Pod, q string) *corev1.Pod {
	cp := *p
	cp.Labels = make(map[string]string, len(p.Labels)+1)
	for k, v := range p.Labels {
		cp.Labels[k] = v
	}
	cp.Labels[api.LabelQueue] = q
	return &cp
}

// defaultQueue is the queue a namespace names for its label-less pods, ""
// for none.
func (s *Scheduler) defaultQueue(namespace string) string {
	if s.deps.Namespaces == nil {
		return ""
	}
	ns, err := s.deps.Namespaces.Get(namespace)
	if err != nil {
		return ""
	}
	return ns.Labels[api.LabelDefaultQueue]
}

// A cycle reads pods more than once (collect and the plans read the pending
// ones; the bound-pod ledger, bound.go, those an event changed), and parsing
// them was most of a cycle's work at 50,000 pods (docs/benchmarks-history.md,
// "Scale"). So parses are kept from one cycle to the next, by pod object: the informer never changes an object it handed
// out, it replaces it with a new one (and the coordinator changes none), so
// the same pointer is the same pod. Keying by pointer spares a cycle
// reading the pods' UIDs and hashing them; an object without a
// resourceVersion (hand-made, and maybe changed in place) is parsed every
// time. A kept parse also needs the cycle-wide inputs unchanged - the GPU
// models in the cluster and the worth of scalar resources; a change empties
// the cache - and the queue it was parsed for: a namespace's default queue
// can change under the same pod. A parse that read a Job (a gang derived
// from its parallelism) is not kept: the Job can change under the same pod.
// What a cycle did not read is forgotten at its end (sweepParses).

// parseEntry is what is kept of one pod.
type parseEntry struct {
	own      parsed  // parse: for its label's queue, or its namespace's default
	admitted parsed  // parseAdmitted: for the queue its binding recorded
	head     podHead // what readBound reads of the pod besides
	cycle    uint64  // the last cycle that read it
}

// parsed is one kept parse.
type parsed struct {
	done  bool
	fixed bool   // the queue came from the pod itself, not its namespace
	queue string // the queue parsed for ("" for none)
	pi    podInfo
	err   error
}

// result is the kept parse for the pod object p.
func (k *parsed) result(p *corev1.Pod) (podInfo, error) {
	pi := k.pi
	pi.pod = p
	return pi, k.err
}

// parseInputsNow are the parse inputs the Scheduler has now (the last
// snapshot's).
func (s *Scheduler) parseInputsNow() parseInputs {
	return parseInputs{models: s.models, scalarMilli: s.scalarMilli, draNodes: s.draNodes}
}

// beginParses begins a cycle's parses with the Scheduler's GPU models,
// scalar worth and nodes in mode dra; the parses kept are forgotten when
// they changed.
func (s *Scheduler) beginParses() { s.parses.begin(s.parseInputsNow()) }

// parsesValid tells whether the parses kept were made with the GPU models,
// scalar worth and nodes in mode dra the cycle now has.
func (s *Scheduler) parsesValid() bool { return s.parses.valid(s.parseInputsNow()) }

// sweepParses forgets the pods the cycle did not read.
func (s *Scheduler) sweepParses() { s.parses.sweep() }

// parseFor parses p as charged to queue and tells whether the parse read
// a Job or a resource claim (which change under the same pod: such a parse
// is not kept).
func (s *Scheduler) parseFor(v *draCycle, p *corev1.Pod, queue string) (pi podInfo, err error, readJob bool) {
	labelled := p
	if queue != "" && p.Labels[api.LabelQueue] != queue {
		labelled = withQueueLabel(p, queue)
	}
	var readClaims bool
	pi, err = s.parseAsIs(v, labelled, func(ns, name string) (*batchv1.Job, bool) {
		readJob = true
		return s.deps.Jobs(ns, name)
	}, func(ns, name string) (*schedulingv1alpha2.PodGroup, bool) {
		readJob = true
		return s.deps.PodGroups(ns, name)
	}, &readClaims)
	pi.pod = p
	return pi, err, readJob || readClaims
}

// parseAsIs parses p; it sets *readClaims (when not nil) if the parse read
// a resource claim.
func (s *Scheduler) parseAsIs(v *draCycle, p *corev1.Pod, jobs func(namespace, name string) (*batchv1.Job, bool),
	podGroups func(namespace, name string) (*schedulingv1alpha2.PodGroup, bool), readClaims *bool) (podInfo, error) {
	opts := podrequest.Options{MaxGPUs: s.opts.MaxGPUsPerPod, GPUModels: s.models,
		TimesliceResource: s.opts.TimesliceResource, ScalarMilli: s.scalarMilli,
		NonPreemptiblePriority: s.opts.NonPreemptiblePriority}
	if s.deps.Jobs != nil {
		opts.JobLookup = jobs
	}
	if s.deps.PodGroups != nil && podGroups != nil {
		opts.PodGroupLookup = podGroups
	}
	if s.deps.DRA != nil {
		get := s.deps.DRA.GetClaim
		opts.Claims = podrequest.ClaimOptions{GPUMemoryBytes: v.claimGPUMemory,
			Get: func(namespace, name string) (*resourceapi.ResourceClaim, bool) {
				if readClaims != nil {
					*readClaims = true
				}
				return get(namespace, name)
			}}
	}
	r, err := podrequest.Parse(p, opts)
	if err != nil {
		return podInfo{pod: p}, err
	}
	pi := podInfo{pod: p, Parsed: r, res: r.QueueResources()}
	if r.ClaimsGPU {
		// GPUs asked through claims are served only by nodes in mode dra.
		pi.Request = *withOnlyNodes(&pi.Request, s.draNodes)
	}
	return pi, nil
}
