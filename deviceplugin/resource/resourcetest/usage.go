// Package resourcetest has fakes for the seams of package resource.
package resourcetest

import (
	"context"
	"sync"

	"github.com/gpufrac/gpufrac/deviceplugin/resource"
)

// Usage is a resource.UsageSource answering a fixed per-GPU usage (nil:
// nothing allocated), that can be told to fail once, as the kubelet's
// PodResources does while the kubelet restarts.
type Usage struct {
	mu sync.Mutex
	// ByGPU is what Usage answers; set it before use or under Set.
	ByGPU map[string]resource.GPUUsage
	// NextErr, when set, is returned by the next call, then cleared.
	NextErr error
	// Calls counts the calls.
	Calls int
}

var _ resource.UsageSource = (*Usage)(nil)

// Usage implements resource.UsageSource.
func (u *Usage) Usage(context.Context) (map[string]resource.GPUUsage, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.Calls++
	if err := u.NextErr; err != nil {
		u.NextErr = nil
		return nil, err
	}
	return u.ByGPU, nil
}

// FailOnce makes the next call fail with err.
func (u *Usage) FailOnce(err error) {
	u.mu.Lock()
	u.NextErr = err
	u.mu.Unlock()
}
