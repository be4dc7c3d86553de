// Package report is what the workload image (tests/images/workload) prints:
// one JSON line on stdout that says what its container sees.
package report

import (
	"encoding/json"
	"regexp"
	"strings"
)

// Report is one container's view.
type Report struct {
	Name     string            `json:"name"`
	PID      int               `json:"pid"`
	Hostname string            `json:"hostname"`
	Env      map[string]string `json:"env"`
	Devices  []Device          `json:"devices"`
	Mounts   []string          `json:"mounts"`
	Cgroup   []string          `json:"cgroup"`
	API      string            `json:"api,omitempty"`
}

// Device is one /dev/nvidia* node.
type Device struct {
	Path  string `json:"path"`
	Char  bool   `json:"char"`
	Major uint32 `json:"major"`
	Minor uint32 `json:"minor"`
}

var gpuDevice = regexp.MustCompile(`^/dev/nvidia[0-9]+$`)

// GPUs are the GPU device nodes the container sees (not the control ones).
func (r Report) GPUs() []string {
	var out []string
	for _, d := range r.Devices {
		if gpuDevice.MatchString(d.Path) {
			out = append(out, d.Path)
		}
	}
	return out
}

// FromCRILog finds the report of container name in one line of a CRI
// container log ("<time> stdout F <line>").
func FromCRILog(line, name string) (Report, bool) {
	var r Report
	parts := strings.SplitN(line, " ", 4)
	if len(parts) != 4 || parts[1] != "stdout" || json.Unmarshal([]byte(parts[3]), &r) != nil || r.Name != name {
		return Report{}, false
	}
	return r, true
}
