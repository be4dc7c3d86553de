// Command idle-measure starts the real gpufrac-node on mock GPUs against a
// kubelet simulator, waits until its resources are registered, leaves it
// idle with a Prometheus scrape at a fixed period, and reports the
// process's memory (/proc/<pid>/status) and CPU time (/proc/<pid>/stat)
// over the idle window.
//
//	go build -o bin/ ./cmd/gpufrac-node
//	go run ./tests/nodeagent/cmd/idle-measure -binary bin/gpufrac-node -idle 60s -scrape 15s
//
// -env passes extra environment (GODEBUG, GOGC, GOMEMLIMIT) to the agent.
// -cluster starts a local control plane (tests/cluster: etcd, kube-apiserver,
// kwok, ...) with the node and gives the agent API access, so its pod
// informers, event recorder and node annotations run as in a cluster;
// -kubeconfig points it at an existing cluster instead (the node must exist).
// -tmpfs runs a copy of the binary from /dev/shm: the page cache of a file on
// disk may be kept in large folios that are mapped whole, which makes the
// executable's share of VmRSS depend on the kernel and the filesystem;
// tmpfs (without huge pages) maps 4 KiB pages.
// -dra (with -cluster or -kubeconfig) serves the node in mode dra instead
// (config "mode: dra", every GPU in the fraction views): the simulator's
// plugin registry takes the DRA driver gpu.gpufrac.io, and the idle window
// starts once the kubelet accepted it and its ResourceSlices are published.
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/tests/cluster"
	"github.com/gpufrac/gpufrac/tests/kubeletsim"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat;
// 100 on every Linux architecture Go supports.
const clockTicks = 100

type options struct {
	binary     string
	model      string
	node       string
	idle       time.Duration
	scrape     time.Duration
	kubeconfig string
	cluster    bool
	tmpfs      bool
	env        []string
	keepLog    bool
	dra        bool
}

func main() {
	var o options
	var env string
	flag.StringVar(&o.binary, "binary", "bin/gpufrac-node", "the gpufrac-node binary to measure")
	flag.StringVar(&o.model, "model", "dgxh100", "mock GPU model (--nvml=mock:<model>)")
	flag.StringVar(&o.node, "node", "node-a", "node name")
	flag.DurationVar(&o.idle, "idle", 60*time.Second, "idle window measured after registration")
	flag.DurationVar(&o.scrape, "scrape", 15*time.Second, "Prometheus scrape period during the idle window")
	flag.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig giving the agent API access (default: standalone)")
	flag.BoolVar(&o.cluster, "cluster", false, "start a local control plane (tests/cluster) and give the agent API access")
	flag.BoolVar(&o.tmpfs, "tmpfs", false, "run a copy of the binary from /dev/shm (4 KiB page-cache pages)")
	flag.StringVar(&env, "env", "", "comma-separated KEY=VALUE pairs added to the agent's environment (GODEBUG values use ';' for ',')")
	flag.BoolVar(&o.keepLog, "print-log", false, "print the agent's log at the end")
	flag.BoolVar(&o.dra, "dra", false, "serve the node in mode dra (needs -cluster or -kubeconfig)")
	flag.Parse()
	for _, kv := range strings.Split(env, ",") {
		if kv != "" {
			o.env = append(o.env, strings.ReplaceAll(kv, ";", ","))
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "idle-measure:", err)
		os.Exit(1)
	}
}

// procSample is one reading of the agent's /proc files.
type procSample struct {
	at                       time.Time
	rssKiB, hwmKiB           int64
	anonKiB, fileKiB, shmKiB int64
	filePmdKiB               int64 // file pages mapped with 2 MiB entries
	cpuTicks                 int64 // utime + stime
	threads                  int64
	voluntary, nonvoluntary  int64 // summed over threads
}

func run(ctx context.Context, o options, out io.Writer) error {
	bin, err := filepath.Abs(o.binary)
	if err != nil {
		return fmt.Errorf("resolving %s: %w", o.binary, err)
	}
	dir, err := os.MkdirTemp("", "idle") // short: unix socket paths are limited to 108 bytes
	if err != nil {
		return fmt.Errorf("creating work dir: %w", err)
	}
	defer os.RemoveAll(dir)
	if o.tmpfs {
		if bin, err = copyToShm(bin); err != nil {
			return err
		}
		defer os.Remove(bin)
	}
	// The helpers' own logs would drown the report.
	ctx = klog.NewContext(ctx, logr.Discard())
	if o.cluster {
		began := time.Now()
		c, err := cluster.Start(ctx, cluster.Options{})
		if err != nil {
			return fmt.Errorf("starting the local control plane: %w", err)
		}
		defer func() {
			_ = c.Stop()
			_ = os.RemoveAll(c.Dir)
		}()
		if _, err := c.AddNode(ctx, cluster.NodeSpec{Name: o.node}); err != nil {
			return fmt.Errorf("adding node %s: %w", o.node, err)
		}
		o.kubeconfig = c.KubeconfigPath
		fmt.Fprintf(out, "local control plane up in %s\n", time.Since(began).Round(time.Millisecond))
	}
	if o.dra && o.kubeconfig == "" {
		return errors.New("-dra needs API access: -cluster or -kubeconfig")
	}
	dpDir := filepath.Join(dir, "dp")
	ko := kubeletsim.Options{NodeName: o.node, Dir: dpDir, PodResourcesSocket: filepath.Join(dir, "pr.sock")}
	if o.dra {
		ko.PluginRegistryDir = filepath.Join(dir, "reg")
	}
	k := kubeletsim.New(ko)
	if err := k.Start(ctx); err != nil {
		return fmt.Errorf("starting kubelet simulator: %w", err)
	}
	defer k.Stop()

	addr, err := freeAddr()
	if err != nil {
		return err
	}
	args := []string{
		"--node-name=" + o.node, "--nvml=mock:" + o.model, "--mock-state-dir=" + filepath.Join(dir, "mock"),
		"--kubelet-dir=" + dpDir, "--pod-resources-socket=" + filepath.Join(dir, "pr.sock"),
		"--metrics-addr=" + addr,
	}
	if o.kubeconfig != "" {
		args = append(args, "--kubeconfig="+o.kubeconfig)
	} else {
		args = append(args, "--allow-standalone")
	}
	if err := os.MkdirAll(filepath.Join(dir, "mock"), 0o755); err != nil {
		return fmt.Errorf("creating mock state dir: %w", err)
	}
	if o.dra {
		cfg := filepath.Join(dir, "config.yaml")
		if err := os.WriteFile(cfg, []byte("version: v1\ndefault:\n  mode: dra\n"), 0o644); err != nil {
			return err
		}
		args = append(args, "--config="+cfg, "--kubelet-registry-dir="+ko.PluginRegistryDir,
			"--dra-plugin-dir="+filepath.Join(dir, "dra"), "--cdi-dir="+filepath.Join(dir, "cdi"))
	}
	var log bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &log, &log
	cmd.Env = append(os.Environ(), o.env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	started := time.Now()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		if o.keepLog {
			fmt.Fprintf(out, "\n--- gpufrac-node log ---\n%s", log.String())
		}
	}()
	pid := cmd.Process.Pid

	// 1. Wait until both resources are registered with all devices healthy
	// (in mode dra: the driver registered and its slices published).
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	if o.dra {
		err = waitDRA(wctx, k, o)
	} else {
		err = k.Wait(wctx, func(res map[string]kubeletsim.ResourceState) bool {
			g, f := res[api.ResourceGPU], res[api.ResourceFraction]
			return g.Connected && f.Connected && g.Allocatable > 0 && f.Allocatable == g.Allocatable*api.UnitsPerGPU
		})
	}
	cancel()
	if err != nil {
		return fmt.Errorf("waiting for registration: %w\nlog:\n%s", err, log.String())
	}
	registered := time.Since(started)
	client := &http.Client{Timeout: 5 * time.Second}
	if _, _, err := scrape(ctx, client, addr); err != nil {
		return fmt.Errorf("first scrape: %w", err)
	}

	// 2. The idle window: a scrape every period, /proc read around each.
	first, err := readProc(pid)
	if err != nil {
		return err
	}
	load0, _ := os.ReadFile("/proc/loadavg")
	var samples []procSample
	var lastBody string
	var scrapeDur []time.Duration
	tick := time.NewTicker(o.scrape)
	defer tick.Stop()
	end := time.NewTimer(o.idle)
	defer end.Stop()
loop:
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-exited:
			return fmt.Errorf("gpufrac-node exited during the idle window: %v\nlog:\n%s", err, log.String())
		case <-end.C:
			break loop
		case <-tick.C:
			body, d, err := scrape(ctx, client, addr)
			if err != nil {
				return fmt.Errorf("scrape: %w", err)
			}
			lastBody, scrapeDur = body, append(scrapeDur, d)
			s, err := readProc(pid)
			if err != nil {
				return err
			}
			samples = append(samples, s)
		}
	}
	last, err := readProc(pid)
	if err != nil {
		return err
	}
	load1, _ := os.ReadFile("/proc/loadavg")

	// 3. Report.
	window := last.at.Sub(first.at).Seconds()
	cpu := float64(last.cpuTicks-first.cpuTicks) / clockTicks
	minRSS, maxRSS := first.rssKiB, first.rssKiB
	for _, s := range append(samples, last) {
		minRSS, maxRSS = min(minRSS, s.rssKiB), max(maxRSS, s.rssKiB)
	}
	mode := "standalone"
	if o.kubeconfig != "" {
		mode = "API access"
	}
	if o.tmpfs {
		mode += ", binary on tmpfs"
	}
	if o.dra {
		mode += ", mode dra"
	}
	fmt.Fprintf(out, "gpufrac-node idle measurement (%s, mock:%s, %s idle, scrape every %s)\n", mode, o.model, o.idle, o.scrape)
	fmt.Fprintf(out, "env                    %s\n", strings.Join(o.env, " "))
	fmt.Fprintf(out, "registered after       %s\n", registered.Round(time.Millisecond))
	fmt.Fprintf(out, "load average           start %s  end %s\n", strings.TrimSpace(string(load0)), strings.TrimSpace(string(load1)))
	fmt.Fprintf(out, "VmRSS                  start %.1f MiB, end %.1f MiB (min %.1f, max %.1f)\n", mib(first.rssKiB), mib(last.rssKiB), mib(minRSS), mib(maxRSS))
	fmt.Fprintf(out, "  RssAnon              start %.1f MiB, end %.1f MiB (heap, stacks: the process's own memory)\n", mib(first.anonKiB), mib(last.anonKiB))
	fmt.Fprintf(out, "  RssFile + RssShmem   %.1f MiB (mapped executable and libraries), %.1f MiB of it in 2 MiB mappings\n", mib(last.fileKiB+last.shmKiB), mib(last.filePmdKiB))
	fmt.Fprintf(out, "VmHWM (peak RSS)       %.1f MiB\n", mib(last.hwmKiB))
	fmt.Fprintf(out, "CPU (utime+stime)      %.2f s over %.1f s = %.3f%% of one core\n", cpu, window, 100*cpu/window)
	fmt.Fprintf(out, "CPU since start        %.2f s\n", float64(last.cpuTicks)/clockTicks)
	fmt.Fprintf(out, "threads                %d\n", last.threads)
	fmt.Fprintf(out, "context switches       %d voluntary, %d involuntary over the window (all threads)\n", last.voluntary-first.voluntary, last.nonvoluntary-first.nonvoluntary)
	if len(scrapeDur) > 0 {
		sort.Slice(scrapeDur, func(i, j int) bool { return scrapeDur[i] < scrapeDur[j] })
		fmt.Fprintf(out, "scrapes                %d, slowest %s, %d bytes\n", len(scrapeDur), scrapeDur[len(scrapeDur)-1].Round(time.Microsecond), len(lastBody))
	}
	for _, m := range []string{
		"go_memstats_heap_inuse_bytes", "go_memstats_heap_sys_bytes", "go_memstats_stack_inuse_bytes",
		"go_memstats_sys_bytes", "go_memstats_next_gc_bytes", "go_goroutines", "go_gc_gogc_percent",
	} {
		if v, ok := sample(lastBody, m); ok {
			if strings.HasSuffix(m, "_bytes") {
				fmt.Fprintf(out, "%-22s %.1f MiB\n", strings.TrimPrefix(m, "go_memstats_"), v/(1<<20))
			} else {
				fmt.Fprintf(out, "%-22s %g\n", strings.TrimPrefix(m, "go_"), v)
			}
		}
	}
	return nil
}

func mib(kib int64) float64 { return float64(kib) / 1024 }

// waitDRA waits until the kubelet simulator registered the DRA driver and
// the node's ResourceSlices of it carry devices.
func waitDRA(ctx context.Context, k *kubeletsim.Kubelet, o options) error {
	if err := k.WaitForDRADriver(ctx, api.DRADriver); err != nil {
		return err
	}
	rc, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	sel := metav1.ListOptions{FieldSelector: "spec.nodeName=" + o.node + ",spec.driver=" + api.DRADriver}
	for {
		list, err := cs.ResourceV1().ResourceSlices().List(ctx, sel)
		if err == nil {
			devices := 0
			for _, s := range list.Items {
				devices += len(s.Spec.Devices)
			}
			if devices > 0 {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the node's ResourceSlices: %w (last error: %v)", ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// scrape GETs /metrics once.
func scrape(ctx context.Context, c *http.Client, addr string) (string, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return "", 0, err
	}
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	d := time.Since(start)
	if err != nil {
		return "", 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return "", 0, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	return string(b), d, nil
}

// sample returns the value of an unlabelled series in exposition text.
func sample(body, name string) (float64, bool) {
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return f, err == nil
		}
	}
	return 0, false
}

// readProc reads memory from /proc/<pid>/status and smaps_rollup, context
// switches from every thread's status and CPU ticks from /proc/<pid>/stat.
func readProc(pid int) (procSample, error) {
	s := procSample{at: time.Now()}
	status := map[string]*int64{
		"VmRSS": &s.rssKiB, "VmHWM": &s.hwmKiB, "RssAnon": &s.anonKiB, "RssFile": &s.fileKiB,
		"RssShmem": &s.shmKiB, "Threads": &s.threads,
	}
	if err := readKV(fmt.Sprintf("/proc/%d/status", pid), status, false); err != nil {
		return s, err
	}
	if err := readKV(fmt.Sprintf("/proc/%d/smaps_rollup", pid), map[string]*int64{"FilePmdMapped": &s.filePmdKiB}, false); err != nil {
		return s, err
	}
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil {
		return s, fmt.Errorf("listing threads: %w", err)
	}
	for _, t := range tasks {
		// A thread may end between the listing and the read.
		_ = readKV(t, map[string]*int64{"voluntary_ctxt_switches": &s.voluntary, "nonvoluntary_ctxt_switches": &s.nonvoluntary}, true)
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, fmt.Errorf("reading process stat: %w", err)
	}
	// The command name (field 2) may hold spaces; fields after ")" are fixed.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return s, errors.New("malformed /proc/<pid>/stat")
	}
	rest := strings.Fields(string(stat[i+1:]))
	// rest[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(rest) < 13 {
		return s, errors.New("short /proc/<pid>/stat")
	}
	utime, err1 := strconv.ParseInt(rest[11], 10, 64)
	stime, err2 := strconv.ParseInt(rest[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return s, fmt.Errorf("parsing CPU times: %w", err)
	}
	s.cpuTicks = utime + stime
	return s, nil
}

// readKV reads "Key: value [kB]" lines of a /proc file into fields, adding
// to them when add is set.
func readKV(path string, fields map[string]*int64, add bool) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		dst, want := fields[key]
		if !ok || !want {
			continue
		}
		n, err := strconv.ParseInt(strings.Fields(val)[0], 10, 64)
		if err != nil {
			return fmt.Errorf("parsing %s in %s: %w", key, path, err)
		}
		if add {
			*dst += n
		} else {
			*dst = n
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	return nil
}

// copyToShm copies the binary to /dev/shm and returns the copy's path.
func copyToShm(bin string) (string, error) {
	src, err := os.Open(bin)
	if err != nil {
		return "", fmt.Errorf("opening %s: %w", bin, err)
	}
	defer src.Close()
	dst, err := os.CreateTemp("/dev/shm", "gpufrac-node-")
	if err != nil {
		return "", fmt.Errorf("copying the binary to tmpfs: %w", err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		os.Remove(dst.Name())
		return "", fmt.Errorf("copying the binary to tmpfs: %w", err)
	}
	if err := dst.Chmod(0o755); err != nil {
		dst.Close()
		os.Remove(dst.Name())
		return "", fmt.Errorf("copying the binary to tmpfs: %w", err)
	}
	if err := dst.Close(); err != nil {
		os.Remove(dst.Name())
		return "", fmt.Errorf("copying the binary to tmpfs: %w", err)
	}
	return dst.Name(), nil
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}
