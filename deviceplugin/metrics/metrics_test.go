package metrics

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
)

// usageFunc adapts a function to resource.UsageSource.
type usageFunc func(context.Context) (map[string]resource.GPUUsage, error)

func (f usageFunc) Usage(ctx context.Context) (map[string]resource.GPUUsage, error) { return f(ctx) }

// mockGPUs returns a started dgxh100 mock and its first n GPUs.
func mockGPUs(t *testing.T, n int) (*nvidia.Mock, []nvidia.GPU) {
	t.Helper()
	m, err := nvidia.NewMock("dgxh100", nvidia.WithUUIDSeed("node-a"))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Init(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Shutdown() })
	gs, err := m.GPUs()
	if err != nil {
		t.Fatal(err)
	}
	return m, gs[:n]
}

// series renders one GPU's expected samples; "" values are left out.
type series struct {
	memUsed, util, units, healthy string
}

// expectedGPU is the exposition text the collector should give for gs.
func expectedGPU(gs []nvidia.GPU, s []series) string {
	var b strings.Builder
	section := func(name, help string, value func(i int, g nvidia.GPU) (string, string)) {
		var lines []string
		for i, g := range gs {
			if labels, v := value(i, g); v != "" {
				lines = append(lines, fmt.Sprintf("%s{%s} %s\n", name, labels, v))
			}
		}
		if len(lines) == 0 {
			return
		}
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name)
		for _, l := range lines {
			b.WriteString(l)
		}
	}
	uuid := func(g nvidia.GPU) string { return fmt.Sprintf("gpu_uuid=%q", g.UUID) }
	section("gpufrac_gpu_memory_total_bytes", "Total framebuffer memory of the GPU.", func(_ int, g nvidia.GPU) (string, string) {
		return fmt.Sprintf("gpu_index=\"%d\",gpu_uuid=%q,model=%q", g.Index, g.UUID, g.Name), fmt.Sprintf("%g", float64(g.MemoryBytes))
	})
	section("gpufrac_gpu_memory_used_bytes", "Framebuffer memory in use on the GPU, all processes.", func(i int, g nvidia.GPU) (string, string) {
		return uuid(g), s[i].memUsed
	})
	section("gpufrac_gpu_utilization_ratio", "GPU compute utilization over NVML's last sample period, 0-1.", func(i int, g nvidia.GPU) (string, string) {
		return uuid(g), s[i].util
	})
	section("gpufrac_gpu_fraction_units_allocated", "Fraction units (percent of the GPU) the kubelet has allocated on the GPU.", func(i int, g nvidia.GPU) (string, string) {
		return uuid(g), s[i].units
	})
	section("gpufrac_gpu_healthy", "1 when the GPU is advertised healthy, 0 when unhealthy (recent critical Xid or failing NVML queries).", func(i int, g nvidia.GPU) (string, string) {
		return uuid(g), s[i].healthy
	})
	return b.String()
}

var gpuMetricNames = []string{
	"gpufrac_gpu_memory_total_bytes", "gpufrac_gpu_memory_used_bytes", "gpufrac_gpu_utilization_ratio",
	"gpufrac_gpu_fraction_units_allocated", "gpufrac_gpu_healthy",
}

func TestGPUCollector(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(t *testing.T, m *nvidia.Mock, gs []nvidia.GPU)
		usage   func(gs []nvidia.GPU) resource.UsageSource
		healthy func(gs []nvidia.GPU) resource.HealthFunc
		want    []series
		// wantErrors are gpufrac_nvml_errors_total by query after each scrape.
		wantErrors map[string]float64
	}{
		{
			name: "memory, utilization, units and health per GPU",
			setup: func(t *testing.T, m *nvidia.Mock, gs []nvidia.GPU) {
				must(t, m.SetMemoryUsed(gs[0].UUID, 10<<30))
				must(t, m.SetUtilization(gs[0].UUID, 40))
				must(t, m.SetProcesses(gs[1].UUID, []nvidia.Process{{PID: 7, UsedBytes: 1 << 30}, {PID: 9, UsedBytes: 2 << 30}}))
			},
			usage: func(gs []nvidia.GPU) resource.UsageSource {
				return usageFunc(func(context.Context) (map[string]resource.GPUUsage, error) {
					return map[string]resource.GPUUsage{gs[0].UUID: {Units: 30, WholeHolder: "gpufrac-system/r"}}, nil
				})
			},
			want: []series{
				{memUsed: "1.073741824e+10", util: "0.4", units: "30", healthy: "1"},
				{memUsed: "3.221225472e+09", util: "0", units: "0", healthy: "1"},
			},
			wantErrors: map[string]float64{"memory": 0, "utilization": 0},
		},
		{
			name: "an NVML failure on one GPU skips its series and counts the errors",
			setup: func(t *testing.T, m *nvidia.Mock, gs []nvidia.GPU) {
				must(t, m.SetUtilization(gs[0].UUID, 5))
				must(t, m.FailGPU(gs[1].UUID, nvidia.ErrGPULost))
			},
			healthy: func(gs []nvidia.GPU) resource.HealthFunc {
				return func(uuid string) bool { return uuid != gs[1].UUID }
			},
			want: []series{
				{memUsed: "0", util: "0.05", healthy: "1"},
				{healthy: "0"},
			},
			wantErrors: map[string]float64{"memory": 1, "utilization": 1},
		},
		{
			name: "PodResources unavailable: no units series",
			usage: func([]nvidia.GPU) resource.UsageSource {
				return usageFunc(func(context.Context) (map[string]resource.GPUUsage, error) {
					return nil, errors.New("kubelet away")
				})
			},
			want: []series{
				{memUsed: "0", util: "0", healthy: "1"},
				{memUsed: "0", util: "0", healthy: "1"},
			},
			wantErrors: map[string]float64{"memory": 0, "utilization": 0},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lib, gs := mockGPUs(t, 2)
			if tt.setup != nil {
				tt.setup(t, lib, gs)
			}
			src := Sources{Lib: lib, GPUs: func() []nvidia.GPU { return gs }}
			if tt.usage != nil {
				src.Usage = tt.usage(gs)
			}
			if tt.healthy != nil {
				src.Healthy = tt.healthy(gs)
			}
			reg := prometheus.NewRegistry()
			m := New(reg, src, "test")
			for scrape := 1; scrape <= 2; scrape++ {
				// Collect only the GPU collector: a registry scrape reads the
				// error counter concurrently with the collector raising it.
				if err := testutil.CollectAndCompare(m.collector, strings.NewReader(expectedGPU(gs, tt.want)), gpuMetricNames...); err != nil {
					t.Errorf("scrape %d: %v", scrape, err)
				}
				for query, per := range tt.wantErrors {
					if got := testutil.ToFloat64(m.nvmlErrors.WithLabelValues(query)); got != per*float64(scrape) {
						t.Errorf("after scrape %d gpufrac_nvml_errors_total{query=%q} = %g, want %g", scrape, query, got, per*float64(scrape))
					}
				}
			}
			// The registry exports the same series, and lints clean.
			if err := testutil.GatherAndCompare(reg, strings.NewReader(expectedGPU(gs, tt.want)), gpuMetricNames...); err != nil {
				t.Errorf("registry: %v", err)
			}
			problems, err := testutil.GatherAndLint(reg)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range problems {
				t.Errorf("lint: %s: %s", p.Metric, p.Text)
			}
		})
	}
}

func TestCollectorWithoutInventory(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg, Sources{}, "test")
	if n := testutil.CollectAndCount(m.collector); n != 0 {
		t.Errorf("collector without NVML gave %d series", n)
	}
}

func TestCounters(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg, Sources{}, "v1.2.3")
	m.Allocated("gpufrac.io/gpu-fraction", make([]string, 30), 200*time.Microsecond, nil)
	m.Allocated("gpufrac.io/gpu-fraction", make([]string, 120), 20*time.Microsecond, errors.New("too many units"))
	m.Allocated("nvidia.com/gpu", make([]string, 2), 3*time.Millisecond, nil)
	m.Xid(nvidia.XidEvent{UUID: "GPU-1", Xid: 79}, true)
	m.Xid(nvidia.XidEvent{UUID: "GPU-1", Xid: 79}, true)
	m.Xid(nvidia.XidEvent{UUID: "GPU-2", Xid: 13}, false)
	want := fmt.Sprintf(`
# HELP gpufrac_allocations_total Container allocations answered by the device plugin, by resource and result ("success" or "error").
# TYPE gpufrac_allocations_total counter
gpufrac_allocations_total{resource="gpufrac.io/gpu-fraction",result="error"} 1
gpufrac_allocations_total{resource="gpufrac.io/gpu-fraction",result="success"} 1
gpufrac_allocations_total{resource="nvidia.com/gpu",result="success"} 1
# HELP gpufrac_allocate_duration_seconds Time the device plugin spent answering one container's Allocate, by resource.
# TYPE gpufrac_allocate_duration_seconds histogram
gpufrac_allocate_duration_seconds_bucket{resource="gpufrac.io/gpu-fraction",le="1e-05"} 0
gpufrac_allocate_duration_seconds_bucket{resource="gpufrac.io/gpu-fraction",le="5e-05"} 1
gpufrac_allocate_duration_seconds_bucket{resource="gpufrac.io/gpu-fraction",le="0.0001"} 1
gpufrac_allocate_duration_seconds_bucket{resource="gpufrac.io/gpu-fraction",le="0.0005"} 2
gpufrac_allocate_duration_seconds_bucket{resource="gpufrac.io/gpu-fraction",le="0.001"} 2
gpufrac_allocate_duration_seconds_bucket{resource="gpufrac.io/gpu-fraction",le="0.005"} 2
gpufrac_allocate_duration_seconds_bucket{resource="gpufrac.io/gpu-fraction",le="0.01"} 2
gpufrac_allocate_duration_seconds_bucket{resource="gpufrac.io/gpu-fraction",le="0.1"} 2
gpufrac_allocate_duration_seconds_bucket{resource="gpufrac.io/gpu-fraction",le="+Inf"} 2
gpufrac_allocate_duration_seconds_sum{resource="gpufrac.io/gpu-fraction"} 0.00022
gpufrac_allocate_duration_seconds_count{resource="gpufrac.io/gpu-fraction"} 2
gpufrac_allocate_duration_seconds_bucket{resource="nvidia.com/gpu",le="1e-05"} 0
gpufrac_allocate_duration_seconds_bucket{resource="nvidia.com/gpu",le="5e-05"} 0
gpufrac_allocate_duration_seconds_bucket{resource="nvidia.com/gpu",le="0.0001"} 0
gpufrac_allocate_duration_seconds_bucket{resource="nvidia.com/gpu",le="0.0005"} 0
gpufrac_allocate_duration_seconds_bucket{resource="nvidia.com/gpu",le="0.001"} 0
gpufrac_allocate_duration_seconds_bucket{resource="nvidia.com/gpu",le="0.005"} 1
gpufrac_allocate_duration_seconds_bucket{resource="nvidia.com/gpu",le="0.01"} 1
gpufrac_allocate_duration_seconds_bucket{resource="nvidia.com/gpu",le="0.1"} 1
gpufrac_allocate_duration_seconds_bucket{resource="nvidia.com/gpu",le="+Inf"} 1
gpufrac_allocate_duration_seconds_sum{resource="nvidia.com/gpu"} 0.003
gpufrac_allocate_duration_seconds_count{resource="nvidia.com/gpu"} 1
# HELP gpufrac_gpu_xid_errors_total Xid errors NVML reported per GPU. critical is "true" for Xids that mark the GPU unhealthy, "false" for ignored application Xids.
# TYPE gpufrac_gpu_xid_errors_total counter
gpufrac_gpu_xid_errors_total{critical="false",gpu_uuid="GPU-2",xid="13"} 1
gpufrac_gpu_xid_errors_total{critical="true",gpu_uuid="GPU-1",xid="79"} 2
# HELP gpufrac_build_info Always 1; labels carry the gpufrac version and the Go version it was built with.
# TYPE gpufrac_build_info gauge
gpufrac_build_info{component="gpufrac-node",goversion=%q,version="v1.2.3"} 1
`, runtime.Version())
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"gpufrac_allocations_total", "gpufrac_allocate_duration_seconds", "gpufrac_gpu_xid_errors_total", "gpufrac_build_info"); err != nil {
		t.Error(err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
