package app

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/podrequest"
	"github.com/gpufrac/gpufrac/coordinator/state"
	"github.com/gpufrac/gpufrac/tests/builders"
)

// busyPod is a pod with everything the API server and a kubelet add, and
// what a tenant may write besides its resources.
func busyPod(b *builders.PodWrapper) *corev1.Pod {
	p := b.Obj()
	p.ResourceVersion = "7"
	p.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}}
	p.Spec.Volumes = []corev1.Volume{{Name: "kube-api-access", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{}}}}
	for i := range p.Spec.Containers {
		c := &p.Spec.Containers[i]
		c.Image, c.Command, c.Args = "registry/app:1", []string{"/app"}, []string{"--serve"}
		c.VolumeMounts = []corev1.VolumeMount{{Name: "kube-api-access", MountPath: "/var/run/secrets"}}
		c.LivenessProbe = &corev1.Probe{PeriodSeconds: 10}
		c.Ports = []corev1.ContainerPort{{ContainerPort: 8080}, {ContainerPort: 9090, HostPort: 9090}}
		c.TerminationMessagePath = "/dev/termination-log"
	}
	p.Status = corev1.PodStatus{
		Phase:             corev1.PodRunning,
		Conditions:        []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}},
		ContainerStatuses: []corev1.ContainerStatus{{Name: "main", Ready: true}},
		PodIP:             "10.0.0.1", PodIPs: []corev1.PodIP{{IP: "10.0.0.1"}},
		HostIP: "192.168.0.1", HostIPs: []corev1.HostIP{{IP: "192.168.0.1"}},
	}
	return p
}

// TestTrimObjectKeepsWhatTheCoordinatorReads: a pod trimmed by the
// informers' transform parses as the whole pod does (requests, queue,
// gang, constraints, and the refusal of NVIDIA_VISIBLE_DEVICES), while
// what runs its containers is gone.
func TestTrimObjectKeepsWhatTheCoordinatorReads(t *testing.T) {
	cases := map[string]*builders.PodWrapper{
		"fraction with queue and affinity": builders.MakePod("f", "team").Fraction(30).CPU("500m").Memory("1Gi").Queue("q").
			RequiredNodeAffinity(api.LabelGPUProduct, corev1.NodeSelectorOpIn, "H100").Toleration("gpu", corev1.TolerationOpExists, "", corev1.TaintEffectNoSchedule),
		"whole GPUs, sidecar and init container": builders.MakePod("w", "team").GPUs(2).CPU("1").
			InitContainer("init").CPU("4").SidecarContainer("proxy").CPU("250m").Memory("64Mi").
			Overhead(corev1.ResourceCPU, "100m").PodGroup("g").MinMember(4).Priority(50),
		"sets NVIDIA_VISIBLE_DEVICES": builders.MakePod("v", "team").GPUs(1).Env(api.EnvVisibleDevices, "all").Env("OTHER", "x"),
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			whole := busyPod(b)
			trimmed := busyPod(b)
			if _, err := trimObject(trimmed); err != nil {
				t.Fatal(err)
			}
			wantParsed, wantErr := podrequest.Parse(whole, podrequest.Options{})
			gotParsed, gotErr := podrequest.Parse(trimmed, podrequest.Options{})
			if d := cmp.Diff(wantParsed, gotParsed); d != "" {
				t.Errorf("parsed differently after trimming (-whole +trimmed):\n%s", d)
			}
			if (wantErr == nil) != (gotErr == nil) || (wantErr != nil && wantErr.Error() != gotErr.Error()) {
				t.Errorf("parse error %v after trimming, %v before", gotErr, wantErr)
			}
			if d := cmp.Diff(state.Demand(whole), state.Demand(trimmed)); d != "" {
				t.Errorf("request model differs after trimming (-whole +trimmed):\n%s", d)
			}
			for what, kept := range map[string]bool{
				"managed fields":   trimmed.ManagedFields == nil,
				"volumes":          trimmed.Spec.Volumes == nil,
				"container image":  trimmed.Spec.Containers[0].Image == "",
				"volume mounts":    trimmed.Spec.Containers[0].VolumeMounts == nil,
				"probes":           trimmed.Spec.Containers[0].LivenessProbe == nil,
				"container ports":  len(trimmed.Spec.Containers[0].Ports) == 1 && trimmed.Spec.Containers[0].Ports[0].HostPort == 9090,
				"container status": trimmed.Status.ContainerStatuses == nil,
				"pod IP":           trimmed.Status.PodIP == "" && trimmed.Status.PodIPs == nil,
				"phase kept":       trimmed.Status.Phase == corev1.PodRunning,
				"conditions kept":  len(trimmed.Status.Conditions) == 1,
				"labels kept":      cmp.Equal(trimmed.Labels, whole.Labels),
				"annotations kept": cmp.Equal(trimmed.Annotations, whole.Annotations),
				"affinity kept":    cmp.Equal(trimmed.Spec.Affinity, whole.Spec.Affinity),
				"tolerations kept": cmp.Equal(trimmed.Spec.Tolerations, whole.Spec.Tolerations),
				"resources kept":   cmp.Equal(trimmed.Spec.Containers[0].Resources, whole.Spec.Containers[0].Resources),
				"env values dropped": func() bool {
					for _, e := range trimmed.Spec.Containers[0].Env {
						if e.Value != "" {
							return false
						}
					}
					return len(trimmed.Spec.Containers[0].Env) == len(whole.Spec.Containers[0].Env)
				}(),
			} {
				if !kept {
					t.Errorf("%s: not as expected after trimming", what)
				}
			}
			again := trimmed.DeepCopy()
			if _, err := trimObject(again); err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(trimmed, again); d != "" {
				t.Errorf("trimming twice changed the pod (not idempotent):\n%s", d)
			}
		})
	}
}

// TestTrimObjectNodes: a node keeps all but its managed fields and images.
func TestTrimObjectNodes(t *testing.T) {
	n := builders.MakeNode("n1").Obj()
	n.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}
	n.Status.Images = []corev1.ContainerImage{{Names: []string{"registry/app:1"}, SizeBytes: 1 << 30}}
	want := n.DeepCopy()
	want.ManagedFields, want.Status.Images = nil, nil
	if _, err := trimObject(n); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(want, n); d != "" {
		t.Errorf("trimmed node (-want +got):\n%s", d)
	}
	// Objects of other kinds lose their managed fields only.
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team", Labels: map[string]string{"a": "b"}, ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "x"}}}}
	if _, err := trimObject(ns); err != nil || ns.ManagedFields != nil || ns.Labels["a"] != "b" {
		t.Errorf("namespace after trimming: %+v (err %v)", ns.ObjectMeta, err)
	}
	// Not an object (a tombstone): left as it is.
	tomb := "not an object"
	if got, err := trimObject(tomb); err != nil || got != tomb {
		t.Errorf("trimObject(%q) = %v, %v", tomb, got, err)
	}
}
