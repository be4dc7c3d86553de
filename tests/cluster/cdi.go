package cluster

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/cdi/cditest"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
	"github.com/gpufrac/gpufrac/mig"
)

// toolkitSpecs plays the NVIDIA container toolkit of one test-bed node for
// --device-list-strategy=cdi: it keeps a CDI spec in the form
// `nvidia-ctk cdi generate` writes in the node's spec directory, for the
// node's mock GPUs and the MIG devices they have now, as the toolkit's spec
// refresh does on a real node. The GPUs' part is written before gpufrac-node
// starts; the MIG devices are added when the node's device lists change,
// before the node's status shows them (its OnChange callback comes first),
// so no pod is placed on a device the spec lacks.
type toolkitSpecs struct {
	dir  string
	gpus []nvidia.GPU
	// migs maps every MIG UUID the mock can give these GPUs to its device.
	migs map[string]mig.Device

	mu      sync.Mutex
	devices map[string][]string // resource -> device IDs served
	written string              // the spec last written
}

// mockMIGInstances bounds the GPU and compute instance IDs the mock gives.
const mockMIGInstances = 16

// newToolkitSpecs writes the GPUs' spec for a node's mock model into dir.
func newToolkitSpecs(dir, node, model string, gpuCount int) (*toolkitSpecs, error) {
	lib, err := nvidia.NewMock(model, nvidia.WithUUIDSeed(node), nvidia.WithGPUCount(gpuCount))
	if err != nil {
		return nil, fmt.Errorf("the CDI spec of node %s: %w", node, err)
	}
	if err := lib.Init(); err != nil {
		return nil, fmt.Errorf("the CDI spec of node %s: %w", node, err)
	}
	gpus, err := lib.GPUs()
	_ = lib.Shutdown()
	if err != nil {
		return nil, fmt.Errorf("the CDI spec of node %s: %w", node, err)
	}
	t := &toolkitSpecs{dir: dir, gpus: gpus, migs: map[string]mig.Device{}, devices: map[string][]string{}}
	for _, g := range gpus {
		for gi := range mockMIGInstances {
			for ci := range mockMIGInstances {
				u := nvidia.MockMIGUUID(g.UUID, gi, ci)
				t.migs[u] = mig.Device{UUID: u, GPU: g.UUID, GI: gi, CI: ci}
			}
		}
	}
	return t, t.write()
}

// update is the node's kubelet simulator's OnChange callback.
func (t *toolkitSpecs) update(res string, devs []*v1beta1.Device) {
	ids := make([]string, 0, len(devs))
	for _, d := range devs {
		ids = append(ids, d.ID)
	}
	t.mu.Lock()
	t.devices[res] = ids
	t.mu.Unlock()
	if err := t.write(); err != nil {
		klog.Background().Error(err, "Writing the test bed's CDI spec", "dir", t.dir)
	}
}

// write writes the spec for the GPUs and the MIG devices served, when it changed.
func (t *toolkitSpecs) write() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	var migs []mig.Device
	for _, ids := range t.devices {
		for _, id := range ids {
			if _, _, err := resource.ParseUnitID(id); err == nil || !strings.HasPrefix(id, "MIG-") {
				continue
			}
			if m, ok := t.migs[id]; ok {
				migs = append(migs, m)
			}
		}
	}
	slices.SortFunc(migs, func(a, b mig.Device) int {
		return strings.Compare(fmt.Sprintf("%s/%03d/%03d", a.GPU, a.GI, a.CI), fmt.Sprintf("%s/%03d/%03d", b.GPU, b.GI, b.CI))
	})
	spec := string(cditest.Spec(cditest.FromGPUs(t.gpus, migs)))
	if spec == t.written {
		return nil
	}
	if _, err := cditest.Write(t.dir, []byte(spec)); err != nil {
		return err
	}
	t.written = spec
	return nil
}

// draDevices is the key in toolkitSpecs.devices of the MIG devices the
// node's DRA driver publishes.
const draDevices = "dra:" + api.DRADriver

// followDRA keeps the spec's MIG devices in step with those the node's
// gpufrac-node publishes as DRA driver (mode dra), whose devices are in no
// device-plugin list: the toolkit's spec refresh after a MIG change. It
// polls every 500 ms until ctx ends (a claim prepared before that is refused
// and retried by the kubelet simulator).
func (t *toolkitSpecs) followDRA(ctx context.Context, client kubernetes.Interface, node string) {
	_ = wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
			FieldSelector: "spec.nodeName=" + node + ",spec.driver=" + api.DRADriver,
		})
		if err != nil {
			return false, nil
		}
		var ids []string
		for _, sl := range list.Items {
			for _, d := range sl.Spec.Devices {
				if a := d.Attributes[api.DRAAttrType]; a.StringValue == nil || *a.StringValue != api.DRATypeMIG {
					continue
				}
				if u := d.Attributes[api.DRAAttrUUID].StringValue; u != nil {
					ids = append(ids, *u)
				}
			}
		}
		slices.Sort(ids)
		t.mu.Lock()
		same := slices.Equal(t.devices[draDevices], ids)
		t.devices[draDevices] = ids
		t.mu.Unlock()
		if !same {
			if err := t.write(); err != nil {
				klog.FromContext(ctx).Error(err, "Writing the test bed's CDI spec", "dir", t.dir)
			}
		}
		return false, nil
	})
}

// specDir is a node agent's CDI spec directory.
func specDir(nodeDir string) string { return filepath.Join(nodeDir, "cdi") }
