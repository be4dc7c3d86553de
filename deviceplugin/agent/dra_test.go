package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	k8sresource "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/tests/builders"
	"github.com/gpufrac/gpufrac/tests/kubeletsim"
)

// fakeClaims reads claims for the kubelet simulator from the fake API server.
type fakeClaims struct{ cs *fake.Clientset }

func (f fakeClaims) GetClaim(ctx context.Context, ns, name string) (*resourceapi.ResourceClaim, error) {
	return f.cs.ResourceV1().ResourceClaims(ns).Get(ctx, name, metav1.GetOptions{})
}

// draFractions puts every GPU in mode dra with the fraction views.
const draFractions = "version: v1\ndefault:\n  mode: dra\n"

// draGPU7Exclusive is draFractions with GPU 7 published whole only.
const draGPU7Exclusive = "version: v1\ndefault:\n  mode: dra\n  gpus: [{indices: \"7\", mode: exclusive}]\n"

// withNodeUID gives the fake API server's Node uid (the fake sets none),
// then runs more.
func withNodeUID(uid types.UID, more ...func(*fake.Clientset)) func(*fake.Clientset) {
	return func(c *fake.Clientset) {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, UID: uid, Labels: map[string]string{"kubernetes.io/hostname": nodeName}}}
		if err := c.Tracker().Update(corev1.SchemeGroupVersion.WithResource("nodes"), n, ""); err != nil {
			panic(err)
		}
		for _, f := range more {
			f(c)
		}
	}
}

// published is what the node's slices of the driver say.
type published struct {
	devices     []string // device names, sorted
	counterSets int
	owners      []types.UID // each slice's controller, in slice order
}

func (e *env) draPublished() published {
	e.t.Helper()
	list, err := e.client.ResourceV1().ResourceSlices().List(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	var p published
	for _, s := range list.Items {
		if s.Spec.Driver != api.DRADriver || s.Spec.NodeName == nil || *s.Spec.NodeName != nodeName || s.Spec.Pool.Name != nodeName {
			e.t.Errorf("slice %s of driver %s, node %v, pool %s", s.Name, s.Spec.Driver, s.Spec.NodeName, s.Spec.Pool.Name)
			continue
		}
		for _, d := range s.Spec.Devices {
			p.devices = append(p.devices, d.Name)
		}
		p.counterSets += len(s.Spec.SharedCounters)
		var owner types.UID
		if o := s.OwnerReferences; len(o) == 1 && o[0].Kind == "Node" && o[0].Name == nodeName && o[0].Controller != nil && *o[0].Controller {
			owner = o[0].UID
		}
		p.owners = append(p.owners, owner)
	}
	slices.Sort(p.devices)
	return p
}

// wantDevices is the device names of the mock's GPUs in the fraction views,
// GPU indices in whole set published whole only.
func (e *env) wantDevices(whole ...int) []string {
	var out []string
	for _, g := range e.gpus {
		out = append(out, api.DRADeviceName(g.Minor, api.DRAViewWhole))
		if !slices.Contains(whole, g.Index) {
			out = append(out, api.DRADeviceName(g.Minor, api.DRAViewShares), api.DRADeviceName(g.Minor, api.DRAViewMemory))
		}
	}
	slices.Sort(out)
	return out
}

// waitPublished waits until the slices carry want's devices and counter
// sets, every slice owned by the Node with UID owner.
func (e *env) waitPublished(what string, devices []string, counterSets int, owner types.UID) {
	e.t.Helper()
	e.poll(what, func() bool {
		p := e.draPublished()
		if !slices.Equal(p.devices, devices) || p.counterSets != counterSets || len(p.owners) == 0 {
			return false
		}
		for _, o := range p.owners {
			if o != owner {
				return false
			}
		}
		return true
	})
}

// claimPod creates a claim for device (consuming consumed), a pod of node-a
// whose container main uses it, and the claim's allocation reserved for the
// pod, as an allocating scheduler writes it.
func (e *env) claimPod(name string, claim *resourceapi.ResourceClaim, device string, consumed map[string]string) *corev1.Pod {
	e.t.Helper()
	p := builders.MakePod(name, "default").SchedulerName("default-scheduler").Node(nodeName).Claim("gpu", claim.Name).Obj()
	p.UID = types.UID("uid-" + name)
	share := types.UID("share-" + name)
	res := resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: api.DRADriver, Pool: nodeName, Device: device, ShareID: &share,
		ConsumedCapacity: map[resourceapi.QualifiedName]k8sresource.Quantity{}}
	for k, v := range consumed {
		res.ConsumedCapacity[resourceapi.QualifiedName(k)] = k8sresource.MustParse(v)
	}
	claim.UID = types.UID("uid-" + claim.Name)
	claim.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{res}}}
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: p.Name, UID: p.UID}}
	if _, err := e.client.ResourceV1().ResourceClaims(claim.Namespace).Create(e.ctx, claim, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.client.CoreV1().Pods(p.Namespace).Create(e.ctx, p, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	return p
}

// TestDRAServesThroughTheUpstreamHelpers: in mode dra the agent registers
// with the kubelet through the kubeletplugin helper (ready once the kubelet
// accepted it), publishes every GPU's views through the resourceslice
// controller (owned by the Node), prepares claims against what it
// published (refusing what exceeds a GPU, naming the holder), follows a
// config edit with its slices, and on stop removes its sockets and leaves
// the slices (the kubelet removes a gone driver's).
func TestDRAServesThroughTheUpstreamHelpers(t *testing.T) {
	e := startAgentWith(t, draFractions, withNodeUID("uid-1"))
	if err := e.kubelet.WaitForDRADriver(e.ctx, api.DRADriver); err != nil {
		t.Fatal(err)
	}
	e.poll("ready once the kubelet accepted the driver", func() bool { return e.agent.Ready() == nil })
	e.waitPublished("every GPU's views published", e.wantDevices(), len(e.gpus), "uid-1")

	// Claims: 30 % of GPU 0, then 80 % more does not fit.
	shares := api.DRADeviceName(e.gpus[0].Minor, api.DRAViewShares)
	p30 := e.claimPod("p30", builders.MakeClaim("c30", "default").Shares(30).Obj(), shares, map[string]string{api.DRACapacityShares: "30"})
	if err := e.kubelet.PrepareClaims(e.ctx, p30); err != nil {
		t.Fatal(err)
	}
	ids := e.kubelet.ContainerCDIDevices(p30.UID, "main")
	if !slices.ContainsFunc(ids, func(id string) bool { return strings.HasPrefix(id, api.DRACDIKind+"=") }) {
		t.Errorf("CDI devices of the 30 %% claim's container: %v, want one of kind %s", ids, api.DRACDIKind)
	}
	p80 := e.claimPod("p80", builders.MakeClaim("c80", "default").Shares(80).Obj(), shares, map[string]string{api.DRACapacityShares: "80"})
	var perr *kubeletsim.DRAPluginError
	if err := e.kubelet.PrepareClaims(e.ctx, p80); !errors.As(err, &perr) || !strings.Contains(perr.Msg, "30 of 100 are held by default/c30 (30 shares)") {
		t.Fatalf("an over-capacity claim: %v, want the driver's refusal naming the holder", err)
	}
	if err := e.kubelet.UnprepareClaims(e.ctx, p30.UID); err != nil {
		t.Fatal(err)
	}
	if err := e.kubelet.PrepareClaims(e.ctx, p80); err != nil {
		t.Fatalf("the 80 %% claim once the 30 %% went: %v", err)
	}

	// A config edit changes the slices.
	e.writeConfig(draGPU7Exclusive)
	e.waitPublished("GPU 7 published whole only", e.wantDevices(7), len(e.gpus)-1, "uid-1")

	// Stopped: the sockets go, the slices stay.
	e.stop()
	for _, s := range []string{filepath.Join(e.dir, "reg", api.DRADriver+"-reg.sock"), filepath.Join(e.dir, "dra", "dra.sock")} {
		if _, err := os.Stat(s); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("socket %s after stop: %v", s, err)
		}
	}
	if p := e.draPublished(); !slices.Equal(p.devices, e.wantDevices(7)) {
		t.Errorf("slices after stop carry %v", p.devices)
	}
}

// TestDRADisabledRefusesModeDRA: with DRA turned off (--dra=false, the
// chart's dra.enabled: false, whose pod lacks the kubelet's plugin
// directories) a config in mode dra at start fails closed through device
// plugins, saying why; a valid config brings the fractions; an edit back to
// mode dra is rejected, and the node keeps its last good config. Nothing
// is registered as a DRA driver and no slice is published.
func TestDRADisabledRefusesModeDRA(t *testing.T) {
	e := startAgentFull(t, draFractions, withNodeUID("uid-1"), func(c *Config) { c.DRA.Disabled = true })
	e.waitServed("whole GPUs only", map[string]served{
		api.ResourceGPU: {Healthy: 8, Connected: true, Registrations: 1},
	})
	e.poll("the fail-closed event naming dra.enabled", func() bool {
		for _, ev := range e.nodeEvents() {
			if strings.HasPrefix(ev, "Warning GPUConfigRejected: gpufrac-node fails closed") && strings.Contains(ev, "dra.enabled: false") {
				return true
			}
		}
		return false
	})
	e.checkGauge("gpufrac_config_fail_closed", 1)

	e.writeConfig(fractionConfig)
	e.waitServed("the fraction config", map[string]served{
		api.ResourceGPU:      {Healthy: 8, Connected: true, Registrations: 1},
		api.ResourceFraction: {Healthy: 800, Connected: true, Registrations: 1},
	})
	e.checkGauge("gpufrac_config_fail_closed", 0)

	e.writeConfig(draFractions)
	e.poll("the edit to mode dra rejected", func() bool { return rejectedReloads(t, e) == 1 })
	if got := e.served(); got[api.ResourceFraction].Healthy != 800 {
		t.Errorf("served after the rejected edit: %v, want the fractions kept", got)
	}
	if _, err := os.Stat(filepath.Join(e.dir, "reg", api.DRADriver+"-reg.sock")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a DRA registration socket with DRA off: %v", err)
	}
	if p := e.draPublished(); len(p.devices) != 0 {
		t.Errorf("slices published with DRA off: %v", p.devices)
	}
}

// TestDRAPublishingRetriesFailedWrites: an API server that refuses slice
// creates and updates for a while costs retries, not the agent: the slices
// are published once it accepts them, and a config edit after.
func TestDRAPublishingRetriesFailedWrites(t *testing.T) {
	var creates, updates atomic.Int32
	e := startAgentWith(t, draFractions, withNodeUID("uid-1", func(c *fake.Clientset) {
		c.PrependReactor("create", "resourceslices", func(clienttesting.Action) (bool, runtime.Object, error) {
			if creates.Add(1) <= 3 {
				return true, nil, apierrors.NewServiceUnavailable("injected: creates refused")
			}
			return false, nil, nil
		})
		c.PrependReactor("update", "resourceslices", func(clienttesting.Action) (bool, runtime.Object, error) {
			if updates.Add(1) <= 2 {
				return true, nil, errors.New("injected: updates refused")
			}
			return false, nil, nil
		})
	}))
	e.waitPublished("published once creates are accepted", e.wantDevices(), len(e.gpus), "uid-1")
	if n := creates.Load(); n <= 3 {
		t.Errorf("%d creates, want the 3 refused ones and more", n)
	}
	e.writeConfig(draGPU7Exclusive)
	e.waitPublished("updated once updates are accepted", e.wantDevices(7), len(e.gpus)-1, "uid-1")
	if n := updates.Load(); n <= 2 {
		t.Errorf("%d updates, want the 2 refused ones and more", n)
	}
	if err := e.agent.Ready(); err != nil {
		t.Errorf("not ready after failed writes: %v", err)
	}
}

// TestDRASliceOwnerFollowsNodeUID: the Node deleted and registered again
// (a new UID): the garbage collector deletes the slices owned by the old
// one; nothing is published while the Node is gone, and the slices come
// back owned by the new one (with the old UID they would be deleted again
// and again).
func TestDRASliceOwnerFollowsNodeUID(t *testing.T) {
	var writes atomic.Int32
	count := func(clienttesting.Action) (bool, runtime.Object, error) {
		writes.Add(1)
		return false, nil, nil
	}
	e := startAgentFull(t, draFractions, withNodeUID("uid-1", func(c *fake.Clientset) {
		c.PrependReactor("create", "resourceslices", count)
		c.PrependReactor("update", "resourceslices", count)
	}), func(c *Config) { c.DRA.NodeCheckInterval = 100 * time.Millisecond })
	e.waitPublished("published owned by the Node", e.wantDevices(), len(e.gpus), "uid-1")

	// The garbage collector: slices whose owner is not the Node go.
	nodes := corev1.SchemeGroupVersion.WithResource("nodes")
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	go func() {
		for ctx.Err() == nil {
			var uid types.UID
			if n, err := e.client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{}); err == nil {
				uid = n.UID
			}
			list, err := e.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
			if err == nil {
				for _, s := range list.Items {
					if o := s.OwnerReferences; len(o) != 1 || o[0].UID != uid {
						_ = e.client.ResourceV1().ResourceSlices().Delete(ctx, s.Name, metav1.DeleteOptions{})
					}
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()

	if err := e.client.Tracker().Delete(nodes, "", nodeName); err != nil {
		t.Fatal(err)
	}
	// While the Node is gone nothing is written, not even a config edit
	// (the controller's cache, which keeps slices it created for a minute,
	// would otherwise write them).
	time.Sleep(500 * time.Millisecond) // the agent notices
	before := writes.Load()
	e.writeConfig(draGPU7Exclusive)
	time.Sleep(time.Second)
	if n := writes.Load() - before; n != 0 {
		t.Errorf("%d slice writes in a second while the Node was gone", n)
	}
	renewed := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, UID: "uid-2", Labels: map[string]string{"kubernetes.io/hostname": nodeName}}}
	if err := e.client.Tracker().Add(renewed); err != nil {
		t.Fatal(err)
	}
	e.waitPublished("the edit published owned by the renewed Node", e.wantDevices(7), len(e.gpus)-1, "uid-2")
	time.Sleep(time.Second) // they stay
	if p := e.draPublished(); !slices.Equal(p.devices, e.wantDevices(7)) || slices.ContainsFunc(p.owners, func(o types.UID) bool { return o != "uid-2" }) {
		t.Errorf("a second after: devices %v, owners %v", p.devices, p.owners)
	}
	if diff := cmp.Diff([]string{api.DRADriver}, e.agent.Resources()); diff != "" {
		t.Errorf("resources (-want +got):\n%s", diff)
	}
}

// TestDRADroppedTaintsLeaveUnhealthyGPUsOut: an API server without
// DRADeviceTaints stores the slice of an unhealthy GPU without its taint;
// the resourceslice controller reports the dropped fields, and the agent
// publishes again without the unhealthy GPU (left out, as the device
// plugins withdraw it) instead of offering it untainted.
func TestDRADroppedTaintsLeaveUnhealthyGPUsOut(t *testing.T) {
	var stripped atomic.Int32
	dropTaints := func(action clienttesting.Action) (bool, runtime.Object, error) {
		var obj runtime.Object
		switch a := action.(type) {
		case clienttesting.CreateAction:
			obj = a.GetObject()
		case clienttesting.UpdateAction:
			obj = a.GetObject()
		}
		if s, ok := obj.(*resourceapi.ResourceSlice); ok {
			for i := range s.Spec.Devices {
				if len(s.Spec.Devices[i].Taints) > 0 {
					s.Spec.Devices[i].Taints = nil
					stripped.Add(1)
				}
			}
		}
		return false, nil, nil
	}
	e := startAgentWith(t, draFractions, withNodeUID("uid-1", func(c *fake.Clientset) {
		c.PrependReactor("create", "resourceslices", dropTaints)
		c.PrependReactor("update", "resourceslices", dropTaints)
	}))
	e.waitPublished("every GPU's views published", e.wantDevices(), len(e.gpus), "uid-1")
	sick := e.gpus[1]
	if err := e.lib.(*nvidia.Mock).InjectXid(sick.UUID, 79); err != nil {
		t.Fatal(err)
	}
	want := slices.DeleteFunc(e.wantDevices(), func(d string) bool {
		return d == api.DRADeviceName(sick.Minor, api.DRAViewWhole) || d == api.DRADeviceName(sick.Minor, api.DRAViewShares) ||
			d == api.DRADeviceName(sick.Minor, api.DRAViewMemory)
	})
	e.waitPublished("the unhealthy GPU left out", want, len(e.gpus)-1, "uid-1")
	if stripped.Load() == 0 {
		t.Error("no taint was ever published (and dropped)")
	}
	if !e.agent.dra.driver.TaintsDropped() {
		t.Error("the driver did not learn that the API server drops taints")
	}
}
