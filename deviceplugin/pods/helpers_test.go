package pods

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	k8sresource "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpufrac/gpufrac/api"
)

const node = "node-a"

var (
	podsGVR = corev1.SchemeGroupVersion.WithResource("pods")
	podsGVK = corev1.SchemeGroupVersion.WithKind("Pod")
	t0      = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
)

// fakeClient is a fake clientset whose pod list and watch honour field
// selectors on spec.nodeName as the API server does (the plain fake ignores
// them), and which records the field selectors asked for.
type fakeClient struct {
	*fake.Clientset

	mu        sync.Mutex
	selectors []string      // field selectors of pod lists and watches, in order
	watching  chan struct{} // closed when the first pod watch is open
	once      sync.Once
}

func newFakeClient(objs ...runtime.Object) *fakeClient {
	c := &fakeClient{Clientset: fake.NewClientset(objs...), watching: make(chan struct{})}
	c.PrependReactor("list", "pods", func(action clienttesting.Action) (bool, runtime.Object, error) {
		la := action.(clienttesting.ListAction)
		sel := la.GetListRestrictions().Fields
		c.record(sel)
		obj, err := c.Tracker().List(podsGVR, podsGVK, la.GetNamespace())
		if err != nil {
			return true, nil, err
		}
		list := obj.(*corev1.PodList)
		kept := list.Items[:0]
		for _, p := range list.Items {
			if matchesNode(sel, &p) {
				kept = append(kept, p)
			}
		}
		list.Items = kept
		return true, list, nil
	})
	c.PrependWatchReactor("pods", func(action clienttesting.Action) (bool, watch.Interface, error) {
		wa := action.(clienttesting.WatchActionImpl)
		sel := wa.WatchRestrictions.Fields
		c.record(sel)
		w, err := c.Tracker().Watch(podsGVR, wa.GetNamespace())
		if err != nil {
			return true, nil, err
		}
		c.once.Do(func() { close(c.watching) })
		return true, watch.Filter(w, func(ev watch.Event) (watch.Event, bool) {
			p, ok := ev.Object.(*corev1.Pod)
			return ev, !ok || matchesNode(sel, p)
		}), nil
	})
	return c
}

func (c *fakeClient) record(sel fields.Selector) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := ""
	if sel != nil {
		s = sel.String()
	}
	c.selectors = append(c.selectors, s)
}

func matchesNode(sel fields.Selector, p *corev1.Pod) bool {
	return sel == nil || sel.Matches(fields.Set{"spec.nodeName": p.Spec.NodeName})
}

// patches returns the pod patches sent, as "namespace/name".
func (c *fakeClient) patches() []string {
	var out []string
	for _, a := range c.Actions() {
		if pa, ok := a.(clienttesting.PatchAction); ok && a.GetResource() == podsGVR {
			out = append(out, pa.GetNamespace()+"/"+pa.GetName())
		}
	}
	return out
}

// annotations returns the gpufrac annotations of every pod in the fake API
// ("namespace/name" -> key -> value), pods without any left out.
func (c *fakeClient) annotations(t *testing.T) map[string]map[string]string {
	t.Helper()
	list, err := c.CoreV1().Pods("").List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]string{}
	for _, p := range list.Items {
		for k, v := range p.Annotations {
			if k == api.AnnotationGPU || k == api.AnnotationAllocatedGPU || k == api.AnnotationReservedGPU {
				if out[p.Namespace+"/"+p.Name] == nil {
					out[p.Namespace+"/"+p.Name] = map[string]string{}
				}
				out[p.Namespace+"/"+p.Name][k] = v
			}
		}
	}
	return out
}

// podBuilder builds pods for the tests.
type podBuilder struct{ p *corev1.Pod }

func makePod(namespace, name string) *podBuilder {
	return &podBuilder{p: &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: namespace, Name: name, UID: types.UID(namespace + "-" + name),
			CreationTimestamp: metav1.NewTime(t0),
		},
		// The coordinator's pods: their gpufrac.io/gpu is read.
		Spec:   corev1.PodSpec{NodeName: node, SchedulerName: api.SchedulerName},
		Status: corev1.PodStatus{Phase: corev1.PodPending},
	}}
}

// fraction adds a container asking for units fraction units (as a limit).
func (b *podBuilder) fraction(container string, units int) *podBuilder {
	q := *k8sresource.NewQuantity(int64(units), k8sresource.DecimalSI)
	b.p.Spec.Containers = append(b.p.Spec.Containers, corev1.Container{Name: container,
		Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{api.ResourceFraction: q}}})
	return b
}

// plain adds a container without GPU resources.
func (b *podBuilder) plain(container string) *podBuilder {
	b.p.Spec.Containers = append(b.p.Spec.Containers, corev1.Container{Name: container})
	return b
}

func (b *podBuilder) gpu(uuid string) *podBuilder { return b.annotate(api.AnnotationGPU, uuid) }

func (b *podBuilder) annotate(k, v string) *podBuilder {
	if b.p.Annotations == nil {
		b.p.Annotations = map[string]string{}
	}
	b.p.Annotations[k] = v
	return b
}

func (b *podBuilder) age(d time.Duration) *podBuilder {
	b.p.CreationTimestamp = metav1.NewTime(t0.Add(-d))
	return b
}

func (b *podBuilder) phase(p corev1.PodPhase) *podBuilder {
	b.p.Status.Phase = p
	return b
}

// scheduler sets spec.schedulerName (default: the coordinator's).
func (b *podBuilder) scheduler(name string) *podBuilder {
	b.p.Spec.SchedulerName = name
	return b
}

// initFraction adds an init container asking for units fraction units.
func (b *podBuilder) initFraction(container string, units int) *podBuilder {
	q := *k8sresource.NewQuantity(int64(units), k8sresource.DecimalSI)
	b.p.Spec.InitContainers = append(b.p.Spec.InitContainers, corev1.Container{Name: container,
		Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{api.ResourceFraction: q}}})
	return b
}

func (b *podBuilder) on(n string) *podBuilder {
	b.p.Spec.NodeName = n
	return b
}

func (b *podBuilder) obj() *corev1.Pod { return b.p }

// testContext carries a logger writing to t.Log and ends with the test.
func testContext(t *testing.T) context.Context {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// startInformer runs h's pod informer (not the write-back loop) until the
// test ends and waits until it has synced and its watch is open, so later
// changes reach the cache.
func startInformer(t *testing.T, ctx context.Context, h *Hint, c *fakeClient) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); h.pods.informer.RunWithContext(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	if !cache.WaitForCacheSync(ctx.Done(), h.HasSynced) {
		t.Fatal("pod informer did not sync")
	}
	select {
	case <-c.watching:
	case <-ctx.Done():
		t.Fatal("pod informer never opened its watch")
	}
}

// eventually polls cond every 10ms until it holds or ctx ends.
func eventually(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-tick.C:
		}
	}
}

// shortDir is a temp dir short enough for unix sockets (108 bytes).
func shortDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("", "pods")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// runHint runs h (informer and write-back loop) until the test ends, and
// fails the test if Run returns an error.
func runHint(t *testing.T, ctx context.Context, h *Hint) {
	t.Helper()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- h.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}
