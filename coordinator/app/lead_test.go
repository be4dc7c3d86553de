package app

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1alpha2 "k8s.io/api/scheduling/v1alpha2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	fakediscovery "k8s.io/client-go/discovery/fake"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpufrac/gpufrac/api/v1alpha1"
	"github.com/gpufrac/gpufrac/coordinator/kueue"
	"github.com/gpufrac/gpufrac/tests/builders"
)

// leadApp is an App on fake clients whose API server serves the optional
// group versions served (NodeClaims, PodGroups, Kueue, resource claims)
// and holds a node with one GPU, a queue and a pod pending for it; bound
// receives the node of each binding written.
func leadApp(t *testing.T, cfg Config, served ...schema.GroupVersion) (a *App, bound chan string) {
	t.Helper()
	node := builders.MakeNode("n1").Inventory("exclusive", 1).Obj()
	pod := builders.MakePod("p", "team-a").GPUs(1).CPU("1").Queue("q").UID("p").Obj()
	client := fake.NewClientset(node, pod, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}})
	disc := client.Discovery().(*fakediscovery.FakeDiscovery)
	for _, gv := range served {
		disc.Resources = append(disc.Resources, &metav1.APIResourceList{GroupVersion: gv.String(), APIResources: []metav1.APIResource{{Name: "any"}}})
	}
	bound = make(chan string, 10)
	client.PrependReactor("create", "pods", func(action clienttesting.Action) (bool, runtime.Object, error) {
		ca, ok := action.(clienttesting.CreateAction)
		if !ok || ca.GetSubresource() != "binding" {
			return false, nil, nil
		}
		b, ok := ca.GetObject().(*corev1.Binding)
		if !ok {
			return false, nil, nil
		}
		bound <- b.Target.Name
		return true, b, nil
	})
	queue, err := v1alpha1.ToUnstructured(builders.MakeQueue("q").GPUQuota("1").Namespaces("team-a").Obj())
	if err != nil {
		t.Fatal(err)
	}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		v1alpha1.QueueGVR():    "QueueList",
		nodeClaimGVR:           "NodeClaimList",
		kueue.WorkloadResource: "WorkloadList",
	}, queue)
	a = &App{cfg: cfg, client: client, events: client, election: client, dynamic: dyn, reg: prometheus.NewRegistry()}
	a.leadFn = a.lead
	return a, bound
}

// TestLeadSchedulesOnceSyncedAndStopsWithItsContext runs the work under
// the lease on fake clients, with each option and optional API off and
// on: it calls the App ready once the caches synced, binds the pending
// pod, and returns nil soon after its context ends.
func TestLeadSchedulesOnceSyncedAndStopsWithItsContext(t *testing.T) {
	every := []schema.GroupVersion{nodeClaimGVR.GroupVersion(), schedulingv1alpha2.SchemeGroupVersion,
		kueue.WorkloadResource.GroupVersion(), resourceapi.SchemeGroupVersion}
	tests := []struct {
		name   string
		cfg    Config
		served []schema.GroupVersion
	}{
		{name: "no option, no optional API"},
		{name: "every option, no optional API",
			cfg: Config{Reservations: true, Placeholders: true, KubeChecks: true, Consolidation: true, Kueue: true}},
		{name: "no option, every optional API", served: every},
		{name: "every option, every optional API", served: every,
			cfg: Config{Reservations: true, Placeholders: true, KubeChecks: true, Consolidation: true, Kueue: true}},
		{name: "every option, every optional API, DRA off", served: every,
			cfg: Config{Reservations: true, Placeholders: true, KubeChecks: true, Consolidation: true, Kueue: true, NoDRA: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			tt.cfg.Scheduler.Interval = 50 * time.Millisecond
			a, bound := leadApp(t, tt.cfg, tt.served...)
			done := make(chan error, 1)
			go func() { done <- a.Run(ctx) }()
			select {
			case node := <-bound:
				if node != "n1" {
					t.Errorf("bound to %q, want n1", node)
				}
			case err := <-done:
				t.Fatalf("Run returned before binding: %v", err)
			case <-time.After(20 * time.Second):
				t.Fatal("the pending pod was not bound within 20 s")
			}
			if !a.synced.Load() || a.Ready() != nil {
				t.Errorf("bound before the caches synced (synced %v, Ready %v)", a.synced.Load(), a.Ready())
			}
			// resource.k8s.io is read where served, unless DRA is off
			// (--dra=false: the chart grants no RBAC there).
			readDRA := false
			for _, act := range a.client.(*fake.Clientset).Actions() {
				if act.GetResource().Group == resourceapi.GroupName {
					readDRA = true
				}
			}
			if want := slices.Contains(tt.served, resourceapi.SchemeGroupVersion) && !tt.cfg.NoDRA; readDRA != want {
				t.Errorf("read resource.k8s.io: %v, want %v", readDRA, want)
			}
			cancel()
			waitRunReturnsNil(t, done)
		})
	}
}

// TestLeadFailsWhenAStepFails: a step that fails (here the reservation
// metrics, registered twice) ends lead with its error, and nothing it
// started keeps running.
func TestLeadFailsWhenAStepFails(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	a, _ := leadApp(t, Config{Reservations: true})
	var wg sync.WaitGroup
	first, firstCancel := context.WithCancel(ctx)
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = a.lead(first) // registers the reservation metrics
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !a.synced.Load() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	firstCancel()
	wg.Wait()
	done := make(chan error, 1)
	go func() { done <- a.lead(ctx) }()
	select {
	case err := <-done:
		if err == nil || errors.Is(err, context.Canceled) {
			t.Errorf("lead = %v, want the reservation metrics' error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("lead still running 10 s after a step failed")
	}
}
