package scheduler

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1alpha2 "k8s.io/api/scheduling/v1alpha2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/tests/builders"
)

// PodGroupScheduled=True is written when the gang is sent to
// binding, before any binding succeeded; when every binding fails the group
// keeps saying Scheduled (the writer never turns True back) while its pods
// wait with BindingFailed.
func TestPodGroupScheduledBeforeBindingsSucceed(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	pg := builders.MakePodGroup("train", "default").Gang(2).Obj()
	pods := podGroupMembers("train", 2)
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 8)}, []*v1alpha1.Queue{queueOf("q", "16")}, pods...)
	c.s.clock = clk
	c.s.deps.PodGroups = builders.PodGroupLookup(pg)
	cs := fake.NewClientset(pg.DeepCopy())
	c.s.deps.PodGroupStatus = ClientPodGroupStatus{Client: cs}
	refused := apierrors.NewForbidden(schema.GroupResource{Resource: "pods/binding"}, "x", errors.New("node n1 is gone"))
	c.b.BindErr = func(*corev1.Pod, string) error { return refused }
	for range 5 {
		c.cycle()
		clk.Step(2 * time.Second)
	}
	for _, p := range pods {
		if c.boundTo(p.Name) != "" {
			t.Fatalf("%s bound", p.Name)
		}
	}
	got, _ := cs.SchedulingV1alpha2().PodGroups("default").Get(context.Background(), "train", metav1.GetOptions{})
	cond := apimeta.FindStatusCondition(got.Status.Conditions, schedulingv1alpha2.PodGroupScheduled)
	if cond != nil && cond.Status == metav1.ConditionTrue {
		t.Errorf("no member bound (pods say %s), but PodGroup says %s %s %q", c.reason(pods[0].Name), cond.Status, cond.Reason, cond.Message)
	}
}

// failOnce fails its first write.
type failOnce struct {
	recordingPodGroups
	failed bool
}

func (f *failOnce) SetPodGroupScheduled(ctx context.Context, ns, name string, cond metav1.Condition) error {
	if !f.failed {
		f.failed = true
		return apierrors.NewConflict(schedulingv1alpha2.Resource("podgroups"), name, errors.New("changed"))
	}
	return f.recordingPodGroups.SetPodGroupScheduled(ctx, ns, name, cond)
}

// a True condition whose write failed (a conflict, a timeout, a
// leader change) is never written again: the bound gang is no workload of
// the next cycles, so tellPodGroup is never called for it.
func TestFailedScheduledWriteIsNeverRetried(t *testing.T) {
	pg := builders.MakePodGroup("train", "default").Gang(2).Obj()
	pods := podGroupMembers("train", 2)
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 8)}, []*v1alpha1.Queue{queueOf("q", "16")}, pods...)
	c.s.deps.PodGroups = builders.PodGroupLookup(pg)
	w := &failOnce{}
	c.s.deps.PodGroupStatus = w
	for range 5 {
		c.cycle()
	}
	if c.boundTo(pods[0].Name) == "" {
		t.Fatal("not bound")
	}
	if len(w.said()) == 0 {
		t.Errorf("gang bound, its Scheduled write failed once, and 5 cycles later the condition was never written")
	}
}
