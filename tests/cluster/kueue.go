package cluster

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// Kueue (sigs.k8s.io/kueue, bin/kueue and bin/kueue-manifests from `make
// tools`) runs beside the control plane when Options.Kueue is set: its CRDs
// are installed, its manager runs as a process with a Configuration written to
// the cluster dir, and its webhooks are registered with the API server by URL
// (https://127.0.0.1:<port>), signed by the cluster CA, as a real install
// registers them through its Service.

const (
	// KueueQueueNameLabel names the LocalQueue a Job (or other workload) is
	// submitted to.
	KueueQueueNameLabel = "kueue.x-k8s.io/queue-name"
	// KueueNamespace is the manager's own namespace (Configuration.namespace),
	// created at start; Kueue manages no jobs in it.
	KueueNamespace = "kueue-system"
	// KueueAPIVersion is the version of Kueue's kinds the helpers below speak.
	// The CRDs also serve v1beta1, without a conversion webhook (the API
	// server only relabels objects): use v1beta2.
	KueueAPIVersion = "kueue.x-k8s.io/v1beta2"
	// KueueAdmitted is the Workload condition that says it is admitted: its
	// quota is reserved and its admission checks passed.
	KueueAdmitted = "Admitted"
	// KueueQuotaReserved is the Workload condition that says it holds quota.
	KueueQuotaReserved = "QuotaReserved"
	// KueueDefaultFramework is the integration KueueOptions.Frameworks defaults to.
	KueueDefaultFramework = "batch/job"

	// kueueMetricsCertDir is where Kueue v0.17 reads its metrics serving
	// certificate from when its internal certificate management is off: a
	// path its main hard-codes (see ensureKueueMetricsCert).
	kueueMetricsCertDir = "/etc/kueue/metrics/certs"
	// kueueWebhookCheckTimeout bounds the end-to-end webhook check after the
	// manager reports ready.
	kueueWebhookCheckTimeout = 30 * time.Second
	// kueueResourceInUseFinalizer is the finalizer Kueue's ResourceFlavor
	// webhook adds: seeing it proves the mutating webhook ran.
	kueueResourceInUseFinalizer = "kueue.x-k8s.io/resource-in-use"
)

// KueueOptions configures Kueue's manager.
type KueueOptions struct {
	// Frameworks are the job integrations Kueue manages (its
	// integrations.frameworks): "batch/job", "pod", "deployment",
	// "statefulset", "jobset.x-k8s.io/jobset", ... Empty means
	// ["batch/job"]. Only their webhooks (and Kueue's own kinds') are
	// registered; integrations of kinds other than the built-in ones need
	// those kinds' CRDs, which the harness does not install.
	Frameworks []string
	// ManageJobsWithoutQueueName makes Kueue manage (suspend until admitted)
	// jobs of the enabled frameworks that carry no KueueQueueNameLabel too,
	// in every namespace but kube-system and KueueNamespace (Kueue's default
	// managedJobsNamespaceSelector), gpufrac's own included: with the pod
	// integration that takes in the node agents' pods.
	ManageJobsWithoutQueueName bool
}

// ClusterQueueResource is Kueue's kueue.x-k8s.io/v1beta2 ClusterQueues.
func ClusterQueueResource() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "clusterqueues"}
}

// LocalQueueResource is Kueue's kueue.x-k8s.io/v1beta2 LocalQueues (namespaced).
func LocalQueueResource() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "localqueues"}
}

// ResourceFlavorResource is Kueue's kueue.x-k8s.io/v1beta2 ResourceFlavors.
func ResourceFlavorResource() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "resourceflavors"}
}

// WorkloadResource is Kueue's kueue.x-k8s.io/v1beta2 Workloads (namespaced).
func WorkloadResource() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "workloads"}
}

// ResourceFlavorObject renders a ResourceFlavor; nodeLabels, when not empty,
// restrict the flavor to nodes with those labels (spec.nodeLabels).
func ResourceFlavorObject(name string, nodeLabels map[string]string) *unstructured.Unstructured {
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": KueueAPIVersion,
		"kind":       "ResourceFlavor",
		"metadata":   map[string]any{"name": name},
		"spec":       map[string]any{},
	}}
	if len(nodeLabels) > 0 {
		labels := map[string]any{}
		for k, v := range nodeLabels {
			labels[k] = v
		}
		obj.Object["spec"] = map[string]any{"nodeLabels": labels}
	}
	return obj
}

// ClusterQueue is a Kueue ClusterQueue with one resource group of one flavor.
type ClusterQueue struct {
	// Name is the ClusterQueue's name.
	Name string
	// Flavor is the ResourceFlavor its quota is in.
	Flavor string
	// Quotas are the nominal quotas; their names are the group's covered
	// resources (a workload asking for a resource not covered is never
	// admitted).
	Quotas corev1.ResourceList
	// QueueingStrategy is StrictFIFO or BestEffortFIFO. Empty means Kueue's
	// default (BestEffortFIFO).
	QueueingStrategy string
	// Cohort, when set, puts the queue in that cohort (spec.cohortName).
	Cohort string
}

// ClusterQueueObject renders a ClusterQueue open to every namespace
// (namespaceSelector {}).
func ClusterQueueObject(cq ClusterQueue) (*unstructured.Unstructured, error) {
	if cq.Name == "" || cq.Flavor == "" || len(cq.Quotas) == 0 {
		return nil, fmt.Errorf("rendering ClusterQueue %q: it needs a name, a flavor and quotas", cq.Name)
	}
	names := make([]string, 0, len(cq.Quotas))
	for name := range cq.Quotas {
		names = append(names, string(name))
	}
	slices.Sort(names)
	var resources []map[string]any
	for _, name := range names {
		q := cq.Quotas[corev1.ResourceName(name)]
		resources = append(resources, map[string]any{"name": name, "nominalQuota": q.String()})
	}
	spec := map[string]any{
		"namespaceSelector": map[string]any{},
		"resourceGroups": []map[string]any{{
			"coveredResources": names,
			"flavors":          []map[string]any{{"name": cq.Flavor, "resources": resources}},
		}},
	}
	if cq.QueueingStrategy != "" {
		spec["queueingStrategy"] = cq.QueueingStrategy
	}
	if cq.Cohort != "" {
		spec["cohortName"] = cq.Cohort
	}
	// A JSON round trip makes the typed slices plain []any, as unstructured needs.
	raw, err := json.Marshal(map[string]any{
		"apiVersion": KueueAPIVersion,
		"kind":       "ClusterQueue",
		"metadata":   map[string]any{"name": cq.Name},
		"spec":       spec,
	})
	if err != nil {
		return nil, fmt.Errorf("rendering ClusterQueue %s: %w", cq.Name, err)
	}
	obj := &unstructured.Unstructured{}
	if err := obj.UnmarshalJSON(raw); err != nil {
		return nil, fmt.Errorf("rendering ClusterQueue %s: %w", cq.Name, err)
	}
	return obj, nil
}

// LocalQueueObject renders a LocalQueue in namespace submitting to clusterQueue.
func LocalQueueObject(namespace, name, clusterQueue string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": KueueAPIVersion,
		"kind":       "LocalQueue",
		"metadata":   map[string]any{"name": name, "namespace": namespace},
		"spec":       map[string]any{"clusterQueue": clusterQueue},
	}}
}

// KueueRunning reports whether the cluster started Kueue and its manager is
// still running. Its log is the Process named "kueue" (Processes).
func (c *Cluster) KueueRunning() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.kueue != nil && !c.kueue.proc.exited()
}

// startKueue installs Kueue's CRDs and its namespace, starts the manager,
// waits for its /readyz, registers its webhooks and checks that the API
// server reaches them.
func (c *Cluster) startKueue(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	began := time.Now()
	opts := *c.opts.Kueue
	frameworks := opts.Frameworks
	if len(frameworks) == 0 {
		frameworks = []string{KueueDefaultFramework}
	}
	manifests := filepath.Join(c.binDir, "kueue-manifests")

	// 1. What must be there before the manager starts: the metrics
	// certificate it insists on, its webhooks as released (read now, so an
	// unknown framework fails before anything starts), its CRDs established
	// and its namespace.
	if err := ensureKueueMetricsCert(kueueMetricsCertDir); err != nil {
		return err
	}
	released, err := readKueueWebhooks(filepath.Join(manifests, "manifests.yaml"))
	if err != nil {
		return err
	}
	id, err := randomToken()
	if err != nil {
		return err
	}
	// Names of the cluster's own: nothing else may own Kueue's webhooks here.
	webhookName := "gpufrac-testbed-kueue-" + id[:8]
	if _, _, err := released.render(frameworks, webhookName, "https://127.0.0.1:0", nil); err != nil {
		return err
	}
	if err := c.applyCRDs(ctx, filepath.Join(manifests, "crds")); err != nil {
		return err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: KueueNamespace}}
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", KueueNamespace, err)
	}

	// 2. The webhook server's certificate, for 127.0.0.1, signed by the cluster CA.
	dir := filepath.Join(c.Dir, "kueue")
	certDir := filepath.Join(dir, "certs")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return fmt.Errorf("creating Kueue's cert dir: %w", err)
	}
	certPEM, keyPEM, err := c.pki.loopbackServingCert("kueue-webhook")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(certDir, "tls.crt"), certPEM, 0o644); err != nil {
		return fmt.Errorf("writing Kueue's webhook certificate: %w", err)
	}
	if err := os.WriteFile(filepath.Join(certDir, "tls.key"), keyPEM, 0o600); err != nil {
		return fmt.Errorf("writing Kueue's webhook key: %w", err)
	}

	// 3. The manager: webhook server and health probes on 127.0.0.1, metrics
	// off, no leader election, no visibility API server.
	configPath := filepath.Join(dir, "config.yaml")
	comp := component{
		name:  "kueue",
		ports: 2, // webhook, health probes
		args: func(ports []int) ([]string, error) {
			cfg, err := kueueConfiguration(opts, frameworks, ports[0], ports[1], certDir)
			if err != nil {
				return nil, err
			}
			if err := os.WriteFile(configPath, cfg, 0o644); err != nil {
				return nil, fmt.Errorf("writing Kueue's configuration: %w", err)
			}
			return []string{"--config=" + configPath, "--kubeconfig=" + c.componentKubeconfig("kueue")}, nil
		},
		ready: func(ctx context.Context, ports []int) error {
			// Kueue's readyz includes its webhook server's started check.
			return probeHTTP(ctx, http.DefaultClient, fmt.Sprintf("http://127.0.0.1:%d/readyz", ports[1]), nil)
		},
	}
	ports, proc, err := c.startComponent(ctx, comp)
	if err != nil {
		return err
	}
	// Recorded before the webhooks exist, so that Stop removes whatever got created.
	c.mu.Lock()
	c.kueue = &running{comp: comp, ports: ports, proc: proc}
	c.kueueWebhooks = webhookName
	c.mu.Unlock()

	// 4. The webhooks, for the enabled frameworks and Kueue's own kinds.
	mutating, validating, err := released.render(frameworks, webhookName, "https://127.0.0.1:"+strconv.Itoa(ports[0]), c.pki.caPEM)
	if err != nil {
		return err
	}
	if _, err := c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, mutating, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("registering Kueue's mutating webhooks: %w", err)
	}
	if _, err := c.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, validating, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("registering Kueue's validating webhooks: %w", err)
	}

	// 5. The API server reaches them: a dry-run ResourceFlavor passes both,
	// and comes back with the finalizer the mutating one adds.
	if err := c.checkKueueWebhooks(ctx, proc); err != nil {
		return err
	}
	logger.V(2).Info("Kueue ready", "frameworks", frameworks, "duration", time.Since(began).Round(time.Millisecond))
	return nil
}

// kueueConfiguration renders the manager's Configuration (config.kueue.x-k8s.io/v1beta2).
func kueueConfiguration(opts KueueOptions, frameworks []string, webhookPort, healthPort int, certDir string) ([]byte, error) {
	cfg := map[string]any{
		"apiVersion":                 "config.kueue.x-k8s.io/v1beta2",
		"kind":                       "Configuration",
		"namespace":                  KueueNamespace,
		"manageJobsWithoutQueueName": opts.ManageJobsWithoutQueueName,
		"leaderElection":             map[string]any{"leaderElect": false},
		// The harness signs the webhook certificate: Kueue's own management
		// would want a Secret and a Service's DNS name.
		"internalCertManagement": map[string]any{"enable": false},
		"webhook":                map[string]any{"host": "127.0.0.1", "port": webhookPort, "certDir": certDir},
		"health":                 map[string]any{"healthProbeBindAddress": "127.0.0.1:" + strconv.Itoa(healthPort)},
		// "0" turns the metrics server off (its default is :8443, all interfaces).
		"metrics": map[string]any{"bindAddress": "0"},
		// On by default, it starts an extended API server of its own on :8082.
		"featureGates": map[string]any{"VisibilityOnDemand": false},
		"integrations": map[string]any{"frameworks": frameworks},
	}
	data, err := yaml.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("rendering Kueue's configuration: %w", err)
	}
	return data, nil
}

// checkKueueWebhooks dry-run creates a ResourceFlavor until the API server
// admits it through Kueue's webhooks (bounded by kueueWebhookCheckTimeout):
// its webhook configurations take a moment to reach the API server's
// admission chain.
func (c *Cluster) checkKueueWebhooks(ctx context.Context, proc *process) error {
	rf := ResourceFlavorObject("gpufrac-testbed-webhook-check", nil)
	var last error
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, kueueWebhookCheckTimeout, true, func(ctx context.Context) (bool, error) {
		if proc.exited() {
			return false, fmt.Errorf("kueue exited: %v\n--- last lines of %s ---\n%s", proc.err, proc.LogPath, proc.logTail(20))
		}
		got, err := c.Dynamic.Resource(ResourceFlavorResource()).Create(ctx, rf, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		switch {
		case err != nil:
			last = err
		case !slices.Contains(got.GetFinalizers(), kueueResourceInUseFinalizer):
			// Admitted without the mutating webhook: its configuration is not in force yet.
			last = fmt.Errorf("the dry-run ResourceFlavor came back without the finalizer %s", kueueResourceInUseFinalizer)
		default:
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("checking Kueue's webhooks through the API server: %w (last: %v)", err, last)
	}
	return nil
}

// unregisterKueueWebhooks removes Kueue's webhook configurations, so that
// nothing the API server admits waits on a manager that is stopping (every
// one of them fails closed). Best effort: the API server may be gone already.
func (c *Cluster) unregisterKueueWebhooks() {
	c.mu.Lock()
	name := c.kueueWebhooks
	c.mu.Unlock()
	if name == "" || c.Client == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	api := c.Client.AdmissionregistrationV1()
	err := errors.Join(
		client404(api.MutatingWebhookConfigurations().Delete(ctx, name, metav1.DeleteOptions{})),
		client404(api.ValidatingWebhookConfigurations().Delete(ctx, name, metav1.DeleteOptions{})),
	)
	if err != nil {
		c.logger.V(2).Info("Could not remove Kueue's webhook configurations", "name", name, "err", err)
	}
}

// kueueWebhooks are Kueue's webhook configurations as its release ships them
// (config/components/webhook/manifests.yaml): every webhook of every
// integration, each calling the webhook Service.
type kueueWebhooks struct {
	mutating   admissionregistrationv1.MutatingWebhookConfiguration
	validating admissionregistrationv1.ValidatingWebhookConfiguration
}

// readKueueWebhooks reads the release's webhook configurations.
func readKueueWebhooks(path string) (*kueueWebhooks, error) {
	objs, err := ReadObjects(path)
	if err != nil {
		return nil, fmt.Errorf("reading Kueue's webhooks (run make tools): %w", err)
	}
	w := &kueueWebhooks{}
	var seen []string
	for _, obj := range objs {
		var into any
		switch obj.GetKind() {
		case "MutatingWebhookConfiguration":
			into = &w.mutating
		case "ValidatingWebhookConfiguration":
			into = &w.validating
		default:
			continue
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, into); err != nil {
			return nil, fmt.Errorf("decoding %s of %s: %w", obj.GetKind(), path, err)
		}
		seen = append(seen, obj.GetKind())
	}
	if len(w.mutating.Webhooks) == 0 || len(w.validating.Webhooks) == 0 {
		return nil, fmt.Errorf("%s: want a MutatingWebhookConfiguration and a ValidatingWebhookConfiguration with webhooks, got %v", path, seen)
	}
	return w, nil
}

// kueueNamespacedFrameworks are the integrations whose webhooks Kueue's
// release restricts to namespaces other than kube-system and its own
// (config/components/webhook/kustomization.yaml).
var kueueNamespacedFrameworks = []string{"pod", "deployment", "statefulset"}

// kueuePodUsers are the integrations that enable the pod integration
// implicitly (Kueue manages their pods through it).
var kueuePodUsers = []string{"deployment", "statefulset", "leaderworkerset.x-k8s.io/leaderworkerset"}

// kueueWebhookFramework is the integration (its name in
// integrations.frameworks) a webhook rule's group and resource belong to,
// "" for Kueue's own kinds: batch jobs -> batch/job, pods -> pod, apps
// deployments -> deployment, ray.io rayjobs -> ray.io/rayjob.
func kueueWebhookFramework(group, resource string) string {
	resource, _, _ = strings.Cut(resource, "/")
	kind := strings.TrimSuffix(resource, "s")
	switch group {
	case "kueue.x-k8s.io":
		return ""
	case "", "apps":
		return kind
	}
	return group + "/" + kind
}

// render returns the configurations to register, both named name: the
// webhooks of Kueue's own kinds and of the enabled frameworks (those the
// pod integration needs included), each calling baseURL plus its path and
// trusting caBundle. The others are left out: the manager serves no webhook
// for a framework it does not run (or a no-op one), and as every webhook
// fails closed they would only stand between the API server and pods or
// deployments. It fails for a framework no webhook belongs to.
func (w *kueueWebhooks) render(frameworks []string, name, baseURL string, caBundle []byte) (*admissionregistrationv1.MutatingWebhookConfiguration, *admissionregistrationv1.ValidatingWebhookConfiguration, error) {
	enabled := map[string]bool{}
	for _, f := range frameworks {
		enabled[f] = true
		if slices.Contains(kueuePodUsers, f) {
			enabled["pod"] = true
		}
	}
	served := map[string]bool{}
	// keep says whether a webhook is to be registered and points it at the manager.
	keep := func(hookName string, rules []admissionregistrationv1.RuleWithOperations, cc *admissionregistrationv1.WebhookClientConfig, nsSel **metav1.LabelSelector) (bool, error) {
		framework := ""
		for _, r := range rules {
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					framework = kueueWebhookFramework(g, res)
				}
			}
		}
		if framework != "" && !enabled[framework] {
			return false, nil
		}
		served[framework] = true
		if cc.Service == nil || cc.Service.Path == nil {
			return false, fmt.Errorf("Kueue's webhook %s names no Service path", hookName)
		}
		*cc = admissionregistrationv1.WebhookClientConfig{URL: ptr.To(baseURL + *cc.Service.Path), CABundle: caBundle}
		if slices.Contains(kueueNamespacedFrameworks, framework) && *nsSel == nil {
			*nsSel = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: corev1.LabelMetadataName, Operator: metav1.LabelSelectorOpNotIn, Values: []string{metav1.NamespaceSystem, KueueNamespace},
			}}}
		}
		return true, nil
	}
	mutating := w.mutating.DeepCopy()
	mutating.ObjectMeta = metav1.ObjectMeta{Name: name}
	mutating.Webhooks = nil
	for _, h := range w.mutating.Webhooks {
		h := *h.DeepCopy()
		ok, err := keep(h.Name, h.Rules, &h.ClientConfig, &h.NamespaceSelector)
		if err != nil {
			return nil, nil, err
		}
		if ok {
			mutating.Webhooks = append(mutating.Webhooks, h)
		}
	}
	validating := w.validating.DeepCopy()
	validating.ObjectMeta = metav1.ObjectMeta{Name: name}
	validating.Webhooks = nil
	for _, h := range w.validating.Webhooks {
		h := *h.DeepCopy()
		ok, err := keep(h.Name, h.Rules, &h.ClientConfig, &h.NamespaceSelector)
		if err != nil {
			return nil, nil, err
		}
		if ok {
			validating.Webhooks = append(validating.Webhooks, h)
		}
	}
	var unknown []string
	for f := range enabled {
		if !served[f] {
			unknown = append(unknown, f)
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		return nil, nil, fmt.Errorf("Kueue frameworks %v: no webhook of Kueue's release belongs to them (a typo?)", unknown)
	}
	return mutating, validating, nil
}

// ensureKueueMetricsCert makes sure dir holds a certificate and key Kueue can load.
//
// With internalCertManagement off, Kueue v0.17's main (cmd/kueue/main.go)
// always creates a certificate watcher for its metrics server on the
// hard-coded files /etc/kueue/metrics/certs/tls.crt and tls.key (mounted
// from a cert-manager Secret in its Helm chart), and exits when they cannot
// be read, even with the metrics server off, as here. No flag or
// Configuration field moves it. So the harness writes a self-signed loopback
// certificate there when the files are absent. They are shared by every
// cluster on the machine and never overwritten: created under an exclusive
// lock on a file beside them, each through a temporary file renamed into
// place (the key 0600), so parallel tests and test binaries each find both or
// neither. Files already there are used as they are when they load as a
// pair. Writing under /etc needs root; without it the error says so.
func ensureKueueMetricsCert(dir string) error {
	crt, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if _, err := tls.LoadX509KeyPair(crt, key); err == nil {
		return nil
	}
	why := func(err error) error {
		return fmt.Errorf("Kueue v0.17 with the harness's certificates (internalCertManagement off) exits unless it can read "+
			"a metrics certificate from the hard-coded %s/tls.crt and tls.key; the harness writes a self-signed one there, "+
			"which needs write access to %s (run as root, or create the two files once): %w", dir, dir, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return why(err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".gpufrac-testbed.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return why(err)
	}
	defer lock.Close() // releases the lock
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return why(fmt.Errorf("locking %s: %w", lock.Name(), err))
	}
	_, crtErr := os.Stat(crt)
	_, keyErr := os.Stat(key)
	switch {
	case crtErr == nil && keyErr == nil:
		// Written meanwhile, or there from the start but not a pair.
		if _, err := tls.LoadX509KeyPair(crt, key); err != nil {
			return fmt.Errorf("Kueue's metrics certificate in %s does not load (the harness never overwrites it; remove both files to have it written again): %w", dir, err)
		}
		return nil
	case !errors.Is(crtErr, fs.ErrNotExist) || !errors.Is(keyErr, fs.ErrNotExist):
		return fmt.Errorf("Kueue's metrics certificate in %s: only one of tls.crt and tls.key is there (the harness never overwrites either; remove it): %v, %v", dir, crtErr, keyErr)
	}
	certPEM, keyPEM, err := selfSignedLoopbackCert("kueue-metrics (gpufrac test bed)", 10*365*24*time.Hour)
	if err != nil {
		return err
	}
	// The key first: a reader that does not take the lock sees a certificate only with its key.
	if err := writeFileAtomic(key, keyPEM, 0o600); err != nil {
		return why(err)
	}
	if err := writeFileAtomic(crt, certPEM, 0o644); err != nil {
		return why(err)
	}
	return nil
}

// writeFileAtomic writes data to a temporary file in path's directory and
// renames it to path.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	err = errors.Join(err, f.Chmod(mode), f.Sync(), f.Close())
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		return errors.Join(fmt.Errorf("writing %s: %w", path, err), os.Remove(tmp))
	}
	return nil
}

// selfSignedLoopbackCert returns a self-signed serving certificate for
// 127.0.0.1 and localhost, valid for validity, and its key, in PEM.
func selfSignedLoopbackCert(cn string, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	return signCert(loopbackServing(cn, time.Now().Add(validity)), nil, nil)
}
