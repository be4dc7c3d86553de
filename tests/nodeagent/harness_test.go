package nodeagent

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpufrac/gpufrac/tests/kubeletsim"
)

// binary is the gpufrac-node built once by TestMain.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "gpufrac-node-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "gpufrac-node")
	build := exec.Command("go", "build", "-o", binary, "github.com/gpufrac/gpufrac/cmd/gpufrac-node")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building gpufrac-node:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// node is one gpufrac-node process on mock GPUs, served by a kubelet simulator.
type node struct {
	t          *testing.T
	dir        string
	kubelet    *kubeletsim.Kubelet
	stateDir   string
	configPath string
	metrics    string // host:port
	cmd        *exec.Cmd
	args       []string
	log        *syncBuffer
	// cdiDir and draStateDir are the DRA driver's CDI specs and
	// prepared-claims record (nodeOptions.claims set).
	cdiDir, draStateDir string
}

type nodeOptions struct {
	model       string // dgxh100 by default
	config      string // config file content; "" runs without --config
	quietPeriod time.Duration
	extraArgs   []string
	// claims, when set, gives the kubelet simulator a plugin registry and
	// reads claims through it: gpufrac-node can then serve mode dra.
	claims kubeletsim.ClaimGetter
}

// startNode starts a kubelet simulator and a real gpufrac-node process.
func startNode(t *testing.T, o nodeOptions) *node {
	t.Helper()
	if o.model == "" {
		o.model = "dgxh100"
	}
	if o.quietPeriod == 0 {
		o.quietPeriod = time.Minute
	}
	dir, err := os.MkdirTemp("", "na") // short: unix socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	n := &node{t: t, dir: dir, stateDir: filepath.Join(dir, "mock"), log: &syncBuffer{}}
	for _, d := range []string{"dp", "mock", "cfg", "reg", "drv", "cdi", "drastate"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	n.kubelet = kubeletsim.New(kubeletsim.Options{
		NodeName:           "node-a",
		Dir:                filepath.Join(dir, "dp"),
		PodResourcesSocket: filepath.Join(dir, "pr.sock"),
		Strict:             true,
		PluginRegistryDir:  filepath.Join(dir, "reg"),
		Claims:             o.claims,
	})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := n.kubelet.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.kubelet.Stop)

	n.metrics = freeAddr(t)
	args := []string{
		"--node-name=node-a", "--nvml=mock:" + o.model, "--mock-state-dir=" + n.stateDir,
		"--kubelet-dir=" + filepath.Join(dir, "dp"), "--pod-resources-socket=" + filepath.Join(dir, "pr.sock"),
		"--metrics-addr=" + n.metrics, "--health-quiet-period=" + o.quietPeriod.String(),
		"--health-probe-interval=200ms", "--allow-standalone", "-v=2",
		"--kubelet-registry-dir=" + filepath.Join(dir, "reg"), "--dra-plugin-dir=" + filepath.Join(dir, "drv"),
		"--cdi-dir=" + filepath.Join(dir, "cdi"), "--dra-state-dir=" + filepath.Join(dir, "drastate"),
	}
	n.cdiDir, n.draStateDir = filepath.Join(dir, "cdi"), filepath.Join(dir, "drastate")
	if o.config != "" {
		n.configPath = filepath.Join(dir, "cfg", "config.yaml")
		n.writeConfig(o.config)
		args = append(args, "--config="+n.configPath)
	}
	n.args = append(args, o.extraArgs...)
	n.start()
	t.Cleanup(n.stop)
	return n
}

// start starts the gpufrac-node process.
func (n *node) start() {
	n.t.Helper()
	n.cmd = exec.Command(binary, n.args...)
	n.cmd.Stdout, n.cmd.Stderr = n.log, n.log
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := n.cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
}

// restart stops gpufrac-node (SIGTERM) and starts it again with the same
// arguments and state directories.
func (n *node) restart() {
	n.t.Helper()
	n.stop()
	n.start()
}

func (n *node) stop() {
	if n.cmd.ProcessState != nil {
		return
	}
	_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = n.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
	if n.t.Failed() {
		n.t.Logf("gpufrac-node log:\n%s", n.log.String())
	}
}

// writeConfig replaces the config file atomically (write + rename).
func (n *node) writeConfig(content string) {
	n.t.Helper()
	tmp := n.configPath + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		n.t.Fatal(err)
	}
	if err := os.Rename(tmp, n.configPath); err != nil {
		n.t.Fatal(err)
	}
}

// waitResource waits (bounded) until the simulator sees the resource meet cond.
func (n *node) waitResource(name string, what string, cond func(kubeletsim.ResourceState) bool) kubeletsim.ResourceState {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(n.t.Context(), 15*time.Second)
	defer cancel()
	if err := n.kubelet.WaitForResource(ctx, name, cond); err != nil {
		n.t.Fatalf("waiting for %s %s: %v\nresources: %+v\ngpufrac-node log:\n%s", name, what, err, n.kubelet.Resources(), n.log.String())
	}
	st, _ := n.kubelet.Resource(name)
	return st
}

// get fetches a path from the metrics server.
func (n *node) get(path string) (int, string) {
	n.t.Helper()
	resp, err := http.Get("http://" + n.metrics + path)
	if err != nil {
		n.t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitMetrics polls /metrics until it contains want.
func (n *node) waitMetrics(want string) string {
	n.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var body string
	for time.Now().Before(deadline) {
		if _, err := net.DialTimeout("tcp", n.metrics, time.Second); err == nil {
			_, body = n.get("/metrics")
			if strings.Contains(body, want) {
				return body
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	n.t.Fatalf("metrics never contained %q; last:\n%s", want, grepLines(body, "gpufrac_"))
	return ""
}

// metricValue returns the value of one sample line of /metrics ("name{labels}"), 0 if absent.
func (n *node) metricValue(series string) float64 {
	n.t.Helper()
	_, body := n.get("/metrics")
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				n.t.Fatalf("metric %s: %v", series, err)
			}
			return f
		}
	}
	return 0
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func healthyCount(st kubeletsim.ResourceState) int {
	n := 0
	for _, d := range st.Devices {
		if d.Health == "Healthy" {
			n++
		}
	}
	return n
}

// syncBuffer is the gpufrac-node process's log: exec copies the process's
// output into it from its own goroutine while tests read it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
