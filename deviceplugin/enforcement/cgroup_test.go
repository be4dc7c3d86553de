package enforcement

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const (
	testUID = "0f6c3b9e-5b1c-4a53-9c5e-2d4f1a7b8c90"
	// testUIDEsc is testUID as the systemd driver escapes it in slice names.
	testUIDEsc = "0f6c3b9e_5b1c_4a53_9c5e_2d4f1a7b8c90"
	testCID    = "3f4e5d6c7b8a99887766554433221100ffeeddccbbaa00112233445566778899"
	otherCID   = "aaaabbbbccccddddeeeeffff0000111122223333444455556666777788889999"
	// staticUID is a static pod's UID: 32 hex digits, no dashes.
	staticUID = "8a4ba8dc1e6f0f5b6bd6f6d6e7b1a7e5"
)

func TestParseCgroup(t *testing.T) {
	containerd := ContainerRef{PodUID: testUID, ContainerID: testCID, Runtime: RuntimeContainerd}
	crio := ContainerRef{PodUID: testUID, ContainerID: testCID, Runtime: RuntimeCRIO}
	docker := ContainerRef{PodUID: testUID, ContainerID: testCID, Runtime: RuntimeDocker}
	bare := ContainerRef{PodUID: testUID, ContainerID: testCID}
	for _, tc := range []struct {
		name    string
		content string
		want    ContainerRef
	}{
		// cgroup v2, systemd driver.
		{name: "v2 systemd containerd burstable",
			content: "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + testUIDEsc + ".slice/cri-containerd-" + testCID + ".scope\n",
			want:    containerd},
		{name: "v2 systemd containerd besteffort",
			content: "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + testUIDEsc + ".slice/cri-containerd-" + testCID + ".scope\n",
			want:    containerd},
		{name: "v2 systemd containerd guaranteed",
			content: "0::/kubepods.slice/kubepods-pod" + testUIDEsc + ".slice/cri-containerd-" + testCID + ".scope\n",
			want:    containerd},
		{name: "v2 systemd cri-o",
			content: "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + testUIDEsc + ".slice/crio-" + testCID + ".scope\n",
			want:    crio},
		{name: "v2 systemd docker (cri-dockerd)",
			content: "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + testUIDEsc + ".slice/docker-" + testCID + ".scope\n",
			want:    docker},
		{name: "v2 systemd nested sub-cgroup inside the container",
			content: "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + testUIDEsc + ".slice/cri-containerd-" + testCID + ".scope/init.scope\n",
			want:    containerd},
		{name: "v2 kind: kubelet slice nested in a docker node container",
			content: "0::/system.slice/docker-" + otherCID + ".scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod" + testUIDEsc + ".slice/cri-containerd-" + testCID + ".scope\n",
			want:    containerd},
		{name: "v2 systemd static pod UID",
			content: "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + staticUID + ".slice/cri-containerd-" + testCID + ".scope\n",
			want:    ContainerRef{PodUID: staticUID, ContainerID: testCID, Runtime: RuntimeContainerd}},

		// cgroup v2, cgroupfs driver.
		{name: "v2 cgroupfs containerd burstable",
			content: "0::/kubepods/burstable/pod" + testUID + "/" + testCID + "\n",
			want:    bare},
		{name: "v2 cgroupfs guaranteed",
			content: "0::/kubepods/pod" + testUID + "/" + testCID + "\n",
			want:    bare},
		{name: "v2 cgroupfs cri-o",
			content: "0::/kubepods/besteffort/pod" + testUID + "/crio-" + testCID + "\n",
			want:    crio},

		// Cgroup namespaces: paths relative to the reader's namespace root.
		{name: "v2 cgroupns relative, systemd",
			content: "0::/../../../kubepods-besteffort.slice/kubepods-besteffort-pod" + testUIDEsc + ".slice/cri-containerd-" + testCID + ".scope\n",
			want:    containerd},
		{name: "v2 cgroupns relative, cgroupfs guaranteed",
			content: "0::/../../pod" + testUID + "/" + testCID + "\n",
			want:    bare},
		{name: "v2 cgroupns: a sibling container of the reader's own pod",
			content: "0::/../cri-containerd-" + testCID + ".scope\n",
			want:    ContainerRef{}},
		{name: "v2 cgroupns: the reader's own cgroup",
			content: "0::/\n",
			want:    ContainerRef{}},

		// cgroup v1 and hybrid.
		{name: "v1 cgroupfs docker",
			content: strings.Join([]string{
				"12:pids:/kubepods/burstable/pod" + testUID + "/" + testCID,
				"11:memory:/kubepods/burstable/pod" + testUID + "/" + testCID,
				"10:cpu,cpuacct:/kubepods/burstable/pod" + testUID + "/" + testCID,
				"1:name=systemd:/kubepods/burstable/pod" + testUID + "/" + testCID,
			}, "\n") + "\n",
			want: bare},
		{name: "v1 systemd containerd",
			content: strings.Join([]string{
				"11:devices:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + testUIDEsc + ".slice/cri-containerd-" + testCID + ".scope",
				"4:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + testUIDEsc + ".slice/cri-containerd-" + testCID + ".scope",
				"1:name=systemd:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + testUIDEsc + ".slice/cri-containerd-" + testCID + ".scope",
			}, "\n") + "\n",
			want: containerd},
		{name: "v1 kind on cgroupfs: kubepods under a docker node container",
			content: "4:memory:/docker/" + otherCID + "/kubepods/besteffort/pod" + testUID + "/" + testCID + "\n",
			want:    bare},
		{name: "hybrid: v1 controllers plus an empty unified line",
			content: "5:memory:/kubepods/burstable/pod" + testUID + "/" + testCID + "\n0::/\n",
			want:    bare},
		{name: "v1 lines disagree: the first naming a container wins",
			content: "3:cpu:/kubepods/burstable/pod" + testUID + "\n2:memory:/kubepods/burstable/pod" + testUID + "/" + testCID + "\n",
			want:    bare},

		// Processes in a pod but in no container of it.
		{name: "cri-o conmon is not the container",
			content: "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + testUIDEsc + ".slice/crio-conmon-" + testCID + ".scope\n",
			want:    ContainerRef{PodUID: testUID}},
		{name: "pod slice itself",
			content: "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + testUIDEsc + ".slice\n",
			want:    ContainerRef{PodUID: testUID}},

		// Host processes.
		{name: "host systemd service", content: "0::/system.slice/nvidia-persistenced.service\n", want: ContainerRef{}},
		{name: "host user session", content: "0::/user.slice/user-1000.slice/session-3.scope\n", want: ContainerRef{}},
		{name: "docker container outside Kubernetes", content: "0::/system.slice/docker-" + testCID + ".scope\n", want: ContainerRef{}},
		{name: "v1 host process", content: "4:memory:/\n1:name=systemd:/init.scope\n", want: ContainerRef{}},
		{name: "kubepods slice without a pod", content: "0::/kubepods.slice/kubepods-burstable.slice\n", want: ContainerRef{}},
		{name: "empty", content: "", want: ContainerRef{}},
		{name: "malformed lines are skipped", content: "garbage\n0::/kubepods/pod" + testUID + "/" + testCID + "\n", want: bare},
		{name: "no trailing newline, CRLF tolerated", content: "0::/kubepods/pod" + testUID + "/" + testCID + "\r\n", want: bare},
		{name: "short hex is not a container ID", content: "0::/kubepods/pod" + testUID + "/" + testCID[:63] + "\n", want: ContainerRef{PodUID: testUID}},
		{name: "uppercase UID is not a pod", content: "0::/kubepods/pod" + strings.ToUpper(testUID) + "/" + testCID + "\n", want: ContainerRef{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, ParseCgroup(tc.content)); diff != "" {
				t.Errorf("ParseCgroup() (-want +got):\n%s", diff)
			}
		})
	}
}

func FuzzParseCgroup(f *testing.F) {
	f.Add("0::/kubepods/pod" + testUID + "/" + testCID + "\n")
	f.Add("1:name=systemd:/kubepods.slice/kubepods-pod" + testUIDEsc + ".slice/crio-" + testCID + ".scope\n")
	f.Fuzz(func(t *testing.T, content string) {
		ref := ParseCgroup(content)
		if ref.ContainerID != "" && ref.PodUID == "" {
			t.Fatalf("ParseCgroup(%q) = %+v: a container without a pod", content, ref)
		}
		if ref.ContainerID != "" && len(ref.ContainerID) != 64 {
			t.Fatalf("ParseCgroup(%q) container ID %q is not 64 hex digits", content, ref.ContainerID)
		}
	})
}
