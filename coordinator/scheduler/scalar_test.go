package scheduler

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/coordinator/placeholder"
	"github.com/gpufrac/gpufrac/tests/builders"
)

const mig1g = "nvidia.com/mig-1g.10gb"

// partitionedNode is a Ready H100 node whose n GPUs are in mode mig (seven
// 1g.10gb devices each) or timeslice (4 replicas each), as gpufrac-node
// publishes them.
func partitionedNode(name, mode string, n int) *corev1.Node {
	w := builders.MakeNode(name).CPU("128").Memory("1Ti").Product("NVIDIA-H100-80GB-HBM3")
	inv := make([]api.GPUInfo, n)
	for i := range inv {
		g := api.GPUInfo{UUID: fmt.Sprintf("GPU-%s-%d", name, i), Index: i, Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81920, Mode: mode, Healthy: true}
		if mode == "mig" {
			for k := 0; k < 7; k++ {
				g.MIGDevices = append(g.MIGDevices, api.MIGDeviceInfo{UUID: fmt.Sprintf("MIG-%s-%d-%d", name, i, k), Profile: "1g.10gb", Resource: mig1g, MemoryMiB: 10240})
			}
		} else {
			g.Replicas, g.ReplicaResource = 4, api.DefaultTimesliceResource
		}
		inv[i] = g
	}
	if mode == "mig" {
		w.Resource(mig1g, fmt.Sprint(7*n))
	} else {
		w.Resource(api.DefaultTimesliceResource, fmt.Sprint(4*n))
	}
	node := w.Obj()
	s, _ := api.EncodeInventory(inv)
	node.Annotations = map[string]string{api.AnnotationGPUInventory: s}
	return node
}

func scalarPod(name, queue, resource string, n int) *corev1.Pod {
	return builders.MakePod(name, "default").Queue(queue).Resource(corev1.ResourceName(resource), fmt.Sprint(n)).CPU("1").UID(name).Obj()
}

// recordingPlaceholders records the placeholder pods created.
type recordingPlaceholders struct {
	mu      sync.Mutex
	created []*corev1.Pod
}

func (r *recordingPlaceholders) Create(_ context.Context, p *corev1.Pod) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.created = append(r.created, p)
	return nil
}

func (r *recordingPlaceholders) Delete(context.Context, *corev1.Pod, string) error { return nil }

func (r *recordingPlaceholders) MarkUnschedulable(context.Context, *corev1.Pod) error { return nil }

func TestMIGDevicesAndReplicasArePlacedAndChargedInGPUTerms(t *testing.T) {
	nodes := []*corev1.Node{partitionedNode("mig", "mig", 1), partitionedNode("ts", "timeslice", 1), h100Node("frac", "", 2)}
	pods := []*corev1.Pod{
		scalarPod("m-0", "q", mig1g, 2), scalarPod("m-1", "q", mig1g, 1),
		scalarPod("r-0", "q", api.DefaultTimesliceResource, 1), scalarPod("r-1", "q", api.DefaultTimesliceResource, 1),
		fracPod("f", "q", 30), gpuPod("w", "q", 1),
	}
	c := newCluster(t, "", nodes, []*v1alpha1.Queue{queueOf("q", "8")}, pods...)
	rec := &recordingStatus{st: map[string]v1alpha1.QueueStatus{}}
	c.s.deps.Status = rec
	c.cycle()
	c.cycle() // bound pods now come from the "informer"

	got := map[string]string{}
	for _, p := range pods {
		got[p.Name] = c.boundTo(p.Name)
	}
	want := map[string]string{"m-0": "mig", "m-1": "mig", "r-0": "ts", "r-1": "ts", "f": "frac", "w": "frac"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("nodes (-want +got):\n%s\nreasons: %v", diff, c.b.Messages)
	}
	for _, n := range []string{"m-0", "r-0"} {
		if g := c.b.Annotations[n][api.AnnotationGPU]; g != "" {
			t.Errorf("%s annotated with GPU %s; MIG devices and replicas are chosen by the kubelet", n, g)
		}
	}
	// 3 MIG devices × 125 (10 of 80 GB) + 2 replicas × 250 + 300 + 1000.
	if got := rec.st["q"].Allocated["gpu"]; got.MilliValue() != 2175 {
		t.Errorf("queue q allocated %s GPU, want 2.175", got.String())
	}
}

func TestMIGDevicesWithNoRoomAskForWholeGPUs(t *testing.T) {
	var pods []*corev1.Pod
	for i := 0; i < 9; i++ {
		pods = append(pods, scalarPod(fmt.Sprintf("m-%d", i), "q", mig1g, 1))
	}
	c := newCluster(t, "", []*corev1.Node{partitionedNode("mig", "mig", 1), h100Node("frac", "", 8)}, []*v1alpha1.Queue{queueOf("q", "16")}, pods...)
	ph := &recordingPlaceholders{}
	c.s.deps.Placeholders = ph
	c.cycle()

	bound, waiting := 0, []string{}
	for _, p := range pods {
		switch {
		case c.boundTo(p.Name) == "mig":
			bound++
		case c.boundTo(p.Name) != "":
			t.Errorf("%s bound to %s, which serves no MIG devices", p.Name, c.boundTo(p.Name))
		default:
			waiting = append(waiting, p.Name)
			if r, msg := c.reason(p.Name), c.b.Messages[p.Name]; r != api.ReasonNoCapacity || !strings.Contains(msg, "had insufficient "+mig1g) {
				t.Errorf("%s: reason %s %q, want NoCapacity naming %s", p.Name, r, msg, mig1g)
			}
		}
	}
	if bound != 7 || len(waiting) != 2 {
		t.Fatalf("%d bound, %v waiting; want the node's 7 devices taken and 2 waiting", bound, waiting)
	}
	// The two waiting devices fit one GPU: one placeholder for one whole GPU.
	if len(ph.created) != 1 {
		t.Fatalf("%d placeholders created, want 1", len(ph.created))
	}
	p := ph.created[0]
	if q := p.Spec.Containers[0].Resources.Limits[api.ResourceGPU]; q.Value() != 1 {
		t.Errorf("placeholder asks %s GPUs, want 1", q.String())
	}
	if got := p.Annotations[placeholder.AnnotationPackedMilli]; got != "284" {
		t.Errorf("placeholder packs %s milli, want 284 (two 1g devices, a seventh of a GPU each)", got)
	}
}
