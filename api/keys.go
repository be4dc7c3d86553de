// Package api holds the names gpufrac shares between the node agent, the
// coordinator and the tools: resource names, labels and annotations.
// Every gpufrac.io key lives here and nowhere else.
package api

const (
	// Domain is the API group and the prefix of every gpufrac label and annotation.
	Domain = "gpufrac.io"

	// ResourceGPU is the whole, exclusive GPU resource (device ID = GPU UUID).
	ResourceGPU = "nvidia.com/gpu"
	// ResourceFraction is percent of one GPU, 100 units per shareable GPU
	// (device IDs "<uuid>::<k>").
	ResourceFraction = Domain + "/gpu-fraction"
	// DefaultTimesliceResource is the default name of the time-sliced replica resource.
	DefaultTimesliceResource = "nvidia.com/gpu.shared"
	// MIGResourcePrefix prefixes MIG resources in the mixed strategy ("nvidia.com/mig-1g.10gb").
	MIGResourcePrefix = "nvidia.com/mig-"

	// UnitsPerGPU is how many fraction units one GPU offers.
	UnitsPerGPU = 100

	// SchedulerName is the schedulerName pods use to be scheduled by the coordinator.
	SchedulerName = "gpufrac-scheduler"
	// ComponentNamespace holds gpufrac's components: the gpufrac-node
	// DaemonSet, the coordinator's Deployment, their ServiceAccounts and the
	// coordinator's leader-election Lease. It runs the privileged node agent,
	// so it cannot enforce Pod Security "restricted".
	ComponentNamespace = "gpufrac-system"
	// ReservationNamespace holds reservation and placeholder pods, and nothing
	// else: only the coordinator creates pods there, only of their shape, and
	// it enforces Pod Security "restricted" (deployments/helm/gpufrac). The node
	// agent recognises reservations by it and ReservationNamePrefix.
	ReservationNamespace = "gpufrac-reservations"
	// SystemNamespace is the namespace of reservation and placeholder pods,
	// under the name it had when those shared gpufrac-system with the
	// components.
	//
	// Deprecated: use ReservationNamespace (or ComponentNamespace for the
	// components).
	SystemNamespace = ReservationNamespace
	// CoordinatorServiceAccount is the coordinator's ServiceAccount in
	// ComponentNamespace; the admission policies let only it write what the
	// coordinator owns.
	CoordinatorServiceAccount = "gpufrac-coordinator"
	// NodeServiceAccount is gpufrac-node's ServiceAccount in ComponentNamespace;
	// the admission policies let it write only pods bound to its own node
	// and only its own Node.
	NodeServiceAccount = "gpufrac-node"

	// LabelQueue names the queue a pod is charged to. Tenants write it; the
	// admission policies refuse a queue that does not list the pod's namespace.
	LabelQueue = Domain + "/queue"
	// LabelDefaultQueue, on a Namespace, names the queue of the coordinator's
	// pods there that carry no LabelQueue. Only whoever administers namespaces
	// sets it (tenants cannot write Namespace objects).
	LabelDefaultQueue = Domain + "/default-queue"
	// LabelPodGroup names the gang a pod belongs to.
	LabelPodGroup = Domain + "/pod-group"
	// AnnotationMinMember is the gang's minimum member count.
	AnnotationMinMember = Domain + "/min-member"
	// AnnotationGPU is the GPU UUID the coordinator chose for a fraction pod
	// (written only through the pods/binding subresource) or for a
	// reservation pod (at its creation). A protocol annotation: only the
	// coordinator may set or change it (see ProtocolAnnotations).
	AnnotationGPU = Domain + "/gpu"
	// AnnotationAdmittedQueue is the queue the coordinator charged a pod to,
	// written only through the pods/binding subresource: queue usage counts
	// the bound pods that carry it, whatever their gpufrac.io/queue label
	// says now. A protocol annotation of the coordinator.
	AnnotationAdmittedQueue = Domain + "/admitted-queue"
	// AnnotationAdmittedPreemptible records, on the binding, how the
	// coordinator admitted a pod: "true" preemptible (it may have borrowed
	// beyond its queue's deserved quota, and may be reclaimed), "false"
	// non-preemptible (within the deserved quota, never reclaimed). Queue
	// usage and reclaim read it, not gpufrac.io/preemptible, which the pod's
	// author may change after admission. A protocol annotation of the
	// coordinator.
	AnnotationAdmittedPreemptible = Domain + "/admitted-preemptible"
	// AnnotationAdmittedGang records, on the binding, the gang the
	// coordinator admitted a pod in ("" for a pod on its own): reclaim and
	// the rollback of a gang bound in part group bound pods by it, not by
	// the gpufrac.io/pod-group label, which the pod's author may change
	// after admission. A protocol annotation of the coordinator.
	AnnotationAdmittedGang = Domain + "/admitted-gang"
	// AnnotationAdmittedOwner records, on the binding of a pod of a queue
	// whose quota Kueue keeps, the UID of the controller whose admitted
	// Workload let it in: the pod holds one of that Workload's slots until
	// it ends, whatever its owner references say later (the pod's author
	// may change them). A protocol annotation of the coordinator.
	AnnotationAdmittedOwner = Domain + "/admitted-owner"
	// AnnotationAllocatedGPU is the GPU UUID the node agent actually gave a
	// pod. A protocol annotation of the node agent.
	AnnotationAllocatedGPU = Domain + "/allocated-gpu"
	// AnnotationReservedGPU is the GPU UUID a reservation pod holds, written
	// by the node agent. A protocol annotation of the node agent.
	AnnotationReservedGPU = Domain + "/reserved-gpu"
	// AnnotationConfigError is set on a Node by gpufrac-node while it fails
	// closed because its config was invalid at start: the reason. Removed
	// once a valid config is in force.
	AnnotationConfigError = Domain + "/config-error"
	// AnnotationGPUModels restricts a pod to GPU models ("H100|A100").
	AnnotationGPUModels = Domain + "/gpu-models"
	// AnnotationPreemptible marks a pod non-preemptible when "false".
	AnnotationPreemptible = Domain + "/preemptible"
	// LabelNodePool is the default node label that groups nodes into pools.
	LabelNodePool = "karpenter.sh/nodepool"
	// AnnotationDoNotDisrupt keeps Karpenter from disrupting a pod's node.
	AnnotationDoNotDisrupt = "karpenter.sh/do-not-disrupt"
	// LabelGPUProduct is the node label holding the GPU model.
	LabelGPUProduct = "nvidia.com/gpu.product"
	// LabelGPUNode marks a node as a gpufrac GPU node ("true"): the local
	// cluster harness runs a node agent on fake nodes carrying it.
	LabelGPUNode = Domain + "/gpu-node"

	// LabelRole marks gpufrac's own pods in ReservationNamespace: RoleReservation or RolePlaceholder.
	LabelRole = Domain + "/role"
	// RoleReservation is the LabelRole value of reservation pods.
	RoleReservation = "reservation"
	// RolePlaceholder is the LabelRole value of scale-up placeholder pods.
	RolePlaceholder = "placeholder"
	// TaintDraining is the NoSchedule taint the coordinator's consolidation
	// puts on a node it drains (value: the drain's deadline, Unix seconds):
	// nothing new is placed there, and a restarted coordinator finds the
	// drain to resume or abandon.
	TaintDraining = Domain + "/draining"
	// LabelReservedNode names the node of a reservation pod.
	LabelReservedNode = Domain + "/node"
	// ReasonReservationPending is the pod-condition reason of a fraction
	// waiting for its GPU's reservation pod to be admitted by the kubelet.
	ReasonReservationPending = "ReservationPending"
	// ReservationNamePrefix starts every reservation pod's name; the node
	// agent recognises reservations in PodResources by it (and the namespace).
	ReservationNamePrefix = "gpufrac-reservation-"

	// EnvMemoryLimitMiB tells a fraction's or replica's container its GPU
	// memory limit, so it can size itself (a framework's memory cap). It is
	// information only: the memory watchdog takes each container's limit
	// from the devices it holds, never from its environment, which the
	// tenant controls.
	EnvMemoryLimitMiB = "GPUFRAC_MEMORY_LIMIT_MIB"
	// EnvVisibleDevices is the variable users must not set themselves.
	EnvVisibleDevices = "NVIDIA_VISIBLE_DEVICES"

	// ReasonOverQuota is the pod-condition reason of a pod its queue cannot
	// admit now: non-preemptible work beyond the deserved quota, or preemptible
	// work beyond the fair share. Never "Unschedulable", so Karpenter ignores it.
	ReasonOverQuota = "OverQuota"
	// ReasonOverLimit is the pod-condition reason of a pod that would take its
	// queue, or an ancestor, beyond a hard limit.
	ReasonOverLimit = "OverLimit"
	// ReasonInvalidRequest is the pod-condition reason of a pod whose request
	// can never be admitted as written (bad fraction, missing queue label...).
	ReasonInvalidRequest = "InvalidRequest"
	// ReasonGangIncomplete is the pod-condition reason of a gang member
	// waiting for the rest of its gang (min-member) before any is placed.
	ReasonGangIncomplete = "GangIncomplete"
	// ReasonNoCapacity is the pod-condition reason of admitted work with no
	// room in the cluster now (placeholders ask Karpenter for capacity).
	ReasonNoCapacity = "NoCapacity"
	// ReasonWaitingForKubeScheduler is the pod-condition reason of a pod
	// whose GPUs would come through claims on nodes in mode dra while
	// kube-scheduler is still placing pods with claims there: two
	// allocators that do not see each other's allocations in flight could
	// give the same GPU away twice, so the coordinator waits for
	// kube-scheduler's claims to show.
	ReasonWaitingForKubeScheduler = "WaitingForKubeScheduler"
	// ReasonNotAdmittedByKueue is the pod-condition reason of a pod of a
	// queue whose quota Kueue keeps (Queue spec.admission: Kueue) that no
	// Workload Kueue admitted covers. Never "Unschedulable", so Karpenter
	// buys nothing for it.
	ReasonNotAdmittedByKueue = "NotAdmittedByKueue"
	// ReasonKubeChecksNotReady is the pod-condition reason of a pod that
	// needs kube-scheduler's checks (volumes, topology spread, inter-pod
	// affinity, host ports) while the objects they read (PVs, PVCs,
	// StorageClasses, CSI objects) have not been read yet: the informers
	// did not sync, usually for want of RBAC. Never "Unschedulable".
	ReasonKubeChecksNotReady = "KubeChecksNotReady"
	// ReasonBindingFailed is the pod-condition reason of a pod the
	// coordinator placed whose binding the API server refused or failed; it
	// is placed and bound again after a back-off.
	ReasonBindingFailed = "BindingFailed"
	// ReasonDriftedNodesOnly is the pod-condition reason of admitted work
	// with no room but on nodes whose Karpenter NodeClaim is Drifted, where
	// the coordinator places nothing new (coordinator --avoid-drifted-nodes)
	// so that Karpenter can replace them. Like NoCapacity, it asks
	// Karpenter for capacity through placeholders. Never "Unschedulable".
	ReasonDriftedNodesOnly = "DriftedNodesOnly"
)

// ProtocolAnnotation is a pod annotation gpufrac's components write for each
// other, and who owns it.
type ProtocolAnnotation struct {
	// Key is the annotation key.
	Key string
	// Owner is the component that alone may set or change it:
	// CoordinatorServiceAccount or NodeServiceAccount.
	Owner string
}

// ProtocolAnnotations lists every pod annotation the components write for
// each other. The chart's admission policies (deployments/helm/gpufrac) refuse anyone
// but the owner who sets or changes one (a test keeps the two in step).
func ProtocolAnnotations() []ProtocolAnnotation {
	return []ProtocolAnnotation{
		{Key: AnnotationGPU, Owner: CoordinatorServiceAccount},
		{Key: AnnotationAdmittedQueue, Owner: CoordinatorServiceAccount},
		{Key: AnnotationAdmittedPreemptible, Owner: CoordinatorServiceAccount},
		{Key: AnnotationAdmittedGang, Owner: CoordinatorServiceAccount},
		{Key: AnnotationAdmittedOwner, Owner: CoordinatorServiceAccount},
		{Key: AnnotationAllocatedGPU, Owner: NodeServiceAccount},
		{Key: AnnotationReservedGPU, Owner: NodeServiceAccount},
	}
}
