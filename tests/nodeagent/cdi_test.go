package nodeagent

import (
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gpufrac/gpufrac/deviceplugin/cdi/cditest"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/mig"
)

// migSeries matches gpufrac_mig_device_memory_total_bytes' labels.
var migSeries = regexp.MustCompile(`gpufrac_mig_device_memory_total_bytes\{gpu_uuid="([^"]+)",mig_uuid="([^"]+)"`)

// writeCDISpec writes into dir the CDI spec nvidia-ctk cdi generate would
// write for this node now: its mock GPUs (the same mock, seeded with the
// node name) and the MIG devices it reports.
func (n *node) writeCDISpec(dir string, model string) {
	n.t.Helper()
	lib, err := nvidia.NewMock(model, nvidia.WithUUIDSeed("node-a"))
	if err != nil {
		n.t.Fatal(err)
	}
	if err := lib.Init(); err != nil {
		n.t.Fatal(err)
	}
	defer lib.Shutdown()
	gpus, err := lib.GPUs()
	if err != nil {
		n.t.Fatal(err)
	}
	_, body := n.get("/metrics")
	var migs []mig.Device
	for _, m := range migSeries.FindAllStringSubmatch(body, -1) {
		migs = append(migs, mig.Device{GPU: m[1], UUID: m[2], GI: len(migs) + 1})
	}
	if _, err := cditest.Write(dir, cditest.Spec(cditest.FromGPUs(gpus, migs))); err != nil {
		n.t.Fatal(err)
	}
}

// waitReadyz polls /readyz until its answer has code and contains want
// (a freshly restarted binary may not be listening yet).
func (n *node) waitReadyz(code int, want string) {
	n.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var c int
	var body string
	var err error
	for time.Now().Before(deadline) {
		var resp *http.Response
		if resp, err = http.Get("http://" + n.metrics + "/readyz"); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if c, body = resp.StatusCode, string(b); c == code && strings.Contains(body, want) {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	n.t.Fatalf("/readyz = %d %q (%v), want %d with %q", c, body, err, code, want)
}

// TestCDIStrategyNeedsTheToolkitSpec runs the real binary with
// --device-list-strategy=cdi: without the NVIDIA toolkit's spec it is not
// ready and says why; with the spec it is.
func TestCDIStrategyNeedsTheToolkitSpec(t *testing.T) {
	specDir := filepath.Join(t.TempDir(), "run-cdi")
	n := startNode(t, nodeOptions{extraArgs: []string{"--device-list-strategy=cdi", "--cdi-spec-dirs=" + filepath.Join(t.TempDir(), "etc-cdi") + "," + specDir}})
	n.waitResource("nvidia.com/gpu", "8 GPUs", registered(8))
	n.waitReadyz(503, "no CDI spec")
	n.waitMetrics("gpufrac_cdi_devices_unresolved 8")
	n.writeCDISpec(specDir, "dgxh100")
	n.waitReadyz(200, "")
	n.waitMetrics("gpufrac_cdi_devices_unresolved 0")
}
