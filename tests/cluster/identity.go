package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
)

const (
	// tokenLifetime matches the cluster certificates' lifetime.
	tokenLifetime = 7 * 24 * time.Hour
	// nodeDaemonSet is the chart's DaemonSet of gpufrac-node.
	nodeDaemonSet = "gpufrac-node"
	// agentPodPrefix starts the name of every node agent's pod.
	agentPodPrefix = "gpufrac-node-"
)

// serviceAccountToken requests a token of a ServiceAccount, bound to the pod
// boundTo when it is not nil (the API server then puts the pod's node into
// it and refuses it once the pod is gone).
func (c *Cluster) serviceAccountToken(ctx context.Context, namespace, name string, boundTo *corev1.Pod) (string, error) {
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To(int64(tokenLifetime.Seconds())),
	}}
	if boundTo != nil {
		req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{
			Kind: "Pod", APIVersion: "v1", Name: boundTo.Name, UID: boundTo.UID,
		}
	}
	tr, err := c.Client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, req, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("requesting a token for ServiceAccount %s/%s: %w", namespace, name, err)
	}
	return tr.Status.Token, nil
}

// nodeAgentPod makes the node agent's pod on a node from the gpufrac-node
// DaemonSet's pod template (the chart's, as installed), as
// the DaemonSet controller would, and returns it as created. The harness runs
// gpufrac-node as a process, not in this pod (kwok runs no containers): the
// pod is what the agent's identity is bound to, exactly as on a real node,
// where the agent's projected service-account token names its pod and the
// API server adds the pod's node. Two differences from a DaemonSet pod, both
// for the test bed: it tolerates every taint (Karpenter's new nodes start
// tainted, and a pod bound straight to a node is evicted by a NoExecute taint
// it does not tolerate), and its owner is its Node (so Karpenter treats it as
// a node's own pod and garbage collection removes it with the node).
func (c *Cluster) nodeAgentPod(ctx context.Context, node *corev1.Node) (*corev1.Pod, error) {
	in := c.Installed()
	if in == nil {
		return nil, errors.New("node agents need gpufrac's chart installed (Options.Bare is set)")
	}
	obj := in.Objects.Find("DaemonSet", nodeDaemonSet)
	if obj == nil {
		return nil, fmt.Errorf("the chart, as installed, has no DaemonSet %s", nodeDaemonSet)
	}
	var ds appsv1.DaemonSet
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &ds); err != nil {
		return nil, fmt.Errorf("decoding the chart's DaemonSet %s: %w", nodeDaemonSet, err)
	}
	name := agentPodPrefix + node.Name
	if len(name) > 253 {
		name = name[:253]
	}
	pod := &corev1.Pod{
		ObjectMeta: *ds.Spec.Template.ObjectMeta.DeepCopy(),
		Spec:       *ds.Spec.Template.Spec.DeepCopy(),
	}
	pod.Name, pod.Namespace = name, ds.Namespace
	pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}}
	pod.Spec.NodeName = node.Name
	pod.Spec.NodeSelector = nil
	pod.Spec.Tolerations = append(pod.Spec.Tolerations, corev1.Toleration{Operator: corev1.TolerationOpExists})
	pods := c.Client.CoreV1().Pods(pod.Namespace)
	var created *corev1.Pod
	var err error
	// A node that came back under the same name may still have its old
	// agent pod (garbage collection has not caught up): replace it.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		created, err = pods.Create(ctx, pod, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			old, getErr := pods.Get(ctx, name, metav1.GetOptions{})
			if getErr == nil && len(old.OwnerReferences) == 1 && old.OwnerReferences[0].UID == node.UID {
				created = old
				return true, nil
			}
			delErr := pods.Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
			return false, client404(delErr)
		}
		return err == nil, err
	})
	if err != nil {
		return nil, fmt.Errorf("creating the node agent's pod on %s: %w", node.Name, err)
	}
	return created, nil
}

// client404 is nil for NotFound (gone already), else err.
func client404(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// nodeAgentKubeconfig creates the node agent's pod on a node and writes a
// kubeconfig with a token of the gpufrac-node ServiceAccount bound to it, so
// the agent runs with exactly the identity a real deployment gives it: the
// chart's RBAC for it, and the admission policies' hold on its node. It
// returns the kubeconfig's path and the pod; deleting the pod revokes the
// token.
func (c *Cluster) nodeAgentKubeconfig(ctx context.Context, node *corev1.Node) (string, *corev1.Pod, error) {
	pod, err := c.nodeAgentPod(ctx, node)
	if err != nil {
		return "", nil, err
	}
	path, err := c.ServiceAccountKubeconfig(ctx, pod.Namespace, pod.Spec.ServiceAccountName, pod)
	if err != nil {
		return "", nil, errors.Join(err, c.deleteNodeAgentPod(ctx, pod))
	}
	return path, pod, nil
}

// deleteNodeAgentPod removes a node agent's pod (NotFound is success).
func (c *Cluster) deleteNodeAgentPod(ctx context.Context, pod *corev1.Pod) error {
	err := c.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: ptr.To[int64](0),
		Preconditions:      &metav1.Preconditions{UID: &pod.UID},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("deleting the node agent's pod %s: %w", pod.Name, err)
	}
	return nil
}

// writeKubeconfig writes the kubeconfig of one identity with a bearer token.
func (c *Cluster) writeKubeconfig(name, user, token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["gpufrac"] = &clientcmdapi.Cluster{Server: c.apiURL, CertificateAuthorityData: c.pki.caPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["gpufrac"] = &clientcmdapi.Context{Cluster: "gpufrac", AuthInfo: user}
	cfg.CurrentContext = "gpufrac"
	if err := clientcmd.WriteToFile(*cfg, c.componentKubeconfig(name)); err != nil {
		return fmt.Errorf("writing kubeconfig of %s: %w", name, err)
	}
	return nil
}
