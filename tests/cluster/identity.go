package cluster

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/api"
)

const (
	// nodeAgentIdentity names the node agents' kubeconfig.
	nodeAgentIdentity = "gpufrac-node"
	// nodeAgentServiceAccount is the ServiceAccount node-rbac.yaml binds.
	nodeAgentServiceAccount = "gpufrac-node"
	// nodeAgentTokenLifetime matches the cluster certificates' lifetime.
	nodeAgentTokenLifetime = 7 * 24 * time.Hour
)

// manifestResource returns the resource of a kind the node manifests hold, and
// whether it is namespaced; ok is false for kinds the harness does not apply.
func manifestResource(kind string) (gvr schema.GroupVersionResource, namespaced, ok bool) {
	rbac := func(resource string) schema.GroupVersionResource {
		return schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: resource}
	}
	switch kind {
	case "Namespace":
		return schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}, false, true
	case "ServiceAccount":
		return schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}, true, true
	case "ClusterRole":
		return rbac("clusterroles"), false, true
	case "ClusterRoleBinding":
		return rbac("clusterrolebindings"), false, true
	case "Role":
		return rbac("roles"), true, true
	case "RoleBinding":
		return rbac("rolebindings"), true, true
	}
	return schema.GroupVersionResource{}, false, false
}

// setUpNodeAgentIdentity applies the project's namespace and node-agent RBAC
// manifests and writes a kubeconfig with a token of the gpufrac-node
// ServiceAccount, so the agents run with exactly the permissions a real
// deployment grants them (and a missing permission fails the tests).
func (c *Cluster) setUpNodeAgentIdentity(ctx context.Context) error {
	dir := c.opts.NodeAgents.ManifestsDir
	if dir == "" {
		root, err := RepoRoot()
		if err != nil {
			return err
		}
		dir = filepath.Join(root, "deployments", "manifests")
	}
	for _, file := range []string{"namespace.yaml", "node-rbac.yaml"} {
		objs, err := ReadObjects(filepath.Join(dir, file))
		if err != nil {
			return err
		}
		for _, obj := range objs {
			gvr, namespaced, ok := manifestResource(obj.GetKind())
			if !ok {
				return fmt.Errorf("applying %s: kind %s is not supported by the harness", file, obj.GetKind())
			}
			var err error
			if namespaced {
				_, err = c.Dynamic.Resource(gvr).Namespace(obj.GetNamespace()).Create(ctx, obj, metav1.CreateOptions{})
			} else {
				_, err = c.Dynamic.Resource(gvr).Create(ctx, obj, metav1.CreateOptions{})
			}
			if err != nil {
				return fmt.Errorf("creating %s %s from %s: %w", obj.GetKind(), obj.GetName(), file, err)
			}
		}
	}
	tr, err := c.Client.CoreV1().ServiceAccounts(api.SystemNamespace).CreateToken(ctx, nodeAgentServiceAccount,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: ptr.To(int64(nodeAgentTokenLifetime.Seconds())),
		}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("requesting a token for ServiceAccount %s/%s: %w", api.SystemNamespace, nodeAgentServiceAccount, err)
	}
	return c.writeKubeconfig(nodeAgentIdentity, nodeAgentIdentity, tr.Status.Token)
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
