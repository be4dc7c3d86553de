package enforcement

import (
	"regexp"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// Container runtimes named by a cgroup path ([ContainerRef.Runtime]).
const (
	RuntimeContainerd = "containerd"
	RuntimeCRIO       = "cri-o"
	RuntimeDocker     = "docker"
)

// ContainerRef is the pod container a process runs in, as its cgroup path
// tells: the pod UID and the runtime's container ID.
type ContainerRef struct {
	// PodUID is the pod's UID; empty for a process outside any pod (a host
	// process, or one outside the agent's cgroup namespace view).
	PodUID types.UID
	// ContainerID is the runtime's 64-hex container ID, without a runtime
	// prefix; empty when the process is in the pod's cgroup but in no
	// container of it (CRI-O's conmon, a process in the pod slice itself).
	ContainerID string
	// Runtime is RuntimeContainerd, RuntimeCRIO or RuntimeDocker when the
	// path names it (systemd driver, CRI-O), "" when it does not (the
	// cgroupfs driver with containerd or docker).
	Runtime string
}

// podSegment matches the cgroup directory of a pod:
//
//	cgroupfs driver: pod<uid>                                  (UID with dashes)
//	systemd driver:  kubepods-burstable-pod<uid>.slice         (dashes escaped as "_")
//	                 kubepods-pod<uid>.slice                    (guaranteed QoS)
//	                 kubelet-kubepods-besteffort-pod<uid>.slice (kubelet in a nested slice, kind)
//
// UIDs are RFC 4122 UUIDs, except static pods' which are 32 hex digits.
var podSegment = regexp.MustCompile(`^(?:[a-z0-9_.-]+-)?pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32})(?:\.slice)?$`)

// containerSegment matches the cgroup directory of a container, the one
// right below its pod's:
//
//	<id>                       containerd or docker, cgroupfs driver
//	crio-<id>                  CRI-O, cgroupfs driver
//	cri-containerd-<id>.scope  containerd, systemd driver
//	crio-<id>.scope            CRI-O, systemd driver
//	docker-<id>.scope          docker (cri-dockerd), systemd driver
//
// CRI-O's "crio-conmon-<id>.scope" (the container monitor, not the
// container) deliberately does not match.
var containerSegment = regexp.MustCompile(`^(?:(cri-containerd|crio|docker)-)?([0-9a-f]{64})(?:\.scope)?$`)

// ParseCgroup returns the pod container a process runs in from the content
// of its /proc/<pid>/cgroup, for cgroup v1 (one line per hierarchy), v2
// ("0::<path>") and hybrid layouts, the systemd and cgroupfs drivers, and
// containerd, CRI-O and docker container IDs. Paths relative to a cgroup
// namespace ("0::/../../kubepods-...") work too: the pod and container
// directories are found by name wherever they are, and ".." is skipped.
//
// A process in no pod gives the zero ContainerRef. When hierarchies
// disagree (they should not), the first line naming a container wins over
// lines naming only a pod.
func ParseCgroup(content string) ContainerRef {
	var podOnly ContainerRef
	for line := range strings.Lines(content) {
		// hierarchy-ID:controller-list:cgroup-path; the path may contain ':'.
		parts := strings.SplitN(strings.TrimRight(line, "\r\n"), ":", 3)
		if len(parts) != 3 {
			continue
		}
		ref := parseCgroupPath(parts[2])
		if ref.ContainerID != "" {
			return ref
		}
		if podOnly.PodUID == "" {
			podOnly = ref
		}
	}
	return podOnly
}

// parseCgroupPath finds the pod directory in one cgroup path and the
// container directory right below it.
func parseCgroupPath(path string) ContainerRef {
	segs := strings.Split(path, "/")
	for i, s := range segs {
		if !strings.Contains(s, "pod") {
			continue // cheap filter: most segments are not pods
		}
		m := podSegment.FindStringSubmatch(s)
		if m == nil {
			continue
		}
		ref := ContainerRef{PodUID: types.UID(strings.ReplaceAll(m[1], "_", "-"))}
		if i+1 < len(segs) {
			if c := containerSegment.FindStringSubmatch(segs[i+1]); c != nil {
				ref.ContainerID = c[2]
				ref.Runtime = runtimeOfPrefix(c[1])
			}
		}
		return ref
	}
	return ContainerRef{}
}

func runtimeOfPrefix(prefix string) string {
	switch prefix {
	case "cri-containerd":
		return RuntimeContainerd
	case "crio":
		return RuntimeCRIO
	case "docker":
		return RuntimeDocker
	}
	return ""
}
