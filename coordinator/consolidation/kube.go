package consolidation

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/gpufrac/gpufrac/api"
)

// APIWriter is Kube on a clientset.
type APIWriter struct {
	Client kubernetes.Interface
}

var _ Kube = APIWriter{}

// Evict evicts the pod (its UID as precondition, so a re-created pod of the
// same name is never hit).
func (w APIWriter) Evict(ctx context.Context, pod *corev1.Pod) error {
	ev := &policyv1.Eviction{
		ObjectMeta:    metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name},
		DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pod.UID}},
	}
	if err := w.Client.PolicyV1().Evictions(pod.Namespace).Evict(ctx, ev); err != nil {
		return fmt.Errorf("evicting %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// DeleteReservation deletes a reservation pod of gpufrac-system, at once.
func (w APIWriter) DeleteReservation(ctx context.Context, pod *corev1.Pod) error {
	if pod.Namespace != api.ReservationNamespace {
		return fmt.Errorf("deleting reservation %s/%s: not in %s", pod.Namespace, pod.Name, api.ReservationNamespace)
	}
	if err := w.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pod.UID}}); err != nil {
		return fmt.Errorf("deleting reservation %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// Node reads the node from the API server (a consistent read, not a cache).
func (w APIWriter) Node(ctx context.Context, name string) (*corev1.Node, error) {
	n, err := w.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading node %s: %w", name, err)
	}
	return n, nil
}

// DeleteNode deletes a drained node with its UID and, when set, its
// resourceVersion as preconditions: a node of the same name made since, or
// this node changed since it was read (its drain taint removed or moved), is
// never hit; the API server answers Conflict.
func (w APIWriter) DeleteNode(ctx context.Context, n *corev1.Node) error {
	pre := &metav1.Preconditions{UID: &n.UID}
	if n.ResourceVersion != "" {
		pre.ResourceVersion = &n.ResourceVersion
	}
	if err := w.Client.CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{Preconditions: pre}); err != nil {
		return fmt.Errorf("deleting node %s: %w", n.Name, err)
	}
	return nil
}

// PodsOnNode lists the pods bound to node from the API server (a
// consistent read, not a cache).
func (w APIWriter) PodsOnNode(ctx context.Context, node string) ([]*corev1.Pod, error) {
	l, err := w.Client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()})
	if err != nil {
		return nil, fmt.Errorf("listing the pods of node %s: %w", node, err)
	}
	out := make([]*corev1.Pod, len(l.Items))
	for i := range l.Items {
		out[i] = &l.Items[i]
	}
	return out, nil
}

// Taint sets the gpufrac.io/draining NoSchedule taint with the deadline.
func (w APIWriter) Taint(ctx context.Context, node string, deadline int64) error {
	return w.updateTaints(ctx, node, func(ts []corev1.Taint) []corev1.Taint {
		ts = slices.DeleteFunc(ts, func(t corev1.Taint) bool { return t.Key == api.TaintDraining })
		return append(ts, corev1.Taint{Key: api.TaintDraining, Value: strconv.FormatInt(deadline, 10), Effect: corev1.TaintEffectNoSchedule})
	})
}

// Untaint removes the gpufrac.io/draining taint.
func (w APIWriter) Untaint(ctx context.Context, node string) error {
	return w.updateTaints(ctx, node, func(ts []corev1.Taint) []corev1.Taint {
		return slices.DeleteFunc(ts, func(t corev1.Taint) bool { return t.Key == api.TaintDraining })
	})
}

// updateTaints rewrites the node's taints with change: a JSON merge patch
// of the whole list with the node's resourceVersion in it (the API server
// refuses it with Conflict when the node changed since it was read), retried
// on conflict with client-go's backoff. A patch, so the coordinator needs
// only the patch verb on nodes; the whole list under a resourceVersion,
// because the taint list has no merge key and other controllers (Karpenter,
// the node lifecycle controller) write it too.
func (w APIWriter) updateTaints(ctx context.Context, node string, change func([]corev1.Taint) []corev1.Taint) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := w.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		taints := change(slices.Clone(n.Spec.Taints))
		if taints == nil {
			taints = []corev1.Taint{}
		}
		patch, err := json.Marshal(taintPatch{
			Metadata: taintPatchMeta{ResourceVersion: n.ResourceVersion},
			Spec:     taintPatchSpec{Taints: taints},
		})
		if err != nil {
			return err
		}
		_, err = w.Client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "gpufrac-coordinator"})
		return err
	})
	if err != nil {
		return fmt.Errorf("updating the taints of node %s: %w", node, err)
	}
	return nil
}

// taintPatch is the merge patch updateTaints sends.
type taintPatch struct {
	Metadata taintPatchMeta `json:"metadata"`
	Spec     taintPatchSpec `json:"spec"`
}

type taintPatchMeta struct {
	ResourceVersion string `json:"resourceVersion"`
}

type taintPatchSpec struct {
	Taints []corev1.Taint `json:"taints"`
}
