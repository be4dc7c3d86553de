// Package restricted gives the pods the coordinator creates (reservations and
// placeholders) the security settings of Pod Security "restricted", which
// their namespace (api.ReservationNamespace) enforces: they run the pause
// image as a non-root user, with no privilege escalation, no capabilities and
// the runtime's default seccomp profile. Both builders call Apply, so one
// place says what "restricted" takes.
package restricted

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// PauseUser is the user the pause image runs as (its image config says
// 65535); stated explicitly so runAsNonRoot never depends on the image.
const PauseUser int64 = 65535

// Apply sets the pod-level and every container's security context to what
// Pod Security "restricted" requires, and turns off the service-account
// token mount: these pods call no API.
func Apply(spec *corev1.PodSpec) {
	spec.AutomountServiceAccountToken = ptr.To(false)
	spec.SecurityContext = &corev1.PodSecurityContext{
		RunAsNonRoot:   ptr.To(true),
		RunAsUser:      ptr.To(PauseUser),
		RunAsGroup:     ptr.To(PauseUser),
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	for i := range spec.Containers {
		spec.Containers[i].SecurityContext = &corev1.SecurityContext{
			AllowPrivilegeEscalation: ptr.To(false),
			ReadOnlyRootFilesystem:   ptr.To(true),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		}
	}
}
