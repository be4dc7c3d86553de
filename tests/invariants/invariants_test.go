package invariants

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/coordinator/placeholder"
	"github.com/gpufrac/gpufrac/tests/builders"
)

var now = time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)

// gpuNode is a Ready node with 2 GPUs in fraction mode, n-gpu0 and n-gpu1.
func gpuNode() *corev1.Node {
	n := builders.MakeNode("n").GPUs(2).FractionUnits(200).Obj()
	inv := []api.GPUInfo{{UUID: "n-gpu0", Index: 0, Mode: "fraction", Healthy: true}, {UUID: "n-gpu1", Index: 1, Mode: "fraction", Healthy: true}}
	s, _ := api.EncodeInventory(inv)
	n.Annotations = map[string]string{api.AnnotationGPUInventory: s}
	return n
}

func reservation(gpu string) *corev1.Pod {
	return builders.MakePod("res-"+gpu, api.ReservationNamespace).Label(api.LabelRole, api.RoleReservation).GPUs(1).Node("n").
		Annotation(api.AnnotationGPU, gpu).Annotation(api.AnnotationReservedGPU, gpu).SchedulerName("default-scheduler").Obj()
}

func fraction(name string, pct int, gpu string) *corev1.Pod {
	return builders.MakePod(name, "default").Queue("q").Fraction(pct).CPU("1").Node("n").Annotation(api.AnnotationAdmittedQueue, "q").
		Annotation(api.AnnotationGPU, gpu).Annotation(api.AnnotationAllocatedGPU, gpu).Obj()
}

func whole(name, gpu string) *corev1.Pod {
	return builders.MakePod(name, "default").Queue("q").GPUs(1).CPU("1").Node("n").Annotation(api.AnnotationAdmittedQueue, "q").
		Annotation(api.AnnotationAllocatedGPU, gpu).Obj()
}

// queueWithStatus is queue q with allocated gpu and cpu in its status.
func queueWithStatus(gpu, cpu string) *v1alpha1.Queue {
	q := builders.MakeQueue("q").GPUQuota("2").Obj()
	q.Status.Allocated = corev1.ResourceList{"gpu": resource.MustParse(gpu), "cpu": resource.MustParse(cpu)}
	return q
}

func check(t *testing.T, nodes []*corev1.Node, pods []*corev1.Pod, queues []*v1alpha1.Queue, opts ...Options) []Violation {
	t.Helper()
	var objs []runtime.Object
	for _, n := range nodes {
		objs = append(objs, n)
	}
	for _, p := range pods {
		if p.CreationTimestamp.IsZero() {
			p.CreationTimestamp = metav1.NewTime(now.Add(-time.Minute))
		}
		objs = append(objs, p)
	}
	var dynObjs []runtime.Object
	for _, q := range queues {
		u, err := v1alpha1.ToUnstructured(q)
		if err != nil {
			t.Fatal(err)
		}
		dynObjs = append(dynObjs, u)
	}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{v1alpha1.QueueGVR(): "QueueList"}, dynObjs...)
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	o.Now = func() time.Time { return now }
	got, err := Check(t.Context(), fake.NewSimpleClientset(objs...), dyn, o)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// runningUnwritten are running fractions of 60 % on n-gpu1 that gpufrac-node
// never wrote back.
func runningUnwritten(names ...string) []*corev1.Pod {
	var ps []*corev1.Pod
	for _, name := range names {
		f := fraction(name, 60, "n-gpu1")
		delete(f.Annotations, api.AnnotationAllocatedGPU)
		f.Status.Phase = corev1.PodRunning
		ps = append(ps, f)
	}
	return ps
}

// TestCheck starts from a correct cluster (two fractions sharing a reserved
// GPU, a whole GPU, the queue's status right) and breaks one invariant per
// case: each must be reported, and only that one.
func TestCheck(t *testing.T) {
	base := func() ([]*corev1.Node, []*corev1.Pod, []*v1alpha1.Queue) {
		return []*corev1.Node{gpuNode()},
			[]*corev1.Pod{reservation("n-gpu0"), fraction("f1", 30, "n-gpu0"), fraction("f2", 40, "n-gpu0"), whole("w", "n-gpu1")},
			[]*v1alpha1.Queue{queueWithStatus("1.7", "3")}
	}
	tests := []struct {
		name   string
		opts   Options
		mutate func(nodes []*corev1.Node, pods []*corev1.Pod, qs []*v1alpha1.Queue) ([]*corev1.Node, []*corev1.Pod, []*v1alpha1.Queue)
		want   []string // "[invariant] object: part of the message"
	}{
		{name: "correct"},
		{name: "fractions beyond 100%", mutate: func(n []*corev1.Node, p []*corev1.Pod, q []*v1alpha1.Queue) ([]*corev1.Node, []*corev1.Pod, []*v1alpha1.Queue) {
			return n, append(p, fraction("f3", 40, "n-gpu0")), []*v1alpha1.Queue{queueWithStatus("2.1", "4")}
		}, want: []string{"[gpu] n/n-gpu0: fractions take 110%"}},
		{name: "two whole holders", mutate: func(n []*corev1.Node, p []*corev1.Pod, q []*v1alpha1.Queue) ([]*corev1.Node, []*corev1.Pod, []*v1alpha1.Queue) {
			return n, append(p, whole("w2", "n-gpu1")), []*v1alpha1.Queue{queueWithStatus("2.7", "4")}
		}, want: []string{"[gpu] n/n-gpu1: given whole to 2 pods: default/w, default/w2"}},
		{name: "fraction on a GPU held whole", mutate: func(n []*corev1.Node, p []*corev1.Pod, q []*v1alpha1.Queue) ([]*corev1.Node, []*corev1.Pod, []*v1alpha1.Queue) {
			return n, append(p, fraction("f3", 10, "n-gpu1")), []*v1alpha1.Queue{queueWithStatus("1.8", "4")}
		}, want: []string{"[gpu] n/n-gpu1: fractions (10%) run on it but no reservation", "[gpu] n/n-gpu1: fractions (10%) share it with default/w"}},
		{name: "pod rejected at admission", mutate: func(n []*corev1.Node, p []*corev1.Pod, q []*v1alpha1.Queue) ([]*corev1.Node, []*corev1.Pod, []*v1alpha1.Queue) {
			r := builders.MakePod("rejected", "default").Node("n").Obj()
			r.Status.Phase, r.Status.Reason, r.Status.Message = corev1.PodFailed, reasonUnexpectedAdmissionError, "Pod was rejected: no devices"
			return n, append(p, r), q
		}, want: []string{"[gpu] default/rejected: rejected at device admission"}},
		{name: "reservation of a GPU gone to MIG", mutate: func(n []*corev1.Node, p []*corev1.Pod, q []*v1alpha1.Queue) ([]*corev1.Node, []*corev1.Pod, []*v1alpha1.Queue) {
			inv := []api.GPUInfo{{UUID: "n-gpu0", Mode: "mig", Healthy: true}, {UUID: "n-gpu1", Index: 1, Mode: "fraction", Healthy: true}}
			s, _ := api.EncodeInventory(inv)
			n[0].Annotations[api.AnnotationGPUInventory] = s
			return n, p, q
		}, want: []string{"[reservation] gpufrac-reservations/res-n-gpu0: GPU n-gpu0 on n is in mode mig"}},
		{name: "idle reservation", mutate: func(n []*corev1.Node, p []*corev1.Pod, q []*v1alpha1.Queue) ([]*corev1.Node, []*corev1.Pod, []*v1alpha1.Queue) {
			return n, []*corev1.Pod{reservation("n-gpu0"), whole("w", "n-gpu1")}, []*v1alpha1.Queue{queueWithStatus("1", "1")}
		}, want: []string{"[reservation] gpufrac-reservations/res-n-gpu0: no fraction uses GPU n-gpu0 on n"}},
		{name: "reservation on a deleted node", mutate: func(n []*corev1.Node, p []*corev1.Pod, q []*v1alpha1.Queue) ([]*corev1.Node, []*corev1.Pod, []*v1alpha1.Queue) {
			return nil, p, q
		}, want: []string{"[reservation] gpufrac-reservations/res-n-gpu0: its node n no longer exists"}},
		{name: "reservation on a cordoned node", mutate: func(n []*corev1.Node, p []*corev1.Pod, q []*v1alpha1.Queue) ([]*corev1.Node, []*corev1.Pod, []*v1alpha1.Queue) {
			n[0].Spec.Unschedulable = true
			return n, p, q
		}, want: []string{"[reservation] gpufrac-reservations/res-n-gpu0: its node n is cordoned"}},
		{name: "placeholder for nothing pending", mutate: func(n []*corev1.Node, p []*corev1.Pod, q []*v1alpha1.Queue) ([]*corev1.Node, []*corev1.Pod, []*v1alpha1.Queue) {
			ph := builders.MakePod(placeholder.NamePrefix+"x-0", api.ReservationNamespace).Label(api.LabelRole, api.RolePlaceholder).
				Annotation(placeholder.AnnotationWorkloads, "default/gone").SchedulerName("default-scheduler").Obj()
			return n, append(p, ph), q
		}, want: []string{`[placeholder] gpufrac-reservations/gpufrac-placeholder-x-0: serves no pending admitted work (workloads "default/gone")`}},
		{name: "queue status off", mutate: func(n []*corev1.Node, p []*corev1.Pod, q []*v1alpha1.Queue) ([]*corev1.Node, []*corev1.Pod, []*v1alpha1.Queue) {
			return n, p, []*v1alpha1.Queue{queueWithStatus("2.7", "3")}
		}, want: []string{"[queue] queue q: status says 2700m GPU and 3 CPU allocated, its pods use 1.700 GPU and 3.000 CPU"}},
		// The GPU checks read what gpufrac-node wrote back: two fractions of
		// 60 % running on one GPU that no reservation holds, never written
		// back, must not pass for want of anything to check.
		{name: "running fractions never written back", mutate: func(n []*corev1.Node, p []*corev1.Pod, q []*v1alpha1.Queue) ([]*corev1.Node, []*corev1.Pod, []*v1alpha1.Queue) {
			return n, append(p, runningUnwritten("v1", "v2")...), []*v1alpha1.Queue{queueWithStatus("2.9", "5")}
		}, want: []string{
			"[gpu] default/v1: runs on n holding GPUs, but gpufrac-node never wrote back",
			"[gpu] default/v2: runs on n holding GPUs, but gpufrac-node never wrote back",
			"[gpu] n/n-gpu1: fractions default/v1, default/v2 are bound to it but no reservation holds it",
		}},
		// Without a write-back (NoWriteBack: nothing plays that part of
		// gpufrac-node), the same pods are still checked for their GPU.
		{name: "fractions never written back, no write-back expected", opts: Options{NoWriteBack: true}, mutate: func(n []*corev1.Node, p []*corev1.Pod, q []*v1alpha1.Queue) ([]*corev1.Node, []*corev1.Pod, []*v1alpha1.Queue) {
			return n, append(p, runningUnwritten("v1", "v2")...), []*v1alpha1.Queue{queueWithStatus("2.9", "5")}
		}, want: []string{
			"[gpu] n/n-gpu1: fractions default/v1, default/v2 are bound to it but no reservation holds it",
		}},
		{name: "bound without the queue charged", mutate: func(n []*corev1.Node, p []*corev1.Pod, q []*v1alpha1.Queue) ([]*corev1.Node, []*corev1.Pod, []*v1alpha1.Queue) {
			return n, append(p, builders.MakePod("sneaked", "default").Queue("q").CPU("1").Node("n").Obj()), q
		}, want: []string{"[queue] default/sneaked: bound to n without gpufrac.io/admitted-queue"}},
		{name: "placeholders beyond the pending work", mutate: func(n []*corev1.Node, p []*corev1.Pod, q []*v1alpha1.Queue) ([]*corev1.Node, []*corev1.Pod, []*v1alpha1.Queue) {
			waits := builders.MakePod("waits", "default").Queue("q").GPUs(1).Obj()
			waits.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: api.ReasonNoCapacity}}
			p = append(p, waits)
			for i := range 3 {
				p = append(p, builders.MakePod(fmt.Sprintf("%sx-%d", placeholder.NamePrefix, i), api.ReservationNamespace).GPUs(1).
					Label(api.LabelRole, api.RolePlaceholder).Annotation(placeholder.AnnotationWorkloads, "default/waits").SchedulerName("default-scheduler").Obj())
			}
			return n, p, q
		}, want: []string{"[placeholder] gpufrac-reservations: placeholders ask 3 GPUs, more than the 1 the admitted pending pods could use"}},
		{name: "pending without a reason", mutate: func(n []*corev1.Node, p []*corev1.Pod, q []*v1alpha1.Queue) ([]*corev1.Node, []*corev1.Pod, []*v1alpha1.Queue) {
			return n, append(p, builders.MakePod("silent", "default").Queue("q").GPUs(1).Obj()), q
		}, want: []string{"[pending] default/silent: pending for 1m0s without a reason"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nodes, pods, qs := base()
			if tt.mutate != nil {
				nodes, pods, qs = tt.mutate(nodes, pods, qs)
			}
			got := check(t, nodes, pods, qs, tt.opts)
			var gotS []string
			for _, v := range got {
				gotS = append(gotS, v.String())
			}
			if len(got) != len(tt.want) {
				t.Fatalf("violations:\n  %s\nwant %d: %q", strings.Join(gotS, "\n  "), len(tt.want), tt.want)
			}
			for i, w := range tt.want {
				if !strings.HasPrefix(gotS[i], w) {
					t.Errorf("violation %d = %q, want it to start %q", i, gotS[i], w)
				}
			}
		})
	}
}

// TestPendingWithAReasonAndAPlaceholderIsFine: admitted work waiting for
// capacity, with its placeholder, breaks nothing.
func TestPendingWithAReasonAndAPlaceholderIsFine(t *testing.T) {
	p := builders.MakePod("waits", "default").Queue("q").GPUs(1).Obj()
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: api.ReasonNoCapacity}}
	ph := builders.MakePod(placeholder.NamePrefix+"x-0", api.ReservationNamespace).Label(api.LabelRole, api.RolePlaceholder).
		Annotation(placeholder.AnnotationWorkloads, "default/other,default/waits").SchedulerName("default-scheduler").Obj()
	if got := check(t, []*corev1.Node{gpuNode()}, []*corev1.Pod{p, ph}, []*v1alpha1.Queue{queueWithStatus("0", "0")}); len(got) != 0 {
		t.Errorf("violations %v, want none", got)
	}
}

// TestJobGangWaitingWithItsPlaceholderIsFine: a Job's gang is named after
// the Job, so its placeholder's workload is "namespace/job": it serves the
// Job's pods waiting for capacity.
func TestJobGangWaitingWithItsPlaceholderIsFine(t *testing.T) {
	p := builders.MakePod("train-abcde", "default").Queue("q").GPUs(1).OwnedBy("batch/v1", "Job", "train").Obj()
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: api.ReasonNoCapacity}}
	ph := builders.MakePod(placeholder.NamePrefix+"x-0", api.ReservationNamespace).Label(api.LabelRole, api.RolePlaceholder).
		Annotation(placeholder.AnnotationWorkloads, "default/train").SchedulerName("default-scheduler").Obj()
	if got := check(t, []*corev1.Node{gpuNode()}, []*corev1.Pod{p, ph}, []*v1alpha1.Queue{queueWithStatus("0", "0")}); len(got) != 0 {
		t.Errorf("violations %v, want none", got)
	}
}
