package agent

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	k8sresource "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/config"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
	"github.com/gpufrac/gpufrac/tests/kubeletsim"
)

// The tests in this file run gpufrac-node's defence-in-depth rules with no
// admission policy in front of it: every pod here is one a tenant could
// create where the policies were skipped.

// tenantPod is a pod a tenant wrote: bound to this node by spec.nodeName,
// with the scheduler name and annotations it chose.
func tenantPod(name, scheduler string, annotations map[string]string, c corev1.Container) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: name, UID: types.UID("uid-" + name), Annotations: annotations,
			CreationTimestamp: metav1.NewTime(time.Now())},
		Spec:   corev1.PodSpec{NodeName: nodeName, SchedulerName: scheduler, Containers: []corev1.Container{c}},
		Status: corev1.PodStatus{Phase: corev1.PodPending},
	}
}

func asks(name string, res corev1.ResourceName, n int64) corev1.Container {
	return corev1.Container{Name: name, Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
		res: *k8sresource.NewQuantity(n, k8sresource.DecimalSI)}}}
}

// waitForPods waits until the agent's pod informer shows every pod.
func (e *env) waitForPods(ps ...*corev1.Pod) {
	e.t.Helper()
	e.poll("the pods in the agent's informer", func() bool {
		if e.agent.hint == nil || !e.agent.hint.HasSynced() {
			return false
		}
		for _, p := range ps {
			if _, ok := e.agent.hint.Pod(p.Namespace, p.Name); !ok {
				return false
			}
		}
		return true
	})
}

// TestSpoofedHintOntoAVictimsGPU is issue 12's attack on gpufrac-node with
// no admission policy: a victim holds a GPU whole; a tenant's pod sets
// spec.nodeName, its own gpufrac.io/gpu naming the victim's GPU and asks 10
// units - with the default scheduler's name, and dressed with the
// coordinator's. The fraction never lands on the victim's GPU, and the
// victim's GPU carries no units.
func TestSpoofedHintOntoAVictimsGPU(t *testing.T) {
	for _, scheduler := range []string{"default-scheduler", api.SchedulerName} {
		t.Run(scheduler, func(t *testing.T) {
			victim := tenantPod("victim", "default-scheduler", nil, asks("main", api.ResourceGPU, 1))
			e := startAgent(t, fractionConfig, victim)
			e.waitServed("the whole and fraction resources", map[string]served{
				api.ResourceGPU:      {Healthy: 8, Connected: true, Registrations: 1},
				api.ResourceFraction: {Healthy: 800, Connected: true, Registrations: 1},
			})
			v, err := e.kubelet.Allocate(e.ctx, podRef(victim), "main", api.ResourceGPU, 1)
			if err != nil {
				t.Fatal(err)
			}
			target := v.DeviceIDs[0]
			attacker := tenantPod("attacker", scheduler, map[string]string{api.AnnotationGPU: target}, asks("main", api.ResourceFraction, 10))
			if _, err := e.client.CoreV1().Pods("tenant").Create(e.ctx, attacker, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			e.waitForPods(victim, attacker)
			a, err := e.kubelet.Allocate(e.ctx, podRef(attacker), "main", api.ResourceFraction, 10)
			if err != nil {
				t.Fatalf("the attacker's fraction was refused outright (%v); it should go by best fit elsewhere", err)
			}
			got, err := resource.GPUOfUnits(a.DeviceIDs)
			if err != nil {
				t.Fatal(err)
			}
			if got == target {
				t.Fatalf("the spoofed fraction landed on the victim's GPU %s", target)
			}
			if a.Response.Envs[api.EnvVisibleDevices] != "void" {
				t.Errorf("%s = %q, want void", api.EnvVisibleDevices, a.Response.Envs[api.EnvVisibleDevices])
			}
			for _, alloc := range e.kubelet.Allocations() {
				if alloc.Resource != api.ResourceFraction {
					continue
				}
				if g, _ := resource.GPUOfUnits(alloc.DeviceIDs); g == target {
					t.Errorf("units on the victim's GPU: %+v", alloc)
				}
			}
		})
	}
}

// TestWholeGPUAfterFractions: once every GPU carries a fraction, a
// whole-GPU pod is refused with a clear reason instead of being handed a
// shared GPU; with one clean GPU left it gets that one.
func TestWholeGPUAfterFractions(t *testing.T) {
	e := startAgent(t, fractionConfig)
	e.waitServed("the whole and fraction resources", map[string]served{
		api.ResourceGPU:      {Healthy: 8, Connected: true, Registrations: 1},
		api.ResourceFraction: {Healthy: 800, Connected: true, Registrations: 1},
	})
	e.poll("the pod informer to sync", func() bool { return e.agent.hint != nil && e.agent.hint.HasSynced() })
	// Fractions of 60 never share a GPU: seven of them take seven GPUs.
	shared := map[string]bool{}
	for i := range 7 {
		p := kubeletsim.PodRef{Namespace: "tenant", Name: fmt.Sprintf("frac-%d", i), UID: types.UID(fmt.Sprintf("uid-frac-%d", i))}
		a, err := e.kubelet.Allocate(e.ctx, p, "main", api.ResourceFraction, 60)
		if err != nil {
			t.Fatal(err)
		}
		g, _ := resource.GPUOfUnits(a.DeviceIDs)
		shared[g] = true
	}
	if len(shared) != 7 {
		t.Fatalf("seven 60%% fractions took %d GPUs", len(shared))
	}
	one, err := e.kubelet.Allocate(e.ctx, kubeletsim.PodRef{Namespace: "tenant", Name: "one", UID: "uid-one"}, "main", api.ResourceGPU, 1)
	if err != nil {
		t.Fatalf("a one-GPU pod with one clean GPU left: %v", err)
	}
	if shared[one.DeviceIDs[0]] {
		t.Fatalf("the one-GPU pod got %s, which carries a fraction", one.DeviceIDs[0])
	}
	_, err = e.kubelet.Allocate(e.ctx, kubeletsim.PodRef{Namespace: "tenant", Name: "two", UID: "uid-two"}, "main", api.ResourceGPU, 1)
	var pe *kubeletsim.PluginError
	if !errors.As(err, &pe) || !strings.Contains(pe.Message(), "carry no fractions or time-sliced replicas") {
		t.Fatalf("a whole GPU with only shared GPUs free: error = %v, want the plugin's refusal", err)
	}
	t.Logf("refusal: %s", pe.Message())
}

// TestInitContainerFractionRefused: a pod asking a fraction in an init
// container is refused at admission with the reason, naming the pod.
func TestInitContainerFractionRefused(t *testing.T) {
	p := tenantPod("init-frac", "default-scheduler", nil, asks("main", corev1.ResourceCPU, 1))
	p.Spec.InitContainers = []corev1.Container{asks("setup", api.ResourceFraction, 20)}
	e := startAgent(t, fractionConfig, p)
	e.waitServed("the whole and fraction resources", map[string]served{
		api.ResourceGPU:      {Healthy: 8, Connected: true, Registrations: 1},
		api.ResourceFraction: {Healthy: 800, Connected: true, Registrations: 1},
	})
	e.waitForPods(p)
	_, err := e.kubelet.Allocate(e.ctx, podRef(p), "setup", api.ResourceFraction, 20)
	var pe *kubeletsim.PluginError
	if !errors.As(err, &pe) || !strings.Contains(pe.Message(), "tenant/init-frac asks 20 units in an init container") ||
		!strings.Contains(pe.Message(), "served to app containers only") {
		t.Fatalf("init container's fraction: error = %v, want a refusal naming the pod", err)
	}
	if n := len(e.kubelet.Allocations()); n != 0 {
		t.Errorf("%d allocations after the refusal", n)
	}
}

// TestInvalidConfigAtStartFailsClosed: an invalid config at start serves
// whole GPUs only (no fractions), says why in a metric, a Node event and a
// Node annotation, and a valid config later brings the fractions back and
// clears the annotation.
func TestInvalidConfigAtStartFailsClosed(t *testing.T) {
	e := startAgent(t, "version: v1\ndefault:\n  mode: turbo\n")
	e.waitServed("whole GPUs only", map[string]served{
		api.ResourceGPU: {Healthy: 8, Connected: true, Registrations: 1},
	})
	e.poll("the fail-closed event", func() bool {
		for _, ev := range e.nodeEvents() {
			if strings.HasPrefix(ev, "Warning GPUConfigRejected: gpufrac-node fails closed: it serves whole GPUs only") && strings.Contains(ev, "turbo") {
				return true
			}
		}
		return false
	})
	if got := e.nodeAnnotation(api.AnnotationConfigError); !strings.Contains(got, "turbo") {
		t.Errorf("Node annotation %s = %q, want the reason", api.AnnotationConfigError, got)
	}
	e.checkGauge("gpufrac_config_fail_closed", 1)
	if got := e.nodeAnnotation(api.AnnotationGPUInventory); !strings.Contains(got, `"mode":"exclusive"`) || strings.Contains(got, `"mode":"fraction"`) {
		t.Errorf("inventory while failing closed = %s, want every GPU exclusive", got)
	}

	e.writeConfig(fractionConfig)
	e.waitServed("the fraction config", map[string]served{
		api.ResourceGPU:      {Healthy: 8, Connected: true, Registrations: 1},
		api.ResourceFraction: {Healthy: 800, Connected: true, Registrations: 1},
	})
	e.poll("the annotation removed", func() bool { return e.nodeAnnotation(api.AnnotationConfigError) == "" })
	e.poll("the recovery event", func() bool {
		for _, ev := range e.nodeEvents() {
			if strings.HasPrefix(ev, "Normal GPUConfigApplied: ") {
				return true
			}
		}
		return false
	})
	e.checkGauge("gpufrac_config_fail_closed", 0)
}

// nodeAnnotation reads an annotation of this Node from the fake API.
func (e *env) nodeAnnotation(key string) string {
	e.t.Helper()
	n, err := e.client.CoreV1().Nodes().Get(e.ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return n.Annotations[key]
}

// checkGauge compares a gauge of the agent's registry.
func (e *env) checkGauge(name string, want float64) {
	e.t.Helper()
	want0 := fmt.Sprintf("# HELP %[1]s %[2]s\n# TYPE %[1]s gauge\n%[1]s %[3]g\n", name, gaugeHelp(e, name), want)
	if err := testutil.GatherAndCompare(e.agent.Registry(), strings.NewReader(want0), name); err != nil {
		e.t.Errorf("%s: %v", name, err)
	}
}

// gaugeHelp returns the help text the registry has for name.
func gaugeHelp(e *env, name string) string {
	mfs, err := e.agent.Registry().Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetHelp()
		}
	}
	e.t.Fatalf("metric %s not registered", name)
	return ""
}

// TestFailClosedWhenTheNodeCannotBePatched: the API server refuses the
// first writes of the Node's annotations (the config error, the GPU
// inventory): the node still fails closed, the event and the metric say why
// at once, and the annotations are written once the API server takes them
// - not only at the next change, which may never come.
func TestFailClosedWhenTheNodeCannotBePatched(t *testing.T) {
	var refusedError, refusedInventory atomic.Int32
	e := startAgentFull(t, "version: v1\ndefault:\n  mode: turbo\n", func(c *fake.Clientset) {
		c.PrependReactor("patch", "nodes", func(action clienttesting.Action) (bool, runtime.Object, error) {
			patch := string(action.(clienttesting.PatchAction).GetPatch())
			if strings.Contains(patch, api.AnnotationConfigError) && refusedError.CompareAndSwap(0, 1) {
				return true, nil, errors.New("the API server refused the patch")
			}
			if strings.Contains(patch, api.AnnotationGPUInventory) && refusedInventory.CompareAndSwap(0, 1) {
				return true, nil, errors.New("the API server refused the patch")
			}
			return false, nil, nil
		})
	}, func(c *Config) { c.NodeResyncInterval = 100 * time.Millisecond })
	e.waitServed("whole GPUs only", map[string]served{
		api.ResourceGPU: {Healthy: 8, Connected: true, Registrations: 1},
	})
	e.poll("the fail-closed event", func() bool {
		for _, ev := range e.nodeEvents() {
			if strings.HasPrefix(ev, "Warning GPUConfigRejected: gpufrac-node fails closed") {
				return true
			}
		}
		return false
	})
	e.checkGauge("gpufrac_config_fail_closed", 1)
	e.poll("the config error written after the refused patch", func() bool {
		return refusedError.Load() == 1 && strings.Contains(e.nodeAnnotation(api.AnnotationConfigError), "turbo")
	})
	e.poll("the inventory written after the refused patch", func() bool {
		return refusedInventory.Load() == 1 && strings.Contains(e.nodeAnnotation(api.AnnotationGPUInventory), `"mode":"exclusive"`)
	})
}

// TestNodeLabelsUnreadableAtStartFailClosed: the admin's config shares
// GPUs as fractions by default and time-slices the nodes of pool "sliced".
// This node is in that pool, and the API server does not answer when
// gpufrac-node reads its labels at start. Without them no group matches, and
// the default (fractions) would be served on a node its admin configured
// otherwise: instead the node fails closed (whole GPUs only), says why, and
// applies its group's config once the labels can be read.
func TestNodeLabelsUnreadableAtStartFailClosed(t *testing.T) {
	const config = "version: v1\ndefault:\n  mode: fraction\ngroups:\n  - nodeSelector: {gpufrac.io/pool: sliced}\n    mode: timeslice\n"
	var refusing atomic.Bool
	refusing.Store(true)
	sliced := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, Labels: map[string]string{"gpufrac.io/pool": "sliced"}}}
	e := startAgentWith(t, config, func(c *fake.Clientset) {
		if err := c.Tracker().Update(corev1.SchemeGroupVersion.WithResource("nodes"), sliced, ""); err != nil {
			t.Fatal(err)
		}
		c.PrependReactor("get", "nodes", func(clienttesting.Action) (bool, runtime.Object, error) {
			if refusing.Load() {
				return true, nil, errors.New("the API server is not answering")
			}
			return false, nil, nil
		})
	})
	e.waitServed("whole GPUs only while the node's group is unknown", map[string]served{
		api.ResourceGPU: {Healthy: 8, Connected: true, Registrations: 1},
	})
	e.poll("the fail-closed event naming the labels", func() bool {
		for _, ev := range e.nodeEvents() {
			if strings.HasPrefix(ev, "Warning GPUConfigRejected: gpufrac-node fails closed") && strings.Contains(ev, "labels") {
				return true
			}
		}
		return false
	})
	if want := map[string]served{api.ResourceGPU: {Healthy: 8, Connected: true, Registrations: 1}}; !cmp.Equal(want, e.served()) {
		t.Fatalf("served while the node's group is unknown (-want +got):\n%s", cmp.Diff(want, e.served()))
	}
	e.checkGauge("gpufrac_config_fail_closed", 1)
	refusing.Store(false)
	e.waitServed("the sliced group's config", map[string]served{
		api.ResourceGPU:              {Healthy: 0, Connected: false, Registrations: 1},
		api.DefaultTimesliceResource: {Healthy: 32, Connected: true, Registrations: 1},
	})
	e.poll("the config error removed", func() bool { return e.nodeAnnotation(api.AnnotationConfigError) == "" })
	e.checkGauge("gpufrac_config_fail_closed", 0)
}

// TestNodeLabelsReadLatePutNodeInModeDRA: the node's group serves it through
// DRA, but its labels could not be read at start, so gpufrac-node chose the
// device plugins and failed closed. Once the labels are read it does not
// serve the DRA node's config through device plugins (fractions where the
// admin asked for DRA, the GPUs offered twice after a restart): it stays
// closed, whole GPUs only, and says a restart is needed.
func TestNodeLabelsReadLatePutNodeInModeDRA(t *testing.T) {
	const config = "version: v1\ndefault:\n  mode: fraction\ngroups:\n  - nodeSelector: {gpufrac.io/pool: dra}\n    mode: dra\n"
	var refusing atomic.Bool
	refusing.Store(true)
	draNode := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, Labels: map[string]string{"gpufrac.io/pool": "dra"}}}
	var gets atomic.Int32
	e := startAgentWith(t, config, func(c *fake.Clientset) {
		if err := c.Tracker().Update(corev1.SchemeGroupVersion.WithResource("nodes"), draNode, ""); err != nil {
			t.Fatal(err)
		}
		c.PrependReactor("get", "nodes", func(clienttesting.Action) (bool, runtime.Object, error) {
			if refusing.Load() {
				return true, nil, errors.New("the API server is not answering")
			}
			gets.Add(1)
			return false, nil, nil
		})
	})
	whole := map[string]served{api.ResourceGPU: {Healthy: 8, Connected: true, Registrations: 1}}
	e.waitServed("whole GPUs only while the node's group is unknown", whole)
	refusing.Store(false)
	e.poll("the restart named once the labels are read", func() bool {
		for _, ev := range e.nodeEvents() {
			if strings.HasPrefix(ev, "Warning GPUConfigRejected: gpufrac-node fails closed") && strings.Contains(ev, "needs a restart") {
				return true
			}
		}
		return false
	})
	if gets.Load() == 0 {
		t.Fatal("the labels were never read")
	}
	if got := e.served(); !cmp.Equal(whole, got) {
		t.Fatalf("served once the labels put the node in mode dra (-want +got):\n%s", cmp.Diff(whole, got))
	}
	e.checkGauge("gpufrac_config_fail_closed", 1)
	if got := e.nodeAnnotation(api.AnnotationConfigError); !strings.Contains(got, "needs a restart") {
		t.Fatalf("config error annotation %q does not say a restart is needed", got)
	}
}

// TestFailClosedDRA: a node in mode dra that fails closed (a config with
// node groups waiting for its labels) publishes every GPU whole through
// DRA: it stays on the serving path chosen at start, nothing shared.
func TestFailClosedDRA(t *testing.T) {
	np, err := failClosedDRA.Resolve(nil, 4)
	if err != nil {
		t.Fatal(err)
	}
	if !np.DRA {
		t.Fatal("failing closed in mode dra left DRA")
	}
	for i, m := range np.GPUModes {
		if m != config.ModeExclusive {
			t.Errorf("GPU %d published as %q, want exclusive", i, m)
		}
	}
	if len(np.GPUModes) != 4 {
		t.Errorf("%d GPU modes, want 4", len(np.GPUModes))
	}
}
