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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
