package policycheck

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

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
		}
		return nil, nil
	}
	r, err := Check(t.Context(), cs, "", dry)
	if err != nil {
		t.Fatal(err)
	}
	want := []Finding{
		{Namespace: "team-a", Workload: "Deployment/vllm", Pod: "vllm-1", Policy: "gpufrac-visible-devices", Message: `container "main" sets NVIDIA_VISIBLE_DEVICES`},
		{Namespace: "team-b", Workload: "Pod/notebook", Pod: "notebook", Policy: "gpufrac-tenant-gpu-access", Denied: true, Message: "hostPath volumes are not allowed"},
	}
	if diff := cmp.Diff(want, r.Findings); diff != "" {
		t.Errorf("findings (-want +got):\n%s", diff)
	}
	if r.Checked != 4 {
		t.Errorf("checked %d workloads, want 4 (one per workload; no completed pod, no reservation): %v", r.Checked, dried)
	}
	if len(r.Notes) != 1 || !strings.Contains(r.Notes[0], "team-c/privileged") || !strings.Contains(r.Notes[0], "PodSecurity") {
		t.Errorf("notes %q, want the pod another admission plugin refused", r.Notes)
	}
	var out bytes.Buffer
	if err := r.Render(&out); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"Deployment/vllm", "gpufrac-visible-devices", "warns", "Pod/notebook", "denies", "4 workloads checked, 2 refused"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("report does not say %q:\n%s", s, out.String())
		}
	}

	// An error that is no admission answer stops the check.
	broken := func(context.Context, *corev1.Pod) ([]string, error) { return nil, apierrors.NewServiceUnavailable("down") }
	if _, err := Check(t.Context(), cs, "team-a", broken); err == nil {
		t.Error("Check returned no error while the API server was unavailable")
	}
}
