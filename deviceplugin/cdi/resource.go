package cdi

import (
	"context"
	"fmt"
	"slices"
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

// Allocate implements resource.Resource. The devices behind ids are
// checked before the resource allocates: a refused container must leave no
// trace (the fraction resource records every answer it gives as placed, for
// the next admissions, until the kubelet says otherwise). The response's
// own device names are checked again after.
func (r checked) Allocate(ctx context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	names := make([]string, 0, len(ids))
	for _, id := range ids {
		names = append(names, Name(deviceUUID(id)))
	}
	if err := r.refuseUnresolved(names); err != nil {
		return nil, err
	}
	resp, err := r.Resource.Allocate(ctx, ids)
	if err != nil || len(resp.CdiDevices) == 0 {
		return resp, err
	}
	names = names[:0]
	for _, d := range resp.CdiDevices {
		names = append(names, d.Name)
	}
	if err := r.refuseUnresolved(names); err != nil {
		return nil, err
	}
	return resp, nil
}

// refuseUnresolved returns why the container must be refused when some of
// the CDI names resolve in no spec, counting the refusal; else nil.
func (r checked) refuseUnresolved(names []string) error {
	missing := r.c.Unresolved(slices.Compact(slices.Sorted(slices.Values(names))))
	if len(missing) == 0 {
		return nil
	}
	r.c.metrics.refused.WithLabelValues(r.Name()).Inc()
	return fmt.Errorf("%w: %s is in no spec under %s; the container runtime could not start the container (generate the NVIDIA CDI spec: nvidia-ctk cdi generate --device-name-strategy=uuid --output=/var/run/cdi/nvidia.yaml)",
		ErrUnresolved, strings.Join(missing, ", "), strings.Join(r.c.opts.SpecDirs, ", "))
}
