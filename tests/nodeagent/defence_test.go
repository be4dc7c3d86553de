package nodeagent

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
	"github.com/gpufrac/gpufrac/tests/builders"
	"github.com/gpufrac/gpufrac/tests/cluster"
	"github.com/gpufrac/gpufrac/tests/kubeletsim"
)

// TestDefenceInDepthWithoutPolicies runs the real gpufrac-node against a
// real API server with no gpufrac admission policy installed, and admits
// tenants' pods through the kubelet simulator:
//
//  1. issue 12's attack: a pod with spec.nodeName, its own gpufrac.io/gpu
//     naming the GPU another pod holds whole, the coordinator's scheduler
//     name and a 10% fraction. The fraction goes elsewhere, and the
//     write-back records where it went;
//  2. a whole-GPU pod once every free GPU carries a fraction: refused at
//     admission with gpufrac-node's reason;
//  3. a fraction in an init container: refused at admission, naming the pod.
//
// Every Allocate answer carries NVIDIA_VISIBLE_DEVICES=void.
func TestDefenceInDepthWithoutPolicies(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the local control plane (make tools)")
	}
	// The test bed installs gpufrac's admission policies by default; this
	// test is about a node without them.
	c := cluster.StartForTest(t, cluster.Options{NoAdmissionPolicies: true})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	// A Node object no kwok manages: pods bound to it stay Pending, as on a
	// node whose kubelet has not started them yet.
	if _, err := c.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	n := startNode(t, nodeOptions{extraArgs: []string{"--kubeconfig=" + c.KubeconfigPath, "--allow-standalone=false"}})
	n.waitResource(api.ResourceGPU, "8 healthy GPUs", registered(8))
	n.waitResource(api.ResourceFraction, "800 healthy units", registered(800))

	create := func(p *corev1.Pod) kubeletsim.PodRef {
		t.Helper()
		got, err := c.Client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return kubeletsim.PodRef{Namespace: got.Namespace, Name: got.Name, UID: got.UID}
	}
	admit := func(p kubeletsim.PodRef, container, res string, count int) (*kubeletsim.Allocation, error) {
		t.Helper()
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		a, err := n.kubelet.Allocate(actx, p, container, res, count)
		if err == nil && a.Response.Envs[api.EnvVisibleDevices] != "void" {
			t.Errorf("%s %s: %s = %q, want void", p, res, api.EnvVisibleDevices, a.Response.Envs[api.EnvVisibleDevices])
		}
		return a, err
	}
	annotation := func(p kubeletsim.PodRef, key string) func(context.Context) (bool, error) {
		return func(ctx context.Context) (bool, error) {
			got, err := c.Client.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
			return err == nil && got.Annotations[key] != "", nil
		}
	}

	// 1. The victim holds a GPU whole; gpufrac-node writes it back, which
	// also shows it watches the pods of its node through the API.
	victim := create(builders.MakePod("victim", "default").SchedulerName("default-scheduler").Node("node-a").GPUs(1).Obj())
	v, err := admit(victim, "main", api.ResourceGPU, 1)
	if err != nil {
		t.Fatal(err)
	}
	target := v.DeviceIDs[0]
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 20*time.Second, true, annotation(victim, api.AnnotationAllocatedGPU)); err != nil {
		t.Fatalf("the victim's GPU was never written back: %v\n%s", err, n.log.String())
	}
	attacker := create(builders.MakePod("attacker", "default").Node("node-a").Fraction(10).
		Annotation(api.AnnotationGPU, target).Obj())
	a, err := admit(attacker, "main", api.ResourceFraction, 10)
	if err != nil {
		t.Fatalf("the attacker's fraction was refused (%v); it should go by best fit elsewhere", err)
	}
	got, err := resource.GPUOfUnits(a.DeviceIDs)
	if err != nil {
		t.Fatal(err)
	}
	if got == target {
		t.Fatalf("the spoofed fraction landed on the victim's GPU %s", target)
	}
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 20*time.Second, true, annotation(attacker, api.AnnotationAllocatedGPU)); err != nil {
		t.Fatalf("the attacker's GPU was never written back: %v", err)
	}
	p, err := c.Client.CoreV1().Pods("default").Get(ctx, "attacker", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if w := p.Annotations[api.AnnotationAllocatedGPU]; w != got {
		t.Errorf("attacker's allocated-gpu = %s, want %s, the GPU it holds", w, got)
	}

	// 2. Fractions of 60 on every other GPU (the first shares the
	// attacker's); then no free GPU is clean.
	for i := range 7 {
		ref := create(builders.MakePod("frac-"+string(rune('a'+i)), "default").SchedulerName("default-scheduler").Node("node-a").Fraction(60).Obj())
		if _, err := admit(ref, "main", api.ResourceFraction, 60); err != nil {
			t.Fatalf("fraction %d: %v", i, err)
		}
	}
	whole := create(builders.MakePod("trainer", "default").SchedulerName("default-scheduler").Node("node-a").GPUs(1).Obj())
	_, err = admit(whole, "main", api.ResourceGPU, 1)
	var pe *kubeletsim.PluginError
	if !errors.As(err, &pe) || !strings.Contains(pe.Message(), "carry no fractions or time-sliced replicas") {
		t.Fatalf("a whole GPU with only shared GPUs free: error = %v, want gpufrac-node's refusal", err)
	}
	t.Logf("whole GPU refused: %s", pe.Message())

	// 3. A fraction in an init container.
	initPod := create(builders.MakePod("init-frac", "default").SchedulerName("default-scheduler").Node("node-a").
		InitContainer("setup").Fraction(5).Obj())
	_, refusal := admit(initPod, "setup", api.ResourceFraction, 5)
	if !errors.As(refusal, &pe) || !strings.Contains(pe.Message(), "default/init-frac asks 5 units in an init container") {
		t.Fatalf("init container's fraction: error = %v, want gpufrac-node's refusal naming the pod", refusal)
	}
	t.Logf("init container's fraction refused: %s", pe.Message())
}

// TestInvalidConfigAtStartFailsClosed runs the real gpufrac-node with an
// invalid config: it serves whole GPUs only (no fractions), says why in its
// log and metrics, and a valid config afterwards brings the fractions back.
func TestInvalidConfigAtStartFailsClosed(t *testing.T) {
	n := startNode(t, nodeOptions{config: "version: v1\ndefault:\n  mode: frac\n"})
	n.waitResource(api.ResourceGPU, "8 whole GPUs", registered(8))
	n.waitValue("gpufrac_config_fail_closed", 1)
	if _, ok := n.kubelet.Resource(api.ResourceFraction); ok {
		t.Fatal("the fraction resource is served although the config at start was invalid")
	}
	if got := n.metricValue(`gpufrac_config_reloads_total{result="rejected"}`); got < 1 {
		t.Errorf("rejected loads = %v, want at least 1", got)
	}
	if !strings.Contains(n.log.String(), "Config unusable at start; failing closed") {
		t.Error("the log does not say the node fails closed")
	}
	a := n.allocate(pod("trainer"), api.ResourceGPU, 1)
	if a.Response.Envs[api.EnvVisibleDevices] != "void" {
		t.Errorf("whole GPU while failing closed: %s = %q", api.EnvVisibleDevices, a.Response.Envs[api.EnvVisibleDevices])
	}

	n.writeConfig(fractionConfig)
	n.waitResource(api.ResourceFraction, "800 units once the config is valid", registered(800))
	n.waitValue("gpufrac_config_fail_closed", 0)
}
