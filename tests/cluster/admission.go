package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/informers"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/gpufrac/gpufrac/tests/kubeletsim"
)

const (
	// ReasonUnexpectedAdmissionError is the pod status reason (and event reason) the
	// kubelet writes when device allocation fails at admission; the pod ends Failed.
	ReasonUnexpectedAdmissionError = "UnexpectedAdmissionError"

	// admissionWorkers admit pods in parallel; each node's simulator still admits
	// one container at a time, as the kubelet does.
	admissionWorkers = 2
	// agentWaitRequeue is how soon a pod waiting for its node's agent is looked at again.
	agentWaitRequeue = 250 * time.Millisecond
	// fieldManager names the harness in managed fields.
	fieldManager = "gpufrac-test-kubelet"
)

// errAgentNotReady means the pod's node has a node agent that has not registered
// its resources yet: like a kubelet that has not started, the pod just waits.
var errAgentNotReady = errors.New("node agent not ready")

// errClaimsNotPrepared means the pod's resource claims could not be prepared
// yet (not allocated, not reserved for it, the driver refused or is away): the
// kubelet keeps such a pod pending with a FailedPrepareDynamicResources event
// and tries again, it does not fail it.
var errClaimsNotPrepared = errors.New("resource claims not prepared")

// ReasonFailedPrepareDynamicResources is the kubelet's event reason when a
// pod's resource claims cannot be prepared.
const ReasonFailedPrepareDynamicResources = "FailedPrepareDynamicResources"

// rejection is an admission failure that ends the pod Failed, as the kubelet's
// device manager does; message is the kubelet's text.
type rejection struct{ message string }

func (r *rejection) Error() string { return r.message }

// admittedPod is a pod the admission controller allocated devices to.
type admittedPod struct {
	uid  types.UID
	node string
}

// admission plays the kubelet's device admission for every pod bound to a node:
// for pods on a node with a node agent it allocates each container's device
// resources through that node's kubelet simulator (GetPreferredAllocation,
// Allocate), for other pods it allocates nothing; then it marks the pod
// AnnotationAdmitted, which lets kwok run it. A failed allocation ends the pod
// Failed with reason UnexpectedAdmissionError and the plugin's message. Devices
// are released when the pod ends or goes.
type admission struct {
	c       *Cluster
	factory informers.SharedInformerFactory
	pods    corelisters.PodLister
	synced  cache.InformerSynced
	queue   workqueue.TypedRateLimitingInterface[types.NamespacedName]

	// mu guards admitted and prepareErrors.
	mu sync.Mutex
	// admitted: pod -> the UID and node it holds devices under.
	admitted map[types.NamespacedName]admittedPod
	// prepareErrors: pod UID -> the last claim preparation error reported in
	// an event (one event per distinct message).
	prepareErrors map[types.UID]string
}

// newAdmission watches the pods bound to any node.
func newAdmission(c *Cluster) *admission {
	factory := informers.NewSharedInformerFactoryWithOptions(c.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermNotEqualSelector("spec.nodeName", "").String()
		}))
	podInformer := factory.Core().V1().Pods()
	return &admission{
		c:       c,
		factory: factory,
		pods:    podInformer.Lister(),
		synced:  podInformer.Informer().HasSynced,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.DefaultTypedControllerRateLimiter[types.NamespacedName](),
			workqueue.TypedRateLimitingQueueConfig[types.NamespacedName]{Name: "admission"}),
		admitted:      map[types.NamespacedName]admittedPod{},
		prepareErrors: map[types.UID]string{},
	}
}

// start registers the handlers, starts the informer and the workers; they run
// until ctx ends, tracked by wg. It returns once the informer has synced.
func (a *admission) start(ctx context.Context, startCtx context.Context, wg *sync.WaitGroup) error {
	enqueue := func(obj any) {
		if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		if pod, ok := obj.(*corev1.Pod); ok {
			a.queue.Add(types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name})
		}
	}
	if _, err := a.factory.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: enqueue,
	}); err != nil {
		return fmt.Errorf("adding pod event handler: %w", err)
	}
	a.factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(startCtx.Done(), a.synced) {
		return fmt.Errorf("syncing the pod informer: %w", startCtx.Err())
	}
	wg.Go(func() {
		<-ctx.Done()
		a.queue.ShutDown()
	})
	for range admissionWorkers {
		wg.Go(func() {
			for a.processNext(ctx) {
			}
		})
	}
	return nil
}

// stop shuts the informer down; the workers end with the ctx given to start.
func (a *admission) stop() {
	a.queue.ShutDown()
	a.factory.Shutdown()
}

// processNext handles one key; it returns false once the queue is shut down.
func (a *admission) processNext(ctx context.Context) bool {
	key, quit := a.queue.Get()
	if quit {
		return false
	}
	defer a.queue.Done(key)
	err := a.sync(ctx, key)
	switch {
	case err == nil:
		a.queue.Forget(key)
	case errors.Is(err, errAgentNotReady), errors.Is(err, errClaimsNotPrepared):
		a.queue.AddAfter(key, agentWaitRequeue)
	case ctx.Err() != nil:
	default:
		utilruntime.HandleErrorWithContext(ctx, err, "Admitting pod failed; retrying", "pod", key)
		a.queue.AddRateLimited(key)
	}
	return true
}

// sync brings one pod in line: release the devices of a pod that ended or went,
// admit a bound pod not admitted yet.
func (a *admission) sync(ctx context.Context, key types.NamespacedName) error {
	pod, err := a.pods.Pods(key.Namespace).Get(key.Name)
	if apierrors.IsNotFound(err) {
		a.release(ctx, key, "")
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading pod %s from the cache: %w", key, err)
	}
	// A pod recreated under the same name is another pod.
	a.release(ctx, key, pod.UID)
	switch {
	case pod.Spec.NodeName == "":
		return nil
	case pod.DeletionTimestamp != nil, pod.Status.Phase == corev1.PodSucceeded, pod.Status.Phase == corev1.PodFailed:
		a.release(ctx, key, "")
		return nil
	case pod.Annotations[AnnotationAdmitted] == "true":
		return nil
	}

	logger := klog.FromContext(ctx).WithValues("pod", klog.KObj(pod), "node", pod.Spec.NodeName)
	err = a.admit(ctx, pod)
	var rej *rejection
	if errors.As(err, &rej) {
		logger.V(2).Info("Pod rejected at admission", "message", rej.message)
		return a.reject(ctx, pod, rej.message)
	}
	if err != nil {
		return err
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"annotations": map[string]string{AnnotationAdmitted: "true"},
	}})
	if err != nil {
		return fmt.Errorf("encoding admission patch: %w", err)
	}
	if _, err := a.c.Client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch,
		metav1.PatchOptions{FieldManager: fieldManager}); err != nil {
		if apierrors.IsNotFound(err) {
			a.release(ctx, key, "")
			return nil
		}
		return fmt.Errorf("marking pod %s admitted: %w", key, err)
	}
	logger.V(4).Info("Pod admitted")
	return nil
}

// admit prepares the pod's resource claims and allocates its device resources on
// its node's kubelet simulator.
func (a *admission) admit(ctx context.Context, pod *corev1.Pod) error {
	requests := deviceRequests(pod)
	claims := kubeletsim.HasClaims(pod)
	if len(requests) == 0 && !claims {
		return nil
	}
	agent, err := a.c.agentForAdmission(pod.Spec.NodeName)
	if err != nil {
		return err
	}
	if agent == nil {
		return nil // no device manager on this node: nothing to allocate
	}
	if agent.ctl.restarting() {
		return errAgentNotReady
	}
	key := types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}
	ref := kubeletsim.PodRef{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}
	a.mu.Lock()
	a.admitted[key] = admittedPod{uid: pod.UID, node: pod.Spec.NodeName}
	a.mu.Unlock()
	if claims {
		// As the kubelet: claims first (before any container), and a failure
		// leaves the pod pending, not failed.
		if err := agent.Kubelet.PrepareClaims(ctx, pod); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("admitting pod %s: %w", key, ctx.Err())
			}
			a.prepareFailed(ctx, pod, err)
			return fmt.Errorf("%w: pod %s: %w", errClaimsNotPrepared, key, err)
		}
	}
	for _, r := range requests {
		if _, ok := agent.Kubelet.Resource(r.resource); !ok {
			// Not a device-plugin resource on this node: the kubelet's device manager
			// leaves it to the scheduler's accounting.
			continue
		}
		admit := agent.Kubelet.Allocate
		if r.init {
			// Its devices go on to the pod's later containers, as the kubelet's.
			admit = agent.Kubelet.AllocateInit
		}
		if _, err := admit(ctx, ref, r.container, r.resource, r.count); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("admitting pod %s: %w", key, ctx.Err())
			}
			a.release(ctx, key, "")
			if agent.ctl.restarting() {
				// Interrupted by a restart the test made (RestartNodeAgent,
				// RestartKubelet): admit it again once the plugin is back.
				return fmt.Errorf("%w: admitting pod %s during a restart: %w", errAgentNotReady, key, err)
			}
			return &rejection{message: allocateFailedMessage(err)}
		}
	}
	return nil
}

// allocateFailedMessage renders an allocation error the way the kubelet's
// admission does ("Allocate failed due to ..., which is unexpected"), where the
// cause is the plugin's gRPC error or the device manager's own complaint.
func allocateFailedMessage(err error) string {
	cause := err.Error()
	var pe *kubeletsim.PluginError
	if errors.As(err, &pe) {
		cause = pe.KubeletCause()
	} else if inner := errors.Unwrap(err); inner != nil {
		// kubeletsim.Allocate prefixes the pod and container; the kubelet does not.
		cause = inner.Error()
	}
	return fmt.Sprintf("Allocate failed due to %s, which is unexpected", cause)
}

// prepareFailed records a Warning event FailedPrepareDynamicResources on the
// pod, once per distinct error, as the kubelet does while it retries.
func (a *admission) prepareFailed(ctx context.Context, pod *corev1.Pod, err error) {
	msg := err.Error()
	a.mu.Lock()
	same := a.prepareErrors[pod.UID] == msg
	a.prepareErrors[pod.UID] = msg
	a.mu.Unlock()
	klog.FromContext(ctx).V(2).Info("Preparing the pod's claims failed; retrying", "pod", klog.KObj(pod), "err", msg)
	if same {
		return
	}
	now := metav1.Now()
	event := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", pod.Name, now.UnixNano()), Namespace: pod.Namespace},
		InvolvedObject: corev1.ObjectReference{
			Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID,
			ResourceVersion: pod.ResourceVersion,
		},
		Reason:         ReasonFailedPrepareDynamicResources,
		Message:        "Failed to prepare dynamic resources: " + msg,
		Type:           corev1.EventTypeWarning,
		Source:         corev1.EventSource{Component: "kubelet", Host: pod.Spec.NodeName},
		FirstTimestamp: now,
		LastTimestamp:  now,
		Count:          1,
	}
	if _, err := a.c.Client.CoreV1().Events(pod.Namespace).Create(ctx, event, metav1.CreateOptions{}); err != nil {
		klog.FromContext(ctx).Error(err, "Recording the claim preparation failure failed", "pod", klog.KObj(pod))
	}
}

// reject ends the pod Failed as the kubelet's rejectPod does: a Warning event and
// the status phase Failed with the reason and "Pod was rejected: <message>".
func (a *admission) reject(ctx context.Context, pod *corev1.Pod, message string) error {
	now := metav1.Now()
	event := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{
			Name:      fmt.Sprintf("%s.%x", pod.Name, now.UnixNano()),
			Namespace: pod.Namespace,
		},
		InvolvedObject: corev1.ObjectReference{
			Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID,
			ResourceVersion: pod.ResourceVersion,
		},
		Reason:         ReasonUnexpectedAdmissionError,
		Message:        message,
		Type:           corev1.EventTypeWarning,
		Source:         corev1.EventSource{Component: "kubelet", Host: pod.Spec.NodeName},
		FirstTimestamp: now,
		LastTimestamp:  now,
		Count:          1,
	}
	if _, err := a.c.Client.CoreV1().Events(pod.Namespace).Create(ctx, event, metav1.CreateOptions{}); err != nil {
		klog.FromContext(ctx).Error(err, "Recording the admission failure event failed", "pod", klog.KObj(pod))
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{
		"phase":   corev1.PodFailed,
		"reason":  ReasonUnexpectedAdmissionError,
		"message": "Pod was rejected: " + message,
	}})
	if err != nil {
		return fmt.Errorf("encoding rejection patch: %w", err)
	}
	if _, err := a.c.Client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch,
		metav1.PatchOptions{FieldManager: fieldManager}, "status"); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("failing pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// release frees the devices the pod holds on its node unless it is still the pod
// with UID keep (pass "" to release unconditionally).
func (a *admission) release(ctx context.Context, key types.NamespacedName, keep types.UID) {
	a.mu.Lock()
	rec, ok := a.admitted[key]
	if !ok || (keep != "" && rec.uid == keep) {
		a.mu.Unlock()
		return
	}
	delete(a.admitted, key)
	delete(a.prepareErrors, rec.uid)
	a.mu.Unlock()
	if agent := a.c.NodeAgent(rec.node); agent != nil {
		n := agent.Kubelet.Release(rec.uid)
		klog.FromContext(ctx).V(4).Info("Released pod's devices", "pod", key, "node", rec.node, "allocations", n)
		if err := agent.Kubelet.UnprepareClaims(ctx, rec.uid); err != nil {
			klog.FromContext(ctx).Error(err, "Unpreparing the pod's claims failed", "pod", key, "node", rec.node)
		}
	}
}

// deviceRequest is one container's request for one extended resource.
type deviceRequest struct {
	container string
	resource  string
	count     int
	// init marks a regular (not restartable) init container.
	init bool
}

// deviceRequests lists the extended resources each container asks for (limits,
// else requests), init containers first, as the kubelet's device manager sees
// them. Native resources (cpu, memory, hugepages, kubernetes.io/...) are left out.
func deviceRequests(pod *corev1.Pod) []deviceRequest {
	var out []deviceRequest
	add := func(containers []corev1.Container, init bool) {
		for _, c := range containers {
			regularInit := init && (c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways)
			counts := map[corev1.ResourceName]int64{}
			// Limits win: for extended resources requests must equal them anyway.
			for _, list := range []corev1.ResourceList{c.Resources.Requests, c.Resources.Limits} {
				for name, q := range list {
					if isExtendedResource(name) {
						counts[name] = q.Value()
					}
				}
			}
			for _, name := range slices.Sorted(maps.Keys(counts)) {
				if n := counts[name]; n > 0 {
					out = append(out, deviceRequest{container: c.Name, resource: string(name), count: int(n), init: regularInit})
				}
			}
		}
	}
	add(pod.Spec.InitContainers, true)
	add(pod.Spec.Containers, false)
	return out
}

// isExtendedResource reports whether name is an extended resource: fully
// qualified, outside the kubernetes.io domain, not a quota "requests." name.
func isExtendedResource(name corev1.ResourceName) bool {
	s := string(name)
	return strings.Contains(s, "/") && !strings.Contains(s, "kubernetes.io/") && !strings.HasPrefix(s, "requests.")
}
