// Package miglayout is the node agent's MIG layout manager: it turns each
// GPU's declared MIG mode and layout (from the node's config) into GPU and
// compute instances through NVML (nvidia.MIGLib), deferring changes while
// the kubelet has devices of the GPU allocated, and reports where each GPU
// stands. The layout arithmetic it applies (Expand, Diff, Describe) is the
// pure vocabulary in package mig.
package miglayout

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpufrac/gpufrac/deviceplugin/config"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/mig"
)

// AllocationsFunc lists the device IDs the kubelet has allocated on this
// node, by resource name (from the PodResources API). An error means the
// allocations are unknown, and the manager then touches no GPU.
type AllocationsFunc func(ctx context.Context) (map[string][]string, error)

// State is where a GPU's declared MIG configuration stands.
type State string

// The states of a GPU in a Status.
const (
	// StateApplied: the GPU's MIG mode and layout are as declared.
	StateApplied State = "Applied"
	// StatePending: a change is needed but waits (see Reason).
	StatePending State = "Pending"
	// StateFailed: applying the change failed; it is retried.
	StateFailed State = "Failed"
)

// Reasons a change is pending or failed.
const (
	// ReasonDevicesAllocated: pods hold devices on the GPU; the change is
	// applied once they are freed.
	ReasonDevicesAllocated = "DevicesAllocated"
	// ReasonAllocationsUnknown: PodResources cannot be read, so the GPU may
	// be in use and is left alone.
	ReasonAllocationsUnknown = "AllocationsUnknown"
	// ReasonResetRequired: the MIG mode change needs a GPU reset; the mode
	// was left as found.
	ReasonResetRequired = "ResetRequired"
	// ReasonInUse: processes use the GPU, so the MIG mode change could not
	// be activated (the mode was left as found) or an instance could not be
	// destroyed.
	ReasonInUse = "InUse"
	// ReasonNoLayout: mode mig without a layout on a GPU whose MIG mode is
	// disabled: there is nothing to keep and nothing to create.
	ReasonNoLayout = "NoLayout"
	// ReasonNotSupported: the GPU has no MIG.
	ReasonNotSupported = "NotSupported"
	// ReasonNVMLError: an NVML call failed. It is retried with an
	// exponential back-off (Options.RetryNVMLError).
	ReasonNVMLError = "NVMLError"
	// ReasonNoPermission: NVML refused a MIG change for lack of privilege
	// (gpufrac-node runs without CAP_SYS_ADMIN). Not retried while the GPU
	// stays as it was (the process cannot gain the capability): the GPU is
	// looked at again when its MIG state or its declared MIG changes.
	ReasonNoPermission = "NoPermission"
	// ReasonExternalOwner: mig.owner is external and the GPU's MIG mode does
	// not match its gpufrac mode; gpufrac-node changes nothing and waits for
	// the GPU's MIG owner.
	ReasonExternalOwner = "ExternalOwner"
)

// Status is the outcome of the last reconciliation of one GPU.
type Status struct {
	// GPU is the GPU's UUID, Index its NVML index.
	GPU   string
	Index int
	// MIG tells whether the GPU is declared in mode mig; Layout is its
	// declared layout ("" keeps the current one).
	MIG    bool
	Layout string
	State  State
	// Reason is set for StatePending and StateFailed.
	Reason string
	// Message explains the state for an operator.
	Message string
	// Changed tells whether this reconciliation changed the GPU.
	Changed bool
}

// Options configures a Manager.
type Options struct {
	// Allocations tells which devices pods hold (nil: unknown, so only
	// GPUs that need no change are ever Applied).
	Allocations AllocationsFunc
	// Registerer receives the manager's metrics (nil: not registered).
	Registerer prometheus.Registerer
	// Event reports what an operator should see, as a Kubernetes event on
	// the node (nil: logged only). reason is a CamelCase event reason.
	Event func(warning bool, reason, message string)
	// Retry is called from Run when a pending change may now go through (a
	// GPU drained, an admin enabled MIG mode) or a GPU's MIG changed under
	// the node agent; it should reconcile again by calling Apply with the
	// current policy and rebuild resources. An error makes Run call it
	// again, backing off, until it succeeds.
	Retry func(ctx context.Context) error
	// Interval is how often Run checks pending changes (default 5s).
	Interval time.Duration
	// RetryInUse is how long a GPU whose mode change failed because it was
	// in use waits before the change is tried again (default 1m). Changes
	// that need a reset are never retried: the mode stays as found until an
	// admin resets the GPU (or the declared mode changes).
	RetryInUse time.Duration
	// RetryNVMLError bounds the back-off of a GPU whose change failed with
	// an NVML error: the first retry waits Initial, each failure after it
	// doubles the wait up to Max (defaults 10s and 5m). A success resets it.
	RetryNVMLError BackoffBounds
	// Clock defaults to the real clock.
	Clock clock.WithTicker
}

// BackoffBounds are the first and the longest wait of an exponential
// back-off.
type BackoffBounds struct {
	Initial, Max time.Duration
}

// Manager applies declared MIG modes and layouts to the node's GPUs through
// NVML. It is idempotent: a GPU that already matches is not touched. It
// never touches a GPU on which pods hold devices (whole GPU, fraction units,
// replicas or MIG devices): the change is reported pending and applied when
// the GPU drains. A MIG mode change the driver cannot activate right away
// (needs a reset, or the GPU is in use) is undone, leaving the mode as
// found, and reported. GPUs are never reset.
//
// MIG mode follows the declared mode: on for GPUs in mode mig, off for the
// others (after their instances are destroyed), so a GPU moved from mig to
// fraction becomes usable whole again.
//
// With mig.owner external another MIG manager owns MIG (the GPU operator's,
// Bottlerocket's): the manager then calls no NVML function that changes a
// GPU. It reports each GPU whose MIG mode does not match its gpufrac mode
// (ReasonExternalOwner) and, from Run, asks for a rebuild when a GPU's MIG
// mode or devices change under it, so that the resources follow the owner's
// layout.
type Manager struct {
	lib     nvidia.MIGLib
	gpus    []nvidia.GPU
	opts    Options
	metrics *metrics

	// mu serialises reconciliations and guards the fields below.
	mu sync.Mutex
	// status: GPU UUID -> outcome of the last reconciliation.
	status map[string]Status
	// blocked: GPU UUID -> a mode change that could not be activated.
	blocked map[string]blockedChange
	// devices: GPU UUID -> its MIG devices as last read.
	devices map[string][]mig.Device
	// observed: GPU UUID -> the MIG state (mode and devices) of every
	// MIG-capable GPU as last read: Run asks for a rebuild when it changes
	// under the manager (another MIG manager, an admin's nvidia-smi), so
	// that a GPU put in MIG mode stops being served whole, whatever the
	// config in force.
	observed map[string]string
	// backoff: per GPU UUID, the wait before an NVML error is retried.
	backoff *flowcontrol.Backoff
	// refused: GPU UUID -> its MIG state when NVML refused a change for
	// lack of privilege; the change is not tried again in that state.
	refused map[string]string
	// owed: the last Retry failed, or Owe was called, so Run calls Retry
	// again (backing off while it fails). owes counts Owe's calls: one made
	// while Retry runs (the apply it made left a GPU out) outlives
	// that Retry's success.
	owed bool
	owes uint64
	// unreadable: GPU UUID -> checks in a row whose MIG read failed, while
	// the GPU was last seen readable.
	unreadable map[string]int
}

// blockedChange is a MIG mode change the driver refused to activate.
type blockedChange struct {
	enable bool
	reason string
	at     time.Time
}

// NewManager returns a manager for the GPUs (all of the node's, by index).
func NewManager(lib nvidia.MIGLib, gpus []nvidia.GPU, o Options) *Manager {
	if o.Interval <= 0 {
		o.Interval = 5 * time.Second
	}
	if o.RetryInUse <= 0 {
		o.RetryInUse = time.Minute
	}
	if o.RetryNVMLError.Initial <= 0 {
		o.RetryNVMLError.Initial = 10 * time.Second
	}
	if o.RetryNVMLError.Max < o.RetryNVMLError.Initial {
		o.RetryNVMLError.Max = max(5*time.Minute, o.RetryNVMLError.Initial)
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	m := &Manager{
		lib:        lib,
		gpus:       append([]nvidia.GPU(nil), gpus...),
		opts:       o,
		status:     map[string]Status{},
		blocked:    map[string]blockedChange{},
		devices:    map[string][]mig.Device{},
		observed:   map[string]string{},
		refused:    map[string]string{},
		unreadable: map[string]int{},
		backoff:    flowcontrol.NewBackOff(o.RetryNVMLError.Initial, o.RetryNVMLError.Max),
	}
	m.backoff.Clock = o.Clock
	for _, g := range m.gpus {
		if g.MIGCapable {
			m.observed[g.UUID] = m.migStateLocked(g.UUID)
		}
	}
	m.metrics = newMetrics(m)
	if o.Registerer != nil {
		m.metrics.register(o.Registerer)
	}
	return m
}

// Status returns the outcome of the last reconciliation, by GPU index.
func (m *Manager) Status() []Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Status, 0, len(m.gpus))
	for _, g := range m.gpus {
		if s, ok := m.status[g.UUID]; ok {
			out = append(out, s)
		}
	}
	return out
}

// Apply reconciles every GPU with np (np.GPUModes and np.GPUMIGLayouts by
// GPU index) and returns each GPU's status. Layouts must have passed
// Expand for the GPU's model (resource.Build checks that for every config
// the agent takes). Apply is safe to call again with the same policy: GPUs
// that match are not touched.
func (m *Manager) Apply(ctx context.Context, np config.NodePolicy) []Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	// PodResources is read once, and only if some GPU needs a change.
	var alloc map[string]int
	var allocErr error
	read := false
	users := func(uuid string) (int, error) {
		if !read {
			alloc, allocErr = m.allocatedByGPU(ctx)
			read = true
		}
		return alloc[uuid], allocErr
	}
	external := np.Policy.MIG.Owner == config.MIGOwnerExternal
	out := make([]Status, 0, len(m.gpus))
	for i, g := range m.gpus {
		want := target{external: external}
		if i < len(np.GPUModes) && np.GPUModes[i] == config.ModeMIG {
			want.mig, want.layout = true, np.GPUMIGLayouts[i]
		}
		if i < len(np.GPUModes) {
			want.mode = np.GPUModes[i]
		}
		s := m.reconcileLocked(ctx, g, want, users)
		m.observeLocked(g)
		m.reportLocked(ctx, g, s)
		out = append(out, s)
	}
	m.metrics.setPending(out)
	return out
}

// target is the declared MIG configuration of one GPU.
type target struct {
	mig    bool
	layout string // "" keeps the current layout
	// mode is the GPU's gpufrac mode, for messages.
	mode config.Mode
	// external: another MIG manager owns the GPU's MIG (mig.owner
	// external); nothing is changed.
	external bool
}

// reconcileLocked brings one GPU to want, if it may be touched. users
// tells how many devices pods hold on a GPU.
func (m *Manager) reconcileLocked(ctx context.Context, g nvidia.GPU, want target, users func(uuid string) (int, error)) Status {
	logger := klog.FromContext(ctx).WithValues("gpu", g.UUID, "index", g.Index)
	s := Status{GPU: g.UUID, Index: g.Index, MIG: want.mig, Layout: want.layout, State: StateApplied}
	if prev, ok := m.status[g.UUID]; !ok || prev.MIG != want.mig || prev.Layout != want.layout {
		// A new target: earlier refusals and back-off are about another change.
		delete(m.refused, g.UUID)
		m.backoff.Reset(g.UUID)
	} else if prev.Reason != ReasonNoPermission {
		delete(m.refused, g.UUID)
	}
	fail := func(reason string, err error) Status {
		s.State, s.Reason, s.Message = StateFailed, reason, err.Error()
		if reason == ReasonNVMLError {
			m.backoff.Next(g.UUID, m.opts.Clock.Now())
		}
		return s
	}
	pending := func(reason, format string, args ...any) Status {
		s.State, s.Reason, s.Message = StatePending, reason, fmt.Sprintf(format, args...)
		return s
	}
	if !g.MIGCapable {
		delete(m.devices, g.UUID)
		m.backoff.Reset(g.UUID)
		if want.mig {
			return fail(ReasonNotSupported, fmt.Errorf("GPU %d (%s) does not support MIG", g.Index, g.Name))
		}
		return s
	}

	// 1. Read the GPU: mode, instances and, for mig, the layout's instances.
	mode, err := m.lib.MIGMode(g.UUID)
	if err != nil {
		return fail(ReasonNVMLError, err)
	}
	var instances []mig.GPUInstance
	if mode.Current {
		if instances, err = m.lib.MIGInstances(g.UUID); err != nil {
			return fail(ReasonNVMLError, err)
		}
	}
	m.devices[g.UUID] = devicesOf(instances)
	if want.external {
		// Another MIG manager owns the GPU's MIG: read, never write.
		delete(m.blocked, g.UUID)
		m.backoff.Reset(g.UUID)
		switch {
		case want.mig && !mode.Current:
			return pending(ReasonExternalOwner, "GPU %d is in mode mig, but its MIG mode is disabled; its MIG owner (mig.owner: external) has not enabled it, so the GPU serves nothing until it does", g.Index)
		case !want.mig && mode.Current:
			return pending(ReasonExternalOwner, "GPU %d is in mode %s, but its MIG mode is enabled; its MIG owner (mig.owner: external) must disable MIG on it (in the GPU operator: a nvidia.com/mig.config that leaves it whole), and until then the GPU is not served", g.Index, want.mode)
		}
		s.Message = fmt.Sprintf("GPU %d: MIG %s by its owner", g.Index, onOff(mode.Current))
		if mode.Current {
			s.Message += ", devices " + mig.Describe(instances)
		}
		return s
	}
	// Drivers may list profiles only once MIG is on; then the layout is
	// expanded after enabling it.
	var wantGIs []mig.Profile
	expand := func() (Status, bool) {
		if !want.mig || want.layout == "" {
			return s, true
		}
		profiles, err := m.lib.MIGProfiles(g.UUID)
		if err != nil {
			return fail(ReasonNVMLError, err), false
		}
		if wantGIs, err = mig.Expand(want.layout, profiles); err != nil {
			return fail(ReasonNotSupported, fmt.Errorf("layout %q on GPU %d: %w", want.layout, g.Index, err)), false
		}
		return s, true
	}
	if mode.Current {
		if st, ok := expand(); !ok {
			return st
		}
	}

	// 2. Anything to do? A pending mode left over from an earlier attempt
	// counts as a change too: it would take effect at the next reset.
	var steps []mig.Step
	needMode := mode.Current != want.mig
	switch {
	case want.mig && !mode.Current && want.layout == "":
		return fail(ReasonNoLayout, fmt.Errorf("GPU %d is in mode mig without a layout, but its MIG mode is disabled: set mig.layout or a migLayout for it", g.Index))
	case want.mig && want.layout != "" && mode.Current:
		steps = mig.Diff(instances, wantGIs)
	case !want.mig && mode.Current:
		steps = mig.Diff(instances, nil)
	}
	if !needMode && len(steps) == 0 {
		// A pending mode someone else asked for (nvidia-smi -mig, waiting
		// for a reboot) is left alone: the GPU's mode is the admin's.
		delete(m.blocked, g.UUID)
		return s
	}
	if b, ok := m.blocked[g.UUID]; ok && needMode && b.enable == want.mig {
		if b.reason == ReasonResetRequired || m.opts.Clock.Since(b.at) < m.opts.RetryInUse {
			return pending(b.reason, "%s", modeMessage(g, want.mig, b.reason))
		}
	}
	if prev, ok := m.status[g.UUID]; ok && prev.State == StateFailed && prev.MIG == want.mig && prev.Layout == want.layout {
		// The same change failed before: an NVML error waits out its
		// back-off, a refused privilege waits for a new config or GPU state.
		if (prev.Reason == ReasonNoPermission && m.refused[g.UUID] == m.migStateLocked(g.UUID)) ||
			(prev.Reason == ReasonNVMLError && m.backoff.IsInBackOffSinceUpdate(g.UUID, m.opts.Clock.Now())) {
			prev.Changed = false
			return prev
		}
	}

	// 3. Never touch a GPU pods hold devices on.
	switch n, err := users(g.UUID); {
	case err != nil:
		return pending(ReasonAllocationsUnknown, "GPU %d needs a MIG change but its allocations are unknown (%v); it is left alone", g.Index, err)
	case n > 0:
		return pending(ReasonDevicesAllocated, "GPU %d needs a MIG change; deferred until the %d device(s) pods hold on it are freed", g.Index, n)
	}

	// 4. Apply: enable MIG, reshape instances, or drain and disable MIG.
	logger.Info("Changing MIG configuration", "mig", want.mig, "layout", want.layout, "steps", len(steps), "modeChange", needMode)
	s.Changed = true
	if needMode && want.mig {
		if st, done := m.setModeLocked(ctx, g, true, s); done {
			return st
		}
		if instances, err = m.lib.MIGInstances(g.UUID); err != nil {
			return fail(ReasonNVMLError, err)
		}
		if st, ok := expand(); !ok {
			return st
		}
		steps = mig.Diff(instances, wantGIs)
	}
	for _, st := range steps {
		if st.Destroy >= 0 {
			err := m.lib.DestroyMIGInstance(g.UUID, st.Destroy)
			m.metrics.operation("destroy_instance", err)
			if err != nil {
				m.refreshDevicesLocked(g)
				if errors.Is(err, nvidia.ErrInUse) {
					// Retried after RetryInUse, as a mode change in use is.
					m.blocked[g.UUID] = blockedChange{enable: want.mig, reason: ReasonInUse, at: m.opts.Clock.Now()}
					return fail(ReasonInUse, err)
				}
				return m.failedLocked(g, s, err)
			}
			continue
		}
		_, err := m.lib.CreateMIGInstance(g.UUID, st.Create.ID, st.At)
		m.metrics.operation("create_instance", err)
		if err != nil {
			m.refreshDevicesLocked(g)
			return m.failedLocked(g, s, err)
		}
	}
	if needMode && !want.mig {
		if st, done := m.setModeLocked(ctx, g, false, s); done {
			m.refreshDevicesLocked(g)
			return st
		}
	}
	m.refreshDevicesLocked(g)
	m.backoff.Reset(g.UUID)
	s.Message = fmt.Sprintf("GPU %d: MIG %s", g.Index, onOff(want.mig))
	if want.mig {
		s.Message += ", devices " + mig.Describe(instancesOrEmpty(m.lib, g.UUID))
	}
	return s
}

// setModeLocked changes g's MIG mode. When the driver cannot activate the
// change it restores the mode as found and returns the pending status and
// true; on success it returns false.
func (m *Manager) setModeLocked(ctx context.Context, g nvidia.GPU, enable bool, s Status) (Status, bool) {
	op := "disable_mig"
	if enable {
		op = "enable_mig"
	}
	err := m.lib.SetMIGMode(g.UUID, enable)
	m.metrics.operation(op, err)
	if err == nil {
		delete(m.blocked, g.UUID)
		return s, false
	}
	reason := ""
	switch {
	case errors.Is(err, nvidia.ErrResetRequired):
		reason = ReasonResetRequired
	case errors.Is(err, nvidia.ErrInUse):
		reason = ReasonInUse
	default:
		return m.failedLocked(g, s, err), true
	}
	// Leave the mode as found: without this the change would still take
	// effect at the next reset, behind the admin's back.
	if rerr := m.lib.SetMIGMode(g.UUID, !enable); rerr != nil {
		klog.FromContext(ctx).Error(rerr, "Cannot restore MIG mode as found; a reset would apply the change", "gpu", g.UUID, "enable", enable)
	}
	m.blocked[g.UUID] = blockedChange{enable: enable, reason: reason, at: m.opts.Clock.Now()}
	s.State, s.Reason, s.Message = StatePending, reason, modeMessage(g, enable, reason)+": "+err.Error()
	return s, true
}

// failedLocked is the status of a change NVML failed: NoPermission when
// NVML refused the privilege, else NVMLError, whose retry backs off.
func (m *Manager) failedLocked(g nvidia.GPU, s Status, err error) Status {
	s.State = StateFailed
	if errors.Is(err, nvidia.ErrNoPermission) {
		m.refused[g.UUID] = m.migStateLocked(g.UUID)
		s.Reason = ReasonNoPermission
		s.Message = fmt.Sprintf("GPU %d needs a MIG change, but NVML refused it (%v): gpufrac-node changes MIG only with SYS_ADMIN in the chart's node.capabilities; where another MIG manager owns MIG, set mig.owner: external instead", g.Index, err)
		return s
	}
	s.Reason, s.Message = ReasonNVMLError, err.Error()
	m.backoff.Next(g.UUID, m.opts.Clock.Now())
	return s
}

// observeLocked records a MIG-capable GPU's MIG state after its
// reconciliation, for Run to notice when someone else changes it. As in
// Run's checks, one failed read of a GPU last read fine is not recorded:
// a GPU whose reads fail now and then would otherwise be a change, and a
// rebuild, at nearly every check (the node agent leaves a GPU it could
// not read out, and owes a rebuild, by itself).
func (m *Manager) observeLocked(g nvidia.GPU) {
	if !g.MIGCapable {
		return
	}
	now := m.migStateLocked(g.UUID)
	if was, ok := m.observed[g.UUID]; ok && now == stateUnreadable && was != stateUnreadable {
		return
	}
	m.observed[g.UUID] = now
}

// stateUnreadable is the MIG state of a GPU NVML cannot read: reads that
// fail at two checks in a row, and one that works again after them, are
// each a change (the node agent leaves a GPU out, on both paths, while its
// MIG state cannot be read).
const stateUnreadable = "unreadable"

// migStateLocked summarises a GPU's MIG mode and devices.
func (m *Manager) migStateLocked(uuid string) string {
	mode, err := m.lib.MIGMode(uuid)
	if err != nil {
		return stateUnreadable
	}
	if !mode.Current {
		return "off"
	}
	gis, err := m.lib.MIGInstances(uuid)
	if err != nil {
		return stateUnreadable
	}
	var b strings.Builder
	b.WriteString("on")
	for _, d := range devicesOf(gis) {
		b.WriteString(" " + d.UUID)
	}
	return b.String()
}

// modeMessage tells an operator why a MIG mode change waits.
func modeMessage(g nvidia.GPU, enable bool, reason string) string {
	flag := 0
	if enable {
		flag = 1
	}
	if reason == ReasonResetRequired {
		return fmt.Sprintf("GPU %d needs MIG mode %s, which needs a GPU reset; gpufrac-node left it as found: run nvidia-smi -i %d -mig %d and reset the GPU (or reboot)", g.Index, onOff(enable), g.Index, flag)
	}
	return fmt.Sprintf("GPU %d needs MIG mode %s, but processes use the GPU; gpufrac-node left it as found and retries later", g.Index, onOff(enable))
}

func onOff(b bool) string {
	if b {
		return "enabled"
	}
	return "disabled"
}

// refreshDevicesLocked re-reads g's MIG devices for metrics after a change.
func (m *Manager) refreshDevicesLocked(g nvidia.GPU) {
	m.devices[g.UUID] = devicesOf(instancesOrEmpty(m.lib, g.UUID))
}

// instancesOrEmpty lists a GPU's instances, none when MIG is off or NVML fails.
func instancesOrEmpty(lib nvidia.MIGLib, uuid string) []mig.GPUInstance {
	mode, err := lib.MIGMode(uuid)
	if err != nil || !mode.Current {
		return nil
	}
	gis, err := lib.MIGInstances(uuid)
	if err != nil {
		return nil
	}
	return gis
}

// devicesOf flattens instances into their MIG devices.
func devicesOf(instances []mig.GPUInstance) []mig.Device {
	var out []mig.Device
	for _, gi := range instances {
		out = append(out, gi.Devices...)
	}
	return out
}

// reportLocked logs a status and raises an event when it changed.
func (m *Manager) reportLocked(ctx context.Context, g nvidia.GPU, s Status) {
	logger := klog.FromContext(ctx).WithValues("gpu", g.UUID, "index", g.Index)
	prev, seen := m.status[g.UUID]
	m.status[g.UUID] = s
	same := seen && prev.State == s.State && prev.Reason == s.Reason && prev.MIG == s.MIG && prev.Layout == s.Layout
	switch s.State {
	case StateApplied:
		if s.Changed {
			logger.Info("MIG configuration applied", "mig", s.MIG, "layout", s.Layout, "message", s.Message)
			m.event(false, "MIGLayoutApplied", s.Message)
		}
	case StatePending:
		if !same {
			logger.Info("MIG change pending", "reason", s.Reason, "message", s.Message)
			m.event(true, "MIGLayoutPending", s.Message)
		}
	case StateFailed:
		// A retry that fails the same way again is logged, not raised
		// again: retries back off, and the first event said it all.
		if !same || prev.Message != s.Message {
			logger.Error(errors.New(s.Message), "MIG change failed", "reason", s.Reason)
			m.event(true, "MIGLayoutFailed", s.Message)
		} else if s.Changed {
			logger.V(2).Info("MIG change failed again", "reason", s.Reason, "message", s.Message)
		}
	}
}

func (m *Manager) event(warning bool, reason, message string) {
	if m.opts.Event != nil {
		m.opts.Event(warning, reason, message)
	}
}

// allocatedByGPU counts the devices pods hold per GPU UUID: whole GPUs
// (ID = GPU UUID), fraction units and replicas ("<uuid>::<k>") and MIG
// devices (their parent, from the MIG devices last read or read now).
func (m *Manager) allocatedByGPU(ctx context.Context) (map[string]int, error) {
	if m.opts.Allocations == nil {
		return nil, errors.New("no PodResources source")
	}
	byResource, err := m.opts.Allocations(ctx)
	if err != nil {
		return nil, err
	}
	known := map[string]bool{}
	for _, g := range m.gpus {
		known[g.UUID] = true
	}
	migParent := map[string]string{} // MIG UUID -> GPU UUID
	for _, g := range m.gpus {
		if !g.MIGCapable {
			continue
		}
		for _, d := range devicesOf(instancesOrEmpty(m.lib, g.UUID)) {
			migParent[d.UUID] = g.UUID
		}
	}
	out := map[string]int{}
	for _, ids := range byResource {
		for _, id := range ids {
			switch {
			case known[id]:
				out[id]++
			case migParent[id] != "":
				out[migParent[id]]++
			default:
				if i := strings.LastIndex(id, "::"); i > 0 && known[id[:i]] {
					out[id[:i]]++
				}
			}
		}
	}
	return out, nil
}

// rebuildKey is the back-off ID of a Retry that failed.
const rebuildKey = "\x00retry"

// Run checks pending changes every Interval until ctx ends and calls
// Options.Retry when one may now go through (pods freed the GPU's devices,
// allocations became known, an admin set the MIG mode needed, a GPU in use
// or a failed change waited long enough) or a GPU's MIG changed under the
// manager. A Retry that fails is called again, backing off, until it
// succeeds: a change noticed once is not lost.
func (m *Manager) Run(ctx context.Context) error {
	tick := m.opts.Clock.NewTicker(m.opts.Interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C():
			m.tick(ctx)
		}
	}
}

// tick is one of Run's checks; it tells whether it called Retry.
func (m *Manager) tick(ctx context.Context) bool {
	if m.opts.Retry == nil {
		return false
	}
	due := m.retryDue(ctx)
	m.mu.Lock()
	owed := m.owed && !m.backoff.IsInBackOffSinceUpdate(rebuildKey, m.opts.Clock.Now())
	owes := m.owes
	m.mu.Unlock()
	if !due && !owed {
		return false
	}
	klog.FromContext(ctx).V(2).Info("Retrying pending MIG changes")
	err := m.opts.Retry(ctx)
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case err != nil:
		klog.FromContext(ctx).Error(err, "Applying the config after a MIG change failed; retrying")
		m.owed = true
		m.backoff.Next(rebuildKey, m.opts.Clock.Now())
	case m.owes != owes:
		// The apply succeeded but owed another (it could not read a GPU):
		// again at the next check, backing off as after a failure.
		m.owed = true
		m.backoff.Next(rebuildKey, m.opts.Clock.Now())
	default:
		m.owed = false
		m.backoff.Reset(rebuildKey)
	}
	return true
}

// Owe makes Run call Retry at its next check (then backing off while it
// fails): the node agent calls it when applying a config failed after
// Apply had recorded the GPUs' MIG states, so that a change Apply saw is
// not left unserved, and when an apply left out a GPU whose MIG state NVML
// could not read, so that the GPU is served again once it can. An Owe made
// during Retry's own apply is kept after that apply succeeds.
func (m *Manager) Owe() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.owed = true
	m.owes++
}

// Forget drops what the last Apply found: the node agent calls it when the
// config in force declares no MIG (its built-in config, or failed closed),
// so that Run does not retry changes nobody asks for any more. MIG states
// stay observed: a GPU put in MIG mode is still noticed, and resources
// rebuilt.
func (m *Manager) Forget() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for uuid := range m.status {
		m.backoff.Reset(uuid)
	}
	clear(m.status)
	clear(m.blocked)
	clear(m.refused)
	m.metrics.setPending(nil)
}

// retryDue tells whether a pending or failed change may now go through.
func (m *Manager) retryDue(ctx context.Context) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	var waiting []Status
	for _, g := range m.gpus {
		if s, ok := m.status[g.UUID]; ok && s.State != StateApplied {
			waiting = append(waiting, s)
		}
	}
	changed := false
	for uuid, was := range m.observed {
		now := m.migStateLocked(uuid)
		if now == stateUnreadable && was != stateUnreadable {
			// One failed read is not a change: a read that fails on
			// alternate checks would rebuild at every one.
			if m.unreadable[uuid]++; m.unreadable[uuid] < 2 {
				continue
			}
		}
		delete(m.unreadable, uuid)
		if now != was {
			klog.FromContext(ctx).Info("A GPU's MIG state changed outside gpufrac-node", "gpu", uuid, "was", was, "now", now)
			m.observed[uuid] = now // noticed once, whatever the retry does
			changed = true
		}
	}
	if changed {
		return true
	}
	if len(waiting) == 0 {
		return false
	}
	// PodResources is read only for the reasons that wait on it.
	var alloc map[string]int
	var allocErr error
	read := false
	allocations := func() (map[string]int, error) {
		if !read {
			alloc, allocErr = m.allocatedByGPU(ctx)
			read = true
		}
		return alloc, allocErr
	}
	for _, s := range waiting {
		switch s.Reason {
		case ReasonAllocationsUnknown:
			if _, err := allocations(); err == nil {
				return true
			}
		case ReasonDevicesAllocated:
			if a, err := allocations(); err == nil && a[s.GPU] == 0 {
				return true
			}
		case ReasonResetRequired:
			// Only an admin (enable/disable plus reset) can move it; the
			// GPUs of NoPermission and ExternalOwner are observed above.
			if mode, err := m.lib.MIGMode(s.GPU); err == nil && mode.Current == s.MIG {
				return true
			}
		case ReasonInUse:
			if b, ok := m.blocked[s.GPU]; !ok || m.opts.Clock.Since(b.at) >= m.opts.RetryInUse {
				return true
			}
		case ReasonNVMLError:
			if !m.backoff.IsInBackOffSinceUpdate(s.GPU, m.opts.Clock.Now()) {
				return true
			}
		}
	}
	return false
}

// Devices returns the MIG devices of every GPU as last read, by GPU UUID.
func (m *Manager) Devices() map[string][]mig.Device {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string][]mig.Device, len(m.devices))
	for u, ds := range m.devices {
		out[u] = append([]mig.Device(nil), ds...)
	}
	return out
}
