package scheduler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	schedulingv1alpha2 "k8s.io/api/scheduling/v1alpha2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/coordinator/binder"
	"github.com/gpufrac/gpufrac/tests/builders"
)

func podGroupMembers(group string, n int) []*corev1.Pod {
	var pods []*corev1.Pod
	for i := range n {
		name := fmt.Sprintf("%s-%d", group, i)
		pods = append(pods, builders.MakePod(name, "default").Queue("q").GPUs(1).CPU("1").SchedulingGroup(group).UID(name).Obj())
	}
	return pods
}

// TestPodGroupIsAGang: pods in a PodGroup with the gang policy (KEP-4671,
// spec.schedulingGroup) are placed all or nothing.
func TestPodGroupIsAGang(t *testing.T) {
	for _, tc := range []struct {
		name       string
		groups     []*schedulingv1alpha2.PodGroup
		members    int
		gpus       int  // on the one node
		fixedPools bool // no Karpenter: pools cannot grow
		wantBound  int
		reason     string // of the pods left pending
		message    string // in their message
	}{
		{name: "fits whole", groups: []*schedulingv1alpha2.PodGroup{builders.MakePodGroup("train", "default").Gang(4).Obj()}, members: 4, gpus: 8, wantBound: 4},
		{name: "too few members", groups: []*schedulingv1alpha2.PodGroup{builders.MakePodGroup("train", "default").Gang(4).Obj()}, members: 3, gpus: 8,
			reason: api.ReasonGangIncomplete, message: "has 3 of its 4 members"},
		{name: "does not fit whole: none bound (Karpenter asked for it)", groups: []*schedulingv1alpha2.PodGroup{builders.MakePodGroup("train", "default").Gang(8).Obj()}, members: 8, gpus: 4,
			reason: api.ReasonNoCapacity, message: "gang default/podgroup/train (8 pods) does not fit"},
		{name: "larger than any pool can grow", groups: []*schedulingv1alpha2.PodGroup{builders.MakePodGroup("train", "default").Gang(8).Obj()}, members: 8, gpus: 4, fixedPools: true,
			reason: api.ReasonInvalidRequest, message: "needs 8 GPUs but the largest node pool has 4"},
		{name: "its PodGroup not created yet", members: 2, gpus: 8,
			reason: api.ReasonGangIncomplete, message: "waiting for PodGroup default/train"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pods := podGroupMembers("train", tc.members)
			c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", tc.gpus)}, []*v1alpha1.Queue{queueOf("q", "16")}, pods...)
			c.s.deps.PodGroups = builders.PodGroupLookup(tc.groups...)
			told := &recordingPodGroups{}
			c.s.deps.PodGroupStatus = told
			c.s.opts.ElasticPools = !tc.fixedPools
			c.cycle()
			c.cycle() // a condition already written is not written again
			bound := 0
			for _, p := range pods {
				if c.boundTo(p.Name) != "" {
					bound++
					if g, ok := c.b.Annotations[p.Name][api.AnnotationAdmittedGang]; !ok || g != "podgroup/train" {
						t.Errorf("%s bound with %s %q (set: %v), want podgroup/train", p.Name, api.AnnotationAdmittedGang, g, ok)
					}
					continue
				}
				if r, m := c.reason(p.Name), c.b.Messages[p.Name]; r != tc.reason || !strings.Contains(m, tc.message) {
					t.Errorf("%s pending %s %q, want %s with %q", p.Name, r, m, tc.reason, tc.message)
				}
			}
			if bound != tc.wantBound {
				t.Errorf("%d of %d members bound, want %d", bound, len(pods), tc.wantBound)
			}
			want := []string{"default/train Unschedulable " + tc.reason}
			switch {
			case tc.wantBound > 0:
				want = []string{"default/train Scheduled"}
			case tc.reason == api.ReasonGangIncomplete || tc.reason == api.ReasonInvalidRequest:
				want = nil // not complete yet, or never admitted: no condition
			}
			if diff := cmp.Diff(want, told.said()); diff != "" {
				t.Errorf("PodGroupScheduled conditions written (-want +got):\n%s", diff)
			}
		})
	}
}

// recordingPodGroups records the PodGroupScheduled conditions written.
type recordingPodGroups struct {
	mu    sync.Mutex
	conds []string
}

func (r *recordingPodGroups) SetPodGroupScheduled(_ context.Context, ns, name string, cond metav1.Condition) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.conds = append(r.conds, ns+"/"+name+" "+cond.Reason+strings.TrimSuffix(" "+strings.SplitN(cond.Message, ":", 2)[0], " "+cond.Message))
	return nil
}

func (r *recordingPodGroups) said() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.conds
}

// TestPodGroupBasicPolicyPlacesEachPodAlone: the basic policy is no gang.
func TestPodGroupBasicPolicyPlacesEachPodAlone(t *testing.T) {
	basic := builders.MakePodGroup("serve", "default").Obj()
	pods := podGroupMembers("serve", 3)
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 2)}, []*v1alpha1.Queue{queueOf("q", "16")}, pods...)
	c.s.deps.PodGroups = builders.PodGroupLookup(basic)
	c.cycle()
	bound := 0
	for _, p := range pods {
		if c.boundTo(p.Name) != "" {
			bound++
			if g, ok := c.b.Annotations[p.Name][api.AnnotationAdmittedGang]; !ok || g != "" {
				t.Errorf("%s bound with %s %q (set: %v), want \"\": a pod on its own", p.Name, api.AnnotationAdmittedGang, g, ok)
			}
		}
	}
	if bound != 2 {
		t.Errorf("%d of 3 pods bound on 2 GPUs, want 2 (each pod on its own)", bound)
	}
}

// TestClientPodGroupStatus: the writer sets the condition, never turns a
// scheduled group back to unschedulable, and fails when the API does.
func TestClientPodGroupStatus(t *testing.T) {
	ctx := t.Context()
	scheduled := metav1.Condition{Type: schedulingv1alpha2.PodGroupScheduled, Status: metav1.ConditionTrue, Reason: "Scheduled", Message: "bound"}
	unschedulable := metav1.Condition{Type: schedulingv1alpha2.PodGroupScheduled, Status: metav1.ConditionFalse,
		Reason: schedulingv1alpha2.PodGroupReasonUnschedulable, Message: "NoCapacity: no room"}
	cs := fake.NewClientset(builders.MakePodGroup("train", "default").Gang(4).Obj())
	w := ClientPodGroupStatus{Client: cs}
	read := func() *metav1.Condition {
		pg, err := cs.SchedulingV1alpha2().PodGroups("default").Get(ctx, "train", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return apimeta.FindStatusCondition(pg.Status.Conditions, schedulingv1alpha2.PodGroupScheduled)
	}
	if err := w.SetPodGroupScheduled(ctx, "default", "train", unschedulable); err != nil {
		t.Fatal(err)
	}
	if c := read(); c == nil || c.Status != metav1.ConditionFalse || c.Message != unschedulable.Message {
		t.Fatalf("condition %+v, want the unschedulable one", c)
	}
	if err := w.SetPodGroupScheduled(ctx, "default", "train", scheduled); err != nil {
		t.Fatal(err)
	}
	if err := w.SetPodGroupScheduled(ctx, "default", "train", unschedulable); err != nil {
		t.Fatal(err)
	}
	if c := read(); c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("condition %+v after an unschedulable one came for a scheduled group, want it still True", c)
	}
	cs.PrependReactor("update", "podgroups", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewConflict(schedulingv1alpha2.Resource("podgroups"), "train", errors.New("changed"))
	})
	other := builders.MakePodGroup("other", "default").Gang(2).Obj()
	if _, err := cs.SchedulingV1alpha2().PodGroups("default").Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := w.SetPodGroupScheduled(ctx, "default", "other", scheduled); err == nil {
		t.Error("a refused status write returned no error")
	}
	if err := w.SetPodGroupScheduled(ctx, "default", "gone", scheduled); !apierrors.IsNotFound(errors.Unwrap(err)) {
		t.Errorf("writing to a missing PodGroup: %v, want NotFound", err)
	}
}

// TestGangThatMixesQueuesIsRefused: a gang is charged to one queue; members
// of one pod group that name two queues are all refused, with a reason that
// names both, and nothing of it is bound.
func TestGangThatMixesQueuesIsRefused(t *testing.T) {
	a := builders.MakePod("g-0", "default").Queue("qa").GPUs(1).CPU("1").PodGroup("g").MinMember(2).UID("g-0").Obj()
	b := builders.MakePod("g-1", "default").Queue("qb").GPUs(1).CPU("1").PodGroup("g").MinMember(2).UID("g-1").Obj()
	c := newCluster(t, "binpack", []*corev1.Node{h100Node("n1", "a", 8)}, []*v1alpha1.Queue{queueOf("qa", "8"), queueOf("qb", "8")}, a, b)
	res := c.cycle()
	if res.Bound != 0 || res.Pending[binder.ReasonInvalidRequest] != 2 {
		t.Fatalf("bound %d, pending %v; want both members refused as InvalidRequest", res.Bound, res.Pending)
	}
	for _, name := range []string{"g-0", "g-1"} {
		reason, msg := c.b.Reason(name)
		if reason != binder.ReasonInvalidRequest || !strings.Contains(msg, "mixes queues") || !strings.Contains(msg, "qa") || !strings.Contains(msg, "qb") {
			t.Errorf("%s: reason %q, message %q; want InvalidRequest naming both queues", name, reason, msg)
		}
	}
}

// TestPodNamedLikeAGangIsRefused: a workload is keyed "namespace/name", so
// a pod in no gang named like a pending gang of its namespace would be
// taken for a member (first come decided whether the workload was a gang:
// the gang placed in part, or the pod counted toward its min-member). The
// pod is refused with a reason, whichever was created first; the gang is
// placed whole.
func TestPodNamedLikeAGangIsRefused(t *testing.T) {
	for _, singleFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("single pod first %v", singleFirst), func(t *testing.T) {
			// A gang of three that has two members: with the pod counted as
			// its third it would be placed.
			g0 := builders.MakePod("train-0", "default").Queue("q").GPUs(1).CPU("1").PodGroup("train").MinMember(3).UID("train-0").Obj()
			g1 := builders.MakePod("train-1", "default").Queue("q").GPUs(1).CPU("1").PodGroup("train").MinMember(3).UID("train-1").Obj()
			single := builders.MakePod("train", "default").Queue("q").GPUs(1).CPU("1").UID("train").Obj()
			// The same name in another namespace is another workload.
			elsewhere := builders.MakePod("train", "other").Queue("q-other").GPUs(1).CPU("1").UID("other-train").Obj()
			pods := []*corev1.Pod{g0, g1, single, elsewhere}
			if singleFirst {
				pods = []*corev1.Pod{elsewhere, single, g0, g1}
			}
			for i, p := range pods {
				p.CreationTimestamp = metav1.NewTime(time.Unix(1000+int64(i), 0))
			}
			c := newCluster(t, "binpack", []*corev1.Node{h100Node("n1", "a", 8)},
				[]*v1alpha1.Queue{queueOf("q", "8"), builders.MakeQueue("q-other").GPUQuota("8").Namespaces("other").Obj()}, pods...)
			var mu sync.Mutex
			var bound []string // namespace/name: the fake binder keys by name
			c.b.BindErr = func(p *corev1.Pod, _ string) error {
				mu.Lock()
				defer mu.Unlock()
				bound = append(bound, p.Namespace+"/"+p.Name)
				return nil
			}
			res := c.cycle()
			mu.Lock()
			defer mu.Unlock()
			if res.Bound != 1 || !slices.Equal(bound, []string{"other/train"}) {
				t.Fatalf("bound %d: %q; want other/train alone: the gang has 2 of its 3 members and default/train is refused", res.Bound, bound)
			}
			reason, msg := c.b.Reason("train")
			if reason != binder.ReasonInvalidRequest || !strings.Contains(msg, "default/train") || !strings.Contains(msg, "rename") {
				t.Errorf("pod train: reason %q, message %q; want InvalidRequest naming the gang", reason, msg)
			}
			for _, name := range []string{"train-0", "train-1"} {
				if reason, msg := c.b.Reason(name); reason != binder.ReasonGangIncomplete || !strings.Contains(msg, "2 of its 3") {
					t.Errorf("%s: reason %q, message %q; want GangIncomplete with 2 of its 3 members", name, reason, msg)
				}
			}
		})
	}
}
