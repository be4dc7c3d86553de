package cluster

import (
	"github.com/gpufrac/gpufrac/deviceplugin/cdi/cditest"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestMockDriverRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mknod of character devices needs root")
	}
	root := t.TempDir()
	d, err := NewMockDriver(root, "node-a", "dgxh100", 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.GPUs) != 2 {
		t.Fatalf("%d GPUs, want 2", len(d.GPUs))
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(root, "dev/nvidia1"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFCHR || st.Rdev>>8 != nvidiaMajor {
		t.Errorf("dev/nvidia1: mode %o rdev %x, want a character device of major 195", st.Mode, st.Rdev)
	}
	spec, err := d.WriteSpec(filepath.Join(root, "cdi"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(spec)
	for _, want := range []string{"hostPath: " + root + "/dev/nvidia1", "path: /dev/nvidia1", d.GPUs[1].UUID, root + "/usr/bin/nvidia-cdi-hook"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("spec lacks %q:\n%s", want, b)
		}
	}
	files, hooks := driverPaths(t, root)
	for _, p := range append(files, hooks...) {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("the spec names %s, which does not exist: %v", p, err)
		}
	}
}

func driverPaths(t *testing.T, root string) (files, hooks []string) {
	t.Helper()
	f, h := cditest.DriverFiles()
	for _, p := range f {
		files = append(files, filepath.Join(root, p))
	}
	for _, p := range h {
		hooks = append(hooks, filepath.Join(root, p))
	}
	return files, hooks
}

// On a machine whose kernel serves the NVIDIA driver's major (a GPU
// machine) or the mock's nvidia-uvm major, mock device nodes would be the
// real devices, mode 0666: NewMockDriver refuses, and says why.
func TestMockDriverRefusesMajorsTheKernelServes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mknod of character devices needs root")
	}
	for _, tc := range []struct {
		name, devices, want string
	}{
		{name: "NVIDIA driver loaded", devices: "Character devices:\n  1 mem\n195 nvidia-frontend\n509 nvidia-uvm\n\nBlock devices:\n  7 loop\n", want: "major 195 (nvidia-frontend)"},
		{name: "another driver on the uvm major", devices: "Character devices:\n  1 mem\n509 somedriver\n\nBlock devices:\n", want: "major 509 (somedriver)"},
		{name: "a block major is no character major", devices: "Character devices:\n  1 mem\n\nBlock devices:\n195 blk\n509 blk2\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := filepath.Join(t.TempDir(), "devices")
			if err := os.WriteFile(f, []byte(tc.devices), 0o644); err != nil {
				t.Fatal(err)
			}
			old := procDevices
			procDevices = f
			t.Cleanup(func() { procDevices = old })
			_, err := NewMockDriver(t.TempDir(), "node-a", "dgxh100", 1)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("NewMockDriver: %v, want no error", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("NewMockDriver: %v, want an error naming %q", err, tc.want)
			}
		})
	}
}

// A second GPU node would re-apply the gpufrac-node DaemonSet with its own
// mock state path and GPU count, rolling the first node's agent onto them:
// StartGPUNode refuses it before it starts anything.
func TestSecondGPUNodeIsRefused(t *testing.T) {
	c := &Cluster{gpuNode: "gpu-a"}
	_, err := c.StartGPUNode(t.Context(), GPUNodeOptions{Name: "gpu-b"})
	if err == nil || !strings.Contains(err.Error(), "the cluster has one (gpu-a)") {
		t.Errorf("StartGPUNode: %v, want a refusal naming gpu-a", err)
	}
}

// The service proxy on 10.96.0.1:443 serves the real nodes' pods and the
// host, not a machine elsewhere that routes 10.96.0.1 to this one.
func TestServiceProxyClients(t *testing.T) {
	for _, tc := range []struct {
		ip   string
		want bool
	}{
		{"10.89.0.7", true},   // a pod of real node 0
		{"10.89.255.1", true}, // a node IP
		{"127.0.0.1", true},   // the host
		{"192.0.2.7", false},  // elsewhere
		{"10.96.0.2", false},  // another service address, no host's
		{"10.90.0.1", false},  // next to the real nodes' range
	} {
		if got := serviceClientAllowed(net.ParseIP(tc.ip)); got != tc.want {
			t.Errorf("serviceClientAllowed(%s) = %v, want %v", tc.ip, got, tc.want)
		}
	}
}
