package app

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/request"
	"github.com/gpufrac/gpufrac/coordinator/podrequest"
	"github.com/gpufrac/gpufrac/coordinator/predicates"

	"github.com/gpufrac/gpufrac/tests/builders"
)

// busyPod is a pod with everything the API server and a kubelet add, and
// what a tenant may write besides its resources.
func busyPod(b *builders.PodWrapper) *corev1.Pod {
	p := b.Obj()
	p.ResourceVersion = "7"
	p.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}}
	p.Spec.Volumes = []corev1.Volume{{Name: "kube-api-access", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{}}}}
	for i := range p.Spec.Containers {
		c := &p.Spec.Containers[i]
		c.Image, c.Command, c.Args = "registry/app:1", []string{"/app"}, []string{"--serve"}
		c.VolumeMounts = []corev1.VolumeMount{{Name: "kube-api-access", MountPath: "/var/run/secrets"}}
		c.LivenessProbe = &corev1.Probe{PeriodSeconds: 10}
		c.Ports = []corev1.ContainerPort{{ContainerPort: 8080}, {ContainerPort: 9090, HostPort: 9090}}
		c.TerminationMessagePath = "/dev/termination-log"
	}
	p.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsNonRoot: new(bool)}
	p.Status = corev1.PodStatus{
		StartTime:         &metav1.Time{},
		Phase:             corev1.PodRunning,
		Conditions:        []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}, {Type: corev1.PodScheduled, Status: corev1.ConditionTrue}},
		ContainerStatuses: []corev1.ContainerStatus{{Name: "main", Ready: true}},
		PodIP:             "10.0.0.1", PodIPs: []corev1.PodIP{{IP: "10.0.0.1"}},
		HostIP: "192.168.0.1", HostIPs: []corev1.HostIP{{IP: "192.168.0.1"}},
	}
	return p
}

// TestTrimObjectKeepsWhatTheCoordinatorReads: a pod trimmed by the
// informers' transform parses as the whole pod does (requests, queue,
// gang, constraints, and the refusal of NVIDIA_VISIBLE_DEVICES), while
// what runs its containers is gone.
func TestTrimObjectKeepsWhatTheCoordinatorReads(t *testing.T) {
	cases := map[string]*builders.PodWrapper{
		"fraction with queue and affinity": builders.MakePod("f", "team").Fraction(30).CPU("500m").Memory("1Gi").Queue("q").
			RequiredNodeAffinity(api.LabelGPUProduct, corev1.NodeSelectorOpIn, "H100").Toleration("gpu", corev1.TolerationOpExists, "", corev1.TaintEffectNoSchedule),
		"whole GPUs, sidecar and init container": builders.MakePod("w", "team").GPUs(2).CPU("1").
			InitContainer("init").CPU("4").SidecarContainer("proxy").CPU("250m").Memory("64Mi").
			Overhead(corev1.ResourceCPU, "100m").PodGroup("g").MinMember(4).Priority(50),
		"sets NVIDIA_VISIBLE_DEVICES": builders.MakePod("v", "team").GPUs(1).Env(api.EnvVisibleDevices, "all").Env("OTHER", "x"),
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			whole := busyPod(b)
			trimmed := busyPod(b)
			if _, err := trimObject(trimmed); err != nil {
				t.Fatal(err)
			}
			wantParsed, wantErr := podrequest.Parse(whole, podrequest.Options{})
			gotParsed, gotErr := podrequest.Parse(trimmed, podrequest.Options{})
			if d := cmp.Diff(wantParsed, gotParsed); d != "" {
				t.Errorf("parsed differently after trimming (-whole +trimmed):\n%s", d)
			}
			if (wantErr == nil) != (gotErr == nil) || (wantErr != nil && wantErr.Error() != gotErr.Error()) {
				t.Errorf("parse error %v after trimming, %v before", gotErr, wantErr)
			}
			if d := cmp.Diff(request.Parse(whole, request.Options{}).Demand(), request.Parse(trimmed, request.Options{}).Demand()); d != "" {
				t.Errorf("request model differs after trimming (-whole +trimmed):\n%s", d)
			}
			for what, kept := range map[string]bool{
				"managed fields":                   trimmed.ManagedFields == nil,
				"volumes":                          trimmed.Spec.Volumes == nil,
				"container image":                  trimmed.Spec.Containers[0].Image == "",
				"volume mounts":                    trimmed.Spec.Containers[0].VolumeMounts == nil,
				"probes":                           trimmed.Spec.Containers[0].LivenessProbe == nil,
				"container ports":                  len(trimmed.Spec.Containers[0].Ports) == 1 && trimmed.Spec.Containers[0].Ports[0].HostPort == 9090,
				"container status":                 trimmed.Status.ContainerStatuses == nil,
				"pod IP":                           trimmed.Status.PodIP == "" && trimmed.Status.PodIPs == nil,
				"phase kept":                       trimmed.Status.Phase == corev1.PodRunning,
				"PodScheduled kept, Ready dropped": len(trimmed.Status.Conditions) == 1 && trimmed.Status.Conditions[0].Type == corev1.PodScheduled,
				"security context dropped":         trimmed.Spec.SecurityContext == nil && trimmed.Status.StartTime == nil,
				"labels kept":                      cmp.Equal(trimmed.Labels, whole.Labels),
				"annotations kept":                 cmp.Equal(trimmed.Annotations, whole.Annotations),
				"affinity kept":                    cmp.Equal(trimmed.Spec.Affinity, whole.Spec.Affinity),
				"tolerations kept":                 cmp.Equal(trimmed.Spec.Tolerations, whole.Spec.Tolerations),
				"resources kept":                   cmp.Equal(trimmed.Spec.Containers[0].Resources, whole.Spec.Containers[0].Resources),
				"env values dropped": func() bool {
					for _, e := range trimmed.Spec.Containers[0].Env {
						if e.Value != "" {
							return false
						}
					}
					return len(trimmed.Spec.Containers[0].Env) == len(whole.Spec.Containers[0].Env)
				}(),
			} {
				if !kept {
					t.Errorf("%s: not as expected after trimming", what)
				}
			}
			again := trimmed.DeepCopy()
			if _, err := trimObject(again); err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(trimmed, again); d != "" {
				t.Errorf("trimming twice changed the pod (not idempotent):\n%s", d)
			}
		})
	}
}

// TestTrimObjectNodes: a node keeps all but its managed fields and images.
// TestTrimKeepsWhetherAFailedPodRan: the trim drops container states, but
// keeps of a failed pod what says whether it ran (predicates.NeverRan): a
// gang's member that ran and failed is not taken for one that never did,
// whose gang is rolled back. It stays idempotent.
func TestTrimKeepsWhetherAFailedPodRan(t *testing.T) {
	started := metav1.Unix(1_700_000_000, 0)
	for _, tc := range []struct {
		name     string
		phase    corev1.PodPhase
		statuses []corev1.ContainerStatus
		neverRan bool
	}{
		{"failed after it ran", corev1.PodFailed, []corev1.ContainerStatus{{Name: "main", Image: "img", ImageID: "sha", ContainerID: "c1", RestartCount: 2,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", Message: "boom", StartedAt: started, FinishedAt: started}}}}, false},
		{"failed after a restart", corev1.PodFailed, []corev1.ContainerStatus{{Name: "main",
			LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{StartedAt: started}},
			State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}}}, false},
		{"failed before it ran", corev1.PodFailed, []corev1.ContainerStatus{{Name: "main",
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := builders.MakePod("p", "default").GPUs(1).Obj()
			p.Status.Phase, p.Status.ContainerStatuses = tc.phase, tc.statuses
			if _, err := trimObject(p); err != nil {
				t.Fatal(err)
			}
			if got := predicates.NeverRan(p); got != tc.neverRan {
				t.Errorf("NeverRan after the trim = %v, want %v", got, tc.neverRan)
			}
			once := p.DeepCopy()
			if _, err := trimObject(p); err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(once, p); d != "" {
				t.Errorf("the trim is not idempotent (-once +twice):\n%s", d)
			}
			if cs := p.Status.ContainerStatuses; len(cs) != 1 || cs[0].Image != "" || cs[0].RestartCount != 0 ||
				cs[0].State.Terminated != nil && (cs[0].State.Terminated.Message != "" || cs[0].State.Terminated.ExitCode != 0) {
				t.Errorf("the trim kept more than the start of each container: %+v", cs)
			}
		})
	}
	running := builders.MakePod("r", "default").GPUs(1).Obj()
	running.Status.Phase = corev1.PodRunning
	running.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "main", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: started}}}}
	if _, err := trimObject(running); err != nil {
		t.Fatal(err)
	}
	if running.Status.ContainerStatuses != nil {
		t.Error("a running pod's container states were kept: every state change would be an update the cycles take")
	}
}

func TestTrimObjectNodes(t *testing.T) {
	n := builders.MakeNode("n1").Obj()
	n.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}
	n.Status.Images = []corev1.ContainerImage{{Names: []string{"registry/app:1"}, SizeBytes: 1 << 30}}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
		LastHeartbeatTime: metav1.Unix(1_700_000_100, 0), LastTransitionTime: metav1.Unix(1_700_000_000, 0)}}
	want := n.DeepCopy()
	want.ManagedFields, want.Status.Images = nil, nil
	want.Status.Conditions[0].LastHeartbeatTime = metav1.Time{}
	if _, err := trimObject(n); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(want, n); d != "" {
		t.Errorf("trimmed node (-want +got):\n%s", d)
	}
	// Objects of other kinds lose their managed fields only.
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team", Labels: map[string]string{"a": "b"}, ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "x"}}}}
	if _, err := trimObject(ns); err != nil || ns.ManagedFields != nil || ns.Labels["a"] != "b" {
		t.Errorf("namespace after trimming: %+v (err %v)", ns.ObjectMeta, err)
	}
	// Not an object (a tombstone): left as it is.
	tomb := "not an object"
	if got, err := trimObject(tomb); err != nil || got != tomb {
		t.Errorf("trimObject(%q) = %v, %v", tomb, got, err)
	}
}

// TestSharerSharesEqualParts: pods of one shape share their resource lists,
// labels, annotations and tolerations after the informers' transform, and
// every pod reads as trimObject alone leaves it; pods of another shape
// share nothing of what differs.
func TestSharerSharesEqualParts(t *testing.T) {
	s := newSharer()
	shape := func(name string, gpus int) *corev1.Pod {
		p := busyPod(builders.MakePod(name, "team").GPUs(gpus).CPU("1").Memory("1Gi").Queue("q").PodGroup("g").
			Toleration("gpu", corev1.TolerationOpExists, "", corev1.TaintEffectNoSchedule))
		p.Spec.SecurityContext = &corev1.PodSecurityContext{}
		return p
	}
	var pods []*corev1.Pod
	for i, gpus := range []int{1, 1, 2} {
		p := shape(fmt.Sprintf("p%d", i), gpus)
		want := p.DeepCopy()
		if _, err := trimObject(want); err != nil {
			t.Fatal(err)
		}
		if _, err := s.transform(p); err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(want, p); d != "" {
			t.Fatalf("pod %d reads differently once shared (-trimmed +shared):\n%s", i, d)
		}
		if p.Spec.SecurityContext != nil {
			t.Errorf("pod %d keeps its security context", i)
		}
		pods = append(pods, p)
	}
	same := func(a, b any) bool { return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer() }
	a, b, c := pods[0], pods[1], pods[2]
	for what, ok := range map[string]bool{
		"equal requests shared":      same(a.Spec.Containers[0].Resources.Requests, b.Spec.Containers[0].Resources.Requests),
		"equal limits shared":        same(a.Spec.Containers[0].Resources.Limits, b.Spec.Containers[0].Resources.Limits),
		"equal labels shared":        same(a.Labels, b.Labels) && same(a.Labels, c.Labels),
		"equal tolerations shared":   same(a.Spec.Tolerations, b.Spec.Tolerations),
		"shared list has no room":    cap(a.Spec.Tolerations) == len(a.Spec.Tolerations),
		"other requests not shared":  !same(a.Spec.Containers[0].Resources.Requests, c.Spec.Containers[0].Resources.Requests),
		"other limits not shared":    !same(a.Spec.Containers[0].Resources.Limits, c.Spec.Containers[0].Resources.Limits),
		"other requests read as own": c.Spec.Containers[0].Resources.Limits.Name(api.ResourceGPU, "").Value() == 2,
	} {
		if !ok {
			t.Errorf("%s: not so", what)
		}
	}
	// Appending to a shared list copies it: the other pods keep theirs.
	_ = append(a.Spec.Tolerations, corev1.Toleration{Key: "mine"})
	if n := len(b.Spec.Tolerations); n != 1 || b.Spec.Tolerations[0].Key != "gpu" {
		t.Errorf("another pod's tolerations changed: %+v", b.Spec.Tolerations)
	}
}

// TestSharerKeysDoNotCollide: lists whose fields run together alike (a
// label "ab"="c" and "a"="bc", a quantity 1 in two formats) are not taken
// for each other, and a full table starts again without losing anything.
func TestSharerKeysDoNotCollide(t *testing.T) {
	s := newSharer()
	s.mu.Lock()
	defer s.mu.Unlock()
	m1 := s.strMap(map[string]string{"ab": "c"})
	m2 := s.strMap(map[string]string{"a": "bc"})
	if m2["a"] != "bc" || m1["ab"] != "c" {
		t.Errorf("maps taken for each other: %v %v", m1, m2)
	}
	dec := corev1.ResourceList{corev1.ResourceMemory: *resource.NewQuantity(1, resource.DecimalSI)}
	bin := corev1.ResourceList{corev1.ResourceMemory: *resource.NewQuantity(1, resource.BinarySI)}
	if got := s.list(dec); got[corev1.ResourceMemory].Format != resource.DecimalSI {
		t.Errorf("first list not kept: %v", got)
	}
	if got := s.list(bin); got[corev1.ResourceMemory].Format != resource.BinarySI {
		t.Errorf("a list in another format was taken for the first: %v", got)
	}
	for i := range 2 * sharedMax {
		v := strconv.Itoa(i)
		if got := s.strMap(map[string]string{"k": v}); got["k"] != v {
			t.Fatalf("map %d read %v", i, got)
		}
	}
	if n := len(s.strMaps); n > sharedMax {
		t.Errorf("table holds %d maps, more than %d", n, sharedMax)
	}
	long := map[string]string{"k": strings.Repeat("x", sharedKeyMax)}
	if got := s.strMap(long); !reflect.DeepEqual(got, long) {
		t.Errorf("a long map changed: %d bytes", len(got["k"]))
	}
}

// TestSharerConcurrent: informers call the transform at once (run with -race).
func TestSharerConcurrent(t *testing.T) {
	s := newSharer()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				p := busyPod(builders.MakePod(fmt.Sprintf("p%d-%d", g, i), "team").Fraction(10 * (1 + i%5)).Queue("q"))
				if _, err := s.transform(p); err != nil {
					t.Error(err)
					return
				}
				if got := p.Spec.Containers[0].Resources.Limits.Name(api.ResourceFraction, "").Value(); got != int64(10*(1+i%5)) {
					t.Errorf("pod %s asks %d", p.Name, got)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func TestScheduledOnlyKeepsPodScheduledAndDisruptionTarget(t *testing.T) {
	cond := func(typ corev1.PodConditionType) corev1.PodCondition {
		return corev1.PodCondition{Type: typ, Status: corev1.ConditionTrue}
	}
	for _, tc := range []struct {
		name string
		in   []corev1.PodCondition
		want []corev1.PodConditionType
	}{
		{name: "none"},
		{name: "running", in: []corev1.PodCondition{cond(corev1.PodReady), cond(corev1.PodScheduled)}, want: []corev1.PodConditionType{corev1.PodScheduled}},
		{
			name: "deleted by the pod garbage collector",
			in:   []corev1.PodCondition{cond(corev1.PodReady), cond(corev1.PodScheduled), cond(corev1.DisruptionTarget)},
			want: []corev1.PodConditionType{corev1.PodScheduled, corev1.DisruptionTarget},
		},
		{name: "only kept ones", in: []corev1.PodCondition{cond(corev1.DisruptionTarget)}, want: []corev1.PodConditionType{corev1.DisruptionTarget}},
		{name: "only dropped ones", in: []corev1.PodCondition{cond(corev1.PodReady)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []corev1.PodConditionType
			for _, c := range scheduledOnly(tc.in) {
				got = append(got, c.Type)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("conditions kept (-want +got):\n%s", d)
			}
		})
	}
}

// TestChangedIgnoresWhatTrimDrops: an update that changes only what
// trimObject drops (a node's heartbeat, a container's state) or the
// resourceVersion is no change; anything the coordinator reads is.
func TestChangedIgnoresWhatTrimDrops(t *testing.T) {
	node := func(edit func(n *corev1.Node)) *corev1.Node {
		n := builders.MakeNode("n1").GPUs(8).Obj()
		n.ResourceVersion = "1"
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
			LastHeartbeatTime: metav1.Unix(1_700_000_100, 0), LastTransitionTime: metav1.Unix(1_700_000_000, 0)}}
		if edit != nil {
			edit(n)
		}
		if _, err := trimObject(n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	pod := func(edit func(p *corev1.Pod)) *corev1.Pod {
		p := builders.MakePod("p", "default").GPUs(1).Obj()
		p.ResourceVersion = "1"
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "main", RestartCount: 0}}
		if edit != nil {
			edit(p)
		}
		if _, err := trimObject(p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name     string
		old, cur any
		want     bool
	}{
		{"node heartbeat", node(nil), node(func(n *corev1.Node) {
			n.ResourceVersion = "2"
			n.Status.Conditions[0].LastHeartbeatTime = metav1.Unix(1_700_000_400, 0)
		}), false},
		{"node resync", node(nil), node(nil), false},
		{"node not ready", node(nil), node(func(n *corev1.Node) {
			n.ResourceVersion = "2"
			n.Status.Conditions[0].Status = corev1.ConditionFalse
		}), true},
		{"node taint", node(nil), node(func(n *corev1.Node) {
			n.ResourceVersion = "2"
			n.Spec.Taints = []corev1.Taint{{Key: "k", Effect: corev1.TaintEffectNoSchedule}}
		}), true},
		{"node label", node(nil), node(func(n *corev1.Node) { n.Labels["x"] = "y" }), true},
		{"node allocatable", node(nil), node(func(n *corev1.Node) { n.Status.Allocatable[api.ResourceGPU] = resource.MustParse("7") }), true},
		{"pod container restarted", pod(nil), pod(func(p *corev1.Pod) {
			p.ResourceVersion = "2"
			p.Status.ContainerStatuses[0].RestartCount = 1
		}), false},
		{"pod bound", pod(nil), pod(func(p *corev1.Pod) {
			p.ResourceVersion = "2"
			p.Spec.NodeName = "n1"
		}), true},
		{"pod succeeded", pod(nil), pod(func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }), true},
		{"other kinds", &corev1.Namespace{}, &corev1.Namespace{}, true},
	} {
		if got := changed(tc.old, tc.cur); got != tc.want {
			t.Errorf("%s: changed = %v, want %v", tc.name, got, tc.want)
		}
	}
}
