package kubeletsimtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// DRAPlugin is a fake DRA driver behind k8s.io/dynamic-resource-allocation's
// kubeletplugin helper (the real registration and DRA gRPC services): it
// prepares any claim, answering each allocated device of its driver with
// the CDI device "<Vendor>/claim=<claim UID>-<device>", records the calls,
// and fails the next prepare of a claim once when told to.
type DRAPlugin struct {
	// Driver is the driver name whose results it prepares.
	Driver string
	// Vendor is the CDI vendor/class prefix of its answers.
	Vendor string

	mu sync.Mutex
	// prepared: claim UID -> prepared.
	prepared map[types.UID]bool
	// failNext: claim name -> error to answer once.
	failNext map[string]error
	// calls records "prepare <ns>/<name>" and "unprepare <ns>/<name>".
	calls []string
}

var _ kubeletplugin.DRAPlugin = (*DRAPlugin)(nil)

// FailNextPrepare makes the next prepare of the claim named name fail with err.
func (p *DRAPlugin) FailNextPrepare(name string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failNext == nil {
		p.failNext = map[string]error{}
	}
	p.failNext[name] = err
}

// Calls returns the recorded calls.
func (p *DRAPlugin) Calls() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.calls)
}

// Prepared tells whether the claim is prepared.
func (p *DRAPlugin) Prepared(uid types.UID) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.prepared[uid]
}

// PrepareResourceClaims implements kubeletplugin.DRAPlugin.
func (p *DRAPlugin) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.prepared == nil {
		p.prepared = map[types.UID]bool{}
	}
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, c := range claims {
		p.calls = append(p.calls, "prepare "+c.Namespace+"/"+c.Name)
		if err := p.failNext[c.Name]; err != nil {
			delete(p.failNext, c.Name)
			out[c.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		var devs []kubeletplugin.Device
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver != p.Driver {
				continue
			}
			devs = append(devs, kubeletplugin.Device{
				Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device, ShareID: r.ShareID,
				CDIDeviceIDs: []string{fmt.Sprintf("%s/claim=%s-%s", p.Vendor, c.UID, r.Device)},
			})
		}
		p.prepared[c.UID] = true
		out[c.UID] = kubeletplugin.PrepareResult{Devices: devs}
	}
	return out, nil
}

// UnprepareResourceClaims implements kubeletplugin.DRAPlugin.
func (p *DRAPlugin) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[types.UID]error{}
	for _, c := range claims {
		p.calls = append(p.calls, "unprepare "+c.Namespace+"/"+c.Name)
		delete(p.prepared, c.UID)
		out[c.UID] = nil
	}
	return out, nil
}

// HandleError implements kubeletplugin.DRAPlugin; the fake publishes no slices.
func (p *DRAPlugin) HandleError(context.Context, error, string) {}

// ErrInjected is the error tests inject with FailNextPrepare.
var ErrInjected = errors.New("injected failure")
