package cluster

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gpufrac/gpufrac/deviceplugin/cdi/cditest"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
)

// The mock driver's device numbers: the NVIDIA driver's character major 195
// (GPU minors 0..N, nvidiactl 255, nvidia-modeset 254) and, for nvidia-uvm,
// a major from the dynamic range, as the driver gets one at load time.
const (
	nvidiaMajor    = 195
	nvidiaCtlMinor = 255
	modesetMinor   = 254
	uvmMajor       = 509
)

// MockDriver is a real node's NVIDIA driver without a GPU, kept in one
// directory (the driver root) as the GPU operator keeps its containerized
// driver under /run/nvidia/driver: character device nodes with the driver's
// numbers under dev/, empty driver libraries and tools where the NVIDIA
// container toolkit's CDI spec mounts them from, and a no-op in place of the
// toolkit's nvidia-cdi-hook. The spec itself (SpecAt) names them by their
// paths under the root, so nothing outside the directory changes.
//
// The device nodes cannot be opened (no driver serves them: NewMockDriver
// refuses a machine whose kernel serves their majors, see
// MockDriverRequirements); what they show is which nodes a container gets,
// with which numbers.
type MockDriver struct {
	Root string
	GPUs []nvidia.GPU
}

// NewMockDriver makes the driver root for the mock GPUs of a node: model
// and count as gpufrac-node's --nvml=mock:<model> --mock-gpus=<count> sees
// them on the node named node (the mock's UUIDs are seeded by node name).
func NewMockDriver(root, node, model string, count int) (*MockDriver, error) {
	if err := MockDriverRequirements(); err != nil {
		return nil, err
	}
	lib, err := nvidia.NewMock(model, nvidia.WithUUIDSeed(node), nvidia.WithGPUCount(count))
	if err != nil {
		return nil, err
	}
	if err := lib.Init(); err != nil {
		return nil, err
	}
	gpus, err := lib.GPUs()
	_ = lib.Shutdown()
	if err != nil {
		return nil, err
	}
	d := &MockDriver{Root: root, GPUs: gpus}
	if err := d.write(); err != nil {
		return nil, fmt.Errorf("mock driver in %s: %w", root, err)
	}
	return d, nil
}

// procDevices lists the device majors the kernel's drivers serve.
var procDevices = "/proc/devices"

// MockDriverRequirements says why mock device nodes cannot be made on this
// machine: a driver of its kernel serves one of their majors (the NVIDIA
// driver's 195 on a machine with a GPU, or whichever driver got the dynamic
// major the mock gives nvidia-uvm). The mock nodes (mode 0666, under the
// node's directory, in the node's containers) would then open the real
// devices.
func MockDriverRequirements() error {
	f, err := os.Open(procDevices)
	if err != nil {
		return fmt.Errorf("mock GPU devices: reading the kernel's device majors: %w", err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	inChar := false
	for s.Scan() {
		line := strings.TrimSpace(s.Text())
		switch {
		case line == "Character devices:":
			inChar = true
			continue
		case strings.HasSuffix(line, ":"):
			inChar = false
			continue
		case !inChar:
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		major, err := strconv.Atoi(fields[0])
		if err != nil {
			continue
		}
		if major == nvidiaMajor || major == uvmMajor {
			return fmt.Errorf("mock GPU devices: this machine's kernel serves character major %d (%s): mock device nodes with it would open real devices", major, fields[1])
		}
	}
	if err := s.Err(); err != nil {
		return fmt.Errorf("mock GPU devices: reading %s: %w", procDevices, err)
	}
	return nil
}

func (d *MockDriver) write() error {
	dev := filepath.Join(d.Root, "dev")
	if err := os.MkdirAll(dev, 0o755); err != nil {
		return err
	}
	nodes := map[string][2]uint32{
		"nvidiactl":        {nvidiaMajor, nvidiaCtlMinor},
		"nvidia-modeset":   {nvidiaMajor, modesetMinor},
		"nvidia-uvm":       {uvmMajor, 0},
		"nvidia-uvm-tools": {uvmMajor, 1},
	}
	for _, g := range d.GPUs {
		nodes[fmt.Sprintf("nvidia%d", g.Minor)] = [2]uint32{nvidiaMajor, uint32(g.Minor)}
	}
	for name, n := range nodes {
		p := filepath.Join(dev, name)
		_ = os.Remove(p)
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(n[0], n[1]))); err != nil {
			return fmt.Errorf("mknod %s: %w", p, err)
		}
	}
	files, hooks := cditest.DriverFiles()
	for _, f := range files {
		p := filepath.Join(d.Root, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, nil, 0o755); err != nil {
			return err
		}
	}
	// The hook runs in the runtime's namespaces with the toolkit's arguments;
	// /bin/true takes any and succeeds.
	for _, h := range hooks {
		p := filepath.Join(d.Root, h)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := copyFile("/bin/true", p, 0o755); err != nil {
			return fmt.Errorf("the no-op CDI hook: %w", err)
		}
	}
	return nil
}

// WriteSpec writes the toolkit's CDI spec for the driver's GPUs into dir
// (a directory the node's containerd reads, e.g. its /etc/cdi).
func (d *MockDriver) WriteSpec(dir string) (string, error) {
	return cditest.Write(dir, cditest.SpecAt(d.Root, cditest.FromGPUs(d.GPUs, nil)))
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
