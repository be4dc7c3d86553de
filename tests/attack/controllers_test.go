package attack

// Issue 25: the tenant policies hold pods that workload controllers create
// for a tenant, not only the pods a tenant creates itself. The attack bed's
// kube-controller-manager runs with per-controller ServiceAccounts
// (--use-service-account-credentials, as kubeadm and managed clusters run
// it), so a Deployment's pods are created as
// system:serviceaccount:kube-system:replicaset-controller, never as a
// superuser the policies leave alone.

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/tests/builders"
)

// attackThroughWorkloadControllers: the tenant asks for a whole GPU through
// kube-scheduler, and for a privileged container, in Deployments' pod
// templates. The ReplicaSet controller's pod creations are refused with the
// policies' messages (its ReplicaFailure condition says so) and no pod of
// either Deployment exists.
func (b *bed) attackThroughWorkloadControllers(t *testing.T) {
	for _, tc := range []struct {
		name, policy, phrase string
		pod                  *corev1.Pod
	}{
		{
			name:   "ctl-gpu-default-scheduler",
			policy: "gpufrac-tenant-gpu-scheduler",
			phrase: "outside gpufrac's queues",
			pod: builders.MakePod("x", attackerNS).GPUs(1).CPU("100m").
				Toleration(api.LabelGPUNode, corev1.TolerationOpExists, "", "").Obj(),
		},
		{
			name:   "ctl-privileged",
			policy: "gpufrac-tenant-gpu-access",
			phrase: "is privileged",
			pod:    privileged(builders.MakePod("x", attackerNS).CPU("100m").Obj()),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			labels := map[string]string{"app": tc.name}
			tc.pod.Spec.SchedulerName = ""
			d := &appsv1.Deployment{
				ObjectMeta: metav1.ObjectMeta{Name: tc.name, Namespace: attackerNS},
				Spec: appsv1.DeploymentSpec{
					Replicas: ptr.To[int32](1),
					Selector: &metav1.LabelSelector{MatchLabels: labels},
					Template: corev1.PodTemplateSpec{
						ObjectMeta: metav1.ObjectMeta{Labels: labels},
						Spec:       tc.pod.Spec,
					},
				},
			}
			if _, err := b.tenant.AppsV1().Deployments(attackerNS).Create(t.Context(), d, metav1.CreateOptions{}); err != nil {
				t.Fatalf("the tenant's Deployment: %v", err)
			}
			t.Cleanup(func() {
				_ = b.c.Client.AppsV1().Deployments(attackerNS).Delete(context.WithoutCancel(t.Context()), tc.name,
					metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)})
			})
			var failure string
			waitFor(t, 60*time.Second, "the ReplicaSet's ReplicaFailure naming "+tc.policy, func(ctx context.Context) (bool, error) {
				rss, err := b.c.Client.AppsV1().ReplicaSets(attackerNS).List(ctx, metav1.ListOptions{LabelSelector: "app=" + tc.name})
				if err != nil {
					return false, nil
				}
				for _, rs := range rss.Items {
					for _, c := range rs.Status.Conditions {
						if c.Type == appsv1.ReplicaSetReplicaFailure && c.Status == corev1.ConditionTrue {
							failure = c.Message
							return true, nil
						}
					}
				}
				return false, nil
			})
			if !strings.Contains(failure, tc.policy) || !strings.Contains(failure, tc.phrase) {
				t.Errorf("ReplicaFailure %q, want the refusal of %s (%q)", failure, tc.policy, tc.phrase)
			}
			pods, err := b.c.Client.CoreV1().Pods(attackerNS).List(t.Context(), metav1.ListOptions{LabelSelector: "app=" + tc.name})
			if err != nil {
				t.Fatal(err)
			}
			if len(pods.Items) != 0 {
				t.Errorf("%d pods of Deployment %s exist, want none", len(pods.Items), tc.name)
			}
		})
	}
}

// privileged makes p's first container privileged.
func privileged(p *corev1.Pod) *corev1.Pod {
	p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
	return p
}

// attackReviewedHoles are the holes the hostile review of issue 25 found in
// the tenant policies' first version, each refused now:
//   - a GPU pod of high priority from a namespace of the tenant's that no
//     Queue admits (it preempted team-b's whole-GPU pod and a reservation on
//     the test bed);
//   - a pod a controller creates as a superuser (kube-controller-manager in
//     system:masters, as on clusters without per-controller credentials);
//   - host namespaces, added capabilities and unconfined profiles, which
//     reach other teams' GPU processes and the node's GPU sockets.
func (b *bed) attackReviewedHoles(t *testing.T) {
	t.Run("a GPU pod of system-node-critical from a namespace no queue admits", func(t *testing.T) {
		const ns = "team-a-scratch"
		if _, err := b.c.Client.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		defer b.grantEdit(t, ns)()
		p := builders.MakePod("vip-gpu", ns).SchedulerName(corev1.DefaultSchedulerName).GPUs(8).CPU("100m").Obj()
		p.Spec.PriorityClassName = "system-node-critical"
		p.Spec.NodeSelector = map[string]string{corev1.LabelHostname: victimNode}
		b.mustRefuse(t, p, "gpufrac-tenant-priority", "priority class system-node-critical (priority 2000001000) outranks gpufrac's reservations")
		// A GPU pod below the reservations that may preempt is refused
		// there too; one that may not preempt is the tenant's to run.
		b.priorityClass(t, "scratch-urgent", 2_000_000, corev1.PreemptLowerPriority)
		p = builders.MakePod("urgent-gpu", ns).SchedulerName(corev1.DefaultSchedulerName).GPUs(1).CPU("100m").Obj()
		p.Spec.PriorityClassName = "scratch-urgent"
		b.mustRefuse(t, p, "gpufrac-tenant-priority", "preempts lower-priority pods")
	})

	t.Run("a controller's pod created by a superuser", func(t *testing.T) {
		// The admin's own pods are the admin's; a pod a controller makes
		// for a tenant's workload is the tenant's, whoever the controller
		// runs as.
		p := privileged(builders.MakePod("ctl-made", attackerNS).SchedulerName(corev1.DefaultSchedulerName).CPU("100m").Obj())
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "tenant-rs",
			UID: "00000000-0000-0000-0000-000000000001", Controller: ptr.To(true)}}
		_, err := b.c.Client.CoreV1().Pods(attackerNS).Create(t.Context(), p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		refused(t, err, "gpufrac-tenant-gpu-access", "container main is privileged")
	})

	t.Run("host namespaces, capabilities and unconfined profiles", func(t *testing.T) {
		const policy = "gpufrac-tenant-gpu-access"
		base := func(name string) *corev1.Pod {
			return builders.MakePod(name, attackerNS).SchedulerName(corev1.DefaultSchedulerName).CPU("100m").Obj()
		}
		for _, tc := range []struct {
			name, phrase string
			mutate       func(*corev1.Pod)
		}{
			{"hostpid", "the pod asks hostPID", func(p *corev1.Pod) { p.Spec.HostPID = true }},
			{"hostipc", "the pod asks hostIPC", func(p *corev1.Pod) { p.Spec.HostIPC = true }},
			{"hostnetwork", "the pod asks hostNetwork", func(p *corev1.Pod) { p.Spec.HostNetwork = true }},
			{"sys-admin", "container main adds capabilities beyond Pod Security baseline's", func(p *corev1.Pod) {
				p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"SYS_ADMIN"}}}
			}},
			{"sys-ptrace", "container main adds capabilities beyond Pod Security baseline's", func(p *corev1.Pod) {
				p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"SYS_PTRACE"}}}
			}},
			{"seccomp-unconfined", "(pod): an Unconfined seccomp or AppArmor profile", func(p *corev1.Pod) {
				p.Spec.SecurityContext = &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}}
			}},
			{"apparmor-unconfined", "main: an Unconfined seccomp or AppArmor profile", func(p *corev1.Pod) {
				p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{AppArmorProfile: &corev1.AppArmorProfile{Type: corev1.AppArmorProfileTypeUnconfined}}
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				p := base("host-" + tc.name)
				tc.mutate(p)
				b.mustRefuse(t, p, policy, tc.phrase)
			})
		}
		t.Run("selinux-spc", func(t *testing.T) {
			p := base("host-spc")
			p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{SELinuxOptions: &corev1.SELinuxOptions{Type: "spc_t"}}
			b.mustRefuse(t, p, policy, "main: an Unconfined seccomp or AppArmor profile, an SELinux type outside")
		})
		// Baseline's own capabilities stay the tenant's to add, and
		// IPC_LOCK (RDMA); NVIDIA resources that are no GPUs (the network
		// operator's NICs) stay kube-scheduler's.
		p := base("host-ok")
		p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_BIND_SERVICE", "IPC_LOCK"}},
			SELinuxOptions: &corev1.SELinuxOptions{Type: "container_t"}}
		b.mayCreate(t, p)
		nic := base("nic-ok")
		nic.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"nvidia.com/hostdev": resource.MustParse("1")}
		nic.Spec.Containers[0].Resources.Requests = corev1.ResourceList{"nvidia.com/hostdev": resource.MustParse("1")}
		b.mayCreate(t, nic)
	})

	t.Run("a pod from before the rules keeps taking updates", func(t *testing.T) {
		// The admin's own pod (not checked) carries an unconfined AppArmor
		// annotation; the tenant's label on it, and a controller's update,
		// must not be refused for what was there already.
		p := builders.MakePod("old-unconfined", attackerNS).SchedulerName(corev1.DefaultSchedulerName).CPU("100m").
			Annotation("container.apparmor.security.beta.kubernetes.io/main", "unconfined").Obj()
		if _, err := b.c.Client.CoreV1().Pods(attackerNS).Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		defer func() {
			_ = b.c.Client.CoreV1().Pods(attackerNS).Delete(context.WithoutCancel(t.Context()), p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		}()
		if _, err := b.tenant.CoreV1().Pods(attackerNS).Patch(t.Context(), p.Name, types.MergePatchType,
			mergePatch(map[string]any{"metadata": map[string]any{"labels": map[string]string{"touched": "yes"}}}), metav1.PatchOptions{}); err != nil {
			t.Errorf("the tenant's label on a pod that was there before: %v", err)
		}
		// (Adding such an annotation to a pod later is refused by the API
		// server's own validation: AppArmor annotations are set at creation.)
	})
}
