package attack

// Issue 25, classes 2-4: what a tenant writes into a pod spec that reaches
// other teams' GPUs without touching gpufrac's protocol. Each attack runs as
// the tenant in its own namespace (a namespace of queue team-a, so a tenant
// namespace of the policies gpufrac-tenant-*) and is refused at admission.

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/tests/builders"
	"github.com/gpufrac/gpufrac/tests/cluster"
)

// labelAdminNamespace is the cluster admin's opt-out of the tenant policies.
const labelAdminNamespace = "gpufrac.io/admin-namespace"

// mustRefuse creates p as the tenant and expects policy to refuse it with a
// message containing phrase. A pod accepted anyway (on a cluster without the
// policy) is deleted at once, so that it takes nothing from the victims.
func (b *bed) mustRefuse(t *testing.T, p *corev1.Pod, policy, phrase string) {
	t.Helper()
	out, err := b.tenant.CoreV1().Pods(p.Namespace).Create(t.Context(), p, metav1.CreateOptions{})
	if err == nil {
		_ = b.c.Client.CoreV1().Pods(out.Namespace).Delete(context.WithoutCancel(t.Context()), out.Name,
			metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	}
	refused(t, err, policy, phrase)
}

// mayCreate expects the tenant's pod to be admitted (a dry run: nothing runs).
func (b *bed) mayCreate(t *testing.T, p *corev1.Pod) {
	t.Helper()
	if _, err := b.tenant.CoreV1().Pods(p.Namespace).Create(t.Context(), p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("pod %s refused: %v", p.Name, err)
	}
}

// priorityClass creates a PriorityClass as the admin, deleted when the test ends.
func (b *bed) priorityClass(t *testing.T, name string, value int32, policy corev1.PreemptionPolicy) {
	t.Helper()
	if _, err := b.c.Client.SchedulingV1().PriorityClasses().Create(t.Context(), &schedulingv1.PriorityClass{
		ObjectMeta: metav1.ObjectMeta{Name: name}, Value: value, PreemptionPolicy: &policy,
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = b.c.Client.SchedulingV1().PriorityClasses().Delete(context.WithoutCancel(t.Context()), name, metav1.DeleteOptions{})
	})
	// The Priority admission plugin reads classes through an informer: wait
	// until it resolves this one (a dry run of the admin's, not checked by
	// the tenant policies).
	waitFor(t, 10*time.Second, "priority class "+name+" known to admission", func(ctx context.Context) (bool, error) {
		p := builders.MakePod("probe-"+name, attackerNS).SchedulerName(corev1.DefaultSchedulerName).PriorityClass(name).Obj()
		_, err := b.c.Client.CoreV1().Pods(attackerNS).Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil || !strings.Contains(err.Error(), "no PriorityClass"), nil
	})
}

// kubePod is a pod of the tenant for kube-scheduler, tolerating every taint
// (a taint a tenant can tolerate is no boundary).
func kubePod(name string) *builders.PodWrapper {
	return builders.MakePod(name, attackerNS).SchedulerName(corev1.DefaultSchedulerName).CPU("100m").
		Toleration("", corev1.TolerationOpExists, "", "")
}

// attackPriority: built-in and high priority classes that would preempt
// another team's non-preemptible pods or gpufrac's reservations (class 2).
func (b *bed) attackPriority(t *testing.T) {
	const policy = "gpufrac-tenant-priority"
	// An admin's classes for teams: one that preempts above gpufrac's
	// non-preemptible threshold, the same without preemption, and one at the
	// reservations' priority.
	b.priorityClass(t, "attack-urgent", 2_000_000, corev1.PreemptLowerPriority)
	b.priorityClass(t, "attack-urgent-never", 2_000_000, corev1.PreemptNever)
	b.priorityClass(t, "attack-top", 1_000_000_000, corev1.PreemptNever)

	t.Run("system-cluster-critical through kube-scheduler", func(t *testing.T) {
		p := kubePod("vip-kube").Obj()
		p.Spec.PriorityClassName = "system-cluster-critical"
		b.mustRefuse(t, p, policy, "priority class system-cluster-critical (priority 2000000000) outranks gpufrac's reservations")
	})
	t.Run("system-node-critical on the victims' node", func(t *testing.T) {
		// The kubelet evicts other pods to admit a critical pod.
		p := kubePod("vip-node").Obj()
		p.Spec.PriorityClassName = "system-node-critical"
		p.Spec.NodeName = victimNode
		b.mustRefuse(t, p, policy, "priority class system-node-critical (priority 2000001000) outranks gpufrac's reservations")
	})
	t.Run("system-cluster-critical through the coordinator", func(t *testing.T) {
		p := tenantPod("vip-queued").CPU("100m").Obj()
		p.Spec.PriorityClassName = "system-cluster-critical"
		b.mustRefuse(t, p, policy, "outranks gpufrac's reservations")
	})
	t.Run("a class at the reservations' priority", func(t *testing.T) {
		p := kubePod("vip-top").Obj()
		p.Spec.PriorityClassName = "attack-top"
		b.mustRefuse(t, p, policy, "priority class attack-top (priority 1000000000) outranks gpufrac's reservations")
	})
	t.Run("a preempting class above the non-preemptible threshold", func(t *testing.T) {
		p := kubePod("urgent").Obj()
		p.Spec.PriorityClassName = "attack-urgent"
		b.mustRefuse(t, p, policy, "priority class attack-urgent (priority 2000000) preempts lower-priority pods")
	})
	t.Run("what stays allowed", func(t *testing.T) {
		// The coordinator's pods do not preempt by priority (it reclaims by
		// queue quota); a class that never preempts takes nobody's place.
		p := tenantPod("urgent-queued").CPU("100m").Obj()
		p.Spec.PriorityClassName = "attack-urgent"
		b.mayCreate(t, p)
		p = kubePod("urgent-never").Obj()
		p.Spec.PriorityClassName = "attack-urgent-never"
		b.mayCreate(t, p)
	})
}

// attackDefaultSchedulerGPU: GPUs through kube-scheduler (or any other
// scheduler) run outside every queue (class 3).
func (b *bed) attackDefaultSchedulerGPU(t *testing.T) {
	const policy = "gpufrac-tenant-gpu-scheduler"
	const phrase = "container main asks GPUs (nvidia.com/gpu, nvidia.com/gpu.*, nvidia.com/mig-*, nvidia.com/gpu.shared, gpufrac.io/* or a gpufrac DeviceClass) outside gpufrac's queues"
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
	}{
		{"nvidia.com/gpu with a toleration", kubePod("kube-gpu").GPUs(1).Obj()},
		{"nvidia.com/gpu.shared", kubePod("kube-shared").Resource("nvidia.com/gpu.shared", "1").Obj()},
		{"nvidia.com/mig-1g.10gb", kubePod("kube-mig").Resource("nvidia.com/mig-1g.10gb", "1").Obj()},
		{"KEP-5004 implicit name", kubePod("kube-class").Resource("deviceclass.resource.kubernetes.io/"+api.DRAClassGPU, "1").Obj()},
		{"another scheduler", kubePod("other-gpu").SchedulerName("my-scheduler").GPUs(1).Obj()},
	} {
		t.Run(tc.name, func(t *testing.T) { b.mustRefuse(t, tc.pod, policy, phrase) })
	}
	t.Run("nodeName on the victims' node", func(t *testing.T) {
		p := kubePod("kube-pinned").GPUs(1).Obj()
		p.Spec.NodeName = victimNode
		b.mustRefuse(t, p, policy, phrase)
	})
	t.Run("in an init container", func(t *testing.T) {
		p := kubePod("kube-init").InitContainer("setup").GPUs(1).Obj()
		b.mustRefuse(t, p, policy, "container setup asks GPUs")
	})
	t.Run("a DRA claim", func(t *testing.T) {
		p := kubePod("kube-claim").ClaimTemplate("gpu", "any-template").Obj()
		b.mustRefuse(t, p, policy, "pods with spec.resourceClaims in team-a-ns, a namespace of a gpufrac queue, are placed by gpufrac-coordinator")
	})
	t.Run("what stays allowed", func(t *testing.T) {
		b.mayCreate(t, kubePod("kube-cpu").Obj())
		b.mayCreate(t, tenantPod("queued-gpu").GPUs(1).Obj())
	})
}

// attackHostAccess: host access that reaches every GPU, and env that would
// override the limits Allocate sets (class 4).
func (b *bed) attackHostAccess(t *testing.T) {
	const policy = "gpufrac-tenant-gpu-access"
	privileged := &corev1.SecurityContext{Privileged: ptr.To(true)}
	t.Run("privileged", func(t *testing.T) {
		p := kubePod("priv").Obj()
		p.Spec.Containers[0].SecurityContext = privileged
		b.mustRefuse(t, p, policy, "container main is privileged and would see every GPU of its node")
		p = tenantPod("priv-init").CPU("100m").InitContainer("setup").Obj()
		p.Spec.InitContainers[0].SecurityContext = privileged
		b.mustRefuse(t, p, policy, "container setup is privileged")
	})
	t.Run("a mount at /var/run/nvidia-container-devices", func(t *testing.T) {
		// Any volume: the toolkit reads the mount path.
		p := kubePod("device-mount").Obj()
		p.Spec.Volumes = []corev1.Volume{{Name: "all", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
		p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "all", MountPath: "/var/run/nvidia-container-devices/all"}}
		b.mustRefuse(t, p, policy, "container main mounts a volume at /var/run/nvidia-container-devices")
	})
	t.Run("hostPath", func(t *testing.T) {
		p := kubePod("host-dev").Obj()
		p.Spec.Volumes = []corev1.Volume{{Name: "dev", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/kubelet/device-plugins"}}}}
		p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "dev", MountPath: "/plugins"}}
		b.mustRefuse(t, p, policy, "volume dev is a hostPath")
	})
	t.Run("cdi.k8s.io annotations", func(t *testing.T) {
		p := kubePod("cdi").Annotation("cdi.k8s.io/gpu", "nvidia.com/gpu=all").Obj()
		b.mustRefuse(t, p, policy, "annotation cdi.k8s.io/gpu asks the container runtime for CDI devices")
		// Added to a running pod.
		own := create(t, b.tenant, tenantPod("cdi-later").CPU("100m").Obj())
		_, err := b.tenant.CoreV1().Pods(attackerNS).Patch(t.Context(), own.Name, types.MergePatchType,
			mergePatch(map[string]any{"metadata": map[string]any{"annotations": map[string]string{"cdi.k8s.io/gpu": "nvidia.com/gpu=all"}}}), metav1.PatchOptions{})
		refused(t, err, policy, "annotation cdi.k8s.io/gpu asks the container runtime for CDI devices")
	})
	t.Run("env Allocate sets", func(t *testing.T) {
		for _, name := range []string{"GPUFRAC_MEMORY_LIMIT_MIB", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"} {
			p := tenantPod("env-"+strings.ToLower(strings.ReplaceAll(name, "_", "-"))).Fraction(10).Env(name, "1000000").Obj()
			b.mustRefuse(t, p, policy, "container main sets GPUFRAC_* or CUDA_MPS_* env")
		}
	})
	t.Run("a privileged ephemeral container", func(t *testing.T) {
		p := create(t, b.tenant, tenantPod("debuggee-priv").CPU("100m").Obj())
		_, err := b.tenant.CoreV1().Pods(attackerNS).Patch(t.Context(), p.Name, types.StrategicMergePatchType,
			mergePatch(map[string]any{"spec": map[string]any{"ephemeralContainers": []any{map[string]any{
				"name": "debug", "image": builders.DefaultImage, "securityContext": map[string]any{"privileged": true},
			}}}}), metav1.PatchOptions{}, "ephemeralcontainers")
		refused(t, err, policy, "container debug is privileged")
	})
}

// attackAdminOptOut: only the cluster admin takes a namespace out of the
// tenant policies (a GPU operator's, a monitoring agent's), and there such
// pods are admitted.
func (b *bed) attackAdminOptOut(t *testing.T) {
	_, err := b.tenant.CoreV1().Namespaces().Patch(t.Context(), attackerNS, types.MergePatchType,
		mergePatch(map[string]any{"metadata": map[string]any{"labels": map[string]string{labelAdminNamespace: "true"}}}), metav1.PatchOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("the tenant labelling its namespace %s: %v, want Forbidden", labelAdminNamespace, err)
	}
	gpu := kubePod("opted-out-gpu").GPUs(1).Obj()
	priv := kubePod("opted-out-priv").Obj()
	priv.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
	vip := kubePod("opted-out-vip").Obj()
	vip.Spec.PriorityClassName = "system-cluster-critical"
	dryRun := func(ctx context.Context, p *corev1.Pod) error {
		_, err := b.tenant.CoreV1().Pods(attackerNS).Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	setLabel := func(v any) {
		if _, err := b.c.Client.CoreV1().Namespaces().Patch(t.Context(), attackerNS, types.MergePatchType,
			mergePatch(map[string]any{"metadata": map[string]any{"labels": map[string]any{labelAdminNamespace: v}}}), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setLabel("true")
	defer func() {
		// The label gone, the tenant rules apply again (the API server
		// reads namespace labels a moment later: poll).
		setLabel(nil)
		waitFor(t, 10*time.Second, "the tenant rules back", func(ctx context.Context) (bool, error) {
			return cluster.RefusedBy(dryRun(ctx, gpu), "gpufrac-tenant-gpu-scheduler"), nil
		})
	}()
	waitFor(t, 10*time.Second, "the opt-out to be read", func(ctx context.Context) (bool, error) {
		return dryRun(ctx, gpu) == nil, nil
	})
	for _, p := range []*corev1.Pod{priv, vip} {
		if err := dryRun(t.Context(), p); err != nil {
			t.Errorf("pod %s in a namespace the admin opted out: %v", p.Name, err)
		}
	}
}
