package restricted_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpufrac/gpufrac/coordinator/placeholder"
	"github.com/gpufrac/gpufrac/coordinator/reservation"
	"github.com/gpufrac/gpufrac/tests/builders"
)

// violations lists what Pod Security "restricted" (v1.34) would refuse in a
// pod, for the fields these pods can have: privileged or host namespaces,
// volumes other than the restricted types, escalation, capabilities beyond
// NET_BIND_SERVICE, a missing runAsNonRoot, root users, and a seccomp
// profile other than RuntimeDefault or Localhost. The test bed enforces the
// real admission on the reservation namespace; this keeps the builders right
// without it.
func violations(p *corev1.Pod) []string {
	var out []string
	s := p.Spec
	if s.HostNetwork || s.HostPID || s.HostIPC {
		out = append(out, "host namespaces")
	}
	for _, v := range s.Volumes {
		if v.HostPath != nil {
			out = append(out, "hostPath volume "+v.Name)
		}
	}
	podNonRoot := s.SecurityContext != nil && s.SecurityContext.RunAsNonRoot != nil && *s.SecurityContext.RunAsNonRoot
	podSeccomp := s.SecurityContext != nil && s.SecurityContext.SeccompProfile != nil &&
		s.SecurityContext.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault
	if s.SecurityContext != nil && s.SecurityContext.RunAsUser != nil && *s.SecurityContext.RunAsUser == 0 {
		out = append(out, "pod runs as root")
	}
	for _, c := range s.Containers {
		sc := c.SecurityContext
		if sc == nil {
			out = append(out, c.Name+": no security context")
			continue
		}
		if sc.Privileged != nil && *sc.Privileged {
			out = append(out, c.Name+": privileged")
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			out = append(out, c.Name+": allowPrivilegeEscalation not false")
		}
		if sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
			out = append(out, c.Name+": capabilities not dropped")
		} else if len(sc.Capabilities.Add) > 0 {
			out = append(out, c.Name+": capabilities added")
		}
		if !podNonRoot && (sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot) {
			out = append(out, c.Name+": runAsNonRoot not set")
		}
		if !podSeccomp && (sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault) {
			out = append(out, c.Name+": seccomp profile not RuntimeDefault")
		}
		for _, p := range c.Ports {
			if p.HostPort != 0 {
				out = append(out, c.Name+": host port")
			}
		}
	}
	return out
}

func TestCoordinatorPodsAreRestricted(t *testing.T) {
	pods := map[string]*corev1.Pod{
		"reservation": reservation.Pod("node-1", "GPU-1", reservation.DefaultOptions()),
	}
	for i, p := range placeholder.Plan([]placeholder.Item{
		{Workload: "ns/a", Pod: builders.MakePod("a", "ns").Obj(), FractionPercent: 40},
		{Workload: "ns/b", Pod: builders.MakePod("b", "ns").Obj(), GPUs: 2},
	}, placeholder.DefaultOptions()) {
		pods["placeholder "+string(rune('0'+i))] = p
	}
	for name, p := range pods {
		if v := violations(p); len(v) > 0 {
			t.Errorf("%s pod is not restricted: %v", name, v)
		}
		if p.Spec.AutomountServiceAccountToken == nil || *p.Spec.AutomountServiceAccountToken {
			t.Errorf("%s pod mounts a service-account token", name)
		}
	}
	if v := violations(builders.MakePod("plain", "ns").Obj()); len(v) == 0 {
		t.Error("a plain pod passes the check: it checks nothing")
	}
}
