package agent

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpufrac/gpufrac/deviceplugin/cdi"
	"github.com/gpufrac/gpufrac/deviceplugin/cdi/cditest"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
	"github.com/gpufrac/gpufrac/mig"
	"github.com/gpufrac/gpufrac/tests/kubeletsim"
)

const migConfig = `version: v1
default:
  mode: fraction
  mig: {strategy: mixed, layout: %s}
  gpus: [{indices: "0-1", mode: mig}]
`

// writeSpec writes the spec nvidia-ctk would generate for the mock's
// current inventory: its GPUs and the MIG devices they have now.
func (e *env) writeSpec(dir string) {
	e.t.Helper()
	if _, err := cditest.Write(dir, e.specData()); err != nil {
		e.t.Fatal(err)
	}
}

// specData is the spec nvidia-ctk would generate now (writeSpec).
func (e *env) specData() []byte {
	var migs []mig.Device
	for _, g := range e.gpus {
		insts, err := e.lib.(nvidia.MIGLib).MIGInstances(g.UUID)
		if err != nil {
			continue // MIG off
		}
		for _, in := range insts {
			migs = append(migs, in.Devices...)
		}
	}
	return cditest.Spec(cditest.FromGPUs(e.gpus, migs))
}

// countEvents counts the Node events starting with prefix (event objects:
// a series is one).
func (e *env) countEvents(prefix string) int {
	n := 0
	for _, ev := range e.nodeEvents() {
		if strings.HasPrefix(ev, prefix) {
			n++
		}
	}
	return n
}

// TestCDISpecsAreChecked: with --device-list-strategy=cdi, a node whose
// CDI specs lack the devices it serves says so (event, metric, readiness)
// and refuses allocations with the reason; the toolkit's spec fixes it at
// once; a MIG layout change leaves the spec stale, which is reported again
// until the spec is generated anew (without a regeneration command, by
// someone else: TestCDISpecRegeneratedAfterMIGLayoutChange has gpufrac-node
// run one).
func TestCDISpecsAreChecked(t *testing.T) {
	specDir := filepath.Join(t.TempDir(), "cdi")
	e := startAgentFull(t, strings.Replace(migConfig, "%s", "all-1g.10gb", 1), nil, func(c *Config) {
		c.DeviceListStrategy = resource.StrategyCDI
		c.CDISpecDirs = []string{specDir}
		c.CDICheckInterval = time.Hour // changes are seen through the watch
	})
	e.waitServed("MIG devices on GPUs 0-1, fractions on the rest", map[string]served{
		"nvidia.com/gpu":          {Healthy: 6, Connected: true, Registrations: 1},
		"gpufrac.io/gpu-fraction": {Healthy: 600, Connected: true, Registrations: 1},
		"nvidia.com/mig-1g.10gb":  {Healthy: 14, Connected: true, Registrations: 1},
	})

	// 1. No spec: a Warning event with what is missing and how to fix it,
	// the metric, and /readyz.
	e.poll("a CDISpecMissing event", func() bool { return e.countEvents("Warning CDISpecMissing: ") == 1 })
	for _, ev := range e.nodeEvents() {
		if strings.HasPrefix(ev, "Warning CDISpecMissing: ") && (!strings.Contains(ev, "20 of 20 devices served") || !strings.Contains(ev, "nvidia-ctk cdi generate")) {
			t.Errorf("event %q does not say what is missing and how to fix it", ev)
		}
	}
	// (Ready may first say a resource is still registering: 2 runs in 40
	// saw "device plugins not registered" here.)
	e.poll("Ready() to say ErrUnresolved", func() bool { return errors.Is(e.agent.Ready(), cdi.ErrUnresolved) })
	if v := metricValue(t, e, "gpufrac_cdi_devices_unresolved"); v != 20 {
		t.Errorf("gpufrac_cdi_devices_unresolved = %v, want 20 (6 GPUs, 14 MIG devices)", v)
	}
	_, err := e.kubelet.Allocate(e.ctx, kubeletsim.PodRef{Namespace: "default", Name: "mig-1", UID: "mig-1"}, "main", "nvidia.com/mig-1g.10gb", 1)
	if err == nil || !strings.Contains(err.Error(), "not in the node's CDI specs") {
		t.Errorf("Allocate without a spec = %v, want it refused with the reason", err)
	}

	// 2. The toolkit writes the spec: resolved at once.
	e.writeSpec(specDir)
	e.poll("a CDISpecResolved event and readiness", func() bool {
		return e.countEvents("Normal CDISpecResolved: ") == 1 && e.agent.Ready() == nil
	})
	a, err := e.kubelet.Allocate(e.ctx, kubeletsim.PodRef{Namespace: "default", Name: "mig-2", UID: "mig-2"}, "main", "nvidia.com/mig-1g.10gb", 1)
	if err != nil {
		t.Fatalf("Allocate with the spec: %v", err)
	}
	if len(a.Response.CdiDevices) != 1 || a.Response.CdiDevices[0].Name != cdi.Name(a.DeviceIDs[0]) {
		t.Errorf("CDI devices %v, want %s", a.Response.CdiDevices, cdi.Name(a.DeviceIDs[0]))
	}
	e.kubelet.Release("mig-2")

	// 3. The admin changes the MIG layout: the spec no longer names the new
	// MIG devices, and the node says so again (counted on the first
	// CDISpecMissing event's series).
	e.writeConfig(strings.Replace(migConfig, "%s", "all-3g.40gb", 1))
	e.poll("a second CDISpecMissing event after the MIG layout change", func() bool {
		return e.occurrences("Warning CDISpecMissing: ") == 2
	})
	// (Ready may first say the new MIG resource is registering.)
	e.poll("Ready() to say ErrUnresolved after the layout change", func() bool { return errors.Is(e.agent.Ready(), cdi.ErrUnresolved) })
	e.writeSpec(specDir)
	e.poll("resolved again after the spec was generated anew", func() bool {
		return e.countEvents("Normal CDISpecResolved: ") >= 1 && e.agent.Ready() == nil && metricValue(t, e, "gpufrac_cdi_devices_unresolved") == 0
	})
	// Without a regeneration command (today's behaviour) none runs.
	if got := regenerations(t, e, "success"); got != -1 {
		t.Errorf("gpufrac_cdi_regenerations_total exported without a regeneration command (%v)", got)
	}
	if got := metricValue(t, e, "gpufrac_cdi_devices_served"); got != 6+4 {
		t.Errorf("gpufrac_cdi_devices_served = %v, want 10 (6 GPUs, 2x2 3g.40gb)", got)
	}
}

// metricValue reads an unlabelled gauge from the agent's registry.
func metricValue(t *testing.T, e *env, name string) float64 {
	t.Helper()
	mfs, err := e.agent.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}
