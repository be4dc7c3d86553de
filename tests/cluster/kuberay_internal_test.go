package cluster

import (
	"slices"
	"strings"
	"testing"
)

func TestKubeRayEnv(t *testing.T) {
	tests := []struct {
		name    string
		env     []string
		wantErr string // "" for none
	}{
		{name: "none"},
		{name: "switches", env: []string{"ENABLE_INIT_CONTAINER_INJECTION=false", "RAYCLUSTER_DEFAULT_REQUEUE_SECONDS=5", "EMPTY="}},
		{name: "webhooks", env: []string{"ENABLE_WEBHOOKS=true"}, wantErr: "ENABLE_WEBHOOKS"},
		{name: "webhooks off is refused too", env: []string{"ENABLE_WEBHOOKS=false"}, wantErr: "ENABLE_WEBHOOKS"},
		{name: "HOME", env: []string{"HOME=/root"}, wantErr: "HOME"},
		{name: "no =", env: []string{"ENABLE_PROBES_INJECTION"}, wantErr: "not NAME=value"},
		{name: "no name", env: []string{"=x"}, wantErr: "not NAME=value"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := kubeRayEnv(KubeRayOptions{Env: tt.env})
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("kubeRayEnv(%q): %v", tt.env, err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("kubeRayEnv(%q) error %v, want one naming %s", tt.env, err, tt.wantErr)
			case tt.wantErr == "" && !slices.Equal(got, tt.env):
				t.Errorf("kubeRayEnv(%q) = %q", tt.env, got)
			}
		})
	}
}
