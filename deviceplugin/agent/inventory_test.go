package agent

import (
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpufrac/gpufrac/api"
)

// inventoryView is what TestInventoryPublishesMIGDevicesAndReplicas checks
// of one published GPU.
type inventoryView struct {
	Mode            string
	MIGProfiles     map[string]int // resource/profile/MiB -> devices
	Replicas        int
	ReplicaResource string
	Unhealthy       bool
}

func (e *env) inventory() map[int]inventoryView {
	e.t.Helper()
	n, err := e.client.CoreV1().Nodes().Get(e.ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	raw := n.Annotations[api.AnnotationGPUInventory]
	if raw == "" {
		return nil
	}
	inv, err := api.DecodeInventory(raw)
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[int]inventoryView{}
	for _, g := range inv {
		v := inventoryView{Mode: g.Mode, Replicas: g.Replicas, ReplicaResource: g.ReplicaResource, Unhealthy: !g.Healthy}
		for _, d := range g.MIGDevices {
			if v.MIGProfiles == nil {
				v.MIGProfiles = map[string]int{}
			}
			v.MIGProfiles[d.Resource+"/"+d.Profile+"/"+strconv.FormatUint(d.MemoryMiB, 10)]++
			if d.UUID == "" || d.UUID == g.UUID {
				e.t.Errorf("GPU %d: MIG device without its own UUID: %+v", g.Index, d)
			}
		}
		out[g.Index] = v
	}
	return out
}

// waitInventory waits until the published inventory is want, showing the
// difference when it does not come.
func (e *env) waitInventory(what string, want map[int]inventoryView) {
	e.t.Helper()
	var got map[int]inventoryView
	defer func() {
		if e.t.Failed() {
			e.t.Logf("inventory (-want +got):\n%s", cmp.Diff(want, got))
		}
	}()
	e.poll(what, func() bool {
		got = e.inventory()
		return cmp.Equal(want, got)
	})
}

func TestInventoryPublishesMIGDevicesAndReplicas(t *testing.T) {
	e := startAgent(t, fractionConfig)
	allFraction := map[int]inventoryView{}
	for i := range e.gpus {
		allFraction[i] = inventoryView{Mode: "fraction"}
	}
	e.waitInventory("a fraction-mode inventory", allFraction)

	e.writeConfig(`version: v1
default:
  mode: fraction
  mig: {strategy: mixed, layout: all-1g.10gb}
  timeslice: {replicas: 3, resourceName: example.com/slice}
  gpus: [{indices: "0-1", mode: mig}, {indices: "2", mode: timeslice}]
`)
	want := map[int]inventoryView{}
	for i := range e.gpus {
		switch {
		case i <= 1:
			want[i] = inventoryView{Mode: "mig", MIGProfiles: map[string]int{"nvidia.com/mig-1g.10gb/1g.10gb/10240": 7}}
		case i == 2:
			want[i] = inventoryView{Mode: "timeslice", Replicas: 3, ReplicaResource: "example.com/slice"}
		default:
			want[i] = inventoryView{Mode: "fraction"}
		}
	}
	e.waitInventory("MIG devices and replicas in the inventory", want)

	// Back to fractions: MIG off again, no devices or replicas left behind.
	e.writeConfig(fractionConfig)
	e.waitInventory("a fraction-mode inventory again", allFraction)
}
