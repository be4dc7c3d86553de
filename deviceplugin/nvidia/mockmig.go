package nvidia

import (
	"crypto/sha256"
	"fmt"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/gpufrac/gpufrac/mig"
)

// mockMIG is the MIG state the go-nvml mock servers lack: a pending MIG
// mode that waits for a reset. The servers apply SetMigMode at once and
// report current == pending; gpufrac's mock instead refuses to activate a
// mode change on a GPU that has processes (NVML_ERROR_IN_USE, as the driver
// does) or that was told it needs a reset (NVML_ERROR_RESET_REQUIRED), and
// keeps the requested mode pending until ResetGPU.
type mockMIG struct {
	mu sync.Mutex
	// pending: GPU UUID -> requested MIG mode waiting for a reset.
	pending map[string]bool
	// needsReset: GPU UUID -> mode changes on it need a reset.
	needsReset map[string]bool
	// readFault: GPU UUID -> the error MIGMode and MIGInstances return.
	readFault map[string]error
}

func newMockMIG() *mockMIG {
	return &mockMIG{pending: map[string]bool{}, needsReset: map[string]bool{}, readFault: map[string]error{}}
}

// FailMIGReads makes MIGMode, MIGProfiles and MIGInstances of a GPU
// return err (wrapped), as NVML does for a GPU it has lost;
// FailMIGReads(uuid, nil) heals it.
func (m *Mock) FailMIGReads(uuid string, err error) {
	m.mig.mu.Lock()
	defer m.mig.mu.Unlock()
	if err == nil {
		delete(m.mig.readFault, uuid)
		return
	}
	m.mig.readFault[uuid] = err
}

// readFaultOf is the error FailMIGReads set for a GPU, or nil.
func (m *Mock) readFaultOf(uuid string) error {
	m.mig.mu.Lock()
	defer m.mig.mu.Unlock()
	if err := m.mig.readFault[uuid]; err != nil {
		return fmt.Errorf("reading MIG state of %s: %w", uuid, err)
	}
	return nil
}

// MIGMode implements MIGLib: the mock server's mode is current, the one
// waiting for ResetGPU (if any) pending.
func (m *Mock) MIGMode(uuid string) (MIGMode, error) {
	if err := m.readFaultOf(uuid); err != nil {
		return MIGMode{}, err
	}
	mode, err := m.nvmlLib.MIGMode(uuid)
	if err != nil {
		return mode, err
	}
	m.mig.mu.Lock()
	defer m.mig.mu.Unlock()
	if p, ok := m.mig.pending[uuid]; ok {
		mode.Pending = p
	}
	return mode, nil
}

// SetMIGMode implements MIGLib. A change is activated at once, as on an idle
// bare-metal GPU, unless the GPU has fake processes (ErrInUse), still has
// GPU instances when MIG is being disabled (ErrInUse), or
// RequireMIGModeReset was set for it (ErrResetRequired); then the mode
// stays pending until ResetGPU, or until SetMIGMode asks for the current
// mode again.
func (m *Mock) SetMIGMode(uuid string, enabled bool) error {
	g, err := m.gpu(uuid)
	if err != nil {
		return fmt.Errorf("setting MIG mode: %w", err)
	}
	cur, err := m.nvmlLib.MIGMode(uuid)
	if err != nil {
		return fmt.Errorf("setting MIG mode: %w", err)
	}
	m.mig.mu.Lock()
	defer m.mig.mu.Unlock()
	if enabled == cur.Current {
		delete(m.mig.pending, uuid)
		return nil
	}
	m.mu.Lock()
	busy := len(g.procs) > 0
	m.mu.Unlock()
	if !enabled && mockInstanceCount(g.dev) > 0 {
		busy = true
	}
	var activation nvml.Return
	switch {
	case m.mig.needsReset[uuid]:
		activation = nvml.ERROR_RESET_REQUIRED
	case busy:
		activation = nvml.ERROR_IN_USE
	default:
		delete(m.mig.pending, uuid)
		return m.nvmlLib.SetMIGMode(uuid, enabled)
	}
	m.mig.pending[uuid] = enabled
	return fmt.Errorf("activating MIG mode %v on %s: %w", enabled, uuid, activationError(activation))
}

// RequireMIGModeReset makes MIG mode changes on a GPU wait for ResetGPU
// (required) or be activated at once when the GPU is idle (not required,
// the default).
func (m *Mock) RequireMIGModeReset(uuid string, required bool) error {
	if _, err := m.gpu(uuid); err != nil {
		return fmt.Errorf("requiring MIG mode reset: %w", err)
	}
	m.mig.mu.Lock()
	defer m.mig.mu.Unlock()
	if required {
		m.mig.needsReset[uuid] = true
	} else {
		delete(m.mig.needsReset, uuid)
	}
	return nil
}

// ResetGPU plays a GPU reset: a pending MIG mode takes effect, and a mode
// change destroys every GPU instance.
func (m *Mock) ResetGPU(uuid string) error {
	g, err := m.gpu(uuid)
	if err != nil {
		return fmt.Errorf("resetting GPU: %w", err)
	}
	m.mig.mu.Lock()
	defer m.mig.mu.Unlock()
	p, ok := m.mig.pending[uuid]
	if !ok {
		return nil
	}
	delete(m.mig.pending, uuid)
	g.dev.Lock()
	g.dev.GpuInstances = map[*server.GpuInstance]struct{}{}
	g.dev.Unlock()
	if err := m.nvmlLib.SetMIGMode(uuid, p); err != nil {
		return fmt.Errorf("resetting GPU: %w", err)
	}
	return nil
}

// mockInstanceCount is the number of GPU instances on a mock server device.
func mockInstanceCount(d *server.Device) int {
	d.RLock()
	defer d.RUnlock()
	return len(d.GpuInstances)
}

// MIGInstances implements MIGLib with synthesized MIG device UUIDs.
// MIGProfiles implements MIGLib (failing as FailMIGReads says).
func (m *Mock) MIGProfiles(uuid string) ([]mig.Profile, error) {
	if err := m.readFaultOf(uuid); err != nil {
		return nil, err
	}
	return m.nvmlLib.MIGProfiles(uuid)
}

func (m *Mock) MIGInstances(uuid string) ([]mig.GPUInstance, error) {
	if err := m.readFaultOf(uuid); err != nil {
		return nil, err
	}
	return m.nvmlLib.migInstances(uuid, mockMIGUUIDs)
}

// CreateMIGInstance implements MIGLib with synthesized MIG device UUIDs.
func (m *Mock) CreateMIGInstance(uuid string, profileID int, at mig.Placement) (mig.GPUInstance, error) {
	return m.nvmlLib.createMIGInstance(uuid, profileID, at, mockMIGUUIDs)
}

// mockMIGUUIDs names every compute instance of a mock GPU with MockMIGUUID.
// The mock servers panic on MIG device handles, so the UUIDs cannot be read.
func mockMIGUUIDs(d nvml.Device, parent string) (map[[2]int]string, error) {
	gis, err := listGPUInstances(d, parent)
	if err != nil {
		return nil, err
	}
	out := map[[2]int]string{}
	for _, h := range gis {
		cis, err := listComputeInstances(h.gi)
		if err != nil {
			return nil, err
		}
		for _, c := range cis {
			out[[2]int{int(h.info.Id), int(c.info.Id)}] = MockMIGUUID(parent, int(h.info.Id), int(c.info.Id))
		}
	}
	return out, nil
}

// MockMIGUUID is the UUID the mock gives the MIG device of GPU instance gi,
// compute instance ci on the GPU parent: "MIG-" and a version-5-style UUID
// derived from the three, so it is stable for the same instance IDs.
func MockMIGUUID(parent string, gi, ci int) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "gpufrac-mock-mig\x00%s\x00%d\x00%d", parent, gi, ci))
	b := sum[:16]
	b[6] = b[6]&0x0f | 0x50
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("MIG-%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
