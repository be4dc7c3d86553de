package main

import (
	"context"
	"encoding/csv"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// smiGPUQuery is the --query-gpu field list gpucheck asks nvidia-smi for
// (read-only queries; nvidia-smi is never asked to change anything).
const smiGPUQuery = "index,uuid,name,memory.total,pci.bus_id,mig.mode.current,driver_version"

// smiAppsQuery is the --query-compute-apps field list.
const smiAppsQuery = "pid,gpu_uuid,used_memory"

// smiGPU is one row of nvidia-smi --query-gpu=smiGPUQuery.
type smiGPU struct {
	Index int
	UUID  string
	Name  string
	// MemoryMiB is memory.total; -1 when nvidia-smi printed no number.
	MemoryMiB int64
	PCIBusID  string
	// MIGMode is mig.mode.current: "Enabled", "Disabled" or "" when N/A.
	MIGMode string
	Driver  string
}

// smiApp is one row of nvidia-smi --query-compute-apps=smiAppsQuery.
type smiApp struct {
	PID     uint32
	GPUUUID string
	// UsedMiB is used_memory; -1 when nvidia-smi printed no number.
	UsedMiB int64
}

// runSMI runs nvidia-smi with a query; a missing nvidia-smi gives exec.ErrNotFound.
func runSMI(ctx context.Context, smi string, args ...string) (string, error) {
	path, err := exec.LookPath(smi)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, args...).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return "", fmt.Errorf("%s %s: %w: %s", path, strings.Join(args, " "), err, strings.TrimSpace(string(ee.Stderr)))
		}
		return "", fmt.Errorf("%s %s: %w", path, strings.Join(args, " "), err)
	}
	return string(out), nil
}

// readCSV parses nvidia-smi's --format=csv,noheader,nounits output: one
// record per line, fields separated by ", ".
func readCSV(out string, fields int) ([][]string, error) {
	r := csv.NewReader(strings.NewReader(out))
	r.TrimLeadingSpace = true
	r.FieldsPerRecord = fields
	recs, err := r.ReadAll()
	if err != nil {
		return nil, fmt.Errorf("parsing nvidia-smi CSV: %w", err)
	}
	for _, rec := range recs {
		for i := range rec {
			rec[i] = strings.TrimSpace(rec[i])
		}
	}
	return recs, nil
}

// notAvailable tells whether nvidia-smi printed no value ("[N/A]",
// "[Not Supported]", "N/A", "").
func notAvailable(v string) bool {
	return v == "" || strings.HasPrefix(v, "[") || strings.EqualFold(v, "N/A")
}

func smiNumber(v string) int64 {
	if notAvailable(v) {
		return -1
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// parseSMIGPUs parses nvidia-smi --query-gpu=smiGPUQuery --format=csv,noheader,nounits.
func parseSMIGPUs(out string) ([]smiGPU, error) {
	recs, err := readCSV(out, 7)
	if err != nil {
		return nil, err
	}
	gpus := make([]smiGPU, 0, len(recs))
	for _, rec := range recs {
		idx, err := strconv.Atoi(rec[0])
		if err != nil {
			return nil, fmt.Errorf("parsing nvidia-smi CSV: index %q is not a number", rec[0])
		}
		mig := rec[5]
		if notAvailable(mig) {
			mig = ""
		}
		gpus = append(gpus, smiGPU{
			Index: idx, UUID: rec[1], Name: rec[2], MemoryMiB: smiNumber(rec[3]),
			PCIBusID: normalizeBusID(rec[4]), MIGMode: mig, Driver: rec[6],
		})
	}
	return gpus, nil
}

// parseSMIApps parses nvidia-smi --query-compute-apps=smiAppsQuery --format=csv,noheader,nounits
// (empty output: no compute processes).
func parseSMIApps(out string) ([]smiApp, error) {
	if strings.TrimSpace(out) == "" || strings.Contains(out, "No running") {
		return nil, nil
	}
	recs, err := readCSV(out, 3)
	if err != nil {
		return nil, err
	}
	apps := make([]smiApp, 0, len(recs))
	for _, rec := range recs {
		pid, err := strconv.ParseUint(rec[0], 10, 32)
		if err != nil {
			return nil, fmt.Errorf("parsing nvidia-smi CSV: pid %q is not a number", rec[0])
		}
		apps = append(apps, smiApp{PID: uint32(pid), GPUUUID: rec[1], UsedMiB: smiNumber(rec[2])})
	}
	return apps, nil
}

// normalizeBusID lowercases a PCI bus ID and shortens an all-zero-padded
// 8-digit domain to 4 digits ("00000000:07:00.0" -> "0000:07:00.0"), as
// gpufrac's nvidia package does.
func normalizeBusID(id string) string {
	id = strings.ToLower(strings.TrimSpace(id))
	if dom, rest, ok := strings.Cut(id, ":"); ok && len(dom) == 8 && strings.HasPrefix(dom, "0000") {
		return dom[4:] + ":" + rest
	}
	return id
}

// nvmlGPU is what gpucheck read about one GPU through gpufrac's nvidia package.
type nvmlGPU struct {
	Index     int
	UUID      string
	Name      string
	MemoryMiB uint64
	PCIBusID  string
	// MIGCapable and MIGEnabled: MIG mode as NVML reports it (read only).
	MIGCapable, MIGEnabled bool
}

func (g nvmlGPU) migMode() string {
	switch {
	case !g.MIGCapable:
		return ""
	case g.MIGEnabled:
		return "Enabled"
	default:
		return "Disabled"
	}
}

// compareInventory compares NVML's view with nvidia-smi's, GPU by UUID, and
// returns the differences (none: they agree). Memory may differ by 1 %
// (nvidia-smi and NVML's v1 memory call may count reserved memory apart).
func compareInventory(nv []nvmlGPU, driver string, smi []smiGPU) []string {
	var diffs []string
	if len(nv) != len(smi) {
		diffs = append(diffs, fmt.Sprintf("GPU count: NVML %d, nvidia-smi %d", len(nv), len(smi)))
	}
	byUUID := map[string]smiGPU{}
	for _, s := range smi {
		byUUID[s.UUID] = s
	}
	for _, g := range nv {
		s, ok := byUUID[g.UUID]
		if !ok {
			diffs = append(diffs, fmt.Sprintf("%s: not listed by nvidia-smi", g.UUID))
			continue
		}
		if s.Index != g.Index {
			diffs = append(diffs, fmt.Sprintf("%s: index NVML %d, nvidia-smi %d", g.UUID, g.Index, s.Index))
		}
		if s.Name != g.Name {
			diffs = append(diffs, fmt.Sprintf("%s: name NVML %q, nvidia-smi %q", g.UUID, g.Name, s.Name))
		}
		if s.MemoryMiB < 0 || absDiff(uint64(s.MemoryMiB), g.MemoryMiB)*100 > g.MemoryMiB {
			diffs = append(diffs, fmt.Sprintf("%s: memory NVML %d MiB, nvidia-smi %d MiB", g.UUID, g.MemoryMiB, s.MemoryMiB))
		}
		if s.PCIBusID != normalizeBusID(g.PCIBusID) {
			diffs = append(diffs, fmt.Sprintf("%s: PCI bus ID NVML %s, nvidia-smi %s", g.UUID, g.PCIBusID, s.PCIBusID))
		}
		if s.MIGMode != g.migMode() {
			diffs = append(diffs, fmt.Sprintf("%s: MIG mode NVML %q, nvidia-smi %q", g.UUID, g.migMode(), s.MIGMode))
		}
		if s.Driver != driver {
			diffs = append(diffs, fmt.Sprintf("%s: driver NVML %s, nvidia-smi %s", g.UUID, driver, s.Driver))
		}
	}
	return diffs
}

func absDiff(a, b uint64) uint64 {
	if a > b {
		return a - b
	}
	return b - a
}

// errNotFound is exec.ErrNotFound, for errors.Is on a missing nvidia-smi.
var errNotFound = exec.ErrNotFound
