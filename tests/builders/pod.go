// Package builders makes Kubernetes objects for gpufrac's tests with chained
// calls, in the manner of Kueue's wrappers:
//
//	pod := builders.MakePod("p", "ns").Fraction(30).Queue("team-a").Obj()
//	node := builders.MakeNode("n1").GPUs(8).Product("NVIDIA-H100-80GB-HBM3").Obj()
//
// Each Make function starts from a minimal valid object; each method changes
// the object and returns the wrapper; Obj returns a deep copy, so a wrapper
// can be reused as a template. Quantities are strings ("500m", "4Gi") parsed
// with resource.MustParse, which panics on a malformed literal: these are
// test helpers.
package builders

import (
	"strconv"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	schedulingv1alpha2 "k8s.io/api/scheduling/v1alpha2"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/api"
)

// DefaultImage is the image of the containers MakePod and Container add.
const DefaultImage = "registry.k8s.io/pause:3.10"

// PodWrapper builds a pod. Container-level methods (Fraction, GPUs, CPU,
// Memory, Request, Limit, Resource, Env) apply to the current container: the
// one MakePod creates, or the last one Container, InitContainer or
// SidecarContainer added.
type PodWrapper struct {
	pod corev1.Pod
	// curInit and curIndex locate the current container: Spec.InitContainers
	// or Spec.Containers, at curIndex.
	curInit  bool
	curIndex int
}

// MakePod starts a pod with one container "main" (DefaultImage), scheduled
// by gpufrac (schedulerName gpufrac-scheduler).
func MakePod(name, namespace string) *PodWrapper {
	w := &PodWrapper{pod: corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: corev1.PodSpec{
			SchedulerName: api.SchedulerName,
			Containers:    []corev1.Container{{Name: "main", Image: DefaultImage}},
		},
	}}
	return w
}

// cur is the current container.
func (w *PodWrapper) cur() *corev1.Container {
	if w.curInit {
		return &w.pod.Spec.InitContainers[w.curIndex]
	}
	return &w.pod.Spec.Containers[w.curIndex]
}

// Obj returns a deep copy of the pod.
func (w *PodWrapper) Obj() *corev1.Pod { return w.pod.DeepCopy() }

// Container adds an application container and makes it current.
func (w *PodWrapper) Container(name string) *PodWrapper {
	w.pod.Spec.Containers = append(w.pod.Spec.Containers, corev1.Container{Name: name, Image: DefaultImage})
	w.curInit, w.curIndex = false, len(w.pod.Spec.Containers)-1
	return w
}

// InitContainer adds a regular init container and makes it current.
func (w *PodWrapper) InitContainer(name string) *PodWrapper {
	w.pod.Spec.InitContainers = append(w.pod.Spec.InitContainers, corev1.Container{Name: name, Image: DefaultImage})
	w.curInit, w.curIndex = true, len(w.pod.Spec.InitContainers)-1
	return w
}

// SidecarContainer adds a sidecar (an init container with restartPolicy
// Always) and makes it current.
func (w *PodWrapper) SidecarContainer(name string) *PodWrapper {
	w.InitContainer(name)
	w.cur().RestartPolicy = ptr.To(corev1.ContainerRestartPolicyAlways)
	return w
}

func (w *PodWrapper) setRequest(name corev1.ResourceName, q string) {
	if w.cur().Resources.Requests == nil {
		w.cur().Resources.Requests = corev1.ResourceList{}
	}
	w.cur().Resources.Requests[name] = resource.MustParse(q)
}

func (w *PodWrapper) setLimit(name corev1.ResourceName, q string) {
	if w.cur().Resources.Limits == nil {
		w.cur().Resources.Limits = corev1.ResourceList{}
	}
	w.cur().Resources.Limits[name] = resource.MustParse(q)
}

// Request sets only the request of a resource on the current container.
func (w *PodWrapper) Request(name corev1.ResourceName, q string) *PodWrapper {
	w.setRequest(name, q)
	return w
}

// Limit sets only the limit of a resource on the current container.
func (w *PodWrapper) Limit(name corev1.ResourceName, q string) *PodWrapper {
	w.setLimit(name, q)
	return w
}

// Resource sets both the request and the limit of a resource on the current
// container, as extended resources require.
func (w *PodWrapper) Resource(name corev1.ResourceName, q string) *PodWrapper {
	w.setRequest(name, q)
	w.setLimit(name, q)
	return w
}

// Claim makes the current container use the pod's claim entry name (with
// the ResourceClaim claimName), adding the entry if needed.
func (w *PodWrapper) Claim(name, claimName string) *PodWrapper {
	w.podClaim(corev1.PodResourceClaim{Name: name, ResourceClaimName: &claimName})
	w.cur().Resources.Claims = append(w.cur().Resources.Claims, corev1.ResourceClaim{Name: name})
	return w
}

// ClaimTemplate makes the current container use the pod's claim entry name,
// a claim made for the pod from the ResourceClaimTemplate template.
func (w *PodWrapper) ClaimTemplate(name, template string) *PodWrapper {
	w.podClaim(corev1.PodResourceClaim{Name: name, ResourceClaimTemplateName: &template})
	w.cur().Resources.Claims = append(w.cur().Resources.Claims, corev1.ResourceClaim{Name: name})
	return w
}

func (w *PodWrapper) podClaim(c corev1.PodResourceClaim) {
	for _, have := range w.pod.Spec.ResourceClaims {
		if have.Name == c.Name {
			return
		}
	}
	w.pod.Spec.ResourceClaims = append(w.pod.Spec.ResourceClaims, c)
}

// Fraction asks percent of one GPU (gpufrac.io/gpu-fraction) for the current container.
func (w *PodWrapper) Fraction(percent int) *PodWrapper {
	return w.Resource(api.ResourceFraction, strconv.Itoa(percent))
}

// GPUs asks n whole GPUs (nvidia.com/gpu) for the current container.
func (w *PodWrapper) GPUs(n int) *PodWrapper {
	return w.Resource(api.ResourceGPU, strconv.Itoa(n))
}

// CPU requests CPU for the current container ("500m", "2").
func (w *PodWrapper) CPU(q string) *PodWrapper { return w.Request(corev1.ResourceCPU, q) }

// Memory requests memory for the current container ("512Mi").
func (w *PodWrapper) Memory(q string) *PodWrapper { return w.Request(corev1.ResourceMemory, q) }

// Env sets an environment variable on the current container.
func (w *PodWrapper) Env(name, value string) *PodWrapper {
	w.cur().Env = append(w.cur().Env, corev1.EnvVar{Name: name, Value: value})
	return w
}

// Overhead sets the pod overhead of a resource (as a RuntimeClass would).
func (w *PodWrapper) Overhead(name corev1.ResourceName, q string) *PodWrapper {
	if w.pod.Spec.Overhead == nil {
		w.pod.Spec.Overhead = corev1.ResourceList{}
	}
	w.pod.Spec.Overhead[name] = resource.MustParse(q)
	return w
}

// Queue sets the gpufrac.io/queue label.
func (w *PodWrapper) Queue(q string) *PodWrapper { return w.Label(api.LabelQueue, q) }

// PodGroup sets the gpufrac.io/pod-group label (the gang's name).
func (w *PodWrapper) PodGroup(name string) *PodWrapper { return w.Label(api.LabelPodGroup, name) }

// SchedulingGroup puts the pod in PodGroup name (spec.schedulingGroup,
// Kubernetes' own gangs).
func (w *PodWrapper) SchedulingGroup(name string) *PodWrapper {
	w.pod.Spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: &name}
	return w
}

// MinMember sets the gpufrac.io/min-member annotation.
func (w *PodWrapper) MinMember(n int) *PodWrapper {
	return w.Annotation(api.AnnotationMinMember, strconv.Itoa(n))
}

// Preemptible sets the gpufrac.io/preemptible annotation.
func (w *PodWrapper) Preemptible(p bool) *PodWrapper {
	return w.Annotation(api.AnnotationPreemptible, strconv.FormatBool(p))
}

// GPUModels sets the gpufrac.io/gpu-models annotation ("H100|A100").
func (w *PodWrapper) GPUModels(models string) *PodWrapper {
	return w.Annotation(api.AnnotationGPUModels, models)
}

// Node binds the pod to a node (spec.nodeName).
func (w *PodWrapper) Node(name string) *PodWrapper {
	w.pod.Spec.NodeName = name
	return w
}

// SchedulerName sets spec.schedulerName (MakePod uses gpufrac-scheduler).
func (w *PodWrapper) SchedulerName(name string) *PodWrapper {
	w.pod.Spec.SchedulerName = name
	return w
}

// Priority sets spec.priority.
func (w *PodWrapper) Priority(p int32) *PodWrapper {
	w.pod.Spec.Priority = &p
	return w
}

// PriorityClass sets spec.priorityClassName.
func (w *PodWrapper) PriorityClass(name string) *PodWrapper {
	w.pod.Spec.PriorityClassName = name
	return w
}

// Annotation sets an annotation.
func (w *PodWrapper) Annotation(key, value string) *PodWrapper {
	if w.pod.Annotations == nil {
		w.pod.Annotations = map[string]string{}
	}
	w.pod.Annotations[key] = value
	return w
}

// Label sets a label.
func (w *PodWrapper) Label(key, value string) *PodWrapper {
	if w.pod.Labels == nil {
		w.pod.Labels = map[string]string{}
	}
	w.pod.Labels[key] = value
	return w
}

// Toleration adds a toleration. An empty operator means Equal, or Exists
// when value is empty.
func (w *PodWrapper) Toleration(key string, op corev1.TolerationOperator, value string, effect corev1.TaintEffect) *PodWrapper {
	if op == "" {
		op = corev1.TolerationOpEqual
		if value == "" {
			op = corev1.TolerationOpExists
		}
	}
	w.pod.Spec.Tolerations = append(w.pod.Spec.Tolerations, corev1.Toleration{Key: key, Operator: op, Value: value, Effect: effect})
	return w
}

// NodeSelector adds a node-selector entry.
func (w *PodWrapper) NodeSelector(key, value string) *PodWrapper {
	if w.pod.Spec.NodeSelector == nil {
		w.pod.Spec.NodeSelector = map[string]string{}
	}
	w.pod.Spec.NodeSelector[key] = value
	return w
}

// RequiredNodeAffinity adds a requirement to the first term of the pod's
// required node affinity, creating it when needed. Requirements of one term
// must all hold.
func (w *PodWrapper) RequiredNodeAffinity(key string, op corev1.NodeSelectorOperator, values ...string) *PodWrapper {
	sel := w.requiredSelector()
	if len(sel.NodeSelectorTerms) == 0 {
		sel.NodeSelectorTerms = []corev1.NodeSelectorTerm{{}}
	}
	t := &sel.NodeSelectorTerms[0]
	t.MatchExpressions = append(t.MatchExpressions, corev1.NodeSelectorRequirement{Key: key, Operator: op, Values: values})
	return w
}

// RequiredNodeAffinityTerm adds a term of one requirement to the pod's
// required node affinity; a node must match any one term.
func (w *PodWrapper) RequiredNodeAffinityTerm(key string, op corev1.NodeSelectorOperator, values ...string) *PodWrapper {
	sel := w.requiredSelector()
	sel.NodeSelectorTerms = append(sel.NodeSelectorTerms, corev1.NodeSelectorTerm{
		MatchExpressions: []corev1.NodeSelectorRequirement{{Key: key, Operator: op, Values: values}},
	})
	return w
}

func (w *PodWrapper) requiredSelector() *corev1.NodeSelector {
	if w.pod.Spec.Affinity == nil {
		w.pod.Spec.Affinity = &corev1.Affinity{}
	}
	a := w.pod.Spec.Affinity
	if a.NodeAffinity == nil {
		a.NodeAffinity = &corev1.NodeAffinity{}
	}
	if a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{}
	}
	return a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
}

// Affinity replaces the pod's whole affinity.
func (w *PodWrapper) Affinity(a *corev1.Affinity) *PodWrapper {
	w.pod.Spec.Affinity = a.DeepCopy()
	return w
}

// OwnedByJob makes job the pod's controller, as the Job controller does.
func (w *PodWrapper) OwnedByJob(job *batchv1.Job) *PodWrapper {
	w.pod.OwnerReferences = append(w.pod.OwnerReferences, metav1.OwnerReference{
		APIVersion: "batch/v1", Kind: "Job", Name: job.Name, UID: job.UID,
		Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
	})
	return w
}

// OwnedBy makes a controller of kind (a ReplicaSet, a StatefulSet...) the
// pod's controller owner.
func (w *PodWrapper) OwnedBy(apiVersion, kind, name string) *PodWrapper {
	w.pod.OwnerReferences = append(w.pod.OwnerReferences, metav1.OwnerReference{
		APIVersion: apiVersion, Kind: kind, Name: name, UID: types.UID("uid-" + name),
		Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
	})
	return w
}

// UID sets metadata.uid.
func (w *PodWrapper) UID(uid string) *PodWrapper {
	w.pod.UID = types.UID(uid)
	return w
}

// Created sets metadata.creationTimestamp.
func (w *PodWrapper) Created(t metav1.Time) *PodWrapper {
	w.pod.CreationTimestamp = t
	return w
}

// JobWrapper builds a batch/v1 Job.
type JobWrapper struct{ job batchv1.Job }

// MakeJob starts a Job with parallelism 1 and UID "uid-<name>", whose pod
// template runs one pause container.
func MakeJob(name, namespace string) *JobWrapper {
	return &JobWrapper{job: batchv1.Job{
		TypeMeta:   metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, UID: types.UID("uid-" + name)},
		Spec: batchv1.JobSpec{
			Parallelism: ptr.To[int32](1),
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers:    []corev1.Container{{Name: "main", Image: DefaultImage}},
			}},
		},
	}}
}

// Parallelism sets spec.parallelism.
func (w *JobWrapper) Parallelism(n int32) *JobWrapper {
	w.job.Spec.Parallelism = &n
	return w
}

// Completions sets spec.completions.
func (w *JobWrapper) Completions(n int32) *JobWrapper {
	w.job.Spec.Completions = &n
	return w
}

// UID sets metadata.uid.
func (w *JobWrapper) UID(uid string) *JobWrapper {
	w.job.UID = types.UID(uid)
	return w
}

// Obj returns a deep copy of the Job.
func (w *JobWrapper) Obj() *batchv1.Job { return w.job.DeepCopy() }

// Phase sets status.phase.
func (w *PodWrapper) Phase(p corev1.PodPhase) *PodWrapper {
	w.pod.Status.Phase = p
	return w
}

// PendingFor makes the pod Pending with a PodScheduled=False condition of
// that reason and message, as the coordinator writes it (api.ReasonOverQuota...).
func (w *PodWrapper) PendingFor(reason, message string) *PodWrapper {
	w.pod.Status.Phase = corev1.PodPending
	w.pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: reason, Message: message}}
	return w
}

// PodGroupWrapper builds a PodGroup (scheduling.k8s.io/v1alpha2).
type PodGroupWrapper struct{ pg schedulingv1alpha2.PodGroup }

// MakePodGroup is a PodGroup with the basic policy (each pod on its own).
func MakePodGroup(name, namespace string) *PodGroupWrapper {
	return &PodGroupWrapper{pg: schedulingv1alpha2.PodGroup{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: schedulingv1alpha2.PodGroupSpec{SchedulingPolicy: schedulingv1alpha2.PodGroupSchedulingPolicy{
			Basic: &schedulingv1alpha2.BasicSchedulingPolicy{}}},
	}}
}

// Gang gives the group the gang policy: minCount pods start together.
func (w *PodGroupWrapper) Gang(minCount int32) *PodGroupWrapper {
	w.pg.Spec.SchedulingPolicy = schedulingv1alpha2.PodGroupSchedulingPolicy{
		Gang: &schedulingv1alpha2.GangSchedulingPolicy{MinCount: minCount}}
	return w
}

// Obj returns a copy of the PodGroup.
func (w *PodGroupWrapper) Obj() *schedulingv1alpha2.PodGroup { return w.pg.DeepCopy() }

// PodGroupLookup finds the given PodGroups by namespace and name, as the
// coordinator's informer does.
func PodGroupLookup(pgs ...*schedulingv1alpha2.PodGroup) func(namespace, name string) (*schedulingv1alpha2.PodGroup, bool) {
	return func(namespace, name string) (*schedulingv1alpha2.PodGroup, bool) {
		for _, pg := range pgs {
			if pg.Namespace == namespace && pg.Name == name {
				return pg, true
			}
		}
		return nil, false
	}
}
