package kueue_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/gpufrac/gpufrac/coordinator/kueue"
)

// workloadYAML is a Workload as Kueue v0.17 writes it for a Job of
// parallelism 3 (trimmed), admitted for count pods of its pod set.
func workloadYAML(t *testing.T, status string) *unstructured.Unstructured {
	t.Helper()
	doc := `
apiVersion: kueue.x-k8s.io/v1beta2
kind: Workload
metadata:
  name: job-train-1a2b3
  namespace: ml
  ownerReferences:
  - {apiVersion: v1, kind: ConfigMap, name: unrelated, uid: uid-unrelated}
  - {apiVersion: batch/v1, kind: Job, name: train, uid: uid-train, controller: true, blockOwnerDeletion: true}
spec:
  queueName: team
  podSets:
  - name: main
    count: 3
    template:
      spec:
        containers:
        - name: c
          image: busybox
          resources:
            limits: {gpufrac.io/gpu-fraction: "50"}
` + status
	var obj map[string]any
	if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: obj}
}

func TestFromUnstructured(t *testing.T) {
	for _, tc := range []struct {
		name         string
		status       string
		wantAdmitted bool
		wantCount    int
	}{
		{name: "pending: no status"},
		{name: "quota reserved, admission checks pending", status: `
status:
  conditions:
  - {type: QuotaReserved, status: "True", reason: QuotaReserved, message: "", lastTransitionTime: "2026-11-29T08:00:00Z"}
  - {type: Admitted, status: "False", reason: AdmissionChecksPending, message: "", lastTransitionTime: "2026-11-29T08:00:00Z"}
  admission:
    clusterQueue: gpus
    podSetAssignments: [{name: main, count: 3}]
`},
		{name: "admitted, count in the assignment (partial admission)", status: `
status:
  conditions:
  - {type: Admitted, status: "True", reason: Admitted, message: "", lastTransitionTime: "2026-11-29T08:00:00Z"}
  admission:
    clusterQueue: gpus
    podSetAssignments: [{name: main, count: 2}]
`, wantAdmitted: true, wantCount: 2},
		{name: "admitted by an older Kueue: the spec's count", status: `
status:
  conditions:
  - {type: Admitted, status: "True", reason: Admitted, message: "", lastTransitionTime: "2026-11-29T08:00:00Z"}
  admission:
    clusterQueue: gpus
    podSetAssignments: [{name: main}]
`, wantAdmitted: true, wantCount: 3},
		{name: "finished: Kueue leaves Admitted true, the quota is released", status: `
status:
  conditions:
  - {type: Admitted, status: "True", reason: Admitted, message: "", lastTransitionTime: "2026-11-29T08:00:00Z"}
  - {type: Finished, status: "True", reason: Succeeded, message: "", lastTransitionTime: "2026-11-29T08:00:00Z"}
  admission:
    clusterQueue: gpus
    podSetAssignments: [{name: main, count: 3}]
`},
		{name: "being evicted: Admitted still true", status: `
status:
  conditions:
  - {type: Admitted, status: "True", reason: Admitted, message: "", lastTransitionTime: "2026-11-29T08:00:00Z"}
  - {type: Evicted, status: "True", reason: Preempted, message: "", lastTransitionTime: "2026-11-29T08:00:00Z"}
  admission:
    clusterQueue: gpus
    podSetAssignments: [{name: main, count: 3}]
`},
		{name: "evicted: no longer admitted", status: `
status:
  conditions:
  - {type: Admitted, status: "False", reason: Preempted, message: "", lastTransitionTime: "2026-11-29T08:00:00Z"}
  - {type: Evicted, status: "True", reason: Preempted, message: "", lastTransitionTime: "2026-11-29T08:00:00Z"}
`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, err := kueue.FromUnstructured(workloadYAML(t, tc.status))
			if err != nil {
				t.Fatal(err)
			}
			if w.Namespace != "ml" || w.Name != "job-train-1a2b3" || w.Owner != "uid-train" {
				t.Errorf("read %s/%s owned by %q, want ml/job-train-1a2b3 owned by uid-train (its controller)", w.Namespace, w.Name, w.Owner)
			}
			if w.Admitted != tc.wantAdmitted || w.Count != tc.wantCount {
				t.Errorf("admitted %v for %d pods, want %v for %d", w.Admitted, w.Count, tc.wantAdmitted, tc.wantCount)
			}
			if len(w.Templates) != 1 || w.Templates[0].Spec.Containers[0].Resources.Limits.Name("gpufrac.io/gpu-fraction", "").String() != "50" {
				t.Errorf("templates %+v, want the pod set's", w.Templates)
			}
			idx, err := kueue.OwnerIndexFunc(workloadYAML(t, tc.status))
			if err != nil || !cmp.Equal(idx, []string{"uid-train"}) {
				t.Errorf("indexed under %v (%v), want its controller's UID", idx, err)
			}
		})
	}
}

func TestFromUnstructuredRefusesAMalformedWorkload(t *testing.T) {
	u := workloadYAML(t, "")
	if err := unstructured.SetNestedField(u.Object, "three", "spec", "podSets"); err != nil {
		t.Fatal(err)
	}
	if _, err := kueue.FromUnstructured(u); err == nil {
		t.Fatal("a Workload whose podSets is a string was read without an error")
	}
}
