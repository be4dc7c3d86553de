package scheduler

import (
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/podrequest"
)

// parse turns a pod into what the cycle needs, through podrequest. A pod
// of the coordinator without a queue label is charged to its namespace's
// default queue (label gpufrac.io/default-queue on the Namespace) when it
// names one.
func (s *Scheduler) parse(p *corev1.Pod) (podInfo, error) {
	if p.Labels[api.LabelQueue] == "" && p.Spec.SchedulerName == s.opts.SchedulerName {
		if q := s.defaultQueue(p.Namespace); q != "" {
			p = withQueueLabel(p, q)
		}
	}
	return s.parseAsIs(p)
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
func (s *Scheduler) parseAdmitted(p *corev1.Pod) (pi podInfo, ok bool, err error) {
	q := p.Annotations[api.AnnotationAdmittedQueue]
	if q == "" {
		return podInfo{}, false, nil
	}
	spec := *p
	spec.Labels = map[string]string{api.LabelQueue: q}
	spec.Annotations = nil
	spec.OwnerReferences = nil
	if pi, err = s.parseAsIs(&spec); err != nil {
		return podInfo{}, false, err
	}
	pi.pod = p
	pi.group = p.Labels[api.LabelPodGroup]
	if ref := metav1.GetControllerOf(p); pi.group == "" && ref != nil && ref.Kind == "Job" {
		pi.group = ref.Name
	}
	// The gang's size counts its bound members for the rollback of a gang
	// bound in part (checkGangBinds). Read leniently: a value edited after
	// admission can only make the author's own gang roll back or not, and
	// an unparsable one leaves the pod charged as it was admitted.
	if n, err := strconv.Atoi(strings.TrimSpace(p.Annotations[api.AnnotationMinMember])); err == nil && n > 0 && pi.group != "" {
		pi.minMember = n
	}
	switch p.Annotations[api.AnnotationAdmittedPreemptible] {
	case "true":
		pi.nonPreemptible = false
	case "false":
		pi.nonPreemptible = true
	default:
		// Bound by a coordinator that did not record it: the pod as it is
		// now (its priority is in pi already; an unparsable annotation
		// protects nothing).
		pi.nonPreemptible = pi.nonPreemptible || strings.EqualFold(strings.TrimSpace(p.Annotations[api.AnnotationPreemptible]), "false")
	}
	return pi, true, nil
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

func (s *Scheduler) parseAsIs(p *corev1.Pod) (podInfo, error) {
	opts := podrequest.Options{MaxGPUs: s.opts.MaxGPUsPerPod, JobLookup: s.deps.Jobs, GPUModels: s.models,
		TimesliceResource: s.opts.TimesliceResource, ScalarMilli: s.scalarMilli,
		NonPreemptiblePriority: s.opts.NonPreemptiblePriority}
	if s.deps.DRA != nil {
		opts.Claims = podrequest.ClaimOptions{Get: s.deps.DRA.GetClaim, GPUMemoryBytes: s.claimGPUMemory}
	}
	r, err := podrequest.Parse(p, opts)
	if err != nil {
		return podInfo{}, err
	}
	pi := podInfo{
		pod:            p,
		req:            r.Request,
		queue:          r.Queue,
		nonPreemptible: r.NonPreemptible,
		priority:       r.Priority,
		res:            r.QueueResources(),
		claims:         r.Claims,
		claimsGPU:      r.ClaimsGPU,
	}
	if r.ClaimsGPU {
		// GPUs asked through claims are served only by nodes in mode dra.
		pi.req = *withOnlyNodes(&pi.req, s.draNodes)
	}
	if r.Gang != nil {
		pi.group, pi.minMember = r.Gang.Name, int(r.Gang.MinMember)
	}
	return pi, nil
}

// productsOf lists the GPU products of the nodes (label nvidia.com/gpu.product), sorted and unique.
func productsOf(nodes []*corev1.Node) []string {
	seen := map[string]bool{}
	var out []string
	for _, n := range nodes {
		if m := n.Labels[api.LabelGPUProduct]; m != "" && !seen[m] {
			seen[m] = true
			out = append(out, m)
		}
	}
	return out
}
