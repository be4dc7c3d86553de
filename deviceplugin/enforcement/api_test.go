package enforcement

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpufrac/gpufrac/deviceplugin/config"
)

// eventually polls cond every 10ms for up to 5s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

// startInformer runs a PodInformer on client until the test ends.
func startInformer(t *testing.T, ctx context.Context, client *fake.Clientset) *PodInformer {
	t.Helper()
	inf, err := NewPodInformer(client, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = inf.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	eventually(t, "the pod informer to sync", inf.HasSynced)
	return inf
}

func TestPodInformerLookup(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	hog := testPod("hog", hogUID, "main", "side")
	hog.Spec.NodeName = "node-a"
	hog.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}
	client := fake.NewClientset(hog)
	inf := startInformer(t, ctx, client)

	got, ok := inf.PodByUID(hogUID)
	if !ok || got.Name != "hog" {
		t.Fatalf("PodByUID(hog) = %v, %v", got, ok)
	}
	if got.ManagedFields != nil {
		t.Error("the informer keeps managed fields it never needs")
	}
	if _, ok := inf.PodByUID("00000000-0000-4000-8000-000000000000"); ok {
		t.Error("PodByUID found an unknown UID")
	}
	// A pod created later is found once the informer sees it.
	late := testPod("late", "77777777-2222-4333-8444-555555555555", "main")
	late.Spec.NodeName = "node-a"
	if _, err := client.CoreV1().Pods(late.Namespace).Create(ctx, late, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the late pod in the informer", func() bool { _, ok := inf.PodByUID(late.UID); return ok })

	for _, tc := range []struct {
		name, id, want string
		ok             bool
	}{
		{name: "main", id: hog.Status.ContainerStatuses[0].ContainerID[len("containerd://"):], want: "main", ok: true},
		{name: "side", id: hog.Status.ContainerStatuses[1].ContainerID[len("containerd://"):], want: "side", ok: true},
		{name: "unknown ID", id: strings.Repeat("0", 64)},
		{name: "empty ID", id: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name, ok := ContainerName(got, tc.id)
			if name != tc.want || ok != tc.ok {
				t.Errorf("ContainerName(%q) = %q, %v; want %q, %v", tc.id, name, ok, tc.want, tc.ok)
			}
		})
	}
	initPod := testPod("init", hogUID, "main")
	initPod.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "warmup", ContainerID: "cri-o://" + strings.Repeat("ab", 32)}}
	if name, ok := ContainerName(initPod, strings.Repeat("ab", 32)); !ok || name != "warmup" {
		t.Errorf("ContainerName(init container) = %q, %v", name, ok)
	}
}

// TestAPIPathEvictsAndRecordsEvents runs the API path in process: the
// watchdog on mock NVML and a fixture /proc tree, pods from an informer on a
// fake clientset, evictions through the Eviction API and events through a
// real broadcaster to the fake clientset.
func TestAPIPathEvictsAndRecordsEvents(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	hog := testPod("hog", hogUID, "main")
	hog.Spec.NodeName = "node-a"
	client := fake.NewClientset(hog)
	var evictions []*policyv1.Eviction
	client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		ev := a.(k8stesting.CreateAction).GetObject().(*policyv1.Eviction)
		evictions = append(evictions, ev)
		return true, ev, nil
	})
	inf := startInformer(t, ctx, client)

	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
	if err := b.StartRecordingToSinkWithContext(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Shutdown)
	rec := b.NewRecorder(scheme.Scheme, "gpufrac-node")

	e := newEnv(t, envOptions{pods: inf, evictor: NewEvictor(client.PolicyV1()), recorder: rec})
	e.w.SetPolicy(Policy{Enforcement: config.EnforcementEvict, Samples: 2})
	e.devices.set(e.fraction(hog, "main", 4, 30))
	e.proc(1001, 5000, hog, "main")
	e.nvml(4, procMiB(1001, 40000))

	if st := e.w.Poll(ctx); st.Unknown != 0 || st.OverLimit != 1 || st.Evictions != 0 {
		t.Fatalf("first poll: %+v, want the process mapped and over the limit", st)
	}
	if st := e.w.Poll(ctx); st.Evictions != 1 {
		t.Fatalf("second poll: %+v, want an eviction", st)
	}
	if len(evictions) != 1 {
		t.Fatalf("evictions through the API = %d, want 1", len(evictions))
	}
	ev := evictions[0]
	if ev.Name != "hog" || ev.Namespace != "team-a" || ev.DeleteOptions == nil || ev.DeleteOptions.Preconditions == nil ||
		ev.DeleteOptions.Preconditions.UID == nil || *ev.DeleteOptions.Preconditions.UID != hogUID {
		t.Errorf("eviction = %+v, want team-a/hog preconditioned on UID %s", ev, hogUID)
	}
	if len(e.killer.calls) != 0 {
		t.Errorf("evict mode killed %v", e.killer.calls)
	}

	var got []string
	eventually(t, "two events on the pod", func() bool {
		list, err := client.EventsV1().Events("team-a").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		got = got[:0]
		for _, ev := range list.Items {
			if ev.Regarding.Kind == "Pod" && ev.Regarding.Name == "hog" && ev.Regarding.UID == hogUID && ev.ReportingController == "gpufrac-node" {
				got = append(got, ev.Reason)
			}
		}
		return len(got) == 2
	})
	if diff := cmp.Diff([]string{"GPUMemoryLimitExceeded", "GPUMemoryPodEvicted"}, slices.Sorted(slices.Values(got))); diff != "" {
		t.Errorf("event reasons (-want +got):\n%s", diff)
	}

	// The pod is re-created under the same name: the old UID is gone, so
	// its leftover process is no longer tied to a container.
	if err := client.CoreV1().Pods("team-a").Delete(ctx, "hog", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the informer to drop the pod", func() bool { _, ok := inf.PodByUID(hogUID); return !ok })
	if st := e.w.Poll(ctx); st.Unknown != 1 || st.Evictions != 0 {
		t.Errorf("after the pod is gone: %+v, want the process unknown and no eviction", st)
	}
}

// An eviction the API refuses (a PodDisruptionBudget: 429 TooManyRequests)
// fails with the API's own error, wrapped with the pod's name, so the
// watchdog reports it and retries after another run of samples.
func TestAPIEvictorRefused(t *testing.T) {
	client := fake.NewClientset()
	client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		return true, nil, apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
	})
	err := NewEvictor(client.PolicyV1()).Evict(t.Context(), testPod("hog", hogUID, "main"))
	if !apierrors.IsTooManyRequests(err) || !strings.Contains(err.Error(), "team-a/hog") {
		t.Errorf("Evict = %v, want the API's TooManyRequests naming team-a/hog", err)
	}
}
