// Package cditest writes CDI specs in the form the NVIDIA container toolkit's
// `nvidia-ctk cdi generate` writes them (kind nvidia.com/gpu, cdiVersion
// 0.5.0; per GPU a device by index and by UUID, per MIG device one by
// "<gpu>:<mig>" index and one by MIG UUID, an "all" device, and the common
// edits: NVIDIA_VISIBLE_DEVICES=void, the control device nodes, the
// toolkit's hooks and driver library mounts), for tests of the mock GPUs.
package cditest

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"sigs.k8s.io/yaml"

	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/mig"
)

// NameStrategy is nvidia-ctk's --device-name-strategy.
type NameStrategy string

// The device name strategies (nvidia-ctk writes index and uuid by default
// in recent toolkits; older ones wrote only index).
const (
	ByIndex NameStrategy = "index"
	ByUUID  NameStrategy = "uuid"
)

// GPU is a GPU of the spec and its MIG devices.
type GPU struct {
	Index, Minor int
	UUID         string
	MIGs         []MIG
}

// MIG is a MIG device.
type MIG struct {
	UUID   string
	GI, CI int
}

// FromGPUs returns the spec's GPUs for NVML GPUs; migs lists MIG devices
// (mig.Device.GPU names their parent).
func FromGPUs(gpus []nvidia.GPU, migs []mig.Device) []GPU {
	out := make([]GPU, 0, len(gpus))
	for _, g := range gpus {
		sg := GPU{Index: g.Index, Minor: g.Minor, UUID: g.UUID}
		for _, m := range migs {
			if m.GPU == g.UUID {
				sg.MIGs = append(sg.MIGs, MIG{UUID: m.UUID, GI: m.GI, CI: m.CI})
			}
		}
		out = append(out, sg)
	}
	return out
}

// The spec's shape (tags.cncf.io/container-device-interface/specs-go),
// written out so the tests do not depend on the library they check with.
type (
	spec struct {
		CDIVersion     string   `json:"cdiVersion"`
		Kind           string   `json:"kind"`
		Devices        []device `json:"devices"`
		ContainerEdits edits    `json:"containerEdits"`
	}
	device struct {
		Name           string `json:"name"`
		ContainerEdits edits  `json:"containerEdits"`
	}
	edits struct {
		Env         []string     `json:"env,omitempty"`
		DeviceNodes []deviceNode `json:"deviceNodes,omitempty"`
		Hooks       []hook       `json:"hooks,omitempty"`
		Mounts      []mount      `json:"mounts,omitempty"`
	}
	deviceNode struct {
		Path     string `json:"path"`
		HostPath string `json:"hostPath,omitempty"`
	}
	hook struct {
		HookName string   `json:"hookName"`
		Path     string   `json:"path"`
		Args     []string `json:"args"`
		Env      []string `json:"env,omitempty"`
	}
	mount struct {
		HostPath      string   `json:"hostPath"`
		ContainerPath string   `json:"containerPath"`
		Options       []string `json:"options"`
	}
)

// driverVersion names the mock driver's libraries.
const driverVersion = "570.124.06"

// Spec returns the YAML spec for gpus; no strategies means index and uuid.
func Spec(gpus []GPU, strategies ...NameStrategy) []byte {
	return SpecAt("", gpus, strategies...)
}

// SpecAt is Spec as `nvidia-ctk cdi generate --driver-root=<driverRoot>
// --dev-root=<driverRoot>` writes it, the GPU operator's containerized driver:
// device nodes, library mounts and the hook are taken from under driverRoot
// on the host and appear at their usual paths in the container. The test
// bed's real nodes keep their mock driver (device nodes, empty libraries, a
// no-op hook) there. An empty driverRoot is Spec.
func SpecAt(driverRoot string, gpus []GPU, strategies ...NameStrategy) []byte {
	if len(strategies) == 0 {
		strategies = []NameStrategy{ByIndex, ByUUID}
	}
	s := spec{CDIVersion: "0.5.0", Kind: "nvidia.com/gpu"}
	var all []deviceNode
	add := func(index, uuid string, nodes []deviceNode) {
		for _, st := range strategies {
			name := index
			if st == ByUUID {
				name = uuid
			}
			s.Devices = append(s.Devices, device{Name: name, ContainerEdits: edits{DeviceNodes: nodes}})
		}
		for _, n := range nodes {
			if !slices.Contains(all, n) {
				all = append(all, n)
			}
		}
	}
	for _, g := range gpus {
		gpuNode := deviceNode{Path: fmt.Sprintf("/dev/nvidia%d", g.Minor)}
		add(fmt.Sprint(g.Index), g.UUID, []deviceNode{gpuNode})
		for j, m := range g.MIGs {
			// The GPU and compute instance access capabilities, numbered as
			// /proc/driver/nvidia-caps/mig-minors numbers them.
			giCap := 3 + g.Minor*(8*9+1)*3 + m.GI*3*9
			ciCap := giCap + 1 + m.CI
			add(fmt.Sprintf("%d:%d", g.Index, j), m.UUID, []deviceNode{gpuNode,
				{Path: fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", giCap)},
				{Path: fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", ciCap)}})
		}
	}
	s.Devices = append(s.Devices, device{Name: "all", ContainerEdits: edits{DeviceNodes: all}})
	s.ContainerEdits = commonEdits()
	if driverRoot != "" {
		s.rehost(driverRoot)
	}
	out, err := yaml.Marshal(s)
	if err != nil {
		panic(err) // plain structs: cannot fail
	}
	return append([]byte("---\n"), out...)
}

// commonEdits are the spec's edits for every device: the control device
// nodes, the toolkit's hooks and the driver's library and tool mounts.
func commonEdits() edits {
	lib := "/usr/lib/x86_64-linux-gnu"
	e := edits{
		Env:         []string{"NVIDIA_VISIBLE_DEVICES=void"},
		DeviceNodes: []deviceNode{{Path: "/dev/nvidia-modeset"}, {Path: "/dev/nvidia-uvm"}, {Path: "/dev/nvidia-uvm-tools"}, {Path: "/dev/nvidiactl"}},
		Hooks: []hook{
			{HookName: "createContainer", Path: "/usr/bin/nvidia-cdi-hook", Args: []string{"nvidia-cdi-hook", "create-symlinks", "--link", "libcuda.so.1::" + lib + "/libcuda.so"}, Env: []string{"NVIDIA_CTK_DEBUG=false"}},
			{HookName: "createContainer", Path: "/usr/bin/nvidia-cdi-hook", Args: []string{"nvidia-cdi-hook", "update-ldcache", "--folder", lib}, Env: []string{"NVIDIA_CTK_DEBUG=false"}},
		},
	}
	for _, l := range []string{"libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so"} {
		p := fmt.Sprintf("%s/%s.%s", lib, l, driverVersion)
		e.Mounts = append(e.Mounts, mount{HostPath: p, ContainerPath: p, Options: []string{"ro", "nosuid", "nodev", "bind"}})
	}
	for _, b := range []string{"nvidia-smi", "nvidia-debugdump", "nvidia-persistenced"} {
		p := "/usr/bin/" + b
		e.Mounts = append(e.Mounts, mount{HostPath: p, ContainerPath: p, Options: []string{"ro", "nosuid", "nodev", "bind"}})
	}
	return e
}

// rehost points every host path of the spec under driverRoot.
func (s *spec) rehost(driverRoot string) {
	nodes := func(ns []deviceNode) {
		for i := range ns {
			ns[i].HostPath = filepath.Join(driverRoot, ns[i].Path)
		}
	}
	for i := range s.Devices {
		nodes(s.Devices[i].ContainerEdits.DeviceNodes)
	}
	nodes(s.ContainerEdits.DeviceNodes)
	for i := range s.ContainerEdits.Mounts {
		s.ContainerEdits.Mounts[i].HostPath = filepath.Join(driverRoot, s.ContainerEdits.Mounts[i].HostPath)
	}
	for i := range s.ContainerEdits.Hooks {
		s.ContainerEdits.Hooks[i].Path = filepath.Join(driverRoot, s.ContainerEdits.Hooks[i].Path)
	}
}

// DriverFiles lists what SpecAt's spec names under its driver root, other
// than the device nodes: the driver's libraries and tools (files that must
// exist to be mounted) and the hook (a program the runtime runs).
func DriverFiles() (files, hooks []string) {
	e := commonEdits()
	for _, m := range e.Mounts {
		files = append(files, m.HostPath)
	}
	for _, h := range e.Hooks {
		if !slices.Contains(hooks, h.Path) {
			hooks = append(hooks, h.Path)
		}
	}
	return files, hooks
}

// Write writes a spec into dir as nvidia.yaml (a new file renamed over the
// old one, as nvidia-ctk writes it) and returns its path.
func Write(dir string, data []byte) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("writing CDI spec: %w", err)
	}
	path := filepath.Join(dir, "nvidia.yaml")
	tmp := filepath.Join(dir, ".nvidia.yaml.tmp")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return "", fmt.Errorf("writing CDI spec: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", fmt.Errorf("writing CDI spec: %w", err)
	}
	return path, nil
}
