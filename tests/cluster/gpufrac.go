package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/coordinator/restricted"
)

// policyReadyTimeout bounds the wait for the admission policies to be in force.
const policyReadyTimeout = 60 * time.Second

// installGpufrac installs gpufrac's chart (Options.Chart; the admission
// policies unless Options.NoAdmissionPolicies) and waits until every policy
// refuses what it must.
func (c *Cluster) installGpufrac(ctx context.Context) error {
	began := time.Now()
	o := c.opts.Chart
	if len(o.ValuesFiles) == 0 {
		v, err := TestbedValues()
		if err != nil {
			return err
		}
		o.ValuesFiles = []string{v}
	}
	if c.opts.NoAdmissionPolicies {
		o.Set = append(slices.Clone(o.Set), "admissionPolicies.enabled=false")
	}
	if _, err := c.InstallChart(ctx, o); err != nil {
		return fmt.Errorf("installing gpufrac's chart: %w", err)
	}
	if c.opts.NoAdmissionPolicies {
		return nil
	}
	if err := c.waitPoliciesInForce(ctx); err != nil {
		return err
	}
	klog.FromContext(ctx).V(2).Info("gpufrac installed", "admissionPolicies", true, "duration", time.Since(began).Round(time.Millisecond))
	return nil
}

// waitDefaultServiceAccount waits until kube-controller-manager made a
// namespace's default ServiceAccount.
func (c *Cluster) waitDefaultServiceAccount(ctx context.Context, ns string) error {
	if err := wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	}); err != nil {
		return fmt.Errorf("waiting for the default ServiceAccount of %s: %w", ns, err)
	}
	return nil
}

// policyProbe is a request one admission policy must refuse once it is in
// force; run returns the API server's answer.
type policyProbe struct {
	policy string
	run    func(ctx context.Context) error
}

// waitPoliciesInForce waits until every admission policy refuses a request it
// must (dry runs, and one probe Queue that is removed again): the API server
// loads policies and bindings through informers, a moment after they are
// created, and tests must never race them.
func (c *Cluster) waitPoliciesInForce(ctx context.Context) error {
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	probePod := func(name, ns string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "probe", Image: "registry.k8s.io/pause:3.10"}}},
		}
	}
	pods := c.Client.CoreV1().Pods

	// The queue policy takes Queues as parameters: one Queue that lets no
	// namespace in.
	const probeQueue = "gpufrac-harness-probe"
	queue, err := v1alpha1.ToUnstructured(&v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: probeQueue}})
	if err != nil {
		return err
	}
	if _, err := c.Dynamic.Resource(v1alpha1.QueueGVR()).Create(ctx, queue, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating the probe queue: %w", err)
	}
	defer func() {
		_ = c.Dynamic.Resource(v1alpha1.QueueGVR()).Delete(context.WithoutCancel(ctx), probeQueue, metav1.DeleteOptions{})
	}()
	// The node-agent policy holds gpufrac-node's ServiceAccount: a token bound
	// to no pod carries no node name, so any write of it is refused.
	nodeClient, err := c.serviceAccountClient(ctx, api.ComponentNamespace, api.NodeServiceAccount, nil)
	if err != nil {
		return err
	}
	// A policy whose parameter kind (the Queue CRD) the API server has not
	// configured yet refuses everything it matches ("failed to configure
	// binding"), this pod too, for a moment after the CRD is established: a
	// loaded API server took seconds once. Such refusals are retried.
	var probeErr error
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, policyReadyTimeout, true, func(ctx context.Context) (bool, error) {
		_, err := pods(api.ComponentNamespace).Create(ctx, probePod("gpufrac-harness-probe", api.ComponentNamespace), metav1.CreateOptions{})
		if ctx.Err() == nil {
			probeErr = err // not the deadline's own error
		}
		switch {
		case err == nil || apierrors.IsAlreadyExists(err):
			return true, nil
		case strings.Contains(err.Error(), "failed to configure binding") || apierrors.IsInternalError(err) ||
			apierrors.IsServiceUnavailable(err) || apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) || apierrors.IsTooManyRequests(err):
			return false, nil // the API server is not ready for it yet
		default:
			return false, err
		}
	})
	if err != nil {
		return fmt.Errorf("creating the probe pod (last error: %v): %w", probeErr, err)
	}
	defer func() {
		_ = pods(api.ComponentNamespace).Delete(context.WithoutCancel(ctx), "gpufrac-harness-probe", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	}()

	// Each probe breaks one policy only: where several refuse a request, the
	// API server names one of them.
	probes := []policyProbe{
		{"gpufrac-protocol-annotations", func(ctx context.Context) error {
			p := probePod("probe", metav1.NamespaceDefault)
			p.Annotations = map[string]string{api.AnnotationGPU: "GPU-probe"}
			_, err := pods(metav1.NamespaceDefault).Create(ctx, p, dry)
			return err
		}},
		{"gpufrac-scheduling", func(ctx context.Context) error {
			// A fraction for the default scheduler: no other policy applies.
			p := probePod("probe", metav1.NamespaceDefault)
			p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{api.ResourceFraction: resource.MustParse("10")}
			_, err := pods(metav1.NamespaceDefault).Create(ctx, p, dry)
			return err
		}},
		{"gpufrac-queue-namespaces", func(ctx context.Context) error {
			p := probePod("probe", metav1.NamespaceDefault)
			p.Labels = map[string]string{api.LabelQueue: probeQueue}
			p.Spec.SchedulerName = api.SchedulerName
			_, err := pods(metav1.NamespaceDefault).Create(ctx, p, dry)
			return err
		}},
		{"gpufrac-visible-devices", func(ctx context.Context) error {
			p := probePod("probe", metav1.NamespaceDefault)
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: api.EnvVisibleDevices, Value: "all"}}
			_, err := pods(metav1.NamespaceDefault).Create(ctx, p, dry)
			return err
		}},
		{"gpufrac-reservation-namespace", func(ctx context.Context) error {
			// Pod Security "restricted" (enforced there) would refuse it first otherwise.
			p := probePod("probe", api.ReservationNamespace)
			restricted.Apply(&p.Spec)
			_, err := pods(api.ReservationNamespace).Create(ctx, p, dry)
			return err
		}},
		{"gpufrac-node-agent", func(ctx context.Context) error {
			_, err := nodeClient.CoreV1().Pods(api.ComponentNamespace).Patch(ctx, "gpufrac-harness-probe", types.MergePatchType,
				[]byte(`{"metadata":{"annotations":{"`+api.AnnotationAllocatedGPU+`":"GPU-probe"}}}`),
				metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}},
		{"gpufrac-node-resourceslices", func(ctx context.Context) error {
			slice := &resourceapi.ResourceSlice{
				ObjectMeta: metav1.ObjectMeta{Name: "gpufrac-harness-probe"},
				Spec: resourceapi.ResourceSliceSpec{Driver: api.DRADriver, NodeName: ptr.To("probe-node"),
					Pool: resourceapi.ResourcePool{Name: "probe-node", ResourceSliceCount: 1}},
			}
			_, err := nodeClient.ResourceV1().ResourceSlices().Create(ctx, slice, dry)
			return err
		}},
	}
	ctx, cancel := context.WithTimeout(ctx, policyReadyTimeout)
	defer cancel()
	for _, p := range probes {
		// A binding that only warns (audit-first: admission policies'
		// tenantValidationActions [Warn, Audit]) refuses nothing to wait for.
		if b, err := c.Client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(ctx, p.policy, metav1.GetOptions{}); err == nil &&
			!slices.Contains(b.Spec.ValidationActions, admissionregistrationv1.Deny) {
			continue
		}
		var last error
		err := wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			last = p.run(ctx)
			return RefusedBy(last, p.policy), nil
		})
		if err != nil {
			return fmt.Errorf("waiting for admission policy %s to be in force (last answer: %v): %w", p.policy, last, err)
		}
	}
	return nil
}

// RefusedBy reports whether err is the API server refusing a request
// through the named ValidatingAdmissionPolicy.
func RefusedBy(err error, policy string) bool {
	var status apierrors.APIStatus
	if err == nil || !errors.As(err, &status) {
		return false
	}
	return strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+policy+"'")
}

// ServiceAccountConfig returns a client configuration that authenticates as
// a ServiceAccount with a fresh token (the TokenRequest API), bound to the
// pod boundTo when it is not nil: the API server then binds the pod's node
// into the token (user extra authentication.kubernetes.io/node-name).
func (c *Cluster) ServiceAccountConfig(ctx context.Context, namespace, name string, boundTo *corev1.Pod) (*rest.Config, error) {
	token, err := c.serviceAccountToken(ctx, namespace, name, boundTo)
	if err != nil {
		return nil, err
	}
	cfg := rest.CopyConfig(c.RESTConfig)
	cfg.BearerToken = token
	return cfg, nil
}

// ServiceAccountKubeconfig writes a kubeconfig for a ServiceAccount (see
// ServiceAccountConfig) in the cluster's directory and returns its path, so
// a component runs with exactly the permissions a deployment grants it.
func (c *Cluster) ServiceAccountKubeconfig(ctx context.Context, namespace, name string, boundTo *corev1.Pod) (string, error) {
	token, err := c.serviceAccountToken(ctx, namespace, name, boundTo)
	if err != nil {
		return "", err
	}
	id := namespace + "-" + name
	if boundTo != nil {
		id += "-" + boundTo.Name
	}
	if err := c.writeKubeconfig(id, namespace+":"+name, token); err != nil {
		return "", err
	}
	return c.componentKubeconfig(id), nil
}

func (c *Cluster) serviceAccountClient(ctx context.Context, namespace, name string, boundTo *corev1.Pod) (kubernetes.Interface, error) {
	cfg, err := c.ServiceAccountConfig(ctx, namespace, name, boundTo)
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating a client for ServiceAccount %s/%s: %w", namespace, name, err)
	}
	return client, nil
}
