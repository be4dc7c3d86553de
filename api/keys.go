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
	// SystemNamespace holds reservation and placeholder pods.
	SystemNamespace = "gpufrac-system"

	// LabelQueue names the queue a pod is charged to.
	LabelQueue = Domain + "/queue"
	// LabelPodGroup names the gang a pod belongs to.
	LabelPodGroup = Domain + "/pod-group"
	// AnnotationMinMember is the gang's minimum member count.
	AnnotationMinMember = Domain + "/min-member"
	// AnnotationGPU is the GPU UUID the coordinator chose for a fraction pod.
	AnnotationGPU = Domain + "/gpu"
	// AnnotationAllocatedGPU is the GPU UUID the node agent actually gave a pod.
	AnnotationAllocatedGPU = Domain + "/allocated-gpu"
	// AnnotationReservedGPU is the GPU UUID a reservation pod holds, written by the node agent.
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

	// LabelRole marks gpufrac's own pods in SystemNamespace: RoleReservation or RolePlaceholder.
	LabelRole = Domain + "/role"
	// RoleReservation is the LabelRole value of reservation pods.
	RoleReservation = "reservation"
	// RolePlaceholder is the LabelRole value of scale-up placeholder pods.
	RolePlaceholder = "placeholder"
	// LabelReservedNode names the node of a reservation pod.
	LabelReservedNode = Domain + "/node"
	// ReasonReservationPending is the pod-condition reason of a fraction
	// waiting for its GPU's reservation pod to be admitted by the kubelet.
	ReasonReservationPending = "ReservationPending"
	// ReservationNamePrefix starts every reservation pod's name; the node
	// agent recognises reservations in PodResources by it (and the namespace).
	ReservationNamePrefix = "gpufrac-reservation-"

	// EnvMemoryLimitMiB carries a fraction's or replica's GPU memory limit into the container.
	EnvMemoryLimitMiB = "GPUFRAC_MEMORY_LIMIT_MIB"
	// EnvMPSMemLimit is CUDA MPS's per-device pinned memory limit ("<uuid>=<N>M" or "0=<N>M").
	EnvMPSMemLimit = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
	// EnvMPSThreadPercentage is CUDA MPS's active thread percentage.
	EnvMPSThreadPercentage = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
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
)
