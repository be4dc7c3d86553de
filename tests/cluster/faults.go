package cluster

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/gpufrac/gpufrac/tests/kubeletsim"
)

// This file holds the faults the chaos suite injects: an API server
// restarted in place (etcd kept), gpufrac-node killed and started again
// with live allocations, the kubelet simulator restarted.

// running is a started component that can be started again on its ports.
type running struct {
	comp  component
	ports []int
	proc  *process
}

// RestartAPIServer stops kube-apiserver (SIGTERM, SIGKILL after 10 s) and
// starts it again on the same port with the same flags, as an API server
// restarted in place: etcd and every client keep running and reconnect. It
// returns once the new process reports ready.
func (c *Cluster) RestartAPIServer(ctx context.Context) error {
	c.mu.Lock()
	rs := c.apiServer
	c.mu.Unlock()
	if rs == nil {
		return fmt.Errorf("restarting kube-apiserver: not started")
	}
	began := time.Now()
	if err := rs.proc.stop(10 * time.Second); err != nil {
		return fmt.Errorf("restarting kube-apiserver: %w", err)
	}
	p, err := c.launch(ctx, rs.comp, rs.ports)
	if p == nil || err != nil {
		return fmt.Errorf("restarting kube-apiserver on port %d: %w", rs.ports[0], err)
	}
	c.mu.Lock()
	rs.proc = p
	c.mu.Unlock()
	klog.FromContext(ctx).Info("Restarted kube-apiserver", "pid", p.PID, "duration", time.Since(began).Round(time.Millisecond))
	return nil
}

// agentControl restarts a node's gpufrac-node and kubelet simulator. While
// a restart runs, the node admits no pod (admission requeues them): a
// kubelet restarting admits nothing yet, and the pods it was admitting are
// admitted again once the plugin has registered. (A real kubelet whose
// plugin vanished rejects the pods it admits meanwhile; the restarts here
// are the test's, made to check what gpufrac does across them.)
type agentControl struct {
	c    *Cluster
	comp component

	mu   sync.Mutex // guards node and serializes restarts
	node *running   // the current gpufrac-node process

	inRestart atomic.Bool
}

// restarting tells whether a restart is under way (false for a nil control:
// nodes without agents).
func (a *agentControl) restarting() bool { return a != nil && a.inRestart.Load() }

// stop stops the current gpufrac-node process.
func (a *agentControl) stop() {
	a.mu.Lock()
	defer a.mu.Unlock()
	_ = a.node.proc.stop(5 * time.Second)
}

// Process is the node agent's current gpufrac-node process (after restarts,
// not the one PID names) and its metrics address.
func (a *NodeAgent) Process() (Process, string) {
	a.ctl.mu.Lock()
	defer a.ctl.mu.Unlock()
	return a.ctl.node.proc.Process, fmt.Sprintf("127.0.0.1:%d", a.ctl.node.ports[0])
}

// RestartAgent kills gpufrac-node with SIGKILL (a crash: no cleanup, its
// sockets left behind) and starts it again with the same flags, while the
// pods it served keep their devices in the kubelet simulator. It returns
// once the new process is ready (every resource registered again) and the
// simulator lists devices for every resource it knew.
func (a *NodeAgent) RestartAgent(ctx context.Context) error {
	a.ctl.mu.Lock()
	defer a.ctl.mu.Unlock()
	a.ctl.inRestart.Store(true)
	defer a.ctl.inRestart.Store(false)
	before := a.Kubelet.Resources()
	old := a.ctl.node.proc
	if err := killGroup(old); err != nil {
		return fmt.Errorf("killing gpufrac-node on %s: %w", a.Node, err)
	}
	ports, p, err := a.ctl.c.startComponent(ctx, a.ctl.comp)
	if err != nil {
		return fmt.Errorf("starting gpufrac-node on %s again: %w", a.Node, err)
	}
	a.ctl.node = &running{comp: a.ctl.comp, ports: ports, proc: p}
	return a.waitRegistered(ctx, before)
}

// RestartKubelet restarts the node's kubelet simulator (kubeletsim
// Restart: plugin connections close, sockets are removed, allocations are
// kept) and returns once every resource it knew is registered again with
// devices. Pods it was admitting are admitted again after it. midway, when
// not nil, is called once the simulator has restarted and before its
// plugins are back: the moment to let an Allocate held in BeforeAllocate go
// on into the restarted simulator.
func (a *NodeAgent) RestartKubelet(ctx context.Context, midway func()) error {
	a.ctl.mu.Lock()
	defer a.ctl.mu.Unlock()
	a.ctl.inRestart.Store(true)
	defer a.ctl.inRestart.Store(false)
	before := a.Kubelet.Resources()
	if err := a.Kubelet.Restart(ctx); err != nil {
		return fmt.Errorf("restarting the kubelet simulator of %s: %w", a.Node, err)
	}
	if midway != nil {
		midway()
	}
	return a.waitRegistered(ctx, before)
}

// waitRegistered waits until every resource of before has registered again
// since and lists devices.
func (a *NodeAgent) waitRegistered(ctx context.Context, before map[string]kubeletsim.ResourceState) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	err := a.Kubelet.Wait(ctx, func(now map[string]kubeletsim.ResourceState) bool {
		for name, was := range before {
			s, ok := now[name]
			if !ok || !s.Connected || s.Registrations <= was.Registrations || s.Capacity == 0 {
				return false
			}
		}
		return true
	})
	if err != nil {
		return fmt.Errorf("waiting for the plugins of %s to register again (%v): %w", a.Node, slices.Sorted(maps.Keys(before)), err)
	}
	return nil
}

// killGroup sends SIGKILL to the process group at once (no SIGTERM: a
// crash, nothing cleaned up) and waits for it to end.
func killGroup(p *process) error {
	if err := syscall.Kill(-p.PID, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("sending SIGKILL to %s (pgid %d): %w", p.Name, p.PID, err)
	}
	<-p.done
	return nil
}

// nodeAgentGracePeriod is how long a rolled gpufrac-node gets between
// SIGTERM and SIGKILL: the pod's terminationGracePeriodSeconds (the chart
// leaves the Kubernetes default).
const nodeAgentGracePeriod = 30 * time.Second

// Roll replaces the node's gpufrac-node with binary, run with the arguments
// and config of the chart installed now (Cluster.InstallChart), as a
// DaemonSet's rolling update replaces the agent's pod on one node: the old
// process is stopped (SIGTERM, SIGKILL after the grace period), then the new
// one starts. The kubelet simulator with the pods' devices, the mounted
// ConfigMap and the agent's identity (its pod and token) are kept. It returns
// once the new process is ready and every resource the node had is
// registered again with devices; later restarts (RestartAgent) run binary.
func (a *NodeAgent) Roll(ctx context.Context, binary string) error {
	c := a.ctl.c
	in := c.Installed()
	if in == nil {
		return fmt.Errorf("rolling gpufrac-node on %s: no chart installed", a.Node)
	}
	if cdiStrategy(in) != a.cdi {
		return fmt.Errorf("rolling gpufrac-node on %s: the chart changes the device list strategy (CDI), which the test bed sets up when a node starts only", a.Node)
	}
	a.ctl.mu.Lock()
	defer a.ctl.mu.Unlock()
	comp, err := c.nodeAgentComponent(a, in, binary)
	if err != nil {
		return fmt.Errorf("rolling gpufrac-node on %s: %w", a.Node, err)
	}
	a.ctl.inRestart.Store(true)
	defer a.ctl.inRestart.Store(false)
	before := a.Kubelet.Resources()
	began := time.Now()
	if err := a.ctl.node.proc.stop(nodeAgentGracePeriod); err != nil {
		return fmt.Errorf("stopping gpufrac-node on %s: %w", a.Node, err)
	}
	ports, p, err := c.startComponent(ctx, comp)
	if err != nil {
		return fmt.Errorf("starting the new gpufrac-node on %s: %w", a.Node, err)
	}
	a.ctl.comp = comp
	a.ctl.node = &running{comp: comp, ports: ports, proc: p}
	if err := a.waitRegistered(ctx, before); err != nil {
		return err
	}
	klog.FromContext(ctx).Info("Rolled gpufrac-node", "node", a.Node, "binary", binary, "pid", p.PID,
		"duration", time.Since(began).Round(time.Millisecond))
	return nil
}
