package agent

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpufrac/gpufrac/deviceplugin/cdi"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
)

// fakeCTK is the first argument that makes the test binary the fake
// nvidia-ctk (TestMain).
const fakeCTK = "fake-nvidia-ctk"

// TestMain runs the tests, or, started as `<test binary> fake-nvidia-ctk`,
// stands in for nvidia-ctk cdi generate (fakeNvidiaCTK).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == fakeCTK {
		if err := fakeNvidiaCTK(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "nvidia-ctk:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// fakeNvidiaCTK writes, as nvidia-ctk cdi generate --output does (a new
// file renamed over the old one), the CDI spec of the devices the mock
// NVML has now: the test serves it on --socket, from the agent's own mock.
// While --fail-if exists it fails as nvidia-ctk does when NVML cannot be
// read.
func fakeNvidiaCTK(args []string) error {
	fs := flag.NewFlagSet(fakeCTK, flag.ContinueOnError)
	socket := fs.String("socket", "", "where the test serves the spec")
	output := fs.String("output", "", "the spec file to write")
	failIf := fs.String("fail-if", "", "fail while this file exists")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if _, err := os.Stat(*failIf); *failIf != "" && err == nil {
		return errors.New("failed to generate CDI spec: failed to initialize NVML: simulated failure")
	}
	c := http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", *socket)
		}}}
	resp, err := c.Get("http://fake-nvml/spec")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return fmt.Errorf("reading the mock's devices: %v %s", err, resp.Status)
	}
	if err := os.MkdirAll(filepath.Dir(*output), 0o755); err != nil {
		return err
	}
	tmp := filepath.Join(filepath.Dir(*output), ".nvidia-ctk.tmp")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, *output)
}

// regenEnv is an agent whose CDI spec regeneration command is the fake
// nvidia-ctk, writing into specDir; it fails while failFile exists.
type regenEnv struct {
	*env
	specDir, failFile string
}

// startRegenAgent starts an agent with --device-list-strategy=cdi on
// config whose regeneration command is the fake nvidia-ctk, retried every
// 50-200 ms.
func startRegenAgent(t *testing.T, config string, failing bool) *regenEnv {
	t.Helper()
	base, err := os.MkdirTemp("", "regen") // short: the socket path
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	r := &regenEnv{specDir: filepath.Join(base, "cdi"), failFile: filepath.Join(base, "fail")}
	if failing {
		if err := os.WriteFile(r.failFile, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The fake reads the agent's mock, once the agent has started.
	started := make(chan *env)
	var e *env
	l, err := net.Listen("unix", filepath.Join(base, "nvml.sock"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		select {
		case got, ok := <-started:
			if ok {
				e = got
			}
		case <-req.Context().Done():
			return
		}
		_, _ = w.Write(e.specData())
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	step := []string{os.Args[0], fakeCTK, "--socket=" + filepath.Join(base, "nvml.sock"),
		"--output=" + filepath.Join(r.specDir, "nvidia.yaml"), "--fail-if=" + r.failFile}
	e = startAgentFull(t, config, nil, func(c *Config) {
		c.DeviceListStrategy = resource.StrategyCDI
		c.CDISpecDirs = []string{r.specDir}
		c.CDICheckInterval = time.Hour // changes are seen through the watch
		c.CDIRegenerate = &CDIRegenerateConfig{Steps: [][]string{step}, Timeout: 20 * time.Second,
			Backoff: wait.Backoff{Duration: 50 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 1 << 30, Cap: 200 * time.Millisecond}}
	})
	close(started) // every request from now on reads e
	r.env = e
	return r
}

// regenerations is gpufrac_cdi_regenerations_total{result}.
func regenerations(t *testing.T, e *env, result string) float64 {
	t.Helper()
	mfs, err := e.agent.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "gpufrac_cdi_regenerations_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return -1 // not exported
}

// resolved tells whether every device served resolves (Ready, the gauge).
func (e *env) resolved(t *testing.T) bool {
	return e.agent.Ready() == nil && metricValue(t, e, "gpufrac_cdi_devices_unresolved") == 0
}

// TestCDISpecRegeneratedAfterMIGLayoutChange (issue 29): with a
// regeneration command, the MIG layout gpufrac-node makes at start and the
// one it makes after the admin's change are each followed by the command,
// which writes the spec of the new MIG devices: they resolve without anyone
// running nvidia-ctk by hand (TestCDISpecsAreChecked: they stay unresolved
// without it).
func TestCDISpecRegeneratedAfterMIGLayoutChange(t *testing.T) {
	e := startRegenAgent(t, strings.Replace(migConfig, "%s", "all-1g.10gb", 1), false)
	e.waitServed("MIG devices on GPUs 0-1, fractions on the rest", map[string]served{
		"nvidia.com/gpu":          {Healthy: 6, Connected: true, Registrations: 1},
		"gpufrac.io/gpu-fraction": {Healthy: 600, Connected: true, Registrations: 1},
		"nvidia.com/mig-1g.10gb":  {Healthy: 14, Connected: true, Registrations: 1},
	})
	const afterMIG = "Normal CDISpecRegenerated: the CDI spec regeneration command succeeded (run because gpufrac-node changed the MIG layout of GPU 0, 1)"
	// 1. gpufrac-node enables MIG on GPUs 0-1 at start: the command runs
	// once (not again for the devices then missing) and writes the spec.
	e.poll("the spec written after the MIG layout at start, every device resolved", func() bool {
		return e.resolved(t) && metricValue(t, e.env, "gpufrac_cdi_devices_served") == 20 && e.countEvents(afterMIG) == 1
	})
	if got := regenerations(t, e.env, "success"); got != 1 {
		t.Errorf("regenerations{success} = %v, want 1", got)
	}

	// 2. The admin changes the layout; gpufrac-node reshapes the GPUs and
	// runs the command again: the new MIG devices resolve.
	e.writeConfig(strings.Replace(migConfig, "%s", "all-3g.40gb", 1))
	e.poll("3g.40gb devices served and resolved after the regeneration", func() bool {
		return metricValue(t, e.env, "gpufrac_cdi_devices_served") == 6+4 && e.resolved(t) && regenerations(t, e.env, "success") == 2
	})
	e.waitServed("3g.40gb devices", map[string]served{
		"nvidia.com/gpu":          {Healthy: 6, Connected: true, Registrations: 1},
		"gpufrac.io/gpu-fraction": {Healthy: 600, Connected: true, Registrations: 1},
		"nvidia.com/mig-1g.10gb":  {Registrations: 1}, // gone
		"nvidia.com/mig-3g.40gb":  {Healthy: 4, Connected: true, Registrations: 1},
	})
	// The same note: counted on the first event's series.
	e.poll("a second CDISpecRegenerated occurrence", func() bool { return e.occurrences(afterMIG) == 2 })
	if got := regenerations(t, e.env, "failure"); got != 0 {
		t.Errorf("regenerations{failure} = %v, want 0", got)
	}
}

// TestCDISpecRegenerationFailureIsRetried (issue 29): on a node with no MIG
// change to make and no spec, the command runs once at start; failing, it
// is a Warning event and counted, retried with backoff while the node
// keeps serving (not Ready: the devices stay unresolved), and once it
// succeeds the devices resolve with no new trigger.
func TestCDISpecRegenerationFailureIsRetried(t *testing.T) {
	e := startRegenAgent(t, "version: v1\ndefault: {mode: fraction}\n", true)
	e.poll("failed runs retried", func() bool { return regenerations(t, e.env, "failure") >= 3 })
	const failed = "Warning CDISpecRegenerationFailed: the CDI spec regeneration command failed (run because devices served were missing from the CDI specs at start): step 1 (agent.test): exit status 1; retried with backoff"
	if n := e.countEvents(failed); n != 1 {
		t.Errorf("%d CDISpecRegenerationFailed events, want 1 (repeats on its series): %q", n, e.nodeEvents())
	}
	if err := e.agent.Ready(); !errors.Is(err, cdi.ErrUnresolved) {
		t.Errorf("Ready() = %v while the command fails, want ErrUnresolved", err)
	}
	if got := regenerations(t, e.env, "success"); got != 0 {
		t.Errorf("regenerations{success} = %v, want 0", got)
	}
	// The daemon keeps serving meanwhile.
	e.waitServed("the resources still served", map[string]served{
		"nvidia.com/gpu":          {Healthy: 8, Connected: true, Registrations: 1},
		"gpufrac.io/gpu-fraction": {Healthy: 800, Connected: true, Registrations: 1},
	})

	// NVML recovers: the next retry writes the spec.
	if err := os.Remove(e.failFile); err != nil {
		t.Fatal(err)
	}
	e.poll("the spec written by a retry", func() bool { return e.resolved(t) && regenerations(t, e.env, "success") == 1 })
	e.poll("CDISpecRegenerated and CDISpecResolved events", func() bool {
		return e.countEvents("Normal CDISpecRegenerated: the CDI spec regeneration command succeeded (run because devices served were missing from the CDI specs at start)") == 1 &&
			e.countEvents("Normal CDISpecResolved: ") >= 1
	})
}
