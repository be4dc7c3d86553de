package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/tests/cluster"
)

// TestKubectlGpufracAsATenant runs `kubectl gpufrac` as a tenant against
// the test bed's API server, whose RBAC decides: a ServiceAccount of team-a
// with the built-in view role in team-a and the chart's
// gpufrac-tenant-reader (bound by tenantReader.groups to team-a's service
// accounts). The cluster-wide view is forbidden, so it falls back to team-a
// with a hint; -n team-a and queues work; -n team-b is refused by the API
// server, and team-b's pod is never shown.
func TestKubectlGpufracAsATenant(t *testing.T) {
	t.Parallel()
	c := startCluster(t, cluster.Options{Chart: cluster.ChartOptions{Set: []string{"tenantReader.groups={system:serviceaccounts:team-a}"}}})
	plugin := buildBinary(t, "kubectl-gpufrac")
	ctx := t.Context()
	for _, ns := range []string{"team-a", "team-b"} {
		if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		applyYAML(t, c, []byte("apiVersion: gpufrac.io/v1alpha1\nkind: Queue\nmetadata: {name: "+ns+"}\nspec:\n  namespaces: ["+ns+"]\n  resources:\n    gpu: {quota: \"2\"}\n"))
		p := pod(ns+"-job", ns).Fraction(30).Obj()
		p.Namespace = ns
		if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// alice: a ServiceAccount of team-a, with view in team-a only.
	if _, err := c.Client.CoreV1().ServiceAccounts("team-a").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "alice"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.RbacV1().RoleBindings("team-a").Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "alice-view"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "alice", Namespace: "team-a"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tok, err := c.Client.CoreV1().ServiceAccounts("team-a").CreateToken(ctx, "alice",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := tenantKubeconfig(t, c.KubeconfigPath, tok.Status.Token, "team-a")

	run := func(args ...string) (stdout, stderr string, err error) {
		var o, e bytes.Buffer
		cmd := exec.CommandContext(ctx, plugin, append([]string{"--kubeconfig=" + kubeconfig}, args...)...)
		cmd.Stdout, cmd.Stderr = &o, &e
		err = cmd.Run()
		return o.String(), e.String(), err
	}
	type doc struct {
		Namespace string `json:"namespace"`
		Pods      []struct {
			Namespace, Name string
		} `json:"pods"`
		Queues []struct {
			Name string `json:"name"`
		} `json:"queues"`
	}
	parse := func(what, out string) doc {
		t.Helper()
		var d doc
		if err := json.Unmarshal([]byte(out), &d); err != nil {
			t.Fatalf("%s: %v\n%s", what, err, out)
		}
		return d
	}
	podsOf := func(d doc) []string {
		var out []string
		for _, p := range d.Pods {
			out = append(out, p.Namespace+"/"+p.Name)
		}
		return out
	}

	// The cluster-wide view: forbidden by RBAC, so team-a's, with a hint.
	out, hint, err := run("-o", "json")
	if err != nil {
		t.Fatalf("kubectl gpufrac as team-a: %v\n%s", err, hint)
	}
	if !strings.Contains(hint, "no cluster-wide read (Forbidden); showing namespace team-a") {
		t.Errorf("stderr = %q, want the fallback hint naming team-a", hint)
	}
	if d := parse("the fallback view", out); d.Namespace != "team-a" || !slices.Equal(podsOf(d), []string{"team-a/team-a-job"}) {
		t.Errorf("the fallback view shows namespace %q, pods %q; want team-a's pod only", d.Namespace, podsOf(d))
	}
	// -n team-a: the same view, with team-a's queue (tenant reader).
	out, stderr, err := run("-n", "team-a", "-o", "json")
	if err != nil {
		t.Fatalf("kubectl gpufrac -n team-a: %v\n%s", err, stderr)
	}
	if d := parse("-n team-a", out); !slices.Equal(podsOf(d), []string{"team-a/team-a-job"}) || !slices.ContainsFunc(d.Queues, func(q struct {
		Name string `json:"name"`
	}) bool {
		return q.Name == "team-a"
	}) {
		t.Errorf("-n team-a: pods %q, queues %+v; want team-a's pod and queue", podsOf(d), d.Queues)
	}
	// queues: the Queues are readable through gpufrac-tenant-reader.
	out, stderr, err = run("queues", "-o", "json")
	if err != nil {
		t.Fatalf("kubectl gpufrac queues as team-a: %v\n%s", err, stderr)
	}
	var names []string
	for _, q := range parse("queues", out).Queues {
		names = append(names, q.Name)
	}
	if !slices.Contains(names, "team-a") {
		t.Errorf("queues as team-a: %q, want team-a among them", names)
	}
	// Another tenant's namespace: the API server refuses, and nothing of it is printed.
	out, stderr, err = run("-n", "team-b", "-o", "json")
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() == 0 || !strings.Contains(stderr, "forbidden") {
		t.Errorf("-n team-b as team-a: err %v, stderr %q; want a non-zero exit saying forbidden", err, stderr)
	}
	if strings.Contains(out, "team-b-job") {
		t.Errorf("-n team-b as team-a printed team-b's pod:\n%s", out)
	}
}

// tenantKubeconfig writes a kubeconfig for the test bed's API server that
// authenticates with token and defaults to namespace ns.
func tenantKubeconfig(t *testing.T, adminPath, token, ns string) string {
	t.Helper()
	admin, err := clientcmd.LoadFromFile(adminPath)
	if err != nil {
		t.Fatal(err)
	}
	cur, ok := admin.Contexts[admin.CurrentContext]
	if !ok {
		t.Fatalf("%s has no current context", adminPath)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test-bed"] = admin.Clusters[cur.Cluster]
	cfg.AuthInfos["tenant"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["tenant"] = &clientcmdapi.Context{Cluster: "test-bed", AuthInfo: "tenant", Namespace: ns}
	cfg.CurrentContext = "tenant"
	path := filepath.Join(t.TempDir(), "tenant.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}
