package podrequest

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/utils/ptr"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/tests/builders"
)

func TestClaims(t *testing.T) {
	claims := map[string]*resourceapi.ResourceClaim{
		"c30":   builders.MakeClaim("c30", "team").Shares(30).Obj(),
		"m20":   builders.MakeClaim("m20", "team").GPUMemory("20Gi").Obj(),
		"two":   builders.MakeClaim("two", "team").WholeGPUs(2).Obj(),
		"mig":   builders.MakeClaim("mig", "team").Request("gpu", api.DRAClassMIG, 1).Obj(),
		"nic":   builders.MakeClaim("nic", "team").Request("nic", "nic.example.com", 1).Obj(),
		"huge":  builders.MakeClaim("huge", "team").GPUMemory("100Gi").Obj(),
		"c30b":  builders.MakeClaim("c30b", "team").Shares(30).Obj(),
		"whole": builders.MakeClaim("whole", "team").WholeGPUs(9).Obj(),
	}
	opts := Options{Claims: ClaimOptions{
		Get:            func(ns, name string) (*resourceapi.ResourceClaim, bool) { c, ok := claims[name]; return c, ok },
		GPUMemoryBytes: func(*resourceapi.ResourceClaim) int64 { return 80 << 30 },
	}}
	pod := func(claimNames ...string) *builders.PodWrapper {
		w := builders.MakePod("p", "team").Queue("q")
		for _, n := range claimNames {
			w = w.Claim("pc-"+n, n)
		}
		return w
	}
	tests := []struct {
		name      string
		pod       *corev1.Pod
		wantGPUs  int
		wantShare int
		wantErr   string
		pending   bool
	}{
		{name: "30 %", pod: pod("c30").Obj(), wantShare: 300},
		{name: "20 GiB of an 80 GiB GPU", pod: pod("m20").Obj(), wantShare: 250},
		{name: "two whole GPUs and a NIC", pod: pod("two", "nic").Obj(), wantGPUs: 2},
		{name: "MIG claims are kube-scheduler's", pod: pod("mig").Obj(), wantErr: "asks MIG devices"},
		{name: "claim and extended resources", pod: pod("c30").Fraction(10).Obj(), wantErr: "both as extended resources"},
		{name: "two GPU claims", pod: pod("c30", "c30b").Obj(), wantErr: "ask gpufrac's GPUs 2 times"},
		{name: "more memory than a GPU has", pod: pod("huge").Obj(), wantErr: "more than gpufrac's GPUs have"},
		{name: "more GPUs than a pod may hold", pod: pod("whole").Obj(), wantErr: "asks 9 whole GPUs"},
		{name: "a claim not in the informer yet", pod: pod("absent").Obj(), pending: true},
		{name: "a template claim not created yet", pod: builders.MakePod("p", "team").Queue("q").ClaimTemplate("gpu", "gpu-30pct").Obj(), pending: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(tc.pod, opts)
			switch {
			case tc.pending:
				if !errors.Is(err, ErrClaimsPending) {
					t.Fatalf("Parse error = %v, want ErrClaimsPending", err)
				}
				return
			case tc.wantErr != "":
				if !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Parse error = %v, want an invalid request saying %q", err, tc.wantErr)
				}
				return
			case err != nil:
				t.Fatal(err)
			}
			if got.Request.GPUs != tc.wantGPUs || got.Request.ShareMilli != tc.wantShare || !got.ClaimsGPU {
				t.Errorf("Parse = GPUs %d share %d claims %v, want %d %d true", got.Request.GPUs, got.Request.ShareMilli, got.ClaimsGPU, tc.wantGPUs, tc.wantShare)
			}
			if got.QueueResources().GPUMilli != int64(tc.wantGPUs*1000+tc.wantShare) {
				t.Errorf("queue charge %d milli-GPU", got.QueueResources().GPUMilli)
			}
		})
	}
	// A template claim once created: read by the name the pod's status gives.
	tp := builders.MakePod("p", "team").Queue("q").ClaimTemplate("gpu", "gpu-30pct").Obj()
	tp.Status.ResourceClaimStatuses = []corev1.PodResourceClaimStatus{{Name: "gpu", ResourceClaimName: ptr.To("c30")}}
	if got, err := Parse(tp, opts); err != nil || got.Request.ShareMilli != 300 {
		t.Errorf("template claim: %+v, %v", got.Request, err)
	}
}
