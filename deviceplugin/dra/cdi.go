package dra

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpufrac/gpufrac/api"
)

// DefaultCDIDir is where container runtimes read dynamic CDI specs.
const DefaultCDIDir = "/var/run/cdi"

// cdiFilePrefix starts the name of every CDI spec file the driver writes,
// one per prepared claim: <prefix><claim UID>.json.
const cdiFilePrefix = "gpufrac-claim-"

// cdiDeviceName is the CDI device of one allocated device of a claim: the
// claim's UID (never reused, so no runtime's cached spec can match a later
// claim) and the device, plus the share for a shared device.
func cdiDeviceName(claim types.UID, device, shareID string) string {
	name := string(claim) + "-" + device
	if shareID != "" {
		name += "-" + shareID
	}
	return name
}

// cdiEdits turns a device-plugin container answer into CDI container edits
// and the CDI devices it names: the answer's envs (sorted, so the file is
// reproducible), its device specs as device nodes, and its CDI device names
// (the NVIDIA container toolkit's nvidia.com/gpu=<uuid>) as IDs to pass on.
func cdiEdits(resp *pluginapi.ContainerAllocateResponse) (cdispec.ContainerEdits, []string) {
	var e cdispec.ContainerEdits
	for _, k := range slices.Sorted(maps.Keys(resp.GetEnvs())) {
		e.Env = append(e.Env, k+"="+resp.GetEnvs()[k])
	}
	for _, d := range resp.GetDevices() {
		e.DeviceNodes = append(e.DeviceNodes, &cdispec.DeviceNode{
			Path: d.GetContainerPath(), HostPath: d.GetHostPath(), Permissions: d.GetPermissions(),
		})
	}
	var ids []string
	for _, d := range resp.GetCdiDevices() {
		ids = append(ids, d.GetName())
	}
	return e, ids
}

// cdiSpecPath is the spec file of a claim in dir.
func cdiSpecPath(dir string, claim types.UID) string {
	return filepath.Join(dir, cdiFilePrefix+string(claim)+".json")
}

// writeCDISpec writes the CDI spec of one claim's devices (name -> edits)
// atomically.
func writeCDISpec(dir string, claim types.UID, devices map[string]cdispec.ContainerEdits) error {
	spec := cdispec.Spec{Kind: api.DRACDIKind}
	for _, name := range slices.Sorted(maps.Keys(devices)) {
		spec.Devices = append(spec.Devices, cdispec.Device{Name: name, ContainerEdits: devices[name]})
	}
	v, err := cdispec.MinimumRequiredVersion(&spec)
	if err != nil {
		return fmt.Errorf("writing the CDI spec of claim %s: %w", claim, err)
	}
	spec.Version = v
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return fmt.Errorf("writing the CDI spec of claim %s: %w", claim, err)
	}
	if err := writeFileAtomic(cdiSpecPath(dir, claim), b); err != nil {
		return fmt.Errorf("writing the CDI spec of claim %s: %w", claim, err)
	}
	return nil
}

// removeCDISpec removes a claim's spec; a missing one is not an error.
func removeCDISpec(dir string, claim types.UID) error {
	err := os.Remove(cdiSpecPath(dir, claim))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing the CDI spec of claim %s: %w", claim, err)
	}
	return nil
}

// ReadCDISpec reads the spec file of a claim in dir (for tests and the
// kubelet simulator, which play the container runtime's part).
func ReadCDISpec(dir string, claim types.UID) (cdispec.Spec, error) {
	var spec cdispec.Spec
	b, err := os.ReadFile(cdiSpecPath(dir, claim))
	if err != nil {
		return spec, fmt.Errorf("reading the CDI spec of claim %s: %w", claim, err)
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		return spec, fmt.Errorf("reading the CDI spec of claim %s: %w", claim, err)
	}
	return spec, nil
}

// ResolveCDIEnv returns the environment the CDI devices ids of gpufrac's
// claim kind add, read from the spec files in dir, as a container runtime
// would apply them (later devices win). IDs of other kinds are skipped.
func ResolveCDIEnv(dir string, ids []string) (map[string]string, error) {
	env := map[string]string{}
	for _, id := range ids {
		name, ok := strings.CutPrefix(id, api.DRACDIKind+"=")
		if !ok {
			continue
		}
		claim, _, _ := strings.Cut(name, "-gpu-")
		spec, err := ReadCDISpec(dir, types.UID(claim))
		if err != nil {
			return nil, fmt.Errorf("resolving CDI device %s: %w", id, err)
		}
		found := false
		for _, d := range spec.Devices {
			if d.Name != name {
				continue
			}
			found = true
			for _, kv := range d.ContainerEdits.Env {
				k, v, _ := strings.Cut(kv, "=")
				env[k] = v
			}
		}
		if !found {
			return nil, fmt.Errorf("resolving CDI device %s: not in %s", id, cdiSpecPath(dir, types.UID(claim)))
		}
	}
	return env, nil
}
