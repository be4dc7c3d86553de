package resource

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/mig"
)

// migDevs builds n MIG devices per GPU of gs ("MIG-<gpu index>-<gi>"), GI = slot.
func migDevs(gs []nvidia.GPU, n int) []mig.Device {
	var out []mig.Device
	for _, g := range gs {
		for gi := range n {
			out = append(out, mig.Device{UUID: fmt.Sprintf("MIG-%d-%d", g.Index, gi), GPU: g.UUID, GI: gi + 1, CI: 0, Profile: "1g.10gb", Full: true})
		}
	}
	return out
}

func TestMIGDevicesFollowParentHealth(t *testing.T) {
	gs := gpus(2)
	r, err := NewMIG(MIGOptions{Name: "nvidia.com/mig-1g.10gb", Devices: migDevs(gs, 3), GPUs: gs, Health: func(u string) bool { return u != "GPU-1" }})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range r.Devices() {
		got = append(got, d.ID+" "+d.Health)
	}
	want := []string{"MIG-0-0 Healthy", "MIG-0-1 Healthy", "MIG-0-2 Healthy", "MIG-1-0 Unhealthy", "MIG-1-1 Unhealthy", "MIG-1-2 Unhealthy"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Devices() (-want +got):\n%s", diff)
	}
	if _, err := NewMIG(MIGOptions{Name: "x", Devices: migDevs(gpus(3), 1), GPUs: gs}); err == nil {
		t.Error("NewMIG accepted a device on an unknown GPU")
	}
}

func TestMIGPreferredPacks(t *testing.T) {
	gs := gpus(3)
	r, err := NewMIG(MIGOptions{Name: "nvidia.com/mig-1g.10gb", Devices: migDevs(gs, 3), GPUs: gs})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		available   []string
		mustInclude []string
		size        int
		want        []string
		wantErr     string
	}{
		{name: "empty node: GPU order", available: []string{"MIG-0-0", "MIG-0-1", "MIG-0-2", "MIG-1-0", "MIG-1-1", "MIG-1-2"}, size: 2, want: []string{"MIG-0-0", "MIG-0-1"}},
		{name: "fills the partly used GPU first", available: []string{"MIG-0-0", "MIG-0-1", "MIG-0-2", "MIG-1-2", "MIG-2-0", "MIG-2-1"}, size: 1, want: []string{"MIG-1-2"}},
		{name: "must include", available: []string{"MIG-0-0", "MIG-2-0", "MIG-2-1"}, mustInclude: []string{"MIG-0-0"}, size: 2, want: []string{"MIG-0-0", "MIG-2-0"}},
		{name: "unknown device", available: []string{"MIG-9-9"}, size: 1, wantErr: "unknown MIG device"},
		{name: "too few", available: []string{"MIG-0-0"}, size: 2, wantErr: "only 1 available"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := r.Preferred(t.Context(), tc.available, tc.mustInclude, tc.size)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Preferred() error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Preferred() (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMIGAllocate(t *testing.T) {
	gs := gpus(2)
	gs[1].Minor = 5
	caps := filepath.Join(t.TempDir(), "mig-minors")
	content := "config 1\nmonitor 2\ngpu5/gi1/access 30\ngpu5/gi1/ci0/access 31\ngpu5/gi2/access 39\ngpu5/gi2/ci0/access 40\n"
	if err := os.WriteFile(caps, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	devs := migDevs(gs, 2)
	tests := []struct {
		name     string
		strategy DeviceListStrategy
		capsFile string
		ids      []string
		want     *pluginapi.ContainerAllocateResponse
		wantErr  string
	}{
		{name: "device specs: parent GPU, capabilities, control devices", capsFile: caps, ids: []string{"MIG-1-0", "MIG-1-1"},
			want: &pluginapi.ContainerAllocateResponse{Envs: voidEnv, Devices: specs("/dev/nvidia5", "/dev/nvidia-caps/nvidia-cap30", "/dev/nvidia-caps/nvidia-cap31",
				"/dev/nvidia-caps/nvidia-cap39", "/dev/nvidia-caps/nvidia-cap40", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")}},
		{name: "CDI names the MIG device", strategy: StrategyCDI, capsFile: filepath.Join(t.TempDir(), "absent"), ids: []string{"MIG-0-1"},
			want: &pluginapi.ContainerAllocateResponse{Envs: voidEnv, CdiDevices: []*pluginapi.CDIDevice{{Name: "nvidia.com/gpu=MIG-0-1"}}}},
		{name: "capability missing", capsFile: caps, ids: []string{"MIG-0-0"}, wantErr: "has no minor for gpu0/gi1/access"},
		{name: "no capability file", capsFile: filepath.Join(t.TempDir(), "absent"), ids: []string{"MIG-1-0"}, wantErr: "reading MIG capability minors"},
		{name: "unknown device", capsFile: caps, ids: []string{"MIG-7-7"}, wantErr: "unknown device"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := NewMIG(MIGOptions{Name: "nvidia.com/mig-1g.10gb", Devices: devs, GPUs: gs, Strategy: tc.strategy, CapsFile: tc.capsFile})
			if err != nil {
				t.Fatal(err)
			}
			got, err := r.Allocate(t.Context(), tc.ids)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Allocate() error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got, cmpProto()); diff != "" {
				t.Errorf("Allocate() (-want +got):\n%s", diff)
			}
		})
	}
}

// voidEnv is the environment every Allocate response carries.
var voidEnv = map[string]string{api.EnvVisibleDevices: "void"}

func specs(paths ...string) []*pluginapi.DeviceSpec {
	out := make([]*pluginapi.DeviceSpec, len(paths))
	for i, p := range paths {
		out[i] = &pluginapi.DeviceSpec{ContainerPath: p, HostPath: p, Permissions: "rw"}
	}
	return out
}
