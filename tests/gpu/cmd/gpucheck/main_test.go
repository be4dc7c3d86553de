package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/gpufrac/gpufrac/deviceplugin/enforcement"
	"github.com/gpufrac/gpufrac/deviceplugin/enforcement/enforcementtest"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
)

// failingLib is an NVML whose Init fails as on a machine without the driver.
type failingLib struct{ nvidia.Lib }

func (failingLib) Init() error {
	return fmt.Errorf("initializing NVML: %w", nvidia.ErrDriverUnavailable)
}

func TestCheckWithoutGPU(t *testing.T) {
	var out, errOut strings.Builder
	code := check(context.Background(), options{Lib: failingLib{}, Now: time.Now}, &out, &errOut)
	if code != exitNoGPU {
		t.Errorf("exit status %d, want %d", code, exitNoGPU)
	}
	if !strings.Contains(out.String(), "result: NOT RUN: no NVIDIA driver or GPU on this machine") {
		t.Errorf("stdout does not say why it did not run:\n%s", out.String())
	}
	if !strings.Contains(errOut.String(), "gpucheck: cannot run: no NVIDIA driver or GPU") {
		t.Errorf("stderr does not say why it did not run:\n%s", errOut.String())
	}
}

// TestRunRealBackendWithoutGPU runs gpucheck's real backend here: on a
// machine without the NVIDIA driver NVML does not load, and gpucheck says
// so with status 2.
func TestRunRealBackendWithoutGPU(t *testing.T) {
	if _, err := os.Stat("/dev/nvidiactl"); err == nil {
		t.Skip("this machine has an NVIDIA driver: run tests/gpu/run.sh run")
	}
	var out, errOut strings.Builder
	if code := run(nil, &out, &errOut); code != exitNoGPU {
		t.Fatalf("exit status %d, want %d; stdout:\n%s\nstderr:\n%s", code, exitNoGPU, out.String(), errOut.String())
	}
	if !strings.Contains(out.String(), "result: NOT RUN: ") || !strings.Contains(errOut.String(), "NVML did not initialize") {
		t.Errorf("stdout:\n%s\nstderr:\n%s", out.String(), errOut.String())
	}
}

func TestRunBadFlags(t *testing.T) {
	var out, errOut strings.Builder
	if code := run([]string{"-placement", "container"}, &out, &errOut); code != exitUsage {
		t.Errorf("exit status %d, want %d", code, exitUsage)
	}
}

// holderLib is the mock NVML plus the stand-in holder: the holder writes
// "<pid> <gpu uuid> <mib>" to pidFile, and Processes reports it on that GPU
// with mib + overheadMiB while the process lives, as the driver would.
type holderLib struct {
	*nvidia.Mock
	pidFile     string
	overheadMiB uint64

	mu    sync.Mutex
	calls int
}

func (l *holderLib) Processes(uuid string) ([]nvidia.Process, error) {
	l.mu.Lock()
	l.calls++
	l.mu.Unlock()
	procs, err := l.Mock.Processes(uuid)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(l.pidFile)
	if err != nil {
		return procs, nil
	}
	var pid uint32
	var gpu string
	var mib uint64
	if _, err := fmt.Sscan(string(data), &pid, &gpu, &mib); err != nil || gpu != uuid || !running(pid) {
		return procs, nil
	}
	return append(procs, nvidia.Process{PID: pid, UsedBytes: (mib + l.overheadMiB) << 20}), nil
}

// running tells whether pid exists and is not a zombie.
func running(pid uint32) bool {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.FormatUint(uint64(pid), 10), "stat"))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(stat), ')')
	return i > 0 && !strings.HasPrefix(string(stat[i+1:]), " Z")
}

// fakeSMI writes an nvidia-smi that answers gpucheck's two queries from the
// mock's inventory and the holder's pid file.
func fakeSMI(t *testing.T, lib nvidia.Lib, dir, pidFile string, overheadMiB uint64) string {
	t.Helper()
	gpus, err := lib.GPUs()
	if err != nil {
		t.Fatal(err)
	}
	driver, err := lib.DriverVersion()
	if err != nil {
		t.Fatal(err)
	}
	var rows strings.Builder
	for _, g := range gpus {
		mig := "[N/A]"
		if g.MIGCapable {
			mig = "Disabled"
		}
		// nvidia-smi prints an 8-digit domain and upper-case hex.
		fmt.Fprintf(&rows, "%d, %s, %s, %d, 0000%s, %s, %s\n", g.Index, g.UUID, g.Name, g.MemoryMiB(), strings.ToUpper(g.PCIBusID), mig, driver)
	}
	script := fmt.Sprintf(`#!/bin/sh
case "$1" in
--query-gpu=%s) cat <<'ROWS'
%sROWS
;;
--query-compute-apps=%s) if [ -f %q ]; then read pid uuid mib < %q; echo "$pid, $uuid, $((mib + %d))"; fi ;;
*) echo "unexpected query: $*" >&2; exit 9 ;;
esac
`, smiGPUQuery, rows.String(), smiAppsQuery, pidFile, pidFile, overheadMiB)
	path := filepath.Join(dir, "nvidia-smi")
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestCheckOnMock runs every check against the mock NVML and a stand-in
// CUDA process (a shell that execs sleep): the watchdog finds it through a
// fixture /proc tree (with GPUCHECK_TEST_CGROUP=1, a real cgroup), reports
// it, and kills it.
func TestCheckOnMock(t *testing.T) {
	dir := t.TempDir()
	mock, err := nvidia.NewMock("dgxh100", nvidia.WithGPUCount(2))
	if err != nil {
		t.Fatal(err)
	}
	pidFile := filepath.Join(dir, "holder")
	const overhead = 512
	lib := &holderLib{Mock: mock, pidFile: pidFile, overheadMiB: overhead}
	devDir := filepath.Join(dir, "dev")
	if err := os.MkdirAll(devDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := mock.Init(); err != nil {
		t.Fatal(err)
	}
	gpus, err := mock.GPUs()
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range gpus {
		if err := os.WriteFile(filepath.Join(devDir, fmt.Sprintf("nvidia%d", g.Minor)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	smi := fakeSMI(t, mock, dir, pidFile, overhead)
	// GPUCHECK_TEST_CGROUP=1 (root): the stand-in goes into a real pod
	// cgroup and the watchdog reads the real /proc, as on a GPU machine.
	placement, placed := "fixture", "through a fixture /proc tree"
	if os.Getenv("GPUCHECK_TEST_CGROUP") == "1" {
		placement, placed = "cgroup", "through a real cgroup /sys/fs/cgroup/"
	}
	var out, errOut strings.Builder
	code := check(context.Background(), options{
		Lib:     lib,
		Backend: "mock",
		SMI:     smi,
		Holder: func(mib uint64) []string {
			return []string{"sh", "-c", `echo "$$ $CUDA_VISIBLE_DEVICES $0" > "$1"; echo "READY pid=$$ mib=$0"; exec sleep 300`, strconv.FormatUint(mib, 10), pidFile}
		},
		HolderEnv:      func(uuid string) []string { return []string{"CUDA_VISIBLE_DEVICES=" + uuid} },
		HolderTimeout:  10 * time.Second,
		Placement:      placement,
		CgroupRoot:     "/sys/fs/cgroup",
		TmpDir:         dir,
		DevDir:         devDir,
		Interval:       20 * time.Millisecond,
		Samples:        3,
		MaxOverheadMiB: 2048,
		Now:            time.Now,
	}, &out, &errOut)
	t.Log(out.String())
	if code != exitPass {
		t.Fatalf("exit status %d, want %d\nstderr:\n%s", code, exitPass, errOut.String())
	}
	hold := holdMiB(gpus[0])
	for _, want := range []string{
		"PASS inventory-nvml: 2 GPU(s)",
		"PASS inventory-vs-nvidia-smi: 2 GPU(s)",
		fmt.Sprintf("allocated %d MiB; NVML through gpufrac's nvidia package reports %d MiB for it (+%d MiB: its context)", hold, hold+overhead, overhead),
		fmt.Sprintf("nvidia-smi reports %d MiB", hold+overhead),
		"PASS process-memory:",
		"PASS watchdog-under-limit:",
		"PASS watchdog-report:",
		"violation at poll 3 of 5",
		"gpufrac_memory_limit_violations_total{action=report}=1",
		"holder alive after: true",
		"PASS watchdog-kill:",
		"kill at poll 3 of 3",
		"SIGKILL: true",
		"SKIP in-container:",
		"SKIP mps: gpufrac runs no MPS control daemon",
		"note: the CUDA process ran as a plain process",
		placed,
		"result: PASS (6 passed, 0 failed, 2 skipped)",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("results block misses %q", want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "proc")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the fixture /proc tree was not removed: %v", err)
	}
}

// TestCheckAllMIG: with every GPU in MIG mode, the CUDA checks are skipped
// and no MIG setting is touched.
func TestCheckAllMIG(t *testing.T) {
	mock, err := nvidia.NewMock("dgxh100", nvidia.WithGPUCount(1))
	if err != nil {
		t.Fatal(err)
	}
	if err := mock.Init(); err != nil {
		t.Fatal(err)
	}
	gpus, _ := mock.GPUs()
	if err := mock.SetMIGMode(gpus[0].UUID, true); err != nil {
		t.Fatal(err)
	}
	var out, errOut strings.Builder
	code := check(context.Background(), options{Lib: mock, Holder: func(uint64) []string { t.Fatal("holder started"); return nil }, DevDir: t.TempDir(), Now: time.Now}, &out, &errOut)
	if m, _ := mock.MIGMode(gpus[0].UUID); !m.Current {
		t.Error("MIG mode changed")
	}
	for _, want := range []string{"SKIP process-memory: every GPU is in MIG mode", "SKIP watchdog-kill: every GPU is in MIG mode", "MIG current enabled", "SKIP inventory-vs-nvidia-smi: comparison turned off"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("results block misses %q:\n%s", want, out.String())
		}
	}
	// No device node in the empty DevDir: the inventory check fails.
	if code != exitFail || !strings.Contains(out.String(), "FAIL inventory-nvml") {
		t.Errorf("exit status %d, want %d with a failed inventory:\n%s", code, exitFail, out.String())
	}
}

func TestHoldMiB(t *testing.T) {
	for total, want := range map[uint64]uint64{143771: 4314, 81559: 2447, 15360: 1024} {
		g := nvidia.GPU{MemoryBytes: total << 20}
		if got := holdMiB(g); got != want {
			t.Errorf("holdMiB(%d MiB) = %d, want %d", total, got, want)
		}
	}
}

// TestPlacementsParse: the cgroup path gpucheck writes (real or fixture)
// is one the watchdog's parser reads as the pod container.
func TestPlacementsParse(t *testing.T) {
	uid := types.UID("6a1f0c2e-3b4d-4e5f-8a9b-0c1d2e3f4a5b")
	cid := enforcementtest.ContainerID("gpucheck/x")
	ref := enforcement.ParseCgroup(fixtureCgroupLine(uid, cid))
	if ref.PodUID != uid || ref.ContainerID != cid {
		t.Errorf("ParseCgroup(%q) = %+v", fixtureCgroupLine(uid, cid), ref)
	}
	// A cgroup v1 file with the path on one hierarchy only.
	v1 := "12:pids:/" + podCgroupRel(uid, cid) + "\n11:memory:/user.slice\n1:name=systemd:/user.slice/session-1.scope\n"
	if ref := enforcement.ParseCgroup(v1); ref.PodUID != uid || ref.ContainerID != cid {
		t.Errorf("ParseCgroup(%q) = %+v", v1, ref)
	}

	// The fixture placement resolves a real process.
	dir := t.TempDir()
	pid := uint32(os.Getpid())
	p, err := placeFixture(dir, pid, uid, cid)
	if err != nil {
		t.Fatal(err)
	}
	got, err := enforcement.ProcFS{Root: p.ProcRoot}.Container(pid)
	if err != nil || got.PodUID != uid || got.ContainerID != cid {
		t.Errorf("fixture resolves pid %d to %+v, %v", pid, got, err)
	}
	if err := p.Cleanup(); err != nil {
		t.Error(err)
	}
}

// TestPlaceCgroup moves a child process into a real pod-named cgroup and
// back out. It writes the host's cgroup filesystem, so it runs only when
// GPUCHECK_TEST_CGROUP=1 (as root).
func TestPlaceCgroup(t *testing.T) {
	if os.Getenv("GPUCHECK_TEST_CGROUP") != "1" {
		t.Skip("set GPUCHECK_TEST_CGROUP=1 (root) to write the host's cgroups")
	}
	h, err := startHolder(context.Background(), []string{"sh", "-c", `echo "READY pid=$$"; exec sleep 60`}, nil, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	uid := types.UID("6a1f0c2e-3b4d-4e5f-8a9b-0c1d2e3f4a5b")
	cid := enforcementtest.ContainerID("gpucheck/cgroup")
	p, err := placeCgroup("/sys/fs/cgroup", h.PID, uid, cid)
	if err != nil {
		h.Stop()
		t.Fatal(err)
	}
	t.Log(p.How)
	got, err := enforcement.ProcFS{Root: p.ProcRoot}.Container(h.PID)
	if err != nil || got.PodUID != uid || got.ContainerID != cid {
		t.Errorf("pid %d resolves to %+v, %v", h.PID, got, err)
	}
	h.Stop()
	if err := p.Cleanup(); err != nil {
		t.Errorf("cleanup: %v", err)
	}
}

// TestCheckProcessNotListed: when NVML does not list the CUDA process (a PID
// namespace between gpucheck and the driver would do it), process-memory
// fails with what NVML lists, and the watchdog checks are skipped.
func TestCheckProcessNotListed(t *testing.T) {
	dir := t.TempDir()
	mock, err := nvidia.NewMock("dgxh100", nvidia.WithGPUCount(1))
	if err != nil {
		t.Fatal(err)
	}
	if err := mock.Init(); err != nil {
		t.Fatal(err)
	}
	gpus, _ := mock.GPUs()
	if err := mock.SetProcesses(gpus[0].UUID, []nvidia.Process{{PID: 4242, UsedBytes: 100 << 20}}); err != nil {
		t.Fatal(err)
	}
	var out, errOut strings.Builder
	code := check(context.Background(), options{
		Lib:           mock,
		Holder:        func(uint64) []string { return []string{"sh", "-c", `echo "READY pid=$$"; exec cat >/dev/null`} },
		HolderEnv:     func(string) []string { return nil },
		HolderTimeout: 10 * time.Second,
		ListTimeout:   300 * time.Millisecond,
		DevDir:        dir,
		Now:           time.Now,
	}, &out, &errOut)
	for _, want := range []string{"FAIL process-memory:", "NVML does not list pid", "(it lists: pid 4242 100 MiB)", "SKIP watchdog-report: NVML does not report the CUDA process"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("results block misses %q:\n%s", want, out.String())
		}
	}
	if code != exitFail {
		t.Errorf("exit status %d, want %d", code, exitFail)
	}
}
