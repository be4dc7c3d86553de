package cluster

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
)

// kueueManifests is an excerpt of Kueue v0.17's config/components/webhook/manifests.yaml.
const kueueManifests = `---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: mutating-webhook-configuration
webhooks:
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /mutate-kueue-x-k8s-io-v1beta2-clusterqueue}
  failurePolicy: Fail
  name: mclusterqueue.kb.io
  rules:
  - {apiGroups: [kueue.x-k8s.io], apiVersions: [v1beta2], operations: [CREATE], resources: [clusterqueues]}
  sideEffects: None
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /mutate-apps-v1-deployment}
  failurePolicy: Fail
  name: mdeployment.kb.io
  rules:
  - {apiGroups: [apps], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [deployments]}
  sideEffects: None
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /mutate-batch-v1-job}
  failurePolicy: Fail
  name: mjob.kb.io
  rules:
  - {apiGroups: [batch], apiVersions: [v1], operations: [CREATE], resources: [jobs]}
  sideEffects: None
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /mutate--v1-pod}
  failurePolicy: Fail
  name: mpod.kb.io
  rules:
  - {apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [pods]}
  sideEffects: None
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /mutate-ray-io-v1-rayjob}
  failurePolicy: Fail
  name: mrayjob.kb.io
  rules:
  - {apiGroups: [ray.io], apiVersions: [v1], operations: [CREATE], resources: [rayjobs]}
  sideEffects: None
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: validating-webhook-configuration
webhooks:
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /validate-batch-v1-job}
  failurePolicy: Fail
  name: vjob.kb.io
  rules:
  - {apiGroups: [batch], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [jobs]}
  sideEffects: None
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /validate-kueue-x-k8s-io-v1beta2-workload}
  failurePolicy: Fail
  name: vworkload.kb.io
  rules:
  - {apiGroups: [kueue.x-k8s.io], apiVersions: [v1beta2], operations: [CREATE, UPDATE], resources: [workloads, workloads/status]}
  sideEffects: None
`

func TestKueueWebhookFramework(t *testing.T) {
	for _, tt := range []struct{ group, resource, want string }{
		{"batch", "jobs", "batch/job"},
		{"", "pods", "pod"},
		{"apps", "deployments", "deployment"},
		{"apps", "statefulsets", "statefulset"},
		{"ray.io", "rayjobs", "ray.io/rayjob"},
		{"kubeflow.org", "mpijobs", "kubeflow.org/mpijob"},
		{"leaderworkerset.x-k8s.io", "leaderworkersets", "leaderworkerset.x-k8s.io/leaderworkerset"},
		{"kueue.x-k8s.io", "workloads/status", ""},
	} {
		if got := kueueWebhookFramework(tt.group, tt.resource); got != tt.want {
			t.Errorf("kueueWebhookFramework(%q, %q) = %q, want %q", tt.group, tt.resource, got, tt.want)
		}
	}
}

func TestKueueWebhooksRender(t *testing.T) {
	path := filepath.Join(t.TempDir(), "manifests.yaml")
	if err := os.WriteFile(path, []byte(kueueManifests), 0o644); err != nil {
		t.Fatal(err)
	}
	released, err := readKueueWebhooks(path)
	if err != nil {
		t.Fatal(err)
	}
	names := func(m *admissionregistrationv1.MutatingWebhookConfiguration, v *admissionregistrationv1.ValidatingWebhookConfiguration) []string {
		var out []string
		for _, h := range m.Webhooks {
			out = append(out, h.Name)
		}
		for _, h := range v.Webhooks {
			out = append(out, h.Name)
		}
		return out
	}
	tests := []struct {
		name       string
		frameworks []string
		want       []string
		wantErr    string
	}{
		{"jobs", []string{"batch/job"}, []string{"mclusterqueue.kb.io", "mjob.kb.io", "vjob.kb.io", "vworkload.kb.io"}, ""},
		// Deployments' pods go through the pod integration, which they enable.
		{"deployments", []string{"deployment"}, []string{"mclusterqueue.kb.io", "mdeployment.kb.io", "mpod.kb.io", "vworkload.kb.io"}, ""},
		{"unknown framework", []string{"batch/job", "batch/jobs"}, nil, "batch/jobs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, v, err := released.render(tt.frameworks, "kueue-test", "https://127.0.0.1:9443", []byte("CA"))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("render() error = %v, want one naming %s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, names(m, v)); diff != "" {
				t.Errorf("webhooks (-want +got):\n%s", diff)
			}
			if m.Name != "kueue-test" || v.Name != "kueue-test" {
				t.Errorf("names %q, %q, want kueue-test", m.Name, v.Name)
			}
			for _, h := range m.Webhooks {
				cc := h.ClientConfig
				if cc.Service != nil || cc.URL == nil || !strings.HasPrefix(*cc.URL, "https://127.0.0.1:9443/mutate-") || string(cc.CABundle) != "CA" {
					t.Errorf("%s: client config %+v, want the URL and CA bundle only", h.Name, cc)
				}
				namespaced := h.Name == "mpod.kb.io" || h.Name == "mdeployment.kb.io"
				if namespaced != (h.NamespaceSelector != nil) {
					t.Errorf("%s: namespace selector %v", h.Name, h.NamespaceSelector)
				}
			}
		})
	}
	// The release's objects are left as they were.
	if len(released.mutating.Webhooks) != 5 || released.mutating.Webhooks[0].ClientConfig.Service == nil {
		t.Errorf("render changed the release's webhooks: %+v", released.mutating.Webhooks)
	}
}

func TestEnsureKueueMetricsCert(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "metrics", "certs")
	// Several clusters starting at once: all succeed, one pair is written.
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() { errs[i] = ensureKueueMetricsCert(dir) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	crt, err := os.ReadFile(filepath.Join(dir, "tls.crt"))
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "tls.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("tls.key: %v, %v; want mode 0600", fi, err)
	}
	// Never overwritten.
	if err := ensureKueueMetricsCert(dir); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.ReadFile(filepath.Join(dir, "tls.crt")); string(again) != string(crt) {
		t.Error("tls.crt was written again")
	}
	// Half a pair, or a pair that does not load, is an error, left alone.
	if err := os.Remove(filepath.Join(dir, "tls.key")); err != nil {
		t.Fatal(err)
	}
	if err := ensureKueueMetricsCert(dir); err == nil || !strings.Contains(err.Error(), "only one") {
		t.Errorf("with tls.crt alone: error %v, want one saying only one file is there", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := ensureKueueMetricsCert(dir); err == nil || !strings.Contains(err.Error(), "does not load") {
		t.Errorf("with a broken key: error %v, want one saying it does not load", err)
	}
	// A directory that cannot be made says why.
	blocked := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(blocked, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := ensureKueueMetricsCert(filepath.Join(blocked, "certs")); err == nil || !strings.Contains(err.Error(), "hard-coded") {
		t.Errorf("in an unwritable place: error %v, want one explaining the hard-coded path", err)
	}
}
