package app

import (
	"context"
	"errors"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestServesGroupVersion: a failed discovery call is retried, not taken as
// "not served" (which turned Karpenter's part off for a whole leadership);
// only NotFound means no.
func TestServesGroupVersion(t *testing.T) {
	old := discoveryBackoff
	discoveryBackoff = wait.Backoff{Duration: time.Millisecond, Factor: 1, Steps: old.Steps}
	t.Cleanup(func() { discoveryBackoff = old })
	const gv = "karpenter.sh/v1"
	unavailable := apierrors.NewServiceUnavailable("etcd leader changed")
	tests := []struct {
		name      string
		served    bool
		failures  int // calls that fail with unavailable first
		cancel    bool
		want      bool
		wantErr   bool
		wantCalls int
	}{
		{name: "served", served: true, want: true, wantCalls: 1},
		{name: "not found", want: false, wantCalls: 1},
		{name: "failures, then served", served: true, failures: 3, want: true, wantCalls: 4},
		{name: "failures, then not found", failures: 2, want: false, wantCalls: 3},
		{name: "failing until the leadership ends", served: true, failures: 1 << 30, cancel: true, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cs := fake.NewClientset()
			disc := cs.Discovery().(*fakediscovery.FakeDiscovery)
			if tt.served {
				disc.Resources = []*metav1.APIResourceList{{GroupVersion: gv, APIResources: []metav1.APIResource{{Name: "nodeclaims"}}}}
			}
			calls := 0
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			cs.PrependReactor("get", "resource", func(k8stesting.Action) (bool, runtime.Object, error) {
				calls++
				if calls <= tt.failures {
					if tt.cancel && calls == 5 {
						cancel()
					}
					return true, nil, unavailable
				}
				return false, nil, nil
			})
			got, err := servesGroupVersion(ctx, disc, gv)
			if (err != nil) != tt.wantErr || (tt.wantErr && !errors.Is(err, context.Canceled)) {
				t.Fatalf("error %v, want error: %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("serves %v, want %v", got, tt.want)
			}
			if tt.wantCalls > 0 && calls != tt.wantCalls {
				t.Errorf("%d discovery calls, want %d", calls, tt.wantCalls)
			}
		})
	}
}
