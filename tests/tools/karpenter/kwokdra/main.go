// Command kwokdra is Karpenter's kwok provider (sigs.k8s.io/karpenter/kwok,
// the same wiring as its main) with one addition for gpufrac's test bed: the
// instance types named in the JSON file $DRA_TEMPLATES_FILE_PATH get
// DynamicResources.ResourceSliceTemplates, the devices a DRA driver will
// publish on such a node. Karpenter learns about devices of nodes it has not
// launched only from these templates, and the kwok provider fills none; no
// real provider does either (aws/karpenter-provider-aws#9519), so this is
// what a provider would have to supply. Run with --ignore-dra-requests=false.
//
// The file maps instance type names to templates:
//
//	{"gpu-dra-8x-h100": [{"driver": "gpu.gpufrac.io", "pool": "p",
//	  "sharedCounters": [...]}, {"driver": ..., "pool": "p", "devices": [...]}]}
//
// with devices and counter sets in the resource.k8s.io/v1 shapes
// (ResourceSliceTemplate itself holds unique.Handle values, which JSON
// cannot carry).
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"unique"

	resourcev1 "k8s.io/api/resource/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"

	kwok "sigs.k8s.io/karpenter/kwok/cloudprovider"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"
	"sigs.k8s.io/karpenter/pkg/cloudprovider/overlay"
	"sigs.k8s.io/karpenter/pkg/controllers"
	"sigs.k8s.io/karpenter/pkg/controllers/state"
	"sigs.k8s.io/karpenter/pkg/operator"
)

// templatesEnv names the templates file.
const templatesEnv = "DRA_TEMPLATES_FILE_PATH"

type template struct {
	Driver         string                  `json:"driver"`
	Pool           string                  `json:"pool"`
	Devices        []resourcev1.Device     `json:"devices,omitempty"`
	SharedCounters []resourcev1.CounterSet `json:"sharedCounters,omitempty"`
}

func main() {
	ctx, op := operator.NewOperator()
	instanceTypes, err := kwok.ConstructInstanceTypes(ctx)
	if err != nil {
		log.FromContext(ctx).Error(err, "failed constructing instance types")
	}
	if path := os.Getenv(templatesEnv); path != "" {
		if err := addTemplates(instanceTypes, path); err != nil {
			log.FromContext(ctx).Error(err, "failed reading DRA templates")
			os.Exit(1)
		}
	}

	overlayUndecoratedCloudProvider := kwok.NewCloudProvider(ctx, op.GetClient(), instanceTypes)
	cloudProvider := overlay.Decorate(overlayUndecoratedCloudProvider, op.GetClient(), op.InstanceTypeStore)
	clusterState := state.NewCluster(op.Clock, op.GetClient(), cloudProvider)
	op.
		WithControllers(ctx, controllers.NewControllers(
			ctx,
			op.Manager,
			op.Clock,
			op.GetClient(),
			op.EventRecorder,
			cloudProvider,
			overlayUndecoratedCloudProvider,
			clusterState,
			op.InstanceTypeStore,
		)...).Start(ctx)
}

// addTemplates reads the templates file and sets them on the instance types
// it names; a name the provider does not sell is an error.
func addTemplates(its []*cloudprovider.InstanceType, path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var byType map[string][]template
	if err := json.Unmarshal(raw, &byType); err != nil {
		return fmt.Errorf("parsing %s: %w", path, err)
	}
	for name, ts := range byType {
		found := false
		for _, it := range its {
			if it.Name != name {
				continue
			}
			found = true
			for _, t := range ts {
				rst := &cloudprovider.ResourceSliceTemplate{
					Driver:         unique.Make(t.Driver),
					Pool:           cloudprovider.ResourcePool{Name: unique.Make(t.Pool)},
					SharedCounters: t.SharedCounters,
				}
				for _, d := range t.Devices {
					rst.Devices = append(rst.Devices, cloudprovider.Device{
						Name:                     unique.Make(d.Name),
						Attributes:               d.Attributes,
						Capacity:                 d.Capacity,
						AllowMultipleAllocations: d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations,
						ConsumesCounters:         d.ConsumesCounters,
					})
				}
				it.DynamicResources.ResourceSliceTemplates = append(it.DynamicResources.ResourceSliceTemplates, rst)
			}
		}
		if !found {
			return fmt.Errorf("%s: instance type %q is not sold", path, name)
		}
	}
	return nil
}
