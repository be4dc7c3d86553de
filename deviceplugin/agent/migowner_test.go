package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/config"
	"github.com/gpufrac/gpufrac/deviceplugin/miglayout"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
)

// fastMIGChecks has the MIG layout manager check every 200ms instead of
// 5s, so that a change it must notice (two checks for a failed read) is
// seen well within the waits' 15s, also on a loaded machine.
func fastMIGChecks(c *Config) { c.MIGCheckInterval = 200 * time.Millisecond }

// TestExternalMIGOwnerIsFollowed: with mig.owner external, gpufrac-node
// changes no GPU's MIG. It serves the MIG devices another MIG manager (the
// GPU operator's) makes, withdraws a GPU that manager puts in MIG mode
// against gpufrac's mode fraction (saying why), and follows each change
// without a config write.
func TestExternalMIGOwnerIsFollowed(t *testing.T) {
	const external = `version: v1
default:
  mode: fraction
  mig: {owner: external}
  gpus: [{indices: "0", mode: mig}]
`
	e := startAgentFull(t, external, nil, fastMIGChecks)
	// GPU 0 is in mode mig, but its owner has not enabled MIG yet.
	e.waitServed("GPUs 1-7 whole and as fractions, GPU 0 nothing", map[string]served{
		"nvidia.com/gpu":          {Healthy: 7, Connected: true, Registrations: 1},
		"gpufrac.io/gpu-fraction": {Healthy: 700, Connected: true, Registrations: 1},
	})

	// The other MIG manager partitions GPU 0, and GPU 1 too.
	owner := func(layouts map[int]string) {
		t.Helper()
		np := config.NodePolicy{GPUModes: make([]config.Mode, len(e.gpus)), GPUMIGLayouts: make([]string, len(e.gpus))}
		for i := range e.gpus {
			np.GPUModes[i] = config.ModeFraction
			if l, ok := layouts[i]; ok {
				np.GPUModes[i], np.GPUMIGLayouts[i] = config.ModeMIG, l
			}
		}
		none := func(context.Context) (map[string][]string, error) { return map[string][]string{}, nil }
		for _, s := range miglayout.NewManager(e.lib.(nvidia.MIGLib), e.gpus, miglayout.Options{Allocations: none}).Apply(e.ctx, np) {
			if s.State != miglayout.StateApplied {
				t.Fatalf("the other MIG manager: GPU %d %s %s: %s", s.Index, s.State, s.Reason, s.Message)
			}
		}
	}
	owner(map[int]string{0: "all-3g.40gb", 1: "all-7g.80gb"})
	e.waitServed("GPU 0's MIG devices; GPU 1 withdrawn while its MIG mode is on", map[string]served{
		"nvidia.com/gpu":          {Healthy: 6, Connected: true, Registrations: 1},
		"gpufrac.io/gpu-fraction": {Healthy: 600, Connected: true, Registrations: 1},
		"nvidia.com/mig-3g.40gb":  {Healthy: 2, Connected: true, Registrations: 1},
	})
	e.poll("a warning that says why GPU 1 is not served", func() bool {
		return e.countEvents("Warning MIGLayoutPending: GPU 1 is in mode fraction, but its MIG mode is enabled") == 1
	})

	// The owner reshapes GPU 0 and gives GPU 1 back.
	owner(map[int]string{0: "all-1g.10gb"})
	e.waitServed("GPU 0's new MIG devices; GPU 1 whole again", map[string]served{
		"nvidia.com/gpu":          {Healthy: 7, Connected: true, Registrations: 1},
		"gpufrac.io/gpu-fraction": {Healthy: 700, Connected: true, Registrations: 1},
		"nvidia.com/mig-3g.40gb":  {Registrations: 1},
		"nvidia.com/mig-1g.10gb":  {Healthy: 7, Connected: true, Registrations: 1},
	})
	mfs, err := e.agent.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "gpufrac_mig_operations_total" {
			for _, m := range mf.GetMetric() {
				t.Errorf("gpufrac-node changed MIG under an external owner: %v", m)
			}
		}
	}
}

// TestDRALeavesOutAGPUInMIGMode: a node in mode dra does not publish a GPU
// in mode fraction whose MIG mode another MIG manager turned on (a GPU in
// MIG mode runs no work as a whole GPU), and publishes it again once MIG is
// off, without a config write.
func TestDRALeavesOutAGPUInMIGMode(t *testing.T) {
	const draExternal = "version: v1\ndefault:\n  mode: dra\n  mig: {owner: external}\n"
	e := startAgentFull(t, draExternal, withNodeUID("uid-1"), fastMIGChecks)
	if err := e.kubelet.WaitForDRADriver(e.ctx, api.DRADriver); err != nil {
		t.Fatal(err)
	}
	e.waitPublished("every GPU's views", e.wantDevices(), len(e.gpus), "uid-1")

	lib := e.lib.(nvidia.MIGLib)
	if err := lib.SetMIGMode(e.gpus[1].UUID, true); err != nil {
		t.Fatal(err)
	}
	var without []string
	for _, d := range e.wantDevices() {
		if !strings.HasPrefix(d, fmt.Sprintf("gpu-%d-", e.gpus[1].Minor)) && d != api.DRADeviceName(e.gpus[1].Minor, api.DRAViewWhole) {
			without = append(without, d)
		}
	}
	e.waitPublished("GPU 1 left out while its MIG mode is on", without, len(e.gpus)-1, "uid-1")

	if err := lib.SetMIGMode(e.gpus[1].UUID, false); err != nil {
		t.Fatal(err)
	}
	e.waitPublished("GPU 1 published again once MIG is off", e.wantDevices(), len(e.gpus), "uid-1")
}

// TestDRALeavesOutAGPUWhoseMIGModeCannotBeRead: a node in mode dra leaves
// out a GPU whose MIG mode NVML cannot read (it may be in MIG mode with its
// MIG devices in use), noticed by the MIG layout manager's checks, and
// publishes it again once the reads work, without a config write.
func TestDRALeavesOutAGPUWhoseMIGModeCannotBeRead(t *testing.T) {
	e := startAgentFull(t, "version: v1\ndefault:\n  mode: dra\n  mig: {owner: external}\n", withNodeUID("uid-1"), fastMIGChecks)
	if err := e.kubelet.WaitForDRADriver(e.ctx, api.DRADriver); err != nil {
		t.Fatal(err)
	}
	e.waitPublished("every GPU's views", e.wantDevices(), len(e.gpus), "uid-1")

	mock := e.lib.(*nvidia.Mock)
	mock.FailMIGReads(e.gpus[1].UUID, errors.New("GPU is lost"))
	var without []string
	for _, d := range e.wantDevices() {
		if !strings.HasPrefix(d, fmt.Sprintf("gpu-%d-", e.gpus[1].Minor)) && d != api.DRADeviceName(e.gpus[1].Minor, api.DRAViewWhole) {
			without = append(without, d)
		}
	}
	e.waitPublished("GPU 1 left out while its MIG mode cannot be read", without, len(e.gpus)-1, "uid-1")

	mock.FailMIGReads(e.gpus[1].UUID, nil)
	e.waitPublished("GPU 1 published again once it can be read", e.wantDevices(), len(e.gpus), "uid-1")
}

// TestDevicePluginLeavesOutAGPUWhoseMIGModeCannotBeRead: on the device-plugin
// path too, a GPU whose MIG mode NVML cannot read is withdrawn and the
// node's other GPUs stay served (one lost GPU used to fail the whole
// build), and it is served again once the reads work, without a config
// write.
func TestDevicePluginLeavesOutAGPUWhoseMIGModeCannotBeRead(t *testing.T) {
	e := startAgentFull(t, "version: v1\ndefault:\n  mode: fraction\n", nil, fastMIGChecks)
	e.waitServed("every GPU whole and as fractions", map[string]served{
		"nvidia.com/gpu":          {Healthy: 8, Connected: true, Registrations: 1},
		"gpufrac.io/gpu-fraction": {Healthy: 800, Connected: true, Registrations: 1},
	})

	allFraction := map[int]inventoryView{}
	for i := range e.gpus {
		allFraction[i] = inventoryView{Mode: "fraction"}
	}
	e.waitInventory("every GPU healthy in the inventory", allFraction)

	mock := e.lib.(*nvidia.Mock)
	mock.FailMIGReads(e.gpus[1].UUID, errors.New("GPU is lost"))
	e.waitServed("GPU 1 withdrawn while its MIG mode cannot be read", map[string]served{
		"nvidia.com/gpu":          {Healthy: 7, Connected: true, Registrations: 1},
		"gpufrac.io/gpu-fraction": {Healthy: 700, Connected: true, Registrations: 1},
	})
	// The coordinator must not place on it either.
	lost := map[int]inventoryView{}
	for i := range e.gpus {
		lost[i] = inventoryView{Mode: "fraction", Unhealthy: i == 1}
	}
	e.waitInventory("GPU 1 unhealthy in the inventory", lost)

	mock.FailMIGReads(e.gpus[1].UUID, nil)
	e.waitServed("GPU 1 served again once it can be read", map[string]served{
		"nvidia.com/gpu":          {Healthy: 8, Connected: true, Registrations: 1},
		"gpufrac.io/gpu-fraction": {Healthy: 800, Connected: true, Registrations: 1},
	})
	e.waitInventory("GPU 1 healthy again in the inventory", allFraction)
}
