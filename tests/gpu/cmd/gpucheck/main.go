// Command gpucheck runs the checks of gpufrac-node that only a real NVIDIA
// GPU can show (issue 26, tests/gpu): the real NVML backend's inventory,
// the per-process memory NVML reports for a CUDA process, and the memory
// watchdog acting on that process. It prints a results block and exits 0
// when every check that ran passed, 1 when one failed, 2 when there is no
// NVIDIA GPU or driver here (nothing checked), 64 on bad flags.
//
// It only reads the GPUs' state: no MIG mode, clock, persistence or any
// other setting is changed, and nvidia-smi is only asked --query-* questions.
// Run it through tests/gpu/run.sh run, which finds cudahold beside it.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"

	"github.com/gpufrac/gpufrac/deviceplugin/enforcement/enforcementtest"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// options is one gpucheck run's inputs; tests fill it with a mock NVML and
// a stand-in holder.
type options struct {
	Lib nvidia.Lib
	// Backend names Lib in the report.
	Backend string
	// SMI is the nvidia-smi to compare with ("" or missing: the comparison
	// is skipped).
	SMI string
	// Holder is the command that allocates and holds MiB of memory on the
	// GPU named by its environment (cudahold).
	Holder func(mib uint64) []string
	// HolderEnv selects the GPU for the holder.
	HolderEnv func(uuid string) []string
	// HoldMiB is how much the holder holds; 0: max(1 GiB, 3 % of the GPU).
	HoldMiB uint64
	// HolderTimeout bounds the holder's start (CUDA init, allocation);
	// ListTimeout how long NVML may take to list it (default 30 s).
	HolderTimeout, ListTimeout time.Duration
	// Placement: "auto" (a real cgroup, else a fixture /proc), "cgroup" or "fixture".
	Placement  string
	CgroupRoot string
	// DevDir holds the GPUs' device nodes (/dev).
	DevDir string
	TmpDir string
	// Interval and Samples are the watchdog's poll interval and sample count.
	Interval time.Duration
	Samples  int
	// MaxOverheadMiB is how much more than the allocation NVML may report
	// for the holder (its CUDA context).
	MaxOverheadMiB uint64
	Now            func() time.Time
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("gpucheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	self, _ := os.Executable()
	cudahold := fs.String("cudahold", filepath.Join(filepath.Dir(self), "cudahold"), "path of the cudahold binary")
	smi := fs.String("nvidia-smi", "nvidia-smi", "nvidia-smi to compare the inventory with (\"\": do not compare)")
	holdMiB := fs.Uint64("hold-mib", 0, "GPU memory the CUDA process holds, MiB (0: max(1024, 3% of the GPU))")
	placement := fs.String("placement", "auto", "where the watchdog finds the CUDA process's container: auto, cgroup (a real cgroup under -cgroup-root) or fixture (a fixture /proc tree)")
	cgroupRoot := fs.String("cgroup-root", "/sys/fs/cgroup", "cgroup filesystem root")
	timeout := fs.Duration("timeout", 8*time.Minute, "overall time limit")
	if err := fs.Parse(args); err != nil || fs.NArg() != 0 {
		return exitUsage
	}
	switch *placement {
	case "auto", "cgroup", "fixture":
	default:
		fmt.Fprintf(stderr, "gpucheck: -placement %q: want auto, cgroup or fixture\n", *placement)
		return exitUsage
	}
	tmp, err := os.MkdirTemp("", "gpucheck-")
	if err != nil {
		fmt.Fprintf(stderr, "gpucheck: %v\n", err)
		return exitUsage
	}
	defer os.RemoveAll(tmp)
	// SIGTERM (run.sh's timeout) or SIGINT ends the checks early, so that
	// the CUDA process is stopped and the cgroups removed on the way out.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	holdFor := (*timeout).Round(time.Second).String()
	return check(ctx, options{
		Lib:     nvidia.NewReal(),
		Backend: "real backend: go-nvml on the driver's libnvidia-ml.so.1",
		SMI:     *smi,
		Holder: func(mib uint64) []string {
			return []string{*cudahold, "-mib", strconv.FormatUint(mib, 10), "-hold", holdFor}
		},
		HolderEnv: func(uuid string) []string {
			return []string{"CUDA_VISIBLE_DEVICES=" + uuid, "CUDA_DEVICE_ORDER=PCI_BUS_ID"}
		},
		HoldMiB:        *holdMiB,
		HolderTimeout:  2 * time.Minute,
		Placement:      *placement,
		CgroupRoot:     *cgroupRoot,
		DevDir:         "/dev",
		TmpDir:         tmp,
		Interval:       500 * time.Millisecond,
		Samples:        3,
		MaxOverheadMiB: 2048,
		Now:            time.Now,
	}, stdout, stderr)
}

// migModeReader is the read-only part of nvidia.MIGLib gpucheck uses.
type migModeReader interface {
	MIGMode(uuid string) (nvidia.MIGMode, error)
}

// check runs the checks and prints the results block; it returns the exit status.
func check(ctx context.Context, c options, stdout, stderr io.Writer) int {
	host, _ := os.Hostname()
	if err := c.Lib.Init(); err != nil {
		why := fmt.Sprintf("no usable NVIDIA GPU: NVML did not initialize (%v)", err)
		if errors.Is(err, nvidia.ErrDriverUnavailable) {
			why = fmt.Sprintf("no NVIDIA driver or GPU on this machine: NVML did not initialize (%v)", err)
		}
		fmt.Fprintf(stderr, "gpucheck: cannot run: %s\n", why)
		WriteNotRun(stdout, c.Now(), host, why)
		return exitNoGPU
	}
	defer func() { _ = c.Lib.Shutdown() }()
	r := &Report{Date: c.Now(), Host: host}
	driver, err := c.Lib.DriverVersion()
	if err != nil {
		r.Driver = "unknown: " + err.Error()
	} else {
		r.Driver = driver
	}
	gpus, err := c.Lib.GPUs()
	if err != nil {
		r.Add("inventory-nvml", Fail, "listing GPUs through gpufrac's nvidia package (%s): %v", c.Backend, err)
		r.Write(stdout)
		return exitFail
	}
	if len(gpus) == 0 {
		why := "NVML initialized but lists no GPU"
		fmt.Fprintf(stderr, "gpucheck: cannot run: %s\n", why)
		WriteNotRun(stdout, c.Now(), host, why)
		return exitNoGPU
	}

	nv, free := inventory(c, r, gpus, driver)
	compareSMI(ctx, c, r, nv, driver)

	target, why := pickGPU(nv, gpus, free)
	if target < 0 {
		for _, name := range []string{"process-memory", "watchdog-under-limit", "watchdog-report", "watchdog-kill"} {
			r.Add(name, Skip, "%s", why)
		}
	} else {
		processAndWatchdog(ctx, c, r, gpus[target], free[target])
	}
	if err := ctx.Err(); err != nil {
		r.Add("completed", Fail, "the run was cut short (%v): the checks above may have failed for that reason", err)
	}
	r.Add("mps", Skip, "gpufrac runs no MPS control daemon and sets no CUDA_MPS_* variable (README: a fraction's kernels are time-sliced, with no per-fraction compute share), so there are no MPS limits to check")
	r.Write(stdout)
	return r.ExitCode()
}

// inventory reads each GPU's memory and MIG mode, records the GPU lines and
// the inventory-nvml check, and returns what NVML said and each GPU's free MiB.
func inventory(c options, r *Report, gpus []nvidia.GPU, driver string) ([]nvmlGPU, []uint64) {
	mig, _ := c.Lib.(migModeReader)
	var problems []string
	nv := make([]nvmlGPU, len(gpus))
	free := make([]uint64, len(gpus))
	for i, g := range gpus {
		n := nvmlGPU{Index: g.Index, UUID: g.UUID, Name: g.Name, MemoryMiB: g.MemoryMiB(), PCIBusID: g.PCIBusID, MIGCapable: g.MIGCapable}
		migText := "not MIG-capable"
		if g.MIGCapable {
			switch {
			case mig == nil:
				problems = append(problems, g.UUID+": the backend cannot read MIG mode")
			default:
				m, err := mig.MIGMode(g.UUID)
				if err != nil {
					problems = append(problems, fmt.Sprintf("%s: MIG mode: %v", g.UUID, err))
				}
				n.MIGEnabled = m.Current
				migText = fmt.Sprintf("MIG current %s, pending %s", onOff(m.Current), onOff(m.Pending))
			}
		}
		nv[i] = n
		mem, err := c.Lib.Memory(g.UUID)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: memory: %v", g.UUID, err))
		} else {
			free[i] = (mem.TotalBytes - min(mem.UsedBytes, mem.TotalBytes)) >> 20
		}
		if !strings.HasPrefix(g.UUID, "GPU-") {
			problems = append(problems, fmt.Sprintf("GPU %d: UUID %q does not start with GPU-", g.Index, g.UUID))
		}
		if g.MemoryBytes == 0 {
			problems = append(problems, g.UUID+": no memory")
		}
		node := filepath.Join(c.DevDir, fmt.Sprintf("nvidia%d", g.Minor))
		if _, err := os.Stat(node); err != nil {
			problems = append(problems, fmt.Sprintf("%s: device node %s: %v", g.UUID, node, err))
		}
		r.GPUs = append(r.GPUs, fmt.Sprintf("%d %s %s, %d MiB (%d MiB free), PCI %s, %s, %s",
			g.Index, g.Name, g.UUID, g.MemoryMiB(), free[i], g.PCIBusID, node, migText))
	}
	if len(problems) > 0 {
		r.Add("inventory-nvml", Fail, "%d GPU(s), driver %s; %s", len(gpus), driver, strings.Join(problems, "; "))
	} else {
		r.Add("inventory-nvml", Pass, "%d GPU(s) through gpufrac's nvidia package (%s): UUID, name, memory, PCI bus ID, minor (device node present) and MIG mode read; driver %s", len(gpus), c.Backend, driver)
	}
	return nv, free
}

func onOff(b bool) string {
	if b {
		return "enabled"
	}
	return "disabled"
}

// compareSMI records the inventory-vs-nvidia-smi check.
func compareSMI(ctx context.Context, c options, r *Report, nv []nvmlGPU, driver string) {
	if c.SMI == "" {
		r.Add("inventory-vs-nvidia-smi", Skip, "comparison turned off (-nvidia-smi \"\")")
		return
	}
	out, err := runSMI(ctx, c.SMI, "--query-gpu="+smiGPUQuery, "--format=csv,noheader,nounits")
	if errors.Is(err, errNotFound) {
		r.Add("inventory-vs-nvidia-smi", Skip, "nvidia-smi not found (%v)", err)
		return
	}
	if err != nil {
		r.Add("inventory-vs-nvidia-smi", Fail, "%v", err)
		return
	}
	smi, err := parseSMIGPUs(out)
	if err != nil {
		r.Add("inventory-vs-nvidia-smi", Fail, "%v: %q", err, out)
		return
	}
	if diffs := compareInventory(nv, driver, smi); len(diffs) > 0 {
		r.Add("inventory-vs-nvidia-smi", Fail, "%s", strings.Join(diffs, "; "))
		return
	}
	r.Add("inventory-vs-nvidia-smi", Pass, "%d GPU(s): index, UUID, name, memory.total (within 1%%), PCI bus ID, mig.mode.current and driver version agree with `nvidia-smi --query-gpu=%s`", len(nv), smiGPUQuery)
}

// pickGPU chooses the GPU for the CUDA process: not in MIG mode (gpufrac
// serves fractions from whole GPUs; CUDA on a MIG-enabled GPU needs a MIG
// device), the most free memory. It returns -1 and why when none fits.
func pickGPU(nv []nvmlGPU, gpus []nvidia.GPU, free []uint64) (int, string) {
	best := -1
	for i := range gpus {
		if nv[i].MIGEnabled {
			continue
		}
		if best < 0 || free[i] > free[best] {
			best = i
		}
	}
	if best < 0 {
		return -1, "every GPU is in MIG mode; gpufrac's fractions and its watchdog's limits are for whole GPUs, and gpucheck changes no MIG setting"
	}
	return best, ""
}

// holdMiB is how much the CUDA process holds on g by default: 3 % of the
// GPU, at least 1 GiB, so that a 1-unit fraction's limit (1 %) is well
// below it.
func holdMiB(g nvidia.GPU) uint64 {
	return max(1024, (g.MemoryMiB()*3+99)/100)
}

// processAndWatchdog runs checks (2) and (3) on g.
func processAndWatchdog(ctx context.Context, c options, r *Report, g nvidia.GPU, freeMiB uint64) {
	skipWatchdog := func(format string, args ...any) {
		for _, name := range []string{"watchdog-under-limit", "watchdog-report", "watchdog-kill"} {
			r.Add(name, Skip, format, args...)
		}
	}
	mib := c.HoldMiB
	if mib == 0 {
		mib = holdMiB(g)
	}
	if freeMiB < mib+1024 {
		r.Add("process-memory", Skip, "%s has %d MiB free, the check holds %d MiB plus a context: the GPU is busy", g.UUID, freeMiB, mib)
		skipWatchdog("no CUDA process to act on")
		return
	}
	before, _ := c.Lib.Memory(g.UUID)
	start := time.Now()
	h, err := startHolder(ctx, c.Holder(mib), c.HolderEnv(g.UUID), c.HolderTimeout)
	if err != nil {
		r.Add("process-memory", Fail, "starting a CUDA process holding %d MiB on %s: %v", mib, g.UUID, err)
		skipWatchdog("no CUDA process to act on")
		return
	}
	defer h.Stop()
	ready := time.Since(start)

	// NVML lists the process once its context exists; wait for the memory.
	var reported uint64
	var found bool
	var seen []nvidia.Process
	var listErr error
	deadline := time.Now().Add(cmp.Or(c.ListTimeout, 30*time.Second))
	for time.Now().Before(deadline) && ctx.Err() == nil {
		seen, listErr = c.Lib.Processes(g.UUID)
		if listErr == nil {
			for _, p := range seen {
				if p.PID == h.PID {
					found, reported = true, p.UsedBytes>>20
				}
			}
		}
		if reported >= mib {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	after, _ := c.Lib.Memory(g.UUID)
	smiText := smiUsage(ctx, c.SMI, h.PID)
	detail := fmt.Sprintf("CUDA process pid %d on %s (%s, ready in %v) allocated %d MiB; NVML through gpufrac's nvidia package reports %d MiB for it (%+d MiB: its context); GPU used %d -> %d MiB; %s",
		h.PID, g.UUID, strings.TrimPrefix(h.Ready, "READY "), ready.Round(time.Millisecond), mib, reported, int64(reported)-int64(mib), before.UsedBytes>>20, after.UsedBytes>>20, smiText)
	switch {
	case listErr != nil:
		r.Add("process-memory", Fail, "%s; listing processes: %v", detail, listErr)
		skipWatchdog("NVML cannot list processes")
		return
	case found && reported == 0:
		r.Add("process-memory", Fail, "%s; NVML lists pid %d with no memory figure (NVML_VALUE_NOT_AVAILABLE: no permission, or a virtualized GPU)", detail, h.PID)
		skipWatchdog("NVML reports no memory for the CUDA process")
		return
	case !found:
		r.Add("process-memory", Fail, "%s; NVML does not list pid %d (it lists: %s). A PID namespace between this process and the driver's view would do this", detail, h.PID, describeProcs(seen))
		skipWatchdog("NVML does not report the CUDA process")
		return
	case reported < mib || reported > mib+c.MaxOverheadMiB:
		r.Add("process-memory", Fail, "%s; want %d..%d MiB", detail, mib, mib+c.MaxOverheadMiB)
	default:
		r.Add("process-memory", Pass, "%s", detail)
	}

	// (3) the watchdog, with the process in a pod container's cgroup.
	uid := types.UID(uuid.NewUUID())
	cid := enforcementtest.ContainerID("gpucheck/" + string(uid))
	pl, err := place(c, h.PID, uid, cid)
	defer func() {
		if pl == nil {
			return
		}
		h.Stop()
		if err := pl.Cleanup(); err != nil {
			fmt.Fprintf(os.Stderr, "gpucheck: cleaning up %s: %v\n", pl.How, err)
		}
	}()
	if err != nil {
		skipWatchdog("could not place the CUDA process in a pod container: %v", err)
		return
	}
	r.Note("the CUDA process ran as a plain process (no container runtime is used by gpucheck), placed in pod %s container %s through a %s", uid, cid, pl.How)
	r.Add("in-container", Skip, "no container runtime: the CUDA process is not in a real container; the watchdog found it through its cgroup path, as it finds a container's processes")

	w := wdRun{GPU: g, Processes: c.Lib, Place: pl, UID: uid, Container: cid, Interval: c.Interval, Samples: c.Samples}
	high := int((reported*100)/g.MemoryMiB()) + 2
	if resource.MemoryLimitMiB(g, 1) >= reported {
		skipWatchdog("the CUDA process holds %d MiB, not more than a 1-unit fraction's limit of %d MiB: raise -hold-mib", reported, resource.MemoryLimitMiB(g, 1))
		return
	}
	if high <= 100 {
		w.Units = high
		r.Checks = append(r.Checks, checkUnderLimit(ctx, w, h))
	} else {
		r.Add("watchdog-under-limit", Skip, "the CUDA process holds nearly the whole GPU")
	}
	w.Units = 1
	r.Checks = append(r.Checks, checkReport(ctx, w, h))
	if !h.Alive() {
		r.Add("watchdog-kill", Skip, "the CUDA process is gone before the kill check")
		return
	}
	r.Checks = append(r.Checks, checkKill(ctx, w, h, c.Lib))
}

// place puts the holder in a pod container as c.Placement says. The
// placement returned, even with an error, is to be cleaned up once the
// holder has exited.
func place(c options, pid uint32, uid types.UID, cid string) (*placement, error) {
	if c.Placement == "fixture" {
		return placeFixture(c.TmpDir, pid, uid, cid)
	}
	failed, err := placeCgroup(c.CgroupRoot, pid, uid, cid)
	if err == nil || c.Placement == "cgroup" {
		return failed, err
	}
	p, ferr := placeFixture(c.TmpDir, pid, uid, cid)
	if ferr != nil {
		return failed, errors.Join(err, ferr)
	}
	p.How += "; a real cgroup could not be used: " + err.Error()
	fixtureCleanup := p.cleanup
	p.cleanup = func() error { return errors.Join(fixtureCleanup(), failed.Cleanup()) }
	return p, nil
}

// smiUsage says what nvidia-smi reports for pid, for the report.
func smiUsage(ctx context.Context, smi string, pid uint32) string {
	if smi == "" {
		return "nvidia-smi not asked"
	}
	out, err := runSMI(ctx, smi, "--query-compute-apps="+smiAppsQuery, "--format=csv,noheader,nounits")
	if err != nil {
		return "nvidia-smi: " + err.Error()
	}
	apps, err := parseSMIApps(out)
	if err != nil {
		return "nvidia-smi: " + err.Error()
	}
	for _, a := range apps {
		if a.PID == pid {
			return fmt.Sprintf("nvidia-smi reports %d MiB", a.UsedMiB)
		}
	}
	return fmt.Sprintf("nvidia-smi does not list pid %d", pid)
}
