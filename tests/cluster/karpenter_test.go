package cluster_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/tests/cluster"
)

func TestInstanceTypesJSON(t *testing.T) {
	tests := []struct {
		name    string
		types   []cluster.InstanceType
		want    string
		wantErr bool
	}{
		{
			name: "GPU type in two zones",
			types: []cluster.InstanceType{{
				Name:       "gpu-8x-h100",
				Resources:  cluster.ResourceList(map[corev1.ResourceName]string{"cpu": "192", api.ResourceGPU: "8"}),
				Price:      98.32,
				Zones:      []string{"z1", "z2"},
				GPUProduct: cluster.H100Product,
			}},
			want: `[{"name": "gpu-8x-h100", "architecture": "amd64", "operatingSystems": ["linux"],
			  "resources": {"cpu": "192", "nvidia.com/gpu": "8"},
			  "offerings": [
			    {"Price": 98.32, "Available": true, "Requirements": [
			      {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
			      {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z1"]},
			      {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]},
			      {"key": "karpenter.k8s.aws/instance-gpu-count", "operator": "In", "values": ["8"]}]},
			    {"Price": 98.32, "Available": true, "Requirements": [
			      {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
			      {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z2"]},
			      {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]},
			      {"key": "karpenter.k8s.aws/instance-gpu-count", "operator": "In", "values": ["8"]}]}]}]`,
		},
		{
			name: "CPU type in the default zone",
			types: []cluster.InstanceType{{
				Name:      "cpu-8x",
				Resources: cluster.ResourceList(map[corev1.ResourceName]string{"cpu": "8", "memory": "32Gi"}),
				Price:     0.34,
			}},
			want: `[{"name": "cpu-8x", "architecture": "amd64", "operatingSystems": ["linux"],
			  "resources": {"cpu": "8", "memory": "32Gi"},
			  "offerings": [{"Price": 0.34, "Available": true, "Requirements": [
			    {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
			    {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["test-zone-a"]}]}]}]`,
		},
		{
			name: "spot offered beside on-demand",
			types: []cluster.InstanceType{{
				Name:      "gpu-1x",
				Resources: cluster.ResourceList(map[corev1.ResourceName]string{"cpu": "26", api.ResourceGPU: "1"}),
				Price:     14.19,
				SpotPrice: 4.97,
			}},
			want: `[{"name": "gpu-1x", "architecture": "amd64", "operatingSystems": ["linux"],
			  "resources": {"cpu": "26", "nvidia.com/gpu": "1"},
			  "offerings": [
			    {"Price": 14.19, "Available": true, "Requirements": [
			      {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
			      {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["test-zone-a"]},
			      {"key": "karpenter.k8s.aws/instance-gpu-count", "operator": "In", "values": ["1"]}]},
			    {"Price": 4.97, "Available": true, "Requirements": [
			      {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]},
			      {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["test-zone-a"]},
			      {"key": "karpenter.k8s.aws/instance-gpu-count", "operator": "In", "values": ["1"]}]}]}]`,
		},
		{name: "no name", types: []cluster.InstanceType{{Price: 1}}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := cluster.InstanceTypesJSON(tt.types)
			if (err != nil) != tt.wantErr {
				t.Fatalf("InstanceTypesJSON() error = %v, wantErr %v", err, tt.wantErr)
			}
			if tt.wantErr {
				return
			}
			var gotV, wantV any
			if err := json.Unmarshal(got, &gotV); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal([]byte(tt.want), &wantV); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(wantV, gotV); diff != "" {
				t.Errorf("InstanceTypesJSON() (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNodePoolObject(t *testing.T) {
	tests := []struct {
		name string
		pool cluster.NodePool
		want string
	}{
		{
			name: "defaults",
			pool: cluster.NodePool{Name: "gpu", Labels: map[string]string{api.LabelGPUNode: "true"}, InstanceTypes: []string{"gpu-8x-h100"}},
			want: `{"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "gpu"},
			  "spec": {
			    "template": {
			      "metadata": {"labels": {"gpufrac.io/gpu-node": "true"}},
			      "spec": {
			        "nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "default"},
			        "expireAfter": "Never",
			        "requirements": [
			          {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
			          {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
			          {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["gpu-8x-h100"]}]}},
			    "disruption": {"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "5s",
			      "budgets": [{"nodes": "100%"}]}}}`,
		},
		{
			name: "everything set",
			pool: cluster.NodePool{
				Name:                "big",
				Taints:              []corev1.Taint{{Key: api.ResourceGPU, Effect: corev1.TaintEffectNoSchedule}},
				Requirements:        []corev1.NodeSelectorRequirement{{Key: "gpufrac.io/pool", Operator: corev1.NodeSelectorOpExists}},
				ConsolidationPolicy: "WhenEmpty",
				ConsolidateAfter:    -1,
				Weight:              7,
				Limits:              cluster.ResourceList(map[corev1.ResourceName]string{api.ResourceGPU: "16"}),
				CapacityTypes:       []string{cluster.CapacitySpot, cluster.CapacityOnDemand},
			},
			want: `{"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "big"},
			  "spec": {
			    "weight": 7,
			    "limits": {"nvidia.com/gpu": "16"},
			    "template": {
			      "metadata": {},
			      "spec": {
			        "nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "default"},
			        "expireAfter": "Never",
			        "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}],
			        "requirements": [
			          {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
			          {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot", "on-demand"]},
			          {"key": "gpufrac.io/pool", "operator": "Exists"}]}},
			    "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "Never",
			      "budgets": [{"nodes": "100%"}]}}}`,
		},
		{
			name: "explicit consolidateAfter",
			pool: cluster.NodePool{Name: "slow", ConsolidateAfter: 90 * time.Second},
			want: `{"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "slow"},
			  "spec": {
			    "template": {
			      "metadata": {},
			      "spec": {
			        "nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "default"},
			        "expireAfter": "Never",
			        "requirements": [
			          {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
			          {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}]}},
			    "disruption": {"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "1m30s",
			      "budgets": [{"nodes": "100%"}]}}}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obj, err := cluster.NodePoolObject(tt.pool)
			if err != nil {
				t.Fatal(err)
			}
			var want map[string]any
			if err := json.Unmarshal([]byte(tt.want), &want); err != nil {
				t.Fatal(err)
			}
			// Unstructured numbers are int64; compare through JSON to ignore that.
			raw, err := obj.MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			var got map[string]any
			if err := json.Unmarshal(raw, &got); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("NodePoolObject() (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDefaultNodePools(t *testing.T) {
	want := []cluster.NodePool{
		{Name: "gpu", Labels: map[string]string{api.LabelGPUNode: "true"}, InstanceTypes: []string{"gpu-8x-h100", "gpu-1x-h100"}},
		{Name: "cpu", InstanceTypes: []string{"cpu-8x"}, Weight: 10},
	}
	if diff := cmp.Diff(want, cluster.DefaultNodePools(cluster.DefaultInstanceTypes())); diff != "" {
		t.Errorf("DefaultNodePools(DefaultInstanceTypes()) (-want +got):\n%s", diff)
	}
}

// TestStartWithoutTools checks that a missing binary fails loudly, naming make tools.
func TestStartWithoutTools(t *testing.T) {
	tests := []struct {
		name      string
		opts      cluster.Options
		wantNames []string
	}{
		{name: "control plane", opts: cluster.Options{}, wantNames: []string{"etcd", "kube-apiserver", "kwok-stages"}},
		{name: "with Karpenter", opts: cluster.Options{Karpenter: &cluster.KarpenterOptions{}}, wantNames: []string{"karpenter-kwok", "karpenter-crds"}},
		{name: "with Kueue", opts: cluster.Options{Kueue: &cluster.KueueOptions{}}, wantNames: []string{"kueue", "kueue-manifests"}},
		{name: "with KubeRay", opts: cluster.Options{KubeRay: &cluster.KubeRayOptions{}}, wantNames: []string{"kuberay-operator", "kuberay-crds"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.opts.BinDir = t.TempDir()
			c, err := cluster.Start(t.Context(), tt.opts)
			if err == nil {
				c.Stop()
				t.Fatal("Start with an empty bin dir succeeded")
			}
			if !errors.Is(err, cluster.ErrToolsMissing) || !strings.Contains(err.Error(), "run make tools") {
				t.Errorf("error %q is not ErrToolsMissing saying run make tools", err)
			}
			for _, name := range tt.wantNames {
				if !strings.Contains(err.Error(), name) {
					t.Errorf("error %q does not name %s", err, name)
				}
			}
		})
	}
}
