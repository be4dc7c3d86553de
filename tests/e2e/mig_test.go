package e2e

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/coordinator/placeholder"
	"github.com/gpufrac/gpufrac/tests/cluster"
)

const (
	// modeLabel selects a node's partitioning in partitionConfig.
	modeLabel = "e2e.gpufrac.io/gpu-mode"
	mig1g     = "nvidia.com/mig-1g.10gb"
	shared    = api.DefaultTimesliceResource
)

// partitionConfig is the admin's config of the MIG tests: fractions unless
// the node is labelled for MIG (seven 1g.10gb devices per H100, mixed
// strategy) or time-slicing (4 replicas per GPU).
const partitionConfig = `version: v1
default:
  mode: fraction
  mig: {strategy: mixed, layout: all-1g.10gb}
  timeslice: {replicas: 4}
groups:
  - nodeSelector: {` + modeLabel + `: mig}
    mode: mig
  - nodeSelector: {` + modeLabel + `: timeslice}
    mode: timeslice
`

// startPartitionedCluster starts the test bed with partitionConfig (MIG
// devices reach containers by CDI name: the test bed has no nvidia-caps
// minors file) and the coordinator binary built.
func startPartitionedCluster(t *testing.T, config string) *cluster.Cluster {
	t.Helper()
	c := startCluster(t, cluster.Options{NodeAgents: &cluster.NodeAgentOptions{
		Config: config,
		Args:   []string{"--device-list-strategy=cdi"},
	}})
	buildBinary(t, "gpufrac-coordinator")
	return c
}

// addModeNode adds one mock-H100 node (8 GPUs) labelled for a partitioning
// mode ("" for the default) and waits for its node agent.
func addModeNode(t *testing.T, c *cluster.Cluster, name, mode string) *cluster.NodeAgent {
	t.Helper()
	labels := map[string]string{api.LabelGPUNode: "true", api.LabelGPUProduct: cluster.H100Product}
	if mode != "" {
		labels[modeLabel] = mode
	}
	if _, err := c.AddNode(t.Context(), cluster.NodeSpec{Name: name, Labels: labels, Capacity: cluster.ResourceList(map[corev1.ResourceName]string{
		corev1.ResourceCPU: "192", corev1.ResourceMemory: "2Ti", corev1.ResourcePods: "250",
	})}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	agent, err := c.WaitForNodeAgent(ctx, name)
	if err != nil {
		t.Fatalf("node agent of %s: %v", name, err)
	}
	return agent
}

// nodeShape is what a node offers the coordinator: allocatable GPU
// resources and the inventory's GPUs per mode and MIG devices.
type nodeShape struct {
	Allocatable map[string]int64
	Modes       map[string]int // mode -> GPUs
	MIGDevices  map[string]int // profile -> devices in the inventory
	Replicas    map[int]int    // replicas per GPU -> GPUs
}

func shapeOf(n *corev1.Node) nodeShape {
	s := nodeShape{Allocatable: map[string]int64{}, Modes: map[string]int{}, MIGDevices: map[string]int{}, Replicas: map[int]int{}}
	for name, q := range n.Status.Allocatable {
		gpuResource := name == api.ResourceGPU || name == api.ResourceFraction || strings.HasPrefix(string(name), api.MIGResourcePrefix) || name == shared
		if gpuResource && q.Value() > 0 { // a withdrawn resource stays at 0 for the kubelet's grace period
			s.Allocatable[string(name)] = q.Value()
		}
	}
	inv, _ := api.DecodeInventory(n.Annotations[api.AnnotationGPUInventory])
	for _, g := range inv {
		s.Modes[g.Mode]++
		for _, d := range g.MIGDevices {
			s.MIGDevices[d.Profile]++
		}
		if g.Replicas > 0 {
			s.Replicas[g.Replicas]++
		}
	}
	return s
}

// waitShape waits until a node offers want, showing the difference when it
// does not come.
func waitShape(t *testing.T, c *cluster.Cluster, node string, limit time.Duration, want nodeShape) {
	t.Helper()
	var got nodeShape
	defer func() {
		if t.Failed() {
			t.Logf("%s offers (-want +got):\n%s", node, cmp.Diff(want, got))
		}
	}()
	waitFor(t, limit, node+" to offer its GPUs as configured", func(ctx context.Context) (bool, error) {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		got = shapeOf(n)
		return cmp.Equal(want, got), nil
	})
}

// fractionShape is a mock-H100 node in fraction mode.
func fractionShape() nodeShape {
	return nodeShape{
		Allocatable: map[string]int64{api.ResourceGPU: 8, api.ResourceFraction: 800},
		Modes:       map[string]int{"fraction": 8}, MIGDevices: map[string]int{}, Replicas: map[int]int{},
	}
}

// migShape is a mock-H100 node with every GPU split into seven 1g.10gb devices.
func migShape() nodeShape {
	return nodeShape{
		Allocatable: map[string]int64{mig1g: 56},
		Modes:       map[string]int{"mig": 8}, MIGDevices: map[string]int{"1g.10gb": 56}, Replicas: map[int]int{},
	}
}

// queueGPU is a Queue's status.allocated.gpu in milli-GPU (-1 when unset).
func queueGPU(ctx context.Context, c *cluster.Cluster, name string) int64 {
	u, err := c.Dynamic.Resource(queueGVR).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return -1
	}
	return quantityMilli(u, "status", "allocated", "gpu")
}

func quantityMilli(u *unstructured.Unstructured, path ...string) int64 {
	s, ok, err := unstructured.NestedString(u.Object, path...)
	if !ok || err != nil {
		return -1
	}
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return -1
	}
	return q.MilliValue()
}

// waitQueueGPU waits until a Queue's status says it holds want milli-GPU.
func waitQueueGPU(t *testing.T, c *cluster.Cluster, name string, want int64) {
	t.Helper()
	var got int64
	defer func() {
		if t.Failed() {
			t.Logf("queue %s: allocated gpu %d milli, want %d", name, got, want)
		}
	}()
	waitFor(t, 30*time.Second, fmt.Sprintf("queue %s to be charged %d milli-GPU", name, want), func(ctx context.Context) (bool, error) {
		got = queueGPU(ctx, c, name)
		return got == want, nil
	})
}

// devicesOf lists the device IDs a pod holds of a resource, from its node's PodResources.
func devicesOf(c *cluster.Cluster, p *corev1.Pod, res string) []string {
	var ids []string
	for _, a := range c.NodeAgent(p.Spec.NodeName).Kubelet.Allocations() {
		if a.Pod.Name == p.Name && a.Resource == res {
			ids = append(ids, a.DeviceIDs...)
		}
	}
	sort.Strings(ids)
	return ids
}

// migDevicesOf maps the MIG device UUIDs of a node's inventory to their profiles.
func migDevicesOf(t *testing.T, c *cluster.Cluster, node string) map[string]string {
	t.Helper()
	n, err := c.Client.CoreV1().Nodes().Get(t.Context(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	inv, err := api.DecodeInventory(n.Annotations[api.AnnotationGPUInventory])
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, g := range inv {
		for _, d := range g.MIGDevices {
			out[d.UUID] = d.Profile
		}
	}
	return out
}

// TestMIGAndReplicaPodsRunThroughTheCoordinator runs MIG-device and
// time-sliced replica pods through the coordinator on a MIG node and a
// time-sliced node next to a fraction node: each kind lands where it is
// served, the kubelet gives the MIG devices and replicas, and each queue is
// charged in GPU terms (a 1g.10gb device of an 80 GB H100 is 0.125 GPU, a
// replica of 4 is 0.25).
func TestMIGAndReplicaPodsRunThroughTheCoordinator(t *testing.T) {
	t.Parallel()
	c := startPartitionedCluster(t, partitionConfig)
	addModeNode(t, c, "mig-0", "mig")
	addModeNode(t, c, "ts-0", "timeslice")
	addModeNode(t, c, "frac-0", "")
	waitShape(t, c, "mig-0", 60*time.Second, migShape())
	waitShape(t, c, "ts-0", 60*time.Second, nodeShape{
		Allocatable: map[string]int64{shared: 32},
		Modes:       map[string]int{"timeslice": 8}, MIGDevices: map[string]int{}, Replicas: map[int]int{4: 8},
	})
	waitShape(t, c, "frac-0", 60*time.Second, fractionShape())
	applyYAML(t, c, queuesYAML(map[string]string{"mig-q": "8", "ts-q": "4", "frac-q": "4"}))
	startCoordinator(t, c, "c1", "--leader-elect=false")

	create(t, c,
		pod("mig-a", "mig-q").Resource(mig1g, "1").Obj(),
		pod("mig-b", "mig-q").Resource(mig1g, "1").Obj(),
		pod("mig-c", "mig-q").Resource(mig1g, "2").Obj(),
		pod("ts-a", "ts-q").Resource(shared, "1").Obj(),
		pod("ts-b", "ts-q").Resource(shared, "1").Obj(),
		pod("ts-c", "ts-q").Resource(shared, "1").Obj(),
		pod("frac-a", "frac-q").Fraction(30).Obj(),
	)
	pods := running(t, c, 90*time.Second, "mig-a", "mig-b", "mig-c", "ts-a", "ts-b", "ts-c", "frac-a")

	wantNode := map[string]string{"mig-a": "mig-0", "mig-b": "mig-0", "mig-c": "mig-0", "ts-a": "ts-0", "ts-b": "ts-0", "ts-c": "ts-0", "frac-a": "frac-0"}
	gotNode := map[string]string{}
	for n, p := range pods {
		gotNode[n] = p.Spec.NodeName
	}
	if diff := cmp.Diff(wantNode, gotNode); diff != "" {
		t.Fatalf("pod nodes (-want +got):\n%s", diff)
	}

	// The kubelet gave each MIG pod devices of the node's inventory, none twice.
	inv := migDevicesOf(t, c, "mig-0")
	seen := map[string]string{}
	for n, want := range map[string]int{"mig-a": 1, "mig-b": 1, "mig-c": 2} {
		ids := devicesOf(c, pods[n], mig1g)
		if len(ids) != want {
			t.Errorf("%s holds MIG devices %v, want %d", n, ids, want)
		}
		for _, id := range ids {
			if inv[id] != "1g.10gb" {
				t.Errorf("%s holds %s, not a 1g.10gb device of mig-0's inventory", n, id)
			}
			if other, dup := seen[id]; dup {
				t.Errorf("%s and %s both hold %s", n, other, id)
			}
			seen[id] = n
		}
		if g := pods[n].Annotations[api.AnnotationGPU]; g != "" {
			t.Errorf("%s was given GPU %s by the coordinator; the kubelet picks MIG devices", n, g)
		}
	}
	for _, n := range []string{"ts-a", "ts-b", "ts-c"} {
		if ids := devicesOf(c, pods[n], shared); len(ids) != 1 {
			t.Errorf("%s holds replicas %v, want 1", n, ids)
		}
	}

	// Queues in GPU terms: 4 devices × 0.125, 3 replicas × 0.25, and 0.3.
	waitQueueGPU(t, c, "mig-q", 500)
	waitQueueGPU(t, c, "ts-q", 750)
	waitQueueGPU(t, c, "frac-q", 300)

	// More MIG devices than the node has, all within mig-q's quota (7.25
	// GPUs' worth of 8): the node's 56 devices are taken, never more, and
	// the rest waits as NoCapacity (never Unschedulable) naming the resource.
	var more []string
	for i := 0; i < 54; i++ {
		n := fmt.Sprintf("mig-more-%02d", i)
		more = append(more, n)
		create(t, c, pod(n, "mig-q").Resource(mig1g, "1").Obj())
	}
	waitFor(t, 60*time.Second, "the node's 56 MIG devices to be taken and the rest to wait", func(ctx context.Context) (bool, error) {
		bound, waiting := 0, 0
		for _, n := range more {
			p, err := c.Client.CoreV1().Pods("default").Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			switch {
			case p.Spec.NodeName != "":
				bound++
			case scheduledReason(p) != "":
				waiting++
			}
		}
		return bound == 52 && waiting == 2, nil
	})
	for _, n := range more {
		p, _ := c.Client.CoreV1().Pods("default").Get(t.Context(), n, metav1.GetOptions{})
		if p.Spec.NodeName != "" && p.Spec.NodeName != "mig-0" {
			t.Errorf("%s bound to %s, which serves no MIG devices", n, p.Spec.NodeName)
		}
		if p.Spec.NodeName != "" {
			continue
		}
		if r := scheduledReason(p); r != api.ReasonNoCapacity {
			t.Errorf("%s waits with reason %q, want NoCapacity", n, r)
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && !strings.Contains(cond.Message, "insufficient "+mig1g) {
				t.Errorf("%s waits with %q, want it to name %s", n, cond.Message, mig1g)
			}
		}
	}
	waitQueueGPU(t, c, "mig-q", 56*125)
}

// TestConfigEditSwitchesANodeFromFractionsToMIGForTheCoordinator switches a
// node's partitioning by editing gpufrac-node's config file while the
// coordinator runs: the node re-advertises live (fraction units and whole
// GPUs withdrawn, 56 MIG devices served, the inventory says mig), MIG pods
// then run through the coordinator and are charged 0.125 GPU each,
// fractions are kept off the node, and a MIG profile no node serves waits
// as NoCapacity with a placeholder for the whole GPU behind it.
func TestConfigEditSwitchesANodeFromFractionsToMIGForTheCoordinator(t *testing.T) {
	t.Parallel()
	c := startPartitionedCluster(t, partitionConfig)
	agent := addModeNode(t, c, "gpu-0", "")
	waitShape(t, c, "gpu-0", 60*time.Second, fractionShape())
	applyYAML(t, c, queuesYAML(map[string]string{"q": "8"}))
	startCoordinator(t, c, "c1", "--leader-elect=false")

	// The admin edits the node's group to MIG (the ConfigMap update).
	if err := agent.WriteConfig(strings.Replace(partitionConfig, "default:\n  mode: fraction", "default:\n  mode: mig", 1)); err != nil {
		t.Fatal(err)
	}
	waitShape(t, c, "gpu-0", 90*time.Second, migShape())

	var names []string
	for i := 0; i < 8; i++ {
		n := fmt.Sprintf("mig-%d", i)
		names = append(names, n)
		create(t, c, pod(n, "q").Resource(mig1g, "1").Obj())
	}
	create(t, c,
		pod("frac", "q").Fraction(50).Obj(),
		pod("big-mig", "q").Resource("nvidia.com/mig-3g.40gb", "1").Obj(),
	)
	pods := running(t, c, 90*time.Second, names...)
	for _, n := range names {
		if ids := devicesOf(c, pods[n], mig1g); len(ids) != 1 || !strings.HasPrefix(ids[0], "MIG-") {
			t.Errorf("%s holds %v, want one MIG device", n, ids)
		}
	}
	waitQueueGPU(t, c, "q", 8*125)

	// The fraction's only node has no fraction GPU left: it is kept off it.
	for n, res := range map[string]string{"frac": "did not match the pod's node constraints", "big-mig": "insufficient nvidia.com/mig-3g.40gb"} {
		waitFor(t, 30*time.Second, n+" to wait as NoCapacity", func(ctx context.Context) (bool, error) {
			p, err := c.Client.CoreV1().Pods("default").Get(ctx, n, metav1.GetOptions{})
			return err == nil && p.Spec.NodeName == "" && scheduledReason(p) == api.ReasonNoCapacity, nil
		})
		p, _ := c.Client.CoreV1().Pods("default").Get(t.Context(), n, metav1.GetOptions{})
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && !strings.Contains(cond.Message, res) {
				t.Errorf("%s waits with %q, want it to name %q", n, cond.Message, res)
			}
		}
	}
	// The MIG profile no node serves asks Karpenter for one whole GPU.
	waitFor(t, 30*time.Second, "a placeholder for the 3g.40gb device", func(ctx context.Context) (bool, error) {
		l, err := c.Client.CoreV1().Pods(api.ReservationNamespace).List(ctx, metav1.ListOptions{LabelSelector: api.LabelRole + "=" + api.RolePlaceholder})
		if err != nil {
			return false, nil
		}
		for _, p := range l.Items {
			q := p.Spec.Containers[0].Resources.Limits[api.ResourceGPU]
			if strings.Contains(p.Annotations[placeholder.AnnotationWorkloads], "default/big-mig") && q.Value() == 1 &&
				p.Annotations[placeholder.AnnotationPackedMilli] == "500" {
				return true, nil
			}
		}
		return false, nil
	})
}
