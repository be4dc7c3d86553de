package policycheck

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"

	"github.com/gpufrac/gpufrac/api"
	"github.com/gpufrac/gpufrac/tests/builders"
)

func owned(p *corev1.Pod, kind, name string) *corev1.Pod {
	yes := true
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: kind, Name: name, UID: types.UID("uid-" + name), Controller: &yes}}
	return p
}

func TestCopyIsWhatTheAuthorWouldCreate(t *testing.T) {
	p := builders.MakePod("bare", "team-a").GPUs(1).UID("bare-uid").Obj()
	p.Spec.NodeName = "n1"
	p.Annotations = map[string]string{api.AnnotationGPU: "GPU-1", api.AnnotationAdmittedQueue: "q", api.AnnotationAllocatedGPU: "GPU-1",
		api.AnnotationDoNotDisrupt: "true", "team": "a"}
	c := Copy(p)
	if c.Name != "" || c.GenerateName != copyName || c.Namespace != "team-a" {
		t.Errorf("copy named %q/%q in %s", c.Name, c.GenerateName, c.Namespace)
	}
	if c.Spec.NodeName != "" {
		t.Errorf("copy keeps nodeName %q", c.Spec.NodeName)
	}
	if diff := cmp.Diff(map[string]string{"team": "a"}, c.Annotations); diff != "" {
		t.Errorf("copy's annotations (-want +got):\n%s", diff)
	}
	ref := metav1.GetControllerOf(c)
	if ref == nil || ref.Kind != "Pod" || ref.Name != "bare" {
		t.Errorf("a bare pod's copy has controller %+v, want the pod itself (the policies check what controllers create)", ref)
	}
	if p.Annotations[api.AnnotationGPU] != "GPU-1" || p.Spec.NodeName != "n1" || len(p.OwnerReferences) != 0 {
		t.Error("Copy changed the pod it copied")
	}
	rs := owned(builders.MakePod("web-1", "team-a").Obj(), "ReplicaSet", "web-7c9")
	if got := Copy(rs).OwnerReferences; len(got) != 1 || got[0].Name != "web-7c9" {
		t.Errorf("a controlled pod's copy has owners %+v, want its own controller alone", got)
	}
}

func TestCheck(t *testing.T) {
	const (
		warnVisible = "Validation failed for ValidatingAdmissionPolicy 'gpufrac-visible-devices' with binding 'gpufrac-visible-devices': " +
			"container \"main\" sets NVIDIA_VISIBLE_DEVICES"
		warnOther = "Validation failed for ValidatingAdmissionPolicy 'someone-elses' with binding 'x': not ours"
		// One policy, two of its rules broken: the API server warns twice.
		warnClass   = "Validation failed for ValidatingAdmissionPolicy 'gpufrac-tenant-priority' with binding 'gpufrac-tenant-priority': system-* class"
		warnPreempt = "Validation failed for ValidatingAdmissionPolicy 'gpufrac-tenant-priority' with binding 'gpufrac-tenant-priority': preempts"
	)
	deny := apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "gpufrac-policy-check-x",
		errors.New("ValidatingAdmissionPolicy 'gpufrac-tenant-gpu-access' with binding 'gpufrac-tenant-gpu-access' denied request: hostPath volumes are not allowed"))
	podSecurity := apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "gpufrac-policy-check-y",
		errors.New(`violates PodSecurity "restricted:latest": privileged`))
	yes := true
	rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "vllm-7c9", Namespace: "team-a",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: "vllm", Controller: &yes}}}}
	done := builders.MakePod("done", "team-a").Obj()
	done.Status.Phase = corev1.PodSucceeded
	cs := fake.NewClientset(rs,
		owned(builders.MakePod("vllm-1", "team-a").Obj(), "ReplicaSet", "vllm-7c9"),
		owned(builders.MakePod("vllm-2", "team-a").Obj(), "ReplicaSet", "vllm-7c9"),
		builders.MakePod("notebook", "team-b").Obj(),
		builders.MakePod("fine", "team-b").Obj(),
		builders.MakePod("privileged", "team-c").Obj(),
		builders.MakePod("validator", "gpu-operator").Obj(),
		done,
		builders.MakePod("reservation", api.ReservationNamespace).Obj(),
	)
	var dried []string
	dry := func(_ context.Context, p *corev1.Pod) ([]string, error) {
		owner := metav1.GetControllerOf(p).Name
		dried = append(dried, p.Namespace+"/"+owner)
		switch owner {
		case "vllm-7c9":
			return []string{warnVisible, warnOther}, nil
		case "notebook":
			return nil, deny
		case "privileged":
			return nil, podSecurity
		case "validator":
			return []string{warnClass, warnPreempt}, nil
		}
		return nil, nil
	}
	r, err := Check(t.Context(), cs, Options{}, dry)
	if err != nil {
		t.Fatal(err)
	}
	want := []Finding{
		{Namespace: "gpu-operator", Workload: "Pod/validator", Pod: "validator", Policy: "gpufrac-tenant-priority", Message: "system-* class; preempts"},
		{Namespace: "team-a", Workload: "Deployment/vllm", Pod: "vllm-1", Policy: "gpufrac-visible-devices", Message: `container "main" sets NVIDIA_VISIBLE_DEVICES`},
		{Namespace: "team-b", Workload: "Pod/notebook", Pod: "notebook", Policy: "gpufrac-tenant-gpu-access", Denied: true, Message: "hostPath volumes are not allowed"},
	}
	if diff := cmp.Diff(want, r.Findings); diff != "" {
		t.Errorf("findings (-want +got):\n%s", diff)
	}
	if r.Checked != 4 || len(dried) != 5 {
		t.Errorf("judged %d of %d dry runs, want 4 of 5 (one per workload and shape; no completed pod, no reservation; the PodSecurity refusal is a note): %v", r.Checked, len(dried), dried)
	}
	notes := strings.Join(r.Notes, "\n")
	for _, want := range []string{"team-c/privileged", "PodSecurity", "no gpufrac admission policy is bound"} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes do not say %q:\n%s", want, notes)
		}
	}
	var out bytes.Buffer
	if err := r.Render(&out); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"Deployment/vllm", "gpufrac-visible-devices", "warns", "Pod/notebook", "denies", "4 pods and templates checked, 3 workloads refused"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("report does not say %q:\n%s", s, out.String())
		}
	}

	// An error that is no admission answer stops the check.
	broken := func(context.Context, *corev1.Pod) ([]string, error) {
		return nil, apierrors.NewServiceUnavailable("down")
	}
	r, err = Check(t.Context(), cs, Options{Namespace: "team-a"}, broken)
	if err != nil || r.Checked != 0 || len(r.Notes) == 0 || !strings.Contains(strings.Join(r.Notes, "\n"), "not checked") {
		t.Errorf("an unavailable API server: report %+v, err %v; want every pod a note, no error", r, err)
	}
}

const visibleWarn = "Validation failed for ValidatingAdmissionPolicy 'gpufrac-visible-devices' with binding 'gpufrac-visible-devices': container sets NVIDIA_VISIBLE_DEVICES"

// visibleDevicesDry warns for a copy that sets NVIDIA_VISIBLE_DEVICES, as
// the API server does with the policy in [Warn].
func visibleDevicesDry(_ context.Context, p *corev1.Pod) ([]string, error) {
	for _, c := range p.Spec.Containers {
		for _, e := range c.Env {
			if e.Name == api.EnvVisibleDevices {
				return []string{visibleWarn}, nil
			}
		}
	}
	return nil, nil
}

// TestCheckEveryShapeOfAWorkload: a controller that makes pods of several
// shapes itself (KubeRay's head and workers) is judged by one pod of each.
func TestCheckEveryShapeOfAWorkload(t *testing.T) {
	head := owned(builders.MakePod("rc-head", "team-a").Obj(), "RayCluster", "rc")
	worker := owned(builders.MakePod("rc-worker-x", "team-a").GPUs(1).Obj(), "RayCluster", "rc")
	worker.Spec.Containers[0].Env = []corev1.EnvVar{{Name: api.EnvVisibleDevices, Value: "all"}}
	worker2 := owned(builders.MakePod("rc-worker-y", "team-a").GPUs(1).Obj(), "RayCluster", "rc")
	worker2.Spec.Containers[0].Env = worker.Spec.Containers[0].Env
	r, err := Check(t.Context(), fake.NewClientset(head, worker, worker2), Options{}, visibleDevicesDry)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Findings) != 1 || r.Findings[0].Pod != "rc-worker-x" || r.Checked != 2 {
		t.Errorf("findings %+v after %d judged, want the first worker's alone after 2 (head, one worker)", r.Findings, r.Checked)
	}
}

// TestCheckWorkloadsWithoutPods: a CronJob between runs (its last pod
// Succeeded) and a Deployment scaled to zero are judged by their templates;
// a finished Job is not.
func TestCheckWorkloadsWithoutPods(t *testing.T) {
	env := []corev1.EnvVar{{Name: api.EnvVisibleDevices, Value: "all"}}
	tmpl := func() corev1.PodTemplateSpec {
		p := builders.MakePod("x", "team-a").GPUs(1).Obj()
		p.Spec.Containers[0].Env = env
		return corev1.PodTemplateSpec{Spec: p.Spec}
	}
	yes := true
	cron := &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Name: "nightly", Namespace: "team-a", UID: "cron"},
		Spec: batchv1.CronJobSpec{JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: tmpl()}}}}
	run := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "nightly-290", Namespace: "team-a",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "CronJob", Name: "nightly", Controller: &yes}}},
		Spec: batchv1.JobSpec{Template: tmpl()}}
	done := owned(builders.MakePod("nightly-290-abc", "team-a").GPUs(1).Obj(), "Job", "nightly-290")
	done.Spec.Containers[0].Env = env
	done.Status.Phase = corev1.PodSucceeded
	idle := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "idle", Namespace: "team-a"}, Spec: appsv1.DeploymentSpec{Template: tmpl()}}
	finished := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "old", Namespace: "team-a"}, Spec: batchv1.JobSpec{Template: tmpl()},
		Status: batchv1.JobStatus{Conditions: []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}}}}
	r, err := Check(t.Context(), fake.NewClientset(cron, run, done, idle, finished), Options{}, visibleDevicesDry)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range r.Findings {
		got = append(got, f.Workload+" "+f.Pod)
	}
	if diff := cmp.Diff([]string{"CronJob/nightly template", "Deployment/idle template"}, got); diff != "" {
		t.Errorf("findings (-want +got):\n%s", diff)
	}
}

// TestCheckKeepsGoingPastOtherRefusals: a refusal that is no policy's (a
// webhook without dry-run support) is a note; the other findings stay.
func TestCheckKeepsGoingPastOtherRefusals(t *testing.T) {
	a := builders.MakePod("a", "team-a").Obj()
	a.Spec.Containers[0].Env = []corev1.EnvVar{{Name: api.EnvVisibleDevices, Value: "all"}}
	b := builders.MakePod("b", "team-b").Obj()
	dry := func(ctx context.Context, p *corev1.Pod) ([]string, error) {
		if p.Namespace == "team-b" {
			return nil, apierrors.NewBadRequest(`admission webhook "sidecar.example.com" does not support dry run`)
		}
		return visibleDevicesDry(ctx, p)
	}
	r, err := Check(t.Context(), fake.NewClientset(a, b), Options{}, dry)
	if err != nil || len(r.Findings) != 1 || !strings.Contains(strings.Join(r.Notes, "\n"), "does not support dry run") {
		t.Errorf("report %+v, err %v: want team-a's finding and team-b's refusal as a note", r, err)
	}
}

// TestDryRunIsBoundedPerRequest: the dry-run client does not run at
// client-go's default 5 requests a second (a 30 s deadline for the whole
// check would end it after ~160 pods), and each request has its own bound.
func TestDryRunIsBoundedPerRequest(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		if r.URL.Query().Get("dryRun") != "All" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Add("Warning", `299 - "`+visibleWarn+`"`)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"x","namespace":"ns"}}`))
	}))
	defer srv.Close()
	dry, err := NewDryRun(&rest.Config{Host: srv.URL}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	for i := range 100 {
		warnings, err := dry(t.Context(), Copy(builders.MakePod("p", "ns").Obj()))
		if err != nil || len(warnings) != 1 || warnings[0] != visibleWarn {
			t.Fatalf("dry run %d: warnings %q, err %v", i, warnings, err)
		}
	}
	if d := time.Since(began); d > 10*time.Second { // 18 s at client-go's default 5/s
		t.Errorf("100 dry runs took %v: rate-limited as client-go's default client", d)
	}
}
