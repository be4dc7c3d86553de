package cdi

import (
	"context"
	"fmt"
	"strings"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpufrac/gpufrac/deviceplugin/resource"
)

// Checked wraps resources so that Allocate refuses a container whose CDI
// devices resolve in no spec: the kubelet then fails the pod with this
// reason (UnexpectedAdmissionError) instead of the runtime failing later
// with an opaque one. It also gives the Checker the names they serve.
func (c *Checker) Checked(rs []resource.Resource) []resource.Resource {
	out := make([]resource.Resource, len(rs))
	var names []string
	for i, r := range rs {
		out[i] = checked{Resource: r, c: c}
		for _, d := range r.Devices() {
			names = append(names, Name(deviceUUID(d.ID)))
		}
	}
	c.SetWanted(names)
	return out
}

// deviceUUID is the GPU or MIG UUID of a device ID: whole GPUs and MIG
// devices are their UUID, fraction units and replicas "<uuid>::<k>".
func deviceUUID(id string) string {
	if uuid, _, err := resource.ParseUnitID(id); err == nil {
		return uuid
	}
	return id
}

// checked is a resource whose allocations are checked against the specs.
type checked struct {
	resource.Resource
	c *Checker
}

// Allocate implements resource.Resource.
func (r checked) Allocate(ctx context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	resp, err := r.Resource.Allocate(ctx, ids)
	if err != nil || len(resp.CdiDevices) == 0 {
		return resp, err
	}
	names := make([]string, len(resp.CdiDevices))
	for i, d := range resp.CdiDevices {
		names[i] = d.Name
	}
	if missing := r.c.Unresolved(names); len(missing) > 0 {
		r.c.metrics.refused.WithLabelValues(r.Name()).Inc()
		return nil, fmt.Errorf("%w: %s is in no spec under %s; the container runtime could not start the container (generate the NVIDIA CDI spec: nvidia-ctk cdi generate --device-name-strategy=uuid --output=/var/run/cdi/nvidia.yaml)",
			ErrUnresolved, strings.Join(missing, ", "), strings.Join(r.c.opts.SpecDirs, ", "))
	}
	return resp, nil
}
