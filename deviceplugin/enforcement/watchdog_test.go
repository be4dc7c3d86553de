package enforcement

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/config"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/deviceplugin/pods"
)

const (
	hogUID = types.UID("11111111-2222-4333-8444-555555555555")
	// limit30 is 30% of a mock H100's 81920 MiB.
	limit30 = 24576
)

// TestWatchdogPolicies runs one container holding 30 units of a mock H100
// (limit 24576 MiB) through sequences of samples, one process whose use
// is given per poll, and checks when the policy acts.
func TestWatchdogPolicies(t *testing.T) {
	for _, tc := range []struct {
		name           string
		pol            Policy
		usedMiB        []uint64
		evictErr       error
		wantKills      []int // polls (0-based) that killed
		wantEvictions  []int // polls that evicted
		wantViolations float64
		wantReasons    []string
	}{
		{name: "grows past 30% and is killed after 3 samples",
			pol:     Policy{Enforcement: config.EnforcementKill, Samples: 3},
			usedMiB: []uint64{10000, 20000, 30000, 30000, 30000}, wantKills: []int{4}, wantViolations: 1,
			wantReasons: []string{"GPUMemoryLimitExceeded", "GPUMemoryProcessKilled"}},
		{name: "under the limit is untouched",
			pol:     Policy{Enforcement: config.EnforcementKill, Samples: 1},
			usedMiB: []uint64{10000, 24000, limit30, limit30, limit30}},
		{name: "a dip under the limit restarts the count",
			pol:     Policy{Enforcement: config.EnforcementKill, Samples: 3},
			usedMiB: []uint64{30000, 30000, 20000, 30000, 30000}},
		{name: "within tolerance is untouched",
			pol:     Policy{Enforcement: config.EnforcementKill, Samples: 1, TolerancePercent: 10},
			usedMiB: []uint64{27000, 27000, 27033}},
		{name: "beyond tolerance is killed",
			pol:     Policy{Enforcement: config.EnforcementKill, Samples: 2, TolerancePercent: 10},
			usedMiB: []uint64{27000, 27100, 27100}, wantKills: []int{2}, wantViolations: 1,
			wantReasons: []string{"GPUMemoryLimitExceeded", "GPUMemoryProcessKilled"}},
		{name: "a process that stays gets another full run before the next kill",
			pol:     Policy{Enforcement: config.EnforcementKill, Samples: 2},
			usedMiB: []uint64{30000, 30000, 30000, 30000, 30000}, wantKills: []int{1, 3}, wantViolations: 2,
			wantReasons: []string{"GPUMemoryLimitExceeded", "GPUMemoryProcessKilled", "GPUMemoryLimitExceeded", "GPUMemoryProcessKilled"}},
		{name: "report mode only reports, once per run",
			pol:     Policy{Enforcement: config.EnforcementReport, Samples: 2},
			usedMiB: []uint64{30000, 30000, 30000, 30000, 30000}, wantViolations: 1,
			wantReasons: []string{"GPUMemoryLimitExceeded"}},
		{name: "report mode reports again after a dip",
			pol:     Policy{Enforcement: config.EnforcementReport, Samples: 1},
			usedMiB: []uint64{30000, 30000, 100, 30000}, wantViolations: 2,
			wantReasons: []string{"GPUMemoryLimitExceeded", "GPUMemoryLimitExceeded"}},
		{name: "evict mode evicts once",
			pol:     Policy{Enforcement: config.EnforcementEvict, Samples: 3},
			usedMiB: []uint64{30000, 30000, 30000, 30000, 30000}, wantEvictions: []int{2}, wantViolations: 1,
			wantReasons: []string{"GPUMemoryLimitExceeded", "GPUMemoryPodEvicted"}},
		{name: "a failed eviction is retried after another run",
			pol:      Policy{Enforcement: config.EnforcementEvict, Samples: 2},
			evictErr: errors.New("Cannot evict pod as it would violate the pod's disruption budget"),
			usedMiB:  []uint64{30000, 30000, 30000, 30000}, wantViolations: 2,
			wantReasons: []string{"GPUMemoryLimitExceeded", "GPUMemoryActionFailed", "GPUMemoryLimitExceeded", "GPUMemoryActionFailed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOptions{})
			e.evictor.err = tc.evictErr
			e.w.SetPolicy(tc.pol)
			hog := e.addPod(testPod("hog", hogUID, "main"))
			e.devices.set(e.fraction(hog, "main", 0, 30))
			e.proc(1001, 5000, hog, "main")

			var kills, evictions []int
			for i, used := range tc.usedMiB {
				e.nvml(0, procMiB(1001, used))
				st := e.w.Poll(e.ctx)
				if st.Kills > 0 {
					kills = append(kills, i)
				}
				if st.Evictions > 0 {
					evictions = append(evictions, i)
				}
			}
			if diff := cmp.Diff(tc.wantKills, kills); diff != "" {
				t.Errorf("polls that killed (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantEvictions, evictions); diff != "" {
				t.Errorf("polls that evicted (-want +got):\n%s", diff)
			}
			for _, k := range e.killer.calls {
				if k != (kill{PID: 1001, Start: 5000}) {
					t.Errorf("killed %+v, want PID 1001 started at 5000", k)
				}
			}
			for _, ev := range e.evictor.calls {
				if ev != "team-a/hog" {
					t.Errorf("evicted %s, want team-a/hog", ev)
				}
			}
			events := e.events()
			if diff := cmp.Diff(tc.wantReasons, reasons(events)); diff != "" {
				t.Errorf("event reasons (-want +got):\n%s\nevents: %q", diff, events)
			}
			labels := containerLabelsOf(hog, "main", e.gpus[0].UUID)
			if got, _ := e.metric("gpufrac_container_gpu_memory_violations_total", labels); got != tc.wantViolations {
				t.Errorf("violations_total = %v, want %v", got, tc.wantViolations)
			}
			if got, _ := e.metric("gpufrac_memory_limit_violations_total", map[string]string{"action": string(e.w.Policy().Enforcement)}); got != tc.wantViolations {
				t.Errorf("node violations_total = %v, want %v", got, tc.wantViolations)
			}
			if got, _ := e.metric("gpufrac_container_gpu_memory_actions_total", withLabels(labels, "action", "kill", "result", "success")); got != float64(len(tc.wantKills)) {
				t.Errorf("kill actions_total = %v, want %d", got, len(tc.wantKills))
			}
		})
	}
}

// TestDefaultPolicyKills: a watchdog no config has reached yet acts with the
// default enforcement, kill (issue 25): the over-limit process goes after
// the default 3 samples, with its event and metric.
func TestDefaultPolicyKills(t *testing.T) {
	e := newEnv(t, envOptions{})
	if got := e.w.Policy().Enforcement; got != config.EnforcementKill {
		t.Errorf("default enforcement = %s, want kill", got)
	}
	hog := e.addPod(testPod("hog", hogUID, "main"))
	e.devices.set(e.fraction(hog, "main", 0, 30))
	e.proc(1001, 5000, hog, "main")
	e.nvml(0, procMiB(1001, 30000))
	for range config.DefaultSamples {
		e.w.Poll(e.ctx)
	}
	if diff := cmp.Diff([]kill{{PID: 1001, Start: 5000}}, e.killer.calls); diff != "" {
		t.Errorf("kills (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"GPUMemoryLimitExceeded", "GPUMemoryProcessKilled"}, reasons(e.events())); diff != "" {
		t.Errorf("event reasons (-want +got):\n%s", diff)
	}
	labels := withLabels(containerLabelsOf(hog, "main", e.gpus[0].UUID), "action", "kill", "result", "success")
	if got, _ := e.metric("gpufrac_container_gpu_memory_actions_total", labels); got != 1 {
		t.Errorf("kill actions_total = %v, want 1", got)
	}
}

// TestLimitIsNeverTakenFromTheContainersEnv: GPUFRAC_MEMORY_LIMIT_MIB is
// what the container is told, in an environment its tenant writes. A pod
// spec that sets it itself, larger or smaller, changes nothing: the limit
// is 30 units of the GPU the kubelet says the container holds.
func TestLimitIsNeverTakenFromTheContainersEnv(t *testing.T) {
	for _, tc := range []struct {
		name      string
		env       string
		usedMiB   uint64
		wantKills []kill
	}{
		{name: "a larger limit in the env does not spare an over-limit process",
			env: "1000000", usedMiB: 30000, wantKills: []kill{{PID: 1001, Start: 5000}}},
		{name: "a smaller limit in the env does not condemn a process within its grant",
			env: "1", usedMiB: limit30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOptions{})
			e.w.SetPolicy(Policy{Enforcement: config.EnforcementKill, Samples: 1})
			hog := testPod("hog", hogUID, "main")
			hog.Spec.Containers[0].Env = []corev1.EnvVar{{Name: api.EnvMemoryLimitMiB, Value: tc.env}}
			e.addPod(hog)
			e.devices.set(e.fraction(hog, "main", 0, 30))
			e.proc(1001, 5000, hog, "main")
			e.nvml(0, procMiB(1001, tc.usedMiB))
			e.w.Poll(e.ctx)
			if diff := cmp.Diff(tc.wantKills, e.killer.calls); diff != "" {
				t.Errorf("kills (-want +got):\n%s", diff)
			}
			for _, ev := range e.events() {
				if strings.Contains(ev, "limit") && !strings.Contains(ev, "24576 MiB") {
					t.Errorf("event %q does not name the granted limit of 24576 MiB", ev)
				}
			}
		})
	}
}

// TestEventsCarryTheNumbers checks the event text: used, limit and GPU.
func TestEventsCarryTheNumbers(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.w.SetPolicy(Policy{Enforcement: config.EnforcementKill, Samples: 1})
	hog := e.addPod(testPod("hog", hogUID, "main"))
	e.devices.set(e.fraction(hog, "main", 2, 30))
	e.proc(1001, 5000, hog, "main")
	e.nvml(2, procMiB(1001, 30720))
	e.w.Poll(e.ctx)
	events := e.events()
	if len(events) != 2 {
		t.Fatalf("events = %q, want a violation and a kill", events)
	}
	gpu := e.gpus[2].UUID
	for _, want := range []string{"Warning GPUMemoryLimitExceeded", "Container main uses 30720 MiB", gpu, "limit of 24576 MiB", "1 consecutive samples", "action: kill"} {
		if !strings.Contains(events[0], want) {
			t.Errorf("violation event %q lacks %q", events[0], want)
		}
	}
	for _, want := range []string{"Warning GPUMemoryProcessKilled", "process 1001", "held 30720 MiB", gpu, "limit is 24576 MiB"} {
		if !strings.Contains(events[1], want) {
			t.Errorf("kill event %q lacks %q", events[1], want)
		}
	}
}

func TestKillsLargestProcessesUntilTheRestFit(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.w.SetPolicy(Policy{Enforcement: config.EnforcementKill, Samples: 1})
	hog := e.addPod(testPod("hog", hogUID, "main"))
	e.devices.set(e.fraction(hog, "main", 0, 30))
	for pid, start := range map[uint32]uint64{11: 100, 12: 200, 13: 300} {
		e.proc(pid, start, hog, "main")
	}
	// 10 + 14 + 5 = 29 GiB > 24 GiB; without the 14 GiB one, 15 GiB fits.
	e.nvml(0, procMiB(11, 10240), procMiB(12, 14336), procMiB(13, 5120))
	st := e.w.Poll(e.ctx)
	if diff := cmp.Diff([]kill{{PID: 12, Start: 200}}, e.killer.calls); diff != "" {
		t.Errorf("kills (-want +got):\n%s", diff)
	}
	if st.Kills != 1 || st.OverLimit != 1 || st.Violations != 1 {
		t.Errorf("stats = %+v, want 1 kill, 1 over limit, 1 violation", st)
	}
}

func TestPIDReusedBetweenSampleAndKillKillsNothing(t *testing.T) {
	var e *env
	ops := &fakeKillOps{}
	killer := &PIDFDKiller{ops: ops, self: os.Getpid()}
	e = newEnv(t, envOptions{killer: killer})
	killer.procRoot = e.root
	e.w.SetPolicy(Policy{Enforcement: config.EnforcementKill, Samples: 2})
	hog := e.addPod(testPod("hog", hogUID, "main"))
	e.devices.set(e.fraction(hog, "main", 0, 30))
	e.proc(1001, 5000, hog, "main")
	e.nvml(0, procMiB(1001, 30000))
	if st := e.w.Poll(e.ctx); st.OverLimit != 1 || st.Kills+st.Skipped != 0 {
		t.Fatalf("first poll: %+v, want over the limit and no action yet", st)
	}
	// Between the second sample and the kill, the process exits and a
	// host process gets its PID.
	ops.beforeCheck = func() { e.proc(1001, 7777, nil, "") }
	st := e.w.Poll(e.ctx)
	if st.Kills != 0 || st.Skipped != 1 {
		t.Errorf("second poll: %+v, want the kill skipped", st)
	}
	if len(ops.pidfdKills)+len(ops.kills) != 0 {
		t.Errorf("signalled %v %v, want nothing", ops.pidfdKills, ops.kills)
	}
	if diff := cmp.Diff([]string{"GPUMemoryLimitExceeded", "GPUMemoryKillSkipped"}, reasons(e.events())); diff != "" {
		t.Errorf("event reasons (-want +got):\n%s", diff)
	}
	if got, _ := e.metric("gpufrac_memory_limit_actions_total", map[string]string{"action": "kill", "result": "skipped"}); got != 1 {
		t.Errorf("skipped kills = %v, want 1", got)
	}
	// The newcomer is a host process: reported, never killed.
	ops.beforeCheck = nil
	for range 3 {
		e.w.Poll(e.ctx)
	}
	if len(ops.pidfdKills)+len(ops.kills) != 0 {
		t.Errorf("the PID's new owner was signalled: %v %v", ops.pidfdKills, ops.kills)
	}
}

// countingResolver counts cgroup reads.
type countingResolver struct {
	ProcFS
	containers map[uint32]int
}

func (c *countingResolver) Container(pid uint32) (ContainerRef, error) {
	c.containers[pid]++
	return c.ProcFS.Container(pid)
}

func TestCgroupIsReadOncePerProcess(t *testing.T) {
	e := newEnv(t, envOptions{})
	r := &countingResolver{ProcFS: ProcFS{Root: e.root}, containers: map[uint32]int{}}
	e.w.resolver = r
	hog := e.addPod(testPod("hog", hogUID, "main"))
	e.devices.set(e.fraction(hog, "main", 0, 30))
	e.proc(1001, 5000, hog, "main")
	e.proc(1002, 5001, hog, "main")
	e.nvml(0, procMiB(1001, 100), procMiB(1002, 100))
	e.nvml(1, procMiB(1001, 100)) // one process on two GPUs
	for range 3 {
		if st := e.w.Poll(e.ctx); st.Unknown != 1 {
			t.Fatalf("stats = %+v, want the process on GPU 1 unknown (no device there)", st)
		}
	}
	// PID 1002 exits and its PID is reused by a host process.
	e.proc(1002, 9999, nil, "")
	if st := e.w.Poll(e.ctx); st.Unknown != 2 {
		t.Fatalf("stats after PID reuse = %+v, want the newcomer unknown", st)
	}
	if diff := cmp.Diff(map[uint32]int{1001: 1, 1002: 2}, r.containers); diff != "" {
		t.Errorf("cgroup reads per PID (-want +got):\n%s", diff)
	}
	// Gone processes are forgotten.
	e.nvml(0)
	e.nvml(1)
	e.w.Poll(e.ctx)
	if len(e.w.containers) != 0 {
		t.Errorf("resolver cache holds %d processes after all exited", len(e.w.containers))
	}
}

func TestProcessesOutsideManagedContainersAreNeverKilled(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.w.SetPolicy(Policy{Enforcement: config.EnforcementKill, Samples: 1})
	hog := e.addPod(testPod("hog", hogUID, "main"))
	other := e.addPod(testPod("other", "22222222-2222-4333-8444-555555555555", "main"))
	e.devices.set(e.fraction(hog, "main", 0, 30), e.fraction(other, "main", 1, 10))
	unknownPod := testPod("ghost", "33333333-2222-4333-8444-555555555555", "main") // not in the lookup
	e.proc(1, 1, nil, "")                                                          // init, on the host
	e.proc(500, 10, nil, "")                                                       // a host process
	e.proc(600, 20, other, "main")                                                 // holds units on GPU 1 only
	e.proc(700, 30, unknownPod, "main")                                            // a pod the informer does not know
	e.proc(800, 40, hog, "sidecar")                                                // a container not in the pod's status
	if err := os.MkdirAll(e.root+"/900", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(e.root+"/900/stat", []byte("garbage"), 0o644); err != nil { // unreadable entry
		t.Fatal(err)
	}
	e.nvml(0, procMiB(1, 1000), procMiB(500, 70000), procMiB(600, 30000), procMiB(700, 30000), procMiB(800, 30000), procMiB(900, 30000), procMiB(999, 30000))
	for range 3 {
		st := e.w.Poll(e.ctx)
		if st.Unknown != 7 || st.Processes != 7 {
			t.Fatalf("stats = %+v, want 7 processes, all unknown", st)
		}
	}
	if len(e.killer.calls) != 0 {
		t.Errorf("killed %+v; processes outside managed containers must never be killed", e.killer.calls)
	}
	if got := e.events(); len(got) != 0 {
		t.Errorf("events = %q, want none", got)
	}
	gpu := e.gpus[0].UUID
	if got, _ := e.metric("gpufrac_gpu_process_memory_used_bytes", map[string]string{"gpu_uuid": gpu, "owner": OwnerUnknown}); got != float64(221000*mib1) {
		t.Errorf("unknown-owner bytes = %v, want %v", got, 221000*mib1)
	}
	if got, _ := e.metric("gpufrac_gpu_processes", map[string]string{"gpu_uuid": gpu, "owner": OwnerManaged}); got != 0 {
		t.Errorf("managed processes = %v, want 0", got)
	}
	wantWhy := map[uint32]string{1: whyHost, 500: whyHost, 600: whyNoDevice, 700: whyPod, 800: whyContainer, 900: whyUnreadable, 999: whyNoProc}
	gotWhy := map[uint32]string{}
	for k, why := range e.w.reported {
		gotWhy[k.pid] = why
	}
	if diff := cmp.Diff(wantWhy, gotWhy); diff != "" {
		t.Errorf("reported processes and reasons (-want +got):\n%s", diff)
	}
}

func TestStandaloneReportsOnly(t *testing.T) {
	e := newEnv(t, envOptions{standalone: true})
	e.w.SetPolicy(Policy{Enforcement: config.EnforcementKill, Samples: 1})
	hog := testPod("hog", hogUID, "main")
	e.devices.set(e.fraction(hog, "main", 0, 30))
	e.proc(1001, 5000, hog, "main")
	e.nvml(0, procMiB(1001, 80000))
	for range 3 {
		if st := e.w.Poll(e.ctx); st.Unknown != 1 || st.Kills != 0 {
			t.Fatalf("stats = %+v, want the process unknown and nothing killed", st)
		}
	}
	if len(e.killer.calls) != 0 {
		t.Errorf("standalone killed %+v", e.killer.calls)
	}
	labels := containerLabelsOf(hog, "main", e.gpus[0].UUID)
	if got, ok := e.metric("gpufrac_container_gpu_memory_limit_bytes", labels); !ok || got != limit30*mib1 {
		t.Errorf("limit series = %v (present %v), want %d: PodResources gives limits without API access", got, ok, limit30*mib1)
	}
	if _, ok := e.metric("gpufrac_container_gpu_memory_used_bytes", labels); ok {
		t.Error("standalone exports per-container use it cannot know")
	}
	if reason := e.w.reported[procKey{gpu: e.gpus[0].UUID, pid: 1001, start: 5000}]; reason != whyNoAPI {
		t.Errorf("reported reason = %q, want %q", reason, whyNoAPI)
	}
}

func TestNVMLErrorSkipsTheGPUForThePoll(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.w.SetPolicy(Policy{Enforcement: config.EnforcementKill, Samples: 3})
	hog := e.addPod(testPod("hog", hogUID, "main"))
	calm := e.addPod(testPod("calm", "44444444-2222-4333-8444-555555555555", "main"))
	e.devices.set(e.fraction(hog, "main", 0, 30), e.fraction(calm, "main", 1, 50))
	e.proc(1001, 5000, hog, "main")
	e.proc(2001, 6000, calm, "main")
	e.nvml(0, procMiB(1001, 30000))
	e.nvml(1, procMiB(2001, 1000))
	e.w.Poll(e.ctx)
	e.w.Poll(e.ctx)

	// GPU 0 fails: skipped, never acted on; its run keeps its count.
	if err := e.lib.FailGPU(e.gpus[0].UUID, nvidia.ErrGPULost); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		st := e.w.Poll(e.ctx)
		if st.SkippedGPUs != 1 || st.GPUs != 7 || st.Kills != 0 {
			t.Fatalf("stats with GPU 0 failing = %+v, want 1 skipped, 7 sampled, no kill", st)
		}
	}
	if got, _ := e.metric("gpufrac_enforcement_nvml_errors_total", map[string]string{"gpu_uuid": e.gpus[0].UUID}); got != 3 {
		t.Errorf("nvml errors = %v, want 3", got)
	}
	labels := containerLabelsOf(hog, "main", e.gpus[0].UUID)
	if got, ok := e.metric("gpufrac_container_gpu_memory_used_bytes", labels); !ok || got != 30000*mib1 {
		t.Errorf("used series on the failing GPU = %v (present %v), want its last value", got, ok)
	}

	if diff := cmp.Diff(map[string]bool{e.gpus[0].UUID: true}, e.w.failures); diff != "" {
		t.Errorf("failing sources (-want +got):\n%s", diff)
	}

	// Healed: the third over-limit sample kills.
	if err := e.lib.FailGPU(e.gpus[0].UUID, nil); err != nil {
		t.Fatal(err)
	}
	if st := e.w.Poll(e.ctx); st.Kills != 1 {
		t.Errorf("after healing: %+v, want the kill on the third over-limit sample", st)
	}
	if len(e.w.failures) != 0 {
		t.Errorf("failing sources after healing: %v", e.w.failures)
	}
}

func TestPodResourcesErrorSkipsThePoll(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.w.SetPolicy(Policy{Enforcement: config.EnforcementKill, Samples: 1})
	hog := e.addPod(testPod("hog", hogUID, "main"))
	e.devices.set(e.fraction(hog, "main", 0, 30))
	e.devices.err = errors.New("connection refused")
	e.proc(1001, 5000, hog, "main")
	e.nvml(0, procMiB(1001, 30000))
	if st := e.w.Poll(e.ctx); st.Kills != 0 || st.SkippedGPUs != 8 {
		t.Errorf("stats = %+v, want every GPU skipped", st)
	}
	if got, _ := e.metric("gpufrac_enforcement_podresources_errors_total", nil); got != 1 {
		t.Errorf("podresources errors = %v, want 1", got)
	}
	e.devices.err = nil
	if st := e.w.Poll(e.ctx); st.Kills != 1 {
		t.Errorf("after recovery: %+v, want the kill", st)
	}
}

func TestContainerSeriesFollowTheContainer(t *testing.T) {
	e := newEnv(t, envOptions{})
	hog := e.addPod(testPod("hog", hogUID, "main", "side"))
	whole := e.addPod(testPod("trainer", "55555555-2222-4333-8444-555555555555", "main"))
	e.devices.set(
		e.fraction(hog, "main", 0, 30),
		e.fraction(hog, "side", 0, 20),
		pods.Assignment{Namespace: whole.Namespace, Pod: whole.Name, Container: "main", Resource: api.ResourceGPU, DeviceIDs: []string{e.gpus[5].UUID}},
	)
	e.proc(1001, 5000, hog, "main")
	e.proc(1002, 5001, hog, "main")
	e.proc(3001, 9000, whole, "main")
	e.proc(4001, 9100, nil, "")
	e.nvml(0, procMiB(1001, 1000), procMiB(1002, 2000), procMiB(4001, 300))
	e.nvml(5, procMiB(3001, 70000))
	e.w.Poll(e.ctx)

	gpu0, gpu5 := e.gpus[0].UUID, e.gpus[5].UUID
	for _, tc := range []struct {
		name   string
		metric string
		labels map[string]string
		want   float64
	}{
		{name: "main used sums its processes", metric: "gpufrac_container_gpu_memory_used_bytes", labels: containerLabelsOf(hog, "main", gpu0), want: 3000 * mib1},
		{name: "main limit", metric: "gpufrac_container_gpu_memory_limit_bytes", labels: containerLabelsOf(hog, "main", gpu0), want: limit30 * mib1},
		{name: "idle side container uses 0", metric: "gpufrac_container_gpu_memory_used_bytes", labels: containerLabelsOf(hog, "side", gpu0), want: 0},
		{name: "side limit", metric: "gpufrac_container_gpu_memory_limit_bytes", labels: containerLabelsOf(hog, "side", gpu0), want: 16384 * mib1},
		{name: "whole GPU use", metric: "gpufrac_container_gpu_memory_used_bytes", labels: containerLabelsOf(whole, "main", gpu5), want: 70000 * mib1},
		{name: "GPU 0 managed bytes", metric: "gpufrac_gpu_process_memory_used_bytes", labels: map[string]string{"gpu_uuid": gpu0, "owner": OwnerManaged}, want: 3000 * mib1},
		{name: "GPU 0 unknown bytes", metric: "gpufrac_gpu_process_memory_used_bytes", labels: map[string]string{"gpu_uuid": gpu0, "owner": OwnerUnknown}, want: 300 * mib1},
		{name: "GPU 5 managed processes", metric: "gpufrac_gpu_processes", labels: map[string]string{"gpu_uuid": gpu5, "owner": OwnerManaged}, want: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := e.metric(tc.metric, tc.labels)
			if !ok || got != tc.want {
				t.Errorf("%s%v = %v (present %v), want %v", tc.metric, tc.labels, got, ok, tc.want)
			}
		})
	}
	if _, ok := e.metric("gpufrac_container_gpu_memory_limit_bytes", containerLabelsOf(whole, "main", gpu5)); ok {
		t.Error("a whole GPU exports a limit")
	}
	if n := e.seriesCount("gpufrac_container_gpu_memory_used_bytes"); n != 3 {
		t.Errorf("used series = %d, want 3", n)
	}

	// hog ends: its series go, the trainer's stay.
	e.devices.set(pods.Assignment{Namespace: whole.Namespace, Pod: whole.Name, Container: "main", Resource: api.ResourceGPU, DeviceIDs: []string{gpu5}})
	e.nvml(0)
	e.w.Poll(e.ctx)
	for _, name := range []string{"gpufrac_container_gpu_memory_used_bytes", "gpufrac_container_gpu_memory_limit_bytes"} {
		for _, c := range []string{"main", "side"} {
			if _, ok := e.metric(name, containerLabelsOf(hog, c, gpu0)); ok {
				t.Errorf("%s of ended container %s is still exported", name, c)
			}
		}
	}
	if n := e.seriesCount("gpufrac_container_gpu_memory_used_bytes"); n != 1 {
		t.Errorf("used series after hog ended = %d, want 1 (the trainer)", n)
	}
}

func TestViolationCountersAreDeletedWithTheContainer(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.w.SetPolicy(Policy{Enforcement: config.EnforcementKill, Samples: 1})
	hog := e.addPod(testPod("hog", hogUID, "main"))
	e.devices.set(e.fraction(hog, "main", 0, 30))
	e.proc(1001, 5000, hog, "main")
	e.nvml(0, procMiB(1001, 30000))
	e.w.Poll(e.ctx)
	labels := containerLabelsOf(hog, "main", e.gpus[0].UUID)
	if got, _ := e.metric("gpufrac_container_gpu_memory_violations_total", labels); got != 1 {
		t.Fatalf("violations = %v, want 1", got)
	}
	e.devices.set()
	e.nvml(0)
	e.w.Poll(e.ctx)
	for _, name := range []string{"gpufrac_container_gpu_memory_violations_total", "gpufrac_container_gpu_memory_actions_total"} {
		if n := e.seriesCount(name); n != 0 {
			t.Errorf("%s has %d series after the container ended, want 0", name, n)
		}
	}
	if got, _ := e.metric("gpufrac_memory_limit_violations_total", map[string]string{"action": "kill"}); got != 1 {
		t.Errorf("node violations = %v, want 1: the node total survives the container", got)
	}
}

func TestTimeslicedReplicaLimit(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.w.SetPolicy(Policy{Enforcement: config.EnforcementKill, Samples: 1, TimesliceReplicas: 4})
	p := e.addPod(testPod("replica", hogUID, "main"))
	e.devices.set(pods.Assignment{Namespace: p.Namespace, Pod: p.Name, Container: "main", Resource: api.DefaultTimesliceResource, DeviceIDs: []string{e.gpus[3].UUID + "::2"}})
	e.proc(1001, 5000, p, "main")
	e.nvml(3, procMiB(1001, 20480)) // exactly 81920/4
	if st := e.w.Poll(e.ctx); st.OverLimit != 0 {
		t.Fatalf("a quarter of the GPU is over the replica limit: %+v", st)
	}
	e.nvml(3, procMiB(1001, 20481))
	if st := e.w.Poll(e.ctx); st.Kills != 1 {
		t.Errorf("one MiB over a quarter: %+v, want a kill", st)
	}
}

func TestWholeGPUAndMIGAreUnlimited(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.w.SetPolicy(Policy{Enforcement: config.EnforcementKill, Samples: 1})
	whole := e.addPod(testPod("trainer", hogUID, "main"))
	mig := e.addPod(testPod("mig", "66666666-2222-4333-8444-555555555555", "main"))
	e.devices.set(
		pods.Assignment{Namespace: whole.Namespace, Pod: whole.Name, Container: "main", Resource: api.ResourceGPU, DeviceIDs: []string{e.gpus[0].UUID}},
		pods.Assignment{Namespace: mig.Namespace, Pod: mig.Name, Container: "main", Resource: api.MIGResourcePrefix + "1g.10gb", DeviceIDs: []string{"MIG-aaaa"}},
	)
	e.proc(1001, 5000, whole, "main")
	e.proc(2001, 6000, mig, "main")
	e.nvml(0, procMiB(1001, 81000))
	e.nvml(1, procMiB(2001, 9000))
	st := e.w.Poll(e.ctx)
	if st.Unknown != 0 || st.OverLimit != 0 || len(e.killer.calls) != 0 {
		t.Errorf("stats = %+v, kills %v; want both managed, none over a limit", st, e.killer.calls)
	}
}

func TestRunPollsEveryIntervalWithAFakeClock(t *testing.T) {
	lib, err := nvidia.NewMock("dgxa100")
	if err != nil {
		t.Fatal(err)
	}
	if err := lib.Init(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lib.Shutdown() })
	gpus, err := lib.GPUs()
	if err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	polls := make(chan Stats, 10)
	tickers := make(chan time.Duration, 10)
	w := New(Options{GPUs: gpus, Processes: lib, Resolver: ProcFS{Root: t.TempDir()}, Clock: clk})
	w.onPoll = func(st Stats) { polls <- st }
	w.onTicker = func(d time.Duration) { tickers <- d }
	w.SetPolicy(Policy{PollInterval: 2 * time.Second})
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()

	// wait reads the event it expects: a new ticker of period want, or a
	// poll when want is 0. Both can be ready at once (Run starts its ticker
	// and polls at once), so each has its own receive.
	wait := func(what string, want time.Duration) {
		t.Helper()
		if want != 0 {
			select {
			case d := <-tickers:
				if d != want {
					t.Fatalf("%s: ticker every %s, want %s", what, d, want)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("%s: no ticker", what)
			}
			return
		}
		select {
		case st := <-polls:
			if st.GPUs != 8 {
				t.Errorf("%s: sampled %d GPUs, want 8", what, st.GPUs)
			}
		case d := <-tickers:
			t.Fatalf("%s: new ticker every %s, want a poll", what, d)
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: nothing happened", what)
		}
	}
	noPoll := func(what string) {
		t.Helper()
		select {
		case <-polls:
			t.Fatalf("%s: polled early", what)
		default:
		}
	}
	wait("start: ticker", 2*time.Second)
	wait("start: first poll", 0)
	clk.Step(time.Second)
	noPoll("after 1s of 2s")
	clk.Step(time.Second)
	wait("after 2s", 0)

	// A new interval replaces the ticker.
	w.SetPolicy(Policy{PollInterval: 500 * time.Millisecond})
	wait("new interval", 500*time.Millisecond)
	noPoll("a policy change is no sample")
	clk.Step(500 * time.Millisecond)
	wait("after 500ms", 0)

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run() = %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

func TestPolicyOf(t *testing.T) {
	f := &config.File{Version: config.Version, Default: config.Policy{
		Fraction:  config.FractionConfig{Enforcement: config.EnforcementEvict, PollInterval: config.Duration{Duration: 250 * time.Millisecond}, TolerancePercent: 5},
		Timeslice: config.TimesliceConfig{Replicas: 8},
	}}
	np, err := f.Resolve(nil, 8)
	if err != nil {
		t.Fatal(err)
	}
	want := Policy{Enforcement: config.EnforcementEvict, PollInterval: 250 * time.Millisecond, TolerancePercent: 5, Samples: config.DefaultSamples,
		TimesliceResource: api.DefaultTimesliceResource, TimesliceReplicas: 8}
	if diff := cmp.Diff(want, PolicyOf(np.Policy)); diff != "" {
		t.Errorf("PolicyOf() (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(Policy{Enforcement: config.EnforcementKill, PollInterval: time.Second, Samples: 3, TimesliceResource: api.DefaultTimesliceResource, TimesliceReplicas: 4}, Policy{}.withDefaults()); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
}

// TestClaimSharedByContainersHasOneLimit: a claim for 30 % of a GPU is the
// tenant's 30 %, however many containers hold it. A ResourceClaim may be
// referenced by several containers of a pod and by up to 256 pods; the
// kubelet prepares it once, and each container is told the claim's limit.
// Checked container by container, two pods sharing one 30 % claim could
// hold 60 % of the GPU, memory the counters gave other tenants; the
// watchdog holds the containers of one claim device to its limit together.
func TestClaimSharedByContainersHasOneLimit(t *testing.T) {
	claims := fakeClaims{}
	e := newEnv(t, envOptions{claims: claims})
	claims["team-a/shared/gpu-0-shares"] = struct {
		gpu string
		a   Allowance
	}{e.gpus[0].UUID, Allowance{LimitBytes: limit30 * mib1}}
	claims["team-a/own/gpu-1-shares"] = struct {
		gpu string
		a   Allowance
	}{e.gpus[1].UUID, Allowance{LimitBytes: limit30 * mib1}}
	e.w.SetPolicy(Policy{Enforcement: config.EnforcementKill, Samples: 1})
	a := e.addPod(testPod("a", hogUID, "main"))
	b := e.addPod(testPod("b", "77777777-2222-4333-8444-555555555555", "main", "side"))
	held := func(p string, c string, claim, device string) pods.Assignment {
		return pods.Assignment{Namespace: "team-a", Pod: p, Container: c, Resource: api.DRADriver, Claims: []pods.ClaimDevice{
			{ClaimNamespace: "team-a", ClaimName: claim, Pool: "node-a", Device: device, ShareID: "share-1"}}}
	}
	e.devices.set(held("a", "main", "shared", "gpu-0-shares"), held("b", "main", "shared", "gpu-0-shares"),
		held("b", "side", "own", "gpu-1-shares"))
	e.proc(11, 100, a, "main")
	e.proc(12, 200, b, "main")
	e.proc(13, 300, b, "side")
	// 16 + 15 GiB on GPU 0, each under 24 GiB, together over it; on GPU 1
	// a claim of its own, 20 of its 24 GiB.
	e.nvml(0, procMiB(11, 16384), procMiB(12, 15360))
	e.nvml(1, procMiB(13, 20480))
	st := e.w.Poll(e.ctx)
	if diff := cmp.Diff([]kill{{PID: 11, Start: 100}}, e.killer.calls); diff != "" {
		t.Errorf("kills (-want +got):\n%s", diff)
	}
	if st.OverLimit != 1 || st.Violations != 1 {
		t.Errorf("stats = %+v, want 1 over limit, 1 violation", st)
	}
	// Within the claim's limit together: nothing more.
	e.killer.calls = nil
	e.nvml(0, procMiB(12, 15360))
	if st := e.w.Poll(e.ctx); st.OverLimit != 0 || len(e.killer.calls) != 0 {
		t.Errorf("under the shared limit: stats = %+v, kills %v", st, e.killer.calls)
	}
}
