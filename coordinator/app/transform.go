package app

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
)

// trimObject is the informers' transform: it drops what the coordinator
// never reads from the objects it caches, before they are stored. At 5,000
// nodes and 50,000 pods the informers' decoded pods were two thirds of the
// heap (docs/benchmarks.md, "Scale"); kube-controller-manager drops managed
// fields the same way.
//
// Every object loses its managed fields. Pods also lose what runs the
// containers but never places them (trimPod); nodes their image list. The
// coordinator never writes back an object it read from an informer (it
// patches, creates bindings, or gets a fresh object before an update), so
// nothing dropped here can be lost on the API server. It is idempotent and
// changes only the object it is given, which the informer has just decoded
// and nobody else holds yet (client-go's TransformFunc contract).
func trimObject(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
	}
	switch o := obj.(type) {
	case *corev1.Pod:
		trimPod(o)
	case *corev1.Node:
		o.Status.Images = nil
	}
	return obj, nil
}

// trimPod drops what the coordinator never reads of a pod. Kept: metadata,
// and of the spec everything but volumes and what runs each container; of
// each container its name, resources, restart policy (sidecars), env
// names (a container that sets NVIDIA_VISIBLE_DEVICES is refused:
// podrequest) and host ports; of the status all but the containers' states
// and the IPs. What reads pods: api/request (resources, overhead,
// restart policies), podrequest (annotations, labels, env names, affinity,
// node selector, tolerations, priority, claims), state, scheduler,
// placeholder, consolidation, reservation and dra (node name, phase,
// conditions, claim statuses, gates, owner references).
func trimPod(p *corev1.Pod) {
	p.Spec.Volumes = nil
	for i := range p.Spec.InitContainers {
		trimContainer(&p.Spec.InitContainers[i])
	}
	for i := range p.Spec.Containers {
		trimContainer(&p.Spec.Containers[i])
	}
	for i := range p.Spec.EphemeralContainers {
		e := &p.Spec.EphemeralContainers[i]
		c := corev1.Container(e.EphemeralContainerCommon)
		trimContainer(&c)
		e.EphemeralContainerCommon = corev1.EphemeralContainerCommon(c)
	}
	p.Status.ContainerStatuses = nil
	p.Status.InitContainerStatuses = nil
	p.Status.EphemeralContainerStatuses = nil
	p.Status.PodIPs, p.Status.PodIP = nil, ""
	p.Status.HostIPs, p.Status.HostIP = nil, ""
}

// trimContainer keeps a container's name, resources, restart policy, env
// names and host ports.
func trimContainer(c *corev1.Container) {
	*c = corev1.Container{Name: c.Name, Resources: c.Resources, RestartPolicy: c.RestartPolicy,
		RestartPolicyRules: c.RestartPolicyRules, Env: envNames(c.Env), Ports: hostPorts(c.Ports)}
}

// envNames keeps the names of env variables, not their values.
func envNames(env []corev1.EnvVar) []corev1.EnvVar {
	if len(env) == 0 {
		return nil
	}
	out := make([]corev1.EnvVar, len(env))
	for i, e := range env {
		out[i] = corev1.EnvVar{Name: e.Name}
	}
	return out
}

// hostPorts keeps the ports bound on the host.
func hostPorts(ports []corev1.ContainerPort) []corev1.ContainerPort {
	var out []corev1.ContainerPort
	for _, p := range ports {
		if p.HostPort != 0 {
			out = append(out, p)
		}
	}
	return out
}
