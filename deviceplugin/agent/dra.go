package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/cdi"
	"github.com/gpufrac/gpufrac/deviceplugin/config"
	"github.com/gpufrac/gpufrac/deviceplugin/dra"
	"github.com/gpufrac/gpufrac/deviceplugin/draplugin"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/mig"
)

// DRAConfig is where gpufrac-node meets the kubelet as a DRA driver (nodes
// in mode dra).
type DRAConfig struct {
	// API is what the driver reads claims and publishes ResourceSlices
	// with (draplugin.NewClient). Nil: mode dra cannot be served.
	API draplugin.API
	// RegistryDir is the kubelet's plugin registration directory
	// ("" is draplugin.KubeletRegistryDir).
	RegistryDir string
	// PluginDir is the driver's own directory, where the DRA socket lives
	// ("" is <draplugin.KubeletPluginsDir>/gpu.gpufrac.io).
	PluginDir string
	// StateDir holds the prepared-claims record ("" is PluginDir).
	StateDir string
	// CDIDir is where per-claim CDI specs are written ("" is dra.DefaultCDIDir).
	CDIDir string
}

// ErrServingChanged rejects a config that moves the node between device
// plugins and DRA: the kubelet would see the same GPUs offered twice, so
// gpufrac-node changes its serving path only when it restarts.
var ErrServingChanged = errors.New("switching a node between device plugins (modes exclusive, fraction, timeslice, mig) and DRA (mode dra) needs a restart of gpufrac-node")

// draServing is the running DRA driver of a node in mode dra.
type draServing struct {
	driver *dra.Driver
	server *draplugin.Server
	// publisher publishes the node's ResourceSlices; stopPublisher ends it
	// and waits.
	publisher     *draplugin.Publisher
	stopPublisher func()
	// fatal receives the driver's first fatal background error: Run
	// returns it, and gpufrac-node exits to be restarted.
	fatal chan error
}

// startDRA starts the DRA driver: the prepared-claims record, the kubelet
// plugin registration and DRA service, and the ResourceSlice publisher
// (package draplugin). Slices are published by publishDRA.
func (a *Agent) startDRA(ctx context.Context) error {
	c := a.cfg.DRA
	if c.API == nil || a.client == nil || a.cfg.NodeName == "" {
		return errors.New("mode dra needs API access (a kubeconfig or the in-cluster config) and --node-name")
	}
	pluginDir := c.PluginDir
	if pluginDir == "" {
		pluginDir = filepath.Join(draplugin.KubeletPluginsDir, api.DRADriver)
	}
	stateDir := c.StateDir
	if stateDir == "" {
		stateDir = pluginDir
	}
	// The kubelet makes the registry directory; the driver's own is ours.
	if err := os.MkdirAll(pluginDir, 0o750); err != nil {
		return fmt.Errorf("starting the DRA driver: %w", err)
	}
	o := dra.Options{NodeName: a.cfg.NodeName, StateDir: stateDir, CDIDir: c.CDIDir, Strategy: a.cfg.DeviceListStrategy}
	if a.cdi != nil {
		o.Unresolved = a.cdi.Unresolved
	}
	driver, err := dra.NewDriver(o)
	if err != nil {
		return fmt.Errorf("starting the DRA driver: %w", err)
	}
	pub, err := draplugin.NewPublisher(draplugin.PublisherOptions{
		Driver: api.DRADriver, Node: a.cfg.NodeName, API: c.API, OnError: driver.HandleError,
		NodeUID: func(ctx context.Context) (types.UID, error) {
			n, err := a.client.GetNode(ctx, a.cfg.NodeName)
			if err != nil {
				return "", err
			}
			return n.UID, nil
		},
	})
	if err != nil {
		return fmt.Errorf("starting the DRA driver %s: %w", api.DRADriver, err)
	}
	server, err := draplugin.StartServer(ctx, driver, draplugin.ServerOptions{
		Driver: api.DRADriver, RegistryDir: c.RegistryDir, PluginDir: pluginDir, Claims: c.API,
	})
	if err != nil {
		return fmt.Errorf("starting the DRA driver %s: %w", api.DRADriver, err)
	}
	pubCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		pub.Run(klog.NewContext(pubCtx, klog.LoggerWithName(klog.FromContext(ctx), "resourceslices")))
	}()
	a.dra = &draServing{driver: driver, server: server, publisher: pub, fatal: make(chan error, 1),
		stopPublisher: func() { cancel(); <-done }}
	driver.OnFatal(func(err error) {
		select {
		case a.dra.fatal <- err:
		default:
		}
	})
	driver.OnTaintsDropped(func() {
		if err := a.apply(ctx, nil, a.deps); err != nil {
			klog.FromContext(ctx).Error(err, "Republishing DRA devices without taints")
		}
	})
	klog.FromContext(ctx).Info("Serving GPUs through DRA", "driver", api.DRADriver, "pluginDir", pluginDir, "stateDir", stateDir, "preparedClaims", len(driver.Prepared()))
	return nil
}

// stopDRA stops the kubelet's servers (their sockets go) and slice
// publishing. Published slices stay: the kubelet removes them when the
// plugin is gone for good.
func (a *Agent) stopDRA() {
	if a.dra != nil {
		a.dra.server.Stop()
		a.dra.stopPublisher()
	}
}

// draGPUs is what the driver publishes for a resolved policy: each GPU's
// mode and health, and the GPU instances of GPUs in mode mig.
func (a *Agent) draGPUs(ctx context.Context, np config.NodePolicy) []dra.GPU {
	out := make([]dra.GPU, len(a.gpus))
	for i, g := range a.gpus {
		out[i] = dra.GPU{GPU: g, Healthy: a.checker == nil || a.checker.Healthy(g.UUID)}
		if i < len(np.GPUModes) {
			out[i].Mode = np.GPUModes[i]
		}
		if out[i].Mode == config.ModeMIG {
			out[i].MIG = a.migInstances(ctx, g)
		}
	}
	return out
}

// migInstances lists a GPU's GPU instances while its MIG mode is on
// (empty otherwise, or when NVML cannot tell: logged).
func (a *Agent) migInstances(ctx context.Context, g nvidia.GPU) []mig.GPUInstance {
	lib, ok := a.lib.(nvidia.MIGLib)
	if !ok || !g.MIGCapable {
		return nil
	}
	mode, err := lib.MIGMode(g.UUID)
	if err != nil || !mode.Current {
		return nil
	}
	instances, err := lib.MIGInstances(g.UUID)
	if err != nil {
		klog.FromContext(ctx).Error(err, "MIG devices not published", "gpu", g.UUID)
		return nil
	}
	return instances
}

// buildDRA builds the pool a resolved policy publishes (without unhealthy
// GPUs once the API server is known to drop device taints).
func (a *Agent) buildDRA(ctx context.Context, np config.NodePolicy) (dra.Published, error) {
	gpus := a.draGPUs(ctx, np)
	if a.dra != nil && a.dra.driver.TaintsDropped() {
		gpus = dra.WithoutUnhealthy(gpus)
	}
	return dra.Build(a.cfg.NodeName, gpus)
}

// publishDRA publishes the pool of np and tells the driver what its device
// names stand for.
func (a *Agent) publishDRA(ctx context.Context, np config.NodePolicy) error {
	p, err := a.buildDRA(ctx, np)
	if err != nil {
		return err
	}
	a.dra.driver.SetTargets(p.Targets)
	if a.cdi != nil {
		// The node's CDI check covers the GPUs and MIG devices published.
		var names []string
		for _, t := range p.Targets {
			uuid := t.GPU.UUID
			if t.View == api.DRAViewMIG {
				uuid = t.MIG.UUID
			}
			names = append(names, cdi.Name(uuid))
		}
		a.cdi.SetWanted(names)
	}
	a.dra.publisher.Publish(p.Resources)
	klog.FromContext(ctx).Info("Publishing DRA devices", "driver", api.DRADriver, "devices", len(p.Targets))
	return nil
}

// draRegistered tells whether the kubelet accepted the driver's registration.
func (a *Agent) draRegistered() bool {
	st := a.dra.server.RegistrationStatus()
	return st != nil && st.PluginRegistered
}

// draAllocations lists what prepared claims hold, for the MIG layout
// manager: GPU UUIDs, and MIG UUIDs for MIG devices.
func (a *Agent) draAllocations() []string {
	var out []string
	for _, c := range a.dra.driver.Prepared() {
		for _, d := range c.Devices {
			if d.MIG != "" {
				out = append(out, d.MIG)
				continue
			}
			out = append(out, d.GPU)
		}
	}
	return out
}
