package scheduler

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/tests/builders"
)

// Queue accounting and queue namespaces: what tenants write (labels,
// annotations, nodeName) must not move another team's quota.

func TestBindingRecordsTheAdmittedQueue(t *testing.T) {
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 2)}, []*v1alpha1.Queue{queueOf("q", "8")},
		gpuPod("whole", "q", 1), fracPod("frac", "q", 30))
	c.cycle()
	for _, p := range []string{"whole", "frac"} {
		if got := c.b.Annotations[p][api.AnnotationAdmittedQueue]; got != "q" {
			t.Errorf("%s bound with annotations %v, want %s=q", p, c.b.Annotations[p], api.AnnotationAdmittedQueue)
		}
	}
}

func TestQueueUsageCountsOnlyAdmittedWork(t *testing.T) {
	// team-b deserves 2 GPUs. Pods that carry its label but were never
	// admitted by the coordinator (bound by another scheduler, or given a
	// nodeName) hold 4 GPUs: none of it is team-b's usage. A pod the
	// coordinator admitted to team-a and then relabelled team-b stays
	// team-a's.
	var pods []*corev1.Pod
	for i := range 3 {
		stranger := gpuPod(fmt.Sprintf("stranger-%d", i), "team-b", 1)
		stranger.Spec.SchedulerName = corev1.DefaultSchedulerName
		stranger.Spec.NodeName = "n1"
		stranger.Status.Phase = corev1.PodRunning
		pods = append(pods, stranger)
	}
	forged := gpuPod("forged", "team-b", 1)
	forged.Spec.NodeName = "n1"
	forged.Status.Phase = corev1.PodRunning
	pods = append(pods, forged) // the coordinator's scheduler name, but never bound by it
	moved := admitted(gpuPod("moved", "team-a", 1), "n2")
	moved.Labels[api.LabelQueue] = "team-b"
	pods = append(pods, moved,
		builders.MakePod("victim", "default").Queue("team-b").GPUs(2).CPU("1").Preemptible(false).UID("victim").Obj())
	rec := &recordingStatus{st: map[string]v1alpha1.QueueStatus{}}
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 4), h100Node("n2", "a", 4)},
		[]*v1alpha1.Queue{queueOf("team-a", "2"), queueOf("team-b", "2")}, pods...)
	c.s.deps.Status = rec
	c.cycle()
	if got := c.boundTo("victim"); got != "n2" {
		t.Fatalf("team-b's non-preemptible pod within its quota was not bound (to n2, the only room): %q, reason %s: %s", got, c.reason("victim"), c.b.Messages["victim"])
	}
	c.cycle()
	if got := rec.st["team-a"].Allocated[v1alpha1.ResourceGPU]; got.MilliValue() != 1000 {
		t.Errorf("team-a allocated %s, want 1 (the pod it admitted, relabelled or not)", got.String())
	}
	if got := rec.st["team-b"].Allocated[v1alpha1.ResourceGPU]; got.MilliValue() != 2000 {
		t.Errorf("team-b allocated %s, want 2 (only its admitted pod)", got.String())
	}
}

func TestQueueRefusesPodsOfOtherNamespaces(t *testing.T) {
	open := builders.MakeQueue("open").GPUQuota("8").Namespaces(v1alpha1.AllNamespaces).Obj()
	nobody := builders.MakeQueue("nobody").GPUQuota("8").Obj()
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 8)},
		[]*v1alpha1.Queue{queueOf("team-a", "8"), open, nobody},
		builders.MakePod("intruder", "team-b-ns").Queue("team-a").GPUs(1).UID("intruder").Obj(),
		builders.MakePod("anyone", "team-b-ns").Queue("open").GPUs(1).UID("anyone").Obj(),
		builders.MakePod("lonely", "default").Queue("nobody").GPUs(1).UID("lonely").Obj(),
		builders.MakePod("member", "default").Queue("team-a").GPUs(1).UID("member").Obj())
	c.cycle()
	for pod, queue := range map[string]string{"intruder": "team-a", "lonely": "nobody"} {
		if got := c.boundTo(pod); got != "" {
			t.Errorf("%s was bound to %s", pod, got)
		}
		ns := map[string]string{"intruder": "team-b-ns", "lonely": "default"}[pod]
		if r, msg := c.reason(pod), c.b.Messages[pod]; r != api.ReasonInvalidRequest || msg != QueueNamespaceMessage(queue, ns) {
			t.Errorf("%s pending %s: %q, want %s: %q", pod, r, msg, api.ReasonInvalidRequest, QueueNamespaceMessage(queue, ns))
		}
	}
	for _, pod := range []string{"anyone", "member"} {
		if c.boundTo(pod) == "" {
			t.Errorf("%s was not bound: %s %s", pod, c.reason(pod), c.b.Messages[pod])
		}
	}
	if want := "queue team-a does not take pods from namespace team-b-ns: set label gpufrac.io/queue to a queue whose spec.namespaces lists team-b-ns, or ask the cluster admin to add team-b-ns to spec.namespaces of Queue team-a"; QueueNamespaceMessage("team-a", "team-b-ns") != want {
		t.Errorf("message %q, want %q", QueueNamespaceMessage("team-a", "team-b-ns"), want)
	}
}

func TestNamespaceDefaultQueue(t *testing.T) {
	nsIndexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	_ = nsIndexer.Add(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a-ns", Labels: map[string]string{api.LabelDefaultQueue: "team-a"}}})
	_ = nsIndexer.Add(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "plain"}})
	teamA := builders.MakeQueue("team-a").GPUQuota("8").Namespaces("team-a-ns").Obj()
	other := builders.MakeQueue("other").GPUQuota("8").Namespaces("team-a-ns").Obj()
	c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 8)}, []*v1alpha1.Queue{teamA, other},
		builders.MakePod("unlabelled", "team-a-ns").GPUs(1).UID("unlabelled").Obj(),
		builders.MakePod("labelled", "team-a-ns").Queue("other").GPUs(1).UID("labelled").Obj(),
		builders.MakePod("no-default", "plain").GPUs(1).UID("no-default").Obj())
	c.s.deps.Namespaces = corelisters.NewNamespaceLister(nsIndexer)
	c.cycle()
	if got := c.b.Annotations["unlabelled"][api.AnnotationAdmittedQueue]; got != "team-a" {
		t.Errorf("a label-less pod in team-a-ns was charged to %q, want its namespace's default team-a (reason %s)", got, c.reason("unlabelled"))
	}
	if got := c.b.Annotations["labelled"][api.AnnotationAdmittedQueue]; got != "other" {
		t.Errorf("a pod naming its queue was charged to %q, want other", got)
	}
	if r, msg := c.reason("no-default"), c.b.Messages["no-default"]; r != api.ReasonInvalidRequest || !strings.Contains(msg, "label gpufrac.io/queue is missing") {
		t.Errorf("a label-less pod without a default queue: %s %q, want InvalidRequest for the missing label", r, msg)
	}
}

func TestNonPreemptibleOnlyInsideTheQueueNamespaces(t *testing.T) {
	// team-b (deserves 2) holds all 4 GPUs with non-preemptible pods it was
	// admitted earlier; team-a (deserves 2) now wants 2. While team-b lets its
	// pods' namespace in, gpufrac.io/preemptible "false" protects them and
	// nothing is reclaimed; once team-b drops that namespace it protects
	// nothing, and team-a reclaims its quota.
	var pods []*corev1.Pod
	for i := range 4 {
		pods = append(pods, admitted(builders.MakePod(fmt.Sprintf("b-%d", i), "b-ns").Queue("team-b").GPUs(1).CPU("1").
			Preemptible(false).UID(fmt.Sprintf("b-%d", i)).Obj(), "n1"))
	}
	pods = append(pods, builders.MakePod("a-0", "a-ns").Queue("team-a").GPUs(2).CPU("1").UID("a-0").Obj())
	teamA := builders.MakeQueue("team-a").GPUQuota("2").Namespaces("a-ns").Obj()
	for _, tc := range []struct {
		name      string
		bNS       []string
		wantEvict int
	}{
		{name: "inside team-b's namespaces: protected", bNS: []string{"b-ns"}, wantEvict: 0},
		{name: "namespace dropped from team-b: reclaimable", bNS: []string{"elsewhere"}, wantEvict: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			teamB := builders.MakeQueue("team-b").GPUQuota("2").GPULimit("4").Namespaces(tc.bNS...).Obj()
			var cp []*corev1.Pod
			for _, p := range pods {
				cp = append(cp, p.DeepCopy())
			}
			c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 4)}, []*v1alpha1.Queue{teamA, teamB}, cp...)
			c.cycle()
			if len(c.b.Evicted) != tc.wantEvict {
				t.Errorf("evicted %v, want %d of team-b's pods", c.b.Evicted, tc.wantEvict)
			}
		})
	}
}

// edit changes a pod in the cluster's informer, as its author would with a
// patch of its metadata after admission.
func (c *cluster) edit(name string, change func(p *corev1.Pod)) {
	c.t.Helper()
	obj, ok, _ := c.pods.GetByKey("default/" + name)
	if !ok {
		c.t.Fatalf("no pod %s", name)
	}
	p := obj.(*corev1.Pod).DeepCopy()
	change(p)
	_ = c.pods.Update(p)
}

func TestProtectionAddedAfterAdmissionProtectsNothing(t *testing.T) {
	// team-a deserves 1 GPU and holds it with a non-preemptible gang of one
	// ("anchor"); team-b, idle, deserves 3. team-a's three preemptible pods
	// borrow team-b's share. Their author then protects them after
	// admission: the coordinator admitted them preemptible, and reclaims
	// them when team-b wants its quota - never the anchor.
	for _, tc := range []struct {
		name   string
		change func(p *corev1.Pod)
	}{
		{"gpufrac.io/preemptible false", func(p *corev1.Pod) { p.Annotations[api.AnnotationPreemptible] = "false" }},
		{"relabelled into the non-preemptible gang", func(p *corev1.Pod) {
			p.Labels[api.LabelPodGroup] = "anchor"
			p.Annotations[api.AnnotationMinMember] = "1"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			anchor := builders.MakePod("anchor", "default").Queue("team-a").GPUs(1).CPU("1").Preemptible(false).
				PodGroup("anchor").MinMember(1).UID("anchor").Obj()
			c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 4)},
				[]*v1alpha1.Queue{queueOf("team-a", "1"), queueOf("team-b", "3")}, anchor)
			c.cycle()
			for i := range 3 {
				_ = c.pods.Add(gpuPod(fmt.Sprintf("a-%d", i), "team-a", 1))
			}
			c.cycle()
			for _, name := range []string{"anchor", "a-0", "a-1", "a-2"} {
				if c.boundTo(name) == "" {
					t.Fatalf("%s not bound: %s %s", name, c.reason(name), c.b.Messages[name])
				}
				want := map[bool]string{true: "false", false: "true"}[name == "anchor"]
				if got := c.b.Annotations[name][api.AnnotationAdmittedPreemptible]; got != want {
					t.Errorf("%s bound with %s=%q, want %q", name, api.AnnotationAdmittedPreemptible, got, want)
				}
				c.edit(name, func(p *corev1.Pod) {
					p.Status.Phase = corev1.PodRunning
					if name != "anchor" {
						tc.change(p)
					}
				})
			}
			_ = c.pods.Add(gpuPod("b-0", "team-b", 1))
			c.cycle()
			if len(c.b.Evicted) == 0 || slices.Contains(c.b.Evicted, "anchor") {
				t.Errorf("evicted %v, want team-a's borrowing pods and not its anchor (reason of b-0: %s %s)", c.b.Evicted, c.reason("b-0"), c.b.Messages["b-0"])
			}
		})
	}
}

func TestBoundPodsStayChargedWhateverTheirAuthorEdits(t *testing.T) {
	// team-a deserves 1 GPU and holds it with a non-preemptible pod. Its
	// author then edits the pod's metadata so that it no longer parses: the
	// pod stays charged to team-a, whose next non-preemptible pod is over
	// its quota.
	for _, tc := range []struct {
		name   string
		change func(p *corev1.Pod)
	}{
		{"unparsable preemptible", func(p *corev1.Pod) { p.Annotations[api.AnnotationPreemptible] = "maybe" }},
		{"unparsable min-member", func(p *corev1.Pod) { p.Annotations[api.AnnotationMinMember] = "x" }},
		{"no GPU model", func(p *corev1.Pod) { p.Annotations[api.AnnotationGPUModels] = "|" }},
		{"pod-group without min-member", func(p *corev1.Pod) { p.Labels[api.LabelPodGroup] = "g" }},
		{"queue label removed", func(p *corev1.Pod) { delete(p.Labels, api.LabelQueue) }},
		{"owned by a Job nobody knows", func(p *corev1.Pod) {
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "ghost", UID: "ghost", Controller: ptrTo(true)}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first := builders.MakePod("first", "default").Queue("team-a").GPUs(1).CPU("1").Preemptible(false).UID("first").Obj()
			c := newCluster(t, "", []*corev1.Node{h100Node("n1", "a", 4)},
				[]*v1alpha1.Queue{queueOf("team-a", "1"), queueOf("team-b", "3")}, first)
			c.s.deps.Jobs = func(string, string) (*batchv1.Job, bool) { return nil, false }
			c.cycle()
			if c.boundTo("first") == "" {
				t.Fatalf("first not bound: %s", c.b.Messages["first"])
			}
			c.edit("first", func(p *corev1.Pod) {
				p.Status.Phase = corev1.PodRunning
				tc.change(p)
			})
			_ = c.pods.Add(builders.MakePod("second", "default").Queue("team-a").GPUs(1).CPU("1").Preemptible(false).UID("second").Obj())
			c.cycle()
			if got := c.boundTo("second"); got != "" {
				t.Errorf("team-a's second non-preemptible pod was bound to %s: the first, edited, was no longer charged", got)
			}
			if r := c.reason("second"); r != api.ReasonOverQuota {
				t.Errorf("second pending %s (%s), want %s", r, c.b.Messages["second"], api.ReasonOverQuota)
			}
		})
	}
}

func ptrTo[T any](v T) *T { return &v }
