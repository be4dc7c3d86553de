package attack

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/coordinator/dra"
	"github.com/gpufrac/gpufrac/tests/cluster"
)

// draNode is the bed's GPU node in mode dra: gpufrac-node serves its GPUs
// as DRA driver gpu.gpufrac.io, and the coordinator writes an
// extended-resource claim for each pod asking GPUs there. Its taint keeps
// the other subtests' pods off it.
const (
	draNode   = "gpu-dra"
	draLabel  = "attack.gpufrac.io/serving"
	draTaint  = draLabel
	draConfig = `version: v1
default:
  mode: fraction
  fraction:
    enforcement: report
    pollInterval: 1s
groups:
  - nodeSelector: {` + draLabel + `: dra}
    mode: dra
`
)

// addDRANode adds draNode and waits until its gpufrac-node published its
// GPUs as devices.
func addDRANode(t *testing.T, c *cluster.Cluster) {
	t.Helper()
	ctx := t.Context()
	if _, err := c.AddNode(ctx, cluster.NodeSpec{
		Name:   draNode,
		Labels: map[string]string{api.LabelGPUNode: "true", api.LabelGPUProduct: cluster.H100Product, draLabel: "dra"},
		Taints: []corev1.Taint{{Key: draTaint, Value: "dra", Effect: corev1.TaintEffectNoSchedule}},
	}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	_, err := c.WaitForNodeAgent(wctx, draNode)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, draNode+" devices published", func(ctx context.Context) (bool, error) {
		slices, err := c.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + draNode})
		if err != nil {
			return false, nil
		}
		devices := 0
		for _, s := range slices.Items {
			devices += len(s.Spec.Devices)
		}
		n, err := c.Client.CoreV1().Nodes().Get(ctx, draNode, metav1.GetOptions{})
		return devices > 0 && err == nil && n.Annotations[api.AnnotationGPUInventory] != "", nil
	})
}

// attackForgedExtendedClaim (issue 25, item 1): the tenant makes a pod
// asking 1 % of a GPU on the node in mode dra, and beside it a claim that
// dresses as the pod's extended-resource claim (the annotation, a
// controller reference to the pod) but asks every device of the node.
// Taken up, the pod held whole GPUs while its queue was charged 0.01. The
// claim must never be allocated, the pod is refused with a reason naming
// it, and once the tenant deletes it the pod is placed with the claim the
// coordinator writes, for its 1 %.
func (b *bed) attackForgedExtendedClaim(t *testing.T) {
	ctx := t.Context()
	// Gated while the claim is made: the coordinator would otherwise place
	// the pod before the claim exists, and the attack would test nothing.
	p := tenantPod("forged-claim").Fraction(1).CPU("100m").Obj()
	p.Spec.NodeSelector = map[string]string{corev1.LabelHostname: draNode}
	p.Spec.Tolerations = []corev1.Toleration{{Key: draTaint, Operator: corev1.TolerationOpExists}}
	p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "attack.gpufrac.io/hold"}}
	pod := create(t, b.tenant, p)
	t.Cleanup(func() {
		_ = b.c.Client.CoreV1().Pods(attackerNS).Delete(context.WithoutCancel(ctx), pod.Name, metav1.DeleteOptions{})
	})

	forged := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name: pod.Name + "-extended-resources-forged", Namespace: attackerNS,
			Annotations: map[string]string{resourceapi.ExtendedResourceClaimAnnotation: "true"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}},
		},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name:    "container-0-request-0",
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: api.DRAClassGPU, AllocationMode: resourceapi.DeviceAllocationModeAll},
		}}}},
	}
	if _, err := b.tenant.ResourceV1().ResourceClaims(attackerNS).Create(ctx, forged, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the tenant creating a claim in its namespace: %v", err)
	}
	// Edit rights cannot write the claim's status (its allocation)...
	forged.Status.Allocation = &resourceapi.AllocationResult{}
	if _, err := b.tenant.ResourceV1().ResourceClaims(attackerNS).UpdateStatus(ctx, forged, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the tenant writing a claim's status: %v, want Forbidden", err)
	}
	// ...nor the pod's extendedResourceClaimStatus.
	patch := []byte(`{"status":{"extendedResourceClaimStatus":{"resourceClaimName":"` + forged.Name + `","requestMappings":[{"containerName":"c","resourceName":"` + api.ResourceFraction + `","requestName":"container-0-request-0"}]}}}`)
	if _, err := b.tenant.CoreV1().Pods(attackerNS).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status"); !apierrors.IsForbidden(err) {
		t.Errorf("the tenant writing the pod's extendedResourceClaimStatus: %v, want Forbidden", err)
	}
	st, err := queueStatus(ctx, b.c, "team-a")
	if err != nil {
		t.Fatal(err)
	}
	before := st.Allocated[v1alpha1.ResourceGPU]
	ungate := []byte(`{"spec":{"schedulingGates":null}}`)
	if _, err := b.tenant.CoreV1().Pods(attackerNS).Patch(ctx, pod.Name, types.StrategicMergePatchType, ungate, metav1.PatchOptions{}); err != nil {
		t.Fatalf("removing the scheduling gate: %v", err)
	}

	// Refused, with a reason that names the claim.
	waitFor(t, 60*time.Second, "the pod refused for the forged claim", func(ctx context.Context) (bool, error) {
		got, err := b.c.Client.CoreV1().Pods(attackerNS).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if got.Spec.NodeName != "" {
			c, err := b.c.Client.ResourceV1().ResourceClaims(attackerNS).Get(ctx, forged.Name, metav1.GetOptions{})
			if err == nil && c.Status.Allocation != nil {
				return false, fmt.Errorf("pod bound to %s holding the forged claim's %d devices", got.Spec.NodeName, len(c.Status.Allocation.Devices.Results))
			}
			return false, errBound(got.Spec.NodeName)
		}
		for _, c := range got.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Reason == api.ReasonInvalidRequest && strings.Contains(c.Message, forged.Name) {
				t.Logf("refused: %s", c.Message)
				return true, nil
			}
		}
		return false, nil
	})
	// A few more cycles: still never allocated.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		c, err := b.c.Client.ResourceV1().ResourceClaims(attackerNS).Get(ctx, forged.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if c.Status.Allocation != nil || len(c.Status.ReservedFor) > 0 {
			t.Fatalf("the forged claim got allocation %+v, reserved for %v", c.Status.Allocation, c.Status.ReservedFor)
		}
		time.Sleep(500 * time.Millisecond)
	}

	// Deleted, the pod is placed with the coordinator's own claim: 1 %.
	if err := b.tenant.ResourceV1().ResourceClaims(attackerNS).Delete(ctx, forged.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want, _ := dra.ExtendedClaim(pod)
	waitFor(t, 60*time.Second, "the pod bound with the coordinator's claim", func(ctx context.Context) (bool, error) {
		got, err := b.c.Client.CoreV1().Pods(attackerNS).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil || got.Spec.NodeName == "" || got.Status.ExtendedResourceClaimStatus == nil {
			return false, nil
		}
		if got.Spec.NodeName != draNode {
			return false, errBound(got.Spec.NodeName)
		}
		c, err := b.c.Client.ResourceV1().ResourceClaims(attackerNS).Get(ctx, got.Status.ExtendedResourceClaimStatus.ResourceClaimName, metav1.GetOptions{})
		if err != nil || c.Status.Allocation == nil {
			return false, nil
		}
		if !apiequality.Semantic.DeepEqual(c.Spec, want.Spec) || len(c.Status.Allocation.Devices.Results) != 1 {
			t.Fatalf("the pod's claim %s asks %+v and holds %+v; want 1 share", c.Name, c.Spec, c.Status.Allocation.Devices.Results)
		}
		return true, nil
	})
	// No other claim of the pod holds a device.
	claims, err := b.c.Client.ResourceV1().ResourceClaims(attackerNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	allocated := 0
	for _, c := range claims.Items {
		if owner := metav1.GetControllerOf(&c); owner != nil && owner.UID == pod.UID && c.Status.Allocation != nil {
			allocated++
		}
	}
	if allocated != 1 {
		t.Errorf("%d claims of the pod allocated, want its one", allocated)
	}
	// And the queue is charged the 1 % the pod holds.
	waitFor(t, 30*time.Second, "team-a charged 0.01 GPU more", func(ctx context.Context) (bool, error) {
		st, err := queueStatus(ctx, b.c, "team-a")
		if err != nil {
			return false, nil
		}
		got := st.Allocated[v1alpha1.ResourceGPU]
		return got.MilliValue()-before.MilliValue() == 10, nil
	})
}

// errBound is a pod bound where the attack must not get it.
type errBound string

func (e errBound) Error() string { return "pod bound to " + string(e) }
