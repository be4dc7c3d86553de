package enforcement

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/deviceplugin/nvidia"
	"github.com/gpufrac/gpufrac/deviceplugin/pods"
	"github.com/gpufrac/gpufrac/deviceplugin/resource"
	"github.com/gpufrac/gpufrac/deviceplugin/resource/resourcetest"
)

const (
	h100Bytes = 81559 << 20 // an H100 80GB HBM3 as NVML reports it: 81559 MiB
	a100Bytes = 40960 << 20
)

func testGPUs() map[string]nvidia.GPU {
	return map[string]nvidia.GPU{
		"GPU-h100": {UUID: "GPU-h100", MemoryBytes: h100Bytes},
		"GPU-a100": {UUID: "GPU-a100", MemoryBytes: a100Bytes},
	}
}

func unitIDs(gpu string, n int) []string {
	ids := make([]string, n)
	for k := range ids {
		ids[k] = resource.UnitID(gpu, k)
	}
	return ids
}

func assignment(pod, container, res string, ids ...string) pods.Assignment {
	return pods.Assignment{Namespace: "ns", Pod: pod, Container: container, Resource: res, DeviceIDs: ids}
}

func TestAllowances(t *testing.T) {
	pol := Policy{TimesliceResource: api.DefaultTimesliceResource, TimesliceReplicas: 4}.withDefaults()
	key := func(pod string) ContainerKey { return ContainerKey{Namespace: "ns", Pod: pod, Container: "main"} }
	for _, tc := range []struct {
		name string
		as   []pods.Assignment
		pol  Policy
		want map[ContainerKey]map[string]Allowance
	}{
		{name: "30 units of an H100: 30% in whole MiB, as Allocate announced",
			as:   []pods.Assignment{assignment("p", "main", api.ResourceFraction, unitIDs("GPU-h100", 30)...)},
			want: map[ContainerKey]map[string]Allowance{key("p"): {"GPU-h100": {LimitBytes: 81559 * 30 / 100 << 20}}}},
		{name: "100 units is the whole memory",
			as:   []pods.Assignment{assignment("p", "main", api.ResourceFraction, unitIDs("GPU-a100", 100)...)},
			want: map[ContainerKey]map[string]Allowance{key("p"): {"GPU-a100": {LimitBytes: a100Bytes}}}},
		{name: "whole GPU is unlimited",
			as:   []pods.Assignment{assignment("p", "main", api.ResourceGPU, "GPU-h100", "GPU-a100")},
			want: map[ContainerKey]map[string]Allowance{key("p"): {"GPU-h100": {Unlimited: true}, "GPU-a100": {Unlimited: true}}}},
		{name: "one time-sliced replica of 4: a quarter",
			as:   []pods.Assignment{assignment("p", "main", api.DefaultTimesliceResource, "GPU-a100::2")},
			want: map[ContainerKey]map[string]Allowance{key("p"): {"GPU-a100": {LimitBytes: 10240 << 20}}}},
		{name: "two replicas of 4: a half",
			as:   []pods.Assignment{assignment("p", "main", api.DefaultTimesliceResource, "GPU-a100::0", "GPU-a100::3")},
			want: map[ContainerKey]map[string]Allowance{key("p"): {"GPU-a100": {LimitBytes: 20480 << 20}}}},
		{name: "renamed time-slice resource with 8 replicas",
			pol:  Policy{TimesliceResource: "example.com/shared-gpu", TimesliceReplicas: 8},
			as:   []pods.Assignment{assignment("p", "main", "example.com/shared-gpu", "GPU-a100::5")},
			want: map[ContainerKey]map[string]Allowance{key("p"): {"GPU-a100": {LimitBytes: 5120 << 20}}}},
		{name: "default replica resource name is ignored once renamed",
			pol:  Policy{TimesliceResource: "example.com/shared-gpu", TimesliceReplicas: 8},
			as:   []pods.Assignment{assignment("p", "main", api.DefaultTimesliceResource, "GPU-a100::5")},
			want: map[ContainerKey]map[string]Allowance{}},
		{name: "MIG device: unlimited on any GPU",
			as:   []pods.Assignment{assignment("p", "main", api.MIGResourcePrefix+"1g.10gb", "MIG-1234")},
			want: map[ContainerKey]map[string]Allowance{key("p"): {anyGPU: {Unlimited: true}}}},
		{name: "MIG device through nvidia.com/gpu (single strategy)",
			as:   []pods.Assignment{assignment("p", "main", api.ResourceGPU, "MIG-1234")},
			want: map[ContainerKey]map[string]Allowance{key("p"): {anyGPU: {Unlimited: true}}}},
		{name: "fraction plus whole on the same GPU: unlimited",
			as: []pods.Assignment{
				assignment("p", "main", api.ResourceFraction, unitIDs("GPU-h100", 10)...),
				assignment("p", "main", api.ResourceGPU, "GPU-h100"),
			},
			want: map[ContainerKey]map[string]Allowance{key("p"): {"GPU-h100": {Unlimited: true, LimitBytes: 8155 << 20}}}},
		{name: "containers and pods are kept apart",
			as: []pods.Assignment{
				assignment("p", "main", api.ResourceFraction, unitIDs("GPU-a100", 25)...),
				assignment("p", "side", api.ResourceFraction, unitIDs("GPU-a100", 50)[25:]...),
				assignment("q", "main", api.ResourceGPU, "GPU-h100"),
			},
			want: map[ContainerKey]map[string]Allowance{
				key("p"): {"GPU-a100": {LimitBytes: 10240 << 20}},
				{Namespace: "ns", Pod: "p", Container: "side"}: {"GPU-a100": {LimitBytes: 10240 << 20}},
				key("q"): {"GPU-h100": {Unlimited: true}},
			}},
		{name: "unknown GPUs, malformed IDs and other resources are ignored",
			as: []pods.Assignment{
				assignment("p", "main", api.ResourceFraction, "GPU-gone::1", "not-a-unit"),
				assignment("p", "main", api.ResourceGPU, "GPU-gone"),
				assignment("p", "main", "example.com/fpga", "fpga-0"),
			},
			want: map[ContainerKey]map[string]Allowance{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := pol
			if tc.pol.TimesliceResource != "" {
				p = tc.pol.withDefaults()
			}
			got := Allowances(tc.as, testGPUs(), p)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Allowances() (-want +got):\n%s", diff)
			}
		})
	}
}

// TestFractionLimitMatchesAllocate checks that the watchdog enforces exactly
// the limit the fraction resource announced to the container.
func TestFractionLimitMatchesAllocate(t *testing.T) {
	g := nvidia.GPU{UUID: "GPU-h100", MemoryBytes: h100Bytes}
	f := resource.NewFraction(resource.FractionOptions{GPUs: []nvidia.GPU{g}, Usage: &resourcetest.Usage{}})
	for _, units := range []int{1, 7, 30, 99, 100} {
		t.Run(fmt.Sprint(units), func(t *testing.T) {
			resp, err := f.Allocate(t.Context(), unitIDs(g.UUID, units))
			if err != nil {
				t.Fatal(err)
			}
			a := Allowances([]pods.Assignment{assignment("p", "main", api.ResourceFraction, unitIDs(g.UUID, units)...)},
				map[string]nvidia.GPU{g.UUID: g}, Policy{}.withDefaults())
			got := fmt.Sprint(a[ContainerKey{"ns", "p", "main"}][g.UUID].LimitBytes >> 20)
			if want := resp.Envs[api.EnvMemoryLimitMiB]; got != want {
				t.Errorf("watchdog limit %s MiB, Allocate announced %s MiB", got, want)
			}
		})
	}
}

func TestAllowanceOn(t *testing.T) {
	byGPU := map[string]Allowance{"GPU-a": {LimitBytes: 5}}
	if a, ok := allowanceOn(byGPU, "GPU-a"); !ok || a.LimitBytes != 5 || a.Unlimited {
		t.Errorf("allowanceOn(GPU-a) = %+v, %v", a, ok)
	}
	if _, ok := allowanceOn(byGPU, "GPU-b"); ok {
		t.Error("allowanceOn(GPU-b) found an allowance for a GPU the container holds nothing on")
	}
	byGPU[anyGPU] = Allowance{Unlimited: true}
	if a, ok := allowanceOn(byGPU, "GPU-b"); !ok || !a.Unlimited {
		t.Errorf("allowanceOn(GPU-b) for a MIG holder = %+v, %v; want unlimited", a, ok)
	}
}

// TestMIGDoesNotLiftAFractionLimit: a container holding a MIG device and a
// fraction on another GPU (a pod the coordinator would refuse, bound by
// another scheduler) keeps its fraction's limit on the fraction's GPU; the
// MIG device is unlimited only where the container holds nothing else.
func TestMIGDoesNotLiftAFractionLimit(t *testing.T) {
	as := []pods.Assignment{
		assignment("p", "main", api.MIGResourcePrefix+"1g.10gb", "MIG-1234"),
		assignment("p", "main", api.ResourceFraction, unitIDs("GPU-h100", 10)...),
	}
	allow := Allowances(as, testGPUs(), Policy{}.withDefaults())[ContainerKey{Namespace: "ns", Pod: "p", Container: "main"}]
	a, ok := allowanceOn(allow, "GPU-h100")
	if !ok || a.Unlimited || a.LimitBytes != 8155<<20 {
		t.Errorf("allowance on the fraction's GPU = %+v, %t; want the 10%% limit (8155 MiB)", a, ok)
	}
	if a, ok := allowanceOn(allow, "GPU-a100"); !ok || !a.Unlimited {
		t.Errorf("allowance on another GPU (the MIG device's parent) = %+v, %t; want unlimited", a, ok)
	}
}

// fakeClaims is a ClaimSource from a table: device name -> GPU and allowance.
type fakeClaims map[string]struct {
	gpu string
	a   Allowance
}

func (f fakeClaims) ClaimAllowance(d pods.ClaimDevice) (string, Allowance, bool) {
	x, ok := f[d.ClaimNamespace+"/"+d.ClaimName+"/"+d.Device]
	return x.gpu, x.a, ok
}

func TestAllowancesWithClaims(t *testing.T) {
	claims := fakeClaims{
		"ns/c30/gpu-0-shares": {"GPU-h100", Allowance{LimitBytes: 81559 * 30 / 100 << 20}},
		"ns/m20/gpu-0-memory": {"GPU-a100", Allowance{LimitBytes: 20 << 30}},
		"ns/w/gpu-1":          {"GPU-h100", Allowance{Unlimited: true}},
		"ns/mig/gpu-2-mig-x":  {"", Allowance{Unlimited: true}},
		"ns/gone/gpu-0":       {"GPU-gone", Allowance{Unlimited: true}},
	}
	claim := func(name, device string) pods.ClaimDevice {
		return pods.ClaimDevice{ClaimNamespace: "ns", ClaimName: name, Pool: "node-a", Device: device}
	}
	as := []pods.Assignment{
		{Namespace: "ns", Pod: "p", Container: "main", Resource: api.DRADriver, Claims: []pods.ClaimDevice{claim("c30", "gpu-0-shares")}},
		// A claim and a fraction on the same GPU add up, as two fractions do.
		assignment("p", "main", api.ResourceFraction, unitIDs("GPU-h100", 10)...),
		{Namespace: "ns", Pod: "q", Container: "main", Resource: api.DRADriver, Claims: []pods.ClaimDevice{
			claim("m20", "gpu-0-memory"), claim("w", "gpu-1"), claim("unknown", "gpu-3"), claim("gone", "gpu-0")}},
		{Namespace: "ns", Pod: "r", Container: "main", Resource: api.DRADriver, Claims: []pods.ClaimDevice{claim("mig", "gpu-2-mig-x")}},
	}
	key := func(pod string) ContainerKey { return ContainerKey{Namespace: "ns", Pod: pod, Container: "main"} }
	want := map[ContainerKey]map[string]Allowance{
		key("p"): {"GPU-h100": {LimitBytes: (81559*30/100 + 81559*10/100) << 20}},
		key("q"): {"GPU-a100": {LimitBytes: 20 << 30}, "GPU-h100": {Unlimited: true}},
		key("r"): {anyGPU: {Unlimited: true}},
	}
	got := AllowancesWithClaims(as, testGPUs(), Policy{}.withDefaults(), claims)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("AllowancesWithClaims (-want +got):\n%s", diff)
	}
	// Without a claim source the claims grant nothing, as an unknown
	// resource would; the fraction still counts.
	got = Allowances(as, testGPUs(), Policy{}.withDefaults())
	want = map[ContainerKey]map[string]Allowance{key("p"): {"GPU-h100": {LimitBytes: 81559 * 10 / 100 << 20}}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Allowances without claims (-want +got):\n%s", diff)
	}
}

func TestClaimGrants(t *testing.T) {
	claims := fakeClaims{
		"ns/c30/gpu-0-shares": {"GPU-h100", Allowance{LimitBytes: 30 << 30}},
		"ns/m20/gpu-0-memory": {"GPU-a100", Allowance{LimitBytes: 20 << 30}},
		"ns/m10/gpu-0-memory": {"GPU-a100", Allowance{LimitBytes: 10 << 30}},
		"ns/w/gpu-1":          {"GPU-h100", Allowance{Unlimited: true}},
		"ns/mig/gpu-2-mig-x":  {"", Allowance{LimitBytes: 10 << 30}},
		"ns/gone/gpu-0":       {"GPU-gone", Allowance{LimitBytes: 10 << 30}},
	}
	claim := func(name, device string) pods.ClaimDevice {
		return pods.ClaimDevice{ClaimNamespace: "ns", ClaimName: name, Pool: "node-a", Device: device}
	}
	dra := func(pod, container string, ds ...pods.ClaimDevice) pods.Assignment {
		return pods.Assignment{Namespace: "ns", Pod: pod, Container: container, Resource: api.DRADriver, Claims: ds}
	}
	key := func(pod, container string) ContainerKey {
		return ContainerKey{Namespace: "ns", Pod: pod, Container: container}
	}
	tests := []struct {
		name     string
		as       []pods.Assignment
		noSource bool // ClaimGrants gets no claim source
		want     Grants
	}{
		{
			name: "one container, one limited device",
			as:   []pods.Assignment{dra("p", "main", claim("c30", "gpu-0-shares"))},
			want: Grants{{key("p", "main"), "GPU-h100"}: {claim("c30", "gpu-0-shares"): 30 << 30}},
		},
		{
			name: "two devices on one GPU, one on another",
			as:   []pods.Assignment{dra("p", "main", claim("m20", "gpu-0-memory"), claim("m10", "gpu-0-memory"), claim("c30", "gpu-0-shares"))},
			want: Grants{
				{key("p", "main"), "GPU-a100"}: {claim("m20", "gpu-0-memory"): 20 << 30, claim("m10", "gpu-0-memory"): 10 << 30},
				{key("p", "main"), "GPU-h100"}: {claim("c30", "gpu-0-shares"): 30 << 30},
			},
		},
		{
			name: "a claim shared by two containers and a pod: each holds it",
			as: []pods.Assignment{
				dra("p", "a", claim("c30", "gpu-0-shares")),
				dra("p", "b", claim("c30", "gpu-0-shares")),
				dra("q", "main", claim("c30", "gpu-0-shares")),
			},
			want: Grants{
				{key("p", "a"), "GPU-h100"}:    {claim("c30", "gpu-0-shares"): 30 << 30},
				{key("p", "b"), "GPU-h100"}:    {claim("c30", "gpu-0-shares"): 30 << 30},
				{key("q", "main"), "GPU-h100"}: {claim("c30", "gpu-0-shares"): 30 << 30},
			},
		},
		{
			name: "unlimited, MIG, unknown and other GPUs' devices left out",
			as: []pods.Assignment{dra("p", "main", claim("w", "gpu-1"), claim("mig", "gpu-2-mig-x"),
				claim("gone", "gpu-0"), claim("unknown", "gpu-3"))},
			want: Grants{},
		},
		{
			name: "other resources left out",
			as:   []pods.Assignment{assignment("p", "main", api.ResourceFraction, unitIDs("GPU-h100", 10)...)},
			want: Grants{},
		},
		{
			name:     "no claim source",
			as:       []pods.Assignment{dra("p", "main", claim("c30", "gpu-0-shares"))},
			noSource: true,
			want:     Grants{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var src ClaimSource = claims
			if tt.noSource {
				src = nil
			}
			got := ClaimGrants(tt.as, testGPUs(), src)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ClaimGrants (-want +got):\n%s", diff)
			}
		})
	}
}

func TestGrantsOn(t *testing.T) {
	d := func(name string) pods.ClaimDevice {
		return pods.ClaimDevice{ClaimNamespace: "ns", ClaimName: name, Device: "gpu-0"}
	}
	p := ContainerKey{Namespace: "ns", Pod: "p", Container: "main"}
	q := ContainerKey{Namespace: "ns", Pod: "q", Container: "main"}
	g := Grants{}
	g.add(p, "GPU-h100", d("a"), 10)
	g.add(p, "GPU-h100", d("b"), 20)
	g.add(p, "GPU-a100", d("c"), 30)
	g.add(q, "GPU-h100", d("a"), 10)
	tests := []struct {
		name      string
		container ContainerKey
		gpu       string
		want      DeviceLimits
		wantTotal uint64
	}{
		{name: "two devices on a GPU", container: p, gpu: "GPU-h100", want: DeviceLimits{d("a"): 10, d("b"): 20}, wantTotal: 30},
		{name: "the container's other GPU", container: p, gpu: "GPU-a100", want: DeviceLimits{d("c"): 30}, wantTotal: 30},
		{name: "another container on the GPU", container: q, gpu: "GPU-h100", want: DeviceLimits{d("a"): 10}, wantTotal: 10},
		{name: "a GPU the container holds nothing on", container: q, gpu: "GPU-a100", want: nil, wantTotal: 0},
		{name: "an unknown container", container: ContainerKey{Namespace: "ns", Pod: "r"}, gpu: "GPU-h100", want: nil, wantTotal: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := g.On(tt.container, tt.gpu)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("On (-want +got):\n%s", diff)
			}
			if total := got.Total(); total != tt.wantTotal {
				t.Errorf("Total = %d, want %d", total, tt.wantTotal)
			}
		})
	}
}
